"""Lab 1's a_predict grades predict()'s own skill: a wrong op_flops costs a_flops, and a predict()
that combines it correctly into the roofline bound keeps a_predict's points; a wrong predict()
still loses them."""
import os

import pytest

from conftest import grade_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
CAUSAL = 'return flops / 2 if op["causal"] else flops'        # op_flops: wrong for causal attention
BOUND = '("compute" if t_compute >= t_memory else "memory")'   # predict: which term bounds


@pytest.mark.slow
def test_a_wrong_op_flops_does_not_cost_a_predict(edit):
    nb = edit(SOLUTION, {CAUSAL: "return flops"}, name="flops.ipynb")
    res = grade_in_process(LAB, nb, ["a_flops", "a_predict"])
    assert res["a_flops"].verdict == "partial", res["a_flops"].message
    assert res["a_predict"].verdict == "passed" and res["a_predict"].points == 2, res["a_predict"].message


@pytest.mark.slow
def test_a_wrong_predict_still_fails(edit):
    nb = edit(SOLUTION, {BOUND: '("memory" if t_compute >= t_memory else "compute")'}, name="bound.ipynb")
    res = grade_in_process(LAB, nb, ["a_predict"])
    assert res["a_predict"].points == 0, res["a_predict"].message
    assert "first wrong: predict(op=" in res["a_predict"].message and "expected" in res["a_predict"].message

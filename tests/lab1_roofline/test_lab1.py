"""Lab 1: deliberately wrong submissions are caught (tests/<lab>/test_labN_every_part.py checks that the
solution passes and the student version scores zero)."""
import os

import pytest

from grader import inputs, report, run

LAB = "lab1_roofline"
SOLUTION = ("solutions", LAB, "lab1_roofline.ipynb")


@pytest.mark.slow
def test_wrong_causal_attention_gets_partial_credit_not_full(root, edit, device):
    nb = edit(os.path.join(root, *SOLUTION), {"return flops / 2 if op[\"causal\"] else flops": "return flops"})
    r = run.check_lab(LAB, nb, 12345, device, parts=["a_flops"], progress=lambda m: None)[0]
    assert r.verdict == report.PARTIAL and 0 < r.points < 2
    assert "first wrong" in r.message and "'causal': True" in r.message


@pytest.mark.slow
def test_scalar_loads_fail_the_mechanism_check(root, edit, device):
    """A kernel that works but moves 2 bytes per instruction loses the build part."""
    nb = edit(os.path.join(root, *SOLUTION), {
        'LANES = 8              # fp16 values in one 16-byte vector':
            'LANES = 1              # fp16 values in one 16-byte vector',
        'dtype="float16x8"': 'dtype="float16"',
    })
    r = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["b_build"], progress=lambda m: None)[0]
    assert r.verdict == report.FAILED and "MISSING" in r.message


@pytest.mark.slow
def test_forbidden_torch_fallback_is_rejected(root, edit, device):
    nb = edit(os.path.join(root, *SOLUTION), {"    return min(gpu[\"peak_tflops\"], gpu[\"bandwidth_tbps\"] * ai)":
                                              "    return float(torch.mm(torch.ones(1, 1), torch.ones(1, 1)))"})
    notes = []
    results = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["c_roofline"], progress=lambda m: None,
                            notes=notes)
    assert results[0].points < results[0].max_points           # graded on what it returns: wrong values
    assert any("calls torch for the work" in n for n in notes)  # and advised, never zeroed for the word


@pytest.mark.gpu
def test_kernel_that_skips_half_the_tensor_fails_with_first_mismatch(root, edit, device):
    nb = edit(os.path.join(root, *SOLUTION), {"cta = T.cta_id([n // TILE])": "cta = T.cta_id([n // TILE // 2])"})
    r = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["b_correct"], progress=lambda m: None)[0]
    assert r.verdict == report.FAILED and "NaN/Inf" in r.message and "first at" in r.message

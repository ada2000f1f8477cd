"""The notebook's own cells (grader/notebook.py): a check cell answers at once and says a verdict
once, in the student's terms; a graded cell costs nothing and repeats the check; the last cell
grades the saved notebook as the autograder does."""
import os
import re
import subprocess
import time

import pytest
import torch

from conftest import ROOT, edit_notebook, import_notebook
from grader import compare, hardware, notebook, report, runners, spec

LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
STUDENT = os.path.join(ROOT, "assignments", LAB, f"{LAB}.ipynb")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return vars(import_notebook(SOLUTION, tmp_path_factory.mktemp("ref"), "nb_checks_reference"))


def _edited(tmp_path, replace, name):
    nb = edit_notebook(SOLUTION, str(tmp_path / f"{name}.ipynb"), replace)
    return vars(import_notebook(nb, tmp_path / name, name))


def test_a_cpu_question_answers_at_once_with_one_line_and_no_return_value(reference, capsys):
    start = time.perf_counter()
    assert notebook.check(LAB, "a_flops", reference) is None       # nothing for Jupyter to echo
    took = time.perf_counter() - start
    out = capsys.readouterr().out
    assert took < 1.0, took
    assert out.count("\n") == 1 and out.startswith("[PASS] lab1_roofline/a_flops: 2 / 2"), out
    assert "PartResult" not in out
    assert notebook.last_result(LAB, "a_flops").verdict == report.PASSED


def test_a_wrong_answer_is_said_once_without_a_traceback(tmp_path, capsys):
    ns = _edited(tmp_path, {'return flops / 2 if op["causal"] else flops': "return flops"}, "nb_checks_wrong")
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_flops", ns)
    assert capsys.readouterr().out == ""                            # not printed, then raised again
    shown = "\n".join(info.value._render_traceback_())              # what Jupyter shows: the verdict alone
    assert re.sub(r"\x1b\[[0-9;]*m", "", shown) == str(info.value)
    assert str(info.value).count("first wrong") == 1 and "expected 274877906944" in str(info.value)
    assert "Traceback" not in shown and "grader/" not in shown
    assert isinstance(info.value, AssertionError) and info.value.result.verdict == report.PARTIAL


def test_an_error_in_the_students_code_shows_their_lines_only(tmp_path):
    ns = _edited(tmp_path, {'kind, b = op["kind"], op["dtype_bytes"]': 'kind, b = op["kind"], op["dtype_bytes"] + None'},
                 "nb_checks_typeerror")
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_predict", ns)
    text = str(info.value)
    assert "TypeError: unsupported operand" in text
    assert "in predict: t_memory = op_bytes(op)" in text and 'in op_bytes: kind, b = op["kind"]' in text
    assert "grader" not in text.split("\n", 1)[1] and "site-packages" not in text


def test_an_unwritten_part_says_so_in_one_line(tmp_path):
    ns = vars(import_notebook(STUDENT, tmp_path, "nb_checks_student"))
    for part, todo in (("a_flops", "a_flops"), ("b_build", "b_kernel")):
        with pytest.raises(notebook.CheckFailed) as info:
            notebook.check(LAB, part, ns)
        assert str(info.value) == (f"[FAIL] lab1_roofline/{part}: 0 / 2 on the public cases: not implemented yet: "
                                   f"replace the todo('{todo}') line with your code")


def test_a_kernel_that_does_not_parse_shows_the_tirx_error_not_the_stack(tmp_path):
    ns = _edited(tmp_path, {'X = T.match_buffer(x_ptr, (n,), "float16", align=16)':
                            'X = T.match_buffer(x_ptr, (n,), "float16", align=16)\n        Z = undefined_name + 1'},
                 "nb_checks_parse")
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "b_build", ns)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("[ERROR] lab1_roofline/b_build")
    assert any("error: Undefined variable: undefined_name" in ln for ln in lines)
    assert any("Z = undefined_name + 1" in ln for ln in lines) and any("^^^" in ln for ln in lines)
    assert len(lines) < 12 and not any(re.search(r'File "|parser\.py|site-packages', ln) for ln in lines)


def test_describe_error_keeps_a_compiler_message_and_drops_its_stack():
    class InternalError(Exception):
        pass
    InternalError.__module__ = "tvm.error"
    e = InternalError("Check failed: lanes % 2 == 0 (1 vs. 0) : Only support an even number of lanes\n"
                      "Stack trace:\n  0: tvm::codegen::CodeGenCUDA::PrintType\n  1: ...")
    text = notebook.describe_error(e)
    assert text == "InternalError while compiling your kernel: Check failed: lanes % 2 == 0 (1 vs. 0) : Only " \
                   "support an even number of lanes"


def test_a_gpu_part_without_a_gpu_is_skipped_quietly(reference, capsys, monkeypatch):
    monkeypatch.setattr(notebook, "_device", lambda: hardware.Device(False, "", None, "", reason="no GPU here"))
    assert notebook.check(LAB, "b_correct", reference) is None
    out = capsys.readouterr().out
    assert out == "[SKIP] lab1_roofline/b_correct: needs a GPU (no GPU here); the autograder runs it on one\n"
    assert notebook.last_result(LAB, "b_correct").verdict == report.SKIPPED


def test_a_graded_cell_runs_nothing_and_repeats_the_check(reference, capsys, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("a graded cell must not start the grader")
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    notebook._RESULTS.pop((LAB, "a_bytes"), None)
    start = time.perf_counter()
    assert notebook.grade(LAB, "a_bytes") is None
    first = capsys.readouterr().out
    notebook.check(LAB, "a_bytes", reference)
    capsys.readouterr()
    assert notebook.grade(LAB, "a_bytes") is None
    again = capsys.readouterr().out
    assert time.perf_counter() - start < 1.0
    assert "the autograder grades this part from your saved notebook" in first and "gives no points" in first
    assert "has not run in this kernel" in first
    assert "Its check cell above, in this kernel: passed, 2 / 2 on the public cases." in again


def test_the_last_cell_grades_the_saved_notebook_as_the_cli_does(tmp_path, capsys):
    nb = tmp_path / f"{LAB}.ipynb"
    nb.write_text(open(SOLUTION).read())
    os.chdir(tmp_path)
    try:
        notebook.grade_notebook(LAB, parts=["a_flops"])
    finally:
        os.chdir(ROOT)
    out = capsys.readouterr().out
    assert f"python -m grader check {LAB} --submission {nb} --part a_flops" in out
    assert re.search(rf"\[PASS\] {LAB}/a_flops\s+2\.00 / 2\s+30/30 cases right", out), out   # hidden cases too
    notebook.grade_notebook(LAB, notebook=str(tmp_path / "missing.ipynb"))
    assert "No saved notebook at" in capsys.readouterr().out


# ---------------------------------------------------------------- where a kernel output is wrong

def test_compare_names_the_first_indices_and_the_largest_error():
    ref = torch.zeros(4, 8)
    out = ref.clone()
    out[1, 2], out[1, 5], out[2, 0], out[3, 7] = 0.5, 2.0, 0.25, 0.125
    c = compare.compare(out, ref, compare.Tolerance(0.0, 0.1), name="D (4x8)")
    assert "4 of 32 elements differ" in c.message and "first at [1, 2]" in c.message
    assert "then at [1, 5], [2, 0], ..." in c.message and "max abs error 2" in c.message


def test_a_wrong_matrix_is_drawn_as_a_heat_map_of_its_tiles():
    seen = notebook._Mismatch()
    ref = torch.zeros(256, 512)
    out = ref.clone()
    out[64:128, 0:8] = 1.0                                # one tile row, one column tile, partly wrong
    seen("D (256x512, sampled)", out, ref, compare.Tolerance(0.0, 0.5))
    assert seen.found and seen.tile == (4, 8) and seen.grid.shape == (64, 64)
    wrong = {(int(r), int(c)) for r, c in zip(*seen.grid.nonzero())}
    assert wrong == {(r, 0) for r in range(16, 32)} and seen.grid[16, 0] == 1.0
    fig = seen.figure()
    assert "16 of 4096 tiles" in fig.axes[0].get_title()


def test_the_correctness_runner_tells_the_check_cell_where_the_output_is_wrong():
    from grader.context import Context
    seen = notebook._Mismatch()
    s = spec.load("lab3_layout_swizzle")
    ctx = Context(s, s.part("d_correct"), 0, hardware.Device(True, "fake", hardware.SPECS["H200"], "row H200"),
                  public_only=True, on_mismatch=seen)

    def wrong(m, n):                                      # forgets the last row of every tile
        def ex(a, b):
            b.copy_(a.t())
            b[63::64, :] = 0
        return ex
    env = runners.Env(device="cpu", lower=lambda built: (built, ""), sync=lambda: None, require_gpu=lambda c: None)
    out = runners.correctness(types_module(build_transpose_plain=wrong, build_transpose_swizzled=wrong), ctx, env)
    assert out.fraction == 0.0 and seen.found and seen.what.startswith("b (")
    assert seen.grid.max() > 0 and seen.grid.min() == 0


def types_module(**kw):
    import types
    return types.SimpleNamespace(**kw)


# ---------------------------------------------------------------- kernels, loaded as the grader loads them

def test_notebook_kernels_are_launched_like_the_graders(reference, monkeypatch):
    """A check cell's kernel goes the grader's way: the launch plan and PTX of the kernel, the PTX
    assembled by ptxas and the cubin launched by launch.Kernel (faked here: no GPU); an equal
    PrimFunc is not built again."""
    from grader import launch
    made = []

    class FakeKernel:
        def __init__(self, plan, cubin, ptx):
            made.append((plan, cubin, ptx))
    monkeypatch.setattr(launch, "Kernel", FakeKernel)
    kernels = notebook._Kernels()
    fn, src = kernels.lower(reference["build_scale_add"](65536), "sm_90a")
    again, _ = kernels.lower(reference["build_scale_add"](65536), "sm_90a")    # a new, equal PrimFunc
    other, _ = kernels.lower(reference["build_scale_add"](131072), "sm_90a")
    assert len(made) == 2 and fn is again and other is not fn
    plan, cubin, ptx = made[0]
    assert plan["launches"][0]["grid"][0] * plan["launches"][0]["block"][0] > 0
    assert cubin[:4] == b"\x7fELF" and ".entry" in ptx and "__global__" in src


# ---------------------------------------------------------------- the grader's policies, in the check cell

FAKE_H200 = hardware.Device(True, "NVIDIA H200", hardware.SPECS["H200"], "row H200", sm_count=132)


def test_a_speed_part_below_full_credit_is_measured_again_like_the_grader(monkeypatch):
    from grader import dispatch, grading, verdict
    ratios = iter([0.5, 0.8, 0.7, 0.9])

    def timed(module, ctx):
        return grading.perf_outcome(ctx, next(ratios), {}, "fake timing")
    monkeypatch.setattr(notebook, "_device", lambda: FAKE_H200)
    monkeypatch.setattr(dispatch, "grading_function", lambda lab, part: timed)
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "b_speed", {})
    assert verdict.PERF_TRIALS == 3 and next(ratios) == 0.9                  # three trials, as the grader
    res = info.value.result
    assert res.measurements["ratio"] == 0.8 and res.verdict == report.PARTIAL
    assert "(best of 3 trials: 0.500x, 0.800x, 0.700x)" in str(info.value)


def test_a_kernel_that_hangs_says_to_restart_the_kernel(monkeypatch):
    from grader import dispatch, timing

    def hangs(module, ctx):
        assert timing.HANG_S == 20.0                                      # the part's hang_s, as the harness sets
        raise timing.KernelHang("the GPU work did not finish within 20 s")
    monkeypatch.setattr(notebook, "_device", lambda: FAKE_H200)
    monkeypatch.setattr(dispatch, "grading_function", lambda lab, part: hangs)
    before = timing.HANG_S
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check("lab2_tma", "d_correct", {})
    assert timing.HANG_S == before
    assert "did not finish within 20 s" in str(info.value) and "restart the notebook's kernel" in str(info.value)

"""The grader survives submissions that hang or crash, and says what happened."""
import os

from grader import hardware, inputs, report, run, sandbox, spec

SOLUTION = ("solutions", "lab1_roofline", "lab1_roofline.ipynb")
BODY = '    kind = op["kind"]\n    if kind == "elementwise":\n        return op["n"] * op["flops_per_element"]'


def _grade(nb, part="a_flops", timeout=None, monkeypatch=None):
    lab = spec.load("lab1_roofline")
    p = lab.part(part)
    if timeout is not None:
        object.__setattr__(p, "timeout_s", timeout)
    return run.check_lab("lab1_roofline", nb, inputs.PUBLIC_SEED, hardware.detect(), parts=[part],
                         progress=lambda m: None)[0]


def test_endless_loop_times_out_with_a_clear_verdict(root, edit, monkeypatch):
    nb = edit(os.path.join(root, *SOLUTION), {BODY: "    while True:\n        pass"})
    lab = spec.load("lab1_roofline")
    monkeypatch.setattr(spec, "load", lambda name: _with_timeout(lab, "a_flops", 5))
    res = _grade(nb)
    assert res.verdict == report.ERROR and res.points == 0
    assert "timed out after 5 s" in res.message


def test_gpu_part_timeout_names_the_likely_barrier_deadlock(root, tmp_path):
    """The verdict for a hung GPU part points at a barrier that never completes."""
    part = _with_timeout(spec.load("lab1_roofline"), "a_flops", 3).part("a_flops")
    object.__setattr__(part, "needs_gpu", True)
    mod = tmp_path / "m.py"
    mod.write_text("import time\ndef op_flops(op):\n    time.sleep(60)\n")
    res = sandbox.run_part("lab1_roofline", part, str(mod), seed=1, workdir=str(tmp_path / "w"))
    assert res.verdict == report.ERROR and "barrier wait that never completes" in res.message


def test_crash_is_reported_and_grading_goes_on(root, edit):
    nb = edit(os.path.join(root, *SOLUTION), {BODY: "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)"})
    results = run.check_lab("lab1_roofline", nb, inputs.PUBLIC_SEED, hardware.detect(),
                            parts=["a_flops", "a_bytes"], progress=lambda m: None)
    assert results[0].verdict == report.ERROR and "SIGSEGV" in results[0].message
    assert results[1].verdict == report.PASSED       # the next part is still graded


def test_printing_cannot_forge_a_result(root, edit):
    fake = '{"verdict": "passed", "points": 2}'
    nb = edit(os.path.join(root, *SOLUTION), {BODY: f"    print({fake!r})\n    return -1"})
    assert _grade(nb).verdict == report.FAILED


def _with_timeout(lab, part_id, timeout):
    import dataclasses
    parts = tuple(dataclasses.replace(p, timeout_s=timeout) if p.id == part_id else p for p in lab.parts)
    return dataclasses.replace(lab, parts=parts)

"""The nbgrader round trip: generate -> a submission in submitted/ -> autograde -> grades,
with partial credit, on this machine (GPU parts score 0 without a GPU)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import copy_course, edit_notebook

LAB = "lab1_roofline"


def _nbgrader(course, *args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("GRADER_SECRET_SEED", None)
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course}"],
                          cwd=str(course), env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_generate_submit_autograde_partial_credit(root, tmp_path):
    from nbgrader.api import Gradebook
    from grader import hardware

    course = tmp_path / "course"
    course.mkdir()
    copy_course(root, str(course))
    _nbgrader(course, "db", "student", "add", "alice")
    _nbgrader(course, "db", "assignment", "add", LAB)
    _nbgrader(course, "generate_assignment", LAB, "--force")
    # Alice solves everything but gets causal attention wrong in op_flops (partial credit) and
    # leaves op_bytes as a TODO (zero).
    solution = os.path.join(root, "solutions", LAB, f"{LAB}.ipynb")
    sub = course / "submitted" / "alice" / LAB / f"{LAB}.ipynb"
    edit_notebook(solution, str(sub), {
        'return flops / 2 if op["causal"] else flops': "return flops",
        'kind, b = op["kind"], op["dtype_bytes"]': 'todo("a_bytes")',
    })
    _nbgrader(course, "autograde", LAB, "--force")

    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        sub_nb = gb.find_submission_notebook(LAB, LAB, "alice")
        grades = {g.name: g.score for g in sub_nb.grades}
    assert 0 < grades["test_a_flops"] < 2            # partial credit: causal cases wrong
    assert grades["test_a_bytes"] == 0               # left as a TODO
    assert grades["test_a_predict"] == 0             # depends on op_bytes
    assert grades["test_b_build"] == 2               # compiled for sm_90a and sm_100a here
    assert grades["test_c_roofline"] == 2
    if not hardware.detect().present:
        assert grades["test_b_correct"] == 0 and grades["test_b_speed"] == 0
    if not hardware.detect().present:   # the GPU parts' feedback says why they scored 0
        nb = json.loads((course / "autograded" / "alice" / LAB / f"{LAB}.ipynb").read_text())
        cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_b_correct")
        text = json.dumps(cell["outputs"])
        assert "skipped: needs a GPU" in text

"""python -m grader gradebook: the CSV, nbgrader's gradebook (export and feedback work on it),
Gradescope's files and the HTML summary, from a results folder written here in the batch
layout (reports in the grader's schema, one of them with GPU performance ratios)."""
import base64
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from grader import report, spec
from grader.classroom import batch, gradebook

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")


def _results(points: dict, verdicts: dict, ratio=None, messages=None):
    out = []
    for p in spec.load(LAB).parts:
        m = {}
        if p.id == "b_speed" and ratio is not None:
            m = {"ratio": ratio, "threshold_full": 0.9, "threshold_floor": 0.5}
        out.append(report.PartResult(LAB, p.id, p.title, points.get(p.id, 0.0), p.points,
                                     verdicts.get(p.id, "passed" if points.get(p.id) == p.points else "failed"),
                                     (messages or {}).get(p.id, ""), p.needs_gpu, m))
    return out


def _write_student(results_dir, student, results, notebook, state="done"):
    d = os.path.join(results_dir, LAB, student)
    os.makedirs(d, exist_ok=True)
    rep = report.Report(results, {"present": True, "name": "NVIDIA H200", "row": "H200"}, 7, notebook)
    rep.write_json(os.path.join(d, "report.json"))
    report.write_gradescope(rep, os.path.join(d, "results.json"))
    batch.write_json(os.path.join(d, "status.json"), {
        "student": student, "lab": LAB, "notebook": notebook, "state": state, "notebook_mtime": 1.8e9,
        "fingerprint": {"notebook_sha256": "ab" * 32}, "points": rep.points, "max_points": rep.max_points,
        "errors": [r.part for r in results if r.verdict == "error"], "pieces": {"all": {"state": state}}})


FULL = {"a_flops": 2, "a_bytes": 2, "a_predict": 2, "b_build": 2, "b_correct": 3, "b_speed": 3, "c_roofline": 2}


@pytest.fixture(scope="module")
def class_results(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("class")
    res = str(tmp_path / "results")
    nb = str(tmp_path / "nb.ipynb")
    with open(SOLUTION) as f, open(nb, "w") as g:
        g.write(f.read())
    broken = str(tmp_path / "broken.ipynb")
    with open(broken, "w") as f:
        f.write("not json")
    _write_student(res, "ada", _results(FULL, {}, ratio=1.02), nb)
    _write_student(res, "ben", _results({**FULL, "a_flops": 1.25, "b_speed": 1.5},
                                        {"a_flops": "partial", "b_speed": "partial"}, ratio=0.7), nb)
    _write_student(res, "cy", _results({**FULL, "a_bytes": 0, "a_predict": 0, "b_speed": 0},
                                       {"b_speed": "failed"}, ratio=0.4,
                                       messages={"a_bytes": "wrong for reductions"}), nb)
    _write_student(res, "dee", _results({}, {p: "error" for p in FULL},
                                        messages={p: "timed out after 60 s: an endless loop" for p in FULL}), nb)
    _write_student(res, "eve", _results({}, {p: "error" for p in FULL},
                                        messages={p: "broken.ipynb is not valid JSON" for p in FULL}), broken)
    _write_student(res, "fay", _results({}, {p: "error" for p in FULL},
                                        messages={p: "not graded (crashed): the grader exited" for p in FULL}),
                   nb, state="failed")
    return res


@pytest.fixture(scope="module")
def built(class_results):
    return gradebook.build(class_results)


def test_csv_gradescope_and_html(class_results, built):
    paths = built
    out = os.path.join(class_results, "gradebook")
    with open(paths["csv"]) as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["ada", "ben", "cy", "dee", "eve", "fay"]
    assert rows["ada"]["total"] == "16" and rows["ada"]["max_points"] == "16"
    assert rows["ben"]["a_flops"] == "1.25" and rows["ben"]["a_flops verdict"] == "partial"
    assert rows["cy"]["total"] == "9" and rows["cy"]["a_bytes verdict"] == "failed"
    assert rows["dee"]["graded"] == "yes" and rows["dee"]["errors"].split() == list(FULL)
    assert rows["fay"]["graded"] == "no (failed)"
    gs = json.loads(open(os.path.join(out, "gradescope", LAB, "ben", "results.json")).read())
    assert gs["score"] == 13.75 and len(gs["tests"]) == 7

    html = open(paths["html"]).read()
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(imgs) == 2                                   # points per part, performance ratios
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in imgs)
    # The parts most students failed come first: every part failed by dee, eve, fay; a_bytes and
    # a_predict also by cy.
    table = html.split("Parts most students failed")[1].split("</table>")[0]
    order = re.findall(r"<tr><td>(\w+)</td>", table)
    assert order[:2] == ["a_bytes", "a_predict"] and "4/6 (67%)" in table
    # Grading errors (did not finish, unreadable notebook) apart from the submissions' own errors.
    grading_errors, code_errors = html.split("Grading errors")[1].split("error of the submission&#x27;s code")
    assert "eve" in grading_errors and "not valid JSON" in grading_errors and "dee" not in grading_errors
    assert "fay" in grading_errors and "grading did not finish" in grading_errors
    assert "dee" in code_errors and "timed out" in code_errors and "eve" not in code_errors
    assert rows["eve"]["graded"] == "no (the notebook could not be read)"


def test_nbgrader_gradebook_scores(class_results, built):
    from nbgrader.api import Gradebook
    paths = built
    with Gradebook(paths["db"]) as gb:
        assert sorted(s.id for s in gb.students) == ["ada", "ben", "cy", "dee", "eve", "fay"]
        ben = {g.name: g.score for g in gb.find_submission_notebook(LAB, LAB, "ben").grades}
        assert ben["test_a_flops"] == 1.25 and ben["test_b_speed"] == 1.5 and ben["test_a_bytes"] == 2
        assert gb.find_submission(LAB, "ada").score == 16
        assert gb.find_submission(LAB, "dee").score == 0
    # Rebuilding updates the same gradebook (no duplicate submissions).
    gradebook.build(class_results)
    with Gradebook(paths["db"]) as gb:
        assert len(gb.find_assignment(LAB).submissions) == 6
    # The autograded copy of an unreadable submission is the released notebook with a note.
    nb = json.load(open(os.path.join(class_results, "gradebook", "autograded", "eve", LAB, f"{LAB}.ipynb")))
    assert "could not be read" in "".join(nb["cells"][0]["source"])
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_a_flops")
    assert "not valid JSON" in "".join(cell["outputs"][0]["text"])


@pytest.mark.slow
def test_nbgrader_export_and_generate_feedback_work(class_results, built):
    paths = built
    course = os.path.dirname(paths["csv"])
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for args in (["export"], ["generate_feedback", LAB]):
        p = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(os.path.join(course, "nbgrader_grades.csv")) as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(rows["ada"]["score"]) == 16 and float(rows["ben"]["score"]) == 13.75
    assert float(rows["cy"]["max_score"]) == 16
    fb = open(os.path.join(course, "feedback", "ben", LAB, f"{LAB}.html")).read()
    assert "13.75" in fb and "[PART] lab1_roofline/a_flops" in fb
    assert os.path.exists(os.path.join(course, "feedback", "eve", LAB, f"{LAB}.html"))


def test_cli_needs_results(tmp_path):
    p = subprocess.run([sys.executable, "-m", "grader", "gradebook", str(tmp_path)], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no lab results under" in p.stderr

"""benchmarks/notebook_times.py: a notebook run top to bottom in a kernel, every cell timed and
classified, errors and GPU skips recorded, and the goals checked."""
import json
import os
import sys

import nbformat
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import notebook_times as nt  # noqa: E402


def _cell(src, **nbgrader):
    c = nbformat.v4.new_code_cell(src)
    if nbgrader:
        c.metadata["nbgrader"] = dict(nbgrader, schema_version=3)
    return c


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("times")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        _cell("import time\ndef check(lab, part, ns):\n    print('[SKIP] ' + part) if part == 'b_correct' else None\n"
              "def grade(lab, part):\n    print('no points here')\n"
              "def grade_notebook(lab, report_json=None):\n    time.sleep(0.2)", grade=False, grade_id="setup", locked=True, solution=False),
        nbformat.v4.new_markdown_cell("## Part a"),
        _cell("def f():\n    return 1", grade=False, grade_id="a", locked=False, solution=True),
        _cell('check("lab1_roofline", "a_flops", globals())  # public cases'),
        _cell('grade("lab1_roofline", "a_flops")', grade=True, grade_id="test_a_flops", locked=True, solution=False,
              points=2),
        _cell('check("lab1_roofline", "b_correct", globals())'),
        _cell("time.sleep(0.3)\n1 / 0"),
        _cell('grade_notebook("lab1_roofline")'),
    ]
    src = out / "toy.ipynb"
    nbformat.write(nb, str(src))
    with_final = nt.run_lab("lab1_roofline", str(out), str(src), 60, True, "python3")
    without = nt.run_lab("lab1_roofline", str(out / "b"), str(src), 60, False, "python3")
    return with_final, without


def test_every_code_cell_is_timed_and_classified(run):
    with_final, without = run
    kinds = [(c["index"], c["kind"], c["part"], c["status"]) for c in with_final["cells"]]
    assert kinds == [(0, "setup", None, "ok"), (2, "answer", "a", "ok"), (3, "check", "a_flops", "ok"),
                     (4, "graded", "a_flops", "ok"), (5, "check", "b_correct", "skipped"),
                     (6, "other", None, "error"), (7, "grade-notebook", None, "ok")]
    error = with_final["cells"][5]
    assert error["why"].startswith("ZeroDivisionError") and error["seconds"] >= 0.3
    assert with_final["cells"][-1]["seconds"] >= 0.2
    assert [c["kind"] for c in without["cells"]][-1] == "other"          # --no-final drops the last cell
    assert with_final["total_s"] >= sum(c["seconds"] for c in with_final["cells"])


def test_goals_and_the_table(run):
    with_final, _ = run
    goals = nt.goals(with_final, gpu=False)
    assert goals[0] == "no error cell: NOT met (1 error cells)"
    assert goals[1].startswith("top to bottom <= 60 s: met")
    assert any(g.startswith("every graded cell < 1 s: met") for g in goals)
    data = {"machine": {"host": "h", "cores": 2, "gpu": None, "commit": "c", "when": "w"}, "command": "cmd",
            "labs": [with_final]}
    md = nt.markdown(data)
    assert "| 6 | other |  |" in md and "error: ZeroDivisionError" in md and "grade-notebook" in md
    json.dumps(data)                                                     # times.json is plain JSON


def test_speed_ratios_of_the_check_cells_beside_the_graders(tmp_path):
    # what the kernel's check cells found, and the grader's report of the saved notebook
    (tmp_path / "check-results.json").write_text(json.dumps({
        "a_flops": {"verdict": "passed", "points": 2.0, "ratio": None},
        "b_speed": {"verdict": "passed", "points": 3.0, "ratio": 0.93},
        "c_speed": {"verdict": "partial", "points": 1.0, "ratio": 0.50}}))
    (tmp_path / nt.GRADER_REPORT).write_text(json.dumps({"results": [
        {"part": "a_flops", "points": 2.0, "measurements": {}},
        {"part": "b_speed", "points": 3.0, "measurements": {"ratio": 0.95}},
        {"part": "c_speed", "points": 2.0, "measurements": {"ratio": 0.60}}]}))
    rows = nt.agreement(str(tmp_path))
    assert [(r["part"], r["check"], r["grader"]) for r in rows] == [("b_speed", 0.93, 0.95), ("c_speed", 0.5, 0.6)]
    assert rows[0]["diff"] == pytest.approx(0.02 / 0.95, abs=1e-4)
    lab_run = {"lab": "lab1_roofline", "total_s": 1.0, "cells": [], "speed": rows}
    assert "within 5% of the grader's: NOT met (1 of 2 parts)" in "\n".join(nt.goals(lab_run, gpu=True))
    lab_run["speed"] = rows[:1]
    assert "within 5% of the grader's: met (1 of 1 parts)" in "\n".join(nt.goals(lab_run, gpu=True))
    md = nt.markdown({"machine": {}, "command": "c", "labs": [dict(lab_run, edition="solutions", kernel_start_s=0)]})
    assert "| b_speed | 0.930 | 0.950 | 2.1% | 3.0, 3.0 |" in md


def test_the_last_cell_is_asked_for_the_graders_report(run, tmp_path):
    with_final, _ = run
    assert with_final["cells"][-1]["first_line"] == f'grade_notebook("lab1_roofline", report_json="{nt.GRADER_REPORT}")'


def test_the_timeline_reads_a_gzipped_trace_as_the_records_keep_it(tmp_path):
    """The records store a run's trace gzipped: the timeline reads it as it reads the plain file,
    and a trace with no spans says so instead of drawing nothing."""
    import gzip
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import grading_timeline
    rows = [{"what": "part", "lab": "lab1_roofline", "part": "b_speed", "start": 10.0 + i, "end": 10.5 + i,
             "pid": 7, "thread": 1} for i in range(3)]
    plain, packed = tmp_path / "trace.jsonl", tmp_path / "trace.jsonl.gz"
    plain.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)) + '{"torn')
    with gzip.open(packed, "wt") as f:
        f.write(plain.read_text())
    from grader import spans
    assert spans.read(str(packed)) == spans.read(str(plain)) == rows
    assert grading_timeline.main([str(packed), "--out", str(tmp_path / "out")]) == 0
    assert "lab1_roofline" in (tmp_path / "out" / "timeline.md").read_text()
    empty = tmp_path / "empty.jsonl.gz"
    with gzip.open(empty, "wt") as f:
        f.write("")
    assert grading_timeline.main([str(empty), "--out", str(tmp_path / "none")]) == 1

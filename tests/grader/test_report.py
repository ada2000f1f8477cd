import json
import os
import re

import pytest

from grader import report


def _results():
    return [
        report.PartResult("lab1_roofline", "a", "A", 2.0, 2.0, report.PASSED, "ok"),
        report.PartResult("lab1_roofline", "b", "B", 1.5, 3.0, report.PARTIAL, "0.7x", True, {"ratio": 0.7}),
        report.PartResult("lab1_roofline", "c", "C", 0.0, 3.0, report.SKIPPED, "needs a GPU", True),
    ]


def test_report_roundtrip(tmp_path):
    rep = report.Report(_results(), {"name": "NVIDIA H200", "row": "H200"}, seed=7, submission="x")
    path = tmp_path / "r.json"
    rep.write_json(str(path))
    data = report.load_json(str(path))
    assert data["points"] == 3.5 and data["max_points"] == 8.0
    assert data["gpu"]["name"] == "NVIDIA H200" and data["seed"] == 7
    assert data["versions"]["python"]


def test_validate_rejects_bad_reports():
    with pytest.raises(ValueError):
        report.validate({"schema": 1})
    bad = report.Report(_results(), {}, 1, "x").to_dict()
    bad["results"][0]["verdict"] = "great"
    with pytest.raises(ValueError):
        report.validate(bad)


def test_points_cannot_exceed_max():
    with pytest.raises(ValueError):
        report.PartResult("l", "p", "t", 3.0, 2.0, report.PASSED)


def test_table_names_skipped_parts():
    text = report.format_table(_results())
    assert "SKIP" in text and "1 part(s) skipped" in text and "3.5 / 8" in text


def test_gradescope_export(tmp_path):
    rep = report.Report(_results(), {"name": "NVIDIA H200", "row": "H200"}, seed=7, submission="x")
    path = tmp_path / "results.json"
    report.write_gradescope(rep, str(path))
    gs = json.loads(path.read_text())
    assert gs["score"] == 3.5
    assert [t["score"] for t in gs["tests"]] == [2.0, 1.5, 0.0]
    assert [t["max_score"] for t in gs["tests"]] == [2.0, 3.0, 3.0]
    assert gs["tests"][2]["output"].startswith("[skipped]")


def test_gradescope_says_where_it_was_graded_and_never_none():
    on_gpu = report.to_gradescope(report.Report(_results(), {"name": "NVIDIA H200", "row": "H200"}, seed="public",
                                                submission="x"))
    assert on_gpu["output"] == "graded on NVIDIA H200 (performance thresholds of the H200 row); inputs public"
    cpu_facts = {"present": False, "name": None, "row": None, "row_note": "", "track": None, "reason": "no GPU"}
    on_cpu = report.to_gradescope(report.Report(_results(), cpu_facts, seed="public", submission="x"))
    assert on_cpu["output"] == "graded without a GPU: 1 GPU part(s) skipped, 0 points; inputs public"
    assert "None" not in json.dumps(on_cpu) and "row" not in on_cpu["output"]


def test_nbgrader_score_is_partial_points():
    assert report.nbgrader_score(_results()[1]) == 1.5


def _thirds():
    return [
        report.PartResult("lab4_gemm", "s3_speed", "S", 2 / 3, 2.0, report.PARTIAL, "0.5x", True),
        report.PartResult("lab4_gemm", "s4_speed", "T", 3 * 0.7777777, 3.0, report.PARTIAL, "0.7x", True),
        report.PartResult("lab4_gemm", "a_desc", "D", 2.0, 2.0, report.PASSED, "ok"),
    ]


def test_points_are_rounded_for_display_only(tmp_path):
    results = _thirds()
    text = report.format_table(results)
    assert " 0.67 / 2 " in text and " 2.33 / 3 " in text and " 2.00 / 2 " in text
    assert "total 5 / 7 points" in text             # 0.6667 + 2.3333 + 2 = 5.0000 (sum of the exact points)
    assert not re.search(r"\d\.\d{3}", text), text   # never more than two decimals
    rep = report.Report(results, {"name": "NVIDIA H200", "row": "H200"}, seed=7, submission="x")
    gs = report.to_gradescope(rep)
    assert [t["score"] for t in gs["tests"]] == [0.67, 2.33, 2.0]
    assert gs["score"] == 5.0
    path = tmp_path / "r.json"
    rep.write_json(str(path))
    data = report.load_json(str(path))
    assert data["results"][0]["points"] == 2 / 3                  # the report keeps full precision
    assert data["points"] == sum(r.points for r in results)


def test_format_points():
    assert [report.format_points(x) for x in (7.333333, 3.5, 2.0, 0.004, 12.006)] == ["7.33", "3.5", "2", "0", "12.01"]


def test_reports_are_written_as_new_files(tmp_path):
    """A file made in advance (a link planted in a shared folder) is replaced, not written through."""
    from grader import report as rep
    target = tmp_path / "elsewhere.json"
    target.write_text("untouched")
    path = tmp_path / "report.json"
    path.symlink_to(target)
    rep.write_atomically(str(path), '{"points": 1}\n')
    assert not path.is_symlink() and path.read_text() == '{"points": 1}\n'
    assert target.read_text() == "untouched"


def test_an_answer_of_the_wrong_kind_is_named():
    from grader import grading
    out = grading.grade_calls([grading.Call("f", lambda: "f(3)", lambda: "12", 12, lambda g, e: g == e)])
    assert out.fraction == 0 and "returned a string where a number is expected" in out.message


@pytest.mark.slow
def test_report_folders_that_do_not_exist_yet_are_made(tmp_path):
    """The README's Gradescope example names a folder the course does not ship (grader-results/):
    the reports go there, made at the start, rather than a crash after the grading."""
    import subprocess
    import sys
    out = tmp_path / "grader-results" / "alice-lab1.json"
    gs = tmp_path / "other" / "results.json"
    proc = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops",
                           "--json", str(out), "--gradescope", str(gs)], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert report.load_json(str(out))["points"] == 2 and gs.exists()


def test_a_cases_message_says_how_many_were_public_when_hidden_ones_were_graded():
    """A check cell runs the public cases only and the grader adds the hidden ones: the grader's
    count says how many of each, so that 14/14 in the cell and 46/46 in the grader agree."""
    from grader import grading
    assert grading.cases_outcome(14, []).message == "14/14 cases right"
    out = grading.cases_outcome(46, [grading.hidden_case(3)], hidden=32)
    assert out.message.startswith("45/46 cases right [14 public, 32 hidden]; first wrong: hidden case #4"), out.message
    assert abs(out.fraction - 45 / 46) < 1e-12

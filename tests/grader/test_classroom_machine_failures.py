"""The class tools know the infrastructure verdict (the grading machine failed, not the
submission): a batch counts such a student apart from grading errors and exits non-zero, and
the gradebook's summary.html lists the part apart, neither as a grading error nor as the
student's error, and does not count it as graded."""
import os
import shutil

from grader import cli, report, spec
from grader.classroom import batch, gradebook

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
MACHINE = "the grader could not start the jail: mount /x: No such file or directory"


def _graded_as(verdicts: dict[str, str]):
    """A stand-in for batch.run_batch: each student's one piece ends with the given verdict of
    a_flops, in the files a grader process writes, then merged as the batch merges them."""
    def run_batch(subs, opts, slots, resume=False, progress=None):
        part = spec.load(LAB).part("a_flops")
        piece = batch.pieces(opts)[0]
        for sub in subs:
            v = verdicts[sub.student]
            d = batch.student_dir(opts, sub.student)
            os.makedirs(d, exist_ok=True)
            res = report.PartResult(LAB, "a_flops", part.title, part.points if v == report.PASSED else 0.0,
                                    part.points, v, MACHINE if v == report.INFRASTRUCTURE else "6/6 cases right")
            report.Report([res], {}, "public", sub.path).write_json(os.path.join(d, f"{piece.name}.report.json"))
            state = batch.INFRASTRUCTURE if v == report.INFRASTRUCTURE else batch.DONE
            batch.write_json(os.path.join(d, f"{piece.name}.status.json"), {
                "state": state, "fingerprint": batch.fingerprint(sub, opts, piece.parts, piece.needs_gpu)})
            batch.finalize(sub, opts)
    return run_batch


def test_a_batch_with_a_machine_failure_counts_it_apart_exits_non_zero_and_the_summary_says_so(
        tmp_path, monkeypatch, capsys):
    subs, out = tmp_path / "subs", tmp_path / "results"
    subs.mkdir()
    for student in ("ann", "bob"):
        shutil.copy(SOLUTION, subs / f"{student}.ipynb")
    monkeypatch.setattr(batch, "run_batch", _graded_as({"ann": report.PASSED, "bob": report.INFRASTRUCTURE}))
    rc = cli.main(["batch", LAB, str(subs), "--out", str(out), "--part", "a_flops", "--gpus", "", "--public"])
    printed = capsys.readouterr()
    assert rc != 0, printed
    assert "1/2 graded" in printed.out and "0 with grading errors" in printed.out, printed.out
    assert "1 with machine failures (infrastructure): bob" in printed.out, printed.out
    assert "the grading machine failed (not the students' code) for: bob" in printed.err, printed.err

    page = gradebook.render_html(gradebook.load_results(str(out), [LAB]), str(out))
    grading_errors = page.split("<h3>Grading errors")[1].split("<h3>")[0]
    assert "bob" not in grading_errors and "<p>None.</p>" in grading_errors, grading_errors
    assert "<h3>The grading machine failed (infrastructure)" in page
    machine = page.split("<h3>The grading machine failed (infrastructure)")[1].split("<h3>")[0]
    own_errors = page.split("error of the submission&#x27;s code")[1].split("<h3>")[0]
    assert "bob" in machine and "could not start the jail" in machine, machine
    assert "bob" not in own_errors, own_errors
    header = page.split("<h3>")[0]
    assert "grading did not finish" not in header and "the grading machine failed for 1" in header, header
    row = next(r for r in gradebook.failure_table(LAB, gradebook.load_results(str(out), [LAB])[LAB])
               if r["part"] == "a_flops")
    assert row["graded"] == 1 and row["failed"] == 0 and row["skipped"] == 0, row

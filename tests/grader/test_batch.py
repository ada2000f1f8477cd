"""python -m grader batch: discovery, fingerprints, workers, and a real batch of a generated class
(every kind of submission) that is killed halfway and resumed."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from grader import spec
from grader.classroom import batch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
STUDENT = os.path.join(ROOT, "assignments", LAB, f"{LAB}.ipynb")
CAUSAL = 'return flops / 2 if op["causal"] else flops'   # op_flops: wrong for causal attention


def _edited(src, dst, old, new):
    with open(src) as f:
        nb = json.load(f)
    hits = 0
    for cell in nb["cells"]:
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if old in text:
            hits += 1
            cell["source"] = text.replace(old, new)
    assert hits, f"{old!r} not in {src}"
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as f:
        json.dump(nb, f)


def _copy(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src) as f, open(dst, "w") as g:
        g.write(f.read())


def make_class(root, copies=2):
    """A class of lab 1 with one or more submissions of every kind, in both layouts (flat
    <student>.ipynb and <student>/<lab>/; with ``copies=1``, one of each kind, the layouts
    alternating): {student: expected verdict of a_flops}."""
    expect = {}
    layouts = iter(range(99))

    def flat(name):
        return os.path.join(root, f"{name}.ipynb")

    def nbg(name):
        return os.path.join(root, name, LAB, f"{LAB}.ipynb")
    for i in range(copies):                              # the reference solution
        _copy(SOLUTION, (flat if next(layouts) % 2 else nbg)(f"sol{i}"))
        expect[f"sol{i}"] = "passed"
    for i in range(copies):                              # the student version, untouched
        _copy(STUDENT, (flat if next(layouts) % 2 else nbg)(f"stu{i}"))
        expect[f"stu{i}"] = "failed"
    for i in range(copies):                              # partly right: causal attention wrong
        _edited(SOLUTION, (flat if next(layouts) % 2 else nbg)(f"part{i}"), CAUSAL, "return flops")
        expect[f"part{i}"] = "partial"
    with open(flat("notjson0"), "w") as f:               # broken: not JSON
        f.write('{"cells": [ this is not json')
    expect["notjson0"] = "error"
    with open(flat("list0"), "w") as f:                  # broken: JSON, but a list
        json.dump([1, 2, 3], f)
    expect["list0"] = "error"
    _edited(SOLUTION, flat("wrong0"), '    kind = op["kind"]\n', "    return 0\n")  # runs, all wrong
    expect["wrong0"] = "failed"
    os.makedirs(os.path.join(root, "empty0", LAB))       # an nbgrader folder without a notebook
    expect["empty0"] = "error"
    assert len(expect) == 3 * copies + 4
    return expect


CLASS_SIZE = 10     # make_class's default: two of each kind that is graded


# ------------------------------------------------------------------ fast: no grading

def test_discover_both_layouts(tmp_path):
    make_class(str(tmp_path))
    os.makedirs(tmp_path / ".ipynb_checkpoints")
    (tmp_path / ".hidden.ipynb").write_text("{}")
    subs = batch.discover(LAB, str(tmp_path))
    assert len(subs) == CLASS_SIZE
    by = {s.student: s for s in subs}
    assert by["sol0"].path == str(tmp_path / "sol0" / LAB / f"{LAB}.ipynb")
    assert by["sol1"].path == str(tmp_path / "sol1.ipynb")
    assert by["empty0"].path == str(tmp_path / "empty0" / LAB)    # the grader says what is missing


def test_discover_nbgrader_course_root_and_renamed_notebook(tmp_path):
    sub = tmp_path / "submitted" / "alice" / LAB
    _copy(SOLUTION, str(sub / "my copy.ipynb"))                  # one notebook, renamed: taken
    _copy(SOLUTION, str(tmp_path / "submitted" / "bob" / LAB / f"{LAB}.ipynb"))
    _copy(SOLUTION, str(tmp_path / "stray.ipynb"))               # beside submitted/: not a submission
    subs = batch.discover(LAB, str(tmp_path))
    assert [s.student for s in subs] == ["alice", "bob"]
    assert subs[0].path.endswith("my copy.ipynb")


def test_fingerprint_follows_content_thresholds_parts_and_seed(tmp_path, monkeypatch):
    nb = tmp_path / "a.ipynb"
    _copy(SOLUTION, str(nb))
    sub = batch.Submission("a", LAB, str(nb))
    opts = batch.Options(LAB, str(tmp_path / "out"), ["a_flops"])
    base = batch.full_fingerprint(sub, opts)
    assert base == batch.full_fingerprint(sub, opts)
    assert batch.full_fingerprint(sub, batch.Options(LAB, opts.results_dir, ["a_bytes"])) != base
    monkeypatch.setenv("GRADER_SECRET_SEED", "1234")
    assert batch.full_fingerprint(sub, opts) != base
    monkeypatch.delenv("GRADER_SECRET_SEED")
    real = spec.load
    import dataclasses
    monkeypatch.setattr(batch.spec, "load", lambda lab: dataclasses.replace(real(lab), thresholds_version=99))
    assert batch.full_fingerprint(sub, opts)["thresholds_version"] == 99
    monkeypatch.setattr(batch.spec, "load", real)
    nb.write_text(nb.read_text().replace("flops", "FLOPS"))
    assert batch.full_fingerprint(sub, opts)["notebook_sha256"] != base["notebook_sha256"]


def test_workers_one_per_gpu_pinned_and_cpu_parts_on_the_other_cores(monkeypatch):
    monkeypatch.setattr(batch, "cpu_count", lambda: 16)
    monkeypatch.setattr(batch, "memory_bound_workers", lambda: 64)
    slots = batch.make_slots(["0", "3"], None)
    gpu = [s for s in slots if s.name.startswith("gpu")]
    cpu = [s for s in slots if s.name.startswith("cpu")]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in gpu] == ["0", "3"]
    assert len(cpu) == 14 and all(s.env["CUDA_VISIBLE_DEVICES"] == "" for s in cpu)
    assert len(batch.make_slots([], None)) == 16                      # no GPU: one per core
    monkeypatch.setattr(batch, "memory_bound_workers", lambda: 5)
    assert len(batch.make_slots([], None)) == 5                       # bounded by memory
    # With GPUs, a submission's CPU and GPU parts are separate pieces; without, one.
    opts = batch.Options(LAB, "/tmp/x", None, gpu=True, split=True)
    assert [(p.name, p.needs_gpu) for p in batch.pieces(opts)] == [("cpu", False), ("gpu", True)]
    assert [p.name for p in batch.pieces(batch.Options(LAB, "/tmp/x", None))] == ["all"]


def test_visible_gpus_from_the_environment(monkeypatch):
    monkeypatch.delenv("GRADER_CPU_ONLY", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert batch.visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert batch.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert batch.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("GRADER_CPU_ONLY", "1")
    assert batch.visible_gpus() == []


def test_progress_counts_and_eta():
    import io
    out = io.StringIO()
    p = batch.Progress(LAB, 4, done=1, stream=out)
    p.start -= 20
    p.finished({"student": "a", "state": "done", "points": 2, "max_points": 2, "errors": [], "elapsed_s": 9})
    p.finished({"student": "b", "state": "incomplete", "points": 0, "max_points": 2, "errors": ["a_flops"]})
    line = p.line()
    assert "3/4 done, 1 left, 1 with grading errors" in line and "ETA 0m10s" in line and "failed" not in line
    assert "b: 0/2 points, errors in a_flops (grading did not finish)" in out.getvalue()


def _fake_piece(opts, sub, piece, state="done", points=2.0):
    """A piece's files as grade_piece leaves them, without running the grader."""
    from grader import report
    d = batch.student_dir(opts, sub.student)
    os.makedirs(d, exist_ok=True)
    lab_spec = spec.load(LAB)
    results = [report.PartResult(LAB, p, lab_spec.part(p).title, min(points, lab_spec.part(p).points),
                                 lab_spec.part(p).points, "passed", "", lab_spec.part(p).needs_gpu)
               for p in piece.parts]
    report.Report(results, {"present": False}, 1, sub.path).write_json(os.path.join(d, f"{piece.name}.report.json"))
    batch.write_json(os.path.join(d, f"{piece.name}.status.json"), {
        "state": state, "detail": "the grader exited with code 1" if state != "done" else "",
        "fingerprint": batch.fingerprint(sub, opts, piece.parts, piece.needs_gpu), "elapsed_s": 1.0})


def test_finalize_merges_pieces_and_resume_plans_only_what_is_missing_or_changed(tmp_path):
    opts = batch.Options(LAB, str(tmp_path / "out"), ["a_flops", "b_correct"], gpu=True, split=True)
    subs = []
    for name in ("done", "crashed", "changed", "never"):
        _copy(SOLUTION, str(tmp_path / "subs" / f"{name}.ipynb"))
        subs.append(batch.Submission(name, LAB, str(tmp_path / "subs" / f"{name}.ipynb")))
    cpu, gpu = batch.pieces(opts)
    for sub in subs[:3]:
        _fake_piece(opts, sub, cpu)
        _fake_piece(opts, sub, gpu, state="crashed" if sub.student == "crashed" else "done")
        batch.finalize(sub, opts)
    done = json.loads((tmp_path / "out" / LAB / "done" / "status.json").read_text())
    assert done["state"] == "done" and done["verdicts"] == {"a_flops": "passed", "b_correct": "passed"}
    crashed = json.loads((tmp_path / "out" / LAB / "crashed" / "report.json").read_text())
    assert [r["verdict"] for r in crashed["results"]] == ["passed", "error"]
    assert "not graded (crashed): the grader exited with code 1" in crashed["results"][1]["message"]
    with open(subs[2].path, "a") as f:
        f.write(" ")                                             # a new version of the notebook
    todo, already = batch.plan(subs, opts, resume=True)
    assert [s.student for s, _ in todo] == ["crashed", "changed", "never"] and len(already) == 1
    assert len(batch.plan(subs, opts, resume=False)[0]) == 4
    # A result of the old notebook is not merged as if it were the new one's.
    st = batch.finalize(subs[2], opts)
    assert st["state"] == "incomplete" and st["pieces"]["cpu"]["state"] == "stale"


def _batch_cli(*argv):
    """`python -m grader batch ...` in this process; returns its exit status."""
    import argparse

    from grader.classroom import commands
    ap = argparse.ArgumentParser()
    commands.register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["batch", *argv])
    return args.func(args)


def test_resume_keeps_the_seed_of_the_run_it_resumes(tmp_path, monkeypatch, capsys):
    """The README's --resume after a secret run: without the secret (or with another) it stops
    before grading anything and says why; with the same secret it resumes."""
    monkeypatch.setenv("GRADER_CPU_ONLY", "1")
    _copy(SOLUTION, str(tmp_path / "subs" / "ann.ipynb"))
    out = tmp_path / "results"
    opts = batch.Options(LAB, str(out), ["a_flops"])
    sub = batch.Submission("ann", LAB, str(tmp_path / "subs" / "ann.ipynb"))
    monkeypatch.setenv("GRADER_SECRET_SEED", "s3cret")
    _fake_piece(opts, sub, batch.pieces(opts)[0])
    before = batch.finalize(sub, opts)
    assert before["state"] == "done" and before["fingerprint"]["seed"].startswith("secret (fingerprint ")
    args = (LAB, str(tmp_path / "subs"), "--out", str(out), "--part", "a_flops", "--gpus", "", "--resume")
    for secret in (None, "another"):
        if secret is None:
            monkeypatch.delenv("GRADER_SECRET_SEED")
        else:
            monkeypatch.setenv("GRADER_SECRET_SEED", secret)
        capsys.readouterr()
        assert _batch_cli(*args) == 2
        err = capsys.readouterr().err
        assert "--resume: the results in" in err and before["fingerprint"]["seed"] in err, err
        assert ("GRADER_SECRET_SEED is not set" in err) == (secret is None), err
        assert batch.read_json(str(out / LAB / "ann" / "status.json")) == before      # nothing regraded
    monkeypatch.setenv("GRADER_SECRET_SEED", "s3cret")
    assert _batch_cli(*args) == 0
    captured = capsys.readouterr()
    assert "1 already graded and unchanged (--resume), 0 to grade" in captured.out, captured.out
    assert "PUBLIC seed" not in captured.err


def test_batch_without_a_secret_seed_warns(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADER_CPU_ONLY", "1")
    monkeypatch.delenv("GRADER_SECRET_SEED", raising=False)
    _copy(SOLUTION, str(tmp_path / "subs" / "ann.ipynb"))
    out = tmp_path / "results"
    opts = batch.Options(LAB, str(out), ["a_flops"])
    sub = batch.Submission("ann", LAB, str(tmp_path / "subs" / "ann.ipynb"))
    _fake_piece(opts, sub, batch.pieces(opts)[0])
    assert batch.finalize(sub, opts)["fingerprint"]["seed"] == "public"
    assert _batch_cli(LAB, str(tmp_path / "subs"), "--out", str(out), "--part", "a_flops", "--gpus", "",
                      "--resume") == 0
    err = capsys.readouterr().err
    assert ("warning: grading with the PUBLIC seed: hidden cases are ones students can reproduce; "
            "set GRADER_SECRET_SEED") in err, err


# ------------------------------------------------------------------ real grading

def _grader(*args, **kw):
    env = dict(os.environ, PYTHONPATH=ROOT, GRADER_CPU_ONLY="1")
    env.pop("GRADER_SECRET_SEED", None)
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=kw.get("timeout", 900))


def _statuses(lab_dir):
    out = {}
    for student in sorted(os.listdir(lab_dir)) if os.path.isdir(lab_dir) else []:
        path = os.path.join(lab_dir, student, "status.json")
        if os.path.exists(path):
            with open(path) as f:
                out[student] = json.load(f)
    return out


def _graders_running(marker):
    """Processes whose command line names ``marker`` (our results folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_a_class_killed_halfway_then_resumed(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "results"
    expect = make_class(str(subs), copies=1)      # one of each kind: the gradings are the test's cost
    size = len(expect)
    kill_at = size - 2                            # the broken ones finish at once; two graded ones too
    lab_dir = str(out / LAB)
    env = dict(os.environ, PYTHONPATH=ROOT, GRADER_CPU_ONLY="1")
    env.pop("GRADER_SECRET_SEED", None)
    cmd = [sys.executable, "-m", "grader", "batch", LAB, str(subs), "--out", str(out), "--part", "a_flops"]
    t0 = time.monotonic()
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while len(_statuses(lab_dir)) < kill_at and proc.poll() is None and time.monotonic() - t0 < 600:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)                   # killed halfway
        rc = proc.wait(timeout=60)
    first_s = time.monotonic() - t0
    first = _statuses(lab_dir)
    log_text = (tmp_path / "first.log").read_text()
    assert rc == 130, log_text
    assert kill_at <= len(first) < size, log_text
    assert "rerun with --resume" in log_text
    assert not _graders_running(str(out)), "the running graders were not stopped"
    assert all(st["state"] == "done" for st in first.values())

    # One finished student resubmits a fixed notebook: that one is graded again.
    changed = next(s for s in first if expect[s] in ("partial", "failed"))
    path = first[changed]["notebook"]
    _copy(SOLUTION, path)
    expect[changed] = "passed"

    t1 = time.monotonic()
    p = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    resume_s = time.monotonic() - t1
    assert p.returncode == 0, p.stdout + p.stderr
    assert (f"{len(first) - 1} already graded and unchanged (--resume), {size + 1 - len(first)} to grade"
            in p.stdout), p.stdout
    final = _statuses(lab_dir)
    assert sorted(final) == sorted(expect)
    for student, st in first.items():                 # not regraded: the very same status
        if student != changed:
            assert final[student] == st, student
    assert final[changed]["finished"] != first[changed]["finished"]
    for student, verdict in expect.items():
        with open(os.path.join(lab_dir, student, "report.json")) as f:
            rep = json.load(f)
        assert [r["verdict"] for r in rep["results"]] == [verdict], (student, rep["results"])
        with open(os.path.join(lab_dir, student, "results.json")) as f:
            assert json.load(f)["tests"][0]["name"].startswith(f"{LAB} / a_flops")
    assert final["notjson0"]["errors"] == ["a_flops"] and final["sol0"]["errors"] == []
    with open(os.path.join(lab_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["students"] == size and summary["done"] == size
    assert sorted(summary["grading_errors"]) == sorted(s for s, v in expect.items() if v == "error")
    # A second --resume has nothing to do.
    p2 = _grader("batch", LAB, str(subs), "--out", str(out), "--part", "a_flops", "--resume")
    assert (p2.returncode == 0 and f"{size} already graded and unchanged (--resume), 0 to grade"
            in p2.stdout), p2.stdout
    print(f"\nbatch of {size} (a_flops, {batch.cpu_count()} cores): first run {first_s:.0f} s for {len(first)} "
          f"before the kill, resume {resume_s:.0f} s for {size + 1 - len(first)}; per submission "
          + ", ".join(f"{s}={st['elapsed_s']:.1f}s" for s, st in sorted(final.items())))

    # The class's gradebook from these results.
    g = _grader("gradebook", str(out))
    assert g.returncode == 0, g.stdout + g.stderr
    import csv
    with open(out / "gradebook" / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert len(rows) == size
    assert {s: rows[s]["a_flops verdict"] for s in rows} == expect
    assert rows["sol0"]["total"] == "2"
    for student, verdict in expect.items():           # points as the verdicts say
        if verdict == "partial":
            assert 0 < float(rows[student]["a_flops"]) < 2, student
        elif verdict == "failed":
            assert float(rows[student]["a_flops"]) == 0, student
    html = (out / "gradebook" / "summary.html").read_text()
    assert "notjson0" in html and "list0" in html and "empty0" in html


@pytest.mark.slow
def test_cpu_and_gpu_pieces_are_merged(tmp_path):
    """With a GPU worker and a CPU worker, a submission's CPU parts and GPU parts are graded
    apart (the GPU worker pinned to its GPU) and merged into one report. Here the 'GPU' is an id
    only: the GPU part is skipped by the grader, which is what the report then says."""
    _copy(SOLUTION, str(tmp_path / "subs" / "ann.ipynb"))
    out = tmp_path / "results"
    p = _grader("batch", LAB, str(tmp_path / "subs"), "--out", str(out), "--part", "b_correct",
                "--part", "a_flops", "--gpus", "0", "--cpu-workers", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 GPU worker(s) (0) and 1 CPU worker(s)" in p.stdout
    d = out / LAB / "ann"
    rep = json.loads((d / "report.json").read_text())
    assert [(r["part"], r["verdict"]) for r in rep["results"]] == [("a_flops", "passed"), ("b_correct", "skipped")]
    assert rep["points"] == 2 and rep["max_points"] == 5
    st = json.loads((d / "status.json").read_text())
    assert st["pieces"]["gpu"]["cuda_visible_devices"] == "0"
    assert st["pieces"]["cpu"]["cuda_visible_devices"] == ""
    gs = json.loads((d / "results.json").read_text())
    assert gs["score"] == 2 and len(gs["tests"]) == 2


@pytest.mark.slow
def test_a_syntax_error_is_the_students_not_a_grading_error(tmp_path):
    """The README's definition: a grading error is grading that did not finish or a notebook that
    could not be read. A syntax error in a student's cell is that student's error verdict (0
    points for the parts it breaks), not a grading error."""
    subs, out = tmp_path / "subs", tmp_path / "results"
    _edited(SOLUTION, str(subs / "syn.ipynb"), CAUSAL, CAUSAL + ")")     # a syntax error in a_flops' cell
    (subs / "bad.ipynb").write_text('{"cells": [ not json')
    p = _grader("batch", LAB, str(subs), "--out", str(out), "--part", "a_flops")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 with grading errors: bad;" in p.stdout, p.stdout
    syn = json.loads((out / LAB / "syn" / "report.json").read_text())["results"][0]
    assert syn["verdict"] == "error" and "SyntaxError" in syn["message"], syn
    summary = json.loads((out / LAB / "summary.json").read_text())
    assert summary["grading_errors"] == ["bad"]
    g = _grader("gradebook", str(out))
    assert g.returncode == 0, g.stdout + g.stderr
    html = (out / "gradebook" / "summary.html").read_text()
    grading_errors, code_errors = html.split("Grading errors")[1].split("error of the submission&#x27;s code")
    assert "bad" in grading_errors and "syn" not in grading_errors and "syn" in code_errors


def test_machine_failures_are_counted_apart_and_graded_again(tmp_path):
    """A part the grading machine failed to grade (the infrastructure verdict) is neither the
    student's error nor a grading error: the student is counted apart, the report keeps what the
    grader said, and --resume grades the submission again."""
    from grader import report
    opts = batch.Options(LAB, str(tmp_path / "out"), ["a_flops"])
    _copy(SOLUTION, str(tmp_path / "subs" / "ann.ipynb"))
    sub = batch.Submission("ann", LAB, str(tmp_path / "subs" / "ann.ipynb"))
    piece = batch.pieces(opts)[0]
    d = batch.student_dir(opts, sub.student)
    os.makedirs(d)
    part = spec.load(LAB).part("a_flops")
    report.Report([report.PartResult(LAB, "a_flops", part.title, 0.0, part.points, report.INFRASTRUCTURE,
                                     "the jail could not be set up")], {}, "public", sub.path).write_json(
        os.path.join(d, "all.report.json"))
    batch.write_json(os.path.join(d, "all.status.json"), {
        "state": batch.INFRASTRUCTURE, "fingerprint": batch.fingerprint(sub, opts, piece.parts, piece.needs_gpu)})
    st = batch.finalize(sub, opts)
    assert st["state"] == batch.INFRASTRUCTURE and st["infrastructure"] == ["a_flops"]
    assert batch.has_machine_failures(st) and not batch.has_grading_errors(st)
    assert json.loads((tmp_path / "out" / LAB / "ann" / "report.json").read_text())["results"][0]["message"] == \
        "the jail could not be set up"
    assert [s.student for s, _ in batch.plan([sub], opts, resume=True)[0]] == ["ann"]
    summary = batch.write_summary(opts.results_dir, LAB)
    assert summary["machine_failures"] == ["ann"] and summary["grading_errors"] == []
    import io
    out = io.StringIO()
    p = batch.Progress(LAB, 1, stream=out)
    p.finished(st)
    assert "the grading machine failed for a_flops" in out.getvalue() and "1 with machine failures" in p.line()

"""Profiled runs (grader/executed.py): many kernels in one run of ncu, and a kernel that fails
under the profiler.

A build part's mechanisms count on a GPU of its arch only when the profiler shows them executing.
Two things follow, tested here on the CPU with a stand-in for ncu that plays the profiled
process's part (it reads the jobs and answers with a source page and a line per job):

- the kernels of several parts go through one run, each kernel's counters are its own (blocks
  are taken in launch order and must carry the names the plan launches), and a kernel that fails
  stops that run: the kernels after it are profiled again in a new one;
- a kernel that fails in the profiled run (or does not build at its shape) is not a profiler that
  could not run: nothing shows its mechanisms executing, so its arch scores nothing. Before this,
  any failed profiled run fell back to the static reading, which a kernel could choose by failing
  at the one shape the grader profiles.
"""
import json
import os
import sys
import threading
import time
import types

import pytest

from grader import executed, grading, hardware, inputs, spec
from grader.context import Context

HEADER = ('"Address","Source","Instructions Executed","Thread Instructions Executed",'
          '"Predicated-On Thread Instructions Executed"')

# The stand-in for ncu: its last argument is the job folder (sandbox.trusted_command's). A launch
# named crash* fails (the line says so and the process ends); one named trap* ends the process
# after the job's launching mark, with no line of its own (as ncu does); one named lost* is left out of
# the page; every other launch gets a block whose instructions name the launch and the job.
FAKE_NCU = r'''
import json, os, sys
d = sys.argv[-1]
jobs = json.load(open(os.path.join(d, "jobs.json")))
with open(LOG, "a") as log:
    log.write(json.dumps([ln["name"] for j in jobs for ln in j["plan"]["launches"]]) + "\n")
out = open(os.path.join(d, "results.jsonl"), "a")
for i, job in enumerate(jobs):
    out.write(json.dumps({"launching": i}) + "\n")
    out.flush()
    for ln in job["plan"]["launches"]:
        if ln["name"].startswith("trap"):      # ncu ends the process: no line of the kernel's own, a page cut off
            print('"Kernel Name","%s",' % ln["name"])
            print('"Address","Source","Instructions Executed"')
            print('"0x7000","NOP","0"')
            sys.exit(9)
        if ln["name"].startswith("crash"):
            out.write(json.dumps({"ok": False, "failed": True, "message": "CUDA error 715 (illegal instruction)"}) + "\n")
            sys.exit(0)
        if ln["name"].startswith("lost"):
            continue
        print('"Kernel Name","%s",' % ln["name"])
        print(HEADER)
        print('"0x7000","HGMMA.64x128x16 job%d","4","128","128"' % i)
        print('"0x7010","@P0 UTMALDG.2D [UR8], [UR4]","4","128","0"')
    out.write(json.dumps({"ok": True, "message": "job %d right" % i}) + "\n")
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    script = tmp_path / "ncu.py"
    log = tmp_path / "runs.log"
    script.write_text(f"HEADER = {HEADER!r}\nLOG = {str(log)!r}\n" + FAKE_NCU)
    exe = tmp_path / "ncu"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setattr(executed, "ncu_path", lambda: str(exe))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def job(*names):
    plan = {"launches": [{"name": n} for n in names]}
    return executed.Job(plan, b"\0", "// ptx", {"lab": "lab4_gemm", "part": "s1_correct"})


def test_several_kernels_share_one_run_and_keep_their_own_counters(fake_ncu):
    res = executed.profile_many([job("a"), job("b", "b"), job("c")])
    assert fake_ncu() == [["a", "b", "b", "c"]]                      # one run of ncu for all
    assert [r.sass is not None for r in res] == [True, True, True]
    assert "job0" in res[0].sass and "job1" not in res[0].sass
    assert "job1" in res[1].sass and "job2" in res[2].sass
    assert all(r.batch == 3 and r.correct for r in res)
    assert all("UTMALDG" not in r.sass for r in res)                  # predicated off: did not execute
    assert (res[1].instructions, res[1].executed) == (2, 1)          # its two launches merged by name


def test_a_kernel_that_fails_stops_the_run_and_the_kernels_after_it_run_again(fake_ncu):
    res = executed.profile_many([job("a"), job("crash"), job("c")])
    assert fake_ncu() == [["a", "crash", "c"], ["c"]]
    assert res[0].sass is not None and "job0" in res[0].sass
    assert res[1].failed and res[1].sass is None and "illegal instruction" in res[1].why
    assert res[1].evidence.startswith("not shown to execute: the kernel failed in the profiled correctness run")
    assert res[2].sass is not None and not res[2].failed


def test_a_kernel_that_ends_the_run_without_a_word_failed_and_is_not_read_statically(fake_ncu):
    """Under ncu a trap ends the whole process (exit 9, nothing written after the kernel's launch):
    before, that run 'failed' as the grader's problem and the part fell back to the static reading."""
    res = executed.profile_many([job("a"), job("trap"), job("c")])
    assert fake_ncu() == [["a", "trap", "c"], ["a"], ["c"]]    # the page is cut off: the kernel before runs again
    assert res[0].sass is not None and not res[0].failed
    assert res[1].failed and res[1].sass is None and "ended the profiled run" in res[1].why
    assert res[1].evidence.startswith("not shown to execute: the kernel failed in the profiled correctness run")
    assert res[2].sass is not None and not res[2].failed


def test_counters_are_taken_in_launch_order_and_must_match_the_plan(fake_ncu):
    """A kernel missing from the page shifts nothing onto its neighbour: its block is not there,
    and the next block carries another name."""
    res = executed.profile_many([job("lost"), job("b")])
    assert res[0].sass is None and "where the plan launches lost" in res[0].why
    assert not res[0].failed
    assert res[1].sass is not None and "job0" in res[1].sass     # b, profiled again alone: its own block


def test_a_kernel_the_run_showed_nothing_of_is_profiled_again_alone(fake_ncu):
    """Seen on the H200 while six labs were graded at once: a run whose page lacked a kernel, or
    whose process wrote no outcome, through no fault of the kernel. It is profiled once more, by
    itself, before its part is read statically; the message keeps both reasons."""
    res = executed.profile_many([job("lost"), job("b")])
    assert fake_ncu() == [["lost", "b"], ["lost"], ["b"]]        # b's block was read as lost's: b again too
    assert res[0].sass is None and not res[0].failed
    assert "where the plan launches lost; profiled again alone: ncu reported nothing where the plan launches lost" \
        in res[0].why, res[0].why
    # a kernel that failed is not profiled again: its failure is its own
    fake_ncu_runs = len(fake_ncu())
    res = executed.profile_many([job("crash")])
    assert res[0].failed and len(fake_ncu()) == fake_ncu_runs + 1


def test_a_machine_that_refuses_the_counters_is_not_asked_twice(monkeypatch):
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return types.SimpleNamespace(stdout="", stderr="==ERROR== ERR_NVGPUCTRPERM", returncode=1)
    monkeypatch.setattr(executed, "ncu_path", lambda: "/bin/ncu")
    monkeypatch.setattr(executed.subprocess, "run", run)
    res = executed.profile_many([job("k1")])
    assert len(calls) == 1 and res[0].why == executed.REFUSED_WHY


def test_the_profiler_runs_only_between_the_profiled_process_own_start_and_stop(monkeypatch, tmp_path):
    """ncu's command line: counters from cudaProfilerStart on (the profiled process brackets the
    submitted kernel's launch with it), only the plan's kernels, as many launches as planned."""
    seen = {}

    def run(cmd, **kw):
        seen["cmd"] = cmd
        return types.SimpleNamespace(stdout="", stderr="", returncode=1)
    monkeypatch.setattr(executed, "ncu_path", lambda: "/bin/ncu")
    monkeypatch.setattr(executed.subprocess, "run", run)
    res = executed.profile_many([job("k1", "k2")])
    cmd = seen["cmd"]
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:^(k1|k2)$"
    assert cmd[cmd.index("--launch-count") + 1] == "2"
    assert res[0].sass is None and not res[0].failed and "the profiled run failed (exit 1)" in res[0].why
    src = open(os.path.join(os.path.dirname(executed.__file__), "profiled.py")).read()
    assert src.index("torch.cuda.profiler.start()") < src.index("kernel(*prob.args") < src.index(
        "torch.cuda.profiler.stop()")


def test_requests_made_while_a_run_is_under_way_share_the_next_run(monkeypatch, tmp_path):
    runs = []
    started = threading.Event()

    def profile_many(jobs):
        runs.append([j.inputs["part"] for j in jobs])
        started.set()
        time.sleep(0.3)
        return [executed.Executed("listing", batch=len(jobs)) for _ in jobs]
    monkeypatch.setattr(executed, "profile_many", profile_many)
    batcher = executed.Batcher(str(tmp_path))
    mk = lambda p: executed.Job({"launches": []}, b"", "", {"part": p})   # noqa: E731
    got = {}
    first = threading.Thread(target=lambda: got.setdefault("a", batcher.profile(mk("a"))))
    first.start()
    started.wait(5)
    later = [threading.Thread(target=lambda p=p: got.setdefault(p, batcher.profile(mk(p)))) for p in "bc"]
    for t in later:
        t.start()
    for t in [first, *later]:
        t.join(10)
    assert runs[0] == ["a"] and sorted(runs[1]) == ["b", "c"] and len(runs) == 2
    assert got["a"].batch == 1 and got["b"].batch == got["c"].batch == 2


def test_a_worker_waiting_for_someone_elses_run_builds_kernels_ahead_meanwhile(monkeypatch, tmp_path):
    """One worker: its build part waits for a profiled run another holder makes; the kernels queued
    to be built ahead are built by that worker while it waits (each outside the wait's idle
    span), not after the part. Before, the worker sat idle for the whole run."""
    from grader import run
    monkeypatch.setattr(executed, "profile_many", lambda jobs: [executed.Executed("listing", batch=len(jobs))
                                                                for _ in jobs])
    batcher = executed.Batcher(str(tmp_path))
    holder = threading.Event()
    order = []

    def other_holder():                       # another grading process, running ncu for 1.5 s
        d = batcher._folder(executed.Job({}, b"", "", {}))
        fd = os.open(os.path.join(d, "queue.lock"), os.O_CREAT | os.O_RDWR)
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
        holder.set()
        time.sleep(1.5)
        order.append("the other run ends")
        os.close(fd)
    t = threading.Thread(target=other_holder)
    t.start()
    holder.wait(5)

    class Backend:
        deadline = 0.0

    worker = types.SimpleNamespace(backend=Backend())
    part = spec.load("lab4_gemm").part("s1_correct")
    ahead = [run._BuildAhead(part, f"kernel{i}", (), {}) for i in range(2)]

    def grade_part(w, item):
        if isinstance(item, run._BuildAhead):
            w.backend.deadline = 99.0
            order.append(item.name)
            return
        if item == "build part":
            w.backend.deadline = 7.0
            order.append("wait starts")
            batcher.profile(executed.Job({"launches": []}, b"", "", {"part": "s1_build_sm90"}))
            order.append(f"wait ends (deadline {w.backend.deadline})")
        else:
            order.append(item)
    run._in_pool(1, ["build part", *ahead, "correctness part"], lambda: worker, grade_part)
    t.join(5)
    assert order == ["wait starts", "kernel0", "kernel1", "the other run ends", "wait ends (deadline 7.0)",
                     "correctness part"], order


def _queue_fake(log):
    """A stand-in for profile_many that writes each run's parts to ``log`` (one line per run) and
    answers each job with its own part's name."""
    def profile_many(jobs):
        with open(log, "a") as f:
            f.write(json.dumps([j.inputs["part"] for j in jobs]) + "\n")
        time.sleep(0.6)
        return [executed.Executed(f"listing of {j.inputs['part']}", message=j.inputs["part"], batch=len(jobs))
                for j in jobs]
    return profile_many


def _ask(root, log, part, out):
    """In a process of its own (as each lab's grading process is): one request to the queue."""
    executed.profile_many = _queue_fake(log)
    res = executed.Batcher(root).profile(executed.Job({"launches": []}, b"\0\1", "// ptx", {"part": part}, gpu="GPU-x"))
    with open(out, "w") as f:
        json.dump({"message": res.message, "sass": res.sass, "batch": res.batch}, f)


def test_labs_graded_in_separate_processes_share_one_profiled_run(tmp_path):
    """check all grades each lab in its own process: a request another process makes while a run
    is under way joins the next run, whichever process holds the queue then, and each process gets
    the outcome of its own kernel (before, each process had its own batcher, and parts of
    different labs never shared a run: 13 runs of ncu in check all)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    root, log = str(tmp_path / "private"), str(tmp_path / "runs.log")
    os.makedirs(root)
    first = ctx.Process(target=_ask, args=(root, log, "lab4 s1", str(tmp_path / "a.json")))
    first.start()
    deadline = time.time() + 10
    while not os.path.exists(log) and time.time() < deadline:
        time.sleep(0.02)
    later = [ctx.Process(target=_ask, args=(root, log, p, str(tmp_path / f"{i}.json")))
             for i, p in enumerate(["lab5 s5", "lab6 s2", "lab2 b"])]
    for p in later:
        p.start()
    for p in [first, *later]:
        p.join(20)
        assert p.exitcode == 0
    runs = [json.loads(line) for line in open(log)]
    assert runs[0] == ["lab4 s1"] and sorted(runs[1]) == ["lab2 b", "lab5 s5", "lab6 s2"] and len(runs) == 2, runs
    for name, part in [("a", "lab4 s1"), ("0", "lab5 s5"), ("1", "lab6 s2"), ("2", "lab2 b")]:
        got = json.load(open(tmp_path / f"{name}.json"))
        assert got["message"] == part and got["sass"] == f"listing of {part}", got
        assert got["batch"] == (1 if part == "lab4 s1" else 3)
    assert not [n for n in os.listdir(os.path.join(root, os.listdir(root)[0])) if n.endswith((".job", ".result"))]


def test_a_request_left_by_a_dead_holder_runs_again_and_one_of_a_dead_asker_is_dropped(monkeypatch, tmp_path):
    log = str(tmp_path / "runs.log")
    monkeypatch.setattr(executed, "profile_many", _queue_fake(log))
    batcher = executed.Batcher(str(tmp_path))
    job = lambda p: executed.Job({"launches": []}, b"", "", {"part": p}, gpu="GPU-x")  # noqa: E731
    folder = batcher._folder(job("x"))
    # a request of a live process whose holder died mid-run (no outcome written), and one whose asker is gone
    import subprocess
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    executed._write_json(os.path.join(folder, f"{1:020d}-{os.getpid()}-1.job"), executed._job_record(job("orphan")))
    executed._write_json(os.path.join(folder, f"{2:020d}-{gone.pid}-1.job"), executed._job_record(job("dead asker")))
    # and an outcome its asker died before it could take
    executed._write_json(os.path.join(folder, f"{3:020d}-{gone.pid}-2.job"), executed._job_record(job("answered")))
    executed._write_json(os.path.join(folder, f"{3:020d}-{gone.pid}-2.result"), {"sass": None, "why": "x"})
    res = batcher.profile(job("mine"))
    assert res.message == "mine" and res.batch == 2
    assert [json.loads(line) for line in open(log)] == [["orphan", "mine"]]
    left = sorted(os.listdir(folder))
    assert f"{1:020d}-{os.getpid()}-1.result" in left and not [n for n in left if "dead" in n or f"-{gone.pid}-" in n]


def test_an_outcome_taken_while_another_holder_lists_the_folder_is_neither_run_again_nor_answered(monkeypatch, tmp_path):
    """The asker of a finished request takes its outcome without the lock, while the next holder may
    be listing the folder: the request is gone before its outcome, and a request found in the listing
    but gone when read is skipped (CI once found a stray "unreadable request" outcome left behind)."""
    log = str(tmp_path / "runs.log")
    monkeypatch.setattr(executed, "profile_many", _queue_fake(log))
    batcher = executed.Batcher(str(tmp_path))
    job = executed.Job({"launches": []}, b"", "", {"part": "taken"}, gpu="GPU-x")
    folder = batcher._folder(job)
    rid = f"{1:020d}-{os.getpid()}-1"
    executed._write_json(os.path.join(folder, rid + ".job"), executed._job_record(job))
    executed._write_json(os.path.join(folder, rid + ".result"), {"sass": None, "why": "done"})
    removed = []
    real_unlink = os.unlink
    monkeypatch.setattr(executed.os, "unlink", lambda p: (removed.append(os.path.basename(p)), real_unlink(p)))
    assert executed._take_result(os.path.join(folder, rid + ".result")).why == "done"
    assert removed == [rid + ".job", rid + ".result"]
    # the holder listed the request just before it was taken
    real_listdir = os.listdir
    monkeypatch.setattr(executed.os, "listdir", lambda d: [*real_listdir(d), rid + ".job"])
    batcher._drain(folder)
    assert not [n for n in real_listdir(folder) if n.startswith(rid)] and not os.path.exists(log)


FAKE_H200 = hardware.Device(present=True, driver_name="NVIDIA H200", spec=hardware.SPECS["H200"], row_note="test",
                            uuid="GPU-test", sm_count=132)


@pytest.mark.parametrize("why", ["fails", "does not build"])
def test_a_kernel_that_fails_in_the_profiled_run_scores_nothing_on_that_arch(monkeypatch, why):
    from test_dead_code import DECOY_SOURCE, serve
    serve(monkeypatch, DECOY_SOURCE, "decoy")          # every mechanism of b_build, launched
    lab = spec.load("lab1_roofline")
    ctx = Context(lab, lab.part("b_build"), inputs.PUBLIC_SEED, FAKE_H200)
    module = types.SimpleNamespace(build_scale_add=lambda *a, **kw: None)
    if why == "fails":
        monkeypatch.setattr(executed.BATCHER, "profile", lambda job: executed.Executed(
            None, "LaunchError: CUDA error 715 (illegal instruction)", correct=False, failed=True))
    else:
        from grader import build
        real = build.compile_only

        def compile_only(kernel, arch, want_sass=False, own_ptx=False):
            if not want_sass:                          # the profiled shape's build
                raise build.BuildError("ptxas: too much shared memory")
            return real(kernel, arch, want_sass, own_ptx)
        monkeypatch.setattr(build, "compile_only", compile_only)
    out = grading.build_part(module, ctx)
    assert out.fraction == 0, out.message               # the static sm_100a half is not trusted either
    assert "mechanisms not shown to execute on this GPU (build_scale_add on sm_90a: the kernel failed" in out.message
    assert "sm_90a: compiled; not shown to execute: the kernel failed in the profiled correctness run" in out.message
    assert ("illegal instruction" if why == "fails" else "does not build at") in out.message
    assert "sm_100a: compiled; static (launched entries only" in out.message


def test_check_all_starts_the_longest_labs_first_on_a_gpu():
    from grader import cli
    order = sorted(spec.lab_names(), key=lambda lab: -cli._expected_length(lab, True))
    assert set(order[:2]) == {"lab5_gemm_pipeline", "lab6_flash_attention"}, order
    assert order[-1] in ("lab1_roofline", "lab2_tma", "lab3_layout_swizzle"), order

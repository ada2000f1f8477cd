"""A lab's untimed parts spread over several sandboxed children, each with a user of its own."""
import os

import pytest

from grader import hardware, inputs, report, run, sandbox


def test_children_never_share_a_user():
    if os.geteuid() != 0:
        pytest.skip("own users need root")
    a, fa = sandbox.claim_uid()
    b, fb = sandbox.claim_uid()
    assert a != b
    os.close(fa)
    c, fc = sandbox.claim_uid()
    assert c == a                      # a freed user is handed out again
    os.close(fb)
    os.close(fc)


def test_parts_spread_over_workers_grade_as_one(monkeypatch):
    made = []
    real = run._Worker

    def counting(*a, **k):
        w = real(*a, **k)
        made.append(w)
        return w

    monkeypatch.setattr(run, "_Worker", counting)
    device = hardware.Device(False, "", None, "", reason="test")
    parts = ["a_flops", "a_bytes", "a_predict", "c_roofline", "b_correct"]
    res = run.check_lab("lab1_roofline", None, inputs.PUBLIC_SEED, device, parts=parts,
                        progress=lambda m: None, workers=2)
    assert len(made) == 2
    assert [r.part for r in res] == ["a_flops", "a_bytes", "a_predict", "b_correct", "c_roofline"]
    assert [r.verdict for r in res] == [report.PASSED] * 3 + [report.SKIPPED, report.PASSED]
    assert all(not w.session.alive for w in made)


def test_user_id_locks_live_where_no_child_can_write(tmp_path, monkeypatch):
    """Lock files in a shared /tmp could be planted to stop grading; they live in the grader's
    private folder, and a folder of that name made by someone else is refused."""
    if os.geteuid() != 0:
        pytest.skip("own users need root")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    uid, fd = sandbox.claim_uid()
    os.close(fd)
    private = sandbox.private_dir()
    assert os.path.exists(os.path.join(private, f"uid-{uid}.lock"))
    assert os.stat(private).st_mode & 0o777 == 0o700 and os.stat(private).st_uid == os.geteuid()
    os.chmod(private, 0o777)                          # opened up: not private any more
    with pytest.raises(sandbox.SandboxFailure, match="not a private folder"):
        sandbox.private_dir()
    os.chmod(private, 0o700)


def test_the_kernels_of_gpu_parts_are_planned_ahead_and_ordered_for_the_pool():
    from grader import spec
    lab = spec.load("lab5_gemm_pipeline")
    gpu = hardware.Device(True, "NVIDIA H200 (fake)", hardware.SPECS["H200"], "test", sm_count=132)
    ahead = run.builds_ahead(lab, lab.parts, inputs.PUBLIC_SEED, gpu, public_only=False)
    timed = [a for a in ahead if a.part.thresholds]
    assert timed and ahead[-len(timed):] == timed                      # shared kernels go to correctness
    cpu = [p for p in lab.parts if not p.needs_gpu]
    untimed = [p for p in lab.parts if p.needs_gpu and not p.thresholds]
    order = run.pool_order(cpu, untimed, ahead)
    assert order[:len(cpu)] == cpu and order[-len(timed):] == timed     # CPU first, timed kernels last
    assert sorted(map(id, order)) == sorted(map(id, cpu + untimed + ahead))   # everything, once
    own = [p for p in untimed if not any(a.part is p for a in ahead)]  # parts with their own runner
    assert order[len(cpu):len(cpu) + len(own)] == own
    for p in untimed:                                                  # a part right after its kernels
        if p not in own:
            i = order.index(p)
            mine = [a for a in ahead if a.part is p]
            assert order[i - len(mine):i] == mine
    assert len({(a.name, a.args) for a in ahead}) == len(ahead)          # each kernel once
    timed_parts = [p for p in lab.parts if p.needs_gpu and p.thresholds]
    with_turns = run.pool_order(cpu, untimed, ahead, timed_parts)
    assert with_turns[:len(order) - len(timed)] == order[:len(order) - len(timed)]
    for p in timed_parts:                                              # each timed part right after its kernels
        i = next(k for k, x in enumerate(with_turns) if isinstance(x, run._TimedTurn) and x.part is p)
        mine = [a for a in ahead if a.part is p]
        assert with_turns[i - len(mine):i] == mine
    assert len(with_turns) == len(order) + len(timed_parts)
    assert {a.part.id for a in ahead} == {p.id for p in lab.parts if p.needs_gpu and p.kind == "kernel"}
    assert all(a.name.startswith("hopper_") for a in ahead)             # the GPU's track
    assert {a.kwargs.get("num_sms") for a in ahead if a.name != "hopper_step5"} == {132}   # read from the GPU
    public = run.builds_ahead(lab, lab.parts, inputs.PUBLIC_SEED, gpu, public_only=True)
    assert len(public) < len(ahead)                                      # the hidden shapes are not built for a check


def _gate_result(verdict, message="ok"):
    from grader import report
    return report.PartResult("lab", "p", "t", 0.0, 1, verdict, message, True)


def test_a_timed_part_waits_for_every_untimed_gpu_verdict_and_defers_after_a_hang():
    """The timed turn of a lab's pool starts once all its correctness parts have their verdicts;
    a correctness part that timed out beside others is graded again alone after the pool, and the
    timed parts go after it."""
    import threading
    import time
    from grader import report
    gate = run._TimedGate(["s1_correct", "s2_correct"], regraded=True)
    got = []
    t = threading.Thread(target=lambda: got.append(gate.wait()))
    t.start()
    gate.done("s1_correct", _gate_result(report.PASSED))
    time.sleep(0.2)
    assert t.is_alive() and not got                      # s2_correct has no verdict yet
    gate.done("cpu_part", _gate_result(report.PASSED))     # not a correctness part: no matter
    time.sleep(0.1)
    assert t.is_alive()
    gate.done("s2_correct", _gate_result(report.FAILED, "wrong at 128x128x64"))
    t.join(5)
    assert got == [True]                                 # a wrong kernel is a verdict: time the part now

    hung = run._TimedGate(["s1_correct"], regraded=True)
    hung.done("s1_correct", _gate_result(report.ERROR, "timed out after 300 s: ..."))
    assert hung.wait() is False                           # after the part is graded again alone
    one_worker = run._TimedGate(["s1_correct"], regraded=False)
    one_worker.done("s1_correct", _gate_result(report.ERROR, "timed out after 300 s: ..."))
    assert one_worker.wait() is True                      # nothing is graded again: no reason to wait
    crashed = run._TimedGate(["s1_correct"], regraded=True)
    crashed.done("s1_correct", None)                      # its grading raised: the pool re-raises it
    assert crashed.wait() is False


def test_a_timed_part_waits_for_its_own_kernels_built_ahead():
    """Its kernels still being built by other workers when its turn comes: the part waits for
    them before it takes the GPU, not while it holds it."""
    import threading
    import time
    from grader import spec
    part = spec.load("lab4_gemm").part("s4_speed")
    other = spec.load("lab4_gemm").part("s3_speed")
    ahead = [run._BuildAhead(part, "hopper_step4", (4096, 4096, 4096), {}),
             run._BuildAhead(part, "hopper_step4", (8192, 8192, 8192), {}),
             run._BuildAhead(other, "hopper_step3", (4096, 4096, 4096), {})]
    gate = run._TimedGate([], regraded=True, ahead=ahead)
    got = []
    t = threading.Thread(target=lambda: got.append(gate.wait("s4_speed")))
    t.start()
    gate.built("s4_speed")
    gate.built("s3_speed")
    time.sleep(0.2)
    assert t.is_alive() and not got                      # one of its two kernels is still building
    gate.built("s4_speed")
    t.join(5)
    assert got == [True]

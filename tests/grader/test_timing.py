import pytest

from grader import hardware, timing


class FakeClock:
    """Returns scripted durations and records the order of calls."""

    def __init__(self, durations):
        self.durations = durations
        self.calls = []

    def time_call(self, fn):
        name = fn()
        self.calls.append(name)
        return self.durations[name](len(self.calls))


def test_stops_when_stable_and_interleaves():
    clock = FakeClock({"sub": lambda i: 2e-3, "base": lambda i: 1e-3})
    flushes = []
    policy = timing.TimingPolicy(warmup=0, min_reps=10, max_reps=100)
    stats = timing.measure_interleaved({"sub": lambda: "sub", "base": lambda: "base"}, clock,
                                       flush=lambda: flushes.append(1), policy=policy)
    assert stats["sub"].n == stats["base"].n == 10          # constant times: stable at min_reps
    assert clock.calls[:4] == ["sub", "base", "sub", "base"]  # interleaved
    assert len(flushes) == 20                                 # a flush before every timed call
    assert stats["sub"].median == pytest.approx(2e-3)


def test_noisy_measurement_runs_to_max_reps():
    noise = lambda i: 1e-3 * (1 + (0.5 if i % 2 else -0.5))
    clock = FakeClock({"k": noise})
    stats = timing.measure_interleaved({"k": lambda: "k"}, clock,
                                       policy=timing.TimingPolicy(warmup=0, min_reps=5, max_reps=40,
                                                                  target_rel_stderr=1e-4, budget_s=1e9))
    assert stats["k"].n == 40


def test_budget_stops_early():
    t = [0.0]

    def wall():
        t[0] += 1.0
        return t[0]

    clock = FakeClock({"k": lambda i: 1e-3 * (1 + i % 3)})
    stats = timing.measure_interleaved({"k": lambda: "k"}, clock, wall=wall,
                                       policy=timing.TimingPolicy(warmup=0, min_reps=5, max_reps=1000,
                                                                  target_rel_stderr=1e-6, budget_s=5))
    assert stats["k"].n < 10


def test_stats_median_spread():
    s = timing.Stats([3.0, 1.0, 2.0, 100.0, 2.5])
    assert s.median == 2.5
    assert s.quantile(0.0) == 1.0 and s.quantile(1.0) == 100.0
    assert set(s.summary()) >= {"median_s", "p10_s", "p90_s", "rel_stderr", "n"}


def test_floor_rejects_impossible_times():
    h200 = hardware.SPECS["H200"]
    nbytes = 6 * (1 << 28)       # 1.6 GB: at least ~0.33 ms at 4.92 TB/s
    floor = timing.physical_floor(h200, bytes_moved=nbytes)
    assert timing.check_floor(1e-6, floor) is not None          # 1 us: cached or skipped work
    assert "faster than physically possible" in timing.check_floor(1e-6, floor)
    assert timing.check_floor(0.0, floor) is not None
    assert timing.check_floor(0.4e-3, floor) is None
    gemm = timing.physical_floor(h200, flops=2 * 4096 ** 3)
    assert "compute" in gemm.reason and gemm.min_time_s > 1e-4


def test_the_floor_is_the_gpus_peak_with_the_margin_its_clocks_allow():
    """No slack: a rate above the HBM's ceiling (bus width x memory clock) or the tensor cores'
    (at the highest SM clock) is rejected, and the message names the rate and the ceiling."""
    h200 = hardware.SPECS["H200"]
    nbytes = 3 * (1 << 28) * 2
    floor = timing.physical_floor(h200, bytes_moved=nbytes)
    assert floor.min_time_s == pytest.approx(nbytes / 4.917e12, rel=1e-3)
    bad = timing.check_floor(nbytes / 5.24e12, floor)            # what a kernel that skipped work reported
    assert bad is not None and "(5.24 TB/s)" in bad and "HBM) peak of H200, 4.92 TB/s" in bad, bad
    assert timing.check_floor(nbytes / 4.8e12, floor) is None     # the datasheet's figure itself is possible
    assert timing.check_floor(nbytes / 4.25e12, floor) is None    # the best rate recorded on an H200
    flops = 2 * 8192 ** 3
    gemm = timing.physical_floor(h200, flops=flops)
    assert gemm.min_time_s == pytest.approx(flops / (989e12 * 1980 / 1830))
    assert timing.check_floor(flops / 1100e12, gemm) is not None and timing.check_floor(flops / 989e12, gemm) is None
    b200 = timing.physical_floor(hardware.SPECS["B200"], bytes_moved=nbytes)
    assert b200.min_time_s == pytest.approx(nbytes / 8e12)         # not measured on a B200: no margin


def test_credit_is_linear_between_floor_and_full():
    assert timing.credit(0.95, 0.5, 0.9) == 1.0
    assert timing.credit(0.5, 0.5, 0.9) == 0.0
    assert timing.credit(0.7, 0.5, 0.9) == pytest.approx(0.5)


def test_clock_reading_never_raises():
    c = timing.read_clocks()
    assert "available" in c


def test_event_clock_queues_a_spin_before_the_start_event():
    """The GPU must still be busy when the host has queued the call, so that the host's time to
    queue it (torch.matmul's dispatch) is not counted between the events."""
    import types

    queue, made = [], []

    class Event:
        def __init__(self, enable_timing=False):
            self.name = ("start", "end")[len(made) % 2]
            made.append(self)

        def record(self):
            queue.append(self.name)

        def query(self):
            return True

        def elapsed_time(self, other):
            return 2.0

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, _sleep=lambda n: queue.append(("spin", n))))
    clock = timing.CudaEventClock.__new__(timing.CudaEventClock)
    clock.torch, clock.cover_cycles, clock._spin = fake, 1000, fake.cuda._sleep
    assert clock.time_call(lambda: queue.append("call")) == pytest.approx(2e-3)
    assert queue == [("spin", 1000), "start", "call", "end"]
    queue.clear()
    clock.cover_cycles = 0
    clock.time_call(lambda: queue.append("call"))
    assert queue == ["start", "call", "end"]


# ---------------------------------------------------------------- rotations: every timed call checked

def test_a_rotation_takes_its_sets_in_turn_and_poisons_before_the_flush():
    """Untimed and in this order before every call: the next argument set, its poison, the L2
    flush, the clock's start; after it, the check of that call, told its set and number."""
    log = []

    class Clock:
        def time_call(self, fn):
            log.append("start")
            fn()
            log.append("end")
            return 1e-3

    rot = timing.Rotation([lambda: log.append("call A"), lambda: log.append("call B")],
                          [lambda: log.append("poison A"), lambda: log.append("poison B")],
                          lambda s, k: log.append(f"check set {s} call {k}"))
    policy = timing.TimingPolicy(warmup=1, min_reps=3, max_reps=3)
    stats = timing.measure_interleaved({"k": rot, "plain": lambda: log.append("plain")}, Clock(),
                                       flush=lambda: log.append("flush"), policy=policy)
    assert stats["k"].n == stats["plain"].n == 3
    assert log[:2] == ["poison A", "call A"] and log[2] == "plain"              # warm-up: poisoned, not checked
    assert log[3:8] == ["poison B", "flush", "start", "call B", "end"]
    assert log[8] == "check set 1 call 0"
    assert log[9:13] == ["flush", "start", "plain", "end"]
    assert [e for e in log if e.startswith("check")] == ["check set 1 call 0", "check set 0 call 1", "check set 1 call 2"]
    assert rot.last == {1: 2, 0: 1} and rot.checked == 3 and rot.timed == 3


def test_a_failed_check_stops_the_timing_with_its_message():
    calls = []
    rot = timing.Rotation([lambda: calls.append(1)], check=lambda s, k: "wrong in call #2" if k == 1 else None)
    clock = FakeClock({None: lambda i: 1e-3})
    with pytest.raises(timing.WrongTimedCall, match="wrong in call #2"):
        timing.measure_interleaved({"k": rot}, clock, policy=timing.TimingPolicy(warmup=2, min_reps=10))
    assert len(calls) == 2 + 2 and rot.checked == 2


def test_a_rotation_needs_a_poison_per_set():
    with pytest.raises(ValueError):
        timing.Rotation([lambda: None, lambda: None], [lambda: None])

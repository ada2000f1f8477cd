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
    nbytes = 6 * (1 << 28)       # 1.6 GB: at least ~0.34 ms at 4.8 TB/s
    floor = timing.physical_floor(h200, bytes_moved=nbytes)
    assert timing.check_floor(1e-6, floor) is not None          # 1 us: cached or skipped work
    assert "faster than physically possible" in timing.check_floor(1e-6, floor)
    assert timing.check_floor(0.0, floor) is not None
    assert timing.check_floor(0.4e-3, floor) is None
    gemm = timing.physical_floor(h200, flops=2 * 4096 ** 3)
    assert "compute" in gemm.reason and gemm.min_time_s > 1e-4


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

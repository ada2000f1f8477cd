"""Timing: CUDA events per call, L2 overwritten and the GPU kept busy while the host queues the
call (CudaEventClock), warm-up, median and spread, repetition until stable or out of time, a
same-run baseline timed interleaved with the submission, clocks recorded, and a floor that
rejects impossible times.

The statistics and the stopping rule take any ``clock`` so that they are tested on the
CPU with a fake clock; :class:`CudaEventClock` is the real one.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Protocol


class Clock(Protocol):
    def time_call(self, fn: Callable[[], Any]) -> float:
        """Seconds that one call of ``fn`` took on the device."""


@dataclasses.dataclass
class Stats:
    samples: list[float]

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def stderr(self) -> float:
        if self.n < 2:
            return float("inf")
        return statistics.stdev(self.samples) / self.n ** 0.5

    @property
    def rel_stderr(self) -> float:
        return self.stderr / self.mean if self.mean > 0 else float("inf")

    def quantile(self, q: float) -> float:
        s = sorted(self.samples)
        i = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
        return s[i]

    def summary(self) -> dict[str, float]:
        return {"median_s": self.median, "p10_s": self.quantile(0.1), "p90_s": self.quantile(0.9),
                "mean_s": self.mean, "rel_stderr": self.rel_stderr, "n": self.n}


@dataclasses.dataclass
class TimingPolicy:
    warmup: int = 5
    min_reps: int = 10
    max_reps: int = 200
    target_rel_stderr: float = 0.005   # stop when the standard error is under 0.5% of the mean
    budget_s: float = 10.0             # wall-clock budget per measured pair


def measure_interleaved(fns: dict[str, Callable[[], Any]], clock: Clock,
                        flush: Callable[[], Any] | None = None,
                        policy: TimingPolicy = TimingPolicy(),
                        wall: Callable[[], float] = time.perf_counter) -> dict[str, Stats]:
    """Time several functions call by call in alternation (submission, baseline, submission,
    ...), so that clock drift and neighbours' load hit all of them alike.

    Before every timed call ``flush`` runs (it overwrites L2). Stops when every function's
    relative standard error is below the target (after ``min_reps``), when ``max_reps`` is
    reached, or when the wall-clock budget runs out.
    """
    for _ in range(policy.warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    start = wall()
    while True:
        for name, fn in fns.items():
            if flush is not None:
                flush()
            samples[name].append(clock.time_call(fn))
        n = len(next(iter(samples.values())))
        stats = {k: Stats(v) for k, v in samples.items()}
        if n >= policy.max_reps:
            break
        if n >= policy.min_reps and all(s.rel_stderr < policy.target_rel_stderr for s in stats.values()):
            break
        if n >= 2 and wall() - start > policy.budget_s:
            break
    return stats


HANG_S = 45.0     # a kernel that has not finished this long after the wait began is deadlocked


class KernelHang(Exception):
    """A kernel did not finish within HANG_S seconds: most likely a barrier wait that never completes."""


def wait_event(event, limit_s: float | None = None) -> None:
    """Wait for a recorded CUDA event by polling it, at most ``limit_s`` (default HANG_S) seconds."""
    limit = HANG_S if limit_s is None else limit_s
    start = time.monotonic()
    spins = 0
    while not event.query():
        spins += 1
        if spins > 1000:
            time.sleep(0.0002)
        if time.monotonic() - start > limit:
            raise KernelHang(f"the GPU work did not finish within {limit:g} s")


def sync(limit_s: float | None = None) -> None:
    """torch.cuda.synchronize(), bounded: a deadlocked kernel raises KernelHang."""
    import torch
    ev = torch.cuda.Event()
    ev.record()
    wait_event(ev, limit_s)


class CudaEventClock:
    """Times one call with a pair of CUDA events on the current stream.

    Before the start event it queues a spin of ``cover_cycles`` GPU cycles (about 0.1 ms), so
    that the GPU is still busy when the host has queued the call: without it, a call whose host
    side is slow (torch.matmul's dispatch on a loaded host, tens of microseconds that vary with
    the host's load) has the GPU waiting between the events, and the wait is counted as its time.
    """

    def __init__(self, cover_cycles: int = 200_000) -> None:
        import torch
        self.torch = torch
        self.cover_cycles = cover_cycles
        self._spin = getattr(torch.cuda, "_sleep", None)

    def time_call(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self._spin is not None and self.cover_cycles:
            self._spin(self.cover_cycles)
        start.record()
        fn()
        end.record()
        wait_event(end)
        return start.elapsed_time(end) / 1e3


class L2Flusher:
    """Overwrites a buffer several times the size of L2 before a timed call."""

    def __init__(self, l2_bytes: int, factor: int = 4) -> None:
        import torch
        self.buf = torch.empty(max(l2_bytes * factor, 64 << 20), dtype=torch.uint8, device="cuda")

    def __call__(self) -> None:
        self.buf.fill_(0x5A)


# ---------------------------------------------------------------- physical floor

@dataclasses.dataclass
class Floor:
    min_time_s: float
    reason: str


def physical_floor(spec, bytes_moved: float = 0.0, flops: float = 0.0, slack: float = 1.25) -> Floor:
    """The shortest time the work can take on ``spec``: bytes over peak bandwidth, FLOPs over
    peak compute, whichever is larger, divided by ``slack`` (datasheet peaks are rounded and
    clocks can boost). A measured time under this floor is physically impossible: the work was
    not done, was cached across calls, or the timer was fooled."""
    t_mem = bytes_moved / spec.bandwidth if bytes_moved else 0.0
    t_cmp = flops / spec.peak_flops if flops else 0.0
    t = max(t_mem, t_cmp) / slack
    which = "memory" if t_mem >= t_cmp else "compute"
    return Floor(t, f"{which} roofline of {spec.name} ({t * 1e6:.2f} us after x{slack} slack)")


def check_floor(measured_s: float, floor: Floor) -> str | None:
    """None when plausible, else a message explaining the rejection."""
    if measured_s <= 0 or measured_s < floor.min_time_s:
        return (f"measured {measured_s * 1e6:.3f} us is faster than physically possible: "
                f"the {floor.reason}. The time is rejected.")
    return None


# ---------------------------------------------------------------- clocks (NVML)

def read_clocks() -> dict[str, Any]:
    """SM and memory clocks, temperature, power and throttle reasons of GPU 0, via NVML.

    Returns {"available": False, ...} when NVML is missing, so a report always says.
    """
    try:
        import pynvml
    except ImportError:
        return {"available": False, "why": "pynvml (nvidia-ml-py) not installed"}
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        names = [n[len("nvmlClocksThrottleReason"):] for n in dir(pynvml)
                 if n.startswith("nvmlClocksThrottleReason") and not n.endswith(("All", "None"))
                 and isinstance(getattr(pynvml, n), int) and reasons & getattr(pynvml, n)]
        out = {
            "available": True,
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "throttle_reasons": sorted(set(names)),
            "driver": pynvml.nvmlSystemGetDriverVersion(),
        }
        for k, v in list(out.items()):
            if isinstance(v, bytes):
                out[k] = v.decode()
        return out
    except Exception as e:  # noqa: BLE001 - NVML errors must not stop grading
        return {"available": False, "why": f"NVML error: {e}"}


def credit(ratio: float, floor: float, full: float) -> float:
    """Fraction of performance credit: 0 at or below ``floor``, 1 at or above ``full``, linear
    in between."""
    if ratio >= full:
        return 1.0
    if ratio <= floor:
        return 0.0
    return (ratio - floor) / (full - floor)

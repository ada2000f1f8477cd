"""Timing: CUDA events per call, L2 overwritten and the GPU kept busy while the host queues the
call (CudaEventClock), warm-up, median and spread, repetition until stable or out of time, a
same-run baseline timed interleaved with the submission, clocks recorded, and a floor that
rejects impossible times.

The statistics and the stopping rule take any ``clock`` so that they are tested on the
CPU with a fake clock; :class:`CudaEventClock` is the real one.

Every timed call does checked work
----------------------------------
A time says how fast a kernel is only if the call that took it did the work. A kernel can keep
state between launches (a variable in global memory, a pointer it remembers) and skip the work
on later calls, leaving in its output what an earlier call wrote; or spin until a chosen time.
The defence has four parts, and a kernel must get past all of them on the calls it skips:

1. **No state in the module** (grader/launch.py, ``check_module_state``): a PTX whose code uses a
   module-scope ``.global`` variable is refused before any launch.
2. **Nothing left over to return.** Each function is timed as a :class:`Rotation`: several
   argument sets (the kernel's: inputs of different random contents and their own outputs) taken
   in turn, call k on set k mod n; before every call, warm-up included, the set's outputs are
   poisoned (NaN, which no course kernel writes on purpose). The rotation and the poisoning are
   untimed: they run before the L2 flush, which runs before the start event. So an output is
   right after a call only if that very call wrote it, from inputs that changed since the call
   before.
3. **Every timed call is checked, where the kernel cannot know.** After each timed call has
   finished, ``check(set, index)`` runs (untimed): the grader's runner compares elements of the
   outputs at positions it draws only then, from a generator seeded per run from the operating
   system (grader/runners.py), with the reference of that set under the problem's tolerance,
   and the same positions of the inputs with their originals. A call that skipped the work left
   NaN everywhere and fails any sample; a call that left a fraction f of its output wrong passes
   a sample of S elements with probability (1 - f)^S (S = 2048: under 1e-4 for f = 0.5%, and a
   kernel that skips less than that gains less than the 0.5% spread the timing stops at). After the
   loop the runner checks the last call of each set in full (every element, or the
   ``check_rows`` rows), inputs included. A check that fails stops the timing: the part scores 0
   and the verdict names the timed call (its number) and what it left (wrong values, or the
   poison in place).
4. **A rate the device cannot reach is rejected** (:func:`physical_floor`): the median time is
   compared with the work at the GPU's own peak (grader/hardware.py: HBM bandwidth, dense fp16
   tensor rate, each with the margin its clocks allow over the datasheet figure), not with a
   slack.

The median is what is graded, so a kernel must be fast on more than half of its timed calls to
move it; every one of them is checked. The checks cost little and are not timed: per timed call,
one gather of S elements of each output and input on the GPU and their copy to the host, and the
poison (on an H200, Lab 1's shape of 2^28 elements: 0.41 ms for the check, 0.17 ms for the
poison; at most ``max_reps`` = 200 calls per function), and, per shape, one full check before
timing and one per argument set after it (three with two sets, where there were two).
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


class WrongTimedCall(Exception):
    """A timed call's outputs were wrong, or its inputs changed, when checked after the call."""


class Rotation:
    """One function timed over several argument sets, taken in turn: call k (warm-up calls
    counted) uses set k mod len(calls).

    ``calls[s]()`` runs the function on set s; ``poison[s]()`` (optional) overwrites the outputs
    of set s before each call on it; ``check(s, k)`` (optional) is told, after timed call k (0 for
    the first timed call) on set s has finished, and returns what is wrong with it, or None.
    ``last[s]`` is the number of the last timed call on set s, ``checked`` how many were checked.
    """

    def __init__(self, calls: list[Callable[[], Any]], poison: list[Callable[[], Any] | None] | None = None,
                 check: Callable[[int, int], str | None] | None = None) -> None:
        if not calls:
            raise ValueError("a rotation needs at least one argument set")
        self.calls = list(calls)
        self.poison = list(poison) if poison is not None else [None] * len(self.calls)
        if len(self.poison) != len(self.calls):
            raise ValueError("one poison per argument set")
        self.check = check
        self.turn = 0
        self.timed = 0
        self.last: dict[int, int] = {}
        self.checked = 0

    def prepare(self) -> tuple[int, Callable[[], Any]]:
        """Untimed, before a call: the next argument set, its outputs poisoned."""
        s = self.turn % len(self.calls)
        self.turn += 1
        if self.poison[s] is not None:
            self.poison[s]()
        return s, self.calls[s]

    def __call__(self) -> Any:
        """One untimed call on the next set (a warm-up call)."""
        _, fn = self.prepare()
        return fn()

    def finished(self, s: int) -> None:
        """Untimed, after a timed call on set ``s`` has finished: check it; WrongTimedCall if wrong."""
        k = self.timed
        self.timed += 1
        self.last[s] = k
        if self.check is not None:
            self.checked += 1
            wrong = self.check(s, k)
            if wrong:
                raise WrongTimedCall(wrong)


def as_rotation(fn: Callable[[], Any] | Rotation) -> Rotation:
    """A plain function is a rotation of one argument set, with nothing to poison or check."""
    return fn if isinstance(fn, Rotation) else Rotation([fn])


def measure_interleaved(fns: dict[str, Callable[[], Any] | Rotation], clock: Clock,
                        flush: Callable[[], Any] | None = None,
                        policy: TimingPolicy = TimingPolicy(),
                        wall: Callable[[], float] = time.perf_counter) -> dict[str, Stats]:
    """Time several functions call by call in alternation (submission, baseline, submission,
    ...), so that clock drift and neighbours' load hit all of them alike.

    Each function is a plain callable or a :class:`Rotation`. Before every timed call, in this
    order and untimed: the rotation's next argument set and its poison, then ``flush`` (it
    overwrites L2), then the clock's own preparation and start event. After it: the rotation's
    check of that call (WrongTimedCall stops the measurement). Stops when every function's
    relative standard error is below the target (after ``min_reps``), when ``max_reps`` is
    reached, or when the wall-clock budget runs out.
    """
    rotations = {name: as_rotation(fn) for name, fn in fns.items()}
    for _ in range(policy.warmup):
        for rot in rotations.values():
            rot()
    samples: dict[str, list[float]] = {name: [] for name in rotations}
    start = wall()
    while True:
        for name, rot in rotations.items():
            which, fn = rot.prepare()
            if flush is not None:
                flush()
            samples[name].append(clock.time_call(fn))
            rot.finished(which)
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
    reason: str                  # the peak that bounds the time, named with its figure
    amount: float = 0.0          # the bytes or FLOPs of the bound
    unit: str = ""               # "TB/s" or "TFLOP/s"


def physical_floor(spec, bytes_moved: float = 0.0, flops: float = 0.0) -> Floor:
    """The shortest time the work can take on ``spec``: the bytes at the HBM's peak bandwidth or
    the FLOPs at the dense fp16 tensor peak, whichever takes longer, each peak with the margin the
    GPU's clocks give it over the datasheet figure (grader/hardware.py: ``hbm_margin``,
    ``fp16_margin``). A measured time under this floor is physically impossible: the work was
    not done, was cached across calls, or the timer was fooled."""
    bandwidth = spec.bandwidth * spec.hbm_margin
    compute = spec.peak_flops * spec.fp16_margin
    t_mem = bytes_moved / bandwidth if bytes_moved else 0.0
    t_cmp = flops / compute if flops else 0.0
    if t_mem >= t_cmp:
        return Floor(t_mem, f"memory (HBM) peak of {spec.name}, {bandwidth / 1e12:.2f} TB/s", bytes_moved, "TB/s")
    return Floor(t_cmp, f"compute (dense fp16) peak of {spec.name}, {compute / 1e12:.0f} TFLOP/s", flops, "TFLOP/s")


def check_floor(measured_s: float, floor: Floor) -> str | None:
    """None when plausible, else a message naming the impossible rate and the peak it exceeds."""
    if measured_s <= 0 or measured_s < floor.min_time_s:
        rate = (f" ({floor.amount / measured_s / 1e12:.2f} {floor.unit})"
                if measured_s > 0 and floor.amount else "")
        return (f"measured {measured_s * 1e6:.3f} us{rate} is faster than physically possible: above the "
                f"{floor.reason} (at least {floor.min_time_s * 1e6:.3f} us). The time is rejected.")
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

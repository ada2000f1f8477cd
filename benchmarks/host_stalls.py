"""How long a busy host thread is kept waiting by busy jailed children, at the children's
niceness and at the grader's.

A timed call's host side (the harness queues the L2 overwrite, the spin, the events and the
launch) must not be delayed by more than the spin queued before its start event, or the wait is
counted in the call's time. Children keep working while a part is timed, and a child can leave
threads spinning. This starts ``--spinners`` processes that spin, at niceness 0 and then at the
jail's (grader/sandbox.py ``Limits.nice``), and meanwhile runs steps of 50 us of busy work in
this process (niceness 0, as the harness), printing how long the steps took.

    python benchmarks/host_stalls.py [--spinners N] [--steps N]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from grader.sandbox import Limits  # noqa: E402

STEP_S = 50e-6


def _spin(nice: int) -> None:
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    while True:
        pass


def steps(n: int) -> list[float]:
    """Durations of ``n`` back-to-back steps of STEP_S of busy work, sorted (seconds)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < STEP_S:
            pass
        out.append(time.perf_counter() - t0)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spinners", type=int, default=3 * (os.cpu_count() or 1))
    ap.add_argument("--steps", type=int, default=4000)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; steps of {STEP_S * 1e6:.0f} us of busy work at niceness "
          f"{os.getpriority(os.PRIO_PROCESS, 0)}, {args.steps} of them\n")
    print("| spinning processes | median | p99 | max |\n|---|---:|---:|---:|")
    for nice in (None, 0, Limits().nice):
        procs = [] if nice is None else [multiprocessing.Process(target=_spin, args=(nice,), daemon=True)
                                         for _ in range(args.spinners)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        got = steps(args.steps)
        for p in procs:
            p.kill()
        who = "none" if nice is None else f"{args.spinners} at niceness {nice}"
        us = lambda q: f"{got[min(len(got) - 1, int(q * len(got)))] * 1e6:.0f} us"  # noqa: E731
        print(f"| {who} | {us(0.5)} | {us(0.99)} | {got[-1] * 1e6:.0f} us |")


if __name__ == "__main__":
    main()

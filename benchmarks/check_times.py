"""Where a check cell's time goes: every part of a lab checked in this process on the reference
notebook, as its check cell would (grader.notebook.check), with the seconds spent in each phase.

    python benchmarks/check_times.py --lab lab6_flash_attention
    python benchmarks/check_times.py --lab lab4_gemm --part s4_correct --part s4_speed

Phases: ``builder`` (the notebook's builder functions making PrimFuncs), ``lower`` (TIRx's
pipeline), ``nvrtc`` (CUDA source to PTX), ``ptxas`` (PTX to cubin, in a tool jail), ``load``
(the cubin loaded by the CUDA driver), ``reference`` (the float64 reference outputs), ``timing``
(the timed loop of a speed part), ``other`` (inputs, runs, comparisons, the rest). A phase nested
in another (a builder's own lowering) counts in the inner one only.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import os
import pstats
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


class Phases:
    """Seconds per phase, the innermost phase of nested calls counted alone."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.stack: list[list] = []

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            start = time.perf_counter()
            self.stack.append([name, 0.0])
            try:
                return fn(*a, **k)
            finally:
                _, inner = self.stack.pop()
                spent = time.perf_counter() - start
                self.seconds[name] += spent - inner
                if self.stack:
                    self.stack[-1][1] += spent
        return timed


def patch(phases: Phases, namespace: dict, builders: list[str]) -> contextlib.ExitStack:
    from grader import devcode, launch, problems, timing, toolchain
    stack = contextlib.ExitStack()

    def swap(owner, attr, name):
        if isinstance(owner, dict):
            real = owner[attr]
            owner[attr] = phases.wrap(name, real)
            stack.callback(owner.__setitem__, attr, real)
        else:                                   # a module, or a frozen Problem
            real = getattr(owner, attr)
            object.__setattr__(owner, attr, phases.wrap(name, real))
            stack.callback(object.__setattr__, owner, attr, real)

    swap(devcode, "lower", "lower")
    swap(toolchain, "nvrtc_ptx", "nvrtc")
    swap(launch, "assemble", "ptxas")
    swap(launch, "Kernel", "load")
    swap(timing, "measure_interleaved", "timing")
    for prob in problems.PROBLEMS.values():
        swap(prob, "reference", "reference")
    for name in builders:
        if name in namespace:
            swap(namespace, name, "builder")
    return stack


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lab", required=True)
    ap.add_argument("--part", action="append", help="only these parts (default: every part)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N functions with the most time, cumulative and own, of each part (cProfile)")
    args = ap.parse_args(argv)
    from conftest import import_notebook

    from grader import notebook, spec
    lab = spec.load(args.lab)
    start = time.perf_counter()
    module = import_notebook(os.path.join(ROOT, "solutions", args.lab, f"{args.lab}.ipynb"),
                             tempfile.mkdtemp(), f"{args.lab}_reference")
    namespace = vars(module)
    print(f"notebook imported in {time.perf_counter() - start:.1f} s", flush=True)
    builders = [n for n, v in namespace.items() if callable(v) and "step" in n]
    names = ["builder", "lower", "nvrtc", "ptxas", "load", "reference", "timing", "other"]
    print("| part | seconds | " + " | ".join(names) + " | verdict |")
    print("|---|---:|" + "---:|" * len(names) + "---|")
    totals = collections.Counter()
    for part in lab.parts:
        if args.part and part.id not in args.part:
            continue
        phases = Phases()
        start = time.perf_counter()
        profiler = cProfile.Profile() if args.profile else None
        with patch(phases, namespace, builders):
            try:
                with contextlib.redirect_stdout(open(os.devnull, "w")):
                    if profiler:
                        profiler.enable()
                    notebook.check(args.lab, part.id, namespace)
                verdict = "ok"
            except Exception as e:  # noqa: BLE001 - a failing check is a row, not the end
                verdict = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            finally:
                if profiler:
                    profiler.disable()
        wall = time.perf_counter() - start
        spent = dict(phases.seconds)
        spent["other"] = wall - sum(spent.values())
        totals.update(spent)
        totals["wall"] += wall
        print(f"| {part.id} | {wall:.2f} | " + " | ".join(f"{spent.get(n, 0.0):.2f}" for n in names)
              + f" | {verdict} |", flush=True)
        if profiler:
            for order in ("cumulative", "tottime"):
                pstats.Stats(profiler, stream=sys.stdout).sort_stats(order).print_stats(args.profile)
    print(f"| all | {totals['wall']:.2f} | " + " | ".join(f"{totals[n]:.2f}" for n in names) + " | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

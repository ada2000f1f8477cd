"""Where the time of a grading run goes, from the spans the grader writes (grader/spans.py).

    GRADER_TRACE=/tmp/trace.jsonl python -m grader check all --json check-all.json
    python benchmarks/grading_timeline.py /tmp/trace.jsonl --out DIR

Writes ``DIR/timeline.md`` (per lab: its wall time, and the seconds its parts spent in each
phase: waiting for and holding the GPU's grading lock, waiting for the machine's profiler, ncu,
the children's start and requests, ptxas) and ``DIR/timeline.png`` (one row per grading thread,
a bar per span, coloured by phase; the GPU's exclusive hold, the timed parts, on a row of its own).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from grader import spans  # noqa: E402

PHASES = ["child_start", "child", "ptxas", "profiled_build", "profiler_wait", "ncu",
          "gpu_lock_wait", "gpu_lock_held"]
COLOURS = {"child_start": "#bbbbbb", "child": "#4c72b0", "ptxas": "#55a868", "profiler_wait": "#f2c14e",
           "ncu": "#dd8452", "gpu_lock_wait": "#e377c2", "gpu_lock_held": "#c44e52", "build_ahead": "#8172b3",
           "part": "#eeeeee"}


def phase(s: dict) -> str:
    return s["what"] + (f" ({s['mode']})" if s.get("mode") else "")


def summary(rows: list[dict]) -> str:
    t0 = min(s["start"] for s in rows)
    by_lab: dict[str, list[dict]] = collections.defaultdict(list)
    for s in rows:
        by_lab[s.get("lab", "?")].append(s)
    names = sorted({phase(s) for s in rows if s["what"] in PHASES})
    out = ["| lab | start (s) | end (s) | parts | " + " | ".join(names) + " |",
           "|---|---:|---:|---:|" + "---:|" * len(names)]
    for lab, ss in sorted(by_lab.items(), key=lambda kv: min(s["start"] for s in kv[1])):
        parts = [s for s in ss if s["what"] == "part"]
        secs = collections.Counter()
        for s in ss:
            if s["what"] in PHASES:
                secs[phase(s)] += s["end"] - s["start"]
        out.append(f"| {lab} | {min(s['start'] for s in ss) - t0:.1f} | {max(s['end'] for s in ss) - t0:.1f} | "
                   f"{len(parts)} | " + " | ".join(f"{secs[n]:.1f}" for n in names) + " |")
    held = _union([(s["start"], s["end"]) for s in rows if s["what"] == "gpu_lock_held" and s.get("mode") == "exclusive"])
    ncu = _union([(s["start"], s["end"]) for s in rows if s["what"] == "ncu"])
    wall = max(s["end"] for s in rows) - t0
    out += ["", f"Wall time: {wall:.1f} s. The GPU held exclusively (timed parts, one at a time): {held:.1f} s. "
                f"ncu running (one run at a time on the machine): {ncu:.1f} s, of which the profiled process holds "
                "the GPU's shared lock only around its own GPU work. Child requests under 50 ms are not traced."]
    return "\n".join(out) + "\n"


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def draw(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = min(s["start"] for s in rows)
    lanes = sorted({(s.get("lab", "?"), s["pid"], s["thread"]) for s in rows})
    lane = {k: i + 1 for i, k in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(14, 0.32 * len(lanes) + 2))
    for s in rows:
        colour = COLOURS.get(s["what"])
        if colour is None:
            continue
        y = 0 if s["what"] == "gpu_lock_held" and s.get("mode") == "exclusive" else lane[(s.get("lab", "?"), s["pid"], s["thread"])]
        h = 0.8 if s["what"] not in ("part", "build_ahead") else 0.95
        ax.barh(y, s["end"] - s["start"], left=s["start"] - t0, height=h, color=colour,
                edgecolor="none", zorder=1 if s["what"] in ("part", "build_ahead") else 2)
    ax.set_yticks([0] + list(lane.values()), ["GPU, exclusive"] + [f"{k[0]} ({k[1]}:{str(k[2])[-3:]})" for k in lanes],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the first span")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=7, ncol=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = spans.read(args.trace)
    if not rows:
        print(f"{args.trace}: no spans (was GRADER_TRACE set for the run?)", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    text = summary(rows)
    with open(os.path.join(args.out, "timeline.md"), "w") as f:
        f.write(f"# Where the time went\n\n`python benchmarks/grading_timeline.py {args.trace} --out {args.out}`\n\n"
                + text)
    draw(rows, os.path.join(args.out, "timeline.png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

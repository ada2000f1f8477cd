"""Draw the figures of the Lab 5 notes (pipelined, warp-specialized GEMM) into ./generated/.

Run directly (``python lectures/lab5_gemm_pipeline/figures.py``) or let ``lectures/conf.py`` run
it at the start of every Sphinx build. Two figures are drawn from measurements recorded on an
H200 (``reports/h200/lab5/``): the climb of the Hopper steps against ``torch.matmul`` and the
timeline of a traced warp-specialized kernel, drawn with the course's own ``grader.timeline``.
The ring schematic is drawn from scratch. A copy of the course without ``reports/`` keeps the
figures it was shipped with.

The timelines of the reference steps 5, 7 and 9 are drawn from ``reports/h200/lab5/
timeline_step{5,7,9}.json`` (written by ``benchmarks/lab5/reference_timelines.py`` on an
H200). Until those files exist, each of these figures is a placeholder that says so, so the notes
build either way.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle, Wedge  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from grader.timeline import draw_recorded, draw_timeline, events_from_json  # noqa: E402

OUT = HERE / "generated"
MEASURED = REPO / "reports" / "h200" / "lab5"
STEPS_JSON = MEASURED / "hopper_steps.json"
TRACE_JSON = MEASURED / "timeline_events.json"
STEP_TRACES = {step: MEASURED / f"timeline_step{step}.json" for step in (5, 7, 9)}
STEP_TITLES = {5: "step 5: one warpgroup, a ring of 4 stages",
               7: "step 7: producer and consumer warpgroups",
               9: "step 9: a 2 × 1 cluster, B multicast"}

BLUE, ORANGE, GREY = "#4c72b0", "#dd8452", "#b0b0b0"
SHAPE_COLORS = ["#9ecae1", "#6baed6", "#3182bd", "#fdae6b", "#e6550d"]

STEP_LABELS = {
    "step5": "5: ring of\n4 stages",
    "step6": "6: persistent,\ngrouped order",
    "step7": "7: warp-specialized,\nsetmaxnreg",
    "step8": "8: two consumers,\n128×256 tile",
    "step9": "9: 2×1 cluster,\nB multicast",
}

# The book's B200 measurements at M = N = K = 4096 (chapter_gemm_advanced, "End-to-End Results"):
# milliseconds per call; cuBLAS took 0.094 ms. Its step 8 is the 2-CTA MMA and its step 9 the
# second consumer.
BOOK_B200_MS = [("4: TMA,\nno pipeline", 0.49), ("7: warp-\nspecialized", 0.23),
                ("8: 2-CTA\nMMA", 0.104), ("9: two\nconsumers", 0.094)]
BOOK_CUBLAS_MS = 0.094


def _shape_label(key: str) -> str:
    m, n, k = (int(x) for x in key.split("x"))
    return f"{m}³" if m == n == k else f"{m}×{n}×{k}"


def fig_climb(path):
    """Ratio to torch.matmul per step and shape on the H200, next to the book's B200 ratios."""
    with open(STEPS_JSON) as f:
        data = json.load(f)
    steps = [s for s in STEP_LABELS if s in data["steps"]]
    shapes = list(data["steps"][steps[0]]["timing"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 4.6), dpi=120, gridspec_kw={"width_ratios": [3.2, 1.25]})
    width = 0.8 / len(shapes)
    for j, shape in enumerate(shapes):
        xs = [i + (j - (len(shapes) - 1) / 2) * width for i in range(len(steps))]
        ys = [data["steps"][s]["timing"][shape]["ratio"] for s in steps]
        ax.bar(xs, ys, width * 0.92, color=SHAPE_COLORS[j % len(SHAPE_COLORS)], label=_shape_label(shape))
    for y, style, va in ((1.0, "-", "bottom"), (0.95, "--", "top")):
        ax.axhline(y, color="black", linestyle=style, linewidth=0.9)
        ax.text(-0.48, y + (0.005 if va == "bottom" else -0.005), f"{y:.2f}×", va=va, fontsize=8)
    ax.set_xticks(range(len(steps)), [STEP_LABELS[s] for s in steps], fontsize=8)
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("speed relative to torch.matmul")
    ax.set_title(f"Hopper steps on an {data['device'].split(',')[0].replace('NVIDIA ', '')}: "
                 "torch.matmul time / kernel time", fontsize=10)
    ax.legend(fontsize=8, ncol=len(shapes), loc="upper center", frameon=False)
    ax.grid(axis="y", alpha=0.3)

    names = [n for n, _ in BOOK_B200_MS]
    ratios = [BOOK_CUBLAS_MS / ms for _, ms in BOOK_B200_MS]
    bars = bx.bar(range(len(names)), ratios, 0.6, color=GREY, edgecolor="black", linewidth=0.6)
    for b, (_, ms), r in zip(bars, BOOK_B200_MS, ratios):
        bx.text(b.get_x() + b.get_width() / 2, r + 0.02, f"{ms:g} ms\n{r:.2f}×", ha="center", fontsize=7)
    bx.axhline(1.0, color="black", linewidth=0.9)
    bx.set_xticks(range(len(names)), names, fontsize=7)
    bx.set_ylim(0, 1.25)
    bx.set_title("the book's B200 figures, 4096³:\ncuBLAS time / kernel time", fontsize=9)
    bx.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_timeline(path):
    """The recorded trace: both CTAs at the start of the K loop, CTA 0 at its end."""
    events, meta = events_from_json(TRACE_JSON)
    ctas = meta["trim"]["kept_ctas"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12.5, 7.4), dpi=110, gridspec_kw={"height_ratios": [2, 1.05]})
    draw_timeline(events, ax=top, ctas=ctas, window_us=(0, 7), min_width_us=0.004,
                  title="start: the first K tiles of CTAs 0 and 1")
    last = max(e.end_ns for e in events if e.cta == ctas[0]) / 1e3
    draw_timeline(events, ax=bottom, ctas=ctas[0], window_us=(last - 4.0, last + 0.2), min_width_us=0.004,
                  title=f"end of CTA {ctas[0]}: the last K tiles, the epilogue and the TMA store")
    shape = meta["shape"]
    fig.suptitle(f"2-stage warp-specialized demo kernel, measured on an H200 "
                 f"({shape['M']}×{shape['N']}×{shape['K']}, traced with grader.timeline)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_ring(path):
    """A 4-stage ring at one moment: the stages, their two barriers, the producer and the consumer."""
    fig, ax = plt.subplots(figsize=(11, 5.6), dpi=120)
    r_in, r_out = 1.35, 2.45
    filling, landed, reading = "#a6c8e8", "#a8d5a2", "#f6c28b"
    # stage s covers a quarter of the ring: stage 0 at the top, then clockwise
    states = {
        0: ("K tile 8: TMA in flight", filling, "full[0]: 2 phases completed,\n   the 3rd waits for 32 KB",
            "empty[0]: 2 phases completed"),
        1: ("K tile 5: being read by\nthe consumer's wgmmas", reading, "full[1]: 2 phases completed",
            "empty[1]: 1 phase completed"),
        2: ("K tile 6: landed", landed, "full[2]: 2 phases completed", "empty[2]: 1 phase completed"),
        3: ("K tile 7: landed", landed, "full[3]: 2 phases completed", "empty[3]: 1 phase completed"),
    }
    for s, (what, color, full, empty) in states.items():
        mid = 90 - 90 * s                          # degrees, clockwise from the top
        rad = math.radians(mid)
        ax.add_patch(Wedge((0, 0), r_out, mid - 44, mid + 44, width=r_out - r_in,
                           facecolor=color, edgecolor="black", linewidth=1.0))
        rm = (r_in + r_out) / 2
        ax.text(rm * math.cos(rad), rm * math.sin(rad), f"stage {s}\nA + B\n32 KB",
                ha="center", va="center", fontsize=8, weight="bold")
        c, sn = math.cos(rad), math.sin(rad)
        ha = "left" if c > 0.3 else ("right" if c < -0.3 else "center")
        va = "bottom" if sn > 0.3 else ("top" if sn < -0.3 else "center")
        ax.text((r_out + 0.2) * c, (r_out + 0.2) * sn, f"{what}\n{full}\n{empty}", ha=ha, va=va, fontsize=7.5)
    ax.add_patch(FancyArrowPatch((-0.6, 0.55), (0.6, 0.55), connectionstyle="arc3,rad=-0.35",
                                 arrowstyle="-|>", mutation_scale=12, color="black"))
    ax.text(0, -0.15, "both sides go\nclockwise; K tile k\nuses stage k mod 4", ha="center", va="center", fontsize=8)
    ax.annotate("producer (one thread): waited on empty[0]\nuntil K tile 4 was released, then\n"
                "expect_tx and the TMA loads of K tile 8",
                xy=(-0.9, r_out - 0.1), xytext=(-7.2, 2.3), fontsize=8, color=BLUE,
                arrowprops=dict(arrowstyle="->", color=BLUE))
    ax.annotate("consumer warpgroup: waited on full[1]\nfor K tile 5; arrives on empty[1] once\n"
                "the wgmmas of K tile 5 have completed",
                xy=(r_out * math.cos(math.radians(-35)), r_out * math.sin(math.radians(-35))),
                xytext=(3.2, -2.6), fontsize=8, color=ORANGE, arrowprops=dict(arrowstyle="->", color=ORANGE))
    rules = ("full[s]: initialised for 1 arrival; the producer arrives with expect_tx(bytes) and the TMA "
             "loads deliver the bytes. The consumers\nwait on it with a phase bit that starts at 0 and "
             "flips whenever they wrap from stage 3 to stage 0.\n"
             "empty[s]: initialised for one arrival per consumer warpgroup, each arriving when its MMAs on s "
             "are complete. The producer\nwaits on it with a phase bit that starts at 1 (so its first wait "
             "on each fresh barrier passes) and flips at each wrap.")
    ax.text(-7.2, -3.55, rules, fontsize=8, va="top")
    legend = [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black") for c in (filling, landed, reading)]
    ax.legend(legend, ["being filled by TMA", "data landed (full)", "being read by the MMAs"],
              loc="upper right", fontsize=8, frameon=False)
    ax.set_xlim(-7.3, 7.3)
    ax.set_ylim(-4.7, 3.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("A ring of 4 stages at one moment, on its second trip", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _steady_window(events, cta, first=8, count=8):
    """(t0, t1) in µs around the ``first``-th .. (first + count - 1)-th MMA of the CTA's first row
    with MMAs (the whole row if it has fewer)."""
    mm = sorted((e for e in events if e.cta == cta and e.kind == "mma"), key=lambda e: (e.group, e.start_ns))
    if not mm:
        return None
    mm = [e for e in mm if e.group == mm[0].group]
    a, b = mm[min(first, len(mm) - 1)], mm[min(first + count - 1, len(mm) - 1)]
    return (a.start_ns / 1e3 - 0.05, b.end_ns / 1e3 + 0.05)


def fig_step_timeline(step, path):
    """A reference step's recorded timeline: the kept CTAs, then 8 K tiles of the first one."""
    events, meta = events_from_json(STEP_TRACES[step])
    ctas = sorted({e.cta for e in events})
    shape = meta.get("shape", {})
    draw_recorded(events, meta, path, zoom_us=_steady_window(events, ctas[0]),
                  overview_title=f"CTAs {', '.join(map(str, ctas))}"
                                 + (", first output tiles" if meta.get("kept", {}).get("cut_us") else ""),
                  zoom_title=f"CTA {ctas[0]}: 8 K tiles of the main loop",
                  heading=f"Reference {STEP_TITLES[step]} ({shape.get('M')}×{shape.get('N')}×{shape.get('K')})")


def fig_placeholder(step, path):
    """Stands in for a step's timeline until its measurement is in reports/h200/lab5/."""
    fig, ax = plt.subplots(figsize=(12.5, 1.6), dpi=110)
    ax.axis("off")
    ax.text(0.5, 0.5, f"The timeline of the reference {STEP_TITLES[step]} has not been recorded yet:\n"
                      f"run benchmarks/lab5/reference_timelines.py on an H200 and add "
                      f"reports/h200/lab5/timeline_step{step}.json.", ha="center", va="center", fontsize=10)
    fig.savefig(path)
    plt.close(fig)


def _step_figure(step):
    def draw(path):
        if STEP_TRACES[step].exists():
            fig_step_timeline(step, path)
        elif path.exists():                  # a copy without the measurements keeps its figure
            print(f"kept {path} (no {STEP_TRACES[step].relative_to(REPO)} here)")
        else:
            fig_placeholder(step, path)
    return draw


FIGURES = [("climb.png", fig_climb, [STEPS_JSON]), ("timeline.png", fig_timeline, [TRACE_JSON]),
           ("ring.png", fig_ring, [])]
# drawn from the measurement when it is there, else a placeholder that says it is missing
FIGURES += [(f"timeline_step{step}.png", _step_figure(step), []) for step in STEP_TRACES]


def main():
    OUT.mkdir(exist_ok=True)
    for name, fn, needs in FIGURES:
        missing = [p for p in needs if not p.exists()]
        if missing:
            if (OUT / name).exists():        # a copy without the measurements keeps its figure
                print(f"kept {OUT / name} (no {missing[0].relative_to(REPO)} here)")
                continue
            raise FileNotFoundError(f"{name} is drawn from {missing[0]}, which is missing")
        fn(OUT / name)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()

"""Draw the figures of the Lab 6 notes (Flash Attention with GQA) into ./generated/.

Run directly (``python lectures/lab6_flash_attention/figures.py``) or let ``lectures/conf.py`` run
it at the start of every Sphinx build. Three figures are computed here from the rules the notes
state, with no measurement behind them: the classes of the (query tile, key block) pairs of a
causal head, the rows of a GQA-packed Q tile, and the exponent reference of one row under plain
and conditional rescaling. The fourth, the climb of the steps, is drawn from the grader's reports of the reference on an H200
(reports/h200/lab6/grading/run*.json).

The timeline of the reference step 4 (the two consumers' ping-pong) is drawn with the course's
``grader.timeline`` from ``reports/h200/lab6/timeline_attn_step4.json``, written by
``benchmarks/lab6/reference_timelines.py`` on an H200. Without that file the figure is
the picture the notebook's ``show(...)`` cell drew on the H200
(``reports/h200/lab6/timeline_attn_step4.show.png``, a measurement kept as it came), and without
either a placeholder that says so, so the notes build either way.
"""
from __future__ import annotations

import json
import math
import pathlib
import shutil
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "generated"
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
STEP4_TRACE = REPO / "reports" / "h200" / "lab6" / "timeline_attn_step4.json"
STEP4_SHOW = REPO / "reports" / "h200" / "lab6" / "timeline_attn_step4.show.png"

FULL, MASKED, SKIPPED = "#8fbf7f", "#f2b25c", "#eeeeee"


def block_class(seq_q: int, seq_k: int, bm: int, bn: int, tile: int, block: int) -> str:
    """full, mask or skip for a bottom-right causal mask: query i sees key j iff j <= i + seq_k - seq_q."""
    first, last = tile * bm, min(seq_q, (tile + 1) * bm) - 1
    lo, hi = block * bn, (block + 1) * bn - 1
    shift = seq_k - seq_q
    if lo > last + shift:
        return "skip"
    if hi <= first + shift and hi < seq_k:
        return "full"
    return "mask"


def _grid(ax, seq_q, seq_k, bm, bn, title):
    tiles, blocks = math.ceil(seq_q / bm), math.ceil(seq_k / bn)
    colors = {"full": FULL, "mask": MASKED, "skip": SKIPPED}
    for t in range(tiles):
        for n in range(blocks):
            kind = block_class(seq_q, seq_k, bm, bn, t, n)
            ax.add_patch(Rectangle((n * bn, t * bm), bn, bm, facecolor=colors[kind], edgecolor="white", linewidth=1.2))
    # the boundary of the mask: query i sees keys up to i + seq_k - seq_q
    i = np.arange(seq_q + 1)
    ax.plot(np.clip(i + seq_k - seq_q, 0, seq_k), i, color="black", linewidth=1.2)
    ax.axhline(seq_q, color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(seq_k, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlim(0, blocks * bn)
    ax.set_ylim(tiles * bm, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("key j (blocks of %d)" % bn)
    ax.set_ylabel("query i (tiles of %d)" % bm)
    ax.set_title(title, fontsize=9)


def fig_causal_blocks(path):
    """Three causal heads: Sq = Sk, Sq < Sk and Sq > Sk, with tails."""
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 4.4), dpi=120)
    _grid(axes[0], 512, 512, 128, 128, "S_q = S_k = 512: 6 full, 4 masked, 6 skipped")
    _grid(axes[1], 300, 700, 128, 128, "S_q = 300 < S_k = 700 (tails in both)")
    _grid(axes[2], 640, 330, 128, 128, "S_q = 640 > S_k = 330: the first rows see no key")
    handles = [Patch(facecolor=FULL, label="full: no mask"), Patch(facecolor=MASKED, label="mask: computed, then masked"),
               Patch(facecolor=SKIPPED, label="skip: never loaded")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Which key blocks a query tile visits under a bottom-right causal mask "
                 "(black line: the last key each query sees)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(path)
    plt.close(fig)


def packed_row(r: int, tile: int, group: int, hkv: int, rows: int = 128) -> tuple[int, int]:
    """(sequence position, query head) of row r of packed tile ``tile`` of KV head ``hkv``."""
    return tile * (rows // group) + r // group, hkv * group + r % group


def fig_gqa_packing(path, group=4, hkv=1, groups_shown=3, tiles_shown=3):
    """Q of one batch as [positions x query heads]: the box of one packed tile, and its 128 rows."""
    per_tile = 128 // group
    heads = groups_shown * group
    positions = tiles_shown * per_tile
    head_colors = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.2), dpi=110, gridspec_kw={"width_ratios": [1.15, 1]})
    # left: Q [S, H] of one batch (D is the third axis, not drawn)
    for h in range(heads):
        mine = h // group == hkv
        for t in range(tiles_shown):
            shade = head_colors[h % group] if mine else "#dddddd"
            left.add_patch(Rectangle((h, t * per_tile), 1, per_tile, facecolor=shade, alpha=0.35 + 0.3 * (t == 0),
                                     edgecolor="white", linewidth=0.6))
    for t in range(tiles_shown):
        left.add_patch(Rectangle((hkv * group, t * per_tile), group, per_tile, fill=False, edgecolor="black",
                                 linewidth=2.2 if t == 0 else 1.0, linestyle="-" if t == 0 else "--"))
        left.text(hkv * group + group + 0.3, t * per_tile + per_tile / 2,
                  f"tile {t}: positions {t * per_tile}–{(t + 1) * per_tile - 1}", va="center", fontsize=8)
    left.set_xlim(0, heads + 5.5)
    left.set_ylim(positions, 0)
    left.set_xticks([h + 0.5 for h in range(heads)])
    left.set_xticklabels([str(h) for h in range(heads)], fontsize=7)
    left.set_xlabel(f"query head (KV head h_kv = head // {group})")
    left.set_ylabel("sequence position")
    left.set_title(f"Q[b] in memory, [S, H, D]: the tiles of KV head {hkv} (g = {group}); "
                   f"each is one TMA box (1, {per_tile}, {group}, D)", fontsize=9)
    # right: the 128 rows of tile 0, in the order the MMA sees them, and the K block they share
    shown = 24
    for r in range(shown):
        pos, head = packed_row(r, 0, group, hkv)
        right.add_patch(Rectangle((0, r), 3, 1, facecolor=head_colors[head % group], alpha=0.65,
                                  edgecolor="white", linewidth=0.5))
        if r < 8 or r == shown - 1:
            right.text(3.2, r + 0.5, f"row {r}: position {pos}, head {head}", va="center", fontsize=7.5)
    right.text(1.5, shown + 1.5, "⋮", ha="center", fontsize=12)
    pos, head = packed_row(127, 0, group, hkv)
    right.add_patch(Rectangle((0, shown + 3), 3, 1, facecolor=head_colors[head % group], alpha=0.65, edgecolor="white"))
    right.text(3.2, shown + 3.5, f"row 127: position {pos}, head {head}", va="center", fontsize=7.5)
    right.add_patch(Rectangle((10.5, 0), 3, shown + 4, facecolor="#cccccc", edgecolor="black"))
    right.text(12.0, (shown + 4) / 2, f"K block j of\nKV head {hkv}\n(128 keys × D)\nloaded once", ha="center",
               va="center", fontsize=8, rotation=90)
    right.annotate("", xy=(10.4, (shown + 4) / 2), xytext=(8.6, (shown + 4) / 2),
                   arrowprops=dict(arrowstyle="<->", color="black"))
    right.text(9.5, (shown + 4) / 2 - 1.2, "S = Q Kᵀ\n128 × 128", ha="center", va="bottom", fontsize=8)
    right.set_xlim(0, 14)
    right.set_ylim(shown + 4.5, 0)
    right.axis("off")
    right.set_title(f"Tile 0 as the MMA sees it: row r = position r // {group}, head {hkv * group} + r % {group}",
                    fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def references(row: np.ndarray, block: int, threshold: float) -> list[float]:
    """The exponent reference of one row after each key block (the rule of part a)."""
    m, out = -math.inf, []
    for j in range(0, len(row), block):
        cand = max(m, float(row[j:j + block].max()))
        delta = m - (0.0 if cand == -math.inf else cand)
        if delta < -threshold:
            m = cand
        out.append(m)
    return out


def fig_rescale(path):
    """One row whose maximum keeps growing: the reference under threshold 0 and threshold 8."""
    rng = np.random.default_rng(2)
    block, blocks = 16, 24
    row = np.cumsum(rng.uniform(0.0, 0.35, block * blocks)) + rng.normal(0.0, 0.6, block * blocks)
    running = [float(row[:(j + 1) * block].max()) for j in range(blocks)]
    plain, lazy = references(row, block, 0.0), references(row, block, 8.0)
    x = np.arange(1, blocks + 1)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 4.2), dpi=120, gridspec_kw={"width_ratios": [1.6, 1]})
    ax.step(x, running, where="post", color="black", linewidth=1.0, label="largest logit so far")
    ax.step(x, plain, where="post", color="#4c72b0", linewidth=2.0, linestyle="--",
            label=f"threshold 0: {sum(a != b for a, b in zip(plain[1:], plain[:-1]))} rescales")
    ax.step(x, lazy, where="post", color="#dd8452", linewidth=2.0,
            label=f"threshold 8: {sum(a != b for a, b in zip(lazy[1:], lazy[:-1]))} rescales")
    ax.set_xlabel("key blocks seen")
    ax.set_ylabel("logit (log2 units)")
    ax.set_title("The exponent reference of one row", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    gap = [r - m for r, m in zip(running, lazy)]
    bx.bar(x, np.exp2(gap), color="#dd8452")
    bx.axhline(256, color="black", linewidth=0.9, linestyle=":")
    bx.text(1, 256, " 2^8 = 256", va="bottom", fontsize=8)
    bx.set_yscale("log", base=2)
    bx.set_xlabel("key blocks seen")
    bx.set_title("largest weight 2^(t - m) with threshold 8", fontsize=10)
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


RUNS = HERE.parents[1] / "reports" / "h200" / "lab6" / "grading"


def speed_rows(runs_dir=RUNS) -> dict:
    """{(step, shape label): [ratio to cuDNN, one per run]} from the grader's reports."""
    rows: dict = {}
    for path in sorted(runs_dir.glob("run*.json")):
        for res in json.loads(path.read_text())["results"]:
            if not res["part"].endswith("_speed"):
                continue
            step = int(res["part"][1])
            for shape in res["measurements"].get("shapes", []):
                s = shape["shape"]
                label = f"{s[1] // 1024}k {'causal' if s[6] else 'non-causal'}"
                rows.setdefault((step, label), []).append(shape["ratio"])
    return rows


def fig_climb(path):
    rows = speed_rows()
    fig, ax = plt.subplots(figsize=(7.5, 3.4), constrained_layout=True)
    if not rows:
        ax.text(0.5, 0.5, "not measured yet: reports/h200/lab6/grading/run*.json", ha="center", va="center")
        ax.set_axis_off()
    else:
        labels = sorted({lab for _, lab in rows}, key=lambda x: (int(x.split("k")[0]), x))
        steps = sorted({st for st, _ in rows})
        width = 0.8 / len(labels)
        for i, lab in enumerate(labels):
            vals = [rows.get((st, lab), [float("nan")]) for st in steps]
            x = np.arange(len(steps)) + (i - (len(labels) - 1) / 2) * width
            ax.bar(x, [min(v) for v in vals], width, label=lab)
            ax.errorbar(x, [min(v) for v in vals], yerr=[[0] * len(vals), [max(v) - min(v) for v in vals]],
                        fmt="none", ecolor="black", lw=0.8)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(steps)), [f"step {st}" for st in steps])
        ax.set_ylabel("speed / cuDNN SDPA (same run)")
        ax.set_title("Hopper reference on an H200: B=4, 32 query heads over 8 KV heads, d=128")
        ax.legend(fontsize=8, ncols=2, loc="upper left")
    fig.savefig(path)
    plt.close(fig)


def _turns_window(events, cta, first=5, count=4):
    """(t0, t1) in µs from the start of consumer 0's ``first``-th MMA box to the end of its
    (first + count - 1)-th (None, the whole CTA, when it makes fewer turns)."""
    mmas = sorted((e.start_ns, e.end_ns) for e in events if e.cta == cta and e.role == "consumer 0" and e.kind == "mma")
    if len(mmas) <= first:
        return None
    return (mmas[first][0] / 1e3 - 0.05, mmas[min(first + count - 1, len(mmas) - 1)][1] / 1e3 + 0.05)


def fig_pingpong(path, trace=STEP4_TRACE):
    """The reference step 4's recorded timeline: the kept CTAs, then four turns of CTA 0."""
    from grader.timeline import draw_recorded, events_from_json
    events, meta = events_from_json(trace)
    ctas = sorted({e.cta for e in events})
    cut = any((meta.get("kept", {}).get("cut_us") or {}).values())
    shape = meta.get("shape", {})
    draw_recorded(events, meta, path, zoom_us=_turns_window(events, ctas[0]),
                  overview_title=f"CTAs {', '.join(map(str, ctas))}" + (", first turns" if cut else ""),
                  zoom_title=f"CTA {ctas[0]}: four turns of each consumer",
                  heading=f"Reference hopper_attn_step4, B = {shape.get('batch')}, {shape.get('seq_q')} × "
                          f"{shape.get('seq_k')}, {shape.get('heads_q')} query heads over {shape.get('heads_kv')} KV heads")


def fig_pingpong_placeholder(path):
    """Stands in for the step 4 timeline until its measurement is in reports/h200/lab6/."""
    fig, ax = plt.subplots(figsize=(12.5, 1.6), dpi=110)
    ax.axis("off")
    ax.text(0.5, 0.5, "The timeline of the reference step 4 has not been recorded yet:\n"
                      "run benchmarks/lab6/reference_timelines.py on an H200 and add "
                      "reports/h200/lab6/timeline_attn_step4.json.", ha="center", va="center", fontsize=10)
    fig.savefig(path)
    plt.close(fig)


def fig_timeline(path):
    if STEP4_TRACE.exists():
        fig_pingpong(path)
    elif STEP4_SHOW.exists():            # the notebook's show() cell, run on the H200
        shutil.copyfile(STEP4_SHOW, path)
    elif path.exists():                  # a copy without the measurements keeps its figure
        print(f"kept {path} (no {STEP4_TRACE.relative_to(REPO)} here)")
    else:
        fig_pingpong_placeholder(path)


FIGURES = [("causal_blocks.png", fig_causal_blocks), ("gqa_packing.png", fig_gqa_packing),
           ("rescale.png", fig_rescale), ("climb.png", fig_climb),
           ("timeline_step4.png", fig_timeline)]


def main():
    OUT.mkdir(exist_ok=True)
    for name, fn in FIGURES:
        fn(OUT / name)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()

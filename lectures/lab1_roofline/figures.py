"""Draw the figures of the Lab 1 notes (the roofline) into ./generated/.

Run directly (``python lectures/lab1_roofline/figures.py``) or let
``lectures/conf.py`` run it at the start of every Sphinx build. All hardware
numbers come from ``grader.hardware.SPECS`` so the notes, the grader and the
figures never disagree.
"""
from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from grader.hardware import SPECS  # noqa: E402

OUT = HERE / "generated"

# Line style per GPU row: B200 and H200 solid, H100 dashed (it shares H200's
# compute roof, so only its memory roof and ridge differ).
STYLE = {
    "B200": dict(color="#1f77b4", linestyle="-", linewidth=2.2),
    "H200": dict(color="#d62728", linestyle="-", linewidth=2.2),
    "H100": dict(color="#7f7f7f", linestyle="--", linewidth=1.6),
}

AI_MIN, AI_MAX = 0.05, 1e4


def roof(spec, ai):
    """Attainable TFLOP/s at arithmetic intensity ``ai`` (FLOP/byte)."""
    return np.minimum(spec.fp16_tflops, spec.hbm_tbps * ai)


def worked_examples():
    """(label, FLOPs, bytes) of the operations discussed in the notes, all fp16."""
    ops = []
    n = 1 << 26  # 67M elements
    ops.append(("add  z = x + y", 1 * n, 3 * 2 * n))
    ops.append(("scale-add  a*x + y", 2 * n, 3 * 2 * n))
    r = c = 8192  # row sum of an 8192 x 8192 matrix
    ops.append(("row sum 8192x8192", r * c, 2 * r * c + 2 * r))
    k = 8192  # decode GEMV: y = W x, batch 1
    ops.append(("decode GEMV 8192^2", 2 * k * k, 2 * k * k + 2 * k + 2 * k))
    s, d = 4096, 128  # attention per (batch, head), non-causal
    attn_flops = 4 * s * s * d
    ops.append(("attention, scores in HBM", attn_flops, 4 * 2 * s * d + 4 * 2 * s * s))
    ops.append(("attention prefill (fused)", attn_flops, 4 * 2 * s * d))
    for g in (1024, 4096, 8192):
        ops.append((f"GEMM {g}^3", 2 * g**3, 3 * 2 * g * g))
    return ops


def _draw_roofs(ax, names=("B200", "H200", "H100"), ymin=0.05):
    ai = np.logspace(np.log10(AI_MIN), np.log10(AI_MAX), 600)
    for name in names:
        spec = SPECS[name]
        label = (f"{name}: {spec.fp16_tflops:g} TFLOP/s, {spec.hbm_tbps:g} TB/s"
                 f" (ridge {spec.ridge_point:.0f})")
        ax.plot(ai, roof(spec, ai), label=label, **STYLE[name])
        ax.plot([spec.ridge_point], [spec.fp16_tflops], marker="o", markersize=7,
                color=STYLE[name]["color"], zorder=5)
        ax.axvline(spec.ridge_point, color=STYLE[name]["color"], linestyle=":",
                   linewidth=0.9, alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(AI_MIN, AI_MAX)
    ax.set_ylim(ymin, 5000)
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("attainable dense fp16 throughput (TFLOP/s)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)


def fig_roofline(path):
    fig, ax = plt.subplots(figsize=(8.5, 5.6), dpi=130)
    _draw_roofs(ax)
    # (text offset factors in x and y, relative to the ridge point)
    placement = {"B200": (0.08, 1.35), "H200": (2.2, 0.42), "H100": (3.0, 0.13)}
    for name, (fx, fy) in placement.items():
        spec = SPECS[name]
        ax.annotate(f"{name} ridge: {spec.ridge_point:.0f} FLOP/byte",
                    xy=(spec.ridge_point, spec.fp16_tflops),
                    xytext=(spec.ridge_point * fx, spec.fp16_tflops * fy),
                    fontsize=8.5, color=STYLE[name]["color"],
                    arrowprops=dict(arrowstyle="->", color=STYLE[name]["color"], lw=0.9))
    ax.text(0.3, 0.12, "memory-bound\n(slope = bandwidth)", fontsize=9, color="#444444")
    ax.text(1500, 30, "compute-bound\n(flat = peak)", fontsize=9, color="#444444")
    ax.set_title("HBM roofline, dense fp16 tensor-core peak")
    ax.legend(loc="lower right", fontsize=8, framealpha=0.95)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_roofline_examples(path):
    fig, ax = plt.subplots(figsize=(9.5, 6.2), dpi=130)
    _draw_roofs(ax, ymin=0.005)
    b200, h200 = SPECS["B200"], SPECS["H200"]
    ops = worked_examples()
    palette = ["#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
               "#17becf", "#bcbd22", "#006d5b", "#b8860b"]
    for i, (label, flops, nbytes) in enumerate(ops):
        ai = flops / nbytes
        col = palette[i % len(palette)]
        yb, yh = float(roof(b200, ai)), float(roof(h200, ai))
        ax.plot([ai, ai], [0.005, yb], color=col, linewidth=0.8, alpha=0.5)
        ax.plot([ai], [yb], marker="^", markersize=8, color=col, markeredgecolor="k",
                markeredgewidth=0.5, zorder=6)
        ax.plot([ai], [yh], marker="o", markersize=7, color=col, markeredgecolor="k",
                markeredgewidth=0.5, zorder=6)
        ai_txt = f"{ai:.3g}" if ai < 10 else f"{ai:.0f}"
        left = ai > 1000  # crowded labels go left of their line
        ax.annotate(f"{label}  (AI {ai_txt})", xy=(ai, 0.006), xytext=(-2 if left else 2, 0),
                    textcoords="offset points", rotation=90, fontsize=7, color=col,
                    ha="right" if left else "left", va="bottom")
    # One measured H200 point, for orientation: torch.matmul fp16 4096^3.
    g = 4096
    ax.plot([g / 3], [760], marker="*", markersize=14, color="gold", markeredgecolor="k",
            zorder=7, linestyle="none", label="measured on H200: torch.matmul 4096^3, ~760 TFLOP/s")
    ax.plot([], [], marker="^", color="k", linestyle="none", label="bound on B200")
    ax.plot([], [], marker="o", color="k", linestyle="none", label="bound on H200")
    ax.set_title("Worked examples on the roofline (fp16 data; bytes = HBM reads + writes)")
    ax.legend(loc="upper left", fontsize=7.5, framealpha=0.95)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    OUT.mkdir(exist_ok=True)
    fig_roofline(OUT / "roofline.png")
    fig_roofline_examples(OUT / "roofline_examples.png")
    for label, flops, nbytes in worked_examples():
        ai = flops / nbytes
        times = {n: max(flops / SPECS[n].peak_flops, nbytes / SPECS[n].bandwidth) * 1e6
                 for n in ("H200", "B200")}
        print(f"{label:28s} AI={ai:9.3f}  H200 {times['H200']:9.2f} us  B200 {times['B200']:9.2f} us")


if __name__ == "__main__":
    main()

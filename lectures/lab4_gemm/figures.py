"""Draw the figures of the Lab 4 notes (GEMM on tensor cores) into ./generated/.

Run directly (``python lectures/lab4_gemm/figures.py``) or let ``lectures/conf.py`` run it at
the start of every Sphinx build. The accumulator fragment is drawn from the grader's own
reference mapping, so the figure and the graded answer cannot disagree.
"""
from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from grader.labs.lab4_gemm import ref_acc_coord  # noqa: E402

OUT = HERE / "generated"
BLUE, ORANGE, GREEN, RED, GREY = "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#b0b0b0"
WARP_COLORS = ["#8dbbe8", "#f5b98a", "#9fd4a8", "#e8a0a2"]


def _box(ax, x, y, w, h, color, alpha=1.0, label=None, fs=9, lw=1.0, ec="black", **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, alpha=alpha, edgecolor=ec, linewidth=lw, **kw))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fs)


def fig_tile(path):
    """D = A B^T: the 128 x 128 tile of D, the 128-row panels of A and B, the k-th K tile."""
    fig, ax = plt.subplots(figsize=(9.5, 4.6), dpi=120)
    M, N, K, t, kt = 6.0, 5.0, 4.0, 1.0, 0.6
    # A: M x K at left; B: N x K drawn on top, rotated so that its rows become D's columns
    ax_, ay = 0.0, 0.0
    _box(ax, ax_, ay, K, M, "#eeeeee")
    _box(ax, ax_, ay + M - 2 * t, K, t, BLUE, alpha=0.35)
    _box(ax, ax_ + 1.2, ay + M - 2 * t, kt, t, BLUE, alpha=0.9)
    ax.text(ax_ + K / 2, ay - 0.35, "A  (M × K, row-major: K-major)", ha="center", fontsize=9)
    ax.text(ax_ - 0.15, ay + M - 1.5 * t, "128 rows\nm_st…", ha="right", va="center", fontsize=8)
    dx = K + 1.2
    _box(ax, dx, ay, N, M, "#eeeeee")
    _box(ax, dx + 2 * t, ay + M - 2 * t, t, t, GREEN, alpha=0.9, label="D\ntile", fs=8)
    ax.text(dx + N / 2, ay - 0.35, "D = A·Bᵀ  (M × N)", ha="center", fontsize=9)
    bx, by = dx, M + 0.9
    _box(ax, bx, by, N, K * 0.6, "#eeeeee")
    _box(ax, bx + 2 * t, by, t, K * 0.6, ORANGE, alpha=0.35)
    _box(ax, bx + 2 * t, by + 0.6 * 1.2, t, kt * 0.6, ORANGE, alpha=0.9)
    ax.text(bx + N + 0.15, by + K * 0.3, "Bᵀ  (B is N × K:\neach row of B is\na column of D)", va="center", fontsize=8)
    ax.text(bx + 2.5 * t, by + K * 0.6 + 0.2, "128 rows of B (n_st…)", ha="center", fontsize=8)
    ax.annotate("", xy=(dx + 2 * t, ay + M - 1.5 * t), xytext=(ax_ + 1.2 + kt, ay + M - 1.5 * t),
                arrowprops=dict(arrowstyle="->", color=BLUE))
    ax.annotate("", xy=(dx + 2.5 * t, ay + M - t), xytext=(bx + 2.5 * t, by + 0.6 * 1.2),
                arrowprops=dict(arrowstyle="->", color=ORANGE))
    ax.text(ax_ + 1.2 + kt / 2, ay + M - 2 * t - 0.3, "k-th K tile\n(64 wide)", ha="center", va="top", fontsize=8)
    ax.text(dx + N + 0.3, ay + M / 2,
            "D tile += A tile (128×64) · B tile (128×64)ᵀ\nfor k = 0 … K/64 − 1\n\n"
            "one CTA per D tile;\nfp16 in memory, fp32 sums", va="center", fontsize=9)
    ax.set_xlim(-1.2, dx + N + 4.2)
    ax.set_ylim(-0.8, by + K * 0.6 + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("The tile a CTA computes and the operand tiles it reads", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_grid(path):
    """A 4 x 6 grid of CTAs over D; CTA (1, 3), those that load its A tiles and its B tiles."""
    gx, gy, (cx, cy) = 4, 6, (1, 3)
    fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=120)
    for x in range(gx):
        for y in range(gy):
            color, a = "#f4f4f4", 1.0
            if x == cx and y == cy:
                color = GREEN
            elif x == cx:
                color, a = BLUE, 0.45
            elif y == cy:
                color, a = ORANGE, 0.45
            _box(ax, y, gx - 1 - x, 1, 1, color, alpha=a, label=f"({x},{y})", fs=8)
    ax.text(gy + 0.3, gx - 1 - cx + 0.5, "same bx: same A tiles\n(rows m_st … m_st+127 of A)", va="center",
            fontsize=8, color=BLUE)
    ax.text(cy + 0.5, -0.35, "same by: same B tiles", ha="center", va="top", fontsize=8, color="#a0522d")
    ax.text(-0.2, gx / 2, "bx →\n(rows of D)", ha="right", va="center", fontsize=8)
    ax.text(gy / 2, gx + 0.15, "by → (columns of D)", ha="center", fontsize=8)
    ax.set_xlim(-1.6, gy + 3.6)
    ax.set_ylim(-0.9, gx + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("Step 3: grid [M/128, N/128], CTA (bx, by) owns one tile of D", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_fragment(path):
    """The fp32 accumulator of mma.sync m16n8k16: one warp's 16 x 8 tile, lane and register per
    element. It is warp 0's first column block of the wgmma fragment, drawn from the grader's
    mapping restricted to that piece (the wgmma arrangement of the pieces is part a's question)."""
    fig, ax = plt.subplots(figsize=(6.2, 7.4), dpi=120)
    for lane in range(32):
        for r in range(4):
            row, col = ref_acc_coord(lane, r)
            _box(ax, col, 15 - row, 1, 1, WARP_COLORS[0] if r < 2 else "#c6dcf3", lw=0.3,
                 label=f"T{lane}\nr{r}", fs=6.5)
    ax.plot([0, 8], [8, 8], color="black", linewidth=1.6)
    ax.set_xlim(0, 8)
    ax.set_ylim(0, 16)
    ax.set_aspect("equal")
    ax.set_xticks([x + 0.5 for x in range(8)], [str(x) for x in range(8)], fontsize=7)
    ax.set_yticks([y + 0.5 for y in range(16)], [str(15 - y) for y in range(16)], fontsize=7)
    ax.set_xlabel("column", fontsize=8)
    ax.set_ylabel("row", fontsize=8)
    ax.set_title("mma.sync m16n8k16, fp32 accumulator:\nlane T, register r (r0, r1 above row 8; r2, r3 below)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_tmem(path):
    """Tensor memory: 128 lanes x 512 columns of 32 bits; the accumulator and the warps' windows."""
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=120)
    cols, lanes = 512, 128
    sx, sy = 1 / 40, 1 / 40            # drawing units per column / lane
    _box(ax, 0, 0, cols * sx, lanes * sy, "#f4f4f4")
    _box(ax, 0, 0, 128 * sx, lanes * sy, GREEN, alpha=0.25)
    for w in range(4):
        y = (lanes - 32 * (w + 1)) * sy
        _box(ax, 0, y, 128 * sx, 32 * sy, WARP_COLORS[w], alpha=0.8,
             label=f"lanes {32 * w}–{32 * w + 31}: warp {w}", fs=8)
    ax.text(64 * sx, lanes * sy + 0.12, "columns 0–127: the 128 × 128 fp32 accumulator", ha="center", fontsize=8)
    ax.text((128 + 384 / 2) * sx, lanes * 0.75 * sy, "columns 128–511: free\n(allocated in powers of two ≥ 32)",
            ha="center", va="center", fontsize=9, color="#666666")
    ax.annotate("row t of D = lane t = thread t of the warpgroup:\ntcgen05.ld brings lane t into thread t's registers;\n"
                "warp w may only read lanes 32w … 32w+31",
                xy=(110 * sx, (lanes - 45) * sy), xytext=(160 * sx, 18 * sy), fontsize=8,
                arrowprops=dict(arrowstyle="->"))
    ax.text(-0.15, lanes * sy / 2, "128\nlanes", ha="right", va="center", fontsize=9)
    ax.text(cols * sx / 2, -0.3, "512 columns × 32 bits", ha="center", fontsize=9)
    ax.set_xlim(-1.0, cols * sx + 0.2)
    ax.set_ylim(-0.55, lanes * sy + 0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("Blackwell tensor memory of one CTA", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    OUT.mkdir(exist_ok=True)
    for name, fn in [("tile.png", fig_tile), ("grid.png", fig_grid),
                     ("fragment.png", fig_fragment), ("tmem.png", fig_tmem)]:
        fn(OUT / name)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()

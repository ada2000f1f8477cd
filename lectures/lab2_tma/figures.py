"""Draw the figures of the Lab 2 notes (TMA loads) into ./generated/.

Run directly (``python lectures/lab2_tma/figures.py``) or let ``lectures/conf.py`` run it at
the start of every Sphinx build.

- ``swizzle_3d_box.png``: where the 16-byte chunks of the first 8 rows of a 64 x 128 fp16
  tile land in shared memory when TMA loads it as a 3D box with the 128-byte swizzle.
- ``ring_timeline.png``: a toy schedule of the producer, the copy engine and the consumers with
  one stage and with four stages, each load labelled with the parity its consumer waits for.
"""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "generated"

ROWS = 8          # rows shown (one swizzle atom)
CHUNKS = 16       # 16-byte chunks per 256-byte row of the tile
GROUP = 8         # chunks per 128-byte group


def swizzle_figure(path: pathlib.Path) -> None:
    cmap = plt.get_cmap("tab20")
    fig, (ax_l, ax_r) = plt.subplots(1, 2, figsize=(12, 3.8), dpi=120,
                                     gridspec_kw={"width_ratios": [1, 1.08]})

    def cell(ax, x, y, chunk, row):
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=cmap(chunk % 20), edgecolor="white", lw=1.2))
        ax.text(x + 0.5, y + 0.5, f"{row},{chunk}", ha="center", va="center", fontsize=6.5)

    # Left: the logical tile, row r and chunk c at (c, r).
    for r in range(ROWS):
        for c in range(CHUNKS):
            cell(ax_l, c, ROWS - 1 - r, c, r)
    ax_l.axvline(GROUP, color="black", lw=2)
    ax_l.set_title("global memory: rows 0-7 of the tile, 16 chunks of 16 B per row\n"
                   "(label = row, chunk); the bold line splits a row into two 128-byte groups",
                   fontsize=9)

    # Right: shared memory, group 0 (all 64 rows) then group 1; inside each 128-byte row the
    # chunk lands at position (chunk % 8) XOR (row % 8).
    gap = 1.0
    for r in range(ROWS):
        for c in range(CHUNKS):
            g, cc = divmod(c, GROUP)
            x = g * (GROUP + gap) + (cc ^ (r % 8))
            cell(ax_r, x, ROWS - 1 - r, c, r)
    for g in range(2):
        ax_r.text(g * (GROUP + gap) + GROUP / 2, ROWS + 0.3,
                  f"group {g}: columns {64 * g}-{64 * g + 63}" + (" (8 KiB after group 0)" if g else ""),
                  ha="center", fontsize=8.5)
    ax_r.set_title("shared memory after one 3D copy, box (64, 64, 2), 128-byte swizzle\n"
                   "position in a 128-byte row = (chunk % 8) XOR (row % 8)", fontsize=9)
    for ax, width in ((ax_l, CHUNKS), (ax_r, 2 * GROUP + gap)):
        ax.set_xlim(-0.2, width + 0.2)
        ax.set_ylim(-0.2, ROWS + 0.9)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def simulate(stages: int, n: int, latency: float = 4.0, read: float = 0.5, work: float = 1.0,
             issue: float = 0.15):
    """A toy schedule: returns per iteration (issue, arrive, start, released, end) times."""
    issue_t, arrive, start, released, end = [], [], [], [], []
    for k in range(n):
        t = issue_t[-1] + issue if issue_t else 0.0
        if k >= stages:
            t = max(t, released[k - stages])          # producer waits on empty[k % S]
        issue_t.append(t)
        arrive.append(t + latency)                     # full[k % S] completes
        s = max(arrive[k], end[k - 1] if k else 0.0)   # consumer waits on full[k % S]
        start.append(s)
        released.append(s + read)                      # consumers arrive on empty[k % S]
        end.append(s + work)                           # compute and issue the TMA store
    return issue_t, arrive, start, released, end


def ring_figure(path: pathlib.Path) -> None:
    n = 10
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 1, figsize=(12, 6.4), dpi=120, sharex=True)
    horizon = 0.0
    for ax, stages in zip(axes, (1, 4)):
        issue_t, arrive, start, released, end = simulate(stages, n)
        horizon = max(horizon, end[-1])
        lanes = [f"stage {s}" for s in range(stages)] + ["consumers", "producer"]
        y_of = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
        for k in range(n):
            s = k % stages
            color = cmap(k % 10)
            parity = (k // stages) % 2
            y = y_of[f"stage {s}"]
            ax.add_patch(Rectangle((issue_t[k], y + 0.15), arrive[k] - issue_t[k], 0.7, facecolor=color,
                                   alpha=0.35, edgecolor=color))
            ax.text((issue_t[k] + arrive[k]) / 2, y + 0.5, f"load k={k}\nfull parity {parity}",
                    ha="center", va="center", fontsize=6.5)
            ax.add_patch(Rectangle((arrive[k], y + 0.15), released[k] - arrive[k], 0.7, facecolor=color,
                                   alpha=0.9, edgecolor=color))
            yc = y_of["consumers"]
            ax.add_patch(Rectangle((start[k], yc + 0.15), end[k] - start[k], 0.7, facecolor=color,
                                   alpha=0.9, edgecolor="white"))
            ax.text((start[k] + end[k]) / 2, yc + 0.5, str(k), ha="center", va="center", fontsize=7,
                    color="white")
            yp = y_of["producer"]
            ax.plot([issue_t[k]] * 2, [yp + 0.15, yp + 0.85], color=color, lw=2)
        ax.set_yticks([y_of[name] + 0.5 for name in lanes])
        ax.set_yticklabels(lanes, fontsize=8)
        ax.set_ylim(0, len(lanes))
        rate = n / end[-1]
        ax.set_title(f"{stages} stage{'s' if stages > 1 else ''}: {n} tiles in {end[-1]:.1f} time units "
                     f"({rate:.2f} tiles per unit)", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(0, horizon + 0.5)
    axes[-1].set_xlabel("time (one unit = the consumers' work on one tile; a load takes 4 units)")
    fig.suptitle("Light bars: the copy engine filling a stage; dark bars: the tile waiting in the stage "
                 "until the consumers release it (empty arrival); producer ticks: TMA issue", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    swizzle_figure(OUT / "swizzle_3d_box.png")
    ring_figure(OUT / "ring_timeline.png")


if __name__ == "__main__":
    main()

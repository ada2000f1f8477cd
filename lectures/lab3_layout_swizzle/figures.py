"""Draw the figures of the Lab 3 notes (layouts, banks, swizzle atoms) into ./generated/.

Run directly (``python lectures/lab3_layout_swizzle/figures.py``) or let
``lectures/conf.py`` run it at the start of every Sphinx build. The offsets come from
the grader's reference functions (``grader.labs.lab3_layout_swizzle``), which the
tests check against TVM's own layouts, so the notes, the grader and the figures agree.
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

from grader.labs.lab3_layout_swizzle import (  # noqa: E402
    ref_col_major, ref_mma, ref_row_major, ref_stored_chunks, ref_swizzled, ref_tiled,
    ref_transpose_offset, ref_addresses_gather, ref_wavefronts)

OUT = HERE / "generated"
CHUNK_COLORS = "tab10"


def _grid(ax, values, title, cmap="viridis", fmt="{}", fontsize=8, vmax=None):
    rows, cols = len(values), len(values[0])
    ax.imshow(values, cmap=cmap, vmin=0, vmax=vmax)
    for r in range(rows):
        for c in range(cols):
            ax.text(c, r, fmt.format(values[r][c]), ha="center", va="center", fontsize=fontsize,
                    color="black")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=9)


def fig_layouts(path):
    """Offset of every element of a 4 x 8 tile under four layouts."""
    shape = (4, 8)
    layouts = [
        ("row-major  S[(4, 8):(8, 1)]", lambda r, c: ref_row_major(r, c, shape)),
        ("column-major  S[(4, 8):(1, 4)]", lambda r, c: ref_col_major(r, c, shape)),
        ("tiled 2 x 4  S[(2, 2, 2, 4):(16, 4, 8, 1)]", lambda r, c: ref_tiled(r, c, shape, (2, 4))),
        ("fp32, 32-byte rows, 32-byte swizzle", lambda r, c: ref_swizzled(r, c, (8, 8), 4, 32)),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 5.6), dpi=130)
    for ax, (title, fn) in zip(axes.flat, layouts):
        rows = 8 if "swizzle" in title else 4
        values = [[fn(r, c) for c in range(8)] for r in range(rows)]
        _grid(ax, values, title, cmap="Blues", vmax=80)
        ax.set_xlabel("column c", fontsize=8)
        ax.set_ylabel("row r", fontsize=8)
    fig.suptitle("Each cell: the offset (in elements) where element (r, c) is stored", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_swizzle_atoms(path):
    """The logical chunk stored at each 16-byte position of the three atoms."""
    fig, axes = plt.subplots(1, 3, figsize=(10, 4.2), dpi=130, gridspec_kw={"width_ratios": [2, 4, 8]})
    for ax, sw in zip(axes, (32, 64, 128)):
        stored = ref_stored_chunks(sw)
        n = len(stored[0])
        _grid(ax, stored, f"{sw}-byte atom: 8 rows x {n} chunks", cmap=CHUNK_COLORS, vmax=9, fontsize=9)
        ax.set_xlabel("16-byte position in the row", fontsize=8)
        ax.set_ylabel("row of the atom", fontsize=8)
    fig.suptitle("Swizzle atoms: which logical chunk sits at each position (color = logical chunk)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_bank_map(path):
    """Bank group (4 banks, 16 bytes) of every chunk of an 8-row fp16 tile with 128-byte rows;
    the cells of one column read (logical chunk 2) are outlined."""
    shape = (8, 64)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), dpi=130)
    for ax, (name, fn) in zip(axes, [
            ("row-major: chunk 2 of rows 0-7 all in bank group 2 (8-way conflict)",
             lambda r, c: ref_row_major(r, c, shape)),
            ("128-byte swizzle: chunk 2 of rows 0-7 in 8 different groups",
             lambda r, c: ref_swizzled(r, c, shape, 2, 128))]):
        groups = [[(2 * fn(r, 8 * q) // 16) % 8 for q in range(8)] for r in range(8)]
        _grid(ax, groups, name, cmap="Pastel1", fontsize=9)
        for r in range(8):
            ax.add_patch(Rectangle((2 - 0.5, r - 0.5), 1, 1, fill=False, lw=2.2, ec="black"))
        ax.set_xlabel("logical chunk q (columns 8q ... 8q+7)", fontsize=8)
        ax.set_ylabel("row r", fontsize=8)
    fig.suptitle("Bank group (banks 4g ... 4g+3) holding each 16-byte chunk", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_mma_layout(path):
    """Where mma_shared_layout puts each chunk of a 16 x 128 fp16 tile (two 64-column blocks)."""
    shape, eb, sw = (16, 128), 2, 128
    addr = [[ref_mma(r, 8 * q, shape, eb, sw) // 8 for q in range(16)] for r in range(16)]
    fig, ax = plt.subplots(figsize=(10, 5.2), dpi=130)
    _grid(ax, addr, "", cmap="Blues", fontsize=7, vmax=300)
    ax.axvline(7.5, color="red", lw=2)
    for r0 in (7.5,):
        ax.axhline(r0, color="gray", lw=1, ls="--")
    ax.set_xlabel("logical chunk (8 fp16 columns each)", fontsize=8)
    ax.set_ylabel("row", fontsize=8)
    ax.set_title("mma_shared_layout(float16, SWIZZLE_128B_ATOM, (16, 128)): the chunk address of each "
                 "logical chunk\nleft block (columns 0-63) fills addresses 0-127, the right block 128-255; "
                 "dashed: atoms of 8 rows", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fig_transpose_gather(path):
    """Bank groups of one gather step of the transpose kernel under three layouts."""
    layouts = [("row-major", lambda r, c: ref_row_major(r, c, (64, 64))),
               ("128-byte swizzle", lambda r, c: ref_swizzled(r, c, (64, 64), 2, 128)),
               ("a layout built for this pattern", ref_transpose_offset)]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.3), dpi=130)
    for ax, (name, fn) in zip(axes, layouts):
        addrs = ref_addresses_gather(fn, 0, 3)
        waves = ref_wavefronts(addrs, 2)
        words = {}
        for a in addrs:
            words.setdefault((a // 4) % 32, set()).add(a // 4)
        ax.bar(range(32), [len(words.get(b, ())) for b in range(32)], color="#4c72b0")
        ax.set_ylim(0, 8.5)
        ax.set_xlabel("bank", fontsize=8)
        ax.set_ylabel("distinct words asked", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(f"{name}\n{waves} wavefront{'s' if waves > 1 else ''}", fontsize=9)
    fig.suptitle("Transpose gather, step k = 3: threads read rows 3, 11, ..., 59 of columns 0-3", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    OUT.mkdir(exist_ok=True)
    fig_layouts(OUT / "layouts.png")
    fig_swizzle_atoms(OUT / "swizzle_atoms.png")
    fig_bank_map(OUT / "bank_map.png")
    fig_mma_layout(OUT / "mma_layout.png")
    fig_transpose_gather(OUT / "transpose_gather.png")


if __name__ == "__main__":
    main()

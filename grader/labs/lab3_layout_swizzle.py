"""Grading functions of Lab 3 (TileLayout and swizzle). Contract with the notebook:

- ``offset_row_major(r, c, shape)``, ``offset_col_major(r, c, shape)``,
  ``offset_tiled(r, c, shape, tile)``, ``offset_swizzled(r, c, shape, elem_bytes, swizzle_bytes)``,
  ``offset_mma(r, c, shape, elem_bytes, swizzle_bytes)``: element offsets of element (r, c) of a
  ``shape = (rows, cols)`` tile (the last one as ``mma_shared_layout(dtype, mode, shape)`` places it).
- ``layout_row_major(shape)``, ``layout_col_major(shape)``, ``layout_tiled(shape, tile)``,
  ``layout_swizzled(shape, elem_bytes, swizzle_bytes)``, ``layout_mma_fragment()``,
  ``layout_warpgroup_rows(cols)``, ``layout_tmem_accumulator(cols)``: the same as TIRx layouts,
  and three layouts over lanes, threads and tensor memory.
- ``offset_mma(r, c, shape, elem_bytes, swizzle_bytes)``: the offset that
  ``mma_shared_layout(dtype, mode, shape)`` gives element (r, c).
- ``wavefronts(addresses, width)``: shared-memory wavefronts of one warp's access.
- ``addresses_rows(offset, row0)``, ``addresses_ldmatrix(offset, row0, col0)``,
  ``addresses_gather(offset, col0, k)``: byte addresses of three warp access patterns on a
  64-column fp16 tile stored by ``offset(r, c)``; ``transpose_smem_offset(r, c)``: the
  shared-memory layout of the swizzled transpose kernel.
- ``swizzle_chunks(swizzle_bytes)`` and ``plot_swizzle(swizzle_bytes, path)``.
- ``build_transpose_plain(m, n)``, ``build_transpose_swizzled(m, n) -> PrimFunc``: b = a.T for
  fp16 a of shape (m, n), called as kernel(a, b); m and n are multiples of 64: the problem
  ``transpose`` of grader/problems.py, whose kernel parts the default runners grade.
"""
from __future__ import annotations

import dataclasses
import functools

from .. import grading, inputs
from ..context import Context, Outcome
from . import build_checks

LAB = "lab3_layout_swizzle"

TILE_COLS = 64          # the fp16 tile of part b has 64 columns (128-byte rows)
TILE_ROWS = 64          # and the transpose kernel's tile is 64 x 64
ELEM = 2                # fp16


# ---------------------------------------------------------------- reference answers

def ref_row_major(r: int, c: int, shape) -> int:
    return r * shape[1] + c


def ref_col_major(r: int, c: int, shape) -> int:
    return c * shape[0] + r


def ref_tiled(r: int, c: int, shape, tile) -> int:
    tr, tc = tile
    tiles_per_row = shape[1] // tc
    return ((r // tr) * tiles_per_row + c // tc) * (tr * tc) + (r % tr) * tc + c % tc


def swizzle_bytes_addr(byte: int, swizzle_bytes: int) -> int:
    """The hardware swizzle on a byte address: bits [7, 7+b) XORed into the 16-byte chunk
    bits [4, 4+b), with 2**b = swizzle_bytes / 16."""
    mask = swizzle_bytes // 16 - 1
    return byte ^ (((byte >> 7) & mask) << 4)


def ref_swizzled(r: int, c: int, shape, elem_bytes: int, swizzle_bytes: int) -> int:
    byte = ref_row_major(r, c, shape) * elem_bytes
    return swizzle_bytes_addr(byte, swizzle_bytes) // elem_bytes


def ref_mma(r: int, c: int, shape, elem_bytes: int, swizzle_bytes: int) -> int:
    rows = shape[0]
    width = swizzle_bytes // elem_bytes        # atom width in elements
    linear = (c // width) * (rows * width) + r * width + c % width
    return swizzle_bytes_addr(linear * elem_bytes, swizzle_bytes) // elem_bytes


FRAGMENT = (16, 8)   # the fp32 accumulator of mma.sync m16n8k16 on one warp
# One CTA's 64 rows of a cta_group::2 M = 128 tcgen05 accumulator: the PTX ISA's data-path layout B,
# columns folded over the two halves of the lanes (tmem_datapath_layout's datapath and row count).
TMEM_FOLDED = ("B", 64)


def ref_fragment(r: int, c: int) -> dict:
    """Lane and register slot of element (r, c) of the m16n8k16 accumulator (PTX ISA: c0, c1 in
    row lane // 4, c2, c3 eight rows below)."""
    return {"laneid": 4 * (r % 8) + c // 2, "m": c % 2 + 2 * (r // 8)}


def ref_wavefronts(addresses, width: int) -> int:
    """Shared-memory wavefronts of one warp access (the model stated in the notebook)."""
    addresses = [int(a) for a in addresses]
    if len(addresses) != 32 or width not in (2, 4, 8, 16):
        raise ValueError("need 32 addresses and a width of 2, 4, 8 or 16 bytes")
    per_phase = 32 if width <= 4 else 128 // width
    total = 0
    for start in range(0, 32, per_phase):
        words_in_bank: dict[int, set] = {}
        for a in addresses[start:start + per_phase]:
            for word in range(a // 4, (a + width - 1) // 4 + 1):
                words_in_bank.setdefault(word % 32, set()).add(word)
        total += max(len(s) for s in words_in_bank.values())
    return total


def ref_addresses_rows(offset, row0: int) -> list[int]:
    return [ELEM * offset(row0 + t // 8, 8 * (t % 8)) for t in range(32)]


def ref_addresses_ldmatrix(offset, row0: int, col0: int) -> list[int]:
    """ldmatrix .x4 of the 16 x 16 A block of mma.m16n8k16 at (row0, col0): thread t gives row t % 8
    of matrix t // 8, the matrices in the A fragment's order (rows 0-7, rows 8-15; then k + 8)."""
    return [ELEM * offset(row0 + 8 * (t // 8 % 2) + t % 8, col0 + 8 * (t // 16)) for t in range(32)]


def ref_addresses_gather(offset, col0: int, k: int) -> list[int]:
    return [ELEM * offset(8 * (t % 8) + k, col0 + t // 8) for t in range(32)]


def ref_transpose_offset(r: int, c: int) -> int:
    """Rows interleaved (row 8p + k stored as row 8k + p), then the 128-byte swizzle."""
    prow = (r % 8) * 8 + r // 8
    return prow * TILE_COLS + ((c // 8) ^ (prow % 8)) * 8 + c % 8


def ref_swizzle_chunks(swizzle_bytes: int) -> list[list[int]]:
    cols = swizzle_bytes // ELEM
    return [[(ref_swizzled(i, 8 * q, (8, cols), ELEM, swizzle_bytes) % cols) // 8
             for q in range(swizzle_bytes // 16)] for i in range(8)]


def ref_stored_chunks(swizzle_bytes: int) -> list[list[int]]:
    """The inverse of ref_swizzle_chunks per row: the logical chunk stored at each position."""
    table = ref_swizzle_chunks(swizzle_bytes)
    stored = [[0] * len(table[0]) for _ in range(8)]
    for i, row in enumerate(table):
        for q, position in enumerate(row):
            stored[i][position] = q
    return stored


# ---------------------------------------------------------------- the library's layouts

def dtype_of(elem_bytes: int) -> str:
    return {1: "float8_e4m3fn", 2: "float16", 4: "float32"}[elem_bytes]


def swizzle_mode(swizzle_bytes: int):
    from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode
    return {32: SwizzleMode.SWIZZLE_32B_ATOM, 64: SwizzleMode.SWIZZLE_64B_ATOM,
            128: SwizzleMode.SWIZZLE_128B_ATOM}[swizzle_bytes]


def lib_tiled(shape, tile):
    """The tiled layout written with S[...]: (tile row, row in tile, tile col, col in tile)."""
    from tvm.tirx.layout import S, TileLayout
    (rows, cols), (tr, tc) = shape, tile
    return TileLayout(S[(rows // tr, tr, cols // tc, tc): (tr * cols, tc, tr * tc, 1)])


def lib_swizzled(shape, elem_bytes: int, swizzle_bytes: int):
    from tvm.tirx.layout import ComposeLayout, S, TileLayout
    per_element = (16 // elem_bytes).bit_length() - 1
    swizzle_len = (swizzle_bytes // 16).bit_length() - 1
    return ComposeLayout(per_element, swizzle_len, 3, TileLayout(S[tuple(shape)]))


def lib_mma(shape, elem_bytes: int, swizzle_bytes: int):
    from tvm.backend.cuda.tile_primitive.tma_utils import mma_shared_layout
    return mma_shared_layout(dtype_of(elem_bytes), swizzle_mode(swizzle_bytes), tuple(shape))


def evaluate(layout, r: int, c: int, shape) -> dict:
    """A layout at logical (r, c) of `shape`: {axis: value}, zero entries dropped."""
    return {str(k): int(v) for k, v in layout.apply(r, c, shape=list(shape)).items() if int(v) != 0}


def _nonzero(d: dict) -> dict:
    return {k: v for k, v in d.items() if v != 0}


# ---------------------------------------------------------------- cases

def _elements(shape, r, limit: int = 192) -> list[tuple[int, int]]:
    rows, cols = shape
    if rows * cols <= limit:
        return [(i, j) for i in range(rows) for j in range(cols)]
    corners = [(0, 0), (rows - 1, cols - 1), (rows - 1, 0), (0, cols - 1)]
    return corners + [(r.randrange(rows), r.randrange(cols)) for _ in range(limit - len(corners))]


def _shape_cases(ctx: Context, public: list, make) -> list:
    cases = list(public)
    if not ctx.public_only:
        r = inputs.rng(LAB, ctx.part.id, ctx.seed)
        cases += [make(r) for _ in range(ctx.part.params["hidden_cases"])]
    return cases


def _random_tile(r):
    tr, tc = r.choice([1, 2, 4, 8, 16]), r.choice([1, 2, 4, 8, 16, 32])
    return (tr * r.randint(1, 8), tc * r.randint(1, 8)), (tr, tc)


def _random_swizzle(r, row_blocks=(1, 2)):
    eb, sw = r.choice([1, 2, 4]), r.choice([32, 64, 128])
    return (8 * r.randint(1, 12), (sw // eb) * r.choice(row_blocks)), eb, sw


PUBLIC_TILED = [((8, 8), (2, 4)), ((16, 32), (8, 8)), ((6, 12), (3, 4)), ((64, 64), (8, 64))]
PUBLIC_SWIZZLED = [((8, 64), 2, 128), ((64, 64), 2, 128), ((16, 32), 2, 64), ((32, 16), 2, 32),
                   ((16, 32), 4, 128), ((24, 128), 1, 128), ((16, 64), 2, 64)]
PUBLIC_MMA = [((64, 64), 2, 128), ((128, 128), 2, 128), ((64, 32), 2, 64), ((16, 64), 4, 128),
              ((32, 256), 1, 128), ((8, 16), 2, 32), ((24, 48), 4, 64)]


def _label(name):
    return lambda a: f"{name}{tuple(a)!r}"


# ---------------------------------------------------------------- part a

def index_calls(ctx: Context) -> list[tuple]:
    """(kind, args, hidden): elements of every tiled, swizzled and MMA tile, public tiles first."""
    r = inputs.rng(LAB, ctx.part.id + "-elements", ctx.seed)
    calls = []
    for k, (shape, tile) in enumerate(_shape_cases(ctx, PUBLIC_TILED, _random_tile)):
        hidden = k >= len(PUBLIC_TILED)
        for i, j in _elements(shape, r, 48):
            calls += [("row_major", (i, j, shape), hidden), ("col_major", (i, j, shape), hidden),
                      ("tiled", (i, j, shape, tile), hidden)]
    for k, (shape, eb, sw) in enumerate(_shape_cases(ctx, PUBLIC_SWIZZLED, _random_swizzle)):
        calls += [("swizzled", (i, j, shape, eb, sw), k >= len(PUBLIC_SWIZZLED)) for i, j in _elements(shape, r, 96)]
    mma = _shape_cases(ctx, PUBLIC_MMA, lambda rr: _random_swizzle(rr, (1, 2, 3, 4)))
    for k, (shape, eb, sw) in enumerate(mma):
        calls += [("mma", (i, j, shape, eb, sw), k >= len(PUBLIC_MMA)) for i, j in _elements(shape, r, 96)]
    return calls


@functools.lru_cache(maxsize=256)
def _library_layout(kind: str, shape: tuple, *rest):
    return {"row_major": _lib_row_major, "col_major": _lib_col_major, "tiled": lib_tiled,
            "swizzled": lib_swizzled, "mma": lib_mma}[kind](shape, *rest)


def _library_offset(kind: str):
    """The answer of the library's layout of ``kind`` (TIRx) at element (i, j) of the tile."""
    def offset(i, j, shape, *rest):
        shape = tuple(shape)
        rest = tuple(tuple(x) if isinstance(x, list) else x for x in rest)
        return evaluate(_library_layout(kind, shape, *rest), i, j, shape).get("m", 0)
    return offset


def _lib_row_major(shape):
    from tvm.tirx.layout import S, TileLayout
    return TileLayout(S[tuple(shape)])


def _lib_col_major(shape):
    from tvm.tirx.layout import S, TileLayout
    return TileLayout(S[tuple(shape): (1, shape[0])])


def grade_layouts(module, ctx: Context) -> Outcome:
    from tvm.tirx.layout import Layout, tmem_datapath_layout, wg_local_layout
    names = ("layout_row_major", "layout_col_major", "layout_tiled", "layout_swizzled",
             "layout_mma_fragment", "layout_warpgroup_rows", "layout_tmem_accumulator")
    fns = {n: grading.student(module, n) for n in names}
    r = inputs.rng(LAB, ctx.part.id + "-elements", ctx.seed)
    checks = []  # (label, student layout, shape, reference layout-or-fn)
    for shape, tile in _shape_cases(ctx, PUBLIC_TILED, _random_tile):
        checks.append((f"layout_row_major({shape})", fns["layout_row_major"](shape), shape,
                       lambda i, j, s=shape: _nonzero({"m": ref_row_major(i, j, s)})))
        checks.append((f"layout_col_major({shape})", fns["layout_col_major"](shape), shape,
                       lambda i, j, s=shape: _nonzero({"m": ref_col_major(i, j, s)})))
        checks.append((f"layout_tiled({shape}, {tile})", fns["layout_tiled"](shape, tile), shape,
                       lambda i, j, s=shape, t=tile: _nonzero({"m": ref_tiled(i, j, s, t)})))
    for shape, eb, sw in _shape_cases(ctx, PUBLIC_SWIZZLED, _random_swizzle):
        lib = lib_swizzled(shape, eb, sw)
        checks.append((f"layout_swizzled({shape}, {eb}, {sw})", fns["layout_swizzled"](shape, eb, sw), shape,
                       lambda i, j, s=shape, L=lib: evaluate(L, i, j, s)))
    checks.append(("layout_mma_fragment()", fns["layout_mma_fragment"](), FRAGMENT,
                   lambda i, j: _nonzero(ref_fragment(i, j))))
    for cols in (8, 64, 256) + ((16, 32, 128) if not ctx.public_only else ()):
        lib = wg_local_layout(cols)
        checks.append((f"layout_warpgroup_rows({cols})", fns["layout_warpgroup_rows"](cols), (128, cols),
                       lambda i, j, s=(128, cols), L=lib: evaluate(L, i, j, s)))
        lib = tmem_datapath_layout(*TMEM_FOLDED, 2 * cols)
        checks.append((f"layout_tmem_accumulator({2 * cols})", fns["layout_tmem_accumulator"](2 * cols),
                       (64, 2 * cols), lambda i, j, s=(64, 2 * cols), L=lib: evaluate(L, i, j, s)))
    public_labels = {lb for lb, *_ in _public_layout_labels(ctx)}
    wrong, total, bad_layouts = [], 0, 0
    for label, layout, shape, expect in checks:
        if not (isinstance(layout, Layout) or getattr(layout, "is_layout", False)):
            bad_layouts += 1
            wrong.append(f"{label} returned {type(layout).__name__}, not a TileLayout/ComposeLayout")
            total += 1
            continue
        first = None
        elems = _elements(shape, r, 64)
        for i, j in elems:
            got, exp = evaluate(layout, i, j, shape), expect(i, j)
            if got != exp and first is None:
                first = (f"{label} at ({i}, {j}): apply gives {got}, expected {exp}" if label in public_labels
                         else grading.hidden_case(total))
        total += 1
        if first:
            wrong.append(first)
    wrong.sort(key=lambda w: w.startswith(grading.HIDDEN_CASE))
    good = total - len(wrong)
    msg = f"{good}/{total} layouts right on every element checked"
    if wrong:
        msg += "; first wrong: " + wrong[0]
    return Outcome(good / total, msg, {"layouts": total, "right": good})


def _public_layout_labels(ctx: Context) -> list[tuple[str]]:
    """The labels of the layout checks a public-only run makes (the others are hidden)."""
    pub = dataclasses.replace(ctx, public_only=True)
    out = [(f"layout_{k}({shape})",) for shape, _ in _shape_cases(pub, PUBLIC_TILED, _random_tile)
           for k in ("row_major", "col_major")]
    out += [(f"layout_tiled({shape}, {tile})",) for shape, tile in _shape_cases(pub, PUBLIC_TILED, _random_tile)]
    out += [(f"layout_swizzled({shape}, {eb}, {sw})",) for shape, eb, sw in _shape_cases(pub, PUBLIC_SWIZZLED, _random_swizzle)]
    out += [("layout_mma_fragment()",)]
    out += [(f"layout_warpgroup_rows({c})",) for c in (8, 64, 256)] + [(f"layout_tmem_accumulator({2 * c})",) for c in (8, 64, 256)]
    return out


# ---------------------------------------------------------------- part b

PUBLIC_ACCESSES = [
    # (addresses, width): the examples of the notebook
    ([4 * t for t in range(32)], 4),                       # 32 consecutive words: 1
    ([128 * t for t in range(32)], 4),                     # a column of 128-byte rows: 32
    ([0] * 32, 4),                                         # one word for everyone (broadcast): 1
    ([8 * t for t in range(32)], 4),                       # every other word: 2
    ([8 * t for t in range(32)], 8),                       # 256 contiguous bytes: 2
    ([16 * t for t in range(32)], 16),                     # 512 contiguous bytes: 4
    ([16 * (t % 8) for t in range(32)], 16),               # every quarter-warp reads the same 128 bytes: 4
    ([128 * t for t in range(32)], 16),                    # ldmatrix-like column, row-major: 32
    ([128 * t + 16 * (t % 8) for t in range(32)], 16),     # the same, 128-byte swizzle: 4
    ([2 * t for t in range(32)], 2),                       # 64 contiguous bytes of fp16: 1
    ([256 * (t % 8) + 2 * (t // 8) for t in range(32)], 2),  # the transpose's gather, row-major: 8
]


def _random_access(r) -> tuple[list[int], int]:
    width = r.choice([2, 4, 8, 16])
    kind = r.choice(["window", "stride", "stride", "broadcast", "permuted", "rows"])
    if kind == "window":
        span = r.choice([128, 512, 2048, 8192])
        return [width * r.randrange(span // width) for _ in range(32)], width
    if kind == "stride":
        stride = width * r.choice([1, 2, 3, 4, 8, 16, 32, 33, 64, 17])
        base = width * r.randrange(64)
        return [base + stride * t for t in range(32)], width
    if kind == "broadcast":
        groups = r.choice([1, 2, 4, 8])
        picks = [width * r.randrange(4096 // width) for _ in range(groups)]
        return [picks[t % groups] for t in range(32)], width
    if kind == "permuted":
        addrs = [width * t for t in range(32)]
        r.shuffle(addrs)
        return addrs, width
    # rows: `per_row` threads read consecutive elements of one row; rows `pitch` bytes apart
    pitch = width * r.choice([8, 16, 32, 34, 36, 64])
    per_row = r.choice([2, 4, 8])
    return [pitch * (t // per_row) + width * (t % per_row) for t in range(32)], width


def counter_calls(ctx: Context) -> list[tuple]:
    accesses = list(PUBLIC_ACCESSES)
    if not ctx.public_only:
        r = inputs.rng(LAB, ctx.part.id, ctx.seed)
        accesses += [_random_access(r) for _ in range(ctx.part.params["hidden_cases"])]
    return [("wavefronts", (list(a), w)) for a, w in accesses]


def _pattern_offsets(r) -> dict:
    """Offset functions of 64-column fp16 tiles the pattern generators are tested with."""
    from ..remote import Table2D
    perm = list(range(TILE_ROWS * TILE_COLS // 8))
    r.shuffle(perm)
    fns = {
        "row-major": lambda i, j: ref_row_major(i, j, (TILE_ROWS, TILE_COLS)),
        "128B swizzle": lambda i, j: ref_swizzled(i, j, (TILE_ROWS, TILE_COLS), ELEM, 128),
        "interleaved + 128B swizzle": ref_transpose_offset,
        "random chunk permutation": lambda i, j: 8 * perm[(i * TILE_COLS + j) // 8] + j % 8,
    }
    # Tables, so that they can be passed to the submission's functions in the grader's sandbox.
    return {k: Table2D(f, TILE_ROWS, TILE_COLS) for k, f in fns.items()}


def grade_patterns(module, ctx: Context) -> Outcome:
    gens = {n: grading.student(module, n) for n in ("addresses_rows", "addresses_ldmatrix", "addresses_gather")}
    design = grading.student(module, "transpose_smem_offset")
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    n_cases = 2 if ctx.public_only else 2 + ctx.part.params["hidden_cases"]
    fixed = [("addresses_rows", (0,)), ("addresses_ldmatrix", (0, 0)), ("addresses_gather", (0, 0))]
    cases = []
    offsets = _pattern_offsets(r)
    for name, off in offsets.items():
        calls = list(fixed) if name != "random chunk permutation" or not ctx.public_only else []
        for _ in range(n_cases):
            calls.append(("addresses_rows", (4 * r.randrange(15),)))
            calls.append(("addresses_ldmatrix", (16 * r.randrange(4), 8 * r.randrange(7))))
            calls.append(("addresses_gather", (4 * r.randrange(16), r.randrange(8))))
        for k, (fn_name, args) in enumerate(calls):
            cases.append((name, off, fn_name, args, k >= len(fixed) or name == "random chunk permutation"))
    refs = {"addresses_rows": ref_addresses_rows, "addresses_ldmatrix": ref_addresses_ldmatrix,
            "addresses_gather": ref_addresses_gather}
    widths = {"addresses_rows": 16, "addresses_ldmatrix": 16, "addresses_gather": 2}
    wrong, notes = [], {}
    for c, (lay, off, fn_name, args, hidden) in enumerate(cases):
        exp = refs[fn_name](off, *args)
        got = gens[fn_name](off, *args)
        try:
            same = [int(x) for x in got] == exp
        except (TypeError, ValueError):
            same = False
        if not same:
            wrong.append(grading.hidden_case(c) if hidden and not ctx.public_only else
                         f"{fn_name}(<{lay}>, {', '.join(map(str, args))}): got {got!r}, expected {exp!r}")
        notes.setdefault((lay, fn_name), ref_wavefronts(exp, widths[fn_name]))
    pat_frac = (len(cases) - len(wrong)) / len(cases)
    pat_msg = f"patterns: {len(cases) - len(wrong)}/{len(cases)} address lists right"
    if wrong:
        pat_msg += "; first wrong: " + wrong[0]
    table = "; ".join(f"{lay}: rows {notes[(lay, 'addresses_rows')]}, ldmatrix {notes[(lay, 'addresses_ldmatrix')]}, "
                      f"gather {notes[(lay, 'addresses_gather')]} wavefronts"
                      for lay in ("row-major", "128B swizzle", "interleaved + 128B swizzle"))
    d_ok, d_msg = check_transpose_layout(design)
    frac = 0.5 * pat_frac + (0.5 if d_ok else 0.0)
    return Outcome(frac, f"{pat_msg} | transpose_smem_offset: {d_msg} | reference counts: {table}",
                   {"patterns_right": len(cases) - len(wrong), "patterns": len(cases), "layout_ok": d_ok})


def check_transpose_layout(offset) -> tuple[bool, str]:
    """The layout of the swizzled transpose kernel: a bijection of the 64 x 64 tile that keeps
    16-byte chunks whole and aligned, with conflict-free row writes and column gathers."""
    ok, why = grading.chunked_bijection(offset, TILE_ROWS, TILE_COLS, 8)    # 8 fp16 = 16 bytes
    if not ok:
        return False, why
    for row0 in range(0, TILE_ROWS, 4):
        w = ref_wavefronts(ref_addresses_rows(offset, row0), 16)
        if w != 4:
            return False, f"the load phase's row writes (rows {row0}-{row0 + 3}) take {w} wavefronts, not 4"
    worst = max(ref_wavefronts(ref_addresses_gather(offset, col0, k), 2)
                for col0 in range(0, TILE_COLS, 4) for k in range(8))
    if worst != 1:
        return False, f"the gather reads take up to {worst} wavefronts per warp instruction, not 1"
    return True, "a bijection with whole 16-byte chunks; row writes 4 wavefronts, every gather 1"


# ---------------------------------------------------------------- part c

def grade_atom(module, ctx: Context) -> Outcome:
    table = grading.grade_question(CHUNKS, module, ctx)
    img_ok, img_msg = check_swizzle_figure(grading.figure(module, ctx.part.params["plot"], 128), 128)
    frac = 0.5 * table.fraction + (0.5 if img_ok else 0.0)
    return Outcome(frac, f"swizzle_chunks: {table.message}; plot: {img_msg}", table.measurements)


def check_swizzle_figure(axes: list[dict], swizzle_bytes: int) -> tuple[bool, str]:
    """What the lab asks of the plot: the chunk stored at each 16-byte position of the atom's
    8 rows under the swizzle, drawn as an image (or as a grid of numbers)."""
    stored = ref_stored_chunks(swizzle_bytes)
    n = len(stored[0])
    if not axes:
        return False, "no figure was saved to the path given"
    for ax in axes:
        for img in ax.get("images", []):
            if [[int(round(v)) for v in row] for row in img] == stored:
                return True, f"the {swizzle_bytes}-byte swizzle is drawn (8 x {n} chunks)"
    return False, (f"no image shows the chunk stored at each position of the {swizzle_bytes}-byte swizzle "
                   f"(an 8 x {n} grid, as swizzle_chunks gives it, inverted per row)")

# ---------------------------------------------------------------- the student edition's public tables
# Parts whose grading functions do more than grade tables of calls record their public cases
# here (the hook PUBLIC_TABLES, called by grader/edition/release.py with the public context and
# the table toolkit grader/edition/tables.py), from this lab's own case generators and references.

def public_layouts(ctx, tables) -> dict:
    """Lab 3 a_layouts: each layout function's answer, evaluated at the grader's elements."""
    from tvm.tirx.layout import tmem_datapath_layout, wg_local_layout

    r = inputs.rng(LAB, ctx.part.id + "-elements", ctx.seed)
    checks = []   # (function, args, shape, expect(i, j))
    for shape, tile in _shape_cases(ctx, PUBLIC_TILED, _random_tile):
        checks.append(("layout_row_major", (shape,), shape,
                       lambda i, j, s=shape: _nonzero({"m": ref_row_major(i, j, s)})))
        checks.append(("layout_col_major", (shape,), shape,
                       lambda i, j, s=shape: _nonzero({"m": ref_col_major(i, j, s)})))
        checks.append(("layout_tiled", (shape, tile), shape,
                       lambda i, j, s=shape, t=tile: _nonzero({"m": ref_tiled(i, j, s, t)})))
    for shape, eb, sw in _shape_cases(ctx, PUBLIC_SWIZZLED, _random_swizzle):
        lib = lib_swizzled(shape, eb, sw)
        checks.append(("layout_swizzled", (shape, eb, sw), shape, lambda i, j, s=shape, x=lib: evaluate(x, i, j, s)))
    checks.append(("layout_mma_fragment", (), FRAGMENT, lambda i, j: _nonzero(ref_fragment(i, j))))
    for cols in (8, 64, 256):
        lib = wg_local_layout(cols)
        checks.append(("layout_warpgroup_rows", (cols,), (128, cols),
                       lambda i, j, s=(128, cols), x=lib: evaluate(x, i, j, s)))
        lib = tmem_datapath_layout(*TMEM_FOLDED, 2 * cols)
        checks.append(("layout_tmem_accumulator", (2 * cols,), (64, 2 * cols),
                       lambda i, j, s=(64, 2 * cols), x=lib: evaluate(x, i, j, s)))
    cases: dict[str, list] = {}
    for fn, args, shape, expect in checks:
        points = [[i, j, expect(i, j)] for i, j in _elements(shape, r, 64)]
        cases.setdefault(fn, []).append([[tables.encode(a) for a in args], {"shape": list(shape), "points": points}])
    return {"checks": [{"fn": fn, "compare": {"kind": "layout"}, "cases": c} for fn, c in cases.items()],
            "extras": []}


def public_patterns(ctx, tables) -> dict:
    """Lab 3 b_patterns: the address lists on the grader's public layouts, except the transpose
    layout (the answer of transpose_smem_offset), and the shape of transpose_smem_offset."""
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    fixed = [("addresses_rows", (0,)), ("addresses_ldmatrix", (0, 0)), ("addresses_gather", (0, 0))]
    refs = {"addresses_rows": ref_addresses_rows, "addresses_ldmatrix": ref_addresses_ldmatrix,
            "addresses_gather": ref_addresses_gather}
    offsets = _pattern_offsets(r)
    shape = (TILE_ROWS, TILE_COLS)
    cells = [(i, j) for i in range(shape[0]) for j in range(shape[1])]
    answer = [int(ref_transpose_offset(i, j)) for i, j in cells]
    offsets_shipped, cases = {}, {}
    for name, off in offsets.items():
        calls = list(fixed) if name != "random chunk permutation" else []
        for _ in range(2):
            calls.append(("addresses_rows", (4 * r.randrange(15),)))
            calls.append(("addresses_ldmatrix", (16 * r.randrange(4), 8 * r.randrange(7))))
            calls.append(("addresses_gather", (4 * r.randrange(16), r.randrange(8))))
        values = [int(off(i, j)) for i, j in cells]
        if values == answer:          # the answer of transpose_smem_offset: not shipped
            continue
        offsets_shipped[name] = {"shape": list(shape), "values": values}
        ref_off = tables.TableOffset(name, shape, offsets_shipped[name]["values"])
        for fn, args in calls:
            cases.setdefault(fn, []).append([[tables.encode(ref_off)] + [tables.encode(a) for a in args],
                                             tables.encode(refs[fn](off, *args))])
    return {"checks": [{"fn": fn, "compare": {"kind": "same"}, "cases": c} for fn, c in cases.items()],
            "offsets": offsets_shipped,
            "extras": [{"kind": "chunked_bijection", "fn": "transpose_smem_offset", "shape": list(shape), "chunk": 8},
                       {"kind": "own_counts", "fn": "transpose_smem_offset", "shape": list(shape), "counter": "wavefronts",
                        "patterns": [{"fn": "addresses_rows", "width": 16, "needs": 4,
                                      "args": [[row0] for row0 in range(0, TILE_ROWS, 4)]},
                                     {"fn": "addresses_gather", "width": 2, "needs": 1,
                                      "args": [[col0, k] for col0 in range(0, TILE_COLS, 4) for k in range(8)]}]}],
            "note": "the address patterns on your transpose layout are checked by the course grader"}


PUBLIC_TABLES = {"a_layouts": public_layouts, "b_patterns": public_patterns}


QUESTIONS = {   # CPU questions declared as data: graded by grading.grade_question (grader/dispatch.py)
    "a_index": grading.Question(
        index_calls,
        answers={k: _library_offset(k) for k in ("row_major", "col_major", "tiled", "swizzled", "mma")},
        params={"row_major": ("i", "j", "shape"), "col_major": ("i", "j", "shape"), "tiled": ("i", "j", "shape", "tile"),
                "swizzled": ("i", "j", "shape", "elem_bytes", "swizzle_bytes"),
                "mma": ("i", "j", "shape", "elem_bytes", "swizzle_bytes")},
        compare="int"),
    "b_counter": grading.Question(counter_calls, answers={"wavefronts": ref_wavefronts},
                                  params={"wavefronts": ("addresses", "width")}, compare="int"),
}
CHUNKS = grading.Question(lambda ctx: [("chunks", (sw,)) for sw in (32, 64, 128)],
                          answers={"chunks": ref_swizzle_chunks}, params={"chunks": ("swizzle_bytes",)},
                          compare="int_rows")


GRADERS = {
    "a_layouts": grade_layouts,
    "b_patterns": grade_patterns,
    "c_atom": grade_atom,
    "d_build": build_checks.transpose_build,   # both kernels through shared memory, the swizzled one with an XOR
    # d_correct and d_speed: problem "transpose" (grader/problems.py), graded by grader/runners.py
}

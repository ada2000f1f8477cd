"""Grading functions of Lab 4 (GEMM on tensor cores). Contract with the notebook:

- ``wgmma_desc_fields(swizzle_bytes) -> (lbo, sbo, swizzle_code)`` and
  ``wgmma_desc_offset(row, k, dtype_bytes, swizzle_bytes) -> int`` (bytes from the tile's start)
  for a K-major SMEM tile whose rows are one swizzle atom wide, and
  ``wgmma_desc_fields_mn(swizzle_bytes, k_rows) -> (lbo, sbo, swizzle_code)`` for an MN-major
  tile of k_rows rows laid out by ``mma_shared_layout`` (column blocks one atom wide, each k_rows
  rows deep, one after the other).
- ``wgmma_acc_coord(thread, reg) -> (row, col)`` and ``wgmma_acc_owner(row, col) -> (thread, reg)``:
  the fp32 accumulator fragment of wgmma m64nN.
- ``first_unsafe(ops) -> int | None`` (schedule of "copy", "fence", "sync", "mma", "wait", "read"),
  ``wait_parities(iterations, completed_before) -> list`` and
  ``early_waits(parities, completed_before) -> list``, ``grid_info(M, N, K, blk_m, blk_n, blk_k)
  -> dict`` and ``same_tiles(bx, by, M, N, blk_m, blk_n) -> dict``.
- ``hopper_step1..4(M, N, K)`` (sm_90a, wgmma) and ``blackwell_step1..4(M, N, K)`` (sm_100a,
  tcgen05) -> PrimFunc computing D = A @ B, A [M, K], B [K, N] (N-major), D [M, N] in fp16 with
  fp32 accumulation, called as ``kernel(A, B, D)``; M and N multiples of 128, K of 64 (step 1 is
  128 x 128 x 64 only, step 2 has M = N = 128).

The kernel parts run the builder of the GPU's track (``builders`` in the spec, keyed by
track): the problem ``gemm_nn`` of grader/problems.py, graded by the default runners. The SASS
part compiles the Hopper kernels and checks that no instruction reads a wgmma accumulator
register while a wgmma may still be writing it.
"""
from __future__ import annotations

from .. import grading, inputs
from ..context import Context
from . import build_checks

LAB = "lab4_gemm"
SWIZZLE_CODES = {32: 1, 64: 2, 128: 3}     # the code TIRx's encode_matrix_descriptor takes
OPS = ("copy", "fence", "sync", "mma", "wait", "read")


# ---------------------------------------------------------------- reference answers

def ref_desc_fields(swizzle_bytes: int) -> tuple[int, int, int]:
    # K-major and swizzled: the leading byte offset is unused (1 by convention); the stride
    # byte offset is the distance between 8-row core-matrix groups, 8 rows of one atom width,
    # in 16-byte units.
    return (1, 8 * swizzle_bytes // 16, SWIZZLE_CODES[swizzle_bytes])


def ref_desc_fields_mn(swizzle_bytes: int, k_rows: int) -> tuple[int, int, int]:
    # MN-major and swizzled: the leading byte offset runs from one atom-wide column block to the
    # next along M or N (k_rows rows of swizzle_bytes), the stride byte offset from one 8-row group
    # to the next along K; both in 16-byte units.
    return (k_rows * swizzle_bytes // 16, 8 * swizzle_bytes // 16, SWIZZLE_CODES[swizzle_bytes])


def ref_desc_offset(row: int, k: int, dtype_bytes: int, swizzle_bytes: int) -> int:
    # Rows are whole atom rows; the hardware applies the XOR itself, so the start address of
    # an 8-row-aligned K slice is plain row-major arithmetic.
    return row * swizzle_bytes + k * dtype_bytes


def ref_acc_coord(thread: int, reg: int) -> tuple[int, int]:
    warp, lane = thread // 32, thread % 32
    return (16 * warp + lane // 4 + 8 * ((reg // 2) % 2), 8 * (reg // 4) + 2 * (lane % 4) + reg % 2)


def ref_acc_owner(row: int, col: int) -> tuple[int, int]:
    r16 = row % 16
    thread = 32 * (row // 16) + 4 * (r16 % 8) + (col % 8) // 2
    return (thread, 4 * (col // 8) + 2 * (r16 // 8) + col % 2)


def ref_first_unsafe(ops) -> int | None:
    copied = fenced = published = issued = in_flight = False
    for i, op in enumerate(ops):
        if op == "copy":
            if in_flight:
                return i                    # overwrites tiles an MMA may still be reading
            copied, fenced, published = True, False, False
        elif op == "fence":
            fenced = fenced or copied
        elif op == "sync":
            published = published or fenced
        elif op == "mma":
            if not published:
                return i                    # some writes are unfinished or not visible to the MMA
            issued = in_flight = True
        elif op == "wait":
            in_flight = False
        elif op == "read":
            if in_flight or not issued:
                return i                    # reads an accumulator the MMA may still be writing
        else:
            raise ValueError(op)
    return None


def ref_wait_parities(iterations: int, completed_before: int) -> list[int]:
    return [(completed_before + i) % 2 for i in range(iterations)]


def ref_early_waits(parities, completed_before: int) -> list[int]:
    return [i for i, p in enumerate(parities) if p != (completed_before + i) % 2]


def ref_grid_info(M: int, N: int, K: int, blk_m: int, blk_n: int, blk_k: int) -> dict:
    gx, gy = M // blk_m, N // blk_n
    return {"grid": (gx, gy), "ctas": gx * gy, "k_tiles": K // blk_k,
            "bytes_loaded": 2 * (M * K * gy + N * K * gx), "bytes_once": 2 * (M * K + N * K)}


def ref_same_tiles(bx: int, by: int, M: int, N: int, blk_m: int, blk_n: int) -> dict:
    gx, gy = M // blk_m, N // blk_n
    return {"same_a": [(bx, y) for y in range(gy) if y != by],
            "same_b": [(x, by) for x in range(gx) if x != bx]}


# ---------------------------------------------------------------- comparison helpers

_hidden = grading.hidden_count


# ---------------------------------------------------------------- part a: descriptor and fragment

def desc_cases(ctx: Context) -> list[tuple]:
    cases = [("fields", (128,)), ("fields", (64,)), ("fields", (32,)),
             ("offset", (0, 0, 2, 128)), ("offset", (0, 16, 2, 128)), ("offset", (64, 48, 2, 128)),
             ("offset", (8, 32, 1, 64)), ("offset", (120, 8, 4, 128)),
             ("fields_mn", (128, 32)), ("fields_mn", (32, 128))]   # not the kernels' (128, 64)
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        b, sw = r.choice([1, 2, 4]), r.choice([32, 64, 128])
        if i % 4 == 3:
            cases.append(("fields_mn", (sw, 8 * r.randrange(1, 33))))
            continue
        step = 32 // b                                 # one wgmma K slice is 32 bytes
        cases.append(("offset", (8 * r.randrange(32), step * r.randrange(sw // 32), b, sw)))
    return cases


def frag_cases(ctx: Context) -> list[tuple]:
    cases = [("coord", (t, i)) for t in range(128) for i in range(64)]
    cases += [("owner", (row, col)) for row in range(64) for col in range(128)]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for _ in range(_hidden(ctx)):
        cases.append(("coord", (r.randrange(128), r.randrange(128))))     # up to n256
        cases.append(("owner", (r.randrange(64), r.randrange(256))))
    return cases


# ---------------------------------------------------------------- exercise questions

SAFE_STEP = ["copy", "fence", "sync", "mma", "wait"]


def sync_cases(ctx: Context) -> list[list[str]]:
    cases = [
        SAFE_STEP + ["read"],                                     # step 1: safe
        SAFE_STEP * 3 + ["read"],                                 # step 2 loop: safe
        ["copy", "fence", "mma", "wait", "read"],                 # no CTA sync
        ["copy", "sync", "mma", "wait", "read"],                  # no proxy fence
        ["copy", "sync", "fence", "mma", "wait", "read"],         # fence after the sync
        ["copy", "fence", "sync", "mma", "read"],                 # no wait before the read
        ["copy", "fence", "sync", "mma", "copy", "fence", "sync", "mma", "wait", "read"],
        ["mma", "wait", "read"],                                  # nothing loaded
        ["copy", "fence", "sync", "mma", "wait", "mma", "wait", "read"],   # same tiles twice: safe
        ["fence", "sync", "copy", "mma", "wait", "read"],
    ]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        if i % 3 == 2:
            cases.append([r.choice(OPS) for _ in range(r.randint(2, 12))])
            continue
        ops = SAFE_STEP * r.randint(1, 3) + ["read"]
        for _ in range(r.randint(1, 2)):                          # one or two mutations
            j = r.randrange(len(ops))
            how = r.choice(["drop", "swap", "dup", "insert"])
            if how == "drop" and len(ops) > 2:
                del ops[j]
            elif how == "swap" and j + 1 < len(ops):
                ops[j], ops[j + 1] = ops[j + 1], ops[j]
            elif how == "dup":
                ops.insert(j, ops[j])
            else:
                ops.insert(j, r.choice(OPS))
        cases.append(ops)
    return cases


def phase_cases(ctx: Context) -> list[tuple]:
    cases = [("parities", (4, 0)), ("parities", (5, 1)), ("parities", (1, 0)), ("parities", (6, 64)),
             ("early", ([0, 0, 0, 0], 0)), ("early", ([0, 1, 0, 1], 0)), ("early", ([1, 1, 1], 0)),
             ("early", ([1, 0, 1, 0, 1], 1)), ("early", ([0, 1, 0, 1], 3)), ("early", ([0] * 7, 2))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        before = r.choice([0, 1, r.randint(0, 500)])
        if i % 2 == 0:
            cases.append(("parities", (r.randint(1, 40), before)))
        else:
            n = r.randint(1, 24)
            style = r.choice(["const", "right", "shifted", "random"])
            if style == "const":
                par = [r.randint(0, 1)] * n
            elif style == "right":
                par = ref_wait_parities(n, before)
                if r.random() < 0.7:
                    j = r.randrange(n)
                    par[j] ^= 1
            elif style == "shifted":
                par = ref_wait_parities(n, before + 1)
            else:
                par = [r.randint(0, 1) for _ in range(n)]
            cases.append(("early", (par, before)))
    return cases


def grid_cases(ctx: Context) -> list[tuple]:
    cases = [("info", (4096, 4096, 4096, 128, 128, 64)), ("info", (256, 384, 512, 128, 128, 64)),
             ("info", (8192, 1024, 256, 128, 256, 64)), ("info", (128, 128, 64, 128, 128, 64)),
             ("same", (0, 0, 4096, 4096, 128, 128)), ("same", (5, 17, 4096, 4096, 128, 128)),
             ("same", (1, 2, 256, 384, 128, 128)), ("same", (0, 0, 128, 128, 128, 128)),
             ("same", (3, 0, 1024, 128, 128, 128))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        bm, bn, bk = r.choice([64, 128, 256]), r.choice([64, 128, 256]), r.choice([32, 64, 128])
        M, N = bm * r.randint(1, 40), bn * r.randint(1, 40)
        if i % 2 == 0:
            cases.append(("info", (M, N, bk * r.randint(1, 128), bm, bn, bk)))
        else:
            cases.append(("same", (r.randrange(M // bm), r.randrange(N // bn), M, N, bm, bn)))
    return cases


# ---------------------------------------------------------------- build parts

# ---------------------------------------------------------------- the accumulator hazard in SASS

def unsafe_cases(ctx: Context) -> list[tuple]:
    return [("unsafe", (ops,)) for ops in sync_cases(ctx)]


QUESTIONS = {   # CPU questions declared as data: graded by grading.grade_question (grader/dispatch.py)
    "a_desc": grading.Question(
        desc_cases,
        answers={"fields": ref_desc_fields, "offset": ref_desc_offset, "fields_mn": ref_desc_fields_mn},
        params={"fields": ("swizzle_bytes",), "offset": ("row", "k", "dtype_bytes", "swizzle_bytes"),
                "fields_mn": ("swizzle_bytes", "k_rows")}),
    "a_frag": grading.Question(
        frag_cases,
        answers={"coord": ref_acc_coord, "owner": ref_acc_owner},
        params={"coord": ("thread", "reg"), "owner": ("row", "col")}),
    "s1_sync": grading.Question(unsafe_cases, answers={"unsafe": ref_first_unsafe}, params={"unsafe": ("ops",)}),
    "s2_phase": grading.Question(
        phase_cases,
        answers={"parities": ref_wait_parities, "early": ref_early_waits},
        params={"parities": ("iterations", "completed_before"), "early": ("parities", "completed_before")}),
    "s3_grid": grading.Question(
        grid_cases,
        answers={"info": ref_grid_info, "same": ref_same_tiles},
        params={"info": ("M", "N", "K", "blk_m", "blk_n", "blk_k"), "same": ("bx", "by", "M", "N", "blk_m", "blk_n")},
        compare={"same": "same_sorted"}),      # the order of the CTAs in a list does not matter
}


# The operand tiles of the Hopper steps' wgmma descriptors (the check "wgmma_desc_fields"): A is
# K-major, one 128-byte swizzle atom wide (the hardware does not read its LBO); B is the N-major
# K x N tile, BLK_K rows along K. Course grader only: the student edition replaces this module.
_TILE_FIELDS = [("A (K-major)", (None,) + ref_desc_fields(128)[1:]), ("B (N-major)", ref_desc_fields_mn(128, 64))]
DESC_FIELDS = {f"s{step}_build_sm90": _TILE_FIELDS for step in (1, 2, 3, 4)}


def _tile_coord(thread: int, k: int) -> tuple[int, int]:
    """(row, col) in the 128 x 128 tile of register k = 64 h + i of ``thread`` (the kernels'
    acc[h * ACC + i], register i of the m64 half h): (64 h + row, col), (row, col) = ref_acc_coord."""
    row, col = ref_acc_coord(thread, k % 64)
    return 64 * (k // 64) + row, col


def _acc_places(part_id: str, blocks=((0, 0),), via: str | None = None):
    """Where the epilogue of CTA (bx, by) of ``blocks`` stores each accumulator register (the check
    "wgmma_epilogue_places"): tile element (row, col) of register k is D[128 bx + row][128 by + col],
    at the part's build shape (bx selects rows, by columns, as step 3 is taught). ``via="tma_store"``:
    the epilogue writes a shared tile and TMA-stores it, and the check follows the tile through the
    stores' boxes, swizzle and coordinates (whatever layout the kernel gives its tile). Course
    grader only, as DESC_FIELDS."""
    from .. import spec
    from ..fragment import Places
    params = spec.load(LAB).part(part_id).params
    rows, cols = params["M"], params["N"]
    coord = [[_tile_coord(t, k) for k in range(128)] for t in range(128)]

    def place(bx, by, r, c):            # None: outside D (an edge tile's register, never stored)
        row, col = 128 * bx + r, 128 * by + c
        return row * cols + col if row < rows and col < cols else None
    return [Places([[place(bx, by, r, c) for r, c in regs] for regs in coord], cols, (bx, by, 0), via, rows * cols)
            for bx, by in blocks]


def relative_places(cols: int, tile, blocks=((0, 0),), via: str | None = None, first: int = 0, threads: int = 128,
                    out: str = "D"):
    """fragment.RelativePlaces of CTAs ``blocks`` for kernels whose design (grid order, tile
    schedule, which warpgroup holds which rows) is the student's: per wgmma width n64, n128 and
    n256, the output offset (rows of ``cols`` elements) of each register k < n of thread t of the
    fragment, from register 0 of thread 0; the warpgroups from thread ``first``, ``threads`` in
    all, cover one (rows, cols) ``tile`` of ``out`` once, wherever it lies. Course grader only (Labs 5
    and 6), as DESC_FIELDS."""
    from ..fragment import RelativePlaces
    rel = {n: [[r * cols + c for r, c in (ref_acc_coord(t, k) for k in range(n))] for t in range(128)]
           for n in (32, 64, 128)}
    return [RelativePlaces(rel, cols, (None, None, *tile), (bx, by, 0), via, first, threads, out=out)
            for bx, by in blocks]


# a CTA away from the origin shows its offsets too (256 x 384: 2 x 3 tiles)
ACC_PLACES = {"s1_build_sm90": _acc_places("s1_build_sm90"), "s2_build_sm90": _acc_places("s2_build_sm90"),
              "s3_build_sm90": _acc_places("s3_build_sm90", ((0, 0), (1, 2))),
              "s4_build_sm90": _acc_places("s4_build_sm90", ((0, 0), (1, 2)), via="tma_store")}

GRADERS = {
    "sass_hazard": build_checks.accumulator_hazard,
    # s1..s4_build_sm90/_sm100: the default build runner (grading.build_part);
    # s1..s4_correct, s3_speed and s4_speed: problem "gemm_nn" (grader/problems.py), graded by
    # grader/runners.py with the builder of the GPU's track
}

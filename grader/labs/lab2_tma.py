"""Grading functions of Lab 2 (TMA loads). Contract with the notebook:

- ``tma_box(tile, dtype_bytes, swizzle_bytes) -> dict`` with keys ``box_2d``, ``copies_2d``,
  ``box_3d``, ``copies_3d`` (boxes innermost dimension first, as the tensor map lists them).
- ``tensor_map_3d(shape, dtype_bytes, tile, swizzle_bytes) -> dict`` with keys
  ``global_dims``, ``global_strides`` (bytes, dimension 0 omitted) and ``box_dims`` of the
  3D view (column within group, row, group) of a row-major 2D tensor, and
  ``tile_coords_3d(t, shape, tile, dtype_bytes, swizzle_bytes) -> tuple`` the coordinates
  of tile ``t`` (tiles numbered row-major) in that view.
- ``expect_tx_bytes(loads) -> int`` for a list of tile loads that signal one mbarrier.
- ``ring_waits(stages, iterations, start) -> list[(stage, empty_parity, full_parity)]``.
- ``build_tma_tile(M, N)`` and ``build_tma_stream(M, N)`` -> PrimFunc computing
  ``out = alpha * x + beta`` over an fp16 (M, N) tensor, called as ``kernel(x, out, alpha, beta)``;
  M a multiple of 64 and N of 128: the problem ``affine`` of grader/problems.py, whose kernel
  parts the default runners grade.

Besides the PTX mechanisms its spec lists, each build part checks the tensor maps the
kernel's host code encodes: every one must use the 128-byte swizzle (the lesson of the lab;
grader/labs/build_checks.py).
"""
from __future__ import annotations

import math

from .. import grading, inputs
from ..context import Context
from . import build_checks

LAB = "lab2_tma"
BOX_DIM_MAX = 256           # hardware limit on every box dimension, in elements


# ---------------------------------------------------------------- reference answers

def ref_box(tile, dtype_bytes: int, swizzle_bytes: int) -> dict:
    rows, cols = tile
    inner = swizzle_bytes // dtype_bytes
    groups = cols // inner
    box_rows = min(rows, BOX_DIM_MAX)
    row_copies = math.ceil(rows / BOX_DIM_MAX)
    return {"box_2d": (inner, box_rows), "copies_2d": groups * row_copies,
            "box_3d": (inner, box_rows, groups), "copies_3d": row_copies}


def ref_map(shape, dtype_bytes: int, tile, swizzle_bytes: int) -> dict:
    m, n = shape
    rows, cols = tile
    inner = swizzle_bytes // dtype_bytes
    return {"global_dims": (inner, m, n // inner),
            "global_strides": (n * dtype_bytes, inner * dtype_bytes),
            "box_dims": (inner, min(rows, BOX_DIM_MAX), cols // inner)}


def ref_coords(t: int, shape, tile, dtype_bytes: int, swizzle_bytes: int) -> tuple:
    _, n = shape
    rows, cols = tile
    inner = swizzle_bytes // dtype_bytes
    tiles_per_row = n // cols
    return (0, (t // tiles_per_row) * rows, (t % tiles_per_row) * cols // inner)


def ref_expect_tx(loads) -> int:
    # TMA delivers (and counts) the whole box, zero-filling what lies outside the tensor.
    return sum(ld["tile"][0] * ld["tile"][1] * ld["dtype_bytes"] for ld in loads)


def ref_ring(stages: int, iterations: int, start: int) -> list:
    out = []
    for k in range(start, start + iterations):
        full = (k // stages) % 2
        out.append((k % stages, full ^ 1, full))
    return out


# ---------------------------------------------------------------- cases

_hidden = grading.hidden_count


def box_cases(ctx: Context) -> list[tuple]:
    cases = [((64, 128), 2, 128), ((128, 64), 2, 128), ((64, 64), 2, 128), ((512, 256), 2, 128),
             ((128, 32), 4, 128), ((256, 128), 1, 64), ((16, 32), 2, 32)]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for _ in range(_hidden(ctx)):
        b, sw = r.choice([1, 2, 4]), r.choice([32, 64, 128])
        cases.append(((2 ** r.randint(3, 10), (sw // b) * r.randint(1, 8)), b, sw))
    return cases


def map_cases(ctx: Context) -> list[tuple]:
    cases = [((1024, 2048), 2, (64, 128), 128, 0), ((1024, 2048), 2, (64, 128), 128, 37),
             ((4096, 4096), 2, (128, 64), 128, 100), ((512, 768), 4, (32, 96), 64, 5),
             ((256, 1024), 1, (256, 256), 128, 3)]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for _ in range(_hidden(ctx)):
        b, sw = r.choice([1, 2, 4]), r.choice([32, 64, 128])
        inner = sw // b
        rows, cols = 2 ** r.randint(3, 8), inner * r.randint(1, 4)
        shape = (rows * r.randint(1, 64), cols * r.randint(1, 32))
        tiles = (shape[0] // rows) * (shape[1] // cols)
        cases.append((shape, b, (rows, cols), sw, r.randrange(tiles)))
    return cases


def expect_tx_cases(ctx: Context) -> list[list[dict]]:
    def load(shape, b, tile, start):
        return {"shape": tuple(shape), "dtype_bytes": b, "tile": tuple(tile), "start": tuple(start)}
    cases = [
        [load((4096, 4096), 2, (64, 128), (0, 0))],
        [load((4096, 4096), 2, (128, 64), (128, 64)), load((4096, 4096), 2, (128, 64), (256, 64))],
        [load((1000, 4096), 2, (64, 128), (960, 0))],                # rows 1000..1023 lie outside
        [load((300, 200), 4, (64, 32), (256, 192)), load((300, 200), 4, (64, 32), (0, 0))],
        [load((8192, 1024), 1, (128, 128), (0, 896))],
    ]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for _ in range(_hidden(ctx)):
        loads = []
        for _ in range(r.randint(1, 4)):
            b = r.choice([1, 2, 4])
            rows, cols = 2 ** r.randint(3, 8), (128 // b) * r.randint(1, 2)
            shape = (r.randint(rows, 8192), r.randint(cols, 8192))
            edge = r.random() < 0.5   # a tile that runs past the end of the tensor
            r0 = (shape[0] - r.randint(1, rows - 1) if edge and rows > 1 else
                  r.randrange(0, shape[0] - rows + 1))
            loads.append(load(shape, b, (rows, cols), (r0, r.randrange(0, shape[1] - cols + 1))))
        cases.append(loads)
    return cases


def ring_cases(ctx: Context) -> list[tuple]:
    cases = [(2, 4, 0), (4, 10, 0), (1, 5, 0), (3, 7, 5), (4, 8, 64)]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for _ in range(_hidden(ctx)):
        cases.append((r.randint(1, 8), r.randint(1, 40), r.choice([0, r.randint(0, 200)])))
    return cases


# ---------------------------------------------------------------- parts a, b, c

def _calls(kind: str, case_fn):
    return lambda ctx: [(kind, tuple(args)) for args in case_fn(ctx)]


def map_calls(ctx: Context) -> list[tuple]:
    """Each case asks both functions of part a_map about one tile of one tensor."""
    calls = []
    for shape, b, tile, sw, t in map_cases(ctx):
        calls += [("map", (shape, b, tile, sw)), ("coords", (t, shape, tile, b, sw))]
    return calls


def tx_calls(ctx: Context) -> list[tuple]:
    return [("tx", (loads,)) for loads in expect_tx_cases(ctx)]


QUESTIONS = {   # CPU questions declared as data: graded by grading.grade_question (grader/dispatch.py)
    "a_box": grading.Question(_calls("box", box_cases), answers={"box": ref_box},
                              params={"box": ("tile", "dtype_bytes", "swizzle_bytes")}),
    "a_map": grading.Question(map_calls, answers={"map": ref_map, "coords": ref_coords},
                              params={"map": ("shape", "dtype_bytes", "tile", "swizzle_bytes"),
                                      "coords": ("t", "shape", "tile", "dtype_bytes", "swizzle_bytes")}),
    "b_expect_tx": grading.Question(tx_calls, answers={"tx": ref_expect_tx}, params={"tx": ("loads",)}),
    "c_ring": grading.Question(_calls("ring", ring_cases), answers={"ring": ref_ring},
                               params={"ring": ("stages", "iterations", "start")}),
}


# ---------------------------------------------------------------- the build parts

# The tensor maps of the host code and the 128B-swizzle check live in build_checks, which the
# student edition ships; tensor_maps is kept here for the lab's readers.
tensor_maps = build_checks.tensor_maps


GRADERS = {
    "d_build": build_checks.tma_build,
    "e_build": build_checks.tma_stream_build,
    # d_correct and e_speed: problem "affine", e_correct: "affine_ring" (each case at a ring depth
    # of its own) (grader/problems.py), graded by grader/runners.py
}

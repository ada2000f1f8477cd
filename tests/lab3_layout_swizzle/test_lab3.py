"""Lab 3: the grader's references agree with TVM's own layouts, and deliberately wrong
submissions are caught (tests/<lab>/test_labN_every_part.py checks that the solution passes and the student
version scores zero)."""
import itertools
import os
import random
import re

import pytest

from conftest import import_notebook

from grader import hardware, inputs, report, run, spec, verdict
from grader.context import Context
from grader.labs import lab3_layout_swizzle as lab

LAB = "lab3_layout_swizzle"
SOLUTION = ("solutions", LAB, f"{LAB}.ipynb")


# ---------------------------------------------------------------- the references themselves

def test_reference_swizzle_is_the_compose_layout_of_the_library():
    r = random.Random(3)
    for eb, sw in itertools.product((1, 2, 4), (32, 64, 128)):
        shape = (8 * r.randint(1, 6), (sw // eb) * r.randint(1, 3))
        layout = lab.lib_swizzled(shape, eb, sw)
        for i, j in itertools.product(range(shape[0]), range(0, shape[1], max(1, shape[1] // 16))):
            assert lab.evaluate(layout, i, j, shape).get("m", 0) == lab.ref_swizzled(i, j, shape, eb, sw)


def test_reference_mma_offset_is_mma_shared_layout():
    r = random.Random(4)
    for eb, sw in itertools.product((1, 2, 4), (32, 64, 128)):
        shape = (8 * r.randint(1, 8), (sw // eb) * r.randint(1, 4))
        layout = lab.lib_mma(shape, eb, sw)
        for _ in range(150):
            i, j = r.randrange(shape[0]), r.randrange(shape[1])
            assert lab.evaluate(layout, i, j, shape).get("m", 0) == lab.ref_mma(i, j, shape, eb, sw)


def test_reference_tiled_offset_is_tile_to():
    from tvm.tirx.layout import S, TileLayout
    for shape, tile in [((8, 8), (2, 4)), ((12, 16), (3, 8)), ((16, 16), (16, 1))]:
        tiled = TileLayout(S[tile]).tile_to(list(shape), list(tile))
        for i, j in itertools.product(range(shape[0]), range(shape[1])):
            assert lab.evaluate(tiled, i, j, shape).get("m", 0) == lab.ref_tiled(i, j, shape, tile)


def test_reference_counter_on_the_notebook_table():
    expected = [1, 32, 1, 2, 2, 4, 4, 32, 4, 1, 8]
    assert [lab.ref_wavefronts(a, w) for a, w in lab.PUBLIC_ACCESSES] == expected
    # 8-byte accesses: threads 0 and 16 are in different phases and never conflict.
    assert lab.ref_wavefronts([256 * (t // 16) + 8 * (t % 16) for t in range(32)], 8) == 2
    # within a half-warp, two different words of one bank conflict.
    assert lab.ref_wavefronts([0, 128] + [8 * t for t in range(2, 32)], 8) == 3


def test_reference_atoms():
    assert lab.ref_swizzle_chunks(128) == [[q ^ i for q in range(8)] for i in range(8)]
    assert lab.ref_swizzle_chunks(64) == [[q ^ (i // 2) for q in range(4)] for i in range(8)]
    assert lab.ref_swizzle_chunks(32) == [[q ^ (i // 4) for q in range(2)] for i in range(8)]


def test_transpose_layout_check_needs_more_than_the_plain_swizzle():
    ok, _ = lab.check_transpose_layout(lab.ref_transpose_offset)
    assert ok
    ok, msg = lab.check_transpose_layout(lambda i, j: lab.ref_swizzled(i, j, (64, 64), 2, 128))
    assert not ok and "gather" in msg and "8 wavefronts" in msg
    ok, msg = lab.check_transpose_layout(lambda i, j: lab.ref_col_major(i, j, (64, 64)))
    assert not ok and "chunk" in msg


# ---------------------------------------------------------------- solution and student version

# ---------------------------------------------------------------- wrong submissions

def grade_here(nb_path, part, tmp_path, seed=12345):
    """Grade one part in this process (the worker's steps, without the subprocess): its PartResult."""
    name = f"lab3_sub_{part}_{abs(hash(str(nb_path))) % 10**8}"
    module = import_notebook(nb_path, tmp_path / name, name)
    lab_spec = spec.load(LAB)
    ctx = Context(lab_spec, lab_spec.part(part), seed, hardware.detect())
    return verdict.grade_part(module, ctx)


def test_off_by_one_swizzle_loses_credit(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {
        "chunk = chunk ^ (line % (swizzle_bytes // 16))": "chunk = chunk ^ ((line + 1) % (swizzle_bytes // 16))"})
    out = grade_here(nb, "a_index", tmp_path)
    assert 0 < out.points < out.max_points and "first wrong: offset_swizzled" in out.message
    right, total = map(int, re.search(r"offset_mma (\d+)/(\d+)", out.message).groups())
    assert right < total     # offset_mma builds on offset_swizzled


@pytest.mark.parametrize("answer", [
    "TileLayout(S[(8, 4, 2) : (4 @ laneid, 1 @ laneid, 1)])",        # the 8 x 8 fragment, rows 8-15 left out
    "TileLayout(S[(8, 2, 4, 2) : (4 @ laneid, 2, 1 @ laneid, 1)])",   # the row split the wrong way round
    "TileLayout(S[(2, 8, 4, 2) : (1, 4 @ laneid, 1 @ laneid, 2)])",   # the two slot pieces swapped
])
def test_a_fragment_that_does_not_hold_rows_r_and_r_plus_8_in_one_lane_is_caught(root, edit, tmp_path, answer):
    nb = edit(os.path.join(root, *SOLUTION), {
        "TileLayout(S[(2, 8, 4, 2) : (2, 4 @ laneid, 1 @ laneid, 1)])": answer})
    out = grade_here(nb, "a_layouts", tmp_path)
    assert out.points < out.max_points, out.message
    assert "first wrong: layout_mma_fragment()" in out.message, out.message


@pytest.mark.parametrize("answer", [
    "TileLayout(S[(64, cols) : (1 @ TLane, 1 @ TCol)])",                  # no folding: lanes 64-127 unused
    "TileLayout(S[(64, 2, cols // 2) : (2 @ TLane, 1 @ TLane, 1 @ TCol)])",  # halves interleaved over the lanes
])
def test_a_tmem_layout_that_does_not_fold_the_column_halves_over_the_lanes_is_caught(root, edit, tmp_path, answer):
    nb = edit(os.path.join(root, *SOLUTION), {
        "TileLayout(S[(64, 2, cols // 2) : (1 @ TLane, 64 @ TLane, 1 @ TCol)])": answer})
    out = grade_here(nb, "a_layouts", tmp_path)
    assert out.points < out.max_points and "first wrong: layout_tmem_accumulator(" in out.message, out.message


@pytest.mark.parametrize("answer", [
    "row0 + 8 * (t // 16) + t % 8, col0 + 8 * (t // 8 % 2))",   # quarters in reading order (upper right second)
    "row0 + 8 * (t // 8 % 2) + t % 8, col0)",                    # one 8-column half only
])
def test_ldmatrix_addresses_with_the_quarters_in_another_order_are_caught(root, edit, tmp_path, answer):
    nb = edit(os.path.join(root, *SOLUTION), {"row0 + 8 * (t // 8 % 2) + t % 8, col0 + 8 * (t // 16))": answer})
    out = grade_here(nb, "b_patterns", tmp_path)
    assert out.points < out.max_points and "first wrong: addresses_ldmatrix" in out.message, out.message


def test_counter_that_ignores_the_access_width_is_caught(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {
        "threads_per_phase = 32 if width <= 4 else 128 // width": "threads_per_phase = 32",
        "for word in range(a // 4, (a + width - 1) // 4 + 1):": "for word in (a // 4,):"})
    out = grade_here(nb, "b_counter", tmp_path)
    assert out.points < 0.9 * out.max_points and "first wrong" in out.message


def test_transpose_layout_without_the_row_interleave_is_caught(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {"row = (r % 8) * 8 + r // 8": "row = r"})
    out = grade_here(nb, "b_patterns", tmp_path)
    assert out.points == pytest.approx(0.5 * out.max_points) and "gather reads take up to 8 wavefronts" in out.message


def test_wrong_atom_table_is_caught(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {"line = (i * swizzle_bytes) // 128": "line = i"})
    out = grade_here(nb, "c_atom", tmp_path)
    assert out.points < out.max_points and "swizzle_chunks(swizzle_bytes=32)" in out.message


@pytest.mark.slow
def test_swizzled_kernel_without_xor_loses_the_build_part(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {
        "tile.vstore([transpose_smem_offset(r, q * CHUNK)],": "tile.vstore([plain_smem_offset(r, q * CHUNK)],",
        "vec[k] = tile[transpose_smem_offset(p * CHUNK + k, j)]": "vec[k] = tile[plain_smem_offset(p * CHUNK + k, j)]"})
    out = grade_here(nb, "d_build", tmp_path)
    assert out.points == pytest.approx(0.5 * out.max_points) and "no XOR" in out.message


@pytest.mark.gpu
def test_kernel_reading_the_tile_with_the_wrong_layout_fails(root, edit, device):
    nb = edit(os.path.join(root, *SOLUTION), {
        "vec[k] = tile[transpose_smem_offset(p * CHUNK + k, j)]": "vec[k] = tile[plain_smem_offset(p * CHUNK + k, j)]"})
    r = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["d_correct"], progress=lambda m: None)[0]
    assert r.verdict in (report.PARTIAL, report.FAILED) and r.points <= 1.5
    assert "swizzled" in r.message and "first at" in r.message

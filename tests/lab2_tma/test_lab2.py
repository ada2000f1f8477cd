"""Lab 2: deliberately wrong submissions are caught (tests/<lab>/test_labN_every_part.py checks that the
solution passes and the student version scores zero), including kernels whose barriers
never complete (the grader's timeout turns the hang into a verdict)."""
import dataclasses
import itertools
import os

import pytest

from conftest import import_notebook

from grader import build, hardware, inputs, inspect, report, run, spec, verdict
from grader.context import Context
from grader.labs import build_checks, lab2_tma

LAB = "lab2_tma"
SOLUTION = ("solutions", LAB, "lab2_tma.ipynb")

# Deliberate barrier bugs. Each compiles (only the runtime can catch it) and each hangs:
# an expect_tx larger than the bytes the copy delivers never lets the phase complete, and a
# producer that waits on the parity of the phase still in progress waits for itself.
EXPECT_TX_DOUBLED = {"T.ptx.mbarrier.arrive.expect_tx(bar.ptr_to([0]), TILE_BYTES)":
                     "T.ptx.mbarrier.arrive.expect_tx(bar.ptr_to([0]), 2 * TILE_BYTES)"}
PRODUCER_PHASE_FLIPPED = {"T.ptx.mbarrier.try_wait(empty.ptr_to([s]), phase ^ 1)":
                          "T.ptx.mbarrier.try_wait(empty.ptr_to([s]), phase)"}
HANG_TIMEOUT_S = 40


def _solution_module(root, tmp_path):
    return import_notebook(os.path.join(root, *SOLUTION), tmp_path, "lab2_solution")


def test_reference_tensor_map_matches_what_tvm_encodes(root, tmp_path):
    """Part a's answer for the lab's tile is the 3D tensor map tma_auto really builds."""
    mod = _solution_module(root, tmp_path)
    shape = (1024, 2048)
    maps = lab2_tma.tensor_maps(mod.build_tma_tile(*shape), "sm_90a")
    assert {m["tensor"] for m in maps} == {"X", "OUT"}
    ref = lab2_tma.ref_map(shape, 2, (mod.TILE_M, mod.TILE_N), 128)
    for m in maps:
        assert m["global_dims"] == ref["global_dims"]
        assert m["global_strides"] == ref["global_strides"]
        assert m["box_dims"] == ref["box_dims"]
        assert m["swizzle"] == build_checks.REQUIRED_SWIZZLE


def test_ring_reference_matches_the_phase_table():
    """Two stages, first four iterations: the table of the async-barriers chapter."""
    assert lab2_tma.ref_ring(2, 4, 0) == [(0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1)]
    assert lab2_tma.ref_ring(2, 2, 2) == lab2_tma.ref_ring(2, 4, 0)[2:]


_names = itertools.count()


def _module(nb, tmp_path):
    """Import a notebook's submission module in this process (cheaper than a grading subprocess)."""
    return import_notebook(nb, tmp_path / f"module{next(_names)}", f"lab2_submission_{next(_names)}")


def _grade_here(nb, part_id, device, tmp_path, **params):
    """Grade one part in this process; ``params`` override the spec's (e.g. fewer archs)."""
    part = spec.load(LAB).part(part_id)
    if params:
        part = dataclasses.replace(part, params={**part.params, **params})
    ctx = Context(spec.load(LAB), part, inputs.PUBLIC_SEED, device)
    return verdict.grade_part(_module(nb, tmp_path), ctx)


@pytest.mark.slow
def test_clamping_edge_tiles_gets_partial_credit(root, edit, device):
    """Counting only the in-bounds part of an edge tile would hang the kernel: caught on edge cases."""
    nb = edit(os.path.join(root, *SOLUTION), {
        '    return sum(ld["tile"][0] * ld["tile"][1] * ld["dtype_bytes"] for ld in loads)':
        '    return sum(min(ld["tile"][0], ld["shape"][0] - ld["start"][0])'
        ' * min(ld["tile"][1], ld["shape"][1] - ld["start"][1]) * ld["dtype_bytes"] for ld in loads)'})
    r = run.check_lab(LAB, nb, 12345, device, parts=["b_expect_tx"], progress=lambda m: None)[0]
    assert r.verdict == report.PARTIAL and 0 < r.points < 2, r.message
    assert "first wrong" in r.message


def test_producer_parity_equal_to_consumer_parity_fails(root, edit, device, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {
        "empty_parity = full_parity ^ 1     # the producer waits for the consumers of round rnd - 1":
        "empty_parity = full_parity"})
    r = _grade_here(nb, "c_ring", device, tmp_path)
    assert r.verdict == report.FAILED and r.points == 0 and "first wrong" in r.message


def test_outermost_first_boxes_are_wrong(root, edit, device, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {'"box_2d": (inner, box_rows)': '"box_2d": (box_rows, inner)'})
    r = _grade_here(nb, "a_box", device, tmp_path)
    assert r.points < 2 and "box_2d" in r.message


def test_swapped_view_strides_are_wrong(root, edit, device, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {
        '"global_strides": (n * dtype_bytes, inner * dtype_bytes)': '"global_strides": (inner * dtype_bytes, n * dtype_bytes)'})
    r = _grade_here(nb, "a_map", device, tmp_path)
    # every tensor_map_3d call is wrong, every tile_coords_3d call right: half the calls, each function counted
    assert r.verdict == report.PARTIAL and r.points == r.max_points / 2, r
    n = r.measurements["cases"] // 2
    assert "global_strides" in r.message and f"(tensor_map_3d 0/{n}, tile_coords_3d {n}/{n})" in r.message


@pytest.mark.slow
def test_unswizzled_tile_loses_the_build_part(root, edit, device, tmp_path):
    """A kernel that works but loads into an unswizzled tile misses the point of the lab."""
    nb = edit(os.path.join(root, *SOLUTION), {
        'mma_shared_layout("float16", SwizzleMode.SWIZZLE_128B_ATOM, (TILE_M, TILE_N))':
        'mma_shared_layout("float16", SwizzleMode.SWIZZLE_NONE, (TILE_M, TILE_N))'})
    r = _grade_here(nb, "d_build", device, tmp_path, archs=["sm_90a"])
    assert r.verdict == report.FAILED and "MISSING the 128B swizzle" in r.message, r.message


@pytest.mark.slow
@pytest.mark.parametrize("bug, builder", [(EXPECT_TX_DOUBLED, "build_tma_tile"), (PRODUCER_PHASE_FLIPPED, "build_tma_stream")],
                         ids=["expect_tx_doubled", "producer_phase_flipped"])
def test_barrier_bugs_still_compile(root, edit, tmp_path, bug, builder):
    """Neither bug is visible to the compiler or to the mechanism checks: only running it shows it."""
    mod = _module(edit(os.path.join(root, *SOLUTION), bug), tmp_path)
    art = build.compile_only(getattr(mod, builder)(1024, 1024), "sm_90a", want_sass=True)
    checks = inspect.check_all(["tma_load", "tma_store", "mbarrier_expect_tx"], {"sass": art.sass})
    assert art.cubin and all(c.ok for c in checks), [c.message for c in checks]


def _run_with_timeout(nb, part_id, tmp_path, timeout_s):
    return run.check_lab(LAB, nb, inputs.PUBLIC_SEED, hardware.detect(), parts=[part_id],
                         progress=lambda m: None)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("bug, part", [(EXPECT_TX_DOUBLED, "d_correct"), (PRODUCER_PHASE_FLIPPED, "e_correct")],
                         ids=["expect_tx_doubled", "producer_phase_flipped"])
def test_barrier_bug_hangs_and_gets_a_clear_verdict(root, edit, tmp_path, bug, part):
    nb = edit(os.path.join(root, *SOLUTION), bug)
    r = _run_with_timeout(nb, part, tmp_path, HANG_TIMEOUT_S)
    assert r.verdict == report.ERROR and r.points == 0
    assert "timed out" in r.message and "barrier wait that never completes" in r.message, r.message


@pytest.mark.gpu
def test_kernel_that_drops_beta_fails_with_first_mismatch(root, edit, device):
    nb = edit(os.path.join(root, *SOLUTION), {
        '            reg[e] = T.Cast("float16", alpha * T.Cast("float32", reg[e]) + beta)\n        for i in T.unroll(CHUNKS):':
        '            reg[e] = T.Cast("float16", alpha * T.Cast("float32", reg[e]))\n        for i in T.unroll(CHUNKS):'})
    r = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["d_correct"], progress=lambda m: None)[0]
    assert r.verdict == report.FAILED and "first at" in r.message, r.message


# A stage index kept in a running counter, as the lecture's three-stage example keeps it: it builds
# at the default depth, and at one stage tma_auto cannot prove the slice's alignment.
RUNNING_STAGE_COUNTER = {
    "            # producer: one thread keeps the ring full\n            for it in T.serial(n_iter):\n"
    "                s = T.meta_var(it % stages)\n":
    "            # producer: one thread keeps the ring full\n            cnt = T.alloc_local((1,), \"int32\")\n"
    "            cnt[0] = 0\n            for it in T.serial(n_iter):\n                s = T.meta_var(cnt[0])\n",
    'dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([s]))\n':
    'dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([s]))\n                cnt[0] = (cnt[0] + 1) % stages\n'}


def test_the_stream_is_graded_at_every_ring_depth_and_built_at_one_stage(root, edit, tmp_path):
    """Part e's correctness cases each run at a ring depth of their own, one stage included (public
    and hidden), and its build check also builds a ring of one stage, so that a ring written for
    one depth (the lecture's example has three) shows without a GPU. The reference passes; a
    stream with a running stage counter builds at the default depth only and fails the part."""
    from grader import problems
    lab = spec.load(LAB)
    e = lab.part("e_correct").params
    ring = problems.PROBLEMS[e["problem"]]
    depths = [ring.shape(s).stages for s in e["public_shapes"]]
    assert ring.fields[-1] == "stages" and build_checks.RING_DEPTH_ALSO_BUILT in depths
    assert len(set(depths)) >= 4 and build_checks.RING_DEPTH_ALSO_BUILT in e["hidden_choices"]["stages"]
    assert lab.part("e_speed").params["problem"] == "affine"      # timed at the student's default depth
    no_gpu = hardware.Device(False, "", None, "", reason="no GPU in this test")
    ctx = Context(lab, lab.part("e_build"), inputs.PUBLIC_SEED, no_gpu)
    good = verdict.grade_part(_module(os.path.join(root, *SOLUTION), tmp_path), ctx)
    assert good.verdict == report.PASSED and good.message.count("builds with stages=1 too") == 2, good.message
    counter = _module(edit(os.path.join(root, *SOLUTION), RUNNING_STAGE_COUNTER), tmp_path)
    build.compile_only(counter.build_tma_stream(1024, 1024), "sm_90a")         # builds at the default depth
    bad = verdict.grade_part(counter, ctx)
    assert bad.points == 0 and bad.message.count("with stages=1 the stream does not build") == 2, bad.message
    assert "the index `cnt` moves the tile by 2 byte(s)" in bad.message and "move_base_to" not in bad.message

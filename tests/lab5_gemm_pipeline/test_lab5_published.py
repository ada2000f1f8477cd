"""Lab 5's Blackwell build parts judged by published kernels that reach cuBLAS on a B200: the
book's steps 7, 8 and 9 (tests/published_kernels/book_gemm.py) and mlc-ai/tirx-kernels' fp16
GEMM (tests/published_kernels/tirx_gemm.py), at the commits the book pins; and the reference's
own book-shaped step 8 (pairs=1). Each passes the part it implements, with no setmaxnreg and no
TMA multicast required; a broken variant of each fails with the message that names what broke;
a kernel that does nothing at the build shape is called degenerate, from its PrimFunc and from
the host code of an exported library alike."""
import functools
import math
import os

import pytest
from conftest import grade_in_process, grade_with_builders, import_notebook
from published_kernels import book_gemm, tirx_gemm

from grader import report

LAB = "lab5_gemm_pipeline"
SOLUTION = ("solutions", LAB, "lab5_gemm_pipeline.ipynb")


def part(step, builder, **params):
    return grade_with_builders(LAB, f"s{step}_build_sm100", {f"blackwell_step{step}": builder}, **params)


@pytest.mark.slow
def test_the_books_steps_7_to_9_pass_without_setmaxnreg_or_multicast():
    for step, builder in ((7, book_gemm.hgemm_v7), (8, book_gemm.hgemm_v8), (9, book_gemm.hgemm_v9)):
        r = part(step, builder)
        assert r.verdict == report.PASSED, (step, r.message)
        assert "setmaxnreg" not in r.message and "MULTICAST" not in r.message
    # step 8 arms the leader's barrier through remote_view(0): SASS SYNCS.ARRIVE.TRANS64.RED, read in the PTX
    assert "(expect_tx): found (2 mbarrier.arrive.expect_tx" in part(8, book_gemm.hgemm_v8).message


@pytest.mark.slow
def test_the_books_broken_steps_fail_with_the_right_message():
    # the leader's remote arrive without the byte count: beside it, the .RED arrive of ptxas's
    # own 2-CTA TMEM allocation, which must not count as the kernel's expect_tx
    r = part(8, functools.partial(book_gemm.hgemm_v8, variant="no_expect_tx"))
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "(expect_tx): MISSING (0 mbarrier.arrive.expect_tx" in r.message, r.message
    assert "SYNCS.ARRIVE.TRANS64.RED with a register is ptxas's own" in r.message
    assert r.message.count("MISSING") == 1, r.message

    # a ring of one stage: its loads complete on one barrier, and 4 barriers where two stages and
    # the accumulator hand-over need 6
    r = part(7, functools.partial(book_gemm.hgemm_v7, variant="one_stage"))
    assert r.verdict == report.FAILED, r.message
    assert "an accumulator hand-over (at least 6 mbarriers initialised" in r.message
    assert "MISSING (1 stage(s)" in r.message, r.message
    assert "4 mbarriers initialised in PTX, at least 2 stages needed, at least 6 mbarriers needed" in r.message
    assert r.message.count("MISSING") == 1, r.message


@pytest.mark.slow
def test_the_books_step9_at_256_does_no_work_and_is_called_degenerate():
    """Its cluster tile is 512 x 256: at M = 256 the tile loop never runs and the compiler drops
    every MMA and TMA. One verdict says so (the spec builds step 9 at 512 x 512)."""
    r = part(9, book_gemm.hgemm_v9, M=256, N=256)
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "degenerates at the build shape (M=256, N=256, K=128, num_sms=148): it emits no MMA and no TMA" in r.message
    assert "MISSING" not in r.message


@pytest.mark.slow
def test_tirx_kernels_gemm_passes_step9_and_breaks_where_it_is_broken():
    r = part(9, tirx_gemm.tirx_gemm)
    assert r.verdict == report.PASSED, r.message
    r = part(9, functools.partial(tirx_gemm.tirx_gemm, variant="no_cluster_sync"))
    assert r.verdict == report.FAILED, r.message
    assert "a barrier across the CTAs of a cluster (UCGABAR): MISSING (0 in SASS)" in r.message, r.message
    assert r.message.count("MISSING") == 1, r.message
    # at step 8's 256 x 256 it launches no CTA pair at all (M // 512 = 0)
    r = part(8, tirx_gemm.tirx_gemm)
    assert r.verdict == report.FAILED and "it launches no CTA" in r.message and "MISSING" not in r.message, r.message


@pytest.mark.slow
def test_the_launch_grid_is_read_from_the_launch_plan():
    """What grading sees: the launch plan read from the host code TIRx generates (grader/devcode.py),
    which holds the grid as computed (0 CTA pairs at M = 256), and the one TVM launches."""
    from grader import devcode
    grids = {}
    for m in (256, 512):
        f = tirx_gemm.tirx_gemm(m, 512, 128)
        host, device = devcode.lower(f, "sm_100a")
        (ln,) = devcode.plan(f, host, device)["launches"]
        grids[m] = (math.prod(ln["declared_grid"]), math.prod(ln["grid"]))
    assert grids == {256: (0, 1), 512: (4, 4)}


@pytest.mark.slow
def test_the_references_book_shaped_step8_passes(root, tmp_path):
    """pairs=1 is the book's cluster of one CTA pair, without multicast."""
    mod = import_notebook(os.path.join(root, *SOLUTION), tmp_path)
    r = part(8, functools.partial(mod.blackwell_step8, pairs=1))
    assert r.verdict == report.PASSED, r.message


@pytest.mark.slow
def test_the_reference_arming_its_leader_through_the_remote_view_passes(root, edit, tmp_path):
    """The book arms the leader's full barrier through remote_view(0) (SASS
    SYNCS.ARRIVE.TRANS64.RED, which a SASS-only check could not tell from ptxas's own arrive):
    the reference written that way passes steps 8 and 9 through the sandbox, expect_tx read in
    the PTX, and the grid read from the child's library."""
    nb = edit(os.path.join(root, *SOLUTION), {"full.arrive(ld.stage, LEADER_BYTES)": "full_leader.arrive(ld.stage, LEADER_BYTES)"})
    res = grade_in_process(LAB, nb, ["s8_build_sm100", "s9_build_sm100"], tmp_path / "grade")
    for part_id, r in res.items():
        assert r.verdict == report.PASSED, (part_id, r.message)
        assert "(expect_tx): found (2 mbarrier.arrive.expect_tx" in r.message, r.message
        assert r.measurements["sm_100a"]["ctas"] == 148, r.measurements

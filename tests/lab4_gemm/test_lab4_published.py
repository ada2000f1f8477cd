"""Lab 4's Blackwell build parts judged by published kernels that reach their speed on a B200:
the book's step 4 (tests/published_kernels/book_gemm.py) and mlc-ai/tirx-kernels' fp16 GEMM
(tests/published_kernels/tirx_gemm.py), each at the commit the book pins. Each passes the build
part it implements; a broken variant of each fails with the message that names what broke; a
kernel that does nothing at the build shape is called degenerate; a TIRx call that apache-tvm
0.26 cannot lower is named, with what to use instead."""
import functools

import pytest
from conftest import grade_with_builders
from published_kernels import book_gemm, tirx_gemm

from grader import build, report, spec
from grader import grading
from tvm.script import tirx as T

LAB = "lab4_gemm"
PART = "s4_build_sm100"
EXPECT_TX_MISSING = "mbarrier arrive with a transaction count (expect_tx): MISSING"


def step4(builder, **params):
    return grade_with_builders(LAB, PART, {"blackwell_step4": builder}, **params)


@pytest.mark.slow
def test_the_books_step4_passes_and_breaks_where_it_is_broken():
    r = step4(book_gemm.hgemm_v4)
    assert r.verdict == report.PASSED, r.message
    assert "mbarrier.arrive.expect_tx / mbarrier.expect_tx in PTX" in r.message and "2 x 128B" in r.message

    # an arrive without the byte count: the SASS still holds an arrive (A1T0), the PTX no expect_tx
    r = step4(functools.partial(book_gemm.hgemm_v4, variant="no_expect_tx"))
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert EXPECT_TX_MISSING + " (0 mbarrier.arrive.expect_tx" in r.message, r.message
    assert "without a byte count (SYNCS.ARRIVE.TRANS64...A1T0/ART0) do not count" in r.message

    # SWIZZLE_NONE tiles compile and would compute the right D, slowly: only the descriptors show it
    r = step4(functools.partial(book_gemm.hgemm_v4, variant="swizzle_none"))
    assert r.verdict == report.FAILED, r.message
    assert "swizzled shared memory (the swizzle mode of every shared-memory descriptor): MISSING" in r.message
    assert "2 x SWIZZLE_NONE" in r.message, r.message
    assert r.message.count("MISSING") == 1, r.message


@pytest.mark.slow
def test_tirx_kernels_gemm_passes_step4_and_its_broken_variant_fails():
    assert spec.load(LAB).part(PART).params["M"] % 512 == 0     # its CTA pairs compute 512 x 256
    r = step4(tirx_gemm.tirx_gemm)
    assert r.verdict == report.PASSED, r.message

    r = step4(functools.partial(tirx_gemm.tirx_gemm, variant="no_tma_store"))
    assert r.verdict == report.FAILED, r.message
    assert "TMA tensor stores (UTMASTG): MISSING (0 in SASS)" in r.message, r.message
    assert r.message.count("MISSING") == 1, r.message


@pytest.mark.slow
def test_a_kernel_that_launches_no_cta_at_the_build_shape_is_degenerate():
    """At 256 x 384 tirx-kernels' grid (M // 512 CTA pairs per column) is empty: every mechanism
    is in its code, and it would do nothing. One verdict says so, not a list of mechanisms."""
    r = step4(tirx_gemm.tirx_gemm, M=256, N=384)
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "degenerates at the build shape (M=256, N=384, K=256): it launches no CTA" in r.message, r.message
    assert "MISSING" not in r.message and "found" not in r.message


def _noop_barrier_kernel():
    @T.prim_func
    def kernel(D: T.Buffer((128,), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        acc = T.alloc_local((1,), "float32")
        acc[0] = T.float32(0)
        T.ptx.wgmma.noop_barrier(acc[0])
        D[warp_id * 32 + lane_id] = acc[0]

    return kernel


@pytest.mark.slow
def test_a_call_that_does_not_lower_in_tvm_026_is_named_with_its_alternative():
    r = grade_with_builders(LAB, "s1_build_sm90", {"hopper_step1": lambda M, N, K: _noop_barrier_kernel()})
    assert r.verdict == report.FAILED and "does not build" in r.message, r.message
    assert "This error comes from T.ptx.wgmma.noop_barrier(reg), which apache-tvm 0.26 cannot lower" in r.message
    assert "fence_accumulators" in r.message


def test_the_childs_message_alone_still_names_the_call():
    """In grading the child reports the error's text without its traceback."""
    e = build.BuildError("hopper_step1(128, 128, 64) for sm_90a: AttributeError: "
                         "'BufferLoad' object has no attribute 'dtype'")
    msg = grading.explain_build_error(e)
    assert msg.startswith(str(e)) and "the error apache-tvm 0.26 gives for T.ptx.wgmma.noop_barrier(reg)" in msg
    assert grading.explain_build_error(build.BuildError("ptxas failed")) == "ptxas failed"

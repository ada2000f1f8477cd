"""Lab 4: deliberately wrong submissions are caught (tests/<lab>/test_labN_every_part.py checks that the
solution passes and the student version scores zero). Parts are graded through the worker's own
code path in this process (conftest.grade_in_process); one test runs parts through the sandbox."""
import os

import pytest
from conftest import grade_in_process

from grader import inputs, report, run, spec
from grader import inspect

LAB = "lab4_gemm"
LAB_SPEC = spec.load(LAB)
SOLUTION = ("solutions", LAB, "lab4_gemm.ipynb")


def grade_here(notebook, parts, workdir, seed=inputs.PUBLIC_SEED):
    return grade_in_process(LAB, notebook, parts, workdir, seed)


@pytest.mark.slow
def test_parts_run_through_the_sandbox(root, device):
    """The end-to-end path (module file, static rules, a subprocess per part) for two parts."""
    res = run.check_lab(LAB, os.path.join(root, *SOLUTION), inputs.PUBLIC_SEED, device,
                        parts=["s1_sync", "s1_build_sm100"], progress=lambda m: None)
    assert [r.verdict for r in res] == [report.PASSED, report.PASSED], [r.message for r in res]
    # the grid, read from the host code of the library the sandboxed child exported
    build_result = next(r for r in res if r.part == "s1_build_sm100")
    assert build_result.measurements["sm_100a"]["ctas"] == 1, build_result.measurements


# ---------------------------------------------------------------- deliberately wrong submissions

WAIT_IN_LOOP = "T.ptx.wgmma.wait_group(0)"
WRONG_SWIZZLE = {"codes = {32: 1, 64: 2, 128: 3}": "codes = {32: 1, 64: 2, 128: 1}"}


@pytest.mark.slow
def test_wait_group_1_hazard_fails_the_sass_check(root, edit, tmp_path):
    """wait_group(1) and no wait_group(0): the epilogue reads accumulators of a group in flight."""
    nb = edit(os.path.join(root, *SOLUTION), {WAIT_IN_LOOP: "T.ptx.wgmma.wait_group(1)"})
    r = grade_here(nb, ["sass_hazard"], tmp_path / "grade")["sass_hazard"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "while a wgmma may still be writing them" in r.message and "first:" in r.message


@pytest.mark.slow
def test_wrong_descriptor_swizzle_code_is_caught(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), WRONG_SWIZZLE)
    r = grade_here(nb, ["a_desc"], tmp_path / "grade")["a_desc"]
    assert r.verdict == report.PARTIAL and 0 < r.points < 2
    # graded with hidden cases: the answer is not shown (grader/verdict.py), the expected one is
    assert "wgmma_desc_fields(swizzle_bytes=128): wrong answer, expected [1, 64, 3]" in r.message, r.message


@pytest.mark.slow
def test_step4_without_expect_tx_loses_the_build_part(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {
        "T.ptx.mbarrier.arrive.expect_tx(tma_bar.ptr_to([0]), (BLK_M + BLK_N) * BLK_K * 2)":
            "T.ptx.mbarrier.arrive(tma_bar.ptr_to([0]))"})
    r = grade_here(nb, ["s4_build_sm90"], tmp_path / "grade")["s4_build_sm90"]
    assert r.verdict == report.FAILED and "mbarrier arrive with a transaction count (expect_tx): MISSING" in r.message


def test_schedule_question_fails_a_schedule_without_the_sync(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), {"            if not published:": "            if not fenced:"})
    r = grade_here(nb, ["s1_sync"], tmp_path / "grade")["s1_sync"]
    assert r.verdict == report.PARTIAL, r.message


# ---------------------------------------------------------------- the SASS scan on listings

LISTING = """
        /*0100*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0110*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0 ;
{between}
        /*0120*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0130*/                   F2FP.F16.F32.PACK_AB R4, R25, R24 ;
        /*0140*/                   STG.E [R2.64], R4 ;
"""


def test_sass_scan_passes_reads_after_the_wait():
    ok, msg, meas = inspect.accumulator_hazards(LISTING.format(between=""))
    assert ok, msg
    assert meas["accumulator_registers"] == 64 and meas["final_waits"] == 1


@pytest.mark.parametrize("between", [
    "        /*0118*/                   F2FP.F16.F32.PACK_AB R6, R27, R26 ;",        # a read of R26/R27
    "        /*0118*/                   STG.E.64 [R2.64], R30.64 ;",                 # a store of R30/R31
    "        /*0118*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n"
    "        /*0119*/                   FADD R8, R40, 1 ;",                          # wait(1) is not enough
])
def test_sass_scan_flags_reads_before_the_wait(between):
    ok, msg, _ = inspect.accumulator_hazards(LISTING.format(between=between))
    assert not ok and "first:" in msg


def test_sass_scan_without_hgmma_or_final_wait_fails():
    assert not inspect.accumulator_hazards("        /*0000*/   FADD R1, R2, R3 ;")[0]
    no_wait = LISTING.format(between="").replace("WARPGROUP.DEPBAR.LE gsb0, 0x0", "WARPGROUP.DEPBAR.LE gsb0, 0x1")
    assert not inspect.accumulator_hazards(no_wait)[0]


# ---------------------------------------------------------------- on a GPU

def _needs_track(device, track):
    if not device.present or device.track != track:
        pytest.skip(f"needs a {track} GPU")


@pytest.mark.gpu
def test_wrong_swizzle_code_gives_wrong_results_on_hopper(root, edit, device):
    _needs_track(device, "sm_90a")
    nb = edit(os.path.join(root, *SOLUTION), WRONG_SWIZZLE)
    r = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["s1_correct"], progress=lambda m: None)[0]
    assert r.verdict == report.FAILED and "first at" in r.message, r.message


@pytest.mark.gpu
def test_wait_group_1_hazard_gives_wrong_results_on_hopper(root, edit, device):
    _needs_track(device, "sm_90a")
    nb = edit(os.path.join(root, *SOLUTION), {WAIT_IN_LOOP: "T.ptx.wgmma.wait_group(1)"})
    r = run.check_lab(LAB, nb, inputs.PUBLIC_SEED, device, parts=["s4_correct"], progress=lambda m: None)[0]
    assert r.verdict != report.PASSED and r.points < r.max_points, r.message

"""Mechanism checks read the code that is launched, as instructions.

A submission's kernel crosses from the jailed child as PTX and a launch plan. The attacks here
send PTX whose module holds more than the plan launches (an unlaunched entry carrying every
instruction a check looks for), or words in a comment; each must score nothing. And a ring is
judged by its stages, not by a count of barriers: the book's two-stage step 5 (a full barrier
per stage, one barrier for the MMA) passes, its single-buffered step 4 does not. A kernel that
launches no CTA at the build shape is told so, before any rule of its launch plan."""
import types

import pytest
from conftest import grade_with_builders
from published_kernels import book_gemm

from grader import build, remote, report

# A trivial launched entry, and an unlaunched one holding what the vector-load, vector-store and
# shared-memory checks look for (128-bit loads and stores, STS, LDS, an XOR of addresses).
DECOY_SOURCE = r"""
extern "C" __global__ void trivial(float* out) { out[threadIdx.x] = 1.0f; }
extern "C" __global__ void decoy(float4* out, const float4* in) {
  __shared__ float tile[512];
  tile[threadIdx.x ^ 5] = in[threadIdx.x].x;
  __syncthreads();
  out[threadIdx.x] = make_float4(tile[threadIdx.x], 0.f, 0.f, 0.f);
  out[threadIdx.x + 256] = in[threadIdx.x + 7];
}
"""
# A copy with 128-bit loads and stores and no shared memory at all.
COPY_SOURCE = r"""
extern "C" __global__ void copy(float4* out, const float4* in) { out[threadIdx.x] = in[threadIdx.x]; }
"""


def plan_launching(name: str) -> dict:
    return {"version": 1, "tensormaps": [],
            "signature": [{"kind": "tensor", "name": "out", "shape": [1024], "dtype": "float32"}],
            "launches": [{"name": name, "args": [{"tensor": 0}], "shared_bytes": 0, "grid": [1, 1, 1],
                          "declared_grid": [1, 1, 1], "block": [128, 1, 1], "cluster": [1, 1, 1]}]}


def serve(monkeypatch, source: str, launched: str, ptx_tail: str = ""):
    """build.compile_only answers every builder with ``source`` compiled by the course's NVRTC,
    ptxas and cuobjdump (here, without the tool jail), its PTX followed by ``ptx_tail``, and a
    plan that launches ``launched``: what the grader holds for a child that sent that PTX."""
    def compile_only(kernel, arch, want_sass=False, own_ptx=False):
        art = build.compile_source(source, arch, want_sass=True)
        art.ptx += ptx_tail
        art.plan = plan_launching(launched)
        return art
    monkeypatch.setattr(build, "compile_only", compile_only)


@pytest.mark.slow
def test_an_unlaunched_entry_carrying_the_instructions_scores_nothing(monkeypatch):
    serve(monkeypatch, DECOY_SOURCE, "trivial")
    r = grade_with_builders("lab1_roofline", "b_build", {"build_scale_add": lambda **kw: None})
    assert r.points == 0 and r.verdict == report.FAILED, r.message
    assert "128-bit vector loads from global memory: MISSING (0 in SASS)" in r.message, r.message
    assert "static (launched entries only; dead code not excluded)" in r.message
    # the same module launching the decoy: the instructions are there, and they count
    serve(monkeypatch, DECOY_SOURCE, "decoy")
    r = grade_with_builders("lab1_roofline", "b_build", {"build_scale_add": lambda **kw: None})
    assert r.verdict == report.PASSED, r.message


def _sass_section(name: str, body: list[str]) -> str:
    lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM90"']
    lines += [f"        /*{16 * i:04x}*/                   {ins} ;" for i, ins in enumerate(body)]
    return "\n".join(lines + ["\t\t.........."]) + "\n"


def test_the_accumulator_hazard_check_reads_the_launched_entry_only(monkeypatch):
    """A decoy entry with clean wgmma code next to a launched entry without any."""
    sass = "\tcode for sm_90a\n" + _sass_section("decoy", [
        "HGMMA.64x64x16.F32 R24, gdesc[UR8], RZ, !UPT, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "STG.E desc[UR4][R2.64], R24", "EXIT"]) + _sass_section("trivial", ["STG.E desc[UR4][R2.64], RZ", "EXIT"])
    ptx = ".visible .entry trivial(.param .u64 p)\n{\n\tret;\n}\n.visible .entry decoy(.param .u64 p)\n{\n\tret;\n}\n"
    art = types.SimpleNamespace(sass=sass, ptx=ptx, cuda_source="", plan=plan_launching("trivial"))
    monkeypatch.setattr(build, "compile_only", lambda *a, **kw: art)
    builders = {f"hopper_step{i}": (lambda *a: None) for i in range(1, 5)}
    r = grade_with_builders("lab4_gemm", "sass_hazard", builders)
    assert r.points == 0, r.message
    assert "no HGMMA (wgmma) instruction with an fp32 accumulator in the SASS" in r.message, r.message


TRANSPOSES = {"build_transpose_plain": lambda **kw: None, "build_transpose_swizzled": lambda **kw: None}


@pytest.mark.slow
def test_lab3_staging_is_judged_by_instructions_not_by_words(monkeypatch):
    # a copy kernel whose PTX ends in a comment naming what the staging check looks for
    serve(monkeypatch, COPY_SOURCE, "copy", ptx_tail="\n// st.shared ld.shared xor.b32\n")
    r = grade_with_builders("lab3_layout_swizzle", "d_build", TRANSPOSES)
    assert r.points == 0 and r.verdict == report.FAILED, r.message
    assert "the tile is not staged in shared memory (0 STS and 0 LDS" in r.message, r.message
    assert "no XOR in the swizzled kernel (no xor instruction in the PTX" in r.message
    # the instructions in an entry the plan does not launch do not count either
    serve(monkeypatch, DECOY_SOURCE, "trivial")
    r = grade_with_builders("lab3_layout_swizzle", "d_build", TRANSPOSES)
    assert r.points == 0, r.message
    # launched, they do
    serve(monkeypatch, DECOY_SOURCE, "decoy")
    r = grade_with_builders("lab3_layout_swizzle", "d_build", TRANSPOSES)
    assert r.verdict == report.PASSED, r.message
    assert "staged in shared memory (1 STS, 1 LDS) with an XOR swizzle" in r.message, r.message


@pytest.mark.slow
def test_the_books_two_stage_step5_is_a_ring_and_its_single_buffered_step4_is_not():
    r = grade_with_builders("lab5_gemm_pipeline", "s5_build_sm100", {"blackwell_step5": book_gemm.hgemm_v5})
    assert r.verdict == report.PASSED, r.message
    assert "found (2 stage(s) used at the build shape: TMA loads complete on 2 mbarrier(s) (pool_buf_ptr+8, pool_buf_ptr+16)" in r.message, r.message
    r = grade_with_builders("lab5_gemm_pipeline", "s5_build_sm100", {"blackwell_step5": book_gemm.hgemm_v4})
    assert r.verdict == report.FAILED, r.message
    assert "MISSING (1 stage(s)" in r.message and r.message.count("MISSING") == 1, r.message


class _Child:
    """The child's answer for a kernel whose tile count rounds down to zero at the build shape,
    launched in clusters of 2: the grid of 1 CTA the plan gives it is no multiple of 2."""

    def export(self, kernel, arch):
        plan = plan_launching("k")
        plan["launches"][0].update(grid=[1, 1, 1], declared_grid=[0, 1, 1], cluster=[2, 1, 1])
        return {"code": {"ptx": ".visible .entry k(.param .u64 p)\n{\n\tret;\n}\n", "plan": plan,
                         "cuda_source": ""}}


def test_a_kernel_launching_no_cta_is_told_so_before_the_cluster_rule():
    ref = remote.KernelRef(_Child(), 0, "blackwell_step4", (256, 384, 256))
    with pytest.raises(build.BuildError) as e:
        build.compile_only(ref, "sm_100a", want_sass=True)
    assert "launches no CTA" in str(e.value) and "divides the grid" not in str(e.value), e.value
    r = grade_with_builders("lab4_gemm", "s4_build_sm100", {"blackwell_step4": lambda **kw: ref})
    assert r.points == 0, r.message
    assert "degenerates at the build shape (M=512, N=768, K=256): it launches no CTA" in r.message, r.message
    assert "divides the grid" not in r.message and "does not build" not in r.message


@pytest.mark.slow
def test_build_parts_take_other_listings_with_their_provenance(monkeypatch):
    """What a GPU run would hand over: the listing of the instructions that executed, named."""
    import types as t

    from grader import dispatch, grading, hardware, inputs, spec
    from grader.context import Context
    serve(monkeypatch, DECOY_SOURCE, "decoy")
    lab = spec.load("lab1_roofline")
    ctx = Context(lab, lab.part("b_build"), inputs.PUBLIC_SEED, hardware.detect())
    module = t.SimpleNamespace(build_scale_add=lambda **kw: None)
    assert dispatch.grade("lab1_roofline", "b_build", module, ctx).fraction == 1      # read statically
    out = grading.build_part(module, ctx, texts=lambda name, arch, art: ({"sass": "", "ptx": ""}, "executed (none)"))
    assert out.fraction == 0 and "compiled; executed (none); 128-bit vector loads" in out.message, out.message
    assert out.measurements["sm_90a"]["evidence"] == "executed (none)"

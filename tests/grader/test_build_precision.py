"""Build parts judge a mechanism by what it does, not by its presence alone.

Each kernel here is small hand-written CUDA compiled by the course's NVRTC, ptxas and cuobjdump,
served to a build part with a launch plan as a child would send it (``serve``): a kernel that
announces half the bytes of its TMA box to the barrier, one that reads only one of its two inputs
with 128-bit loads, one that waits on ``__syncthreads()`` inside its consumer branch while its
producer waits for the consumers, and kernels whose ``setmaxnreg`` ptxas ignores. Each passed the
build parts before; each now fails with the message that says what is wrong, and the correct
variant of each passes."""
import os

import pytest
from conftest import grade_with_builders, import_notebook

from grader import build, inspect, ptxflow, report

# ---------------------------------------------------------------- serving a kernel to a build part


def serve(monkeypatch, source: str, plan: dict):
    """build.compile_only answers every builder with ``source`` compiled for the arch asked
    (without the tool jail) and ``plan`` as its launch plan: what the grader holds for a child
    that sent that code."""
    def compile_only(kernel, arch, want_sass=False, own_ptx=False):
        art = build.compile_source(source, arch, want_sass=True)
        art.plan = plan
        return art
    monkeypatch.setattr(build, "compile_only", compile_only)


def launch(name: str, args: list, block: int, grid: int = 16) -> dict:
    return {"name": name, "args": args, "shared_bytes": 0, "grid": [grid, 1, 1], "declared_grid": [grid, 1, 1],
            "block": [block, 1, 1], "cluster": [1, 1, 1]}


def texts_of(source: str, plan: dict, arch: str = "sm_90a") -> dict:
    art = build.compile_source(source, arch, want_sass=True)
    art.plan = plan
    return inspect.launched_texts(art)


# ---------------------------------------------------------------- 1. expect_tx bytes against the boxes

# One 64 x 64 x 2 fp16 box (16384 bytes) loaded by TMA onto a barrier armed with BYTES, stored back.
TMA_TILE = r"""
struct __align__(64) TensorMap { unsigned long long raw[16]; };
extern "C" __global__ void __launch_bounds__(128) tma_tile(const __grid_constant__ TensorMap src,
                                                          const __grid_constant__ TensorMap dst, int nbytes) {
  __shared__ __align__(1024) unsigned char tile[16384];
  __shared__ __align__(8) unsigned long long bar;
  unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
  unsigned t = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(BYTES) : "memory");
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(t), "l"(&src), "r"(0), "r"(blockIdx.x * 64), "r"(0), "r"(b) : "memory");
  }
  asm volatile("{\n.reg .pred P;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 P, [%0], 0;\n@!P bra WAIT;\n}"
               :: "r"(b) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];"
                 :: "l"(&dst), "r"(0), "r"(blockIdx.x * 64), "r"(0), "r"(t) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}
"""
TMAP = {"dtype": "float16", "rank": 3, "tensor": 0, "offset": 0, "sizes": [64, 1024, 16], "strides": [2048, 128],
        "box": [64, 64, 2], "element_strides": [1, 1, 1], "interleave": 0, "swizzle": 3, "l2_promotion": 2,
        "oob_fill": 0}
TMA_PLAN = {"version": 1,
            "signature": [{"name": "X", "kind": "tensor", "shape": [1024, 1024], "dtype": "float16"},
                          {"name": "OUT", "kind": "tensor", "shape": [1024, 1024], "dtype": "float16"},
                          {"name": "nbytes", "kind": "scalar", "dtype": "int32"}],
            "tensormaps": [dict(TMAP), dict(TMAP, tensor=1)],
            "launches": [launch("tma_tile", [{"tensormap": 0}, {"tensormap": 1}, {"scalar": 2, "dtype": "int32"}],
                                128)]}
TILE = {"build_tma_tile": lambda **kw: None}


@pytest.mark.slow
def test_an_expect_tx_of_half_the_box_fails_the_build_part(monkeypatch):
    serve(monkeypatch, TMA_TILE.replace("BYTES", "8192"), TMA_PLAN)
    r = grade_with_builders("lab2_tma", "d_build", TILE)
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert r.message.count("WRONG BYTE COUNT") == 2, r.message           # on sm_90a and sm_100a
    assert ("expect_tx announces 8192 bytes on _ZZ8tma_tileE3bar, but the TMA loads completing on it bring 16384 "
            "(a TMA load of box 64x64x2 float16 (16384 bytes)): too few") in r.message, r.message
    assert r.message.count("MISSING") == 0, r.message

    serve(monkeypatch, TMA_TILE.replace("BYTES", "32768"), TMA_PLAN)
    r = grade_with_builders("lab2_tma", "d_build", TILE)
    assert r.verdict == report.FAILED and "32768 bytes" in r.message and "too many" in r.message, r.message

    serve(monkeypatch, TMA_TILE.replace("BYTES", "16384"), TMA_PLAN)
    r = grade_with_builders("lab2_tma", "d_build", TILE)
    assert r.verdict == report.PASSED, r.message
    assert "byte counts match the TMA boxes: _ZZ8tma_tileE3bar: 16384 bytes = a TMA load of box 64x64x2" in r.message


@pytest.mark.slow
def test_a_byte_count_computed_at_run_time_is_said_to_be_unchecked(monkeypatch):
    serve(monkeypatch, TMA_TILE.replace("BYTES", "nbytes"), TMA_PLAN)
    r = grade_with_builders("lab2_tma", "d_build", TILE)
    assert r.verdict == report.PASSED, r.message
    assert "is in a register computed at run time: byte count not checked statically" in r.message, r.message


MULTICAST_PTX = """
.visible .entry k(.param .align 64 .b8 k_param_0[128])
{{
\tmov.b64 %rd1, k_param_0;
\tmov.u32 %r1, bar;
\tmov.u16 %rs1, 3;
\tmbarrier.arrive.expect_tx.shared::cta.b64 _, [%r1], {count};
\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r2], [%rd1, {{%r3, %r4}}], [%r1], %rs1;
\tret;
}}
"""


@pytest.mark.parametrize("count, ok", [(16384, True), (8192, True), (24576, False), (4096, False)])
def test_multicast_loads_bound_the_count_by_the_ctas_of_their_mask(count, ok):
    """A box of 8192 bytes multicast to the two CTAs of its mask (0b11) brings this CTA's barrier
    8192 bytes from each CTA that issues it: one or two boxes, never three, never half of one."""
    plan = {"signature": [{"name": "A", "kind": "tensor", "shape": [64, 64], "dtype": "float16"}],
            "tensormaps": [dict(TMAP, rank=2, box=[64, 64], element_strides=[1, 1])],
            "launches": [dict(launch("k", [{"tensormap": 0}], 128), cluster=[2, 1, 1])]}
    rep = ptxflow.tx_byte_counts({"ptx": MULTICAST_PTX.format(count=count), "plan": plan})
    assert (not rep.wrong) == ok, rep
    assert bool(rep.checked) == ok, rep


def grade_edited(root, edit, tmp_path, device, lab_name, replace, part_ids, arch):
    """The reference solution of ``lab_name`` with ``replace`` applied, its build parts
    ``part_ids`` graded in this process for one arch: {part: PartResult}."""
    import dataclasses

    from grader import inputs, spec, verdict
    from grader.context import Context
    lab = spec.load(lab_name)
    nb = edit(os.path.join(root, "solutions", lab_name, lab.notebook), replace)
    module = import_notebook(nb, tmp_path / "module", f"{lab_name}_edited_{len(part_ids)}_{arch}")
    out = {}
    for part_id in part_ids:
        part = dataclasses.replace(lab.part(part_id), params={**lab.part(part_id).params, "archs": [arch]})
        out[part_id] = verdict.grade_part(module, Context(lab, part, inputs.PUBLIC_SEED, device))
    return out


@pytest.mark.slow
def test_the_lab2_kernels_announcing_half_a_tile_fail_their_build_parts(root, edit, tmp_path, device):
    res = grade_edited(root, edit, tmp_path, device, "lab2_tma", {
        "T.ptx.mbarrier.arrive.expect_tx(bar.ptr_to([0]), TILE_BYTES)":
        "T.ptx.mbarrier.arrive.expect_tx(bar.ptr_to([0]), TILE_BYTES // 2)",
        "T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([s]), TILE_BYTES)":
        "T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([s]), TILE_BYTES // 2)"}, ["d_build", "e_build"], "sm_90a")
    for part_id, r in res.items():
        assert r.verdict == report.FAILED and r.points == 0, (part_id, r.message)
        assert "WRONG BYTE COUNT" in r.message, (part_id, r.message)
        assert "too few, the barrier's phase completes before the data has landed" in r.message
    assert ("expect_tx announces 8192 bytes on pool_buf_ptr, but the TMA loads completing on it bring 16384 (a TMA "
            "load of box 64x64x2 float16 (16384 bytes))") in res["d_build"].message, res["d_build"].message
    assert ("4 expect_tx on pool_buf_ptr, pool_buf_ptr+8, pool_buf_ptr+16 ... announce 32768 bytes in all, but the "
            "TMA loads completing on them in the same loop bring 65536") in res["e_build"].message


@pytest.mark.slow
def test_several_arms_of_one_ring_are_said_to_be_summed(root, edit, tmp_path, device):
    """Lab 2's ring arms its stages in several places of the code (the prologue unrolled, the loop):
    a passing check says that its byte count is their sum, not what one expect_tx announces."""
    r = grade_edited(root, edit, tmp_path, device, "lab2_tma", {}, ["e_build"], "sm_90a")["e_build"]
    assert r.verdict == report.PASSED, r.message
    assert "5 expect_tx in the code (unrolled or in several places) announce 81920 bytes in all = 5 x a TMA load" \
        in r.message, \
        r.message


# ---------------------------------------------------------------- 2. 128-bit accesses per tensor

# out = alpha * x + y over fp16, 8 halves per thread: x read as one 128-bit load, y as one too
# (Y_WIDE) or as 8 loads of 16 bits.
SCALE_ADD = r"""
#include <cuda_fp16.h>
extern "C" __global__ void __launch_bounds__(256) scale_add(half* __restrict__ out, const half* __restrict__ x,
                                                           const half* __restrict__ y, float alpha) {
  int i = (blockIdx.x * 256 + threadIdx.x) * 8;
  uint4 xv = *reinterpret_cast<const uint4*>(x + i);
  const half* xh = reinterpret_cast<const half*>(&xv);
  __align__(16) half r[8];
#if Y_WIDE
  uint4 yv = *reinterpret_cast<const uint4*>(y + i);
  const half* yh = reinterpret_cast<const half*>(&yv);
#else
  const half* yh = y + i;
#endif
#pragma unroll
  for (int k = 0; k < 8; ++k) r[k] = __float2half(alpha * __half2float(xh[k]) + __half2float(yh[k]));
  *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(r);
}
"""


def scale_add_plan(block: int = 256) -> dict:
    n = 1 << 20
    return {"version": 1,
            "signature": [{"name": "X", "kind": "tensor", "shape": [n], "dtype": "float16"},
                          {"name": "Y", "kind": "tensor", "shape": [n], "dtype": "float16"},
                          {"name": "OUT", "kind": "tensor", "shape": [n], "dtype": "float16"},
                          {"name": "alpha", "kind": "scalar", "dtype": "float32"}],
            "tensormaps": [],
            "launches": [launch("scale_add", [{"tensor": 2}, {"tensor": 0}, {"tensor": 1},
                                              {"scalar": 3, "dtype": "float32"}], block, grid=512)]}


SCALE = {"build_scale_add": lambda **kw: None}


@pytest.mark.slow
def test_every_input_must_be_read_with_128_bit_loads(monkeypatch):
    serve(monkeypatch, SCALE_ADD.replace("Y_WIDE", "0"), scale_add_plan())
    r = grade_with_builders("lab1_roofline", "b_build", SCALE)
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "X: 128-bit loads found (1 of 1); Y: only 16-bit loads (8)" in r.message, r.message
    assert "every tensor the kernel reads must be read with 128-bit loads" in r.message
    assert "OUT: 128-bit stores found (1 of 1)" in r.message
    assert r.message.count("MISSING") == 2, r.message                   # the loads, on each arch

    serve(monkeypatch, SCALE_ADD.replace("Y_WIDE", "1"), scale_add_plan())
    r = grade_with_builders("lab1_roofline", "b_build", SCALE)
    assert r.verdict == report.PASSED, r.message
    assert "X: 128-bit loads found (1 of 1); Y: 128-bit loads found (1 of 1)" in r.message, r.message


def test_accesses_belong_to_the_parameter_their_address_comes_from():
    acc = ptxflow.tensor_accesses(texts_of(SCALE_ADD.replace("Y_WIDE", "0"), scale_add_plan()))
    assert {k: a.bits for k, a in acc["load"].items()} == {"X": {128: 1}, "Y": {16: 8}}
    assert {k: a.bits for k, a in acc["store"].items()} == {"OUT": {128: 1}}


# ---------------------------------------------------------------- 3. a CTA-wide barrier in a branch

# A producer thread (128) hands a scale to 128 consumer threads through full/empty mbarriers;
# threads 129..159 do nothing. CONSUMER_SYNC runs in the consumers' loop.
SCALE_ADD_WS = r"""
#include <cuda_fp16.h>
__device__ __forceinline__ void wait(unsigned bar, unsigned phase) {
  asm volatile("{\n.reg .pred P;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n@!P bra WAIT;\n}"
               :: "r"(bar), "r"(phase) : "memory");
}
__device__ __forceinline__ void arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
extern "C" __global__ void __launch_bounds__(160) scale_add(half* __restrict__ out, const half* __restrict__ x,
                                                           const half* __restrict__ y, float alpha) {
  __shared__ __align__(8) unsigned long long full, empty;
  __shared__ float scale[4];
  unsigned f = (unsigned)__cvta_generic_to_shared(&full), e = (unsigned)__cvta_generic_to_shared(&empty);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(f));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" :: "r"(e));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (threadIdx.x == 128) {
    for (int k = 0; k < 4; ++k) {
      if (k > 0) wait(e, (k - 1) & 1);
      scale[k] = alpha;
      arrive(f);
    }
  } else if (threadIdx.x < 128) {
    for (int k = 0; k < 4; ++k) {
      wait(f, k & 1);
      int i = ((blockIdx.x * 4 + k) * 128 + threadIdx.x) * 8;
      uint4 xv = *reinterpret_cast<const uint4*>(x + i), yv = *reinterpret_cast<const uint4*>(y + i);
      const half* xh = reinterpret_cast<const half*>(&xv);
      const half* yh = reinterpret_cast<const half*>(&yv);
      __align__(16) half r[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = __float2half(scale[k] * __half2float(xh[j]) + __half2float(yh[j]));
      *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(r);
      CONSUMER_SYNC;
      arrive(e);
    }
  }
}
"""
NAMED_SYNC = 'asm volatile("bar.sync 1, 128;" ::: "memory")'


@pytest.mark.slow
def test_syncthreads_in_the_consumer_branch_fails_as_a_hang(monkeypatch):
    serve(monkeypatch, SCALE_ADD_WS.replace("CONSUMER_SYNC", "__syncthreads()"), scale_add_plan(160))
    r = grade_with_builders("lab1_roofline", "b_build", SCALE)
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert r.message.count("WILL HANG ON A GPU (`bar.sync 0;` in scale_add") == 2, r.message
    assert "only the threads of a branch on the thread index" in r.message
    assert "while the others wait at `mbarrier.try_wait.parity" in r.message
    assert "T.cuda.warpgroup_sync(id)" in r.message and "T.ptx.bar.sync(id, threads)" in r.message
    assert "MISSING" not in r.message, r.message                        # 128-bit loads and stores are there

    serve(monkeypatch, SCALE_ADD_WS.replace("CONSUMER_SYNC", NAMED_SYNC), scale_add_plan(160))
    r = grade_with_builders("lab1_roofline", "b_build", SCALE)
    assert r.verdict == report.PASSED, r.message
    assert "ok (1 bar.sync without a thread count;" in r.message


@pytest.mark.slow
def test_lab5_consumers_synchronised_with_cta_sync_fail_as_a_hang(root, edit, tmp_path, device):
    """Hopper's step 7 with its consumer warpgroup's named barrier made CTA-wide: the consumers
    wait at bar.sync 0 for the producer, which waits for a slot they free after it."""
    r = grade_edited(root, edit, tmp_path, device, "lab5_gemm_pipeline", {
        "T.cuda.warpgroup_sync(CONSUMER_BAR)": "T.cuda.cta_sync()",
        "T.cuda.warpgroup_sync(CONSUMER_BAR + c)": "T.cuda.cta_sync()"}, ["s7_build_sm90"], "sm_90a")["s7_build_sm90"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "WILL HANG ON A GPU (`bar.sync 0;` in kernel_kernel" in r.message, r.message
    assert "MISSING" not in r.message, r.message


# Threads past the work leave before a __syncthreads() that the others reach: nothing waits for
# them (a barrier waiting only for exited threads is released), so nothing hangs.
EARLY_EXIT = r"""
extern "C" __global__ void __launch_bounds__(256) scale_add(float4* out, const float4* x, const float4* y, float a) {
  __shared__ float4 t[128];
  if (threadIdx.x >= 128) return;
  int i = blockIdx.x * 128 + threadIdx.x;
  float4 v = x[i], w = y[i];
  t[threadIdx.x] = make_float4(a * v.x + w.x, a * v.y + w.y, a * v.z + w.z, a * v.w + w.w);
  __syncthreads();
  out[i] = t[127 - threadIdx.x];
}
"""


def test_a_barrier_after_an_early_exit_is_not_a_hang():
    plan = scale_add_plan()
    for arch in ("sm_90a", "sm_100a"):
        r = inspect.check("cta_barrier_uniform", texts_of(EARLY_EXIT, plan, arch))
        assert r.ok and "ok (1 bar.sync without a thread count;" in r.message, r.message
        found, total, read = ptxflow.divergent_cta_barriers(texts_of(EARLY_EXIT, plan, arch))
        assert (found, total, read) == ([], 1, True)


def test_the_hang_is_found_on_both_archs():
    plan = scale_add_plan(160)
    for arch in ("sm_90a", "sm_100a"):
        bad = inspect.check("cta_barrier_uniform",
                            texts_of(SCALE_ADD_WS.replace("CONSUMER_SYNC", "__syncthreads()"), plan, arch))
        assert not bad.ok and "WILL HANG ON A GPU" in bad.message, bad.message
        good = inspect.check("cta_barrier_uniform", texts_of(SCALE_ADD_WS.replace("CONSUMER_SYNC", NAMED_SYNC),
                                                             plan, arch))
        assert good.ok, good.message


# ---------------------------------------------------------------- 4. an ignored setmaxnreg

REGISTERS = r"""
extern "C" __global__ void BOUNDS NAME(float* out) {
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    out[threadIdx.x] = 1.0f;
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    out[threadIdx.x] = 2.0f;
  }
}
"""
ONE_CTA_PER_SM = "__launch_bounds__(256, 1)"        # what T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1}) emits
THREADS_ONLY = "__launch_bounds__(256)"             # ptxas cannot know the register count at entry


def registers(bounds: str, name: str = "roles") -> str:
    return REGISTERS.replace("BOUNDS", bounds).replace("NAME", name)


def registers_plan(*names) -> dict:
    return {"version": 1, "signature": [{"name": "OUT", "kind": "tensor", "shape": [256], "dtype": "float32"}],
            "tensormaps": [], "launches": [launch(n, [{"tensor": 0}], 256, grid=1) for n in names]}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_an_ignored_setmaxnreg_fails_with_its_cause_and_the_fix(arch):
    for name in ("setmaxnreg_inc", "setmaxnreg_dec", "setmaxnreg"):
        r = inspect.check(name, texts_of(registers(THREADS_ONLY), registers_plan("roles"), arch))
        assert not r.ok, r.message
        assert "IGNORED by ptxas in roles (\"(C7508) Potential Performance Loss: 'setmaxnreg' ignored" in r.message
        assert "__launch_bounds__(threads, 1)" in r.message, r.message
        assert 'T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})' in r.message
        assert inspect.check(name, texts_of(registers(ONE_CTA_PER_SM), registers_plan("roles"), arch)).ok


def test_a_launched_kernel_whose_setmaxnreg_is_ignored_fails_beside_one_where_it_is_not():
    """Two launched kernels: the SASS holds USETMAXREG (from the first), but ptxas dropped the
    setmaxnreg of the second."""
    src = registers(ONE_CTA_PER_SM, "roles") + registers(THREADS_ONLY, "other")
    texts = texts_of(src, registers_plan("roles", "other"))
    assert "USETMAXREG.TRY_ALLOC" in texts["sass"]
    r = inspect.check("setmaxnreg_inc", texts)
    assert not r.ok and "IGNORED by ptxas in other (" in r.message, r.message
    # the same module with only the first kernel launched: the warning is about code never run
    assert inspect.check("setmaxnreg_inc", texts_of(src, registers_plan("roles"))).ok


@pytest.mark.slow
def test_lab5_step7_without_one_cta_per_sm_has_its_setmaxnreg_ignored(root, edit, tmp_path, device):
    r = grade_edited(root, edit, tmp_path, device, "lab5_gemm_pipeline", {
        'T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})': "pass"}, ["s7_build_sm90"], "sm_90a")["s7_build_sm90"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "(setmaxnreg.inc: USETMAXREG.TRY_ALLOC): IGNORED by ptxas in kernel_kernel" in r.message, r.message
    assert 'put T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1}) at the top of the kernel body' in r.message


@pytest.mark.slow
def test_a_lab4_kernel_whose_b_descriptor_has_the_wrong_lbo_fails_its_build_part_on_a_cpu(root, edit, tmp_path, device):
    """B's MN-major LBO spans the tile's K rows: with half of them the kernel reads the wrong
    elements on a GPU, with no error. The build part sees the fields in the CUDA source."""
    res = grade_edited(root, edit, tmp_path, device, "lab4_gemm", {
        "LBO_B, SBO_B, _ = wgmma_desc_fields_mn(128, BLK_K)": "LBO_B, SBO_B, _ = wgmma_desc_fields_mn(128, BLK_K // 2)"},
        ["s1_build_sm90"], "sm_90a")
    r = res["s1_build_sm90"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "no descriptor has the fields of B (N-major). Encoded: (1, 64, 3) x 8, (256, 64, 3) x 8" in r.message, \
        r.message


@pytest.mark.slow
def test_a_lab4_epilogue_that_transposes_the_fragment_fails_its_build_parts_on_a_cpu(root, edit, tmp_path, device):
    """An epilogue that stores register (row, col) at (col, row) compiles, runs and writes a wrong D
    without any error; the build parts follow its index arithmetic thread by thread."""
    res = grade_edited(root, edit, tmp_path, device, "lab4_gemm", {
        "D.vstore([WGMMA_M * h + row, col], pair": "D.vstore([col, WGMMA_M * h + row], pair",
        "D.vstore([m_st + WGMMA_M * h + row, n_st + col], pair": "D.vstore([m_st + col, n_st + WGMMA_M * h + row], pair"},
        ["s1_build_sm90", "s2_build_sm90", "s3_build_sm90"], "sm_90a")
    for part_id, r in res.items():
        assert r.verdict == report.FAILED and r.points == 0, (part_id, r.message)
        assert "threads store registers where the wgmma accumulator does not hold them" in r.message, r.message
    good = grade_edited(root, edit, tmp_path / "good", device, "lab4_gemm", {"ACC = ": "ACC = "}, ["s3_build_sm90"],
                        "sm_90a")["s3_build_sm90"]
    assert good.verdict == report.PASSED and "each of 128 threads stores its 128 registers" in good.message


@pytest.mark.slow
def test_a_lab4_step3_that_swaps_its_grid_offsets_fails_its_build_part_on_a_cpu(root, edit, tmp_path, device):
    """CTA 0's threads store the same places whichever block index selects rows: the check follows
    a CTA away from the origin too (a student trial noted that only CTA 0 was followed)."""
    res = grade_edited(root, edit, tmp_path, device, "lab4_gemm", {
        "D.vstore([m_st + WGMMA_M * h + row, n_st + col], pair": "D.vstore([n_st + WGMMA_M * h + row, m_st + col], pair"},
        ["s3_build_sm90"], "sm_90a")
    r = res["s3_build_sm90"]
    assert r.verdict == report.FAILED and "CTA (1, 2): 128 of 128 threads store registers" in r.message, r.message


LAB4_STEP3_BOUND = "                if m_st + WGMMA_M * h + row < M and n_st + col < N:   # col is even and N too\n"


@pytest.mark.slow
def test_a_lab4_step3_epilogue_without_its_edge_bound_fails_its_build_part_on_a_cpu(root, edit, tmp_path, device):
    """Step 3 takes ragged shapes, and its build shape (200 x 328) makes CTA (1, 2) an edge tile: an
    epilogue that stores the whole tile writes past D's last row, which the check names."""
    res = grade_edited(root, edit, tmp_path, device, "lab4_gemm", {LAB4_STEP3_BOUND: "                if True:\n"},
                       ["s3_build_sm90"], "sm_90a")
    r = res["s3_build_sm90"]
    assert r.verdict == report.FAILED, r.message
    assert "CTA (1, 2): 128 of 128 threads store registers outside D (200 rows of 328)" in r.message, r.message
    assert "past its last row: an edge tile's store needs a bound" in r.message, r.message
    # bounding the rows only: the columns past N land in the next row's first elements, and those of
    # the last row past D's end
    rows_only = grade_edited(root, edit, tmp_path / "rows", device, "lab4_gemm", {
        LAB4_STEP3_BOUND: "                if m_st + WGMMA_M * h + row < M:\n"}, ["s3_build_sm90"], "sm_90a")
    r = rows_only["s3_build_sm90"]
    assert r.verdict == report.FAILED and "CTA (1, 2): 4 of 128 threads store registers outside D" in r.message, \
        r.message


@pytest.mark.slow
def test_a_lab4_step4_epilogue_that_misplaces_registers_in_dsmem_fails_its_build_part_on_a_cpu(root, edit, tmp_path,
                                                                                              device):
    """Step 4 writes the tile into the swizzled Dsmem that the TMA store reads: the check follows the
    stores into that tile (the swizzle's XOR included) and compares with the layout's places."""
    good = grade_edited(root, edit, tmp_path / "good", device, "lab4_gemm", {"ACC = ": "ACC = "}, ["s4_build_sm90"],
                        "sm_90a")["s4_build_sm90"]
    assert good.verdict == report.PASSED and "each of 128 threads stores its 128 registers" in good.message, \
        good.message
    for name, new in (("transposed", "Dsmem.vstore([col, WGMMA_M * h + row], pair"),
                      ("one half over the other", "Dsmem.vstore([row, col], pair")):
        res = grade_edited(root, edit, tmp_path / name.replace(" ", "_"), device, "lab4_gemm",
                           {"Dsmem.vstore([WGMMA_M * h + row, col], pair": new}, ["s4_build_sm90"], "sm_90a")
        r = res["s4_build_sm90"]
        assert r.verdict == report.FAILED and r.points == 0, (name, r.message)
        assert "threads store registers where the wgmma accumulator does not hold them" in r.message, (name, r.message)
        assert "the TMA store's shared-memory tile" not in r.message or "-> element " in r.message, r.message


@pytest.mark.slow
def test_lab5_epilogues_are_followed_through_their_tma_stores_on_a_cpu(root, edit, tmp_path, device):
    """Lab 5's Hopper steps 5-7 write D through Dsmem and TMA stores of 64-column boxes: the build
    parts follow each register through the tile, the barrier and the stores. Steps 5 and 7 without
    the barrier between the epilogue's writes and the store, and every step with half the columns
    written, fail on a CPU."""
    parts = ["s5_build_sm90", "s6_build_sm90", "s7_build_sm90"]
    good = grade_edited(root, edit, tmp_path / "good", device, "lab5_gemm_pipeline", {"ACC = ": "ACC = "}, parts,
                        "sm_90a")
    for part_id, r in good.items():
        assert r.verdict == report.PASSED and "cover the 128 x 128 tile once" in r.message, (part_id, r.message)
    racing = grade_edited(root, edit, tmp_path / "racing", device, "lab5_gemm_pipeline", {
        'T.ptx.fence.proxy_async("shared::cta")\n                T.cuda.warpgroup_sync(CONSUMER_BAR)':
        'T.ptx.fence.proxy_async("shared::cta")',
        'T.ptx.fence.proxy_async("shared::cta")\n        T.cuda.cta_sync()\n        tr.end("epilogue")':
        'T.ptx.fence.proxy_async("shared::cta")\n        tr.end("epilogue")'},
        ["s5_build_sm90", "s7_build_sm90"], "sm_90a")
    for part_id, r in racing.items():
        assert r.verdict == report.FAILED and "written while a TMA store may still be reading the tile" in \
            r.message, (part_id, r.message)
    half = grade_edited(root, edit, tmp_path / "half", device, "lab5_gemm_pipeline", {
        "acc_to_smem(acc, Dsmem, tid, HALVES, ACC, 0, BLK_N, pair)":
        "acc_to_smem(acc, Dsmem, tid, HALVES, ACC // 2, 0, BLK_N // 2, pair)"}, parts, "sm_90a")
    for part_id, r in half.items():
        assert r.verdict == report.FAILED and "store registers out of the shape of the wgmma fragment" in r.message, \
            (part_id, r.message)


@pytest.mark.slow
def test_lab5_consumers_epilogues_keep_the_fragment_and_cover_the_tile_on_a_cpu(root, edit, tmp_path, device):
    """Steps 8 and 9 leave the consumers' share of the tile to the student: the build parts check
    that each wgmma's registers keep the fragment's shape through Dsmem and the TMA stores, and
    that the two consumers cover the tile once. Both consumers storing at the same rows, a chunk
    that stores the first registers twice, and a chunk written while the previous store may
    still read Dsmem, all fail on a CPU."""
    parts = ["s8_build_sm90", "s9_build_sm90"]
    good = grade_edited(root, edit, tmp_path / "good", device, "lab5_gemm_pipeline", {"ACC = ": "ACC = "}, parts,
                        "sm_90a")
    for part_id, r in good.items():
        assert r.verdict == report.PASSED and "cover the 128 x 256 tile once" in r.message, (part_id, r.message)
    cases = {"same rows": ({"m0 = T.meta_var(tm * TM + WGMMA_M * c)": "m0 = T.meta_var(tm * TM)"},
                           "do not cover the 128 x 256 tile once"),
             "first chunk twice": ({"acc_to_smem(acc, Dsmem, tid, 1, ACC, h * (WS_EPI_N // 2), WS_EPI_N, pair, (c,))":
                                    "acc_to_smem(acc, Dsmem, tid, 1, ACC, 0, WS_EPI_N, pair, (c,))"},
                                   "store registers out of the shape of the wgmma fragment"),
             "no wait": ({"T.ptx.cp_async.bulk.wait_group(0)    # the previous store has read Dsmem[c]": "pass"},
                         "written while a TMA store may still be reading the tile")}
    for name, (replace, said) in cases.items():
        ids = parts if name != "no wait" else ["s8_build_sm90"]
        for part_id, r in grade_edited(root, edit, tmp_path / name.replace(" ", "_"), device, "lab5_gemm_pipeline",
                                       replace, ids, "sm_90a").items():
            assert r.verdict == report.FAILED and said in r.message, (name, part_id, r.message)


@pytest.mark.slow
def test_lab6_o_epilogues_keep_the_fragment_and_cover_the_block_on_a_cpu(root, edit, tmp_path, device):
    """Lab 6's Hopper steps 2-4 store O from the P V accumulator (step 2 straight from registers,
    steps 3 and 4 through shared memory and TMA stores): rows r and r + 8 of the fragment swapped,
    or both consumers storing at the same rows, fail on a CPU; the reference passes."""
    lab, parts = "lab6_flash_attention", ["s2_build_sm90", "s3_build_sm90", "s4_build_sm90"]
    for part_id, r in grade_edited(root, edit, tmp_path / "good", device, lab, {"group = ": "group = "}, parts,
                                   "sm_90a").items():
        assert r.verdict == report.PASSED and "x 128 tile once" in r.message, (part_id, r.message)
    swapped = grade_edited(root, edit, tmp_path / "swapped", device, lab, {
        "store_rows_direct(O_acc, O, LSE, lse_val, tid, b, hq, pos0, pos1,":
        "store_rows_direct(O_acc, O, LSE, lse_val, tid, b, hq, pos1, pos0,"}, ["s2_build_sm90"], "sm_90a")
    r = swapped["s2_build_sm90"]
    assert r.verdict == report.FAILED and "store registers out of the shape of the wgmma fragment" in r.message, \
        r.message
    same = grade_edited(root, edit, tmp_path / "same", device, lab, {
        "store_o_tma(O_acc, O, LSE, lse_val, Qsmem, tid, c, b, hq, m0 + WG_M * c, pos0, pos1, seq_q, pair, tr)":
        "store_o_tma(O_acc, O, LSE, lse_val, Qsmem, tid, c, b, hq, m0, pos0, pos1, seq_q, pair, tr)"},
        ["s3_build_sm90", "s4_build_sm90"], "sm_90a")
    for part_id, r in same.items():
        assert r.verdict == report.FAILED and "do not cover the 128 x 128 tile once" in r.message, (part_id, r.message)


@pytest.mark.slow
def test_lab5_epilogues_of_other_correct_designs_pass_on_a_cpu(root, edit, tmp_path, device):
    """The check must not fail a correct design other than the reference's: a D tile of 32-column
    boxes with the 64-byte swizzle (TMA descriptors of another box and swizzle mode), and step 5's
    grid in column-major order (CTA (0, 1) then holds another tile than the reference's)."""
    designs = {
        "sw64": {"EPI_BOX = 64 ": "EPI_BOX = 32 ",
                 "D_layout = mma_shared_layout(f16, SW128, (BLK_N // EPI_BOX, BLK_M, EPI_BOX))":
                 "D_layout = mma_shared_layout(f16, SwizzleMode.SWIZZLE_64B_ATOM, (BLK_N // EPI_BOX, BLK_M, EPI_BOX))"},
        "grid": {"bx, by = T.cta_id([TILES_M, TILES_N])": "by, bx = T.cta_id([TILES_N, TILES_M])"}}
    for name, replace in designs.items():
        parts = ["s5_build_sm90", "s7_build_sm90"] if name == "sw64" else ["s5_build_sm90"]
        for part_id, r in grade_edited(root, edit, tmp_path / name, device, "lab5_gemm_pipeline", replace, parts,
                                       "sm_90a").items():
            assert r.verdict == report.PASSED and "cover the 128 x 128 tile once" in r.message, \
                (name, part_id, r.message)

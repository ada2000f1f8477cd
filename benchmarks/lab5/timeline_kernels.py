"""Traced Hopper (sm_90a) GEMM kernels for the pipeline-timeline tool.

D = A @ B.T, A [M, K], B [N, K], D [M, N], fp16 in memory, fp32 accumulation.

* ``traced_step4``: Lab 4's ``hopper_step4`` written for the K-major B of Lab 4's lecture and of
  Lab 5 (one warpgroup: thread 0 issues the TMA loads, every warp waits on the barrier, runs the
  wgmmas, syncs; a TMA-store epilogue) with trace points. One timeline row per warp.
* ``traced_ws``: a warp-specialized variant with a ``stages``-deep ring: warpgroup 0's lane 0 of
  warp 0 is the TMA producer (waits on ``empty[s]``, issues the loads into ``full[s]``),
  warpgroup 1 is the MMA consumer (waits on ``full[s]``, 8 x wgmma m64n128k16, releases the
  slot) and then the epilogue. Rows: producer, consumer warps 0..3.

Both builders return ``(prim_func, info)``; ``info`` holds what the host needs: the trace buffer
length, the grid size, the row names for ``timeline.decode``.
The constants and helpers at the top are Lab 4's (solutions/lab4_gemm, cell 1), for a K-major B.
"""
from __future__ import annotations

import os
import sys

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.tile_primitive.tma_utils import mma_shared_layout, SwizzleMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grader.timeline import Tracer, buffer_len  # noqa: E402

f16, f32 = "float16", "float32"
BLK_M, BLK_N, BLK_K = 128, 128, 64
SW128 = SwizzleMode.SWIZZLE_128B_ATOM
WGMMA_M, WGMMA_K = 64, 16
HALVES = BLK_M // WGMMA_M             # 2
ACC = WGMMA_M * BLK_N // 128          # 64 fp32 accumulator registers per thread and half
LBO, SBO, SWZ = 1, 64, 3              # K-major, 128B swizzle (Lab 4 part a)

ACC_FENCE = r"""
__device__ __forceinline__ void acc_fence(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
"""


@T.macro
def fence_accumulators(regs):
    for r in T.unroll(HALVES * ACC):
        T.cuda.func_call("acc_fence", regs[r], source_code=ACC_FENCE)


def wgmma_acc_coord(thread, reg):
    warp, lane = thread // 32, thread % 32
    return 16 * warp + lane // 4 + 8 * ((reg // 2) % 2), 8 * (reg // 4) + 2 * (lane % 4) + reg % 2


def _info(M, N, K, num_groups, records, names, stamp, enabled, threads):
    ctas = (M // BLK_M) * (N // BLK_N)
    return {"M": M, "N": N, "K": K, "grid": (M // BLK_M, N // BLK_N), "num_ctas": ctas,
            "num_groups": num_groups, "records_per_group": records,
            "buf_len": buffer_len(ctas, num_groups, records) if enabled else 1,
            "group_names": names, "stamp": stamp, "traced": enabled, "threads": threads}


# ----------------------------------------------------------------------------------------------
def traced_step4(M, N, K, *, stamp="globaltimer", enabled=True, fence=True):
    """Lab 4 hopper_step4 + trace points (rows: the 4 warps of the warpgroup, warp 0 issues TMA)."""
    assert M % BLK_M == 0 and N % BLK_N == 0 and K % BLK_K == 0
    K_TILES = K // BLK_K
    NUM_CTAS = (M // BLK_M) * (N // BLK_N)
    NG = 4
    REC = 8 * K_TILES + 16
    info = _info(M, N, K, NG, REC, ["warp0 (TMA)", "warp1", "warp2", "warp3"], stamp, enabled, 128)
    L = info["buf_len"]
    A_layout = mma_shared_layout(f16, SW128, (BLK_M, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (BLK_N, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (BLK_M, BLK_N))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16),
               prof: T.Buffer((L,), "uint64")):
        T.device_entry()
        bx, by = T.cta_id([M // BLK_M, N // BLK_N])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid = T.meta_var(warp_id * 32 + lane_id)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)

        pool = T.SMEMPool()
        tma_bar = pool.alloc((1,), "uint64", align=8)
        pool.move_base_to(1024)
        Asmem = pool.alloc((BLK_M, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), f16, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((HALVES * ACC,), f32)
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        pair = T.alloc_local((2,), f16)

        tr = Tracer(prof, NG, NUM_CTAS, stamp=stamp, enabled=enabled, leader=(lane_id == 0), fence=fence)
        tr.init(warp_id)                                   # one row per warp

        if tid == 0:
            T.ptx.mbarrier.init(tma_bar.ptr_to([0]), 1)
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()
        phase_tma: T.int32 = 0

        for i in T.unroll(HALVES * ACC):
            acc[i] = T.float32(0)
        for k in T.serial(K_TILES):
            if tid == 0:
                tr.begin("load")                                                  # TRACE
                Tx.copy_async(Asmem[:, :], A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K],
                              dispatch="tma_auto", cta_group=1, mbar=tma_bar.ptr_to([0]))
                Tx.copy_async(Bsmem[:, :], B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K],
                              dispatch="tma_auto", cta_group=1, mbar=tma_bar.ptr_to([0]))
                T.ptx.mbarrier.arrive.expect_tx(tma_bar.ptr_to([0]), (BLK_M + BLK_N) * BLK_K * 2)
                tr.end("load")                                                    # TRACE
            tr.begin("wait")                                                      # TRACE
            T.ptx.mbarrier.try_wait(tma_bar.ptr_to([0]), phase_tma)
            tr.end("wait")                                                        # TRACE
            phase_tma = phase_tma ^ 1
            tr.begin("mma")                                                       # TRACE
            fence_accumulators(acc)
            T.ptx.wgmma.fence()
            for h in T.unroll(HALVES):
                for kk in T.unroll(BLK_K // WGMMA_K):
                    T.ptx.wgmma.encode_matrix_descriptor(T.address_of(desc_a[0]), Asmem.ptr_to([WGMMA_M * h, WGMMA_K * kk]), LBO, SBO, SWZ)
                    T.ptx.wgmma.encode_matrix_descriptor(T.address_of(desc_b[0]), Bsmem.ptr_to([0, WGMMA_K * kk]), LBO, SBO, SWZ)
                    T.ptx.wgmma.mma_async.ss(desc_a[0], desc_b[0], *[acc[h * ACC + j] for j in range(ACC)],
                                             M=WGMMA_M, N=BLK_N, K=WGMMA_K, in_dtype=f16, out_dtype=f32,
                                             transA=False, transB=False, scaleA=1.0, scaleB=1.0, scaleD=True)
            T.ptx.wgmma.commit_group()
            T.ptx.wgmma.wait_group(0)
            fence_accumulators(acc)
            tr.end("mma")                                                         # TRACE
            tr.begin("sync")                                                      # TRACE
            T.cuda.cta_sync()
            tr.end("sync")                                                        # TRACE

        tr.begin("epilogue")                                                      # TRACE
        for h in T.unroll(HALVES):
            for j in T.unroll(ACC // 2):
                row, col = T.meta_var(wgmma_acc_coord(tid, 2 * j))
                pair[0] = T.Cast(f16, acc[h * ACC + 2 * j])
                pair[1] = T.Cast(f16, acc[h * ACC + 2 * j + 1])
                Dsmem.vstore([WGMMA_M * h + row, col], pair.vload([0], dtype="float16x2"))
        T.ptx.fence.proxy_async("shared::cta")
        T.cuda.cta_sync()
        tr.end("epilogue")                                                        # TRACE
        tr.begin("store")                                                         # TRACE
        if tid == 0:
            Tx.copy_async(D[m_st:m_st + BLK_M, n_st:n_st + BLK_N], Dsmem[:, :], dispatch="tma_auto")
            T.ptx.cp_async.bulk.commit_group()
            T.ptx.cp_async.bulk.wait_group(0)
        T.cuda.cta_sync()
        tr.end("store")                                                           # TRACE
        tr.finalize()

    return kernel, info


# ----------------------------------------------------------------------------------------------
def traced_ws(M, N, K, stages=2, *, stamp="globaltimer", enabled=True, fence=True):
    """Warp-specialized producer/consumer GEMM with a ``stages``-deep TMA ring, traced.
    Warpgroup 0: warp 0 lane 0 = TMA producer (row 0). Warpgroup 1: MMA consumer + epilogue
    (rows 1..4 = its warps 0..3)."""
    assert M % BLK_M == 0 and N % BLK_N == 0 and K % BLK_K == 0
    assert 1 <= stages <= 8
    S = stages
    K_TILES = K // BLK_K
    NUM_CTAS = (M // BLK_M) * (N // BLK_N)
    NG = 5
    REC = 4 * K_TILES + 16
    info = _info(M, N, K, NG, REC, ["producer (TMA)", "consumer w0", "consumer w1", "consumer w2",
                                    "consumer w3"], stamp, enabled, 256)
    info["stages"] = S
    L = info["buf_len"]
    TX_BYTES = (BLK_M + BLK_N) * BLK_K * 2
    A_layout = mma_shared_layout(f16, SW128, (S, BLK_M, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (S, BLK_N, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (BLK_M, BLK_N))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16),
               prof: T.Buffer((L,), "uint64")):
        T.device_entry()
        bx, by = T.cta_id([M // BLK_M, N // BLK_N])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)

        pool = T.SMEMPool()
        full = pool.alloc((S,), "uint64", align=8)      # TMA bytes of stage s have landed
        empty = pool.alloc((S,), "uint64", align=8)     # the consumer is done with stage s
        pool.move_base_to(1024)
        Asmem = pool.alloc((S, BLK_M, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), f16, layout=D_layout)
        pool.commit()

        # rows: 0 = producer (wg 0, warp 0), 1 + w = consumer warp w; one fixed lane-0 leader each
        tr = Tracer(prof, NG, NUM_CTAS, stamp=stamp, enabled=enabled, fence=fence,
                    leader=T.And(lane_id == 0, T.Or(wg_id == 1, warp_id == 0)))
        tr.init(T.Select(wg_id == 0, 0, 1 + warp_id))

        if wg_id == 0:
            if tid_in_wg == 0:
                for s in T.unroll(S):
                    T.ptx.mbarrier.init(full.ptr_to([s]), 1)
                    T.ptx.mbarrier.init(empty.ptr_to([s]), 1)
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()

        if wg_id == 0:
            # ---------------- producer: one thread issues every TMA load ----------------
            if warp_id == 0:
                if lane_id == 0:
                    for k in T.serial(K_TILES):
                        s = T.meta_var(k % S)
                        if k >= S:
                            tr.begin("wait", s)                                   # TRACE
                            T.ptx.mbarrier.try_wait(empty.ptr_to([s]), ((k // S) & 1) ^ 1)
                            tr.end("wait", s)                                     # TRACE
                        tr.begin("load", s)                                       # TRACE
                        Tx.copy_async(Asmem[s, :, :], A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([s]))
                        Tx.copy_async(Bsmem[s, :, :], B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([s]))
                        T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([s]), TX_BYTES)
                        tr.end("load", s)                                         # TRACE
                    tr.finalize()
        else:
            # ---------------- consumer warpgroup: wgmma + epilogue ----------------
            acc = T.alloc_local((HALVES * ACC,), f32)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            pair = T.alloc_local((2,), f16)
            for i in T.unroll(HALVES * ACC):
                acc[i] = T.float32(0)
            for k in T.serial(K_TILES):
                s = T.meta_var(k % S)
                tr.begin("wait", s)                                               # TRACE
                T.ptx.mbarrier.try_wait(full.ptr_to([s]), (k // S) & 1)
                tr.end("wait", s)                                                 # TRACE
                tr.begin("mma", s)                                                # TRACE
                fence_accumulators(acc)
                T.ptx.wgmma.fence()
                for h in T.unroll(HALVES):
                    for kk in T.unroll(BLK_K // WGMMA_K):
                        T.ptx.wgmma.encode_matrix_descriptor(T.address_of(desc_a[0]), Asmem.ptr_to([s, WGMMA_M * h, WGMMA_K * kk]), LBO, SBO, SWZ)
                        T.ptx.wgmma.encode_matrix_descriptor(T.address_of(desc_b[0]), Bsmem.ptr_to([s, 0, WGMMA_K * kk]), LBO, SBO, SWZ)
                        T.ptx.wgmma.mma_async.ss(desc_a[0], desc_b[0], *[acc[h * ACC + j] for j in range(ACC)],
                                                 M=WGMMA_M, N=BLK_N, K=WGMMA_K, in_dtype=f16, out_dtype=f32,
                                                 transA=False, transB=False, scaleA=1.0, scaleB=1.0, scaleD=True)
                T.ptx.wgmma.commit_group()
                T.ptx.wgmma.wait_group(0)             # this stage's wgmmas are complete ...
                fence_accumulators(acc)
                tr.end("mma", s)                                                  # TRACE
                if tid_in_wg == 0:
                    T.ptx.mbarrier.arrive(empty.ptr_to([s]))   # ... so the producer may refill it

            tr.begin("epilogue")                                                  # TRACE
            for h in T.unroll(HALVES):
                for j in T.unroll(ACC // 2):
                    row, col = T.meta_var(wgmma_acc_coord(tid_in_wg, 2 * j))
                    pair[0] = T.Cast(f16, acc[h * ACC + 2 * j])
                    pair[1] = T.Cast(f16, acc[h * ACC + 2 * j + 1])
                    Dsmem.vstore([WGMMA_M * h + row, col], pair.vload([0], dtype="float16x2"))
            T.ptx.fence.proxy_async("shared::cta")
            T.cuda.warpgroup_sync(10)                  # the whole tile is in Dsmem
            tr.end("epilogue")                                                    # TRACE
            if tid_in_wg == 0:
                tr.begin("store")                                                 # TRACE
                Tx.copy_async(D[m_st:m_st + BLK_M, n_st:n_st + BLK_N], Dsmem[:, :], dispatch="tma_auto")
                T.ptx.cp_async.bulk.commit_group()
                T.ptx.cp_async.bulk.wait_group(0)
                tr.end("store")                                                   # TRACE
            tr.begin("sync")                                                      # TRACE
            T.cuda.warpgroup_sync(10)                  # nobody leaves before the store read Dsmem
            tr.end("sync")                                                        # TRACE
            tr.finalize()

    return kernel, info


BUILDERS = {"step4": traced_step4, "ws": traced_ws}

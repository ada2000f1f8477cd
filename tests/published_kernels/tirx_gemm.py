# Test data: the fp16 GEMM of mlc-ai/tirx-kernels, adapted to the course's builder interface.
#
# Source: github.com/mlc-ai/tirx-kernels, tirx_kernels/gemm/fp16_bf16_gemm.py, commit
# 5be39749e7dfd2c4bdae9b4d396f8ec35af07126 (the companion revision pinned by the book's README for
# apache-tvm 0.26). Apache License 2.0. Kept: the kernel's no-overlap configuration (the one its
# GEMM_CONFIGS table uses for N = 4096 and 8192), structure and names. Dropped: the overlapped
# epilogue, bf16, benchmarking and data preparation. Added: `variant`, the broken forms the
# course's tests feed to the grader. Not course material: the tests use it to check that the
# grader accepts the kernels the book points to, and rejects their broken variants.
from __future__ import annotations

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode
from tvm.tirx.lang.pipeline import Pipeline, PipelineState
from tvm.tirx.lang.tile_scheduler import ClusterLaunchControlScheduler

VARIANTS = (None, "no_cluster_sync", "no_tma_store")


@T.jit
def _kernel(
    A: T.Buffer((M, K), ab_type),
    B: T.Buffer((N, K), ab_type),
    D: T.Buffer((M, N), ab_type),
    *,
    M: T.constexpr,
    N: T.constexpr,
    K: T.constexpr,
    ab_type: T.constexpr,
    MMA_N: T.constexpr,
    BLK_K: T.constexpr,
    PIPE_DEPTH: T.constexpr,
    WB_PIPE_DEPTH: T.constexpr,
    L2_GROUP_SIZE: T.constexpr,
    CLUSTER_SYNC: T.constexpr,
    TMA_STORE: T.constexpr,
):
    NUM_CONSUMER = T.meta_var(2)
    BLK_M = T.meta_var(128)
    BLK_N = T.meta_var(MMA_N // 2)
    EPI_N = T.meta_var(MMA_N // WB_PIPE_DEPTH)

    T.device_entry()
    T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
    cbx, cby = T.cta_id_in_cluster([2, 1], preferred=[2, 1])
    bx = T.cta_id([(M // (256 * NUM_CONSUMER) * (N // MMA_N) * 2)])
    wg_id = T.warpgroup_id([(NUM_CONSUMER + 1)])
    warp_id = T.warp_id_in_wg([4])
    lane_id = T.lane_id([32])

    pool = T.SMEMPool()
    tmem_addr = pool.alloc((1,), "uint32")
    tmem_pool = T.TMEMPool(pool, total_cols=512, cta_group=2, tmem_addr=tmem_addr)
    smem_pipe = Pipeline(pool, PIPE_DEPTH, full="tma", empty="tcgen05", init_empty=NUM_CONSUMER)
    tmem_pipe = Pipeline(pool, NUM_CONSUMER, full="tcgen05", empty="mbar", init_empty=2 * 128)
    clc_sched = ClusterLaunchControlScheduler(
        pool,
        num_m_tiles=(M // (256 * NUM_CONSUMER)),
        num_n_tiles=(N // MMA_N),
        l2_group_size=L2_GROUP_SIZE,
        cta_group=2,
        finish_arrivals=((2 + NUM_CONSUMER) * 2 + NUM_CONSUMER),
    )
    pool.move_base_to(1024)
    Asmem = pool.alloc_tcgen05_mma_AB((PIPE_DEPTH, NUM_CONSUMER, BLK_M, BLK_K), ab_type)
    Bsmem = pool.alloc_tcgen05_mma_AB((PIPE_DEPTH, BLK_N, BLK_K), ab_type)
    Dsmem = pool.alloc_tcgen05_mma_AB((NUM_CONSUMER, 2, BLK_M, EPI_N), ab_type,
                                      swizzle_mode=SwizzleMode.SWIZZLE_64B_ATOM)   # 32 fp16 = 64-byte rows
    pool.commit()
    smem_full_cta0 = smem_pipe.full.remote_view(0)
    tmem = tmem_pool.alloc((128, 512), "float32")
    tmem_pool.commit()
    T.ptx.fence.proxy_async("shared::cta")
    T.ptx.fence.mbarrier_init()
    if CLUSTER_SYNC:
        T.cuda.cluster_sync()
    else:   # broken: a CTA may signal its peer's barriers before the peer has initialised them
        T.cuda.cta_sync()

    if wg_id == NUM_CONSUMER:
        # producer warpgroup: loader (warp 3), CLC scheduler (warp 2), MMA (warps 0, 1 of CTA 0)
        T.ptx.setmaxnreg(False, 56)
        if warp_id == 3:
            ld = clc_sched.worker("ld_sched")
            ld.init(bx // 2)
            tma_cur = PipelineState(PIPE_DEPTH, 1)

            @T.inline
            def tma_load_stage(k_tile, m_idx, n_idx):
                smem_pipe.empty.wait(tma_cur.stage, tma_cur.phase)
                stage = tma_cur.stage
                tma_config = T.meta_var({"dispatch": "tma_auto", "cta_group": 2,
                                         "mbar": smem_full_cta0.ptr_to([stage]), "prefetch_tensormap": True})
                k = T.meta_var(k_tile * BLK_K)
                b_n = T.meta_var((n_idx * 2 + cbx) * BLK_N)
                for c in T.unroll(NUM_CONSUMER):
                    a_m = T.meta_var(((m_idx * 2 + cbx) * NUM_CONSUMER + c) * BLK_M)
                    Tx.copy_async(Asmem[stage, c], A[a_m : a_m + BLK_M, k : k + BLK_K], **tma_config)
                Tx.copy_async(Bsmem[stage], B[b_n : b_n + BLK_N, k : k + BLK_K], **tma_config)
                if cbx == 0:     # the leader arms its barrier with the bytes of both CTAs
                    smem_full_cta0.arrive(
                        stage, 2 * (NUM_CONSUMER * BLK_M * BLK_K + BLK_N * BLK_K) * (ab_type.bits // 8))

            if T.ptx.elect_sync():
                while ld.valid():
                    m_idx = T.meta_var(ld.m_idx)
                    n_idx = T.meta_var(ld.n_idx)
                    for k_tile in T.serial(K // BLK_K):
                        tma_load_stage(k_tile, m_idx, n_idx)
                        tma_cur.advance()
                    ld.consume()
                    ld.advance_coords()
                    ld.mark_done_if_drained()
        elif warp_id == 2:
            clc_sched.run_scheduler(cbx)
        elif (warp_id < NUM_CONSUMER) & (cbx == 0):
            mma_smem = PipelineState(PIPE_DEPTH, 0)
            tmem_buf = PipelineState(1, 1)
            accum: T.int32

            @T.inline
            def mma_stage(buf):
                smem_pipe.full.wait(mma_smem.stage, mma_smem.phase)
                stage = mma_smem.stage
                tmem_n = T.meta_var(buf * MMA_N)
                Tx.gemm_async(tmem[:, tmem_n : tmem_n + MMA_N], Asmem[stage, warp_id], Bsmem[stage],
                              accum=accum, dispatch="tcgen05", cta_group=2)
                accum = 1
                smem_pipe.empty.arrive(mma_smem.stage, cta_group=2, cta_mask=3)

            mm = clc_sched.worker("mma_sched")
            mm.reset()
            if T.ptx.elect_sync():
                while mm.valid():
                    mm.consume()
                    tmem_pipe.empty.wait(warp_id, tmem_buf.phase)
                    accum = 0
                    for k_tile in T.serial(K // BLK_K):
                        mma_stage(warp_id)
                        mma_smem.advance()
                    tmem_pipe.full.arrive(warp_id, cta_group=2, cta_mask=3)
                    tmem_buf.advance()
                    mm.mark_done_if_drained()
    elif wg_id < NUM_CONSUMER:
        # epilogue warpgroups: TMEM -> registers -> SMEM -> TMA store
        T.ptx.setmaxnreg(True, 224)
        wb = clc_sched.worker("wb_sched")
        wb.init(bx // 2)
        wb_buf = PipelineState(1, 0)

        @T.inline
        def writeback(m_idx, n_idx):
            tmem_pipe.full.wait(wg_id, wb_buf.phase)
            tmem_base = T.meta_var(wg_id * MMA_N)
            NOL = T.meta_var(16)
            Dreg_16b = T.wg_reg_tile(MMA_N, dtype=ab_type)
            for i in T.unroll(MMA_N // NOL):
                Dreg = T.wg_reg_tile(NOL)
                tn = T.meta_var(tmem_base + i * NOL)
                Tx.wg.copy_async(Dreg, tmem[:, tn : tn + NOL])
                T.ptx.tcgen05.wait.ld()
                Tx.wg.cast(Dreg_16b[:, i * NOL : (i + 1) * NOL], Dreg)
            tmem_pipe.empty.arrive(wg_id, remote=0, pred=True)
            for i in T.unroll(WB_PIPE_DEPTH):
                db = T.meta_var(i % 2)
                T.ptx.cp_async.bulk.wait_group(1, read=True)
                T.cuda.warpgroup_sync(wg_id + 10)
                for jv in T.unroll(EPI_N // 8):
                    c0 = T.meta_var(i * EPI_N + jv * 8)
                    Tx.wg.copy(Dsmem[wg_id, db, :, jv * 8 : jv * 8 + 8], Dreg_16b[:, c0 : c0 + 8])
                T.cuda.warpgroup_sync(wg_id + 10)
                d_m = T.meta_var(((m_idx * 2 + cbx) * NUM_CONSUMER + wg_id) * BLK_M)
                d_n = T.meta_var(n_idx * MMA_N + i * EPI_N)
                if TMA_STORE:
                    if (warp_id == 0) & (lane_id == 0):
                        T.ptx.fence.proxy_async("shared::cta")
                        Tx.copy_async(D[d_m : d_m + BLK_M, d_n : d_n + EPI_N], Dsmem[wg_id, db],
                                      dispatch="tma_auto")
                    T.ptx.cp_async.bulk.commit_group()
                else:   # the broken variant: every thread writes its row with plain stores
                    for jv in T.unroll(EPI_N // 8):
                        Tx.wg.copy(D[d_m : d_m + BLK_M, d_n + jv * 8 : d_n + jv * 8 + 8],
                                   Dreg_16b[:, i * EPI_N + jv * 8 : i * EPI_N + jv * 8 + 8])

        cur_m: T.int32
        cur_n: T.int32
        while wb.valid():
            cur_m = wb.m_idx
            cur_n = wb.n_idx
            wb.consume_wg(wg_id, warp_id, lane_id)
            wb.advance_coords()
            cm = T.meta_var(cur_m)
            cn = T.meta_var(cur_n)
            writeback(cm, cn)
            wb_buf.advance()
            wb.mark_done_if_drained()
        T.ptx.cp_async.bulk.wait_group(0)
    if CLUSTER_SYNC:
        T.cuda.cluster_sync()
    else:   # broken: a CTA may exit while its peer still reads its shared memory
        T.cuda.cta_sync()
    tmem_pool.dealloc()


def tirx_gemm(M, N, K, num_sms=None, variant=None):
    """The kernel for D = A @ B.T (fp16). It launches one CTA pair per 512 x 256 tile of D (no
    persistent grid: `num_sms` is accepted and ignored), so M must be a multiple of 512 and N of
    256; a smaller M launches no CTA at all."""
    assert variant in VARIANTS, variant
    return _kernel.specialize(
        M=M, N=N, K=K, ab_type=tvm.DataType("float16"),
        MMA_N=256, BLK_K=64, PIPE_DEPTH=4, WB_PIPE_DEPTH=8, L2_GROUP_SIZE=8,
        CLUSTER_SYNC=variant != "no_cluster_sync",
        TMA_STORE=variant != "no_tma_store",
    )

"""Lab 5 reference kernels, Hopper track (sm_90a): the climb from Lab 4's TMA + wgmma kernel
(hopper_step4) to cuBLAS speed.

Every builder ``hopper_stepN(M, N, K, ...)`` returns a ``@T.prim_func`` computing
D = A @ B.T with A [M, K], B [N, K], D [M, N]: fp16 in, fp32 accumulate, fp16 out, called as
``kernel(A, B, D)`` on torch tensors once compiled with ``tvm.compile(..., tir_pipeline="tirx")``.

| step | what it adds | CTA tile | warpgroups |
|---|---|---|---|
| 5 | a ring of STAGES shared-memory stages, full/empty mbarriers with phase bits, TMA loads issued STAGES-1 K tiles ahead of the wgmma | 128 x 128 | 1 |
| 6 | persistent: num_sms CTAs, static grouped (L2-friendly) tile order, the ring keeps running across tiles so the epilogue overlaps the next tile's loads | 128 x 128 | 1 |
| 7 | warp specialization: a producer warpgroup (one thread issues TMA) and a consumer warpgroup (wgmma); setmaxnreg 40 / 232 | 128 x 128 | 2 |
| 8 | two consumer warpgroups sharing the B tile, each m64n256 | 128 x 256 | 3 |
| 9 | a 2x1 cluster: the two CTAs (two M tiles) share the B tile, each loads half of it once and multicasts it to both | 2 x (128 x 256) | 3 |

Shapes: K a multiple of BLK_K (64); M and N multiples of 8 (TMA needs 16-byte global strides).
M and N need not be multiples of the CTA tile: TMA loads zero-fill the rows outside A or B, and
the epilogue's TMA stores clip at the edges of D.

Conventions from Lab 4 (hopper_step4): 128-byte swizzled, K-major tiles; wgmma descriptors with
LBO 1, SBO 64 (1024 bytes between 8-row groups), swizzle code 3; half2 stores from the accumulator
fragment into a swizzled D tile, then a TMA store.
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.tile_primitive.tma_utils import mma_shared_layout, SwizzleMode

f16, f32 = "float16", "float32"
F16_BYTES = 2
SW128 = SwizzleMode.SWIZZLE_128B_ATOM   # a 64-element fp16 row (128 bytes) is one swizzle-atom row

# ---------------------------------------------------------------- constants the lecture cites
BLK_K = 64                    # K values per pipeline stage (one 128-byte swizzle atom row)
WGMMA_M, WGMMA_K = 64, 16     # one wgmma: m64 nN k16
DESC_LBO, DESC_SBO, DESC_SWIZZLE = 1, 64, 3   # K-major, 128B swizzle (Lab 4 part a)

# steps 5-7: a 128 x 128 CTA tile computed by one warpgroup as two m64n128 halves
BLK_M, BLK_N = 128, 128
STAGES = 4                    # shared-memory ring depth of steps 5-7 (4 x 32 KB + 32 KB for D)
GROUP_M = 8                   # grouped tile order: 8 tile rows share the walk along N (L2 reuse)

# step 7-9: register budgets after setmaxnreg (per thread)
PRODUCER_REGS = 40
CONSUMER_REGS = 232

# steps 8-9: a 128 x 256 CTA tile, two consumer warpgroups of m64n256 sharing the B tile
WS_BLK_M, WS_BLK_N = 128, 256
NUM_CONSUMERS = 2
WS_STAGES = 4                 # 4 x 48 KB ring + 2 x 16 KB epilogue buffers = 224 KB of shared memory
EPI_N = 128                   # the epilogue stores a consumer's 64 x 256 result in chunks of 64 x EPI_N

# step 9: a cluster of CLUSTER_M CTAs along M; they share (multicast) the B tile
CLUSTER_M = 2

# the epilogue's TMA store box: 64 fp16 columns = one 128-byte swizzle row
EPI_BOX = 64

# named barriers (bar.sync ids); id 0 is __syncthreads
EPI_BAR = 1                   # consumer warpgroup c synchronizes its epilogue on EPI_BAR + c


def ceildiv(a, b):
    return (a + b - 1) // b


def check_shape(M, N, K):
    assert K % BLK_K == 0 and K >= BLK_K, f"K must be a positive multiple of {BLK_K}, got {K}"
    assert M % 8 == 0 and N % 8 == 0 and M > 0 and N > 0, \
        f"M and N must be positive multiples of 8 (16-byte TMA strides), got {M} x {N}"


# ---------------------------------------------------------------- shared helpers

ACC_FENCE = r"""
__device__ __forceinline__ void acc_fence(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
"""


@T.macro
def fence_accumulators(regs, count):
    """An empty asm statement that 'reads and rewrites' each accumulator register, so the compiler
    keeps accumulator accesses on their side of wgmma.fence / wgmma.wait_group."""
    for r in T.unroll(count):
        T.cuda.func_call("acc_fence", regs[r], source_code=ACC_FENCE)


def wgmma_acc_coord(thread, reg):
    """(row, column) in an m64nN fp32 accumulator of register ``reg`` of warpgroup thread
    ``thread`` (Lab 4 part a)."""
    warp, lane = thread // 32, thread % 32
    row = 16 * warp + lane // 4 + 8 * ((reg // 2) % 2)
    col = 8 * (reg // 4) + 2 * (lane % 4) + reg % 2
    return row, col


@T.macro
def store_tile(D, Dsmem, m0, n0, rows, cols):
    """TMA-store the (rows x cols) tile held in Dsmem, laid out as cols / EPI_BOX column blocks of
    (rows x EPI_BOX) 128B-swizzled boxes, to D[m0:m0 + rows, n0:n0 + cols]. One explicit TMA store
    per box: the hardware clips the parts outside D (tma_auto refuses a D whose width is not a
    multiple of 64)."""
    for j in T.unroll(cols // EPI_BOX):
        if n0 + j * EPI_BOX < D.shape[1]:          # skip boxes wholly right of D
            Tx.copy_async(D[m0:m0 + rows, n0 + j * EPI_BOX:n0 + (j + 1) * EPI_BOX], Dsmem[j, :, :],
                          dispatch="tma_explicit")


@T.macro
def wgmma_k_tile(acc, Asmem, Bsmem, stage, a_row0, halves, n, desc_a, desc_b):
    """Issue the wgmmas of one K tile (BLK_K = 4 k16 steps) for ``halves`` m64nN row blocks
    starting at row ``a_row0`` of the A stage, against rows 0..n-1 of the B stage. Register i of
    half h is acc[h * n / 2 + i]."""
    for h in T.unroll(halves):
        for kk in T.unroll(BLK_K // WGMMA_K):
            T.ptx.wgmma.encode_matrix_descriptor(T.address_of(desc_a[0]), Asmem.ptr_to([stage, a_row0 + WGMMA_M * h, WGMMA_K * kk]),
                                                 DESC_LBO, DESC_SBO, DESC_SWIZZLE)
            T.ptx.wgmma.encode_matrix_descriptor(T.address_of(desc_b[0]), Bsmem.ptr_to([stage, 0, WGMMA_K * kk]),
                                                 DESC_LBO, DESC_SBO, DESC_SWIZZLE)
            T.ptx.wgmma.mma_async.ss(desc_a[0], desc_b[0], *[acc[h * (n // 2) + j] for j in range(n // 2)],
                                     M=WGMMA_M, N=n, K=WGMMA_K, in_dtype=f16, out_dtype=f32,
                                     transA=False, transB=False, scaleA=1.0, scaleB=1.0, scaleD=True)


@T.macro
def acc_to_smem(acc, Dsmem, tid, halves, regs_per_half, reg0, cols, pair, lead=()):
    """fp32 accumulators -> fp16 pairs -> half2 stores into the swizzled D tile Dsmem (laid out as
    column blocks of EPI_BOX). For each of the ``halves`` m64 row blocks, registers
    h * regs_per_half + reg0 .. + cols / 2 - 1 (accumulator columns 2 * reg0 .. 2 * reg0 + cols - 1)
    go to rows 64 h .. 64 h + 63 and columns 0 .. cols - 1 of Dsmem[*lead]."""
    for h in T.unroll(halves):
        for j in T.unroll(cols // 4):
            row, col = T.meta_var(wgmma_acc_coord(tid, 2 * j))
            pair[0] = T.Cast(f16, acc[h * regs_per_half + reg0 + 2 * j])
            pair[1] = T.Cast(f16, acc[h * regs_per_half + reg0 + 2 * j + 1])
            Dsmem.vstore([*lead, col // EPI_BOX, WGMMA_M * h + row, col % EPI_BOX], pair.vload([0], dtype="float16x2"))


def grouped_tile(t, tiles_m, tiles_n, group):
    """(tile row, tile column) of linear tile index ``t`` in grouped order: ``group`` tile rows
    are walked column by column (so concurrently running CTAs share A rows and B columns in L2),
    then the next group. The last group may have fewer rows. ``t`` may be a TIR expression."""
    span = group * tiles_n                       # tiles in one full group
    first_row = T.truncdiv(t, span) * group
    rows = T.min(tiles_m - first_row, group)     # rows in this group (fewer in the last one)
    within = T.truncmod(t, span)
    return first_row + T.truncmod(within, rows), T.truncdiv(within, rows)


# ================================================================ step 5: the multi-stage ring

def hopper_step5(M, N, K, stages=STAGES):
    """One CTA (one warpgroup) per 128 x 128 output tile. A ring of ``stages`` shared-memory
    stages: full[s] completes when the TMA bytes of stage s have landed (expect_tx), empty[s] when
    the wgmmas that read stage s are complete. Thread 0 keeps the TMA loads ``stages - 1`` K tiles
    ahead of the wgmma; each K tile's wgmma group stays in flight (wait_group 1) while the next
    K tile's group is issued."""
    check_shape(M, N, K)
    assert stages >= 2
    K_TILES = K // BLK_K
    TILES_M, TILES_N = ceildiv(M, BLK_M), ceildiv(N, BLK_N)
    PREFETCH = min(stages - 1, K_TILES)          # loads issued before the first wgmma
    HALVES = BLK_M // WGMMA_M                    # 2 m64 halves
    ACC = WGMMA_M * BLK_N // 128                 # 64 fp32 registers per thread and half
    TX_BYTES = (BLK_M + BLK_N) * BLK_K * F16_BYTES
    A_layout = mma_shared_layout(f16, SW128, (stages, BLK_M, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (stages, BLK_N, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (BLK_N // EPI_BOX, BLK_M, EPI_BOX))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16)):
        T.device_entry()
        bx, by = T.cta_id([TILES_M, TILES_N])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid = T.meta_var(warp_id * 32 + lane_id)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)

        pool = T.SMEMPool()
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.move_base_to(1024)
        Asmem = pool.alloc((stages, BLK_M, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((stages, BLK_N, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((BLK_N // EPI_BOX, BLK_M, EPI_BOX), f16, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((HALVES * ACC,), f32)
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        pair = T.alloc_local((2,), f16)

        if tid == 0:
            for s in T.unroll(stages):
                T.ptx.mbarrier.init(full.ptr_to([s]), 1)    # the producer's expect_tx arrive
                T.ptx.mbarrier.init(empty.ptr_to([s]), 1)   # one arrive per consumer warpgroup
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()

        @T.inline
        def load(stage, kt):
            # fill ring stage `stage` with K tile `kt` of A and B; full[stage] counts the bytes
            Tx.copy_async(Asmem[stage, :, :], A[m_st:m_st + BLK_M, kt * BLK_K:(kt + 1) * BLK_K],
                          dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
            Tx.copy_async(Bsmem[stage, :, :], B[n_st:n_st + BLK_N, kt * BLK_K:(kt + 1) * BLK_K],
                          dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
            T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([stage]), TX_BYTES)

        @T.inline
        def k_step(kt, last):
            # one K tile: wait for its bytes, issue its 8 wgmmas as one group, retire the previous
            # group, hand the previous stage back, load the K tile stages - 1 ahead
            stage = T.meta_var(kt % stages)
            T.ptx.mbarrier.try_wait(full.ptr_to([stage]), (kt // stages) % 2)   # consumer parity
            fence_accumulators(acc, HALVES * ACC)
            T.ptx.wgmma.fence()
            wgmma_k_tile(acc, Asmem, Bsmem, stage, 0, HALVES, BLK_N, desc_a, desc_b)
            T.ptx.wgmma.commit_group()
            if last:
                T.ptx.wgmma.wait_group(0)     # the last K tile: everything complete, right here
            else:
                T.ptx.wgmma.wait_group(1)     # this K tile's group stays in flight
            fence_accumulators(acc, HALVES * ACC)
            if tid == 0:
                if kt > 0:
                    # the group of K tile kt - 1 is complete: its stage may be refilled
                    T.ptx.mbarrier.arrive(empty.ptr_to([(kt - 1) % stages]))
                nk = T.meta_var(kt + stages - 1)         # the K tile to load now, stages - 1 ahead
                if nk < K_TILES:
                    # producer parity starts at 1: the first round's waits pass at once
                    T.ptx.mbarrier.try_wait(empty.ptr_to([nk % stages]), (nk // stages + 1) % 2)
                    load(nk % stages, nk)

        # prologue: the first stages - 1 K tiles (the ring is empty: no empty-barrier wait)
        if tid == 0:
            for i in T.unroll(PREFETCH):
                load(i, i)
        for i in T.unroll(HALVES * ACC):
            acc[i] = T.float32(0)
        # The last K tile is peeled off the loop so that its wait_group(0) is straight-line code:
        # a wait only after the loop let ptxas hoist epilogue reads above it (wrong results on an
        # H200), and an if/else between wait_group(1) and wait_group(0) inside the loop makes ptxas
        # serialize every wgmma (C7518, "WG.DP in divergent path").
        for kt in T.serial(K_TILES - 1):
            k_step(kt, False)
        k_step(K_TILES - 1, True)

        # epilogue: registers -> half2 into the swizzled D tile -> TMA stores (clipped at the edges)
        acc_to_smem(acc, Dsmem, tid, HALVES, ACC, 0, BLK_N, pair)
        T.ptx.fence.proxy_async("shared::cta")
        T.cuda.cta_sync()
        if tid == 0:
            store_tile(D, Dsmem, m_st, n_st, BLK_M, BLK_N)
            T.ptx.cp_async.bulk.commit_group()
            T.ptx.cp_async.bulk.wait_group(0)

    return kernel


# ================================================================ step 6: persistent, grouped order

def hopper_step6(M, N, K, num_sms, stages=STAGES, group_m=GROUP_M):
    """Persistent: a grid of ``num_sms`` CTAs; CTA b computes tiles b, b + num_sms, ... of the
    grouped (L2-friendly) tile order. The ring does not drain between tiles: thread 0 keeps
    loading ``stages - 1`` K tiles ahead across the tile boundary, so the next tile's first loads
    are in flight while this tile's epilogue runs, and the TMA store of a tile overlaps the next
    tile's main loop (the D tile is reused only after that store has read it)."""
    check_shape(M, N, K)
    assert stages >= 2
    K_TILES = K // BLK_K
    TILES_M, TILES_N = ceildiv(M, BLK_M), ceildiv(N, BLK_N)
    NUM_TILES = TILES_M * TILES_N
    HALVES = BLK_M // WGMMA_M
    ACC = WGMMA_M * BLK_N // 128
    TX_BYTES = (BLK_M + BLK_N) * BLK_K * F16_BYTES
    A_layout = mma_shared_layout(f16, SW128, (stages, BLK_M, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (stages, BLK_N, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (BLK_N // EPI_BOX, BLK_M, EPI_BOX))
    P_COUNT, P_TILE, P_KT, P_STAGE, P_PHASE = 0, 1, 2, 3, 4     # slots of the producer state

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16)):
        T.device_entry()
        bx = T.cta_id([num_sms])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid = T.meta_var(warp_id * 32 + lane_id)

        pool = T.SMEMPool()
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.move_base_to(1024)
        Asmem = pool.alloc((stages, BLK_M, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((stages, BLK_N, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((BLK_N // EPI_BOX, BLK_M, EPI_BOX), f16, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((HALVES * ACC,), f32)
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        pair = T.alloc_local((2,), f16)
        # producer state (thread 0): loads issued, their tile and K tile, ring slot and parity
        prod = T.alloc_local((5,), "int32")
        # consumer state (all threads): ring slot and parity of the next K tile to consume
        cons = T.alloc_local((2,), "int32")

        if tid == 0:
            for s in T.unroll(stages):
                T.ptx.mbarrier.init(full.ptr_to([s]), 1)
                T.ptx.mbarrier.init(empty.ptr_to([s]), 1)
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()

        my_tiles = T.meta_var((NUM_TILES - bx + num_sms - 1) // num_sms)   # tiles of this CTA
        prod[P_COUNT] = 0
        prod[P_TILE] = bx
        prod[P_KT] = 0
        prod[P_STAGE] = 0
        prod[P_PHASE] = 1            # producer parity starts at 1: the first round passes at once
        cons[0] = 0                  # consumer stage
        cons[1] = 0                  # consumer parity

        @T.inline
        def produce():
            # thread 0: the next load of the flattened (tile, K tile) sequence of this CTA, if any
            if prod[P_COUNT] < my_tiles * K_TILES:
                stage = T.meta_var(prod[P_STAGE])
                T.ptx.mbarrier.try_wait(empty.ptr_to([stage]), prod[P_PHASE])
                tm, tn = T.meta_var(grouped_tile(prod[P_TILE], TILES_M, TILES_N, group_m))
                k0 = T.meta_var(prod[P_KT] * BLK_K)
                Tx.copy_async(Asmem[stage, :, :], A[tm * BLK_M:tm * BLK_M + BLK_M, k0:k0 + BLK_K],
                              dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                Tx.copy_async(Bsmem[stage, :, :], B[tn * BLK_N:tn * BLK_N + BLK_N, k0:k0 + BLK_K],
                              dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([stage]), TX_BYTES)
                prod[P_COUNT] = prod[P_COUNT] + 1
                prod[P_KT] = prod[P_KT] + 1
                if prod[P_KT] == K_TILES:
                    prod[P_KT] = 0
                    prod[P_TILE] = prod[P_TILE] + num_sms
                prod[P_STAGE] = prod[P_STAGE] + 1
                if prod[P_STAGE] == stages:
                    prod[P_STAGE] = 0
                    prod[P_PHASE] = prod[P_PHASE] ^ 1

        @T.inline
        def k_step(kt, last):
            stage = T.meta_var(cons[0])
            T.ptx.mbarrier.try_wait(full.ptr_to([stage]), cons[1])
            fence_accumulators(acc, HALVES * ACC)
            T.ptx.wgmma.fence()
            wgmma_k_tile(acc, Asmem, Bsmem, stage, 0, HALVES, BLK_N, desc_a, desc_b)
            T.ptx.wgmma.commit_group()
            if last:
                T.ptx.wgmma.wait_group(0)
            else:
                T.ptx.wgmma.wait_group(1)
            fence_accumulators(acc, HALVES * ACC)
            if tid == 0:
                if kt > 0:
                    # the previous K tile's group is complete (in the first K tile of a tile the
                    # previous stage was already handed back at the end of the last tile)
                    T.ptx.mbarrier.arrive(empty.ptr_to([(stage + stages - 1) % stages]))
                if last:
                    T.ptx.mbarrier.arrive(empty.ptr_to([stage]))   # wait_group(0): this one too
                produce()
            cons[0] = cons[0] + 1
            if cons[0] == stages:
                cons[0] = 0
                cons[1] = cons[1] ^ 1

        # prologue: the first stages - 1 loads of this CTA's sequence
        if tid == 0:
            for i in T.unroll(stages - 1):
                produce()

        for t in T.serial(my_tiles):
            tm, tn = T.meta_var(grouped_tile(bx + t * num_sms, TILES_M, TILES_N, group_m))
            for i in T.unroll(HALVES * ACC):
                acc[i] = T.float32(0)
            for kt in T.serial(K_TILES - 1):
                k_step(kt, False)
            k_step(K_TILES - 1, True)
            # epilogue, while the next tile's first loads are already in flight
            if tid == 0:
                T.ptx.cp_async.bulk.wait_group(0)    # the previous tile's store has read Dsmem
            T.cuda.cta_sync()
            acc_to_smem(acc, Dsmem, tid, HALVES, ACC, 0, BLK_N, pair)
            T.ptx.fence.proxy_async("shared::cta")
            T.cuda.cta_sync()
            if tid == 0:
                store_tile(D, Dsmem, tm * BLK_M, tn * BLK_N, BLK_M, BLK_N)
                T.ptx.cp_async.bulk.commit_group()
        if tid == 0:
            T.ptx.cp_async.bulk.wait_group(0)

    return kernel


# ================================================================ step 7: warp specialization

def hopper_step7(M, N, K, num_sms, stages=STAGES, group_m=GROUP_M):
    """Warp specialization: warpgroup 0 is the producer (one thread issues every TMA load; the
    warpgroup gives registers back with setmaxnreg), warpgroup 1 the consumer (wgmma on a
    128 x 128 tile as two m64n128 halves, epilogue; setmaxnreg raises its budget). They meet only
    at the full/empty barriers of the ring, so the producer runs up to ``stages`` K tiles ahead,
    across tile boundaries, while the consumer computes or stores."""
    check_shape(M, N, K)
    assert stages >= 2
    K_TILES = K // BLK_K
    TILES_M, TILES_N = ceildiv(M, BLK_M), ceildiv(N, BLK_N)
    NUM_TILES = TILES_M * TILES_N
    HALVES = BLK_M // WGMMA_M
    ACC = WGMMA_M * BLK_N // 128
    TX_BYTES = (BLK_M + BLK_N) * BLK_K * F16_BYTES
    A_layout = mma_shared_layout(f16, SW128, (stages, BLK_M, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (stages, BLK_N, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (BLK_N // EPI_BOX, BLK_M, EPI_BOX))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16)):
        T.device_entry()
        # one CTA per SM: ptxas then knows the register count at entry (65536 / threads), which
        # setmaxnreg needs (without it: C7508 "setmaxnreg ignored")
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx = T.cta_id([num_sms])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid = T.meta_var(warp_id * 32 + lane_id)         # thread index in its warpgroup

        pool = T.SMEMPool()
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.move_base_to(1024)
        Asmem = pool.alloc((stages, BLK_M, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((stages, BLK_N, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((BLK_N // EPI_BOX, BLK_M, EPI_BOX), f16, layout=D_layout)
        pool.commit()

        if wg_id == 0:
            if tid == 0:
                for s in T.unroll(stages):
                    T.ptx.mbarrier.init(full.ptr_to([s]), 1)    # the producer's expect_tx arrive
                    T.ptx.mbarrier.init(empty.ptr_to([s]), 1)   # the consumer warpgroup's arrive
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()

        my_tiles = T.meta_var((NUM_TILES - bx + num_sms - 1) // num_sms)

        if wg_id == 0:
            # ---------------- producer warpgroup: 40 registers a thread, one thread works
            T.ptx.setmaxnreg(False, PRODUCER_REGS)
            if tid == 0:
                ps = T.alloc_local((2,), "int32")    # ring slot, parity (starts at 1)
                ps[0] = 0
                ps[1] = 1
                for t in T.serial(my_tiles):
                    tm, tn = T.meta_var(grouped_tile(bx + t * num_sms, TILES_M, TILES_N, group_m))
                    for kt in T.serial(K_TILES):
                        stage = T.meta_var(ps[0])
                        T.ptx.mbarrier.try_wait(empty.ptr_to([stage]), ps[1])
                        Tx.copy_async(Asmem[stage, :, :], A[tm * BLK_M:tm * BLK_M + BLK_M, kt * BLK_K:kt * BLK_K + BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                        Tx.copy_async(Bsmem[stage, :, :], B[tn * BLK_N:tn * BLK_N + BLK_N, kt * BLK_K:kt * BLK_K + BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                        T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([stage]), TX_BYTES)
                        ps[0] = ps[0] + 1
                        if ps[0] == stages:
                            ps[0] = 0
                            ps[1] = ps[1] ^ 1
        else:
            # ---------------- consumer warpgroup: 232 registers a thread
            T.ptx.setmaxnreg(True, CONSUMER_REGS)
            acc = T.alloc_local((HALVES * ACC,), f32)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            pair = T.alloc_local((2,), f16)
            cs = T.alloc_local((2,), "int32")        # ring slot, parity (starts at 0)
            cs[0] = 0
            cs[1] = 0

            @T.inline
            def k_step(kt, last):
                stage = T.meta_var(cs[0])
                T.ptx.mbarrier.try_wait(full.ptr_to([stage]), cs[1])
                fence_accumulators(acc, HALVES * ACC)
                T.ptx.wgmma.fence()
                wgmma_k_tile(acc, Asmem, Bsmem, stage, 0, HALVES, BLK_N, desc_a, desc_b)
                T.ptx.wgmma.commit_group()
                if last:
                    T.ptx.wgmma.wait_group(0)
                else:
                    T.ptx.wgmma.wait_group(1)
                fence_accumulators(acc, HALVES * ACC)
                if tid == 0:
                    if kt > 0:
                        T.ptx.mbarrier.arrive(empty.ptr_to([(stage + stages - 1) % stages]))
                    if last:
                        T.ptx.mbarrier.arrive(empty.ptr_to([stage]))
                cs[0] = cs[0] + 1
                if cs[0] == stages:
                    cs[0] = 0
                    cs[1] = cs[1] ^ 1

            for t in T.serial(my_tiles):
                tm, tn = T.meta_var(grouped_tile(bx + t * num_sms, TILES_M, TILES_N, group_m))
                for i in T.unroll(HALVES * ACC):
                    acc[i] = T.float32(0)
                for kt in T.serial(K_TILES - 1):
                    k_step(kt, False)
                k_step(K_TILES - 1, True)
                # epilogue (the producer is already loading the next tile)
                if tid == 0:
                    T.ptx.cp_async.bulk.wait_group(0)    # the previous tile's store has read Dsmem
                T.cuda.warpgroup_sync(EPI_BAR)
                acc_to_smem(acc, Dsmem, tid, HALVES, ACC, 0, BLK_N, pair)
                T.ptx.fence.proxy_async("shared::cta")
                T.cuda.warpgroup_sync(EPI_BAR)
                if tid == 0:
                    store_tile(D, Dsmem, tm * BLK_M, tn * BLK_N, BLK_M, BLK_N)
                    T.ptx.cp_async.bulk.commit_group()
            if tid == 0:
                T.ptx.cp_async.bulk.wait_group(0)

    return kernel


# ================================================================ step 8: two consumers share B

def hopper_step8(M, N, K, num_sms, stages=WS_STAGES, group_m=GROUP_M):
    """A 128 x 256 CTA tile: warpgroup 0 is the producer, warpgroups 1 and 2 are consumers; consumer
    c computes rows 64c .. 64c + 63 of the tile with one m64n256k16 wgmma per k16 step. Both read
    the same B stage (256 x 64), so each byte of B brought in feeds twice the math of step 7, and
    each wgmma is twice as wide. empty[s] now waits for both consumers. Registers: 3 x 128 threads
    start at 168 (65536 / 384); the producer drops to PRODUCER_REGS, the consumers (128 fp32
    accumulators each) rise to CONSUMER_REGS."""
    check_shape(M, N, K)
    assert stages >= 2
    K_TILES = K // BLK_K
    TM, TN = WS_BLK_M, WS_BLK_N
    TILES_M, TILES_N = ceildiv(M, TM), ceildiv(N, TN)
    NUM_TILES = TILES_M * TILES_N
    ACC = WGMMA_M * TN // 128                    # 128 fp32 registers per consumer thread
    TX_BYTES = (TM + TN) * BLK_K * F16_BYTES     # 48 KB per stage
    A_layout = mma_shared_layout(f16, SW128, (stages, TM, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (stages, TN, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (NUM_CONSUMERS, EPI_N // EPI_BOX, WGMMA_M, EPI_BOX))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16)):
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx = T.cta_id([num_sms])
        wg_id = T.warpgroup_id([1 + NUM_CONSUMERS])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid = T.meta_var(warp_id * 32 + lane_id)         # thread index in its warpgroup

        pool = T.SMEMPool()
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.move_base_to(1024)
        Asmem = pool.alloc((stages, TM, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((stages, TN, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((NUM_CONSUMERS, EPI_N // EPI_BOX, WGMMA_M, EPI_BOX), f16, layout=D_layout)
        pool.commit()

        if wg_id == 0:
            if tid == 0:
                for s in T.unroll(stages):
                    T.ptx.mbarrier.init(full.ptr_to([s]), 1)
                    T.ptx.mbarrier.init(empty.ptr_to([s]), NUM_CONSUMERS)   # one arrive per consumer
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()

        my_tiles = T.meta_var((NUM_TILES - bx + num_sms - 1) // num_sms)

        if wg_id == 0:
            # ---------------- producer warpgroup
            T.ptx.setmaxnreg(False, PRODUCER_REGS)
            if tid == 0:
                ps = T.alloc_local((2,), "int32")    # ring slot, parity (starts at 1)
                ps[0] = 0
                ps[1] = 1
                for t in T.serial(my_tiles):
                    tm, tn = T.meta_var(grouped_tile(bx + t * num_sms, TILES_M, TILES_N, group_m))
                    for kt in T.serial(K_TILES):
                        stage = T.meta_var(ps[0])
                        T.ptx.mbarrier.try_wait(empty.ptr_to([stage]), ps[1])
                        Tx.copy_async(Asmem[stage, :, :], A[tm * TM:tm * TM + TM, kt * BLK_K:kt * BLK_K + BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                        Tx.copy_async(Bsmem[stage, :, :], B[tn * TN:tn * TN + TN, kt * BLK_K:kt * BLK_K + BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                        T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([stage]), TX_BYTES)
                        ps[0] = ps[0] + 1
                        if ps[0] == stages:
                            ps[0] = 0
                            ps[1] = ps[1] ^ 1
        else:
            # ---------------- consumer warpgroups 1 and 2: rows 64c .. 64c + 63 of the tile
            T.ptx.setmaxnreg(True, CONSUMER_REGS)
            c = T.meta_var(wg_id - 1)
            acc = T.alloc_local((ACC,), f32)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            pair = T.alloc_local((2,), f16)
            cs = T.alloc_local((2,), "int32")        # ring slot, parity (starts at 0)
            cs[0] = 0
            cs[1] = 0

            @T.inline
            def k_step(kt, last):
                stage = T.meta_var(cs[0])
                T.ptx.mbarrier.try_wait(full.ptr_to([stage]), cs[1])
                fence_accumulators(acc, ACC)
                T.ptx.wgmma.fence()
                wgmma_k_tile(acc, Asmem, Bsmem, stage, WGMMA_M * c, 1, TN, desc_a, desc_b)
                T.ptx.wgmma.commit_group()
                if last:
                    T.ptx.wgmma.wait_group(0)
                else:
                    T.ptx.wgmma.wait_group(1)
                fence_accumulators(acc, ACC)
                if tid == 0:
                    if kt > 0:
                        T.ptx.mbarrier.arrive(empty.ptr_to([(stage + stages - 1) % stages]))
                    if last:
                        T.ptx.mbarrier.arrive(empty.ptr_to([stage]))
                cs[0] = cs[0] + 1
                if cs[0] == stages:
                    cs[0] = 0
                    cs[1] = cs[1] ^ 1

            for t in T.serial(my_tiles):
                tm, tn = T.meta_var(grouped_tile(bx + t * num_sms, TILES_M, TILES_N, group_m))
                for i in T.unroll(ACC):
                    acc[i] = T.float32(0)
                for kt in T.serial(K_TILES - 1):
                    k_step(kt, False)
                k_step(K_TILES - 1, True)
                # epilogue: the 64 x 256 result in TN / EPI_N chunks of 64 x EPI_N through Dsmem[c]
                for h in T.unroll(TN // EPI_N):
                    if tid == 0:
                        T.ptx.cp_async.bulk.wait_group(0)    # the previous store has read Dsmem[c]
                    T.cuda.warpgroup_sync(EPI_BAR + c)
                    acc_to_smem(acc, Dsmem, tid, 1, ACC, h * (EPI_N // 2), EPI_N, pair, (c,))
                    T.ptx.fence.proxy_async("shared::cta")
                    T.cuda.warpgroup_sync(EPI_BAR + c)
                    if tid == 0:
                        for j in T.unroll(EPI_N // EPI_BOX):
                            m0 = T.meta_var(tm * TM + WGMMA_M * c)
                            n0 = T.meta_var(tn * TN + h * EPI_N + j * EPI_BOX)
                            if (m0 < M) & (n0 < N):    # boxes wholly outside D are skipped
                                Tx.copy_async(D[m0:m0 + WGMMA_M, n0:n0 + EPI_BOX], Dsmem[c, j, :, :], dispatch="tma_explicit")
                        T.ptx.cp_async.bulk.commit_group()
            if tid == 0:
                T.ptx.cp_async.bulk.wait_group(0)

    return kernel


# ================================================================ step 9: 2x1 cluster, B multicast

def hopper_step9(M, N, K, num_sms, stages=WS_STAGES, group_m=GROUP_M):
    """Step 8 in clusters of CLUSTER_M = 2 CTAs along M. The two CTAs of a cluster compute the
    128 x 256 tiles (2i, j) and (2i + 1, j): the same 256 columns, so the same B tile. Each CTA
    loads its own A tile and one half (128 rows) of the B tile, and multicasts that half into
    the shared memory of both CTAs (cta_mask 0b11): every B byte leaves L2 once per cluster.

    Barriers: full[s] of each CTA expects its own A bytes and both B halves (one of them is
    delivered by the peer's TMA); empty[s] counts NUM_CONSUMERS x CLUSTER_M arrivals, because the
    multicast into stage s overwrites it in both CTAs: each consumer warpgroup arrives on its own
    CTA's empty[s] and on the peer's. Cluster barriers after the barrier init (the peer's
    barriers must exist before anything arrives on them) and before exit (no remote arrive may
    target a CTA that has left)."""
    check_shape(M, N, K)
    assert stages >= 2 and CLUSTER_M == 2 and num_sms >= CLUSTER_M
    K_TILES = K // BLK_K
    TM, TN = WS_BLK_M, WS_BLK_N
    TILES_M, TILES_N = ceildiv(M, TM), ceildiv(N, TN)
    CL_TILES_M = ceildiv(TILES_M, CLUSTER_M)         # cluster tiles are 256 x 256
    NUM_CL_TILES = CL_TILES_M * TILES_N
    NUM_CLUSTERS = num_sms // CLUSTER_M
    NUM_CTAS = NUM_CLUSTERS * CLUSTER_M
    CL_GROUP = max(1, group_m // CLUSTER_M)          # grouped order over cluster-tile rows
    B_PART = TN // CLUSTER_M                         # B rows each CTA loads and multicasts
    ACC = WGMMA_M * TN // 128
    TX_BYTES = (TM + TN) * BLK_K * F16_BYTES         # own A + both B halves
    A_layout = mma_shared_layout(f16, SW128, (stages, TM, BLK_K))
    B_layout = mma_shared_layout(f16, SW128, (stages, TN, BLK_K))
    D_layout = mma_shared_layout(f16, SW128, (NUM_CONSUMERS, EPI_N // EPI_BOX, WGMMA_M, EPI_BOX))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), f16), B: T.Buffer((N, K), f16), D: T.Buffer((M, N), f16)):
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx = T.cta_id([NUM_CTAS])
        rank = T.cta_id_in_cluster([CLUSTER_M])
        wg_id = T.warpgroup_id([1 + NUM_CONSUMERS])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        tid = T.meta_var(warp_id * 32 + lane_id)
        cluster = T.meta_var(bx // CLUSTER_M)
        peer = T.meta_var(1 - rank)

        pool = T.SMEMPool()
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.move_base_to(1024)
        Asmem = pool.alloc((stages, TM, BLK_K), f16, layout=A_layout)
        Bsmem = pool.alloc((stages, TN, BLK_K), f16, layout=B_layout)
        Dsmem = pool.alloc((NUM_CONSUMERS, EPI_N // EPI_BOX, WGMMA_M, EPI_BOX), f16, layout=D_layout)
        pool.commit()

        if wg_id == 0:
            if tid == 0:
                for s in T.unroll(stages):
                    T.ptx.mbarrier.init(full.ptr_to([s]), 1)
                    T.ptx.mbarrier.init(empty.ptr_to([s]), NUM_CONSUMERS * CLUSTER_M)
        T.ptx.fence.mbarrier_init()
        T.cuda.cluster_sync()                 # both CTAs' barriers exist before any remote use

        my_tiles = T.meta_var((NUM_CL_TILES - cluster + NUM_CLUSTERS - 1) // NUM_CLUSTERS)

        if wg_id == 0:
            # ---------------- producer warpgroup
            T.ptx.setmaxnreg(False, PRODUCER_REGS)
            if tid == 0:
                ps = T.alloc_local((2,), "int32")
                ps[0] = 0
                ps[1] = 1
                for t in T.serial(my_tiles):
                    cm, tn = T.meta_var(grouped_tile(cluster + t * NUM_CLUSTERS, CL_TILES_M, TILES_N, CL_GROUP))
                    # this CTA's tile row; past the last row (odd TILES_M) load the last row's A
                    # again: the peer still needs this CTA's half of B, the result is not stored
                    am = T.meta_var(T.min(cm * CLUSTER_M + rank, TILES_M - 1) * TM)
                    # my half of the B tile; a half wholly below B (the N edge) loads rows 0..:
                    # the columns it feeds are outside D and never stored
                    bn = T.meta_var(T.Select(tn * TN + rank * B_PART < N, tn * TN + rank * B_PART, 0))
                    for kt in T.serial(K_TILES):
                        stage = T.meta_var(ps[0])
                        # empty in both CTAs: this CTA's empty[s] counts the peer's consumers too
                        T.ptx.mbarrier.try_wait(empty.ptr_to([stage]), ps[1])
                        T.ptx.mbarrier.arrive.expect_tx(full.ptr_to([stage]), TX_BYTES)
                        Tx.copy_async(Asmem[stage, :, :], A[am:am + TM, kt * BLK_K:kt * BLK_K + BLK_K],
                                      dispatch="tma_auto", cta_group=1, mbar=full.ptr_to([stage]))
                        # my half of B, into both CTAs, signalling full[stage] in both
                        Tx.copy_async(Bsmem[stage, rank * B_PART:rank * B_PART + B_PART, :],
                                      B[bn:bn + B_PART, kt * BLK_K:kt * BLK_K + BLK_K],
                                      dispatch="tma_auto", cta_group=1, cta_mask=(1 << CLUSTER_M) - 1,
                                      mbar=full.ptr_to([stage]))
                        ps[0] = ps[0] + 1
                        if ps[0] == stages:
                            ps[0] = 0
                            ps[1] = ps[1] ^ 1
        else:
            # ---------------- consumer warpgroups 1 and 2
            T.ptx.setmaxnreg(True, CONSUMER_REGS)
            c = T.meta_var(wg_id - 1)
            acc = T.alloc_local((ACC,), f32)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            pair = T.alloc_local((2,), f16)
            cs = T.alloc_local((2,), "int32")
            cs[0] = 0
            cs[1] = 0

            @T.inline
            def release(stage):
                # stage `stage` is read: tell both CTAs' producers (both multicast into it)
                T.ptx.mbarrier.arrive(empty.ptr_to([stage]))
                T.ptx.mbarrier.arrive(empty.ptr_to([stage]), remote=peer)

            @T.inline
            def k_step(kt, last):
                stage = T.meta_var(cs[0])
                T.ptx.mbarrier.try_wait(full.ptr_to([stage]), cs[1])
                fence_accumulators(acc, ACC)
                T.ptx.wgmma.fence()
                wgmma_k_tile(acc, Asmem, Bsmem, stage, WGMMA_M * c, 1, TN, desc_a, desc_b)
                T.ptx.wgmma.commit_group()
                if last:
                    T.ptx.wgmma.wait_group(0)
                else:
                    T.ptx.wgmma.wait_group(1)
                fence_accumulators(acc, ACC)
                if tid == 0:
                    if kt > 0:
                        release((stage + stages - 1) % stages)
                    if last:
                        release(stage)
                cs[0] = cs[0] + 1
                if cs[0] == stages:
                    cs[0] = 0
                    cs[1] = cs[1] ^ 1

            for t in T.serial(my_tiles):
                cm, tn = T.meta_var(grouped_tile(cluster + t * NUM_CLUSTERS, CL_TILES_M, TILES_N, CL_GROUP))
                tm = T.meta_var(cm * CLUSTER_M + rank)
                for i in T.unroll(ACC):
                    acc[i] = T.float32(0)
                for kt in T.serial(K_TILES - 1):
                    k_step(kt, False)
                k_step(K_TILES - 1, True)
                for h in T.unroll(TN // EPI_N):
                    if tid == 0:
                        T.ptx.cp_async.bulk.wait_group(0)
                    T.cuda.warpgroup_sync(EPI_BAR + c)
                    acc_to_smem(acc, Dsmem, tid, 1, ACC, h * (EPI_N // 2), EPI_N, pair, (c,))
                    T.ptx.fence.proxy_async("shared::cta")
                    T.cuda.warpgroup_sync(EPI_BAR + c)
                    if tid == 0:
                        if tm < TILES_M:               # the spare CTA of an odd last row stores nothing
                            for j in T.unroll(EPI_N // EPI_BOX):
                                m0 = T.meta_var(tm * TM + WGMMA_M * c)
                                n0 = T.meta_var(tn * TN + h * EPI_N + j * EPI_BOX)
                                if (m0 < M) & (n0 < N):
                                    Tx.copy_async(D[m0:m0 + WGMMA_M, n0:n0 + EPI_BOX], Dsmem[c, j, :, :], dispatch="tma_explicit")
                        T.ptx.cp_async.bulk.commit_group()
            if tid == 0:
                T.ptx.cp_async.bulk.wait_group(0)
        T.cuda.cluster_sync()                 # no CTA leaves while its peer may still arrive on it

    return kernel

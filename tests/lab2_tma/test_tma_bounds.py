"""What TMA does with a box that lies wholly outside its tensor, a question the lectures leave open
(a persistent kernel's last tiles may fall there). The GPU test checks the expectation: a load of
such a box delivers its whole byte count, so the barrier's phase completes, and fills the tile
with zeros; a store of such a box writes nothing. A lecture may state it once this test has
passed on the course's GPUs."""
import pytest
import torch
from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode, mma_shared_layout
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

ROWS, COLS, THREADS = 64, 64, 128          # fp16 tiles of 64 x 64: 128-byte rows, one 2D box
TILE_BYTES = ROWS * COLS * 2
PER_THREAD = ROWS * COLS // 8 // THREADS   # 16-byte chunks per thread
SWZ = mma_shared_layout("float16", SwizzleMode.SWIZZLE_128B_ATOM, (ROWS, COLS))


def build_probe(M, N):
    """One CTA: TMA-load the box at rows [load_row, load_row + 64) of X into shared memory, add 1
    to every element, TMA-store the tile at rows [store_row, store_row + 64) of OUT."""

    @T.prim_func
    def probe(x_ptr: T.handle, out_ptr: T.handle, load_row: T.int32, store_row: T.int32):
        X = T.match_buffer(x_ptr, (M, N), "float16")
        OUT = T.match_buffer(out_ptr, (M, N), "float16")
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        v = T.alloc_local((8 * PER_THREAD,), "float16")
        pool = T.SMEMPool()
        landed = pool.alloc((1,), "uint64", align=8)
        pool.move_base_to(1024)
        tile = pool.alloc((ROWS, COLS), "float16", layout=SWZ)
        pool.commit()
        if tid == 0:
            T.ptx.mbarrier.init(landed.ptr_to([0]), 1)
        T.ptx.fence.mbarrier_init()
        T.cuda.cta_sync()
        if tid == 0:
            T.ptx.mbarrier.arrive.expect_tx(landed.ptr_to([0]), TILE_BYTES)
            Tx.copy_async(tile[:, :], X[load_row:load_row + ROWS, 0:COLS],
                          dispatch="tma_auto", cta_group=1, mbar=landed.ptr_to([0]))
        T.ptx.mbarrier.try_wait(landed.ptr_to([0]), 0)
        for i in T.unroll(PER_THREAD):
            q = T.meta_var(i * THREADS + tid)
            Tx.copy(v[i * 8:i * 8 + 8], tile[q // (COLS // 8), q % (COLS // 8) * 8:q % (COLS // 8) * 8 + 8])
        for e in T.unroll(8 * PER_THREAD):
            v[e] = T.Cast("float16", T.Cast("float32", v[e]) + T.float32(1))
        for i in T.unroll(PER_THREAD):
            q = T.meta_var(i * THREADS + tid)
            Tx.copy(tile[q // (COLS // 8), q % (COLS // 8) * 8:q % (COLS // 8) * 8 + 8], v[i * 8:i * 8 + 8])
        T.ptx.fence.proxy_async("shared::cta")
        T.cuda.cta_sync()
        if tid == 0:
            Tx.copy_async(OUT[store_row:store_row + ROWS, 0:COLS], tile[:, :], dispatch="tma_auto")
            T.ptx.cp_async.bulk.commit_group()
            T.ptx.cp_async.bulk.wait_group(0, read=False)

    return probe


def test_the_probe_builds_for_both_tracks():
    from grader import build
    for arch in ("sm_90a", "sm_100a"):
        art = build.compile_only(build_probe(256, 64), arch, want_sass=True)
        assert "UTMALDG" in art.sass and "UTMASTG" in art.sass


@pytest.mark.gpu
def test_a_box_wholly_outside_the_tensor_loads_zeros_and_stores_nothing(device):
    from grader.notebook import compile_kernel
    M, N = 256, 64
    kernel = compile_kernel(build_probe(M, N))
    x = torch.randn(M, N, device="cuda").half()
    for load_row in (M, M + 1000, -ROWS, -5000):          # past the end, and before the start
        space = torch.full((M + 2 * ROWS, N), float("nan"), device="cuda", dtype=torch.float16)
        out = space[ROWS:ROWS + M]                          # guard rows on both sides
        kernel(x, out, load_row, 0)                         # returns: the phase completed
        torch.cuda.synchronize()
        assert torch.equal(out[:ROWS], torch.ones(ROWS, N, device="cuda", dtype=torch.float16)), load_row
        assert out[ROWS:].isnan().all() and space[:ROWS].isnan().all() and space[ROWS + M:].isnan().all()
    for store_row in (M, M + 1000, -ROWS, -5000):
        space = torch.full((M + 2 * ROWS, N), float("nan"), device="cuda", dtype=torch.float16)
        out = space[ROWS:ROWS + M]
        kernel(x, out, 0, store_row)
        torch.cuda.synchronize()
        assert space.isnan().all(), store_row              # nothing written, in or around the tensor
    space = torch.full((M + 2 * ROWS, N), float("nan"), device="cuda", dtype=torch.float16)
    out = space[ROWS:ROWS + M]
    kernel(x, out, M - 16, M - 16)                           # a box that hangs over the end: the control
    torch.cuda.synchronize()
    assert torch.equal(out[M - 16:], (x[M - 16:].float() + 1).half()) and space[ROWS + M:].isnan().all()

"""Grading functions of Lab 5 (pipelined, warp-specialized GEMM), CPU parts. Contract with the
notebook (the notebook's markdown states every rule these functions apply):

- Part a, the ring of a persistent CTA:
  ``persistent_waits(stages, k_tiles, cta, grid, num_tiles) -> list`` of
  ``(tile, k, stage, empty_parity, full_parity)``, one per load the CTA issues, in issue order
  (CTA ``cta`` of a persistent grid of ``grid`` CTAs computes tiles ``cta, cta + grid, ...`` below
  ``num_tiles``, ``k_tiles`` loads each; the load counter runs on across its tiles), and
  ``ring_run(stages, loads, producer_start, consumer_start) -> dict`` with keys
  ``producer_stuck``, ``consumer_stuck`` (the load index at which that side waits forever, or
  None) and ``early`` (the sorted list of ``(side, load)`` whose wait returned before the event it
  stands for), from a fixed round-by-round simulation of one producer and one consumer.
- Part b, registers: ``setmaxnreg_plan(roles, launch_regs, producer_need) -> dict | None``:
  ``{"producer": ("dec", p), "consumer": ("inc", c)}`` with ``p`` the smallest legal setmaxnreg
  count that covers ``producer_need`` and ``c`` the largest legal count every consumer warpgroup
  can take from the CTA's pool; None when the kernel cannot be compiled or launched for
  ``launch_regs``, when ``p`` is above the registers a thread holds, or when ``c`` is not above
  them (the notebook states the hardware facts, not this procedure). ``accumulator_fit(block_m, block_n, consumers,
  regs, headroom) -> dict`` with keys ``acc_regs`` (fp32 accumulator registers per consumer
  thread), ``wgmmas_per_k16`` (m64nN instructions per consumer and k16 step) and ``fits``.
- Part c, the tile scheduler: ``grouped_tile(t, m_tiles, n_tiles, group) -> (m, n)`` (grouped
  order, m fastest inside a group of ``group`` tile rows, the last group possibly short) and
  ``dram_bytes(M, N, K, blk_m, blk_n, group, ctas, l2_bytes) -> {"row_major": int, "grouped": int}``
  (fp16 A and B bytes read from DRAM under the wave model of the notebook).
- Part d, clusters: ``multicast_plan(cm, cn, rank, blk_m, blk_n) -> dict`` with keys ``a_mask``,
  ``b_mask`` (16-bit CTA masks of the CTA's A and B slices), ``a_rows``, ``b_rows`` (the
  ``[start, stop)`` rows of the A and B tiles that this CTA loads), for a cluster of ``cm`` CTAs
  along M by ``cn`` along N, rank = i + cm * j for the CTA at (i, j); and ``stage_counts(cm, cn,
  blk_m, blk_n, blk_k, dtype_bytes, consumers) -> dict`` with keys ``expect_tx`` (bytes each CTA's
  full barrier expects per stage), ``issued`` (bytes of TMA loads each CTA issues per stage) and
  ``empty_arrivals`` (the arrival count of each CTA's empty barriers).

Every answer is compared exactly (after ``compare.normalize``: tuples and lists alike).

The kernels: ``hopper_step5(M, N, K)``, ``hopper_step6..9(M, N, K, num_sms)`` (sm_90a, wgmma) and
``blackwell_step5(M, N, K)``, ``blackwell_step6..9(M, N, K, num_sms)`` (sm_100a, tcgen05) ->
PrimFunc computing D = A @ B.T (the problem ``gemm`` of grader/problems.py), called as
``kernel(A, B, D)``. K is a multiple of 64; the Hopper kernels take M and N any multiple of 8, the
Blackwell ones multiples of 128. Build parts (``grading.build_part``) and kernel parts (the
default runners) need no code here. The SASS part compiles the Hopper kernels, persistent ones
for the arch's reference GPU, and checks them with Lab 4's accumulator-hazard scan.
"""
from __future__ import annotations

from .. import grading, inputs
from ..context import Context
from . import build_checks
from .lab4_gemm import ref_desc_fields, relative_places

LAB = "lab5_gemm_pipeline"

# Hardware facts used by part b (H100/H200, sm_90a; the same on B200).
WARPGROUP = 128                  # threads of a warpgroup
SM_REGISTERS = 65536             # 32-bit registers in one SM's register file
MAX_THREAD_REGS = 255            # most registers a kernel can be compiled with, per thread
REG_STEP = 8                     # registers are handed to a warp 256 at a time: 8 per thread
SETMAXNREG_RANGE = (24, 256)     # setmaxnreg counts: multiples of 8 in this range (PTX ISA)
F16_BYTES = 2


# ---------------------------------------------------------------- reference answers: part a

def ref_persistent_waits(stages: int, k_tiles: int, cta: int, grid: int, num_tiles: int) -> list:
    out, g = [], 0
    for tile in range(cta, num_tiles, grid):
        for k in range(k_tiles):
            rnd = g // stages                    # completed trips around the ring before load g
            out.append((tile, k, g % stages, (rnd + 1) % 2, rnd % 2))
            g += 1
    return out


def ref_ring_run(stages: int, loads: int, producer_start: int, consumer_start: int) -> dict:
    full, empty = [0] * stages, [0] * stages     # completed phases of each barrier
    p = c = 0                                    # next load of the producer, of the consumer
    early = []
    moved = True
    while moved:
        moved = False
        while p < loads:                         # the producer goes as far as it can
            s, r = p % stages, p // stages
            if empty[s] % 2 == (producer_start + r) % 2:
                break                            # the phase of that parity is still open
            if empty[s] < r:                     # the consumer has not released load p - S
                early.append(("producer", p))
            full[s] += 1                         # load p lands at once in this model
            p, moved = p + 1, True
        while c < loads:                         # then the consumer
            s, r = c % stages, c // stages
            if full[s] % 2 == (consumer_start + r) % 2:
                break
            if full[s] < r + 1:                  # load c has not landed yet
                early.append(("consumer", c))
            empty[s] += 1
            c, moved = c + 1, True
    return {"producer_stuck": p if p < loads else None, "consumer_stuck": c if c < loads else None,
            "early": sorted(early)}


# ---------------------------------------------------------------- reference answers: part b

def _held(launch_regs: int) -> int:
    return -(-launch_regs // REG_STEP) * REG_STEP


def ref_setmaxnreg_plan(roles, launch_regs: int, producer_need: int) -> dict | None:
    if launch_regs > MAX_THREAD_REGS:
        return None
    held = _held(launch_regs)
    pool = WARPGROUP * len(roles) * held
    lo, hi = SETMAXNREG_RANGE
    producer = max(lo, _held(producer_need))
    if pool > SM_REGISTERS or producer > held:
        return None
    left = pool - WARPGROUP * roles.count("producer") * producer
    consumer = min(hi, left // (WARPGROUP * roles.count("consumer")) // REG_STEP * REG_STEP)
    if consumer <= held:
        return None
    return {"producer": ("dec", producer), "consumer": ("inc", consumer)}


def ref_accumulator_fit(block_m: int, block_n: int, consumers: int, regs: int, headroom: int) -> dict:
    rows = block_m // consumers                  # rows of the tile one consumer warpgroup owns
    acc = rows * block_n // WARPGROUP
    return {"acc_regs": acc, "wgmmas_per_k16": rows // 64, "fits": acc + headroom <= regs}


# ---------------------------------------------------------------- reference answers: part c

def ref_grouped_tile(t: int, m_tiles: int, n_tiles: int, group: int) -> tuple[int, int]:
    span = group * n_tiles                       # tiles of one full group
    g = t // span
    first = g * group
    rows = min(group, m_tiles - first)           # the last group may be short
    w = t - g * span
    return (first + w % rows, w // rows)


def ref_dram_bytes(M: int, N: int, K: int, blk_m: int, blk_n: int, group: int, ctas: int,
                   l2_bytes: int) -> dict:
    mt, nt = M // blk_m, N // blk_n
    pa, pb = blk_m * K * F16_BYTES, blk_n * K * F16_BYTES

    def total(order) -> int:
        out = 0
        for w0 in range(0, mt * nt, ctas):
            tiles = [order(t) for t in range(w0, min(w0 + ctas, mt * nt))]
            ms, ns = {m for m, _ in tiles}, {n for _, n in tiles}
            working = len(ms) * pa + len(ns) * pb
            out += working if working <= l2_bytes else len(tiles) * (pa + pb)
        return out

    return {"row_major": total(lambda t: divmod(t, nt)),
            "grouped": total(lambda t: ref_grouped_tile(t, mt, nt, group))}


# ---------------------------------------------------------------- reference answers: part d

def ref_multicast_plan(cm: int, cn: int, rank: int, blk_m: int, blk_n: int) -> dict:
    i, j = rank % cm, rank // cm
    return {"a_mask": sum(1 << (i + cm * jj) for jj in range(cn)),      # same rows of D: same A
            "b_mask": sum(1 << (ii + cm * j) for ii in range(cm)),      # same columns: same B
            "a_rows": (j * blk_m // cn, (j + 1) * blk_m // cn),
            "b_rows": (i * blk_n // cm, (i + 1) * blk_n // cm)}


def ref_stage_counts(cm: int, cn: int, blk_m: int, blk_n: int, blk_k: int, dtype_bytes: int,
                     consumers: int) -> dict:
    return {"expect_tx": (blk_m + blk_n) * blk_k * dtype_bytes,
            "issued": (blk_m // cn + blk_n // cm) * blk_k * dtype_bytes,
            "empty_arrivals": (cm + cn - 1) * consumers}


# ---------------------------------------------------------------- comparison and the cases

_hidden = grading.hidden_count


# ---------------------------------------------------------------- part a: the ring

def ring_cases(ctx: Context) -> list[tuple]:
    cases = [("waits", (2, 5, 0, 1, 1)),          # one tile, the book's two-stage trace
             ("waits", (4, 6, 0, 132, 300)),      # three tiles, 18 loads: the counter runs on
             ("waits", (4, 6, 131, 132, 300)),
             ("waits", (3, 4, 1, 4, 10)),
             ("waits", (4, 8, 1, 2, 5)),          # k_tiles = 2 S: a reset per tile would do
             ("waits", (1, 3, 0, 2, 4)),
             ("waits", (2, 3, 5, 8, 4)),          # more CTAs than tiles: no load at all
             ("run", (4, 8, 1, 0)), ("run", (4, 8, 0, 0)), ("run", (2, 4, 1, 1)),
             ("run", (2, 4, 0, 1)), ("run", (3, 2, 1, 1)), ("run", (1, 5, 1, 0)),
             ("run", (1, 5, 0, 1)), ("run", (4, 1, 0, 0)), ("run", (3, 7, 1, 0))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        if i % 2 == 0:
            stages, k_tiles, grid = r.randint(1, 8), r.randint(1, 12), r.randint(1, 16)
            num_tiles = r.randint(1, 4 * grid)
            cases.append(("waits", (stages, k_tiles, r.randrange(grid), grid, num_tiles)))
        else:
            cases.append(("run", (r.randint(1, 8), r.randint(1, 30), r.randint(0, 1), r.randint(0, 1))))
    return cases




# ---------------------------------------------------------------- part b: registers

WS = ["producer", "consumer", "consumer"]


def regs_cases(ctx: Context) -> list[tuple]:
    cases = [("plan", (WS, 168, 40)),                       # the kernels' plan: the pool used exactly
             ("plan", (WS, 162, 40)),                       # 162 registers hold 168
             ("plan", (WS, 168, 20)),                       # no count below 24
             ("plan", (WS, 168, 33)),                       # a need between multiples of 8
             ("plan", (WS, 176, 40)),                       # the CTA cannot launch
             ("plan", (WS, 168, 170)),                      # the producer would have to grow
             ("plan", (["producer", "consumer"], 240, 24)),   # capped at 256
             ("plan", (["producer", "consumer"], 256, 24)),   # no kernel with 256 per thread
             ("plan", (["producer", "consumer", "consumer", "consumer"], 128, 24)),
             ("plan", (["consumer", "producer", "consumer"], 96, 56)),
             ("plan", (["producer", "producer", "consumer"], 168, 168)),   # nothing to gain
             ("fit", (128, 256, 2, 232, 32)), ("fit", (128, 256, 1, 232, 32)),
             ("fit", (128, 128, 1, 168, 32)), ("fit", (256, 128, 2, 232, 32)),
             ("fit", (64, 256, 1, 240, 24)), ("fit", (192, 256, 3, 160, 32)),
             ("fit", (256, 256, 2, 256, 16))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        if i % 2 == 0:
            roles = ["producer"] * r.choice([1, 1, 1, 2]) + ["consumer"] * r.randint(1, 3)
            r.shuffle(roles)
            w = len(roles)
            spare = SM_REGISTERS // (WARPGROUP * w) // REG_STEP * REG_STEP   # the most a thread can launch with
            launch = min(MAX_THREAD_REGS + r.choice([0, 0, 0, 1]),
                         r.choice([spare, spare, spare - r.randint(1, 60), r.randint(24, spare + 16)]))
            need = r.choice([24, 32, 40, r.randint(1, 64), r.randint(20, 200)])
            cases.append(("plan", (roles, launch, need)))
        else:
            consumers = r.randint(1, 4)
            block_m = 64 * consumers * r.randint(1, 2)
            cases.append(("fit", (block_m, 8 * r.randint(1, 32), consumers, 8 * r.randint(3, 32),
                                  r.choice([0, 16, 24, 32, 40]))))
    return cases


# ---------------------------------------------------------------- part c: the tile scheduler

MIB = 1 << 20


def sched_cases(ctx: Context) -> list[tuple]:
    cases = [("tile", (t, 4, 4, 2)) for t in (0, 1, 2, 5, 8, 9, 14, 15)]
    cases += [("tile", (t, 5, 3, 2)) for t in range(15)]          # a short last group (one row)
    cases += [("tile", (t, 3, 4, 8)) for t in (0, 2, 3, 11)]      # one group, shorter than G
    cases += [("tile", (t, 7, 5, 3)) for t in (0, 4, 14, 15, 29, 30, 31, 34)]
    cases += [("tile", (t, 32, 32, 8)) for t in (7, 131, 256, 1023)]
    cases += [("tile", (t, 4, 6, 1)) for t in (5, 6, 23)]         # G = 1 is row-major
    cases += [("bytes", (512, 512, 256, 128, 128, 2, 4, 4 * MIB)),
              ("bytes", (512, 512, 256, 128, 128, 2, 4, 256 << 10)),
              ("bytes", (640, 384, 128, 128, 128, 2, 4, 4 * MIB)),      # a short last group and wave
              ("bytes", (4096, 4096, 4096, 128, 128, 8, 132, 50 * MIB)),
              ("bytes", (4096, 4096, 8192, 128, 128, 8, 132, 50 * MIB)),
              ("bytes", (8192, 8192, 8192, 128, 256, 8, 132, 50 * MIB)),
              ("bytes", (2048, 6144, 1024, 128, 128, 4, 132, 50 * MIB)),
              ("bytes", (6144, 2048, 2048, 128, 128, 16, 132, 50 * MIB)),
              ("bytes", (4096, 4096, 4096, 128, 128, 1, 132, 50 * MIB))]    # G = 1: no difference
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        if i % 3 == 0:
            mt, nt, g = r.randint(1, 40), r.randint(1, 40), r.randint(1, 12)
            cases.append(("tile", (r.randrange(mt * nt), mt, nt, g)))
        else:
            bm, bn = r.choice([64, 128, 256]), r.choice([64, 128, 256])
            M, N, K = bm * r.randint(1, 40), bn * r.randint(1, 40), 64 * r.randint(1, 128)
            cases.append(("bytes", (M, N, K, bm, bn, r.randint(1, 16), r.choice([8, 66, 114, 132, 148]),
                                    r.choice([4, 16, 40, 50, 60]) * MIB)))
    return cases




# ---------------------------------------------------------------- part d: clusters

def cluster_cases(ctx: Context) -> list[tuple]:
    cases = [("plan", (cm, cn, rank, 128, 128)) for cm, cn in ((2, 1), (1, 2), (2, 2)) for rank in range(cm * cn)]
    cases += [("plan", (4, 2, 5, 128, 256)), ("plan", (1, 4, 3, 128, 256)), ("plan", (1, 1, 0, 128, 256)),
              ("plan", (2, 4, 6, 256, 128)), ("plan", (4, 4, 15, 128, 128))]
    cases += [("counts", (1, 1, 128, 256, 64, 2, 2)), ("counts", (2, 1, 128, 256, 64, 2, 2)),
              ("counts", (2, 2, 128, 128, 64, 2, 1)), ("counts", (1, 2, 128, 128, 64, 2, 1)),
              ("counts", (4, 2, 256, 128, 64, 2, 2)), ("counts", (2, 1, 128, 128, 128, 1, 1))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        cm, cn = r.choice([(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4), (8, 1), (4, 4)])
        bm, bn = r.choice([64, 128, 256]), r.choice([64, 128, 256])
        if i % 2 == 0:
            cases.append(("plan", (cm, cn, r.randrange(cm * cn), bm, bn)))
        else:
            cases.append(("counts", (cm, cn, bm, bn, r.choice([32, 64, 128]), r.choice([1, 2, 4]), r.randint(1, 3))))
    return cases




# ---------------------------------------------------------------- the wgmma accumulator hazard

QUESTIONS = {   # CPU questions declared as data: graded by grading.grade_question (grader/dispatch.py)
    "a_ring": grading.Question(
        ring_cases,
        answers={"waits": ref_persistent_waits, "run": ref_ring_run},
        params={"waits": ("stages", "k_tiles", "cta", "grid", "num_tiles"),
                "run": ("stages", "loads", "producer_start", "consumer_start")}),
    "b_regs": grading.Question(
        regs_cases,
        answers={"plan": ref_setmaxnreg_plan, "fit": ref_accumulator_fit},
        params={"plan": ("roles", "launch_regs", "producer_need"),
                "fit": ("block_m", "block_n", "consumers", "regs", "headroom")}),
    "c_sched": grading.Question(
        sched_cases,
        answers={"tile": ref_grouped_tile, "bytes": ref_dram_bytes},
        params={"tile": ("t", "m_tiles", "n_tiles", "group"),
                "bytes": ("M", "N", "K", "blk_m", "blk_n", "group", "ctas", "l2_bytes")}),
    "d_cluster": grading.Question(
        cluster_cases,
        answers={"plan": ref_multicast_plan, "counts": ref_stage_counts},
        params={"plan": ("cm", "cn", "rank", "blk_m", "blk_n"),
                "counts": ("cm", "cn", "blk_m", "blk_n", "blk_k", "dtype_bytes", "consumers")}),
}

# The operand tiles of the Hopper steps' wgmma descriptors (the check "wgmma_desc_fields"): A and B
# both K-major, one 128-byte swizzle atom wide (the LBO is not read). Course grader only.
DESC_FIELDS = {f"s{step}_build_sm90": [("A and B (K-major)", (None,) + ref_desc_fields(128)[1:])]
               for step in (5, 6, 7, 8, 9)}

# Where the epilogue puts each accumulator register (the check "wgmma_epilogue_places"), followed
# through the shared tile and the TMA stores that read it, whatever the tile's layout and boxes.
# The kernels are the student's from end to end (grid order, tile schedule, which consumer holds
# which rows), so the check asks what holds for every design: each wgmma's registers keep the
# fragment's shape, and together a CTA's threads cover one whole tile (128 x 128 in steps 5-7,
# 128 x 256 in steps 8 and 9) once. Which tile is for the correctness parts. Step 5 on two CTAs of
# its grid, the persistent steps on CTA 0 (one tile at the build shape); the accumulator is held by
# warpgroup 0 in steps 5 and 6, by warpgroup 1 in step 7, by warpgroups 1 and 2 in steps 8 and 9.
# Course grader only.
def _places(part_id: str, tile_n: int, first: int, threads: int, blocks=((0, 0),)):
    from .. import spec
    return relative_places(spec.load(LAB).part(part_id).params["N"], (128, tile_n), blocks, "tma_store", first, threads)


ACC_PLACES = {"s5_build_sm90": _places("s5_build_sm90", 128, 0, 128, ((0, 0), (0, 1))),
              "s6_build_sm90": _places("s6_build_sm90", 128, 0, 128),
              "s7_build_sm90": _places("s7_build_sm90", 128, 128, 128),
              "s8_build_sm90": _places("s8_build_sm90", 256, 128, 256),
              "s9_build_sm90": _places("s9_build_sm90", 256, 128, 256)}

GRADERS = {
    "sass_hazard": build_checks.accumulator_hazard,
    # s5..s9_build_sm90/_sm100: grading.build_part; s5..s9_correct and the speed parts: problem
    # "gemm" (grader/problems.py), graded by grader/runners.py with the builder of the GPU's track
}

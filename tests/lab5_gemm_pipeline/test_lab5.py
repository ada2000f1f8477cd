"""Lab 5. CPU parts: the reference answers against hand-worked cases, and deliberately wrong answers
lose points (tests/<lab>/test_labN_every_part.py checks that the solution passes and the student version
scores zero). Wrong functions are graded in this process by the lab's own grading functions, with
the hidden cases; one test grades an edited notebook through the sandbox (conftest.grade_in_process).
Kernels (steps 5-9): the spec's shapes and thresholds against what the kernels take and what was
measured, the runner's per-track shapes, edited kernels that lose their build part or the SASS
check, and (on a GPU) edited kernels whose barriers never complete."""
import dataclasses
import json
import math
import os
import random
import types

import pytest
from conftest import grade_in_process, import_notebook

from grader import hardware, inputs, problems, report, runners, spec, verdict
from grader.context import Context
from grader.labs import lab5_gemm_pipeline as L

LAB = "lab5_gemm_pipeline"
LAB_SPEC = spec.load(LAB)
SOLUTION = ("solutions", LAB, "lab5_gemm_pipeline.ipynb")
CPU_PARTS = [p.id for p in LAB_SPEC.parts if p.kind == "function"]
MIB = 1 << 20
WS = ["producer", "consumer", "consumer"]


# ---------------------------------------------------------------- part a: hand-worked

def test_one_tile_two_stages_is_the_books_trace():
    assert L.ref_persistent_waits(2, 5, 0, 1, 1) == [
        (0, 0, 0, 1, 0), (0, 1, 1, 1, 0), (0, 2, 0, 0, 1), (0, 3, 1, 0, 1), (0, 4, 0, 1, 0)]


def test_the_load_counter_runs_on_across_the_tiles_of_a_cta():
    waits = L.ref_persistent_waits(4, 6, 0, 132, 300)
    assert [w[0] for w in waits] == [0] * 6 + [132] * 6 + [264] * 6
    # the second tile starts at load 6: stage 2, after 6 // 4 = 1 trip around the ring
    assert waits[6] == (132, 0, 2, 0, 1)
    # the third tile starts at load 12: stage 0, 12 // 4 = 3 trips
    assert waits[12] == (264, 0, 0, 0, 1)
    assert L.ref_persistent_waits(4, 6, 131, 132, 300)[6] == (263, 0, 2, 0, 1)
    assert L.ref_persistent_waits(2, 3, 5, 8, 4) == []


@pytest.mark.parametrize("stages, k_tiles", [(2, 4), (4, 8), (3, 6), (2, 3), (4, 6), (3, 3), (1, 1)])
def test_restarting_per_tile_is_right_only_for_a_multiple_of_2s(stages, k_tiles):
    waits = L.ref_persistent_waits(stages, k_tiles, 0, 1, 3)
    first = [w[2:] for w in waits[:k_tiles]]
    same = all([w[2:] for w in waits[j * k_tiles:(j + 1) * k_tiles]] == first for j in range(3))
    assert same == (k_tiles % (2 * stages) == 0)


def test_ring_run_conventions():
    clean = {"producer_stuck": None, "consumer_stuck": None, "early": []}
    for stages in (1, 2, 4, 7):
        for loads in (1, 3, 10, 29):
            assert L.ref_ring_run(stages, loads, 1, 0) == clean
            # both at 0: each waits for the other at load 0
            assert L.ref_ring_run(stages, loads, 0, 0) == {"producer_stuck": 0, "consumer_stuck": 0, "early": []}
    # both at 1: the producer fills the ring, the consumer waits for a second phase of full[0]
    assert L.ref_ring_run(2, 4, 1, 1) == {"producer_stuck": 2, "consumer_stuck": 0, "early": []}
    assert L.ref_ring_run(3, 2, 1, 1) == {"producer_stuck": None, "consumer_stuck": 0, "early": []}
    # consumer at 1: nothing hangs, and every read is one trip early
    assert L.ref_ring_run(2, 4, 0, 1) == {"producer_stuck": None, "consumer_stuck": None,
                                          "early": [("consumer", g) for g in range(4)]}


# ---------------------------------------------------------------- part b: hand-worked

def _plan(p, c):
    return {"producer": ("dec", p), "consumer": ("inc", c)}


@pytest.mark.parametrize("roles, launch, need, expected", [
    (WS, 168, 40, _plan(40, 232)),                     # 3 x 128 x 168 = 40 + 2 x 232: the kernels' plan
    (WS, 162, 40, _plan(40, 232)),                     # 162 registers hold 168
    (WS, 168, 33, _plan(40, 232)),                     # a need rounds up to a multiple of 8
    (WS, 168, 8, _plan(24, 240)),                      # no count below 24
    (WS, 160, 24, _plan(24, 228 // 8 * 8)),            # (3 x 160 - 24) / 2 = 228: down to 224
    (WS, 176, 40, None),                               # 3 x 128 x 176 > 65536: no launch
    (WS, 168, 176, None),                              # the producer cannot grow with a .dec
    (["producer", "consumer"], 240, 24, _plan(24, 256)),   # 456 left, but at most 256
    (["producer", "consumer"], 256, 24, None),         # no kernel is compiled for 256
    (["producer", "producer", "consumer"], 168, 168, None),   # the consumer gains nothing
    (["consumer", "producer", "consumer", "consumer"], 128, 24, _plan(24, 160)),
])
def test_setmaxnreg_plans(roles, launch, need, expected):
    assert L.ref_setmaxnreg_plan(roles, launch, need) == expected


def test_accumulators_of_one_and_two_consumers():
    assert L.ref_accumulator_fit(128, 256, 2, 232, 32) == {"acc_regs": 128, "wgmmas_per_k16": 1, "fits": True}
    assert L.ref_accumulator_fit(128, 256, 1, 240, 32) == {"acc_regs": 256, "wgmmas_per_k16": 2, "fits": False}
    assert L.ref_accumulator_fit(128, 128, 1, 168, 32)["acc_regs"] == 128       # Lab 4's kernel
    assert L.ref_accumulator_fit(192, 256, 3, 160, 32)["fits"]                  # exactly at the limit


# ---------------------------------------------------------------- part c: hand-worked

def test_grouped_order_tables():
    # TVM's ClusterPersistentScheduler2D docstring, 4 x 4 tiles, l2_group_size 2
    table = [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    for m in range(4):
        for n in range(4):
            assert L.ref_grouped_tile(table[m][n], 4, 4, 2) == (m, n)
    # the notebook's 5 x 3 table: the last group is one row
    table = [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11], [12, 13, 14]]
    for m in range(5):
        for n in range(3):
            assert L.ref_grouped_tile(table[m][n], 5, 3, 2) == (m, n)
    assert [L.ref_grouped_tile(t, 4, 6, 1) for t in range(24)] == [divmod(t, 6) for t in range(24)]
    assert [L.ref_grouped_tile(t, 3, 4, 8) for t in range(12)] == [(t % 3, t // 3) for t in range(12)]


def test_grouped_order_visits_every_tile_once():
    r = random.Random(5)
    for _ in range(200):
        mt, nt, g = r.randint(1, 30), r.randint(1, 30), r.randint(1, 12)
        assert sorted(L.ref_grouped_tile(t, mt, nt, g) for t in range(mt * nt)) == [
            (m, n) for m in range(mt) for n in range(nt)]


def test_dram_bytes_small_case_by_hand():
    # 4 x 4 tiles of 128, K = 256: a panel is 64 KiB; 4 CTAs, so one wave per row in row-major
    # order (1 A + 4 B panels = 320 KiB) and a 2 x 2 block in grouped order (256 KiB).
    assert L.ref_dram_bytes(512, 512, 256, 128, 128, 2, 4, 4 * MIB) == {"row_major": 1280 << 10, "grouped": MIB}
    # an L2 of 256 KiB holds the grouped wave but not the row-major one (4 tiles x 128 KiB each)
    assert L.ref_dram_bytes(512, 512, 256, 128, 128, 2, 4, 256 << 10) == {"row_major": 2 * MIB, "grouped": MIB}


def test_dram_bytes_h200():
    got = L.ref_dram_bytes(4096, 4096, 8192, 128, 128, 8, 132, 50 * MIB)
    # first wave: row-major needs 5 + 32 panels of 2 MiB (74 MiB > 50 MiB), grouped 8 + 17 (50 MiB)
    assert got["grouped"] < got["row_major"] / 2


# ---------------------------------------------------------------- part d: hand-worked

def test_multicast_masks_by_hand():
    assert L.ref_multicast_plan(2, 1, 1, 128, 128) == {"a_mask": 0b10, "b_mask": 0b11, "a_rows": (0, 128),
                                                       "b_rows": (64, 128)}
    assert L.ref_multicast_plan(1, 2, 1, 128, 256) == {"a_mask": 0b11, "b_mask": 0b10, "a_rows": (64, 128),
                                                       "b_rows": (0, 256)}
    assert L.ref_multicast_plan(2, 2, 3, 128, 128) == {"a_mask": 0b1010, "b_mask": 0b1100, "a_rows": (64, 128),
                                                       "b_rows": (64, 128)}


@pytest.mark.parametrize("cm, cn", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (2, 4), (4, 4), (8, 1)])
def test_multicast_slices_cover_each_shared_tile_once(cm, cn):
    plans = {r: L.ref_multicast_plan(cm, cn, r, 128, 256) for r in range(cm * cn)}
    for r, p in plans.items():
        assert p["a_mask"] >> r & 1 and p["b_mask"] >> r & 1
        # the CTAs that share my B tile issue slices that cover it exactly once
        sharers = [q for q in range(cm * cn) if p["b_mask"] >> q & 1]
        assert len(sharers) == cm
        assert sorted(plans[q]["b_rows"] for q in sharers) == [(k * 256 // cm, (k + 1) * 256 // cm) for k in range(cm)]
        sharers = [q for q in range(cm * cn) if p["a_mask"] >> q & 1]
        assert len(sharers) == cn
        assert sorted(plans[q]["a_rows"] for q in sharers) == [(k * 128 // cn, (k + 1) * 128 // cn) for k in range(cn)]


def test_stage_counts_by_hand():
    assert L.ref_stage_counts(1, 1, 128, 256, 64, 2, 2) == {"expect_tx": 49152, "issued": 49152, "empty_arrivals": 2}
    # along M the B tile is shared: each CTA issues half of it but expects all of it
    assert L.ref_stage_counts(2, 1, 128, 256, 64, 2, 2) == {"expect_tx": 49152, "issued": 32768, "empty_arrivals": 4}
    assert L.ref_stage_counts(2, 2, 128, 128, 64, 2, 1) == {"expect_tx": 32768, "issued": 16384, "empty_arrivals": 3}


# ---------------------------------------------------------------- the solution agrees with the references

@pytest.fixture(scope="module")
def reference(root, tmp_path_factory):
    return import_notebook(os.path.join(root, *SOLUTION), tmp_path_factory.mktemp("lab5-solution"), "lab5_solution")


def _grade(module, part_id, device, seed=inputs.PUBLIC_SEED):
    ctx = Context(LAB_SPEC, LAB_SPEC.part(part_id), seed, device, public_only=False)
    return verdict.grade_part(module, ctx)


@pytest.mark.parametrize("seed", [inputs.PUBLIC_SEED, 1, 2, 3])
def test_solution_passes_hidden_cases_of_several_seeds(reference, device, seed):
    for part in map(LAB_SPEC.part, CPU_PARTS):
        r = _grade(reference, part.id, device, seed)
        assert r.verdict == report.PASSED, (part.id, r.message)


# ---------------------------------------------------------------- deliberately wrong answers

def restart_per_tile(stages, k_tiles, cta, grid, num_tiles):
    """The counter (with the stage and the parities) restarts at every output tile."""
    return [w for tile in range(cta, num_tiles, grid)
            for w in L.ref_persistent_waits(stages, k_tiles, tile, 1, tile + 1)]


def counter_from_tile_number(stages, k_tiles, cta, grid, num_tiles):
    """The load number taken from the global tile number instead of the CTA's own count."""
    out = []
    for tile in range(cta, num_tiles, grid):
        for k in range(k_tiles):
            g = tile * k_tiles + k
            out.append((tile, k, g % stages, (g // stages + 1) % 2, g // stages % 2))
    return out


def both_start_at_zero(stages, k_tiles, cta, grid, num_tiles):
    """The producer waits with the consumers' parity: the convention that deadlocks."""
    waits = L.ref_persistent_waits(stages, k_tiles, cta, grid, num_tiles)
    return [(t, k, s, full, full) for t, k, s, _, full in waits]


def off_by_one_parity(stages, k_tiles, cta, grid, num_tiles):
    waits = L.ref_persistent_waits(stages, k_tiles, cta, grid, num_tiles)
    return [(t, k, s, full, empty) for t, k, s, empty, full in waits]


def fresh_barrier_blocks(stages, loads, producer_start, consumer_start):
    """Believes a wait on a barrier that never completed a phase blocks, whatever the parity."""
    full, empty, p, c = [0] * stages, [0] * stages, 0, 0
    moved = True
    while moved:
        moved = False
        while p < loads and empty[p % stages] and empty[p % stages] % 2 != (producer_start + p // stages) % 2:
            full[p % stages] += 1
            p, moved = p + 1, True
        while c < loads and full[c % stages] and full[c % stages] % 2 != (consumer_start + c // stages) % 2:
            empty[c % stages] += 1
            c, moved = c + 1, True
    return {"producer_stuck": p if p < loads else None, "consumer_stuck": c if c < loads else None, "early": []}


def no_early_waits(stages, loads, producer_start, consumer_start):
    return dict(L.ref_ring_run(stages, loads, producer_start, consumer_start), early=[])


def no_rounding(roles, launch_regs, producer_need):
    """Takes the compiled count as the registers held (162 holds 168, not 162)."""
    if launch_regs % 8 == 0:
        return L.ref_setmaxnreg_plan(roles, launch_regs, producer_need)
    return L.ref_setmaxnreg_plan(roles, launch_regs - launch_regs % 8, producer_need)


def no_cap(roles, launch_regs, producer_need):
    """Forgets that setmaxnreg counts stop at 256."""
    got = L.ref_setmaxnreg_plan(roles, launch_regs, producer_need)
    if got and got["consumer"][1] == 256:
        held = 8 * math.ceil(launch_regs / 8)
        left = 128 * len(roles) * held - 128 * roles.count("producer") * got["producer"][1]
        got = dict(got, consumer=("inc", left // (128 * roles.count("consumer")) // 8 * 8))
    return got


def whole_tile_per_consumer(block_m, block_n, consumers, regs, headroom):
    return L.ref_accumulator_fit(block_m, block_n, 1, regs, headroom)


def row_major(t, m_tiles, n_tiles, group):
    return divmod(t, n_tiles)


def tail_group_as_full(t, m_tiles, n_tiles, group):
    span = group * n_tiles
    w = t % span
    return (t // span * group + w % group, w // group)


def l2_ignored(M, N, K, blk_m, blk_n, group, ctas, l2_bytes):
    return L.ref_dram_bytes(M, N, K, blk_m, blk_n, group, ctas, 0)


def mask_missing_a_cta(cm, cn, rank, blk_m, blk_n):
    """The B mask leaves out the highest-ranked other CTA that shares the tile."""
    got = L.ref_multicast_plan(cm, cn, rank, blk_m, blk_n)
    others = got["b_mask"] & ~(1 << rank)
    return dict(got, b_mask=got["b_mask"] & ~(1 << (others.bit_length() - 1))) if others else got


def transposed_rank(cm, cn, rank, blk_m, blk_n):
    """Reads the rank as i * cn + j instead of i + cm * j."""
    i, j = rank // cn, rank % cn
    return L.ref_multicast_plan(cm, cn, i + cm * j, blk_m, blk_n)


def own_slices_only(cm, cn, blk_m, blk_n, blk_k, dtype_bytes, consumers):
    got = L.ref_stage_counts(cm, cn, blk_m, blk_n, blk_k, dtype_bytes, consumers)
    return dict(got, expect_tx=got["issued"])


def arrivals_from_every_cta(cm, cn, blk_m, blk_n, blk_k, dtype_bytes, consumers):
    got = L.ref_stage_counts(cm, cn, blk_m, blk_n, blk_k, dtype_bytes, consumers)
    return dict(got, empty_arrivals=cm * cn * consumers)


WRONG = [
    ("a_ring", "persistent_waits", restart_per_tile),
    ("a_ring", "persistent_waits", counter_from_tile_number),
    ("a_ring", "persistent_waits", both_start_at_zero),
    ("a_ring", "persistent_waits", off_by_one_parity),
    ("a_ring", "ring_run", fresh_barrier_blocks),
    ("a_ring", "ring_run", no_early_waits),
    ("b_regs", "setmaxnreg_plan", no_rounding),
    ("b_regs", "setmaxnreg_plan", no_cap),
    ("b_regs", "accumulator_fit", whole_tile_per_consumer),
    ("c_sched", "grouped_tile", row_major),
    ("c_sched", "grouped_tile", tail_group_as_full),
    ("c_sched", "dram_bytes", l2_ignored),
    ("d_cluster", "multicast_plan", mask_missing_a_cta),
    ("d_cluster", "multicast_plan", transposed_rank),
    ("d_cluster", "stage_counts", own_slices_only),
    ("d_cluster", "stage_counts", arrivals_from_every_cta),
]


@pytest.mark.parametrize("part, name, wrong", WRONG, ids=[w.__name__ for _, _, w in WRONG])
def test_wrong_answers_lose_points(reference, device, part, name, wrong):
    module = types.SimpleNamespace(**{**vars(reference), name: wrong})
    public = Context(LAB_SPEC, LAB_SPEC.part(part), inputs.PUBLIC_SEED, device, public_only=True)
    r = verdict.grade_part(module, public)
    assert r.verdict != report.PASSED and r.points < r.max_points, r.message   # the public cases catch it
    assert f"{name}(" in r.message, r.message
    r = _grade(module, part, device)
    assert r.verdict != report.PASSED and r.points < r.max_points, r.message


def test_wrong_notebook_through_the_sandbox(root, edit, tmp_path):
    """Row-major instead of grouped, and expect_tx of the own slices only: both parts lose points,
    the other two keep theirs."""
    nb = edit(os.path.join(root, *SOLUTION), {
        "return first_row + within % rows_here, within // rows_here": "return t // n_tiles, t % n_tiles",
        'return {"expect_tx": a_tile + b_tile,': 'return {"expect_tx": a_tile // cn + b_tile // cm,'})
    res = grade_in_process(LAB, nb, CPU_PARTS, tmp_path / "grade")
    assert res["a_ring"].verdict == report.PASSED and res["b_regs"].verdict == report.PASSED
    for part, name in (("c_sched", "grouped_tile"), ("d_cluster", "stage_counts")):
        assert res[part].verdict == report.PARTIAL and 0 < res[part].points < res[part].max_points, res[part].message
        assert f"first wrong: {name}(" in res[part].message, res[part].message


# ---------------------------------------------------------------- kernels: the spec

STEPS = range(5, 10)
SMS = {"sm_90a": hardware.SPECS["H200"].sm_count, "sm_100a": hardware.SPECS["B200"].sm_count}
# What one CTA (or, with a cluster, one cluster of `ctas` CTAs) computes at a time, per step and track.
TILE = {("sm_90a", 5): (128, 128, 1), ("sm_90a", 6): (128, 128, 1), ("sm_90a", 7): (128, 128, 1),
        ("sm_90a", 8): (128, 256, 1), ("sm_90a", 9): (256, 256, 2),
        ("sm_100a", 5): (128, 128, 1), ("sm_100a", 6): (128, 128, 1), ("sm_100a", 7): (128, 128, 1),
        ("sm_100a", 8): (256, 512, 4), ("sm_100a", 9): (512, 512, 4)}


def _shapes(part, track):
    return [tuple(s) for s in part.params["public_shapes"] + runners.track_shapes(part.params, track)]


def _takes(track, shape):
    """The shapes the reference kernels of a track take (the builders' docstrings in the notebook)."""
    M, N, K = shape
    grid = 8 if track == "sm_90a" else 128
    return K % 64 == 0 and M % grid == 0 and N % grid == 0


@pytest.mark.parametrize("step", STEPS)
def test_every_step_has_its_parts_on_both_tracks(step):
    b90, b100, correct = (LAB_SPEC.part(f"s{step}_{k}") for k in ("build_sm90", "build_sm100", "correct"))
    assert (b90.params["builder"], b90.params["archs"]) == (f"hopper_step{step}", ["sm_90a"])
    assert (b100.params["builder"], b100.params["archs"]) == (f"blackwell_step{step}", ["sm_100a"])
    assert "not run on a B200" in b100.title
    assert correct.params["builders"] == {"sm_90a": f"hopper_step{step}", "sm_100a": f"blackwell_step{step}"}
    persistent = step >= 6
    assert (b90.params.get("num_sms"), b100.params.get("num_sms")) == (("arch", "arch") if persistent else (None, None))
    assert correct.params.get("num_sms") == ("device" if persistent else None)
    assert all(1 <= p.points <= 3 for p in (b90, b100, correct))
    if step in (5, 7, 8, 9):
        speed = LAB_SPEC.part(f"s{step}_speed")
        assert speed.params["shapes"] == [[4096, 4096, 4096], [8192, 8192, 8192]]
        assert speed.params.get("num_sms") == correct.params.get("num_sms")


@pytest.mark.parametrize("track", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("step", STEPS)
def test_correctness_shapes_fit_the_track_and_cover_the_hard_cases(step, track):
    part = LAB_SPEC.part(f"s{step}_correct")
    shapes = _shapes(part, track)
    assert all(_takes(track, s) for s in shapes), shapes
    assert all(_takes(track, s) for s in map(tuple, part.params["public_shapes"])), "public shapes run on both tracks"
    if track == "sm_90a":                       # off the tile grid: edges of A, B and D
        assert any(M % 128 or N % 128 for M, N, _ in shapes)
    if step >= 6:                               # more tiles than CTAs, by a non-integer factor
        tm, tn, ctas = TILE[track, step]
        units = SMS[track] // ctas
        factors = [math.ceil(M / tm) * math.ceil(N / tn) / units for M, N, _ in shapes]
        assert any(f > 1 and not f.is_integer() for f in factors), factors
        assert any(f < 1 for f in factors), factors      # and idle CTAs


def test_hidden_shapes_are_drawn_on_the_grid_both_tracks_take():
    part = LAB_SPEC.part("s9_correct")
    r = random.Random(7)
    prob = problems.get("gemm")
    for _ in range(50):
        shape = prob.draw_shape(r, part.params)
        assert _takes("sm_100a", shape) and _takes("sm_90a", shape)


GRADING_RUNS = ["lab5_gemm_pipeline.run1.json", "lab5_gemm_pipeline.run2-seed20261203.json", "all.run3.json"]


@pytest.mark.parametrize("step", [5, 7, 8, 9])
def test_h200_thresholds_leave_a_margin_below_every_recorded_grading_run(root, step):
    ratios = []
    for name in GRADING_RUNS:
        with open(os.path.join(root, "reports", "h200", "grader-v3", name)) as f:
            ratios += [r["measurements"]["ratio"] for r in json.load(f)["results"]
                       if r["lab"] == "lab5_gemm_pipeline" and r["part"] == f"s{step}_speed"]
    assert len(ratios) == 3
    th = LAB_SPEC.part(f"s{step}_speed").thresholds
    assert th["H200"].full <= 0.86 * min(ratios) and th["H200"].floor <= 0.5 * min(ratios)
    assert "reports/h200/grader-v3" in th["H200"].source
    assert th["B200"].status == "uncalibrated: not measured on a B200" and "book" in th["B200"].source


def test_points_total():
    assert LAB_SPEC.max_points == 45
    assert all(1 <= p.points <= 3 for p in LAB_SPEC.parts)


# ---------------------------------------------------------------- kernels: the runner's per-track shapes

FAKE = {"sm_90a": hardware.Device(True, "NVIDIA H200 (fake)", hardware.SPECS["H200"], "test"),
        "sm_100a": hardware.Device(True, "NVIDIA B200 (fake)", hardware.SPECS["B200"], "test")}


def _context(part_id, track, params=None, public_only=True):
    part = LAB_SPEC.part(part_id)
    if params is not None:
        part = dataclasses.replace(part, params={**part.params, **params})
    return Context(LAB_SPEC, part, inputs.PUBLIC_SEED, FAKE[track], public_only=public_only)


def test_shapes_by_track_run_only_on_that_track():
    prob = problems.get("gemm")
    hopper = [tuple(s) for s in runners.case_shapes(prob, _context("s7_correct", "sm_90a"))]
    blackwell = [tuple(s) for s in runners.case_shapes(prob, _context("s7_correct", "sm_100a"))]
    public = [tuple(s) for s in LAB_SPEC.part("s7_correct").params["public_shapes"]]
    assert blackwell == public and hopper == public + [(1000, 776, 512)]
    # the aliases of builders work here too, and hidden shapes come after the track's shapes
    ctx = _context("s7_correct", "sm_90a", {"shapes_by_track": {"hopper": [[8, 16, 64]]}}, public_only=False)
    shapes = [tuple(s) for s in runners.case_shapes(prob, ctx)]
    assert shapes[:len(public) + 1] == public + [(8, 16, 64)] and len(shapes) == len(public) + 1 + 2


@pytest.mark.parametrize("track, builder, extra", [("sm_90a", "hopper_step8", [(200, 136, 64)]),
                                                   ("sm_100a", "blackwell_step8", [])])
def test_correctness_runner_runs_the_tracks_shapes(track, builder, extra):
    """The default runner on the CPU, a torch function standing in for the kernel."""
    seen = []

    def build(M, N, K, num_sms):
        seen.append((M, N, K, num_sms))
        return lambda A, B, D: D.copy_((A.float() @ B.float().T).half())
    env = runners.Env(device="cpu", lower=lambda built: (built, "// fake"), sync=lambda: None,
                      require_gpu=lambda ctx: None, sm_count=lambda: 7)
    ctx = _context("s8_correct", track, {"public_shapes": [[128, 256, 64]],
                                         "shapes_by_track": {"sm_90a": [[200, 136, 64]]}})
    out = runners.correctness(types.SimpleNamespace(**{builder: build}), ctx, env)
    assert out.fraction == 1.0, out.message
    assert seen == [(128, 256, 64, 7)] + [s + (7,) for s in extra]


def test_the_sass_check_passes_num_sms_to_persistent_builders_only(monkeypatch):
    from grader import build
    from grader.labs import build_checks
    seen = []
    monkeypatch.setattr(build, "compile_only", lambda kernel, arch, want_sass=False: seen.append(kernel) or
                        types.SimpleNamespace(sass="", plan=None))
    module = types.SimpleNamespace(plain=lambda *a, **k: ("plain", a, k), persistent=lambda *a, **k: ("p", a, k))
    part = LAB_SPEC.part("sass_hazard")
    ctx = types.SimpleNamespace(part=types.SimpleNamespace(params={"builders": ["plain", "persistent"],
                                                                  "shapes": [[1, 2], [1, 2]], "arch": "sm_90a",
                                                                  "persistent": ["persistent"]}))
    with pytest.raises(RuntimeError, match="no SASS"):
        build_checks.accumulator_hazard(module, ctx)
    assert seen == [("plain", (1, 2), {})]
    seen.clear()
    ctx.part.params["builders"] = ["persistent", "plain"]
    with pytest.raises(RuntimeError, match="no SASS"):
        build_checks.accumulator_hazard(module, ctx)
    assert seen == [("p", (1, 2), {"num_sms": 132})]
    assert part.params["persistent"] == [f"hopper_step{s}" for s in range(6, 10)]


# ---------------------------------------------------------------- kernels: broken kernels lose their build part

NO_MULTICAST = {"cta_group=1, cta_mask=(1 << CLUSTER_M) - 1,": "cta_group=1,"}
NO_SETMAXNREG = {"T.ptx.setmaxnreg(False, PRODUCER_REGS)": "", "T.ptx.setmaxnreg(True, CONSUMER_REGS)": "",
                 "T.ptx.setmaxnreg(True, EPILOGUE_REGS)": ""}
LAST_WAIT_1 = {"T.ptx.wgmma.wait_group(0)": "T.ptx.wgmma.wait_group(1)"}


@pytest.mark.slow
def test_step9_without_multicast_loses_the_multicast_mechanism(root, edit, tmp_path):
    """Each CTA loads its half of B into its own shared memory only: it still compiles (and hangs
    on a GPU: the full barrier expects both halves)."""
    nb = edit(os.path.join(root, *SOLUTION), NO_MULTICAST)
    r = grade_in_process(LAB, nb, ["s9_build_sm90"], tmp_path / "grade")["s9_build_sm90"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "sm_90a: compiled" in r.message
    assert "TMA loads multicast to a cluster (UTMALDG...MULTICAST): MISSING" in r.message, r.message
    assert "a barrier across the CTAs of a cluster (UCGABAR): found" in r.message


@pytest.mark.slow
def test_step7_without_setmaxnreg_loses_it_on_hopper_only(root, edit, tmp_path):
    """Hopper's consumers hold their accumulators in registers: step 7 must rebalance them. The
    book's Blackwell step 7 (accumulators in TMEM) reaches its speed without setmaxnreg, so the
    Blackwell part does not require it."""
    nb = edit(os.path.join(root, *SOLUTION), NO_SETMAXNREG)
    res = grade_in_process(LAB, nb, ["s7_build_sm90", "s7_build_sm100"], tmp_path / "grade")
    r = res["s7_build_sm90"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "compiled" in r.message
    assert "(setmaxnreg.inc: USETMAXREG.TRY_ALLOC): MISSING" in r.message, r.message
    assert "(setmaxnreg.dec: USETMAXREG.DEALLOC): MISSING" in r.message, r.message
    assert res["s7_build_sm100"].verdict == report.PASSED, res["s7_build_sm100"].message
    assert "setmaxnreg" not in res["s7_build_sm100"].message


@pytest.mark.slow
def test_no_final_wgmma_wait_fails_the_sass_check(root, edit, tmp_path):
    nb = edit(os.path.join(root, *SOLUTION), LAST_WAIT_1)
    r = grade_in_process(LAB, nb, ["sass_hazard"], tmp_path / "grade")["sass_hazard"]
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert r.message.startswith("accumulator hazard:") and "hopper_step9" in r.message, r.message


# ---------------------------------------------------------------- kernels: on a GPU, barriers that never complete

PRODUCER_STARTS_AT_0 = {"sm_90a": {"ps[1] = 1": "ps[1] = 0"},
                        "sm_100a": {"ld = PipelineState(STAGES, phase=1)": "ld = PipelineState(STAGES, phase=0)"}}


def _needs_track(device, track):
    if not device.present or device.track != track:
        pytest.skip(f"needs a {track} GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("track", ["sm_90a", "sm_100a"])
def test_wrong_ring_phase_hangs_and_gets_a_clear_verdict(root, edit, device, track):
    """The producer waits on empty[s] with the consumers' start parity: on a fresh barrier that
    wait blocks, and so does the consumers' wait on full[s]."""
    _needs_track(device, track)
    nb = edit(os.path.join(root, *SOLUTION), PRODUCER_STARTS_AT_0[track])
    r = grade_in_process(LAB, nb, ["s7_correct"], None)["s7_correct"]
    assert r.verdict == report.ERROR and r.points == 0, r.message
    assert "timed out" in r.message and "barrier wait that never completes" in r.message, r.message


@pytest.mark.gpu
def test_step9_without_multicast_hangs_on_hopper(root, edit, device):
    """The full barrier expects its A tile and the whole B tile; only its own half of B arrives."""
    _needs_track(device, "sm_90a")
    nb = edit(os.path.join(root, *SOLUTION), NO_MULTICAST)
    r = grade_in_process(LAB, nb, ["s9_correct"], None)["s9_correct"]
    assert r.verdict == report.ERROR and r.points == 0, r.message
    assert "timed out" in r.message and "barrier wait that never completes" in r.message, r.message


# ---------------------------------------------------------------- timelines: trace=True

ROLES = {5: ["warpgroup"], 9: ["producer", "consumer 0", "consumer 1"]}


@pytest.mark.parametrize("step", [5, 9])
def test_hopper_builders_trace_only_on_request(reference, step):
    """trace=True adds the trace buffer, the trace points, and tells grader.timeline.show the
    rows and the buffer length. (trace=False, the default, is the kernel the build checks compile;
    its CUDA source is that of the builders before tracing: benchmarks/lab5/
    untraced_unchanged.py. Every traced step is compiled by reference_timelines.py --cpu-dry-run.
    Two steps here: parsing a traced kernel takes seconds.)"""
    from grader import timeline as tl
    build = getattr(reference, f"hopper_step{step}")
    extra = () if step == 5 else (132,)
    traced = build(1000, 776, 512, *extra, trace=True)
    assert [p.name for p in traced.params] == ["A", "B", "D", "prof"]
    assert traced.script().count("tl_trace_clock_rec") >= 8      # wait, load, mma, ... begin and end
    length, roles = tl._kernel_info(traced, None)
    assert roles == ROLES[step]
    ctas = 8 * 7 if step == 5 else 132
    assert (length - 1) % (ctas * len(roles)) == 0 and length > 1 + ctas * len(roles) * 8 * (512 // 64)
    if step == 5:
        plain = build(1000, 776, 512)
        assert [p.name for p in plain.params] == ["A", "B", "D"]
        assert "tl_trace" not in plain.script()

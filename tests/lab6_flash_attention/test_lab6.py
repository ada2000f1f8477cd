"""Lab 6, CPU parts. The reference answers against hand-worked cases and against the course's
attention reference, the hidden-case generators against what they must cover (rows that see no
key, logits of 10^4, rescales on both sides of the threshold, Sq > Sk), and deliberately wrong
answers, which lose points on the public and on the hidden cases (tests/<lab>/test_labN_every_part.py checks
that the solution passes and the student version scores zero). Everything runs in this process
except one edited notebook graded through the sandbox."""
import json
import math
import os
import random
import types

import numpy as np
import pytest
from conftest import grade_in_process, import_notebook

from grader import inputs, problems, report, spec, verdict
from grader.edition import release
from grader.context import Context
from grader.labs import lab6_flash_attention as L

LAB = "lab6_flash_attention"
LAB_SPEC = spec.load(LAB)
SOLUTION = ("solutions", LAB, "lab6_flash_attention.ipynb")
CPU_PARTS = [p.id for p in LAB_SPEC.parts if p.kind == "function"]
INF = math.inf
REL, ABS = 1e-6, 1e-9


def _ctx(part, seed=inputs.PUBLIC_SEED, public_only=False, device=None):
    from grader import hardware
    device = device or hardware.Device(False, "", None, "", "tests")
    return Context(LAB_SPEC, LAB_SPEC.part(part), seed, device, public_only=public_only)


def _chain(t, v, block_n, threshold):
    """The references, block after block, from the empty state."""
    t = np.asarray(t, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    state = L.empty_state(t.shape[0], v.shape[1])
    for j in range(0, t.shape[1], block_n):
        state = L.ref_softmax_step(state, t[:, j:j + block_n].tolist(), v[j:j + block_n].tolist(), threshold)
    return state


# ---------------------------------------------------------------- part a: hand-worked

def test_the_books_exercise_one():
    one = {"m": [2.0], "l": [3.0], "acc": [[4.0, 6.0]]}
    eye = [[1.0, 0.0], [0.0, 1.0]]
    # S = [5, 4]: the maximum grows by 3 <= 8, the reference stays at 2, P = [2^3, 2^2]
    assert L.ref_softmax_step(one, [[5.0, 4.0]], eye, 8.0) == {"m": [2.0], "l": [15.0], "acc": [[12.0, 10.0]]}
    # S = [11, 10]: it grows by 9 > 8, the reference moves to 11, the old state is scaled by 2^-9
    got = L.ref_softmax_step(one, [[11.0, 10.0]], eye, 8.0)
    assert got == {"m": [11.0], "l": [3 / 512 + 1.5], "acc": [[4 / 512 + 1.0, 6 / 512 + 0.5]]}
    # plain online softmax moves the reference at once
    assert L.ref_softmax_step(one, [[5.0, 4.0]], eye, 0.0)["m"] == [5.0]


def test_a_gap_of_exactly_the_threshold_keeps_the_reference():
    got = L.ref_softmax_step({"m": [3.0], "l": [1.0], "acc": [[1.0]]}, [[11.0, 0.0]], [[2.0], [1.0]], 8.0)
    assert got == {"m": [3.0], "l": [1.0 + 256.0 + 0.125], "acc": [[1.0 + 512.0 + 0.125]]}


def test_rows_that_see_no_key_give_zero_and_minus_infinity():
    state = _chain([[-INF] * 6, [-INF, -INF, 1.0, 2.0, -INF, -INF]], [[1.0]] * 6, 2, 8.0)
    assert state["m"] == [-INF, 2.0] and state["l"][0] == 0.0 and state["acc"][0] == [0.0]
    out = L.ref_softmax_finish(state)
    assert out["O"][0] == [0.0] and out["lse"][0] == -INF
    assert out["O"][1] == [1.0] and out["lse"][1] == pytest.approx(math.log(math.exp(math.log(2) * 1) + math.exp(math.log(2) * 2)))


@pytest.mark.parametrize("threshold", [0.0, 4.0, 8.0])
def test_the_online_result_is_the_softmax_whatever_the_threshold(threshold):
    rng = np.random.default_rng(3)
    t = np.concatenate([rng.normal(0, 1, (3, 20)), 1e4 + rng.normal(0, 30, (1, 20)),
                        np.cumsum(rng.uniform(0, 9, (1, 20)), axis=1)])
    t[0, :7] = -INF
    v = rng.normal(0, 1, (20, 3))
    out = L.ref_softmax_finish(_chain(t, v, 3, threshold))
    w = np.exp2(t - t.max(axis=1, keepdims=True))
    want_o = (w @ v) / w.sum(axis=1, keepdims=True)
    want_lse = math.log(2) * (t.max(axis=1) + np.log2(w.sum(axis=1)))
    assert np.allclose(out["O"], want_o, rtol=1e-12, atol=1e-12)
    assert np.allclose(out["lse"], want_lse, rtol=1e-12)


def test_the_conditional_rescale_moves_the_reference_less_often():
    rng = np.random.default_rng(4)
    t = np.cumsum(rng.uniform(0, 1, (8, 64)), axis=1)          # a maximum that keeps growing
    moves = {}
    for threshold in (0.0, 8.0):
        state, n = L.empty_state(8, 1), 0
        for j in range(0, 64, 4):
            new = L.ref_softmax_step(state, t[:, j:j + 4].tolist(), [[1.0]] * 4, threshold)
            n += sum(a != b for a, b in zip(new["m"], state["m"]) if a != -INF and b != -INF)
            state = new
        moves[threshold] = n
    assert moves[8.0] < moves[0.0] / 3, moves


@pytest.mark.parametrize("threshold", [0.0, 8.0])
def test_merging_two_halves_gives_the_whole_rows_result(threshold):
    """Split-KV: the keys in two halves, each through the steps, merged, then finished, give what
    the steps over all keys give, for any split point (an empty half included)."""
    rng = np.random.default_rng(7)
    t = rng.normal(0.0, 300.0, (3, 12))
    t[1, :5] = -INF                         # a row whose first half sees nothing
    t[2, :] = -INF                          # a row that sees nothing
    v = rng.normal(0.0, 1.0, (12, 2))

    def run(j0, j1):
        state = L.empty_state(3, 2)
        for j in range(j0, j1, 4):
            k = min(j + 4, j1)
            state = L.ref_softmax_step(state, t[:, j:k].tolist(), v[j:k].tolist(), threshold)
        return state
    whole = L.ref_softmax_finish(run(0, 12))
    for cut in (0, 5, 7, 12):
        merged = L.ref_softmax_merge(run(0, cut), run(cut, 12))
        assert merged["m"][1] == max(run(0, cut)["m"][1], run(cut, 12)["m"][1])
        got = L.ref_softmax_finish(merged)
        np.testing.assert_allclose(got["O"], whole["O"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["lse"], whole["lse"], rtol=1e-12)


def test_attention_head_reference_is_the_chained_steps():
    """ref_attention_head (the course's torch reference) and the online references agree."""
    rng = np.random.default_rng(5)
    for sq, sk, causal in ((7, 12, True), (12, 7, True), (9, 9, False)):
        q, k, v = rng.normal(0, 30, (sq, 4)), rng.normal(0, 1, (sk, 4)), rng.normal(0, 1, (sk, 4))
        t = (q @ k.T) * (math.log2(math.e) / 2.0)
        if causal:
            t = np.where(problems.causal_mask(sq, sk).numpy(), t, -INF)
        want = L.ref_attention_head(q.tolist(), k.tolist(), v.tolist(), causal, 5, 8.0)
        got = L.ref_softmax_finish(_chain(t, v, 5, 8.0))
        ok, why = L.close_answer(got, want, 1e-9, 1e-12)
        assert ok, why
        assert (np.asarray(want["lse"]) == -INF).sum() == max(0, sq - sk if causal else 0)


def test_close_answer():
    exp = {"O": [[1.0, 0.0]], "lse": [-INF]}
    assert L.close_answer({"O": np.array([[1.0 + 1e-9, 1e-12]]), "lse": [-INF]}, exp, REL, ABS)[0]
    assert not L.close_answer({"O": [[1.0, 0.0]], "lse": [INF]}, exp, REL, ABS)[0]
    assert not L.close_answer({"O": [[1.0, 0.0]], "lse": [-1e300]}, exp, REL, ABS)[0]
    assert "NaN" in L.close_answer({"O": [[math.nan, 0.0]], "lse": [-INF]}, exp, REL, ABS)[1]
    assert "shape" in L.close_answer({"O": [1.0, 0.0], "lse": [-INF]}, exp, REL, ABS)[1]
    assert not L.close_answer({"O": [[1.0, 0.0]]}, exp, REL, ABS)[0]
    assert not L.close_answer([[1.0, 0.0]], exp, REL, ABS)[0]


# ---------------------------------------------------------------- part a: what the cases cover

def _steps(cases):
    for kind, args in cases:
        if kind == "steps":
            state, t, v, block_n, threshold = args
            yield np.asarray(t, dtype=np.float64).reshape(len(t), -1), block_n, threshold


@pytest.mark.parametrize("seed", [inputs.PUBLIC_SEED, 1, 2])
def test_softmax_cases_cover_masked_rows_large_logits_and_both_rescales(seed):
    hidden = L.softmax_cases(_ctx("a_softmax", seed))
    public = L.softmax_cases(_ctx("a_softmax", seed, public_only=True))
    extra = hidden[len(public):]
    assert len(extra) == LAB_SPEC.part("a_softmax").params["hidden_cases"]
    for cases in (public, extra):
        rows = [row for t, _, _ in _steps(cases) for row in t]
        assert any(np.all(row == -INF) for row in rows), "a row that sees no key"
        assert any(np.isneginf(row).any() and np.isfinite(row).any() for row in rows), "masked keys"
        assert any(np.nanmax(np.abs(np.where(np.isfinite(row), row, np.nan))) >= 1e4
                   for row in rows if np.isfinite(row).any()), "logits of 10^4"
        kept = moved = 0
        for t, block_n, threshold in _steps(cases):
            if threshold != 8.0:
                continue
            for row in t:
                best = -INF
                for j in range(0, len(row), block_n):
                    top = row[j:j + block_n].max()
                    if best > -INF and 0 < top - best <= 8:
                        kept += 1
                    if best > -INF and top - best > 8:
                        moved += 1
                    best = max(best, top)
        assert kept and moved, (kept, moved)
        heads = [args for kind, args in cases if kind == "head"]
        assert any(causal and len(q) > len(k) for q, k, v, causal, _, _ in heads), "Sq > Sk, causal"
        assert any(np.abs(np.asarray(q)).max() > 300 for q, *_ in heads), "large logits in a head"


# ---------------------------------------------------------------- part b

def _brute_kind(seq_q, seq_k, bm, bn, mb, causal, shift=None, tail_counts=True):
    """The class of every key block by looking at every (query, key) pair of the tile."""
    shift = seq_k - seq_q if shift is None else shift
    rows = range(mb * bm, min(seq_q, (mb + 1) * bm))
    out = []
    for n in range(math.ceil(seq_k / bn)):
        cols = range(n * bn, (n + 1) * bn if tail_counts else min(seq_k, (n + 1) * bn))
        flat = [(not causal or j <= i + shift) and j < seq_k for i in rows for j in cols]
        out.append("skip" if not any(flat) else "full" if all(flat) else "mask")
    return out


def test_causal_blocks_by_hand_and_by_brute_force():
    assert L.ref_causal_blocks(6, 8, 2, 4, 0, True) == ["mask", "skip"]      # queries 0, 1: keys 0..3
    assert L.ref_causal_blocks(6, 8, 2, 4, 2, True) == ["full", "mask"]      # queries 4, 5: keys 0..7
    assert L.ref_causal_blocks(384, 128, 128, 128, 0, True) == ["skip"]
    assert L.ref_causal_blocks(300, 300, 128, 128, 1, False) == ["full", "full", "mask"]
    r = random.Random(6)
    for _ in range(150):
        sq, sk, bm, bn = r.randint(1, 90), r.randint(1, 90), r.choice([4, 8, 16]), r.choice([4, 8, 16])
        mb, causal = r.randrange(math.ceil(sq / bm)), r.random() < 0.8
        kinds = L.ref_causal_blocks(sq, sk, bm, bn, mb, causal)
        assert kinds == _brute_kind(sq, sk, bm, bn, mb, causal)
        assert kinds == sorted(kinds, key=lambda c: c == "skip")            # skips are a suffix


def test_causal_work():
    assert L.ref_causal_work(512, 512, 128, 128, True) == {"visited": 10, "masked": 4, "empty_tiles": 0,
                                                           "pairs": 512 * 513 // 2}
    assert L.ref_causal_work(384, 128, 128, 128, True) == {"visited": 1, "masked": 1, "empty_tiles": 2,
                                                           "pairs": 128 * 129 // 2}
    assert L.ref_causal_work(300, 300, 128, 128, False)["masked"] == 3


# ---------------------------------------------------------------- part c

@pytest.mark.parametrize("group, rows", [(1, 128), (4, 128), (8, 128), (128, 128), (2, 64)])
def test_packing_is_a_bijection_onto_the_tiles_positions_and_the_groups_heads(group, rows):
    cells = {L.ref_packed_row(r, 3, 2, group, rows) for r in range(rows)}
    per = rows // group
    assert cells == {(3 * per + s, 2 * group + h) for s in range(per) for h in range(group)}


def test_the_books_exercise_eight_and_the_q_box():
    assert [L.ref_packed_row(r, 0, 3, 4, 128) for r in (0, 5, 127)] == [(0, 12), (1, 13), (31, 15)]
    assert L.ref_q_box(0, 31, 0, 4, 128, 128, 1000) == {"start": (0, 992, 0, 0), "box": (1, 32, 4, 128),
                                                        "valid_rows": 32, "tx_bytes": 32768}


def test_attention_cost_by_hand():
    got = L.ref_attention_cost(1, 1024, 1024, 32, 8, 128, False)
    assert got["flops"] == 4 * 1024 * 1024 * 32 * 128
    assert got["bytes"] == 2 * (2 * 1024 * 32 * 128 + 2 * 1024 * 8 * 128) + 4 * 32 * 1024
    assert L.ref_attention_cost(1, 1024, 1024, 32, 8, 128, True)["flops"] == 4 * 32 * 128 * 1024 * 1025 // 2


# ---------------------------------------------------------------- part d

def test_budgets_of_the_book():
    assert L.ref_register_split(L.FA3, {"producer": 24}) == {"launch": 168, "pool": 64512, "share": 240}
    assert L.ref_register_split(L.FA4, {"correction": 64, "load_mma": 48})["share"] == 200
    assert L.ref_register_split(L.FA4, {"correction": 256, "load_mma": 256, "softmax0": 24})["share"] is None
    assert L.ref_consumer_registers(128, 128, 128, 2) == {"s": 64, "p": 32, "o": 64, "total": 160}
    assert L.ref_tmem_columns(128, 128, 2) == {"S": [(0, 128), (128, 256)], "P": [(64, 128), (192, 256)],
                                               "O": [(256, 384), (384, 512)], "used": 512, "alloc": 512,
                                               "fits": True}
    assert L.ref_barrier_counts("sm_100a", 128, 128, 128, 2)["p_o_rescale"] == (256, 0)
    assert L.ref_barrier_counts("sm_90a", 128, 128, 128, 2)["k_empty"] == (2, 0)


# ---------------------------------------------------------------- the solution and wrong answers

@pytest.fixture(scope="module")
def reference(root, tmp_path_factory):
    return import_notebook(os.path.join(root, *SOLUTION), tmp_path_factory.mktemp("lab6-solution"), "lab6_solution")


def _grade(module, part_id, seed=inputs.PUBLIC_SEED, public_only=False):
    ctx = _ctx(part_id, seed, public_only)
    return verdict.grade_part(module, ctx)


@pytest.mark.parametrize("seed", [1])
def test_solution_passes_hidden_cases_of_other_seeds(reference, seed):
    for part in CPU_PARTS:
        r = _grade(reference, part, seed)
        assert r.verdict == report.PASSED, (part, r.message)


def _a(arr):
    return np.asarray(arr, dtype=np.float64)


def no_safe_reference(state, t_block, v_block, threshold):
    """Subtracts the raw reference: -inf - (-inf) for a row that has seen no key."""
    m, l, acc = L._state_arrays(state)
    t = _a(t_block).reshape(len(m), -1)
    with np.errstate(invalid="ignore"):
        cand = np.maximum(m, t.max(axis=1))
        keep = (m - cand) >= -threshold
        m_new = np.where(keep, m, cand)
        scale = np.where(keep, 1.0, np.exp2(m - cand))
        p = np.exp2(t - m_new[:, None])
        return {"m": m_new, "l": l * scale + p.sum(1), "acc": acc * scale[:, None] + p @ _a(v_block)}


def strict_threshold(state, t_block, v_block, threshold):
    """Keeps the reference only when the gap is strictly inside the threshold."""
    return L.ref_softmax_step(state, t_block, v_block, threshold - 1e-12 if threshold else threshold)


def always_rescale(state, t_block, v_block, threshold):
    return L.ref_softmax_step(state, t_block, v_block, 0.0)


def acc_not_rescaled(state, t_block, v_block, threshold):
    """Rescales l when the reference moves, but not acc."""
    got = L.ref_softmax_step(state, t_block, v_block, threshold)
    zero = np.zeros_like(_a(state["acc"])).reshape(len(state["m"]), -1).tolist()
    fresh = L.ref_softmax_step(dict(state, acc=zero), t_block, v_block, threshold)["acc"]
    return dict(got, acc=(_a(state["acc"]).reshape(len(state["m"]), -1) + _a(fresh)).tolist())


def natural_exp(state, t_block, v_block, threshold):
    """exp where the logits are in log2 units."""
    return L.ref_softmax_step(state, (_a(t_block) / math.log(2)).tolist(), v_block, threshold)


def lse_in_log2(state):
    got = L.ref_softmax_finish(state)
    return dict(got, lse=_a(got["lse"]) / math.log(2))


def finish_without_guard(state):
    m, l, acc = L._state_arrays(state)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"O": acc / l[:, None], "lse": math.log(2) * (m + np.log2(l))}


def top_left_causal(q, k, v, causal, block_n, threshold):
    """SDPA's is_causal: query i sees keys 0..i."""
    q, k, v = _a(q), _a(k), _a(v)
    t = (q @ k.T) * (math.log2(math.e) / math.sqrt(q.shape[1]))
    if causal:
        t = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], t, -INF)
    state = L.empty_state(q.shape[0], v.shape[1])
    for j in range(0, k.shape[0], block_n):
        state = L.ref_softmax_step(state, t[:, j:j + block_n].tolist(), v[j:j + block_n].tolist(), threshold)
    return L.ref_softmax_finish(state)


def unscaled_scores(q, k, v, causal, block_n, threshold):
    return L.ref_attention_head((_a(q) * math.sqrt(len(q[0]))).tolist(), k, v, causal, block_n, threshold)


def _classes(seq_q, seq_k, bm, bn, mb, causal, shift, tail_counts):
    """Block classes by the first and last row of the tile (a variant's rule, not the reference)."""
    first, last = mb * bm, min(seq_q, (mb + 1) * bm) - 1
    out = []
    for n in range(math.ceil(seq_k / bn)):
        lo, hi = n * bn, (n + 1) * bn - 1 if tail_counts else min(seq_k, (n + 1) * bn) - 1
        if causal and lo > last + shift:
            out.append("skip")
        elif (not causal or hi <= first + shift) and hi < seq_k:
            out.append("full")
        else:
            out.append("mask")
    return out


def top_left_blocks(seq_q, seq_k, block_m, block_n, m_block, causal):
    """SDPA's is_causal: query i sees keys 0..i."""
    return _classes(seq_q, seq_k, block_m, block_n, m_block, causal, 0, True)


def tail_not_masked(seq_q, seq_k, block_m, block_n, m_block, causal):
    """Takes the zero-filled columns past seq_k for columns that need no mask."""
    return _classes(seq_q, seq_k, block_m, block_n, m_block, causal, seq_k - seq_q, False)


def empty_tiles_forgotten(seq_q, seq_k, block_m, block_n, causal):
    return dict(L.ref_causal_work(seq_q, seq_k, block_m, block_n, causal), empty_tiles=0)


def head_major(row, tile, kv_head, group, rows):
    per = rows // group
    return (tile * per + row % per, kv_head * group + row // per)


def tx_of_valid_rows(batch, tile, kv_head, group, rows, head_dim, seq_q):
    got = L.ref_q_box(batch, tile, kv_head, group, rows, head_dim, seq_q)
    return dict(got, tx_bytes=got["valid_rows"] * head_dim * 2)


def kv_per_query_head(batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal):
    return L.ref_attention_cost(batch, seq_q, seq_k, heads_q, heads_q, head_dim, causal)


def launch_unrounded(warpgroups, fixed):
    got = L.ref_register_split(warpgroups, fixed)
    launch = min(256, 65536 // (128 * len(warpgroups)))
    return dict(got, launch=launch, pool=128 * len(warpgroups) * launch)


def p_in_fp32(block_m, block_n, head_dim, consumers):
    got = L.ref_consumer_registers(block_m, block_n, head_dim, consumers)
    return dict(got, p=got["s"], total=2 * got["s"] + got["o"])


def p_in_lower_half(block_n, head_dim, q_stages):
    got = L.ref_tmem_columns(block_n, head_dim, q_stages)
    return dict(got, P=[(a, a + block_n // 2) for a, _ in got["S"]])


def merge_without_rescale(a, b):
    """Adds the two states' sums as if they shared a reference."""
    got = L.ref_softmax_merge(a, b)
    return dict(got, l=(np.asarray(a["l"]) + np.asarray(b["l"])).tolist(),
                acc=(np.asarray(a["acc"], dtype=np.float64).reshape(len(a["m"]), -1)
                     + np.asarray(b["acc"], dtype=np.float64).reshape(len(b["m"]), -1)).tolist())


def softmax_only_arrives(arch, block_m, block_n, head_dim, consumers):
    got = L.ref_barrier_counts(arch, block_m, block_n, head_dim, consumers)
    if arch == "sm_100a":
        got["p_o_rescale"] = (128, 0)
    else:
        got["k_empty"] = got["v_empty"] = (128 * consumers, 0)
    return got


WRONG = [
    ("a_softmax", "softmax_step", no_safe_reference),
    ("a_softmax", "softmax_step", strict_threshold),
    ("a_softmax", "softmax_step", always_rescale),
    ("a_softmax", "softmax_step", acc_not_rescaled),
    ("a_softmax", "softmax_step", natural_exp),
    ("a_softmax", "softmax_finish", lse_in_log2),
    ("a_softmax", "softmax_finish", finish_without_guard),
    ("a_softmax", "softmax_merge", merge_without_rescale),
    ("a_softmax", "attention_head", top_left_causal),
    ("a_softmax", "attention_head", unscaled_scores),
    ("b_causal", "causal_blocks", top_left_blocks),
    ("b_causal", "causal_blocks", tail_not_masked),
    ("b_causal", "causal_work", empty_tiles_forgotten),
    ("c_gqa", "packed_row", head_major),
    ("c_gqa", "q_box", tx_of_valid_rows),
    ("c_gqa", "attention_cost", kv_per_query_head),
    ("d_budget", "register_split", launch_unrounded),
    ("d_budget", "consumer_registers", p_in_fp32),
    ("d_budget", "tmem_columns", p_in_lower_half),
    ("d_budget", "barrier_counts", softmax_only_arrives),
]


@pytest.mark.parametrize("part, name, wrong", WRONG, ids=[w.__name__ for _, _, w in WRONG])
def test_wrong_answers_lose_points(reference, part, name, wrong):
    module = types.SimpleNamespace(**{**vars(reference), name: wrong})
    if name == "softmax_step":        # attention_head would use the wrong step too: keep it apart
        module.attention_head = L.ref_attention_head
    r = _grade(module, part, public_only=True)
    assert r.verdict != report.PASSED and r.points < r.max_points, r.message   # the public cases catch it
    assert f"{name}" in r.message, r.message
    r = _grade(module, part)
    assert r.verdict != report.PASSED and r.points < r.max_points, r.message


def test_the_student_edition_checks_every_cpu_part_softmax_within_its_tolerance(reference):
    table = json.loads(json.dumps(release.record_lab(LAB, progress=lambda m: None)))   # as shipped: JSON
    assert sorted(table["parts"]) == ["a_softmax", "b_causal", "c_gqa", "d_budget"]
    assert "a_softmax" not in table["course_grader_only"]
    entry = table["parts"]["a_softmax"]
    assert {c["fn"] for c in entry["checks"]} == {"softmax_step", "softmax_finish", "softmax_merge", "attention_head"}
    assert all(c["compare"] == {"kind": "allclose", "rel": 1e-6, "abs": 1e-9} for c in entry["checks"])
    ctx = _ctx("a_softmax", public_only=True)
    assert release.grade_from_table(entry, reference, ctx).fraction == 1.0
    wrong = types.SimpleNamespace(**{n: getattr(reference, n) for n in ("softmax_step", "softmax_merge", "attention_head")},
                                  softmax_finish=lse_in_log2)
    out = release.grade_from_table(entry, wrong, ctx)
    assert out.fraction < 1.0 and "softmax_finish" in out.message, out.message


def test_wrong_notebook_through_the_sandbox(root, edit, tmp_path):
    """A finish with ln l for log2 l, and a packing of heads first: both parts lose points, an
    untouched part keeps its own; the answers crossed the sandbox as JSON, -inf included."""
    nb = edit(os.path.join(root, *SOLUTION), {
        "(m + np.log2(ell)) * LN2": "(m + np.log(ell)) * LN2",
        "return (positions * tile + row // group, group * kv_head + row % group)":
            "return (positions * tile + row % positions, group * kv_head + row // positions)"})
    res = grade_in_process(LAB, nb, ["a_softmax", "c_gqa", "d_budget"], tmp_path / "grade")
    assert res["d_budget"].verdict == report.PASSED
    for part, name in (("a_softmax", "softmax_finish"), ("c_gqa", "packed_row")):
        assert res[part].verdict == report.PARTIAL and 0 < res[part].points < res[part].max_points, res[part].message
        assert f"first wrong: {name}" in res[part].message, res[part].message


# ---------------------------------------------------------------- kernels: the spec's parts and thresholds

def test_every_step_has_its_four_kernel_parts_on_both_tracks():
    for n in (2, 3, 4, 5):
        correct, speed = LAB_SPEC.part(f"s{n}_correct"), LAB_SPEC.part(f"s{n}_speed")
        for part in (correct, speed):
            assert part.params["problem"] == "attention" and part.needs_gpu
            assert part.params["builders"] == {"sm_90a": f"hopper_attn_step{n}", "sm_100a": f"blackwell_attn_step{n}"}
        assert LAB_SPEC.part(f"s{n}_build_sm90").params["archs"] == ["sm_90a"]
        assert LAB_SPEC.part(f"s{n}_build_sm100").params["archs"] == ["sm_100a"]
        assert "not run on a B200" in LAB_SPEC.part(f"s{n}_build_sm100").title
    causal = {bool(problems.get("attention").shape(s).causal) for s in LAB_SPEC.part("s5_correct").params["public_shapes"]}
    assert causal == {True, False}


@pytest.mark.parametrize("step", [2, 3, 4, 5])
def test_h200_thresholds_leave_a_margin_below_every_recorded_grading_run(root, step):
    ratios = []
    for run in ("run1", "run2", "run3"):
        with open(os.path.join(root, "reports", "h200", "lab6", "grading", f"{run}.json")) as f:
            report_ = json.load(f)
        assert report_["points"] == report_["max_points"]
        ratios += [r["measurements"]["ratio"] for r in report_["results"] if r["part"] == f"s{step}_speed"]
    assert len(ratios) == 3
    th = LAB_SPEC.part(f"s{step}_speed").thresholds
    assert th["H200"].full <= 0.86 * min(ratios) and th["H200"].floor <= 0.5 * min(ratios)
    assert "reports/h200/lab6/grading" in th["H200"].source
    assert th["B200"].status == "uncalibrated: not measured on a B200"


# ---------------------------------------------------------------- timelines: trace=True

def test_hopper_step4_traces_only_on_request(reference):
    """trace=True adds the trace buffer, the trace points (around waits, loads, the turn's sync,
    its MMAs, the softmax, epilogue and store), and tells grader.timeline.show the rows and the
    buffer length. (trace=False, the default, is the kernel the build checks compile, with five
    arguments; its CUDA source is that of the builders before tracing, byte for byte:
    benchmarks/lab6/untraced_unchanged.py.
    Steps 4 and 5, traced, are compiled through ptxas by reference_timelines.py --cpu-dry-run;
    one parse here: a traced kernel takes seconds.)"""
    from grader import timeline as tl
    shape = (2, 1000, 777, 16, 2, 128, True)
    traced = reference.hopper_attn_step4(*shape, trace=True)
    assert [p.name for p in traced.params] == ["Q", "K", "V", "O", "LSE", "prof"]
    script = traced.script()
    assert script.count("tl_trace_clock_rec") >= 2 * 8      # wait, load, wait, sync, mma, other, epilogue, store
    length, roles = tl._kernel_info(traced, None)
    assert roles == ["producer", "consumer 0", "consumer 1"]
    ctas = 8 * 16 * 2                                         # ceil(1000 / 128) x heads_q x batch
    assert length == 1 + ctas * 3 * (12 * 7 + 48)             # 7 key blocks of 128


def _pingpong(cta, turns=10, t_mma=500.0, t_soft=380.0, t_issue=40.0, t0=0.0):
    """Events of an idealised ping-pong: consumers 0 and 1 take turns to issue a turn's products,
    which run one after another on the tensor cores; each softmax follows its own products."""
    from grader import timeline as tl
    ev, tc, handed, ready = [], t0, t0, [t0, t0]
    for k in range(2 * turns):
        c = k % 2
        row, role = 1 + c, f"consumer {c}"
        issue = max(ready[c], handed) + 10.0
        ev.append(tl.Event(cta, row, role, "sync", ready[c], issue, 0, 0))
        tc = max(tc, issue) + t_mma
        ev.append(tl.Event(cta, row, role, "mma", issue, tc, 0, 0))
        ev.append(tl.Event(cta, row, role, "other", tc, tc + t_soft, 0, 0))
        handed, ready[c] = issue + t_issue, tc + t_soft
    for j in range(turns):
        ev.append(tl.Event(cta, 0, "producer", "load", t0 + 300.0 * j, t0 + 300.0 * j + t_issue, 0, j % 3))
    return ev


def test_the_lecture_packing_figure_covers_each_position_and_head_once():
    """The GQA figure's row map (the lecture's formula) puts every (position, head) of a KV head's
    group in exactly one row of one tile, and never a head of another group."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), *[os.pardir] * 2, "lectures", LAB, "figures.py")
    mod_spec = importlib.util.spec_from_file_location("lab6_figures_packing", path)
    figures = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(figures)
    for group, hkv in ((1, 0), (2, 3), (4, 1), (8, 2), (16, 0)):
        seen = [figures.packed_row(r, t, group, hkv) for t in range(3) for r in range(128)]
        assert len(set(seen)) == len(seen) == 3 * 128
        assert {h for _, h in seen} == set(range(hkv * group, (hkv + 1) * group))
        assert {p for p, _ in seen} == set(range(3 * 128 // group))


def test_the_lecture_draws_the_recorded_pingpong(tmp_path):
    """lectures/lab6_flash_attention/figures.py draws reports/h200/lab6/timeline_attn_step4.json
    once the GPU run has written it (here: a synthetic one laid out the same way); without it the
    picture the notebook's show() cell drew on the H200, and without either a placeholder."""
    import importlib.util

    from grader import timeline as tl
    path = os.path.join(os.path.dirname(__file__), *[os.pardir] * 2, "lectures", LAB, "figures.py")
    mod_spec = importlib.util.spec_from_file_location("lab6_figures", path)
    figures = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(figures)
    ev = _pingpong(0) + _pingpong(1, t0=120.0)
    trace = tmp_path / "timeline_attn_step4.json"
    tl.events_to_json(ev, trace, shape={"batch": 4, "seq_q": 4096, "seq_k": 4096, "heads_q": 32, "heads_kv": 8},
                      device="NVIDIA H200, 132 SMs", untraced_ms=1.0, traced_ms=1.2, kept={"cut_us": {"0": 9.9}})
    assert figures._turns_window(ev, 0) is not None
    figures.fig_pingpong(tmp_path / "t.png", trace)
    figures.fig_pingpong_placeholder(tmp_path / "p.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    recorded = figures.STEP4_SHOW
    assert recorded.exists()                                  # the H200 picture is in the repository
    figures.STEP4_TRACE = tmp_path / "absent.json"
    figures.fig_timeline(tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes() == recorded.read_bytes()
    figures.STEP4_SHOW = tmp_path / "absent.png"
    figures.fig_timeline(tmp_path / "q.png")
    assert (tmp_path / "q.png").read_bytes() != recorded.read_bytes()   # the placeholder

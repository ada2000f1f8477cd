"""Grading functions of Lab 6 (Flash Attention with GQA), CPU parts. Contract with the notebook
(the notebook's markdown states every rule these functions apply):

- Part a, online softmax, in numpy. The logits arrive in log2 units (``t = s · log2(e)``, the
  kernels fold log2(e) into the softmax scale so that the exponential is one ``exp2``). A state
  is ``{"m": [rows], "l": [rows], "acc": [rows][d]}``: the exponent reference of each row, the
  running sum of ``2^(t - m)`` and the running ``sum 2^(t - m) v``; the empty state is
  ``m = -inf, l = 0, acc = 0``. ``softmax_step(state, t_block, v_block, threshold) -> state``
  takes one key block with the FA4 rule: ``cand = max(m, rowmax(t_block))``,
  ``delta = m - safe(cand)`` (``safe(-inf) = 0``); the reference is kept when
  ``delta >= -threshold`` (scale 1), else it becomes ``cand`` and the old ``l`` and ``acc`` are
  multiplied by ``2^delta``; ``p = 2^(t - safe(m_new))``. Threshold 0 is plain online softmax.
  ``softmax_finish(state) -> {"O": [rows][d], "lse": [rows]}``: ``O = acc / l`` and
  ``lse = ln 2 · (m + log2 l)`` (natural log), ``O = 0`` and ``lse = -inf`` where ``l = 0``.
  ``softmax_merge(a, b) -> state``: the state of the keys of two states together (split-KV), relative
  to the larger of the two references (``-inf`` if both rows saw no key); the notebook gives the
  reference's invariance, not the formula.
  ``attention_head(q, k, v, causal, block_n, threshold) -> {"O", "lse"}``: one head, q [Sq][D],
  k and v [Sk][D], scale 1/sqrt(D), causal aligned bottom-right (query i sees key j iff
  ``j <= i + Sk - Sq``), keys in blocks of ``block_n``; checked against
  ``grader.problems.attention_reference``. The grader drives ``softmax_step`` block by block
  from the trusted state of the previous block, so every step is checked on its own. Arguments
  are plain lists (``-inf`` included); answers are compared with ``rel_tol`` and ``abs_tol`` of
  the spec, infinities exactly, NaN never.
- Part b, causal blocks: ``causal_blocks(seq_q, seq_k, block_m, block_n, m_block, causal)`` ->
  one of ``"full"``, ``"mask"``, ``"skip"`` per key block ``n = 0 .. ceil(seq_k / block_n) - 1``
  for the query tile of rows ``m_block·block_m ...`` (rows past ``seq_q`` do not count; columns
  past ``seq_k`` must be masked); ``causal_work(seq_q, seq_k, block_m, block_n, causal)`` ->
  ``{"visited", "masked", "empty_tiles", "pairs"}`` over all query tiles of one head (pairs:
  ``grader.problems.visible_pairs``).
- Part c, GQA: ``packed_row(row, tile, kv_head, group, rows) -> (seq, q_head)``;
  ``q_box(batch, tile, kv_head, group, rows, head_dim, seq_q) -> {"start", "box", "valid_rows",
  "tx_bytes"}`` (the 4D view [B, S, Hq, D] of Q); ``attention_cost(batch, seq_q, seq_k, heads_q,
  heads_kv, head_dim, causal) -> {"flops", "bytes", "score_bytes"}`` (flops and bytes:
  ``grader.problems.attention_flops`` and ``attention_work``).
- Part d, budgets: ``register_split(warpgroups, fixed) -> {"launch", "pool", "share"}`` (the
  notebook refers to Lab 5 part b for the register rules rather than restating the procedure);
  ``consumer_registers(block_m, block_n, head_dim, consumers) -> {"s", "p", "o", "total"}``;
  ``tmem_columns(block_n, head_dim, q_stages) -> {"S", "P", "O", "used", "alloc", "fits"}``;
  ``barrier_counts(arch, block_m, block_n, head_dim, consumers) -> {barrier: (arrivals,
  tx_bytes)}``.

Parts b to d are compared exactly (after ``compare.normalize``: tuples and lists alike).
"""
from __future__ import annotations

import math
import types

import numpy as np
import torch

from .. import compare, grading, inputs, problems
from ..context import Context, Outcome
from .lab4_gemm import ref_desc_fields, ref_desc_fields_mn, relative_places

LAB = "lab6_flash_attention"
LN2 = math.log(2.0)
F16_BYTES = 2
WARPGROUP = 128                  # threads of a warpgroup
SM_REGISTERS = 65536             # 32-bit registers of one SM (H100/H200 and B200 alike)
TMEM_COLUMNS = 512               # tensor-memory columns of one SM (B200), 128 lanes of 32 bits each


# ---------------------------------------------------------------- reference answers: part a

def _safe(m: np.ndarray) -> np.ndarray:
    return np.where(np.isneginf(m), 0.0, m)


def _state_arrays(state, rows: int | None = None):
    m = np.asarray(state["m"], dtype=np.float64).reshape(-1)
    l = np.asarray(state["l"], dtype=np.float64).reshape(-1)
    acc = np.asarray(state["acc"], dtype=np.float64).reshape(len(m), -1)
    return m, l, acc


def ref_softmax_step(state, t_block, v_block, threshold) -> dict:
    m, l, acc = _state_arrays(state)
    t = np.asarray(t_block, dtype=np.float64).reshape(len(m), -1)
    v = np.asarray(v_block, dtype=np.float64).reshape(t.shape[1], acc.shape[1])
    cand = np.maximum(m, t.max(axis=1))
    delta = m - _safe(cand)                              # <= 0; -inf while the row has seen no key
    keep = delta >= -threshold
    m_new = np.where(keep, m, cand)
    scale = np.where(keep, 1.0, np.exp2(delta))
    p = np.exp2(t - _safe(m_new)[:, None])
    return {"m": m_new.tolist(), "l": (l * scale + p.sum(axis=1)).tolist(),
            "acc": (acc * scale[:, None] + p @ v).tolist()}


def ref_softmax_finish(state) -> dict:
    m, l, acc = _state_arrays(state)
    seen = l > 0
    denom = np.where(seen, l, 1.0)
    O = np.where(seen[:, None], acc / denom[:, None], 0.0)
    lse = np.where(seen, LN2 * (m + np.log2(denom)), -math.inf)
    return {"O": O.tolist(), "lse": lse.tolist()}


def ref_softmax_merge(a, b) -> dict:
    ma, la, acca = _state_arrays(a)
    mb, lb, accb = _state_arrays(b)
    m = np.maximum(ma, mb)
    sa, sb = np.exp2(ma - _safe(m)), np.exp2(mb - _safe(m))     # 0 for a row that saw no key
    return {"m": m.tolist(), "l": (la * sa + lb * sb).tolist(),
            "acc": (acca * sa[:, None] + accb * sb[:, None]).tolist()}


def empty_state(rows: int, d: int) -> dict:
    return {"m": [-math.inf] * rows, "l": [0.0] * rows, "acc": [[0.0] * d for _ in range(rows)]}


def ref_attention_head(q, k, v, causal, block_n, threshold) -> dict:
    """O and LSE of one head from the course's attention reference (float64; block_n and
    threshold change nothing in the exact result)."""
    def as4d(x):
        return torch.tensor(np.asarray(x, dtype=np.float64)).reshape(1, len(x), 1, -1)
    out = problems.attention_reference({"Q": as4d(q), "K": as4d(k), "V": as4d(v)}, causal=bool(causal))
    return {"O": out["O"][0, :, 0].tolist(), "lse": out["LSE"][0, 0].tolist()}


# ---------------------------------------------------------------- reference answers: part b

def _block_classes(seq_q: int, seq_k: int, block_m: int, block_n: int, causal: bool) -> list[list[str]]:
    """The class of every (query tile, key block) pair, from the visibility of every (query, key)
    pair (``problems.causal_mask``): rows past seq_q do not count, columns past seq_k are never
    visible (zero-filled keys must be masked)."""
    if causal:
        seen = problems.causal_mask(seq_q, seq_k).numpy()
    else:
        seen = np.ones((seq_q, seq_k), dtype=bool)
    tiles, blocks = math.ceil(seq_q / block_m), math.ceil(seq_k / block_n)
    cols = np.pad(seen, ((0, 0), (0, blocks * block_n - seq_k)), constant_values=False)
    rows = ((0, tiles * block_m - seq_q), (0, 0))
    some = np.pad(cols, rows, constant_values=False).reshape(tiles, block_m, blocks, block_n).any(axis=(1, 3))
    every = np.pad(cols, rows, constant_values=True).reshape(tiles, block_m, blocks, block_n).all(axis=(1, 3))
    return [["skip" if not some[t, n] else "full" if every[t, n] else "mask" for n in range(blocks)]
            for t in range(tiles)]


def ref_causal_blocks(seq_q: int, seq_k: int, block_m: int, block_n: int, m_block: int, causal: bool) -> list:
    return _block_classes(seq_q, seq_k, block_m, block_n, causal)[m_block]


def ref_causal_work(seq_q: int, seq_k: int, block_m: int, block_n: int, causal: bool) -> dict:
    kinds = _block_classes(seq_q, seq_k, block_m, block_n, causal)
    return {"visited": sum(c != "skip" for row in kinds for c in row),
            "masked": sum(row.count("mask") for row in kinds),
            "empty_tiles": sum(all(c == "skip" for c in row) for row in kinds),
            "pairs": problems.visible_pairs(seq_q, seq_k, causal)}


# ---------------------------------------------------------------- reference answers: part c

def ref_packed_row(row: int, tile: int, kv_head: int, group: int, rows: int) -> tuple[int, int]:
    per = rows // group                      # sequence positions in one tile
    return (tile * per + row // group, kv_head * group + row % group)


def ref_q_box(batch: int, tile: int, kv_head: int, group: int, rows: int, head_dim: int, seq_q: int) -> dict:
    per = rows // group
    first = tile * per
    return {"start": (batch, first, kv_head * group, 0), "box": (1, per, group, head_dim),
            "valid_rows": group * max(0, min(per, seq_q - first)),
            "tx_bytes": rows * head_dim * F16_BYTES}           # the whole box, clipped or not


def _shape(batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal):
    return types.SimpleNamespace(batch=batch, seq_q=seq_q, seq_k=seq_k, heads_q=heads_q,
                                 heads_kv=heads_kv, head_dim=head_dim, causal=causal)


def ref_attention_cost(batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal) -> dict:
    s = _shape(batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal)
    return {"flops": problems.attention_flops(s), "bytes": int(problems.attention_work(s).bytes),
            "score_bytes": 4 * batch * heads_q * seq_q * seq_k}


# ---------------------------------------------------------------- reference answers: part d

def ref_register_split(warpgroups, fixed) -> dict:
    n = len(warpgroups)
    launch = min(256, SM_REGISTERS // (WARPGROUP * n) // 8 * 8)
    pool = WARPGROUP * n * launch
    flexible = [w for w in warpgroups if w not in fixed]
    left = pool // WARPGROUP - sum(fixed[w] for w in warpgroups if w in fixed)
    share = min(256, left // len(flexible) // 8 * 8) if flexible else None
    return {"launch": launch, "pool": pool, "share": share if share is not None and share >= 24 else None}


def ref_consumer_registers(block_m: int, block_n: int, head_dim: int, consumers: int) -> dict:
    rows = block_m // consumers
    s, p, o = rows * block_n // WARPGROUP, rows * block_n // (2 * WARPGROUP), rows * head_dim // WARPGROUP
    return {"s": s, "p": p, "o": o, "total": s + p + o}


def ref_tmem_columns(block_n: int, head_dim: int, q_stages: int) -> dict:
    S = [(i * block_n, (i + 1) * block_n) for i in range(q_stages)]
    P = [(a + block_n // 2, b) for a, b in S]                   # fp16, two per column: S's upper half
    base = q_stages * block_n
    O = [(base + i * head_dim, base + (i + 1) * head_dim) for i in range(q_stages)]
    used = base + q_stages * head_dim
    alloc = max(32, 1 << (used - 1).bit_length())
    return {"S": S, "P": P, "O": O, "used": used, "alloc": alloc, "fits": alloc <= TMEM_COLUMNS}


def ref_barrier_counts(arch: str, block_m: int, block_n: int, head_dim: int, consumers: int) -> dict:
    q_bytes, kv_bytes = block_m * head_dim * F16_BYTES, block_n * head_dim * F16_BYTES
    if arch == "sm_90a":
        return {"q_full": (1, q_bytes), "k_full": (1, kv_bytes), "v_full": (1, kv_bytes),
                "k_empty": (consumers, 0), "v_empty": (consumers, 0)}
    return {"q_full": (1, q_bytes), "kv_full": (1, kv_bytes), "kv_empty": (1, 0), "s_ready": (1, 0),
            "p_o_rescale": (2 * WARPGROUP, 0), "p_ready_2": (WARPGROUP, 0), "o_ready": (1, 0),
            "softmax_corr_empty": (WARPGROUP, 0), "corr_epi_full": (WARPGROUP, 0), "corr_epi_empty": (32, 0)}


# ---------------------------------------------------------------- part a: comparison and cases

close_answer = compare.close_arrays       # dictionaries of arrays, with the spec's rel_tol and abs_tol


def _floats(x: np.ndarray) -> list:
    return x.tolist()


def _row_logits(rng: np.random.Generator, style: str, blocks: list[int]) -> np.ndarray:
    """One row of logits (log2 units) over key blocks of the given widths."""
    n = sum(blocks)
    edges = np.cumsum([0] + blocks)
    if style == "masked":                                   # sees no key at all
        return np.full(n, -np.inf)
    if style == "large":                                    # exp2 of these overflows without the max
        return rng.choice([1.0, -1.0]) * 1e4 + rng.normal(0.0, 30.0, n)
    if style == "spread":                                   # huge spread: most weights underflow
        return rng.normal(0.0, 1e4, n)
    if style == "growing":                                  # the max grows block by block
        step = rng.choice([2.0, 5.0, 7.5, 9.0, 15.0])
        return np.concatenate([rng.normal(step * j, 1.0, w) for j, w in enumerate(blocks)])
    out = rng.normal(0.0, rng.choice([1.0, 4.0]), n)
    cut = int(edges[int(rng.integers(1, len(blocks))) if len(blocks) > 1 else 1])
    if style == "late":                                     # no key in the first block(s)
        out[:cut] = -np.inf
    elif style == "early":                                  # no key after the first block(s)
        out[cut:] = -np.inf
    elif style == "holes":
        out[rng.random(n) < 0.3] = -np.inf
    return out


ROW_STYLES = ("masked", "large", "spread", "growing", "late", "early", "holes", "normal")


def _softmax_case(rng: np.random.Generator, first_style: str) -> tuple:
    rows, d = int(rng.integers(1, 7)), int(rng.integers(1, 6))
    block_n = int(rng.choice([1, 3, 4, 8, 16]))
    n_blocks = int(rng.integers(1, 6))
    n = block_n * n_blocks - int(rng.integers(0, block_n))      # the last block may be short
    blocks = [min(block_n, n - j * block_n) for j in range(n_blocks)]
    styles = [first_style] + [str(rng.choice(ROW_STYLES)) for _ in range(rows - 1)]
    t = np.stack([_row_logits(rng, s, blocks) for s in styles])
    v = rng.normal(0.0, 1.0, (n, d))
    threshold = float(rng.choice([0.0, 8.0, 8.0, 4.0]))
    return ("steps", (empty_state(rows, d), _floats(t), _floats(v), block_n, threshold))


def _attention_case(rng: np.random.Generator, seq_q, seq_k, d, causal, block_n, threshold, q_scale) -> tuple:
    q = rng.normal(0.0, q_scale, (seq_q, d))
    k, v = rng.normal(0.0, 1.0, (seq_k, d)), rng.normal(0.0, 1.0, (seq_k, d))
    return ("head", (_floats(q), _floats(k), _floats(v), causal, block_n, threshold))


def _merge_case(rng: np.random.Generator, styles: tuple) -> tuple:
    """("merge", (a, b)): one row per style, its keys split at a random point, each half run
    through the reference steps (random threshold, block size): two states with references of
    their own, possibly empty, possibly far apart."""
    d, block_n = int(rng.integers(1, 5)), int(rng.choice([1, 3, 4, 8]))
    n = int(rng.integers(2, 20))
    t = np.stack([_row_logits(rng, s, [n]) for s in styles])
    v = rng.normal(0.0, 1.0, (n, d))
    cut = int(rng.integers(0, n + 1))
    halves = []
    for j0, j1 in ((0, cut), (cut, n)):
        state = empty_state(len(styles), d)
        threshold = float(rng.choice([0.0, 8.0]))
        for k0 in range(j0, j1, block_n):
            k1 = min(k0 + block_n, j1)
            state = ref_softmax_step(state, _floats(t[:, k0:k1]), _floats(v[k0:k1]), threshold)
        halves.append(state)
    return ("merge", tuple(halves))


def softmax_cases(ctx: Context) -> list[tuple]:
    """("steps", (state, t, v, block_n, threshold)), ("merge", (a, b)) and ("head", (q, k, v,
    causal, block_n, threshold)) cases; a "steps" case is checked block by block, then finished."""
    inf = math.inf
    one = {"m": [2.0], "l": [3.0], "acc": [[4.0, 6.0]]}          # the book's exercise 1
    eye = [[1.0, 0.0], [0.0, 1.0]]
    cases = [("steps", (one, [[5.0, 4.0]], eye, 2, 8.0)),       # grows by 3: kept
             ("steps", (one, [[11.0, 10.0]], eye, 2, 8.0)),     # grows by 9: rescaled by 2^-9
             ("steps", (one, [[5.0, 4.0]], eye, 2, 0.0)),       # plain online softmax: rescaled by 2^-3
             ("steps", ({"m": [3.0], "l": [1.0], "acc": [[1.0]]}, [[11.0, 0.0]], [[2.0], [1.0]], 2, 8.0)),  # exactly 8: kept
             ("steps", (empty_state(2, 1), [[-inf, -inf, -inf, -inf], [1.0, 2.0, 3.0, 4.0]],
                        [[1.0], [2.0], [3.0], [4.0]], 2, 8.0)),   # a row that sees no key
             ("steps", (empty_state(2, 2), [[-inf, -inf, 0.5, 20.0, 1.0, 2.0], [1.0, -inf, -inf, -inf, -inf, -inf]],
                        [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0], [0.5, 0.5], [-1.0, 3.0]], 2, 8.0)),
             ("steps", (empty_state(2, 1), [[1e4, 1e4 + 3.0, 1e4 - 1.0, 1e4 + 12.0], [-1e4, -1e4 + 1, -1e4 + 2, -1e4 + 30]],
                        [[1.0], [-1.0], [2.0], [0.5]], 1, 8.0)),  # large logits, one key at a time
             ("steps", (empty_state(3, 2), [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [9.0, 0.0, 0.0, 20.0, 0.0, 0.0, 40.0],
                                             [-3.0, -1.0, 0.0, 0.0, 1.0, 2.5, -inf]],
                        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 1.0], [2.0, 3.0], [4.0, 5.0]], 3, 8.0))]
    rng = np.random.default_rng(20261203)
    cases.append(_softmax_case(rng, "growing"))
    cases += [("merge", (one, {"m": [5.0], "l": [1.0], "acc": [[0.0, 2.0]]})),         # b's reference is larger
              ("merge", (one, empty_state(1, 2))), ("merge", (empty_state(1, 2), one)),
              ("merge", (empty_state(2, 1), empty_state(2, 1))),
              _merge_case(rng, ("large", "masked", "spread")), _merge_case(rng, ("holes", "late"))]
    cases += [_attention_case(rng, 16, 16, 8, False, 4, 0.0, 1.0),
              _attention_case(rng, 12, 20, 8, True, 8, 8.0, 1.0),        # more keys than queries
              _attention_case(rng, 20, 12, 8, True, 8, 8.0, 1.0),        # 8 queries see no key
              _attention_case(rng, 16, 16, 16, True, 16, 8.0, 1000.0),   # logits of about 1000
              _attention_case(rng, 9, 30, 4, False, 7, 8.0, 3.0)]        # a short last key block
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    hidden = grading.hidden_count(ctx)
    g = np.random.default_rng(r.getrandbits(63))
    for i in range(hidden):
        if i % 8 == 5:
            cases.append(_merge_case(g, tuple(str(s) for s in g.choice(ROW_STYLES, size=int(g.integers(1, 5))))))
        elif i % 4 != 3:
            cases.append(_softmax_case(g, ROW_STYLES[i % len(ROW_STYLES)]))
        else:                                               # every third: causal with Sq > Sk
            j = i // 4
            sk = int(g.integers(1, 41))
            sq = sk + int(g.integers(1, 20)) if j % 3 == 0 else int(g.integers(1, 41))
            causal = j % 3 == 0 or bool(g.integers(0, 2))
            cases.append(_attention_case(g, sq, sk, int(g.choice([2, 4, 8, 16])), causal,
                                         int(g.choice([1, 4, 5, 8, 16])), float(g.choice([0.0, 8.0])),
                                         (1.0, 1000.0, 30.0, 1.0)[j % 4]))
    return cases


def _blocks(n: int, block_n: int):
    return [(j0, min(n, j0 + block_n)) for j0 in range(0, n, block_n)]


def grade_softmax(module, ctx: Context) -> Outcome:
    """Every "steps" case block by block (each call from the trusted state before it), then its
    finish; every "head" case against the course's attention reference. A case is right when
    every call of it is."""
    rel, abs_ = float(ctx.part.params["rel_tol"]), float(ctx.part.params["abs_tol"])
    step = grading.student(module, "softmax_step")
    finish = grading.student(module, "softmax_finish")
    head = grading.student(module, "attention_head")
    merge = grading.student(module, "softmax_merge")
    cases = softmax_cases(ctx)
    n_public = grading.public_len(softmax_cases, ctx)
    wrong = []
    for c, (kind, args) in enumerate(cases):
        why = ""
        if kind == "steps":
            state, t, v, block_n, threshold = args
            rows, n = len(t), len(v)
            tt = np.asarray(t, dtype=np.float64).reshape(rows, n)
            for b, (j0, j1) in enumerate(_blocks(n, block_n)):
                call = (state, _floats(tt[:, j0:j1]), v[j0:j1], threshold)
                expected = ref_softmax_step(*call)
                ok, why = close_answer(step(*call), expected, rel, abs_)
                if not ok:
                    why = (f"softmax_step on case {c} ({rows} rows, keys {j0}..{j1 - 1} of {n}, "
                           f"threshold {threshold:g}, m before {state['m']}): {why}")
                    break
                state = expected
            else:
                ok, why = close_answer(finish(state), ref_softmax_finish(state), rel, abs_)
                if not ok:
                    why = f"softmax_finish on case {c} (state m = {state['m']}, l = {state['l']}): {why}"
        elif kind == "merge":
            a, b = args
            ok, why = close_answer(merge(a, b), ref_softmax_merge(a, b), rel, abs_)
            if not ok:
                why = f"softmax_merge on case {c} (a: m = {a['m']}, l = {a['l']}; b: m = {b['m']}, l = {b['l']}): {why}"
        else:
            q, k, v, causal, block_n, threshold = args
            ok, why = close_answer(head(*args), ref_attention_head(*args), rel, abs_)
            if not ok:
                why = (f"attention_head on case {c} (Sq={len(q)}, Sk={len(k)}, D={len(q[0])}, "
                       f"{'causal' if causal else 'non-causal'}, block_n={block_n}, threshold {threshold:g}): {why}")
        if not ok:
            wrong.append(why if c < n_public else grading.hidden_case(c - n_public))
    return grading.cases_outcome(len(cases), wrong, hidden=len(cases) - n_public)


# ---------------------------------------------------------------- parts b to d: tables of calls

_hidden = grading.hidden_count


# ---------------------------------------------------------------- part b: causal blocks

def causal_cases(ctx: Context) -> list[tuple]:
    cases = [("blocks", (6, 8, 6, 4, 0, True)),            # the book's exercise 7: one tile of all 6 queries
             ("blocks", (6, 8, 2, 4, 0, True)), ("blocks", (6, 8, 2, 4, 1, True)), ("blocks", (6, 8, 2, 4, 2, True)),
             ("blocks", (512, 512, 128, 128, 0, True)), ("blocks", (512, 512, 128, 128, 3, True)),
             ("blocks", (512, 512, 128, 64, 2, True)),     # the diagonal crosses two key blocks
             ("blocks", (128, 384, 128, 128, 0, True)),    # Sq < Sk: the tile sees the first 256 keys whole
             ("blocks", (384, 128, 128, 128, 0, True)),    # Sq > Sk: the first two tiles see nothing
             ("blocks", (384, 128, 128, 128, 1, True)), ("blocks", (384, 128, 128, 128, 2, True)),
             ("blocks", (300, 300, 128, 128, 2, True)),    # tails: 44 query rows, 44 keys
             ("blocks", (300, 300, 128, 128, 1, False)),   # not causal: only the tail is masked
             ("blocks", (256, 256, 128, 128, 1, False)),
             ("blocks", (100, 1000, 64, 128, 1, True)), ("blocks", (1000, 100, 64, 128, 15, True)),
             ("work", (512, 512, 128, 128, True)), ("work", (512, 512, 128, 128, False)),
             ("work", (384, 128, 128, 128, True)), ("work", (128, 384, 128, 128, True)),
             ("work", (300, 300, 128, 128, True)), ("work", (6, 8, 2, 4, True)),
             ("work", (1000, 100, 64, 128, True)), ("work", (1024, 1024, 128, 64, True)),
             ("work", (2048, 2048, 32, 128, True))]        # GQA with group 4: 32 positions per tile
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        bm, bn = r.choice([16, 32, 64, 128]), r.choice([64, 128])
        sq = r.choice([r.randint(1, 1200), bm * r.randint(1, 10)])
        sk = r.choice([r.randint(1, 1200), bn * r.randint(1, 10), sq])
        causal = r.random() < 0.8
        if i % 3 == 2:
            cases.append(("work", (sq, sk, bm, bn, causal)))
        else:
            cases.append(("blocks", (sq, sk, bm, bn, r.randrange(math.ceil(sq / bm)), causal)))
    return cases




# ---------------------------------------------------------------- part c: GQA

def gqa_cases(ctx: Context) -> list[tuple]:
    cases = [("row", (row, 0, 3, 4, 128)) for row in (0, 5, 127)]          # the book's exercise 8
    cases += [("row", (row, 2, 1, 8, 128)) for row in (0, 7, 8, 100)]
    cases += [("row", (77, 5, 0, 1, 128)), ("row", (77, 5, 6, 128, 128)), ("row", (63, 3, 2, 2, 64))]
    cases += [("box", (0, 0, 3, 4, 128, 128, 1024)), ("box", (1, 2, 1, 8, 128, 128, 1024)),
              ("box", (0, 31, 0, 4, 128, 128, 1000)),    # the last tile: 8 positions of 32
              ("box", (0, 7, 0, 1, 128, 64, 1000)),      # MHA: 104 of 128 rows
              ("box", (2, 0, 5, 16, 128, 128, 3)),       # a sequence shorter than the tile
              ("box", (0, 1, 1, 2, 64, 128, 40))]
    cases += [("cost", (1, 1024, 1024, 32, 8, 128, False)), ("cost", (1, 1024, 1024, 32, 8, 128, True)),
              ("cost", (2, 4096, 4096, 32, 32, 128, True)), ("cost", (1, 128, 1024, 8, 1, 64, True)),
              ("cost", (1, 1024, 128, 8, 1, 64, True)), ("cost", (4, 333, 777, 16, 4, 128, False))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        rows = r.choice([64, 128])
        group = r.choice([g for g in (1, 2, 4, 8, 16, 32) if rows % g == 0])
        if i % 3 == 0:
            cases.append(("row", (r.randrange(rows), r.randrange(64), r.randrange(8), group, rows)))
        elif i % 3 == 1:
            seq_q = r.randint(1, 4000)
            tiles = math.ceil(seq_q * group / rows)
            tile = r.choice([tiles - 1, r.randrange(tiles)])
            cases.append(("box", (r.randrange(4), tile, r.randrange(8), group, rows, r.choice([64, 128]), seq_q)))
        else:
            kv = r.choice([1, 2, 4, 8])
            cases.append(("cost", (r.randint(1, 4), r.randint(1, 5000), r.randint(1, 5000), kv * group, kv,
                                   r.choice([64, 128]), r.random() < 0.6)))
    return cases




# ---------------------------------------------------------------- part d: budgets

FA3 = ["producer", "consumer", "consumer"]
FA4 = ["softmax0", "softmax1", "correction", "load_mma"]


def budget_cases(ctx: Context) -> list[tuple]:
    cases = [("split", (FA3, {"producer": 24})),                              # FA3: 24 / 240 / 240
             ("split", (["producer", "consumer", "consumer", "consumer"], {"producer": 32})),   # 32 / 160 x 3
             ("split", (FA4, {"correction": 64, "load_mma": 48})),            # the book: 200 for softmax
             ("split", (FA4, {"correction": 64, "load_mma": 48, "softmax1": 200})),
             ("split", (["producer", "consumer"], {"producer": 24})),        # capped at 256
             ("split", (FA4, {"correction": 256, "load_mma": 256, "softmax0": 24})),   # nothing left: None
             ("split", (["a", "b", "c", "d", "e"], {"a": 24})),
             ("regs", (128, 128, 128, 2)), ("regs", (128, 176, 128, 2)), ("regs", (192, 128, 128, 3)),
             ("regs", (128, 128, 64, 1)), ("regs", (64, 256, 256, 1)),
             ("tmem", (128, 128, 2)), ("tmem", (128, 64, 2)), ("tmem", (128, 128, 1)), ("tmem", (64, 128, 2)),
             ("tmem", (128, 256, 2)), ("tmem", (256, 128, 2)), ("tmem", (32, 16, 1)),
             ("barriers", ("sm_90a", 128, 128, 128, 2)), ("barriers", ("sm_90a", 192, 128, 64, 3)),
             ("barriers", ("sm_100a", 128, 128, 128, 2)), ("barriers", ("sm_100a", 128, 64, 64, 2))]
    r = inputs.rng(LAB, ctx.part.id, ctx.seed)
    for i in range(_hidden(ctx)):
        kind = ("split", "regs", "tmem", "barriers")[i % 4]
        if kind == "split":
            n = r.randint(1, 5)
            names = [f"wg{j}" for j in range(n)]
            fixed = {w: 8 * r.randint(3, 32) for w in r.sample(names, r.randint(0, n - 1))}
            cases.append(("split", (names, fixed)))
        elif kind == "regs":
            consumers = r.randint(1, 3)
            cases.append(("regs", (64 * consumers * r.randint(1, 2), 16 * r.randint(2, 16), r.choice([64, 128, 256]),
                                   consumers)))
        elif kind == "tmem":
            cases.append(("tmem", (r.choice([32, 64, 128, 256]), r.choice([16, 32, 64, 128, 256]), r.randint(1, 3))))
        else:
            consumers = r.randint(1, 3)
            cases.append(("barriers", (r.choice(["sm_90a", "sm_100a"]), r.choice([64 * consumers, 128]),
                                       r.choice([64, 128, 176, 256]), r.choice([64, 128]), consumers)))
    return cases



# ---------------------------------------------------------------- the student edition's public tables
# Parts whose grading functions do more than grade tables of calls record their public cases
# here (the hook PUBLIC_TABLES, called by grader/edition/release.py with the public context and
# the table toolkit grader/edition/tables.py), from this lab's own case generators and references.

def public_softmax(ctx, tables) -> dict:
    """Lab 6 a_softmax: every call the course grader makes on the public cases, with the trusted
    answer: softmax_step block by block (each from the reference state before it), then
    softmax_finish, softmax_merge and attention_head."""
    def plain(x):
        return {k: np.asarray(v, dtype=np.float64).tolist() for k, v in x.items()}
    cases: dict[str, list] = {}

    def add(fn, args, expected):
        cases.setdefault(fn, []).append([[tables.encode(a) for a in args], tables.encode(plain(expected))])
    for kind, args in softmax_cases(ctx):
        if kind == "steps":
            state, t, v, block_n, threshold = args
            tt = np.asarray(t, dtype=np.float64).reshape(len(t), len(v))
            for j0, j1 in _blocks(len(v), block_n):
                call = (state, tt[:, j0:j1].tolist(), v[j0:j1], threshold)
                expected = plain(ref_softmax_step(*call))
                add("softmax_step", call, expected)
                state = expected
            add("softmax_finish", (state,), ref_softmax_finish(state))
        elif kind == "merge":
            add("softmax_merge", args, ref_softmax_merge(*args))
        else:
            add("attention_head", args, ref_attention_head(*args))
    how = {"kind": "allclose", "rel": float(ctx.part.params["rel_tol"]), "abs": float(ctx.part.params["abs_tol"])}
    return {"checks": [{"fn": fn, "compare": how, "cases": c} for fn, c in cases.items()],
            "extras": []}


PUBLIC_TABLES = {"a_softmax": public_softmax}


QUESTIONS = {   # CPU questions declared as data: graded by grading.grade_question (grader/dispatch.py)
    "b_causal": grading.Question(
        causal_cases,
        answers={"blocks": ref_causal_blocks, "work": ref_causal_work},
        params={"blocks": ("seq_q", "seq_k", "block_m", "block_n", "m_block", "causal"),
                "work": ("seq_q", "seq_k", "block_m", "block_n", "causal")}),
    "c_gqa": grading.Question(
        gqa_cases,
        answers={"row": ref_packed_row, "box": ref_q_box, "cost": ref_attention_cost},
        params={"row": ("row", "tile", "kv_head", "group", "rows"),
                "box": ("batch", "tile", "kv_head", "group", "rows", "head_dim", "seq_q"),
                "cost": ("batch", "seq_q", "seq_k", "heads_q", "heads_kv", "head_dim", "causal")}),
    "d_budget": grading.Question(
        budget_cases,
        answers={"split": ref_register_split, "regs": ref_consumer_registers,
                 "tmem": ref_tmem_columns, "barriers": ref_barrier_counts},
        params={"split": ("warpgroups", "fixed"), "regs": ("block_m", "block_n", "head_dim", "consumers"),
                "tmem": ("block_n", "head_dim", "q_stages"),
                "barriers": ("arch", "block_m", "block_n", "head_dim", "consumers")}),
}

# The operand tiles of the Hopper steps' wgmma descriptors (the check "wgmma_desc_fields"): Q and K
# K-major in 128-byte swizzle atoms (the LBO is not read); V MN-major, BLK_N keys along K. Course
# grader only.
DESC_FIELDS = {f"s{step}_build_sm90": [("Q and K (K-major)", (None,) + ref_desc_fields(128)[1:]),
                                       ("V (MN-major)", ref_desc_fields_mn(128, 128))]
               for step in (2, 3, 4, 5)}


def _o_places(part_id: str, rows: int, consumers: bool):
    """Where the epilogue puts each register of O (the check "wgmma_epilogue_places") in CTA (0, 0)
    and CTA (1, 1) at the part's build shape: each wgmma's registers keep the fragment's shape in O,
    seen as rows of heads_q x head_dim elements, and together cover one ``rows`` x head_dim block
    of one head once (which block a CTA holds, and which consumer holds which rows, are for the
    correctness part). Step 2's one warpgroup stores O itself; steps 3 and 4's consumers (threads
    128-383) through Dsmem and TMA stores. Course grader only."""
    from .. import spec
    p = spec.load(LAB).part(part_id).params
    first, threads, via = (128, 256, "tma_store") if consumers else (0, 128, None)
    return relative_places(p["heads_q"] * p["head_dim"], (rows, p["head_dim"]), ((0, 0), (1, 1)), via, first, threads,
                           out="O")


# Step 5 packs the query heads of a KV group into one CTA's rows (its O block is not a rectangle of
# O's rows): its epilogue is judged by its correctness part.
ACC_PLACES = {"s2_build_sm90": _o_places("s2_build_sm90", 64, False),
              "s3_build_sm90": _o_places("s3_build_sm90", 128, True),
              "s4_build_sm90": _o_places("s4_build_sm90", 128, True)}

GRADERS = {
    "a_softmax": grade_softmax,
    # the kernels: problem "attention" (grader/problems.py), graded by grader/runners.py
}

"""Kernel problems (grader/problems.py) and the default kernel runners (grader/runners.py), on the
CPU: the references against independent computations, the tolerance rules against simulated
kernels (right and wrong), the work counts, and the runners end to end with torch functions
standing in for compiled kernels (runners.Env is the seam)."""
import dataclasses
import math
import types

import pytest
import torch

from grader import compare, dispatch, hardware, inputs, problems, runners, spec
from grader.context import Context, Outcome
from grader import grading

ATT = problems.ATTENTION
U16 = 2.0 ** -11


# ---------------------------------------------------------------- helpers

def rand_qkv(B, Sq, Sk, Hq, Hkv, D, q_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Sq, Hq, D, generator=g) * q_scale).half()
    k = torch.randn(B, Sk, Hkv, D, generator=g).half()
    v = torch.randn(B, Sk, Hkv, D, generator=g).half()
    return {"Q": q, "K": k, "V": v}


def naive_attention(ins, causal):
    """Loops over (batch, head, query, key) in float64: the definition, written independently of
    problems.attention_reference (no masks, no chunks, no einsum)."""
    q, k, v = ins["Q"].double(), ins["K"].double(), ins["V"].double()
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    O = torch.zeros(B, Sq, Hq, D, dtype=torch.float64)
    LSE = torch.empty(B, Hq, Sq, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kvh = h // group
            for i in range(Sq):
                logits = [(j, float(q[b, i, h] @ k[b, j, kvh]) / math.sqrt(D)) for j in range(Sk)
                          if not causal or j - i <= Sk - Sq]
                if not logits:
                    LSE[b, h, i] = -math.inf
                    continue
                m = max(s for _, s in logits)
                w = [(j, math.exp(s - m)) for j, s in logits]
                total = sum(x for _, x in w)
                O[b, i, h] = sum(x * v[b, j, kvh] for j, x in w) / total
                LSE[b, h, i] = m + math.log(total)
    return {"O": O, "LSE": LSE}


def flash_sim(ins, causal, block=128, subtract_max=True, top_left=False, gqa="div", scale=None,
              lse_log2=False, exp_noise=0.0, seed=0):
    """A FlashAttention-style forward on the CPU: fp32 logits, online softmax over key blocks, P
    rounded to fp16 for P·V, fp32 accumulators, O rounded to fp16. The keyword arguments plant the
    bugs the tolerance must catch (and, exp_noise, the approximate exp2 it must allow)."""
    q, k, v = ins["Q"].float(), ins["K"].float(), ins["V"].float()
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = 1 / math.sqrt(D) if scale is None else scale
    gen = torch.Generator().manual_seed(seed)
    O = torch.empty(B, Sq, Hq, D, dtype=torch.float16)
    LSE = torch.empty(B, Hq, Sq, dtype=torch.float32)
    rows = torch.arange(Sq)
    for b in range(B):
        for h in range(Hq):
            kvh = h // group if gqa == "div" else h % Hkv
            m = torch.full((Sq,), -math.inf)
            l = torch.zeros(Sq)
            acc = torch.zeros(Sq, D)
            for j0 in range(0, Sk, block):
                s = (q[b, :, h] @ k[b, j0:j0 + block, kvh].T) * scale
                if causal:
                    cols = torch.arange(j0, min(Sk, j0 + block))
                    shift = 0 if top_left else Sk - Sq
                    s = s.masked_fill(cols[None, :] > rows[:, None] + shift, -math.inf)
                m_new = torch.maximum(m, s.amax(dim=1)) if subtract_max else torch.zeros(Sq)
                m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                alpha = torch.exp(m - m_use) if subtract_max else torch.ones(Sq)
                p = torch.exp(s - m_use[:, None])
                if exp_noise:
                    p = p * (1 + exp_noise * (2 * torch.rand(p.shape, generator=gen) - 1))
                l = l * alpha + p.sum(dim=1)
                acc = acc * alpha[:, None] + p.half().float() @ v[b, j0:j0 + block, kvh]
                m = m_new
            seen = l > 0
            O[b, :, h] = torch.where(seen[:, None], acc / torch.where(seen, l, 1)[:, None], 0).half()
            lse = torch.where(seen, m + torch.log(torch.where(seen, l, 1)), -math.inf)
            LSE[b, h] = lse / math.log(2) if lse_log2 else lse
    return {"O": O, "LSE": LSE}


def verdicts(got, ins, causal):
    ref = problems.attention_reference(ins, causal=causal)
    tol = problems.attention_tolerances(ins)
    return {n: compare.compare(got[n], ref[n], tol[n], name=n) for n in ("O", "LSE")}


# ---------------------------------------------------------------- the attention reference

REF_CASES = [  # (B, Sq, Sk, Hq, Hkv, causal)
    (2, 5, 5, 4, 2, True),       # group 2, square causal (both alignments agree)
    (1, 3, 7, 4, 1, True),       # MQA, seq_q < seq_k: bottom-right alignment matters
    (2, 7, 3, 2, 2, True),       # group 1, seq_q > seq_k: the first 4 rows see no key
    (1, 6, 9, 8, 2, False),      # group 4, non-causal
    (1, 4, 4, 16, 1, True),      # MQA with 16 query heads
]


@pytest.mark.parametrize("B, Sq, Sk, Hq, Hkv, causal", REF_CASES)
def test_attention_reference_matches_naive_loops(B, Sq, Sk, Hq, Hkv, causal):
    ins = rand_qkv(B, Sq, Sk, Hq, Hkv, 8, q_scale=2.0)
    ref = problems.attention_reference(ins, causal=causal)
    want = naive_attention(ins, causal)
    assert ref["O"].shape == (B, Sq, Hq, 8) and ref["LSE"].shape == (B, Hq, Sq)
    assert torch.allclose(ref["O"], want["O"], rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isinf(ref["LSE"]), torch.isinf(want["LSE"]))
    fin = torch.isfinite(want["LSE"])
    assert torch.allclose(ref["LSE"][fin], want["LSE"][fin], rtol=1e-12, atol=1e-12)


def test_bottom_right_causal_rows_and_fully_masked_rows():
    ins = rand_qkv(1, 6, 2, 2, 1, 8)
    ref = problems.attention_reference(ins, causal=True)
    # queries 0..3 see no key: O = 0, LSE = -inf; query 4 sees key 0 only; query 5 keys 0 and 1
    assert torch.all(ref["O"][0, :4] == 0) and torch.all(ref["LSE"][0, :, :4] == -math.inf)
    assert torch.allclose(ref["O"][0, 4], ins["V"][0, 0, 0].double().expand(2, 8))
    s = float(ins["Q"][0, 4, 1].double() @ ins["K"][0, 0, 0].double()) / math.sqrt(8)
    assert ref["LSE"][0, 1, 4].item() == pytest.approx(s, abs=1e-12)
    assert torch.isfinite(ref["LSE"][0, :, 4:]).all()
    # with seq_q < seq_k the last query sees every key and the first sees seq_k - seq_q + 1
    mask = problems.causal_mask(3, 7)
    assert mask.sum(dim=1).tolist() == [5, 6, 7]


@pytest.mark.parametrize("Sq, Sk, causal", [(4, 9, True), (6, 6, True), (5, 8, False)])
def test_attention_reference_matches_sdpa_with_a_lower_right_mask(Sq, Sk, causal):
    from torch.nn.attention.bias import causal_lower_right
    ins = rand_qkv(2, Sq, Sk, 8, 2, 16)
    q, k, v = (ins[n].double().transpose(1, 2) for n in ("Q", "K", "V"))
    mask = causal_lower_right(Sq, Sk) if causal else None
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ref = problems.attention_reference(ins, causal=causal)
    assert torch.allclose(ref["O"], o.transpose(1, 2), atol=1e-10)


def test_attention_reference_in_chunks_and_on_sampled_rows_is_the_same():
    ins = rand_qkv(2, 33, 40, 4, 2, 8)
    full = problems.attention_reference(ins, causal=True)
    chunked = problems.attention_reference(ins, causal=True, max_chunk=50)
    rows = torch.tensor([0, 5, 32])
    sampled = problems.attention_reference(ins, causal=True, rows=rows)
    for n in ("O", "LSE"):
        assert torch.allclose(full[n], chunked[n], atol=1e-12)
    assert torch.allclose(sampled["O"], full["O"][:, rows], atol=1e-12)
    assert torch.allclose(sampled["LSE"], full["LSE"][:, :, rows], atol=1e-12)


# ---------------------------------------------------------------- the attention tolerance

def test_tolerance_accepts_the_reference_rounded_to_fp16():
    ins = rand_qkv(2, 64, 96, 8, 2, 128)
    ref = problems.attention_reference(ins, causal=True)
    got = {"O": ref["O"].half(), "LSE": ref["LSE"].float()}
    res = verdicts(got, ins, causal=True)
    assert res["O"].ok and res["LSE"].ok, (res["O"].message, res["LSE"].message)


@pytest.mark.parametrize("Sk, q_scale, causal", [(256, 1.0, True), (8192, 1.0, False), (4096, 8.0, True)])
def test_tolerance_accepts_a_flash_kernel_with_fp16_p_at_any_seq_k(Sk, q_scale, causal):
    ins = rand_qkv(1, 64, Sk, 4, 2, 128, q_scale=q_scale, seed=Sk)
    res = verdicts(flash_sim(ins, causal, exp_noise=U16), ins, causal)
    assert res["O"].ok and res["LSE"].ok, (res["O"].message, res["LSE"].message)


def test_tolerance_does_not_grow_with_seq_k_like_a_sum():
    short, long = rand_qkv(1, 16, 256, 2, 1, 128, seed=1), rand_qkv(1, 16, 16384, 2, 1, 128, seed=1)
    a, b = problems.attention_tolerances(short)["O"].atol, problems.attention_tolerances(long)["O"].atol
    assert b < 1.6 * a                                   # only the spread of V grows, slowly
    k_sum = (problems.GEMM.tolerance(problems.GEMM.shape([1, 1, 16384]), {})["D"].atol
             / problems.GEMM.tolerance(problems.GEMM.shape([1, 1, 256]), {})["D"].atol)
    assert k_sum > 10                                    # what the K-term-sum rule of gemm grows by
    assert 0.005 < b < 0.02                              # about the book's 1e-2, derived


@pytest.mark.parametrize("bug, seq, q_scale, expect", [
    ({"subtract_max": False}, (64, 256), 30.0, "NaN/Inf"),     # exp overflows without the running max
    ({"top_left": True}, (48, 256), 1.0, "differ"),            # SDPA's is_causal alignment
    ({"gqa": "mod"}, (64, 256), 1.0, "differ"),                # query head h reads kv head h % Hkv
    ({"scale": 1.0}, (64, 256), 1.0, "differ"),                # no 1/sqrt(D)
])
def test_tolerance_rejects_wrong_kernels(bug, seq, q_scale, expect):
    ins = rand_qkv(1, seq[0], seq[1], 8, 2, 128, q_scale=q_scale, seed=3)
    res = verdicts(flash_sim(ins, True, **bug), ins, True)
    assert not res["O"].ok and expect in res["O"].message, res["O"].message


def test_tolerance_rejects_lse_in_log2_and_a_missing_key_block():
    ins = rand_qkv(1, 64, 512, 4, 4, 128, seed=4)
    res = verdicts(flash_sim(ins, False, lse_log2=True), ins, False)
    assert res["O"].ok and not res["LSE"].ok
    short = dict(ins, K=ins["K"][:, :384], V=ins["V"][:, :384])
    res = verdicts(flash_sim(short, False), ins, False)          # the last block of keys never read
    assert not res["O"].ok and not res["LSE"].ok


# ---------------------------------------------------------------- work counts

@pytest.mark.parametrize("Sq, Sk", [(1, 1), (5, 5), (3, 7), (7, 3), (128, 4096), (4096, 128), (1000, 1001)])
def test_visible_pairs_count_the_mask(Sq, Sk):
    assert problems.visible_pairs(Sq, Sk, True) == int(problems.causal_mask(Sq, Sk).sum())
    assert problems.visible_pairs(Sq, Sk, False) == Sq * Sk


def test_attention_flops_and_bytes():
    s = ATT.shape({"batch": 2, "seq_q": 4096, "seq_k": 4096, "heads_kv": 8, "group": 4})
    assert problems.attention_flops(s) == 4 * 2 * 32 * 4096 * 4096 * 128
    c = s._replace(causal=True)
    assert problems.attention_flops(c) == 4 * 2 * 32 * 128 * (4096 * 4097 // 2)
    r = s._replace(causal=True, seq_q=1024)          # the last 1024 queries of a 4096-key causal block
    assert problems.attention_flops(r) == 4 * 2 * 32 * 128 * (1024 * 3072 + 1024 * 1025 // 2)
    w = problems.attention_work(s)
    q_bytes = 2 * 4096 * 32 * 128 * 2
    kv_bytes = 2 * 4096 * 8 * 128 * 2
    assert w.bytes == 2 * q_bytes + 2 * kv_bytes + 4 * 2 * 32 * 4096 and w.flops == problems.attention_flops(s)


def test_gemm_reference_tolerance_and_work():
    g = problems.GEMM
    s = g.shape([128, 256, 4096])
    ins = g.make_inputs("lab", "part", s, 7, 0, "cpu")
    ref = g.reference(ins, {}, s)["D"]
    A, B = ins["A"].double(), ins["B"].double()
    assert ref.shape == (128, 256)
    assert torch.allclose(ref, torch.einsum("mk,nk->mn", A, B), rtol=1e-12, atol=1e-9)
    rows = torch.tensor([3, 100])
    assert torch.equal(g.reference(ins, {}, s, rows)["D"], ref[rows])
    tol = g.tolerance(s, ins)["D"]
    good = (ins["A"].float() @ ins["B"].float().T).half()
    assert compare.compare(good, ref, tol).ok
    bad = (ins["A"].float() @ ins["B"].float().T + ins["A"].float()[:, :1]).half()   # one K term twice
    assert not compare.compare(bad, ref, tol).ok
    transposed = (ins["A"].float() @ ins["B"].float().T).half()[:, list(range(1, 256)) + [0]]
    assert not compare.compare(transposed, ref, tol).ok
    assert g.work(s) == grading.Work(bytes=2 * (128 * 4096 + 256 * 4096 + 128 * 256), flops=2 * 128 * 256 * 4096)


def test_gemm_nn_takes_b_as_k_by_n():
    """Lab 4's problem: D = A @ B with B stored K x N; a kernel that computes Lab 5's A @ B.T of
    the same tensor fails, and the baseline multiplies B as stored."""
    g = problems.get("gemm_nn")
    s = g.shape([128, 256, 512])
    ins = g.make_inputs("lab4_gemm", "s3_correct", s, 7, 0, "cpu")
    assert ins["B"].shape == (512, 256) and g.call == problems.GEMM.call
    ref = g.reference(ins, {}, s)["D"]
    A, B = ins["A"].double(), ins["B"].double()
    assert ref.shape == (128, 256) and torch.allclose(ref, torch.einsum("mk,kn->mn", A, B), rtol=1e-12, atol=1e-9)
    tol = g.tolerance(s, ins)["D"]
    assert compare.compare((ins["A"].float() @ ins["B"].float()).half(), ref, tol).ok
    square = g.shape([256, 256, 256])
    sq = g.make_inputs("lab4_gemm", "s3_correct", square, 7, 0, "cpu")
    assert not compare.compare((sq["A"].float() @ sq["B"].float().T).half(), g.reference(sq, {}, square)["D"],
                               g.tolerance(square, sq)["D"]).ok
    base = g.baseline(sq, {}, square)
    base.fn()
    assert torch.allclose(base.outputs[0].double(), g.reference(sq, {}, square)["D"], atol=0.25)
    assert g.work(s) == problems.GEMM.work(s) and spec.load("lab4_gemm").part("s4_speed").params["problem"] == "gemm_nn"


# ---------------------------------------------------------------- declarations

def test_every_problem_is_declared_consistently():
    for p in problems.PROBLEMS.values():
        assert p.metric in ("bandwidth", "flops") and p.baseline_name
        assert [o.name for o in p.inputs + p.outputs] == [a for a in p.call if a not in {s.name for s in p.scalars}]
    assert problems.get("gemm") is problems.GEMM
    with pytest.raises(KeyError, match="problems: scale_add"):
        problems.get("flash")


def test_attention_shapes_parse_and_validate():
    s = ATT.shape({"batch": 2, "seq_q": 128, "seq_k": 256, "heads_kv": 2, "group": 8, "causal": True})
    assert (s.heads_q, s.head_dim, s.q_scale) == (16, 128, 1.0)
    assert ATT.builder_args(s) == (2, 128, 256, 16, 2, 128, True)
    assert ATT.shape([2, 128, 256, 16, 2, 128, True]) == s
    assert "MQA" in ATT.describe(ATT.shape({"batch": 1, "seq_q": 1, "seq_k": 1, "heads_q": 4, "heads_kv": 1}))
    for bad, why in [({"heads_q": 6, "heads_kv": 4}, "multiple"), ({"heads_q": 4, "heads_kv": 4, "head_dim": 96}, "head_dim"),
                     ({"heads_q": 4, "heads_kv": 4, "colour": 1}, "unknown")]:
        with pytest.raises(ValueError, match=why):
            ATT.shape({"batch": 1, "seq_q": 64, "seq_k": 64, **bad})


def test_inputs_are_seeded_outputs_poisoned():
    s = ATT.shape({"batch": 1, "seq_q": 16, "seq_k": 32, "heads_q": 4, "heads_kv": 2, "head_dim": 64})
    a = ATT.make_inputs("lab6", "p", s, 11, 2, "cpu")
    b = ATT.make_inputs("lab6", "p", s, 11, 2, "cpu")
    c = ATT.make_inputs("lab6", "p", s, 12, 2, "cpu")
    assert all(torch.equal(a[n], b[n]) for n in a) and not torch.equal(a["Q"], c["Q"])
    # input k of case i has index 3i + k, as grader.inputs.randn draws it
    assert torch.equal(a["K"], inputs.randn("lab6", "p", (1, 32, 2, 64), 11, torch.float16, "cpu", index=7))
    scaled = ATT.make_inputs("lab6", "p", s._replace(q_scale=10.0), 11, 2, "cpu")["Q"]
    assert torch.equal(scaled, (inputs.randn("lab6", "p", (1, 16, 4, 64), 11, torch.float32, "cpu", index=6) * 10).half())
    outs = ATT.make_outputs(s, "cpu")
    assert outs["O"].dtype == torch.float16 and outs["LSE"].dtype == torch.float32
    assert outs["LSE"].shape == (1, 4, 16) and torch.isnan(outs["O"]).all() and torch.isnan(outs["LSE"]).all()
    # Lab 4 keeps the seeds it had: A is input 2i, B input 2i + 1
    g = problems.GEMM.make_inputs("lab4_gemm", "s3_correct", problems.GEMM.shape([128, 128, 64]), 5, 3, "cpu")
    assert torch.equal(g["B"], inputs.randn("lab4_gemm", "s3_correct", (128, 64), 5, torch.float16, "cpu", index=7))


def test_hidden_shapes_follow_granule_max_and_choices():
    import random
    params = {"granule": [128, 128, 64], "hidden_max": [2048, 2048, 4096]}
    shapes = [problems.GEMM.draw_shape(random.Random(i), params) for i in range(50)]
    assert all(s.M % 128 == 0 and 128 <= s.M <= 2048 and s.K % 64 == 0 and s.K <= 4096 for s in shapes)
    assert len(set(shapes)) > 40
    params = {"granule": {"batch": 1, "seq_q": 64, "seq_k": 64},
              "hidden_max": {"batch": 3, "seq_q": 512, "seq_k": 512},
              "hidden_choices": {"heads_kv": [1, 2], "group": [1, 2, 4, 8, 16], "causal": [True, False]}}
    shapes = [ATT.draw_shape(random.Random(i), params) for i in range(60)]
    assert {s.heads_q // s.heads_kv for s in shapes} == {1, 2, 4, 8, 16} and {s.causal for s in shapes} == {True, False}
    assert any(s.seq_q > s.seq_k for s in shapes) and all(s.head_dim == 128 for s in shapes)


# ---------------------------------------------------------------- the runners on the CPU

FAKE_H200 = hardware.Device(True, "NVIDIA H200 (fake)", hardware.SPECS["H200"], "test")
FAKE_B200 = hardware.Device(True, "NVIDIA B200 (fake)", hardware.SPECS["B200"], "test")


def fake_timed_ratio(ratios, log):
    """Stands in for grading.timed_ratio: calls each function a few times (as the timing loop
    would), then grades the scripted ratio through grading.perf_outcome."""
    it = iter(ratios)

    def timed_ratio(ctx, kernel, kernel_work, baseline_name, baseline, baseline_work, metric,
                    measurements=None, extras=None):
        log.append("timed")
        for _ in range(3):
            kernel()
            baseline()
            for fn, _ in (extras or {}).values():
                fn()
        r = next(it)
        if r is None:
            return Outcome(0.0, "kernel: measured 0.001 us is faster than physically possible", {}, verdict="failed")
        unit = "TB/s" if metric == "bandwidth" else "TFLOP/s"
        meas = dict(measurements or {}, **{f"kernel_{unit}": 2.0 * r, f"{baseline_name}_{unit}": 2.0})
        meas.update({f"{x}_{unit}": 1.0 for x in (extras or {})})
        return grading.perf_outcome(ctx, r, meas, "fake timing")
    return timed_ratio


def cpu_env(ratios=(), log=None):
    log = [] if log is None else log

    def lower(built):
        log.append("lower")
        return built, "// CUDA source of a fake kernel"
    return runners.Env(device="cpu", lower=lower, sync=lambda: None,
                       timed_ratio=fake_timed_ratio(list(ratios), log), require_gpu=lambda ctx: None)


def context(lab, part, device=FAKE_H200, params=None, public_only=False, seed=inputs.PUBLIC_SEED):
    s = spec.load(lab)
    p = s.part(part)
    if params is not None:
        p = dataclasses.replace(p, params={**p.params, **params})
    return Context(s, p, seed, device, public_only=public_only)


def module(**builders):
    """A stand-in submission: each builder returns a torch function in place of a PrimFunc."""
    return types.SimpleNamespace(**builders)


def scale_add_kernel(n, half=False):
    def ex(x, y, out, alpha):
        stop = n // 2 if half else n
        out[:stop] = (alpha * x[:stop].float() + y[:stop].float()).half()
    return ex


def test_correctness_runner_passes_a_right_kernel_on_public_and_hidden_shapes():
    ctx = context("lab1_roofline", "b_correct", params={"public_shapes": [[65536], [131072]], "hidden_max": [524288]})
    out = runners.correctness(module(build_scale_add=scale_add_kernel), ctx, cpu_env())
    assert out.fraction == 1.0 and "5/5 shapes correct" in out.message, out.message
    assert len(out.measurements["shapes"]) == 5 and all(s[0] % 65536 == 0 for s in out.measurements["shapes"])


def test_correctness_runner_reports_unwritten_outputs_with_the_first_mismatch():
    ctx = context("lab1_roofline", "b_correct", public_only=True)
    out = runners.correctness(module(build_scale_add=lambda n: scale_add_kernel(n, half=True)), ctx, cpu_env())
    assert out.fraction == 0.0
    assert "0/3 shapes correct" in out.message and "NaN/Inf" in out.message and "first at [32768]" in out.message
    assert "build_scale_add" in out.message and "alpha=" in out.message


def test_correctness_runner_catches_a_kernel_that_writes_its_input():
    def ex(x, y, out, alpha):
        out.copy_((alpha * x.float() + y.float()).half())
        y.zero_()
    ctx = context("lab1_roofline", "b_correct", public_only=True)
    out = runners.correctness(module(build_scale_add=lambda n: ex), ctx, cpu_env())
    assert out.fraction == 0.0 and "wrote into its input y" in out.message


def _edge_gemm(overrun_rows=0, overrun_cols=0):
    """A stand-in for Lab 4's step 3 on a ragged shape: D = A @ B over whole 128 x 128 tiles, the
    edge tiles stored as far as the tile reaches (``overrun_*``: how far past D's last row or
    column an unclipped store of the tile writes, in the flat memory D lies in)."""
    def build(m, n, k):
        def ex(a, b, d):
            d.copy_((a.float() @ b.float()).half())
            flat = torch.as_strided(d, (d.numel() + overrun_rows * n,), (1,), d.storage_offset())
            if overrun_rows:
                flat[d.numel():] = 1.0                        # rows past M: after D's end
            if overrun_cols:
                torch.as_strided(d, (1,), (1,), d.storage_offset() - overrun_cols).fill_(1.0)
        return ex
    return build


def test_correctness_runner_catches_a_kernel_that_stores_past_its_output():
    """Lab 4's step 3 takes ragged M and N: an edge tile's rows past M, stored without a bound, lie
    past the end of D, where no element of D shows them; the guard bands around D do."""
    ctx = context("lab4_gemm", "s3_correct", params={"public_shapes": [[200, 328, 64]]}, public_only=True)
    right = runners.correctness(module(hopper_step3=_edge_gemm()), ctx, cpu_env())
    assert right.fraction == 1.0, right.message
    past = runners.correctness(module(hopper_step3=_edge_gemm(overrun_rows=56)), ctx, cpu_env())
    assert past.fraction == 0.0
    assert "wrote outside its output D: 36736 bytes after its end changed (the first at byte +0" in past.message, \
        past.message
    before = runners.correctness(module(hopper_step3=_edge_gemm(overrun_cols=8)), ctx, cpu_env())
    assert before.fraction == 0.0 and "bytes before its start changed (the nearest at byte -15)" in before.message, \
        before.message


def test_the_guard_bands_keep_an_output_contiguous_and_aligned():
    d = problems.guarded_empty((200, 328), torch.float16, "cpu")
    assert d.is_contiguous() and d.shape == (200, 328) and d.data_ptr() % 1024 == d._grader_guard[0].data_ptr() % 1024
    d.fill_(0)
    assert problems.outside_writes("D", d) is None
    assert problems.outside_writes("D", torch.zeros(3)) is None      # an output made without bands


def test_correctness_runner_grades_every_builder_of_a_list():
    def right(m, n):
        return lambda a, b: b.copy_(a.t())

    def wrong(m, n):                                     # forgets the last row of every tile
        def ex(a, b):
            b.copy_(a.t())
            b[:, 63::64] = 0
        return ex
    ctx = context("lab3_layout_swizzle", "d_correct", public_only=True)
    out = runners.correctness(module(build_transpose_plain=right, build_transpose_swizzled=wrong), ctx, cpu_env())
    assert out.fraction == 0.5 and "4/8 (builder, shape) pairs correct" in out.message, out.message
    assert "first failure: build_transpose_swizzled: b (64x64)" in out.message and "first at [0, 63]" in out.message


def test_with_a_prefetch_every_kernel_is_built_and_handed_over_before_the_first_is_lowered():
    """A notebook's check cell starts its kernels' compiles side by side: the runner builds every
    (builder, shape) first and gives the kernels to ``prefetch``, in the order it then lowers
    them; without a prefetch each case is built in its turn."""
    for with_prefetch in (True, False):
        log = []

        def build(m, n):
            log.append(("build", m, n))
            return ("kernel", m, n)
        env = cpu_env()
        real_lower = env.lower

        def lower(built):
            log.append(("lower",) + built[1:])
            return real_lower(lambda a, b: b.copy_(a.t()))
        env = dataclasses.replace(env, lower=lower,
                                  prefetch=(lambda ks: log.append(("prefetch", list(ks)))) if with_prefetch else None)
        ctx = context("lab3_layout_swizzle", "d_correct", public_only=True)
        out = runners.correctness(module(build_transpose_plain=build, build_transpose_swizzled=build), ctx, env)
        assert out.fraction == 1.0, out.message
        kinds = [e[0] for e in log]
        if with_prefetch:
            built = [e for e in log if e[0] == "build"]
            assert kinds[:len(built) + 1] == ["build"] * len(built) + ["prefetch"] and len(built) == 8
            handed = log[len(built)][1]
            lowered = [("kernel",) + e[1:] for e in log if e[0] == "lower"]
            assert handed == lowered == [("kernel",) + b[1:] for b in built]
        else:
            assert "prefetch" not in kinds and kinds[:4] == ["build", "lower", "build", "lower"]


def test_with_a_prefetch_a_builder_that_raises_does_so_after_the_cases_before_it():
    ran = []

    def build(m, n):
        if (m, n) == (1024, 512):
            raise ValueError("this shape is not supported")
        return lambda a, b: ran.append((m, n)) or b.copy_(a.t())
    env = dataclasses.replace(cpu_env(), prefetch=lambda ks: None)
    ctx = context("lab3_layout_swizzle", "d_correct", public_only=True)
    with pytest.raises(ValueError, match="not supported"):
        runners.correctness(module(build_transpose_plain=build, build_transpose_swizzled=build), ctx, env)
    assert ran == [(64, 64), (128, 320)]               # the public shapes before (1024, 512) ran


def test_a_speed_part_hands_its_kernels_to_the_prefetch_before_it_lowers_them():
    log = []
    env = cpu_env([1.0, 1.0], log)
    env = dataclasses.replace(env, prefetch=lambda ks: log.append(("prefetch", len(ks))))
    ctx = context("lab1_roofline", "b_speed", params={"shapes": [[65536], [131072]]})
    out = runners.speed(module(build_scale_add=scale_add_kernel), ctx, env)
    assert out.fraction > 0 and log[0] == ("prefetch", 2) and log.count("lower") == 2, log


@pytest.mark.parametrize("device, builders, picked", [
    (FAKE_H200, None, "hopper_step2"), (FAKE_B200, None, "blackwell_step2"),
    (FAKE_B200, {"hopper": "hopper_step2", "blackwell": "blackwell_step2"}, "blackwell_step2")])
def test_correctness_runner_picks_the_builder_of_the_gpus_track(device, builders, picked):
    called = []

    def builder(name):
        def build(M, N, K):
            called.append((name, M, N, K))
            return lambda A, B, D: D.copy_((A.float() @ B.float()).half())   # Lab 4: D = A @ B, B [K, N]
        return build
    params = {"builders": builders} if builders else None
    ctx = context("lab4_gemm", "s2_correct", device=device, params=params)
    sub = module(hopper_step2=builder("hopper_step2"), blackwell_step2=builder("blackwell_step2"))
    out = runners.correctness(sub, ctx, cpu_env())
    assert out.fraction == 1.0 and out.message.startswith(picked), out.message
    assert {c[0] for c in called} == {picked} and len(called) == 7     # 5 public shapes, 2 hidden
    assert all(M == N == 128 and K % 64 == 0 for _, M, N, K in called)


def test_correctness_runner_on_attention_with_gqa():
    params = {"problem": "attention", "builder": "build_attention",
              "public_shapes": [{"batch": 2, "seq_q": 64, "seq_k": 192, "heads_kv": 2, "group": 4, "causal": True},
                                {"batch": 1, "seq_q": 96, "seq_k": 32, "heads_kv": 1, "group": 2, "causal": True,
                                 "head_dim": 64}],
              "hidden_shapes": 0}
    ctx = context("lab4_gemm", "s1_correct", params=params)
    ctx = dataclasses.replace(ctx, part=dataclasses.replace(ctx.part, params={k: v for k, v in ctx.part.params.items()
                                                                              if k != "builders"}))

    def build(gqa):
        def builder(B, Sq, Sk, Hq, Hkv, D, causal):
            assert isinstance(causal, bool) and Hq % Hkv == 0
            def ex(Q, K, V, O, LSE):
                got = flash_sim({"Q": Q, "K": K, "V": V}, causal, block=64, gqa=gqa)
                O.copy_(got["O"])
                LSE.copy_(got["LSE"])
            return ex
        return builder
    out = runners.correctness(module(build_attention=build("div")), ctx, cpu_env())
    assert out.fraction == 1.0, out.message
    out = runners.correctness(module(build_attention=build("mod")), ctx, cpu_env())
    assert out.fraction == 0.5 and "O (B=2 Sq=64 Sk=192 Hq=8 Hkv=2 (group 4)" in out.message, out.message


def transpose_module(log, swizzled_ok=True, plain_ok=True, wrong_after=None):
    def make(ok, name):
        def builder(m, n):
            log.append(f"build {name}")
            calls = [0]

            def ex(a, b):
                calls[0] += 1
                b.copy_(a.t())
                if not ok or (wrong_after is not None and calls[0] > wrong_after):
                    b[0, 0] += 1
            return ex
        return builder
    return module(build_transpose_swizzled=make(swizzled_ok, "swizzled"), build_transpose_plain=make(plain_ok, "plain"))


SMALL_TRANSPOSE = {"shapes": [[128, 64], [64, 192]]}


def test_speed_runner_times_against_the_baseline_and_takes_the_geometric_mean():
    log = []
    ctx = context("lab3_layout_swizzle", "d_speed", params=SMALL_TRANSPOSE)
    out = runners.speed(transpose_module(log), ctx, cpu_env([0.5, 2.0], log))
    assert out.measurements["ratio"] == pytest.approx(1.0) and out.fraction == 1.0    # full credit at 0.85x
    assert "geometric mean over 2 shapes of the ratio to copy" in out.message, out.message
    assert "build_transpose_plain 1.00 (kernel 1.00x)" in out.message and "torch 1.00" in out.message
    # every kernel is built before the first timing (timing stops the submission's processes)
    assert log.index("timed") > max(i for i, e in enumerate(log) if e.startswith("build") or e == "lower")
    assert log.count("build swizzled") == log.count("build plain") == 2


def test_speed_runner_credit_follows_the_threshold_row():
    ctx = context("lab3_layout_swizzle", "d_speed", params={"shapes": [[64, 64]]})
    out = runners.speed(transpose_module([]), ctx, cpu_env([0.775]))
    assert out.fraction == pytest.approx(0.5) and out.measurements["threshold_row"] == "threshold row H200"


def test_speed_runner_does_not_time_a_wrong_kernel():
    ctx = context("lab3_layout_swizzle", "d_speed", params=SMALL_TRANSPOSE)
    log = []
    out = runners.speed(transpose_module(log, swizzled_ok=False), ctx, cpu_env([1.0, 1.0], log))
    assert out.fraction == 0.0 and "not timed: wrong result at 128x64" in out.message and "timed" not in log


def test_speed_runner_checks_again_after_timing():
    ctx = context("lab3_layout_swizzle", "d_speed", params=SMALL_TRANSPOSE)
    out = runners.speed(transpose_module([], wrong_after=1), ctx, cpu_env([1.0, 1.0]))
    assert out.fraction == 0.0 and "wrong result after timing at 128x64" in out.message, out.message


def test_speed_runner_sees_what_the_timed_calls_wrote():
    """A kernel that does the work on its first call only (then returns at once) passes the check
    before timing; the outputs are poisoned again before timing, so the check after it fails."""
    def builder(m, n):
        calls = [0]

        def ex(a, b):
            calls[0] += 1
            if calls[0] == 1:
                b.copy_(a.t())
        return ex
    ctx = context("lab3_layout_swizzle", "d_speed", params={"shapes": [[64, 64]]})
    out = runners.speed(module(build_transpose_swizzled=builder, build_transpose_plain=builder), ctx, cpu_env([1.0]))
    assert out.fraction == 0.0 and "after timing" in out.message and "NaN/Inf" in out.message, out.message


def test_speed_runner_records_a_wrong_extra_kernel_without_failing():
    ctx = context("lab3_layout_swizzle", "d_speed", params={"shapes": [[64, 64]]})
    out = runners.speed(transpose_module([], plain_ok=False), ctx, cpu_env([1.0]))
    assert out.fraction == 1.0
    skipped = out.measurements["shapes"][0]["extras_skipped"]
    assert "build_transpose_plain" in skipped and "wrong result" in skipped["build_transpose_plain"]


def test_speed_runner_fails_an_impossible_time():
    ctx = context("lab3_layout_swizzle", "d_speed", params={"shapes": [[64, 64]]})
    out = runners.speed(transpose_module([]), ctx, cpu_env([None]))
    assert out.verdict == "failed" and "physically possible" in out.message


def test_speed_runner_samples_rows_of_a_gemm():
    def builder(skip_odd_rows):
        def build(M, N, K):
            def ex(A, B, D):
                D.copy_((A.float() @ B.float()).half())   # Lab 4: D = A @ B, B [K, N]
                if skip_odd_rows:
                    D[1::2] = float("nan")
            return ex
        return build
    ctx = context("lab4_gemm", "s4_speed", params={"shapes": [[256, 128, 64], [128, 128, 64]], "check_rows": 16})
    out = runners.speed(module(hopper_step4=builder(False)), ctx, cpu_env([0.7, 0.7]))
    assert out.fraction == 1.0, out.message
    out = runners.speed(module(hopper_step4=builder(True)), ctx, cpu_env([0.7, 0.7]))
    assert out.fraction == 0.0 and "D (256x128x64, before timing, 16 sampled rows)" in out.message, out.message
    assert "NaN/Inf" in out.message


def test_a_speed_part_times_one_builder():
    ctx = context("lab3_layout_swizzle", "d_speed",
                  params={"builders": ["build_transpose_plain", "build_transpose_swizzled"]})
    ctx = dataclasses.replace(ctx, part=dataclasses.replace(
        ctx.part, params={k: v for k, v in ctx.part.params.items() if k != "builder"}))
    with pytest.raises(ValueError, match="times one builder"):
        runners.speed(transpose_module([]), ctx, cpu_env([1.0]))


# ---------------------------------------------------------------- the specs and grade()

KERNEL_PARTS = [(lab, p) for lab in spec.lab_names() for p in spec.load(lab).parts if p.kind == "kernel"]


@pytest.mark.parametrize("lab, part", KERNEL_PARTS, ids=[f"{lab}.{p.id}" for lab, p in KERNEL_PARTS])
def test_every_kernel_part_is_declared_data(lab, part):
    prob = problems.get(part.params["problem"])
    for raw in part.params.get("public_shapes", []) + part.params.get("shapes", []):
        prob.shape(raw)
    fn = dispatch.grading_function(lab, part)
    assert fn is runners.kernel_part, f"{lab}.{part.id} is graded by {fn}, not the default runner"
    if part.thresholds:
        assert "shapes" in part.params
    else:
        assert "public_shapes" in part.params


def test_grade_falls_back_to_the_default_runner(monkeypatch):
    monkeypatch.setattr(runners, "default_env", lambda: cpu_env())
    ctx = context("lab1_roofline", "b_correct", public_only=True)
    out = dispatch.grade("lab1_roofline", "b_correct", module(build_scale_add=scale_add_kernel), ctx)
    assert out.fraction == 1.0 and "3/3 shapes correct" in out.message


def test_a_part_without_a_grading_function_or_a_problem_is_an_error():
    part = dataclasses.replace(spec.load("lab1_roofline").part("b_correct"), id="z_new", params={"builder": "b"})
    with pytest.raises(KeyError, match="must name its problem"):
        dispatch.grading_function("lab1_roofline", part)
    part = dataclasses.replace(part, kind="function")
    with pytest.raises(KeyError, match="no default runner"):
        dispatch.grading_function("lab1_roofline", part)
    # a lab with no module of its own (data only) still resolves its declared parts
    assert dispatch.grading_function("lab9_future", spec.load("lab1_roofline").part("b_speed")) is runners.kernel_part


def test_persistent_builders_get_the_sm_count_read_from_the_device():
    seen = []

    def build(M, N, K, num_sms):
        seen.append(num_sms)
        return lambda A, B, D: D.copy_((A.float() @ B.float()).half())   # Lab 4: D = A @ B, B [K, N]
    env = cpu_env()
    env.sm_count = lambda: 77                          # what the GPU reports, not a table
    ctx = context("lab4_gemm", "s2_correct", params={"num_sms": "device"}, public_only=True)
    out = runners.correctness(module(hopper_step2=build), ctx, env)
    assert out.fraction == 1.0 and seen and set(seen) == {77} and out.measurements["num_sms"] == 77
    with pytest.raises(TypeError):                     # without the param, no num_sms is passed
        runners.correctness(module(hopper_step2=build), context("lab4_gemm", "s2_correct", public_only=True), cpu_env())


def test_hidden_shapes_use_the_finer_grid_of_the_gpus_track():
    params = {"granule_by_track": {"hopper": [8, 8, 64]}, "hidden_shapes": 40, "public_shapes": [[128, 128, 64]],
              "granule": [128, 128, 64], "hidden_max": [3072, 3072, 2048]}
    hopper = runners.case_shapes(problems.get("gemm"), context("lab4_gemm", "s2_correct", FAKE_H200, params))
    blackwell = runners.case_shapes(problems.get("gemm"), context("lab4_gemm", "s2_correct", FAKE_B200, params))
    assert all(s.M % 8 == 0 and s.N % 8 == 0 and s.K % 64 == 0 for s in hopper[1:])
    assert any(s.M % 128 or s.N % 128 for s in hopper[1:])             # off the tile grid somewhere
    assert all(s.M % 128 == 0 and s.N % 128 == 0 for s in blackwell[1:])


def _recording(names, log):
    """Builders that record (name, args, kwargs) and return a torch stand-in of a GEMM/transpose."""
    def make(name):
        def builder(*args, **kw):
            log.append((name, tuple(args), kw))
            if len(args) == 2:
                return lambda a, b: b.copy_(a.t())
            return lambda A, B, D: D.copy_((A.float() @ B.float().T).half())
        return builder
    return module(**{n: make(n) for n in names})


@pytest.mark.parametrize("lab,part,params", [
    ("lab5_gemm_pipeline", "s7_correct", None),                       # hidden shapes, num_sms, a track's shapes
    ("lab3_layout_swizzle", "d_correct", {"public_shapes": [[64, 64]], "hidden_shapes": 2}),   # two builders
    ("lab3_layout_swizzle", "d_speed", SMALL_TRANSPOSE),              # the timed builder and an extra one
])
def test_the_calls_built_ahead_are_the_calls_the_runner_makes(lab, part, params):
    ctx = context(lab, part, params=params)
    env = cpu_env([1.0, 1.0])
    env.sm_count = lambda: 77
    planned = runners.planned_calls(ctx, 77)
    log = []
    names = sorted({n for n, _, _ in planned})
    runners.kernel_part(_recording(names, log), ctx, env)
    assert planned and log == planned
    hidden = context(lab, part, params=params, seed=12345)
    assert ctx.part.thresholds or runners.planned_calls(hidden, 77) != planned   # the seed draws other shapes

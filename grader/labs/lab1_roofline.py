"""Grading functions of Lab 1 (roofline). Contract with the notebook:

- ``op_flops(op) -> float``, ``op_bytes(op) -> float``, ``predict(op, gpu) -> (seconds, bound)``
  for the operation dictionaries described in the notebook (kinds elementwise, reduction,
  gemm, attention) and a gpu dictionary {"name", "peak_tflops", "bandwidth_tbps"}.
- ``build_scale_add(n) -> PrimFunc`` computing out = alpha * x + y over fp16 vectors of
  length n (a multiple of 65536), called as kernel(x, y, out, alpha).
- ``attainable_tflops(gpu, ai) -> float`` and ``plot_roofline(gpu, points, path)``.
"""
from __future__ import annotations


from .. import compare, hardware, inputs
from ..context import Context, Outcome
from . import common

LAB = "lab1_roofline"


# ---------------------------------------------------------------- reference answers

def ref_flops(op: dict) -> float:
    k = op["kind"]
    if k == "elementwise":
        return float(op["n"] * op["flops_per_element"])
    if k == "reduction":
        return float(op["rows"] * op["cols"])
    if k == "gemm":
        return float(2 * op["m"] * op["n"] * op["k"])
    if k == "attention":
        f = 4 * op["batch"] * op["heads"] * op["seq"] ** 2 * op["head_dim"]
        return float(f / 2 if op["causal"] else f)
    raise ValueError(k)


def ref_bytes(op: dict) -> float:
    k, b = op["kind"], op["dtype_bytes"]
    if k == "elementwise":
        return float(op["n"] * (op["inputs"] + op["outputs"]) * b)
    if k == "reduction":
        return float((op["rows"] * op["cols"] + op["rows"]) * b)
    if k == "gemm":
        return float((op["m"] * op["k"] + op["n"] * op["k"] + op["m"] * op["n"]) * b)
    if k == "attention":
        return float(4 * op["batch"] * op["heads"] * op["seq"] * op["head_dim"] * b)
    raise ValueError(k)


def ref_predict(op: dict, gpu: dict) -> tuple[float, str]:
    t_c = ref_flops(op) / (gpu["peak_tflops"] * 1e12)
    t_m = ref_bytes(op) / (gpu["bandwidth_tbps"] * 1e12)
    return (max(t_c, t_m), "compute" if t_c >= t_m else "memory")


def ref_attainable(gpu: dict, ai: float) -> float:
    return min(gpu["peak_tflops"], gpu["bandwidth_tbps"] * ai)


def gpu_dict(name: str) -> dict:
    s = hardware.SPECS[name]
    return {"name": s.name, "peak_tflops": s.fp16_tflops, "bandwidth_tbps": s.hbm_tbps}


# ---------------------------------------------------------------- cases

PUBLIC_OPS = [
    {"kind": "elementwise", "n": 1 << 28, "inputs": 2, "outputs": 1, "flops_per_element": 2, "dtype_bytes": 2},
    {"kind": "reduction", "rows": 8192, "cols": 8192, "dtype_bytes": 4},
    {"kind": "gemm", "m": 4096, "n": 4096, "k": 4096, "dtype_bytes": 2},
    {"kind": "gemm", "m": 1, "n": 8192, "k": 8192, "dtype_bytes": 2},
    {"kind": "attention", "batch": 1, "heads": 32, "seq": 4096, "head_dim": 128, "causal": False, "dtype_bytes": 2},
    {"kind": "attention", "batch": 2, "heads": 16, "seq": 8192, "head_dim": 64, "causal": True, "dtype_bytes": 2},
]


def random_op(r) -> dict:
    kind = r.choice(["elementwise", "reduction", "gemm", "gemm", "attention"])
    b = r.choice([1, 2, 4])
    if kind == "elementwise":
        return {"kind": kind, "n": r.randrange(1, 1 << 30), "inputs": r.randint(1, 4), "outputs": r.randint(1, 2),
                "flops_per_element": r.randint(0, 40), "dtype_bytes": b}
    if kind == "reduction":
        return {"kind": kind, "rows": r.randint(1, 1 << 16), "cols": r.randint(2, 1 << 16), "dtype_bytes": b}
    if kind == "gemm":
        return {"kind": kind, "m": r.choice([1, r.randint(1, 32768)]), "n": r.randint(1, 32768),
                "k": r.randint(1, 32768), "dtype_bytes": b}
    return {"kind": kind, "batch": r.randint(1, 8), "heads": r.randint(1, 64), "seq": r.randint(1, 32768),
            "head_dim": r.choice([64, 128, 256]), "causal": r.random() < 0.5, "dtype_bytes": b}


def op_cases(ctx: Context) -> list[dict]:
    ops = list(PUBLIC_OPS)
    if not ctx.public_only:
        r = inputs.rng(LAB, ctx.part.id, ctx.seed)
        ops += [random_op(r) for _ in range(ctx.part.params["hidden_cases"])]
    return ops


def _label(args) -> str:
    return ", ".join(repr(a) for a in args)


# ---------------------------------------------------------------- part a

def grade_flops(module, ctx: Context) -> Outcome:
    fn = common.student(module, "op_flops")
    cases = [((op,), ref_flops(op)) for op in op_cases(ctx)]
    return common.grade_cases(fn, cases, common.scalar_match(ctx.part.params["rel_tol"]), _label)


def grade_bytes(module, ctx: Context) -> Outcome:
    fn = common.student(module, "op_bytes")
    cases = [((op,), ref_bytes(op)) for op in op_cases(ctx)]
    return common.grade_cases(fn, cases, common.scalar_match(ctx.part.params["rel_tol"]), _label)


def grade_predict(module, ctx: Context) -> Outcome:
    fn = common.student(module, "predict")
    rel = ctx.part.params["rel_tol"]
    cases = [((op, gpu_dict(g)), ref_predict(op, gpu_dict(g))) for op in op_cases(ctx) for g in ("B200", "H200")]

    def same(got, exp) -> bool:
        try:
            t, bound = got
        except (TypeError, ValueError):
            return False
        return compare.close_scalar(t, exp[0], rel=rel) and bound == exp[1]

    return common.grade_cases(fn, cases, same, lambda a: f"{a[0]!r} on {a[1]['name']}")


# ---------------------------------------------------------------- part b

def grade_build(module, ctx: Context) -> Outcome:
    return common.build_part(module, ctx)


def _run_scale_add(ex, n: int, alpha: float, ctx: Context, index: int):
    import torch
    x = inputs.randn(LAB, ctx.part.id, (n,), ctx.seed, torch.float16, "cuda", index=2 * index)
    y = inputs.randn(LAB, ctx.part.id, (n,), ctx.seed, torch.float16, "cuda", index=2 * index + 1)
    out = inputs.poisoned_like(x)
    ex(x.clone(), y.clone(), out, alpha)
    torch.cuda.synchronize()
    ref = alpha * x.double() + y.double()
    return compare.compare(out, ref, compare.tolerance(torch.float16), name=f"out (n={n}, alpha={alpha})")


def _alpha(ctx: Context, index: int) -> float:
    r = inputs.rng(LAB, f"{ctx.part.id}-alpha{index}", ctx.seed)
    return round(r.uniform(-3, 3), 3)


def grade_correct(module, ctx: Context) -> Outcome:
    from .. import build
    common.require_gpu(ctx)
    p = ctx.part.params
    builder = common.student(module, p["builder"])
    sizes = list(p["public_sizes"])
    if not ctx.public_only:
        r = inputs.rng(LAB, ctx.part.id, ctx.seed)
        sizes += [p["granule"] * r.randint(1, p["hidden_max"] // p["granule"]) for _ in range(p["hidden_sizes"])]
    fails, meas = [], {"sizes": sizes}
    for i, n in enumerate(sizes):
        alpha = _alpha(ctx, i)
        ex, _ = build.lower(builder(n))
        res = _run_scale_add(ex, n, alpha, ctx, i)
        if not res.ok:
            fails.append(res.message)
    ok = len(sizes) - len(fails)
    msg = f"{ok}/{len(sizes)} sizes correct" + (f"; {fails[0]}" if fails else "")
    return Outcome(ok / len(sizes), msg, meas)


def grade_speed(module, ctx: Context) -> Outcome:
    import torch
    from .. import build
    common.require_gpu(ctx)
    p = ctx.part.params
    n, alpha = p["n"], p["alpha"]
    ex, _ = build.lower(common.student(module, p["builder"])(n))
    check = _run_scale_add(ex, n, alpha, ctx, 0)
    if not check.ok:
        return Outcome(0.0, f"not timed: wrong result at the timing size; {check.message}")
    x = torch.randn(n, device="cuda").half()
    y = torch.randn(n, device="cuda").half()
    out, copy_dst = torch.empty_like(x), torch.empty_like(x)
    return common.timed_ratio(ctx, lambda: ex(x, y, out, alpha), common.Work(bytes=3 * n * 2),
                              "copy", lambda: copy_dst.copy_(x), common.Work(bytes=2 * n * 2),
                              "bandwidth", {"n": n})


# ---------------------------------------------------------------- part c

def grade_roofline(module, ctx: Context) -> Outcome:
    p = ctx.part.params
    fn = common.student(module, p["function"])
    ais = [0.25, 1.0, 10.0, 206.0, 281.25, 1000.0]
    if not ctx.public_only:
        r = inputs.rng(LAB, ctx.part.id, ctx.seed)
        ais += [10 ** r.uniform(-2, 4) for _ in range(p["hidden_cases"])]
    cases = [((gpu_dict(g), ai), ref_attainable(gpu_dict(g), ai)) for ai in ais for g in ("B200", "H200", "H100")]
    values = common.grade_cases(fn, cases, common.scalar_match(p["rel_tol"]),
                                lambda a: f"{a[0]['name']} at {a[1]:.4g} FLOP/B")
    plot = common.student(module, p["plot"])
    points = [{"label": "scale-add", "ai": 1 / 3, "tflops": 1.4}, {"label": "gemm 4096", "ai": 1365.0, "tflops": 700.0}]
    img_ok, img_msg = common.plotted_png(lambda path: plot(gpu_dict("H200"), points, path), "plot_roofline")
    frac = 0.5 * values.fraction + (0.5 if img_ok else 0.0)
    return Outcome(frac, f"attainable_tflops: {values.message}; plot: {img_msg}", values.measurements)


GRADERS = {
    "a_flops": grade_flops,
    "a_bytes": grade_bytes,
    "a_predict": grade_predict,
    "b_build": grade_build,
    "b_correct": grade_correct,
    "b_speed": grade_speed,
    "c_roofline": grade_roofline,
}

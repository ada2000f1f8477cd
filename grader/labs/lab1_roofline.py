"""Grading functions of Lab 1 (roofline). Contract with the notebook:

- ``op_flops(op) -> float``, ``op_bytes(op) -> float``, ``predict(op, gpu) -> (seconds, bound)``
  for the operation dictionaries described in the notebook (kinds elementwise, reduction,
  gemm, attention) and a gpu dictionary {"name", "peak_tflops", "bandwidth_tbps"}.
- ``build_scale_add(n) -> PrimFunc`` computing out = alpha * x + y over fp16 vectors of
  length n (a multiple of 65536), called as kernel(x, y, out, alpha): the problem
  ``scale_add`` of grader/problems.py, whose kernel parts the default runners grade.
- ``attainable_tflops(gpu, ai) -> float`` and ``plot_roofline(gpu, points, path)``.
"""
from __future__ import annotations


from .. import compare, grading, hardware, inputs, timing
from ..context import Context, Outcome

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


def op_calls(kind: str):
    return lambda ctx: [(kind, (op,)) for op in op_cases(ctx)]


def predict_calls(ctx: Context) -> list[tuple]:
    return [("predict", (op, gpu_dict(g))) for op in op_cases(ctx) for g in ("B200", "H200")]


def roofline_calls(ctx: Context) -> list[tuple]:
    ais = list(PUBLIC_AIS)
    if not ctx.public_only:
        r = inputs.rng(LAB, ctx.part.id, ctx.seed)
        ais += [10 ** r.uniform(-2, 4) for _ in range(ctx.part.params["hidden_cases"])]
    return [("attainable", (gpu_dict(g), ai)) for ai in ais for g in ("B200", "H200", "H100")]


QUESTIONS = {   # CPU questions declared as data: graded by grading.grade_question (grader/dispatch.py)
    "a_flops": grading.Question(op_calls("flops"), answers={"flops": ref_flops}, params={"flops": ("op",)},
                                compare="close"),
    "a_bytes": grading.Question(op_calls("bytes"), answers={"bytes": ref_bytes}, params={"bytes": ("op",)},
                                compare="close"),
}
PREDICT = grading.Question(predict_calls, answers={"predict": ref_predict}, params={"predict": ("op", "gpu")},
                           compare="time_bound")
ATTAINABLE = grading.Question(roofline_calls, answers={"attainable": ref_attainable},
                              params={"attainable": ("gpu", "ai")}, compare="close")


# ---------------------------------------------------------------- part a: predict


def _own_bound(module, op: dict, gpu: dict) -> tuple[float, str] | None:
    """The roofline bound of ``op`` from the student's own op_flops and op_bytes, or None when
    they do not both give a number."""
    from ..sandbox import SandboxFailure
    try:
        flops, nbytes = float(module.op_flops(op)), float(module.op_bytes(op))
    except (SandboxFailure, timing.KernelHang):
        raise
    except Exception:  # noqa: BLE001 - their own error is a_flops' or a_bytes' verdict, not this one's
        return None
    t_c, t_m = flops / (gpu["peak_tflops"] * 1e12), nbytes / (gpu["bandwidth_tbps"] * 1e12)
    return (max(t_c, t_m), "compute" if t_c >= t_m else "memory")


def grade_predict(module, ctx: Context) -> Outcome:
    """a_predict grades what predict() adds: the roofline bound from FLOPs and bytes. An answer is
    right when it is the bound of the reference FLOPs and bytes, or the bound of the student's own
    op_flops(op) and op_bytes(op): a wrong op_flops or op_bytes costs a_flops or a_bytes, not
    a_predict too. The calls are graded as the declared question first (which is also what the
    student edition records); only when an answer is not the reference's are they graded again,
    asking the student's op_flops and op_bytes for that case."""
    first = grading.grade_question(PREDICT, module, ctx)
    if first.fraction == 1.0:
        return first
    close = compare.answer_check("time_bound", compare.part_tolerance(ctx.part.params))
    predict = grading.student(module, "predict")
    n_public = grading.public_len(predict_calls, ctx)

    def same_for(op, gpu):
        def same(got, expected):
            if close(got, expected):
                return True
            own = _own_bound(module, op, gpu)
            if own is not None and close(got, own):
                return True
            also = f" (or {list(own)}, the bound of your own op_flops and op_bytes)" if own is not None else ""
            return False, f"got {got!r}, expected {list(expected)}{also}"
        return same

    return grading.grade_calls([
        grading.Call("predict", (lambda a=args: f"predict(op={a[0]!r}, gpu={a[1]!r})"), (lambda a=args: predict(*a)),
                     ref_predict(*args), same_for(*args), i >= n_public)
        for i, (_, args) in enumerate(predict_calls(ctx))], ctx=ctx)


# ---------------------------------------------------------------- part c

def grade_roofline(module, ctx: Context) -> Outcome:
    p = ctx.part.params
    values = grading.grade_question(ATTAINABLE, module, ctx)
    gpu = gpu_dict("H200")
    points = [{"label": "scale-add", "ai": 1 / 3, "tflops": 1.4}, {"label": "gemm 4096", "ai": 1365.0, "tflops": 700.0}]
    plot_ok, plot_msg = check_roofline_figure(grading.figure(module, p["plot"], gpu, points), gpu, points)
    frac = 0.5 * values.fraction + (0.5 if plot_ok else 0.0)
    return Outcome(frac, f"attainable_tflops: {values.message}; plot: {plot_msg}", values.measurements)


PUBLIC_AIS = (0.25, 1.0, 10.0, 206.0, 281.25, 1000.0)


def check_roofline_figure(axes: list[dict], gpu: dict, points: list[dict]) -> tuple[bool, str]:
    """What the lab asks of the plot: log-log axes; a roofline through the ridge (a line that
    follows min(peak, bandwidth x AI) on both sides of the ridge point); every measured point
    drawn at its (AI, TFLOP/s)."""
    if not axes:
        return False, "no figure was saved to the path given"
    ridge = gpu["peak_tflops"] / gpu["bandwidth_tbps"]
    problems = []
    for ax in axes:
        problems = []
        if ax.get("xscale") != "log" or ax.get("yscale") != "log":
            problems.append(f"axes are {ax.get('xscale')}-{ax.get('yscale')}, not log-log")
        on_roof = [(x, y) for line in ax.get("lines", []) for x, y in line
                   if x > 0 and grading.near(y, ref_attainable(gpu, x), 0.02)]
        if not (any(x < ridge / 2 for x, _ in on_roof) and any(x > ridge * 2 for x, _ in on_roof)):
            problems.append(f"no line follows the roofline on both sides of the ridge (AI {ridge:.0f} FLOP/B)")
        drawn = [xy for line in ax.get("lines", []) for xy in line] + ax.get("points", [])
        missing = [pt["label"] for pt in points
                   if not any(grading.near(x, pt["ai"], 0.01) and grading.near(y, pt["tflops"], 0.01) for x, y in drawn)]
        if missing:
            problems.append(f"measured point(s) not drawn: {', '.join(missing)}")
        if not problems:
            return True, "log-log roofline through the ridge, measured points drawn"
    return False, "; ".join(problems)


GRADERS = {
    # b_build: the default build runner (grading.build_part); b_correct and b_speed: problem
    # "scale_add" (grader/problems.py), graded by grader/runners.py
    "a_predict": grade_predict,
    "c_roofline": grade_roofline,
}

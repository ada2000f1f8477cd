"""Default runners of kernel parts: one correctness runner and one speed runner for every
problem declared in grader/problems.py.

A spec part of kind "kernel" names its problem and its builders in ``params``::

    problem = "gemm"
    builder = "build_x"                                   # one builder, or
    builders = ["build_plain", "build_swizzled"]          # several (correctness: each one), or
    builders = { sm_90a = "hopper_x", sm_100a = "blackwell_x" }   # one per track (also
                                                          # hopper = ..., blackwell = ...)

Correctness parts (no threshold table) give ``public_shapes`` and, for hidden runs,
``hidden_shapes`` (how many) with ``granule`` / ``hidden_max`` (and optionally
``hidden_choices``): see ``Problem.draw_shape``. ``shapes_by_track = { sm_90a = [[...], ...] }``
adds public shapes that only the kernels of one track take (run after ``public_shapes`` when the
GPU is of that track). Every (builder, shape) pair runs on seeded inputs (cloned; the reference
uses the untouched originals) into NaN-poisoned outputs, and is compared with the problem's
float64 reference under its tolerance (grader.compare reports NaN/Inf, the first and the worst
mismatch). The fraction is the share of pairs right.

Speed parts (a threshold table) give ``shapes``, optionally ``scalars`` (fixed scalar arguments),
``check_rows`` (check a sample of rows of large outputs instead of all) and
``extra_builders`` (the student's other kernels, timed in the same rotation and recorded, not
graded). Per shape: check, time against the problem's baseline through grading.timed_ratio,
check the outputs of the timed calls again; credit on the geometric mean of the ratios
(grading.perf_outcome against the part's threshold row).

Contract with the rest of the grader: a kernel is obtained only as
``ex, cuda_source = build.lower(grading.student(module, name)(*builder_args))`` and called as
``ex(*tensors_and_scalars)``; the GPU is waited for only with ``grading.sync()``; time is taken
only by ``grading.timed_ratio``. :class:`Env` is the seam that lets the tests run the same code on
the CPU with a torch function standing in for ``ex``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from . import build, compare, inputs, problems, timing
from .context import Context, Outcome
from . import grading

TRACK_ALIASES = {"hopper": "sm_90a", "blackwell": "sm_100a"}


def lower_explained(built):
    """build.lower, with grading.explain_build_error's words added to a failure (a TIRx call that
    apache-tvm 0.26 cannot lower is named, with what to use instead)."""
    try:
        return build.lower(built)
    except Exception as e:
        if type(e).__name__ in ("BuildError", "BuildFailed"):
            explained = grading.explain_build_error(e)
            if explained != str(e):
                raise type(e)(explained) from e
        raise


@dataclasses.dataclass
class Env:
    """Where and how kernels run. The defaults are the GPU's; tests put the CPU and a fake
    ``lower`` (returning a torch function) here."""
    device: str = "cuda"
    lower: Callable[[Any], tuple[Callable, str]] = lambda built: lower_explained(built)
    sync: Callable[[], None] = lambda: grading.sync()
    timed_ratio: Callable[..., Outcome] = lambda *a, **k: grading.timed_ratio(*a, **k)
    require_gpu: Callable[[Context], Any] = lambda ctx: grading.require_gpu(ctx)
    sm_count: Callable[[], int] = lambda: torch.cuda.get_device_properties(0).multi_processor_count


def default_env() -> Env:
    return Env()


# ---------------------------------------------------------------- what a part names

def builder_names(params: dict, ctx: Context) -> list[str]:
    """The builders a kernel part runs: ``builder``, a list ``builders``, or ``builders`` keyed by
    track (the GPU's track picks one; ``hopper``/``blackwell`` are accepted for sm_90a/sm_100a)."""
    if "builder" in params:
        return [params["builder"]]
    b = params.get("builders")
    if b is None:
        raise KeyError(f"{ctx.lab.lab}.{ctx.part.id}: a kernel part names `builder` or `builders`")
    if isinstance(b, dict):
        keyed = by_track(b)
        track = ctx.device.track
        if track not in keyed:
            raise RuntimeError(f"{ctx.lab.lab}.{ctx.part.id} has no builder for this GPU's track "
                               f"({track}); tracks: {', '.join(keyed)}")
        v = keyed[track]
        return [v] if isinstance(v, str) else list(v)
    return [b] if isinstance(b, str) else list(b)


def builder_kwargs(params: dict, sm_count: Callable[[], int]) -> dict:
    """Keyword arguments every builder of the part gets besides the shape: ``num_sms = "device"``
    in the params passes the SM count read from the GPU (persistent kernels: one CTA per SM)."""
    return {"num_sms": int(sm_count())} if params.get("num_sms") == "device" else {}


def planned_calls(ctx: Context, sm_count: int) -> list[tuple[str, tuple, dict]]:
    """The builder calls (name, args, kwargs) a kernel part makes, in the order it makes them:
    every (builder, shape) pair of a correctness part; every shape's timed and extra builders of a
    speed part. The grading process makes them ahead of the part, spread over its workers, so
    that the kernels compile in parallel (grader/run.py); :func:`correctness` and :func:`speed`
    make their calls from this list."""
    p = ctx.part.params
    prob = problems.get(p["problem"])
    kw = builder_kwargs(p, lambda: sm_count)
    if ctx.part.thresholds:
        names = [speed_builder(p, ctx)] + list(p.get("extra_builders", []))
        return [(n, prob.builder_args(prob.shape(s)), kw) for s in p["shapes"] for n in names]
    return [(n, prob.builder_args(s), kw) for n in builder_names(p, ctx) for s in case_shapes(prob, ctx)]


def by_track(table: dict | None) -> dict:
    """A table keyed by track, with ``hopper``/``blackwell`` accepted for sm_90a/sm_100a."""
    return {TRACK_ALIASES.get(k, k): v for k, v in (table or {}).items()}


def track_shapes(params: dict, track: str | None) -> list:
    """The public shapes of ``shapes_by_track`` for ``track``: shapes the kernels of that track
    take and the other's do not."""
    return list(by_track(params.get("shapes_by_track")).get(track, []))


def case_shapes(problem: problems.Problem, ctx: Context) -> list:
    """Public shapes (with those of ``shapes_by_track`` for the GPU's track), then (unless
    public_only) ``hidden_shapes`` shapes drawn from the run seed, on the ``granule`` of
    ``granule_by_track`` for the GPU's track when it names one (a finer grid that one track's
    kernels take)."""
    p = ctx.part.params
    shapes = [problem.shape(s) for s in list(p["public_shapes"]) + track_shapes(p, ctx.device.track)]
    if not ctx.public_only and p.get("hidden_shapes"):
        r = inputs.rng(ctx.lab.lab, ctx.part.id, ctx.seed)
        fine = by_track(p.get("granule_by_track"))
        draw = {**p, "granule": fine[ctx.device.track]} if ctx.device.track in fine else p
        shapes += [problem.draw_shape(r, draw) for _ in range(int(p["hidden_shapes"]))]
    return shapes


# ---------------------------------------------------------------- one run, one check

def _scalar_text(scalars: dict) -> str:
    return "".join(f", {k}={v:g}" for k, v in scalars.items())


def _plain_err(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclasses.dataclass
class Check:
    ok: bool
    message: str
    max_abs_err: dict[str, float | None]


def check(problem: problems.Problem, outs: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
          tol: dict[str, compare.Tolerance], label: str, rows: torch.Tensor | None = None,
          originals: dict[str, torch.Tensor] | None = None,
          given: dict[str, torch.Tensor] | None = None,
          on_mismatch: Callable[..., None] | None = None) -> Check:
    """Compare every output with the reference (restricted to ``rows`` along the output's row
    axis when rows are sampled), and the inputs the kernel was given with their originals.
    ``on_mismatch(what, got, expected, tolerance)`` is told of every output that differs (a
    notebook's check cell draws where)."""
    bad, errs = [], {}
    for op in problem.outputs:
        got = outs[op.name]
        what = f"{op.name} ({label})"
        if rows is not None:
            got = got.index_select(problem.row_axis[op.name], rows.to(got.device))
            what = f"{op.name} ({label}, {rows.numel()} sampled rows)"
        c = compare.compare(got, ref[op.name], tol[op.name], name=what)
        errs[op.name] = _plain_err(c.max_abs_err)
        if not c.ok:
            bad.append(c.message)
            if on_mismatch is not None and tuple(got.shape) == tuple(ref[op.name].shape):
                on_mismatch(what, got, ref[op.name], tol[op.name])
    for name, t in (given or {}).items():
        if not torch.equal(t, originals[name]):
            bad.append(f"the kernel wrote into its input {name} ({label})")
    return Check(not bad, " | ".join(bad) if bad else "all outputs within tolerance", errs)


def frozen(ref: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference, computed before the kernel runs and moved to host memory: device code
    that writes wherever its pointers reach (the reference, the inputs it was not given) cannot
    change what its output is compared with."""
    return {k: v.detach().to("cpu") for k, v in ref.items()}


def _run(problem, ex, tensors: dict, scalars: dict, env: Env) -> None:
    ex(*problem.args(tensors, scalars))
    env.sync()


# ---------------------------------------------------------------- correctness

def correctness(module, ctx: Context, env: Env | None = None) -> Outcome:
    env = env or default_env()
    env.require_gpu(ctx)
    p = ctx.part.params
    prob = problems.get(p["problem"])
    names = builder_names(p, ctx)
    shapes = case_shapes(prob, ctx)
    lab, part = ctx.lab.lab, ctx.part.id
    told = getattr(ctx, "on_mismatch", None)      # a notebook's check cell draws where an output is wrong
    cases, fails = [], []
    kw = builder_kwargs(p, env.sm_count)
    for name in names:
        fn = grading.student(module, name)
        for i, shape in enumerate(shapes):
            ex, _ = env.lower(fn(*prob.builder_args(shape), **kw))
            ins = prob.make_inputs(lab, part, shape, ctx.seed, i, env.device)
            scalars = prob.draw_scalars(lab, part, ctx.seed, i)
            given = {k: t.clone() for k, t in ins.items()}
            outs = prob.make_outputs(shape, env.device)
            ref, tol = frozen(prob.reference(ins, scalars, shape)), prob.tolerance(shape, ins)
            _run(prob, ex, {**given, **outs}, scalars, env)
            label = prob.describe(shape) + _scalar_text(scalars)
            res = check(prob, outs, ref, tol, label, originals=ins, given=given, on_mismatch=told)
            cases.append({"builder": name, "shape": list(shape), "ok": res.ok, "max_abs_err": res.max_abs_err})
            if not res.ok:
                fails.append(f"{name}: {res.message}")
    right, total = sum(c["ok"] for c in cases), len(cases)
    what = "shapes" if len(names) == 1 else "(builder, shape) pairs"
    where = f" on {ctx.device.driver_name}" if ctx.device.driver_name else ""
    msg = f"{', '.join(names)}{where}: {right}/{total} {what} correct"
    if fails:
        msg += f"; first failure: {fails[0]}" + (f" (and {len(fails) - 1} more)" if len(fails) > 1 else "")
    meas = {"problem": prob.name, "builders": names, "shapes": [list(s) for s in shapes], "cases": cases, **kw}
    return Outcome(right / total, msg, meas)


# ---------------------------------------------------------------- speed

def speed_builder(params: dict, ctx: Context) -> str:
    names = builder_names(params, ctx)
    if len(names) != 1:
        raise ValueError(f"{ctx.lab.lab}.{ctx.part.id}: a speed part times one builder (name the others "
                         f"in extra_builders), not {names}")
    return names[0]


def _unit(metric: str) -> str:
    return "TB/s" if metric == "bandwidth" else "TFLOP/s"


def speed(module, ctx: Context, env: Env | None = None) -> Outcome:
    env = env or default_env()
    env.require_gpu(ctx)
    p = ctx.part.params
    prob = problems.get(p["problem"])
    name = speed_builder(p, ctx)
    lab, part = ctx.lab.lab, ctx.part.id
    told = getattr(ctx, "on_mismatch", None)
    unit = _unit(prob.metric)
    r = inputs.rng(lab, part, ctx.seed)
    shapes = [prob.shape(s) for s in p["shapes"]]
    others = list(p.get("extra_builders", []))
    # Every kernel is obtained before the first timing: timing stops the submission's processes
    # (grading.end_student_code), so no builder can be called after it.
    kernels = []
    kw = builder_kwargs(p, env.sm_count)
    for shape in shapes:
        args = prob.builder_args(shape)
        kernels.append({n: env.lower(grading.student(module, n)(*args, **kw))[0] for n in [name] + others})
    per_shape, ratios, lines = [], [], []
    for i, shape in enumerate(shapes):
        ex = kernels[i][name]
        ins = prob.make_inputs(lab, part, shape, ctx.seed, i, env.device)
        scalars = {**prob.draw_scalars(lab, part, ctx.seed, i), **p.get("scalars", {})}
        label = prob.describe(shape) + _scalar_text(scalars)
        rows = None
        if p.get("check_rows") and prob.row_extent is not None and p["check_rows"] < prob.row_extent(shape):
            rows = torch.tensor(sorted(r.sample(range(prob.row_extent(shape)), int(p["check_rows"]))),
                                device=env.device)
        ref, tol = frozen(prob.reference(ins, scalars, shape, rows)), prob.tolerance(shape, ins)
        given = {k: t.clone() for k, t in ins.items()}
        outs = prob.make_outputs(shape, env.device)
        tensors = {**given, **outs}
        _run(prob, ex, tensors, scalars, env)
        res = check(prob, outs, ref, tol, f"{label}, before timing", rows, ins, given, on_mismatch=told)
        if not res.ok:
            return Outcome(0.0, f"{name}: not timed: wrong result at {label}; {res.message}",
                           {"problem": prob.name, "builder": name, "shape": list(shape)})

        extras, skipped = {}, {}
        for other in others:
            ex_o = kernels[i][other]
            outs_o = prob.make_outputs(shape, env.device)
            tensors_o = {**given, **outs_o}
            _run(prob, ex_o, tensors_o, scalars, env)
            res_o = check(prob, outs_o, ref, tol, f"{label}, {other}", rows)
            if res_o.ok:
                args_o = prob.args(tensors_o, scalars)
                extras[other] = (lambda ex_o=ex_o, args_o=args_o: ex_o(*args_o), prob.work(shape))
            else:
                skipped[other] = f"not timed: wrong result: {res_o.message}"
        for xname, timed in prob.extras(ins, scalars, shape).items():
            try:                              # a torch variant this GPU or build lacks is recorded, not fatal
                timed.fn()
                env.sync()
            except timing.KernelHang:
                raise
            except Exception as e:  # noqa: BLE001
                skipped[xname] = f"not timed: {type(e).__name__}: {str(e)[:300]}"
                continue
            extras[xname] = (timed.fn, timed.work)
        base = prob.baseline(ins, scalars, shape)

        for t in outs.values():               # the check after timing sees what the timed calls wrote
            t.fill_(float("nan"))
        args = prob.args(tensors, scalars)
        meas = {"shape": list(shape), "label": label}
        if skipped:
            meas["extras_skipped"] = skipped
        out = env.timed_ratio(ctx, lambda: ex(*args), prob.work(shape), prob.baseline_name, base.fn, base.work,
                              prob.metric, measurements=meas, extras=extras or None)
        if out.verdict == "failed":
            return Outcome(0.0, f"{name} at {label}: {out.message}", out.measurements, verdict="failed")
        env.sync()
        res = check(prob, outs, ref, tol, f"{label}, after timing", rows, ins, given, on_mismatch=told)
        if not res.ok:
            return Outcome(0.0, f"{name}: wrong result after timing at {label}; {res.message}", out.measurements)
        m = out.measurements
        k, b = m[f"kernel_{unit}"], m[f"{prob.baseline_name}_{unit}"]
        line = f"{label}: {k:.2f} vs {prob.baseline_name} {b:.2f} {unit}"
        extra_text = [f"{x} {m[f'{x}_{unit}']:.2f} (kernel {k / m[f'{x}_{unit}']:.2f}x)"
                      for x in extras if m.get(f"{x}_{unit}")]
        for x in extras:
            if m.get(f"{x}_{unit}"):
                m[f"kernel_over_{x}"] = k / m[f"{x}_{unit}"]
        if extra_text:
            line += "; " + ", ".join(extra_text)
        lines.append(line)
        ratios.append(m["ratio"])
        per_shape.append(m)
    ratio = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    where = f" on {ctx.device.driver_name}" if ctx.device.driver_name else ""
    mean = (f"geometric mean over {len(ratios)} shapes of the ratio to {prob.baseline_name}" if len(ratios) > 1
            else f"ratio to {prob.baseline_name}")
    meas = {"problem": prob.name, "builder": name, "shapes": per_shape, "gpu": ctx.device.driver_name}
    return grading.perf_outcome(ctx, ratio, meas, f"{name}{where} ({' | '.join(lines)}); {mean}")


# ---------------------------------------------------------------- defaults per part kind

def kernel_part(module, ctx: Context, env: Env | None = None) -> Outcome:
    """A kernel part with a threshold table is a speed part, else a correctness part."""
    return (speed if ctx.part.thresholds else correctness)(module, ctx, env)


DEFAULT_RUNNERS: dict[str, Callable[..., Outcome]] = {
    "kernel": kernel_part,
    "build": lambda module, ctx: grading.build_part(module, ctx),
}


def default_for(part) -> Callable[..., Outcome] | None:
    """The default runner of a part's kind (kernel parts must name their problem)."""
    if part.kind == "kernel" and "problem" not in part.params:
        return None
    return DEFAULT_RUNNERS.get(part.kind)

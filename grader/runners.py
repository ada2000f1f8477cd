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
graded). Per shape: check once, then time against the problem's baseline through
grading.timed_ratio with every timed call checked (several argument sets rotated, outputs
poisoned before every call, sampled elements of every timed call compared with the reference at
positions drawn after the call; the comment above :func:`speed` and grader/timing.py), then check
the last call of each argument set in full; credit on the geometric mean of the ratios
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
import random
import secrets
from typing import Any, Callable

import torch

from . import build, compare, inputs, problems, timing
from .context import Context, Outcome
from .spec import TRACK_ALIASES, builder_kwargs, by_track  # noqa: F401 - what a part names
from . import grading



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
    # where the checks of timed calls look (sampled rows and elements): drawn per run from the
    # operating system, so that neither a kernel nor its author can know it
    secret_rng: Callable[[], random.Random] = lambda: random.Random(secrets.randbits(128))
    # given every kernel a part will ask ``lower`` for, in order, before the first: a notebook
    # starts their compiles side by side (build.prefetch); the grader's children build ahead
    # on their own
    prefetch: Callable[[list], None] | None = None


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
    for op in problem.outputs:
        stray = problems.outside_writes(op.name, outs[op.name])
        if stray:
            bad.append(f"{stray} ({label})")
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

def _built(module, cases: list, prob: problems.Problem, kw: dict, env: Env):
    """(builder, index, shape, kernel) of every case (builder, index, shape), the student's
    builder called on the shape. With ``env.prefetch`` every kernel is built first and handed to
    it, so that their compiles overlap the runs of the first ones; a builder that raises does so
    after the cases before it, as when each case is built in its turn."""
    def make(name, shape):
        return grading.student(module, name)(*prob.builder_args(shape), **kw)
    if env.prefetch is None:
        for name, i, shape in cases:
            yield name, i, shape, make(name, shape)
        return
    made, error = [], None
    for name, _, shape in cases:
        try:
            made.append(make(name, shape))
        except Exception as e:  # noqa: BLE001 - raised in its turn, below
            error = e
            break
    env.prefetch(made)
    for case, built in zip(cases, made):
        yield (*case, built)
    if error is not None:
        raise error


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
    for name, i, shape, built in _built(module, [(n, i, s) for n in names for i, s in enumerate(shapes)],
                                        prob, kw, env):
        ex, _ = env.lower(built)
        ins = prob.make_inputs(lab, part, shape, ctx.seed, i, env.device)
        scalars = prob.draw_scalars(lab, part, ctx.seed, i)
        given = {k: t.clone() for k, t in ins.items()}
        outs = prob.make_outputs(shape, env.device, guarded=True)
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
#
# Every timed call does checked work (the design and its argument: grader/timing.py's docstring).
# Per shape the kernel is timed over ARGUMENT_SETS argument sets of the shape (inputs made with
# distinct case indices, each set with its own outputs and its own host-side reference), taken in
# turn; each set's outputs are poisoned before every call on it; after every timed call the runner
# compares SAMPLED elements of the outputs, at positions drawn only then from a generator seeded
# per run from the operating system (Env.secret_rng), with the set's reference, and the same
# number of elements of the inputs with their originals; after the loop it checks the last call
# of each set in full. The baseline and the other timed functions rotate over their own sets and
# have their outputs poisoned the same way.

ARGUMENT_SETS = 2       # argument sets of one shape, rotated between timed calls
SAMPLED = 2048          # elements of each output and input compared after every timed call


@dataclasses.dataclass
class ArgumentSet:
    """One argument set of a timed shape: the inputs as made (kept apart), the copies the kernel
    is given, its outputs, and its reference (on the host; on ``rows`` when rows are sampled)."""
    index: int
    originals: dict[str, torch.Tensor]
    given: dict[str, torch.Tensor]
    outs: dict[str, torch.Tensor]
    ref: dict[str, torch.Tensor]
    tol: dict[str, compare.Tolerance]
    rows: torch.Tensor | None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**self.given, **self.outs}

    def poison(self) -> None:
        for t in self.outs.values():
            t.fill_(float("nan"))


def argument_set(problem: problems.Problem, ctx: Context, shape, case: int, index: int, scalars: dict,
                 secret: random.Random, env: Env) -> ArgumentSet:
    """The inputs of case ``case``, their reference, NaN-filled outputs; with ``check_rows``, a
    sample of rows drawn from ``secret`` (the reference is computed on those rows only)."""
    p = ctx.part.params
    ins = problem.make_inputs(ctx.lab.lab, ctx.part.id, shape, ctx.seed, case, env.device)
    rows = None
    if p.get("check_rows") and problem.row_extent is not None and p["check_rows"] < problem.row_extent(shape):
        rows = torch.tensor(sorted(secret.sample(range(problem.row_extent(shape)), int(p["check_rows"]))),
                            device=env.device)
    ref = frozen(problem.reference(ins, scalars, shape, rows))
    return ArgumentSet(index, ins, {k: t.clone() for k, t in ins.items()}, problem.make_outputs(shape, env.device),
                       ref, problem.tolerance(shape, ins), rows)


def _output_positions(flat: torch.Tensor, expected_shape, out: torch.Tensor, axis: int | None,
                      rows: torch.Tensor | None) -> torch.Tensor:
    """Flat positions in ``out`` of the flat positions ``flat`` of its reference (which holds only
    ``rows`` along ``axis`` when rows are sampled)."""
    if rows is None:
        return flat
    coords = list(torch.unravel_index(flat, tuple(expected_shape)))
    coords[axis] = rows.to("cpu")[coords[axis]]
    return sum(c * st for c, st in zip(coords, out.stride()))


def _index(flat: int, shape) -> list[int]:
    return [int(c) for c in torch.unravel_index(torch.tensor(flat), tuple(shape))]


def spot_check(problem: problems.Problem, aset: ArgumentSet, where: str, secret: random.Random,
               samples: int = SAMPLED) -> str | None:
    """What is wrong, or None: ``samples`` elements of every output, at positions drawn from
    ``secret`` now (after the call), compared with the set's reference under its tolerance, and as
    many elements of every input compared with their originals."""
    gen = torch.Generator().manual_seed(secret.getrandbits(63))
    for op in problem.outputs:
        out, ref = aset.outs[op.name], aset.ref[op.name]
        flat = torch.randint(ref.numel(), (min(samples, ref.numel()),), generator=gen)
        pos = _output_positions(flat, ref.shape, out, problem.row_axis.get(op.name), aset.rows)
        got = out.reshape(-1)[pos.to(out.device)].to("cpu")
        expected = ref.reshape(-1)[flat]
        bad, _, _ = compare.mismatches(got, expected, aset.tol[op.name])
        if bool(bad.any()):
            poison = int((bad & torch.isnan(got.double())).sum())
            first = int(bad.nonzero()[0])
            at = _index(int(pos[first]), out.shape)
            left = (f"; {poison} of them still hold the NaN written into the output before the call: the call did "
                    f"not write them" if poison else "")
            return (f"wrong result in {where}: {op.name}: {int(bad.sum())} of {flat.numel()} elements sampled after "
                    f"the call differ from the reference beyond {aset.tol[op.name]}{left}; e.g. at {at}: got "
                    f"{float(got[first]):.6g}, expected {float(expected[first]):.6g}")
    for name, t in aset.given.items():
        idx = torch.randint(t.numel(), (min(samples, t.numel()),), generator=gen).to(t.device)
        if not torch.equal(t.reshape(-1)[idx], aset.originals[name].reshape(-1)[idx]):
            return f"{where} wrote into its input {name}"
    return None


def speed_builder(params: dict, ctx: Context) -> str:
    names = builder_names(params, ctx)
    if len(names) != 1:
        raise ValueError(f"{ctx.lab.lab}.{ctx.part.id}: a speed part times one builder (name the others "
                         f"in extra_builders), not {names}")
    return names[0]


def _unit(metric: str) -> str:
    return "TB/s" if metric == "bandwidth" else "TFLOP/s"


def _timed_call(k: int, aset: ArgumentSet, n_sets: int) -> str:
    return f"timed call #{k + 1} (argument set {aset.index + 1} of {n_sets})"


def speed(module, ctx: Context, env: Env | None = None) -> Outcome:
    env = env or default_env()
    env.require_gpu(ctx)
    p = ctx.part.params
    prob = problems.get(p["problem"])
    name = speed_builder(p, ctx)
    told = getattr(ctx, "on_mismatch", None)
    unit = _unit(prob.metric)
    secret = env.secret_rng()
    shapes = [prob.shape(s) for s in p["shapes"]]
    others = list(p.get("extra_builders", []))
    # Every kernel is obtained before the first timing: timing stops the submission's processes
    # (grading.end_student_code), so no builder can be called after it.
    kernels = [{} for _ in shapes]
    kw = builder_kwargs(p, env.sm_count)
    for n, i, _, built in _built(module, [(n, i, s) for i, s in enumerate(shapes) for n in [name] + others],
                                 prob, kw, env):
        kernels[i][n] = env.lower(built)[0]
    per_shape, ratios, lines = [], [], []
    for i, shape in enumerate(shapes):
        ex = kernels[i][name]
        scalars = {**prob.draw_scalars(ctx.lab.lab, ctx.part.id, ctx.seed, i), **p.get("scalars", {})}
        label = prob.describe(shape) + _scalar_text(scalars)
        # set 0 is case i (the inputs a single set had); set j is case i + j * len(shapes)
        sets = [argument_set(prob, ctx, shape, i + j * len(shapes), j, scalars, secret, env)
                for j in range(ARGUMENT_SETS)]
        first = sets[0]
        _run(prob, ex, first.tensors(), scalars, env)
        res = check(prob, first.outs, first.ref, first.tol, f"{label}, before timing", first.rows, first.originals,
                    first.given, on_mismatch=told)
        if not res.ok:
            return Outcome(0.0, f"{name}: not timed: wrong result at {label}; {res.message}",
                           {"problem": prob.name, "builder": name, "shape": list(shape)})

        extras, skipped, wrong_extra = {}, {}, {}
        for other in others:
            ex_o = kernels[i][other]
            outs_o = [prob.make_outputs(shape, env.device) for _ in sets]
            _run(prob, ex_o, {**first.given, **outs_o[0]}, scalars, env)
            res_o = check(prob, outs_o[0], first.ref, first.tol, f"{label}, {other}", first.rows)
            if not res_o.ok:
                skipped[other] = f"not timed: wrong result: {res_o.message}"
                continue
            views = [dataclasses.replace(a, outs=o) for a, o in zip(sets, outs_o)]

            def note(s, k, other=other, views=views):       # recorded, not graded: the timing goes on
                if other not in wrong_extra:
                    bad = spot_check(prob, views[s], _timed_call(k, views[s], len(views)), secret)
                    if bad:
                        wrong_extra[other] = bad
                return None
            extras[other] = (timing.Rotation([lambda ex_o=ex_o, args=prob.args(v.tensors(), scalars): ex_o(*args)
                                              for v in views], [v.poison for v in views], note), prob.work(shape))
        per_set = [prob.extras(a.originals, scalars, shape) for a in sets]
        for xname in per_set[0]:
            timed = [x[xname] for x in per_set]
            try:                              # a torch variant this GPU or build lacks is recorded, not fatal
                timed[0].fn()
                env.sync()
            except timing.KernelHang:
                raise
            except Exception as e:  # noqa: BLE001
                skipped[xname] = f"not timed: {type(e).__name__}: {str(e)[:300]}"
                continue
            extras[xname] = (timing.Rotation([t.fn for t in timed], [t.poison for t in timed]), timed[0].work)
        bases = [prob.baseline(a.originals, scalars, shape) for a in sets]
        base = timing.Rotation([b.fn for b in bases], [b.poison for b in bases])
        rotation = timing.Rotation([lambda args=prob.args(a.tensors(), scalars): ex(*args) for a in sets],
                                   [a.poison for a in sets],
                                   lambda s, k: spot_check(prob, sets[s], _timed_call(k, sets[s], len(sets)), secret))
        meas = {"shape": list(shape), "label": label, "sampled_per_call": SAMPLED}
        out = env.timed_ratio(ctx, rotation, prob.work(shape), prob.baseline_name, base, bases[0].work,
                              prob.metric, measurements=meas, extras=extras or None)
        if out.verdict == "failed":
            return Outcome(0.0, f"{name} at {label}: {out.message}", out.measurements, verdict="failed")
        env.sync()
        for a in sets[:rotation.turn]:            # each set's last call (every set called): all of it, inputs too
            k = rotation.last.get(a.index)
            last = f"timed call #{k + 1}, the last on argument set {a.index + 1} of {len(sets)}" if k is not None \
                else f"the last call on argument set {a.index + 1} of {len(sets)}"
            res = check(prob, a.outs, a.ref, a.tol, f"{label}, {last}", a.rows, a.originals, a.given, on_mismatch=told)
            if not res.ok:
                return Outcome(0.0, f"{name}: wrong result after timing at {label}; {res.message}", out.measurements)
        m = out.measurements
        for other, why in wrong_extra.items():
            skipped[other] = f"rate not recorded: {why}"
            m.pop(f"{other}_{unit}", None)
        if skipped:
            m["extras_skipped"] = skipped
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

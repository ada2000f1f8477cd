"""The toolkit of grading functions (the labs' own, the default runners of grader/runners.py, grader/problems.py):
the student's function by name, tables of calls graded case by case (public and hidden), build
parts, timed ratios against a same-run baseline, figures, and the end of student code."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
import re
from typing import Any, Callable

from . import build, compare, executed, hardware, inspect, problems, spans, timing, toolchain
from .spec import builder_kwargs, by_track
from .context import CaseFailed, Context, Outcome, Work  # noqa: F401 - Work: what a call must do


def student(module, name: str) -> Callable:
    fn = getattr(module, name, None)
    if fn is None:
        raise AttributeError(f"the notebook defines no {name}(): keep the function names of the skeleton")
    return fn


# ---------------------------------------------------------------- tables of calls

_RECORDER: contextvars.ContextVar = contextvars.ContextVar("case_recorder", default=None)


class NotRecordable(Exception):
    """Raised while recording when a grading function grades something other than a declared
    question or a figure: that part is left to the course grader in the student edition."""


@contextlib.contextmanager
def recording(recorder):
    """Record instead of grading: inside this block ``grade_question`` hands each public call
    of a declared question, with its answer and comparison, to ``recorder.add(name, args,
    expected, how)``, and ``figure`` hands its call to ``recorder.figure``;
    nothing else can be recorded (``NotRecordable``). The student edition records a part's public cases this
    way, by running the lab's own grading function in public mode (grader/edition/release.py)."""
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


@dataclasses.dataclass(frozen=True)
class Call:
    """One graded call of a student's function: its name, how it is shown (``label()``), the call
    itself, the trusted answer, how answers are compared (``same(got, expected)`` -> bool, or
    (bool, what is wrong)), and whether the case is hidden."""
    fn: str
    label: Callable[[], str]
    run: Callable[[], Any]
    expected: Any
    same: Callable[[Any, Any], bool]
    hidden: bool = False


def grade_calls(calls: list[Call], noun: str = "cases", per_function: bool = False,
                ctx: Context | None = None) -> Outcome:
    """The one grader of a table of calls: the share answered right; the first wrong public call
    shown with its arguments and the expected answer, a wrong hidden call by its number only;
    with ``per_function``, the count of each function too. What the submission answered (and a
    word when it is not even of the expected kind) is shown only when no hidden case is graded in
    the run: ``ctx.public_only``, or, without ``ctx``, no call of the table is hidden (one child
    answers every part, so an answer to a public case can carry the hidden inputs of another
    part: grader/verdict.py). A call that raises stops the table with context.CaseFailed (the
    case, what it raised): grader/verdict.py says it. The sandbox's failures (a crash, a time
    limit) and a kernel hang pass through as they are."""
    from .sandbox import SandboxFailure
    shows_answers = ctx.public_only if ctx is not None else not any(c.hidden for c in calls)
    wrong, per_fn, hidden_seen, public_wrong = [], {}, 0, False
    for c in calls:
        label = hidden_case_name(hidden_seen) if c.hidden else None
        try:
            got = c.run()
        except (SandboxFailure, timing.KernelHang):
            raise
        except Exception as e:  # noqa: BLE001 - said by the verdict, by case
            failed = CaseFailed(label or c.label(), e, c.hidden, clean=hidden_seen == 0)
        else:
            failed = None
        if failed is not None:
            raise failed from None
        got = _as_json(got)
        verdict = c.same(got, c.expected)
        ok, detail = verdict if isinstance(verdict, tuple) else (bool(verdict), "")
        right, total = per_fn.get(c.fn, (0, 0))
        per_fn[c.fn] = (right + bool(ok), total + 1)
        if c.hidden:
            hidden_seen += 1
        if ok:
            continue
        if c.hidden:
            wrong.append(hidden_case(hidden_seen - 1))
            continue
        public_wrong = True
        if not shows_answers:
            wrong.append(f"{c.label()}: wrong answer, expected {_shown(c.expected)}")
            continue
        kind = _kind_mismatch(got, c.expected)
        wrong.append(f"{c.label()}: {detail}" if detail else
                     f"{c.label()}: got {_shown(got)}, expected {_shown(c.expected)}" + (f" ({kind})" if kind else ""))
    counts = (" (" + ", ".join(f"{k} {a}/{b}" for k, (a, b) in per_fn.items()) + ")"
              if per_function and len(per_fn) > 1 else "")
    out = cases_outcome(len(calls), wrong, noun, counts, hidden=sum(c.hidden for c in calls))
    if public_wrong and not shows_answers:
        out.message += "; " + NOT_SHOWN.format(lab=ctx.lab.lab if ctx is not None else "LAB")
    return out


def _as_json(x):
    """An answer as the grader receives it from its child, where it crossed as JSON: tuples are
    lists. A check cell's answers are made the same, so that both compare and show one value."""
    if isinstance(x, (list, tuple)):
        return [_as_json(v) for v in x]
    if isinstance(x, dict):
        return {k: _as_json(v) for k, v in x.items()}
    return x


def _shown(x, limit: int = 300) -> str:
    """An answer as messages show it, the same in the grader and in a check cell (tuples as lists)."""
    text = repr(_as_json(x))
    return text if len(text) <= limit else text[:limit - 5] + " ...]"


HIDDEN_CASE = "hidden case #"
NOT_SHOWN = ("what your code returned, raised or printed is not shown when hidden cases are graded (details: "
             "run the part's check cell or `python -m grader check {lab} --public`)")


def hidden_case_name(k: int) -> str:
    """The k-th (0-based) hidden case, as every message names it."""
    return f"{HIDDEN_CASE}{k + 1}"


def hidden_case(k: int) -> str:
    return f"{hidden_case_name(k)} (its inputs and answer are not shown)"


def public_len(case_fn: Callable[[Context], list], ctx: Context) -> int:
    """How many of the cases ``case_fn(ctx)`` makes are public: as many as it makes when only the
    public cases are asked for."""
    return len(case_fn(dataclasses.replace(ctx, public_only=True)))


def cases_outcome(n: int, wrong: list[str], noun: str = "cases", counts: str = "", hidden: int = 0) -> Outcome:
    """n cases, ``hidden`` of them hidden, of which those described in ``wrong`` were answered
    wrong: the share right, and a message naming the first wrong one (a public one when there is
    one). With hidden cases the message says how many were public: a check cell runs only those."""
    wrong = sorted(wrong, key=lambda w: w.startswith(HIDDEN_CASE))
    ok = n - len(wrong)
    split = f" [{n - hidden} public, {hidden} hidden]" if hidden else ""
    msg = f"{ok}/{n} {noun} right{split}{counts}"
    if wrong:
        msg += "; first wrong: " + wrong[0] + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else "")
    return Outcome(ok / n if n else 1.0, msg, {"cases": n, "right": ok})


def _call_label(name: str, params: tuple[str, ...]):
    return lambda *args: f"{name}(" + ", ".join(f"{p}={a!r}" for p, a in zip(params, args)) + ")"


@dataclasses.dataclass(frozen=True)
class Question:
    """A CPU question declared as data (a lab module's ``QUESTIONS``), graded by
    :func:`grade_question` with no code of the lab's own, and recorded for the student edition
    from the same declaration.

    - ``cases(ctx)``: the calls, ``(kind, args)`` or ``(kind, args, hidden)``, only the public
      ones when ``ctx.public_only``; without a hidden flag the public ones come first and are
      as many as ``cases`` makes in public mode.
    - ``answers[kind]``: the trusted answer of a call; the student's functions are the part's
      ``params["functions"]`` (or ``params["function"]``) in the order of ``answers``.
    - ``params[kind]``: the argument names shown in messages.
    - ``compare``: how answers are compared, a name of compare.ANSWERS, or {kind: name} (a kind
      left out: ``"same"``); the part's ``rel_tol``/``abs_tol`` are its tolerances."""
    cases: Callable[[Context], list]
    answers: dict[str, Callable]
    params: dict[str, tuple]
    compare: str | dict[str, str] = "same"

    def comparison(self, kind: str) -> str:
        return self.compare if isinstance(self.compare, str) else self.compare.get(kind, "same")


def student_functions(params: dict) -> list[str]:
    """The names of the student's functions a part grades: ``functions``, or one ``function``."""
    return list(params.get("functions") or [params["function"]])


def grade_question(question: Question, module, ctx: Context) -> Outcome:
    """The default runner of a declared CPU question (the lab's ``QUESTIONS``)."""
    names = dict(zip(question.answers, student_functions(ctx.part.params)))
    tol = compare.part_tolerance(ctx.part.params)
    raw = question.cases(ctx)
    flagged = any(len(c) == 3 for c in raw)          # then a call without a flag is public
    n_public = len(raw) if flagged else public_len(question.cases, ctx)
    cases = [(c[0], tuple(c[1]), bool(c[2]) if len(c) == 3 else i >= n_public) for i, c in enumerate(raw)]
    recorder = _RECORDER.get()
    if recorder is not None:          # the student edition: the public calls, their answers and comparison
        for kind, args, hidden in cases:
            if not hidden:
                recorder.add(names[kind], args, question.answers[kind](*args),
                             compare.how(question.comparison(kind), tol))
        return Outcome(1.0, "recorded", {"cases": len(cases), "right": len(cases)})
    fns = {kind: student(module, name) for kind, name in names.items()}
    same = {kind: compare.answer_check(question.comparison(kind), tol) for kind in question.answers}
    labels = {kind: _call_label(names[kind], question.params[kind]) for kind in question.answers}
    return grade_calls([Call(names[kind], (lambda k=kind, a=args: labels[k](*a)), (lambda k=kind, a=args: fns[k](*a)),
                             question.answers[kind](*args), same[kind], hidden)
                        for kind, args, hidden in cases], per_function=True, ctx=ctx)


def _kind(x) -> str:
    if isinstance(x, bool) or x is None:
        return "a boolean" if isinstance(x, bool) else "None"
    if isinstance(x, (int, float)):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, (list, tuple)):
        return "a list or tuple"
    if isinstance(x, dict):
        return "a dict"
    return type(x).__name__


def _kind_mismatch(got, expected) -> str:
    """Say so when an answer is not even of the expected kind (a string for a number...)."""
    g, e = _kind(got), _kind(expected)
    return "" if g == e or "None" in (g, e) else f"returned {g} where {e} is expected"


def builder_names(params: dict) -> list[str]:
    """A build part names one kernel builder (``builder``) or several (``builders``)."""
    return list(params.get("builders") or [params["builder"]])


def builder_args(params: dict) -> dict:
    """A build part's params: ``builder``/``builders`` (function names), ``archs``, and the
    keyword arguments every builder is called with (everything else)."""
    return {k: v for k, v in params.items() if k not in ("builder", "builders", "archs")}


EVIDENCE = {"static": inspect.STATIC}     # provenance label -> how a build part's report names it


def build_part(module, ctx: Context, extra: Callable | None = None, texts: Callable | None = None,
               evidence: str = "static") -> Outcome:
    """Compile-only check of every builder the part names (``builder`` or ``builders``) for every
    arch it lists, with its mechanism checks on the SASS, the PTX and the CUDA source of the code
    the harness would launch (grader/inspect.py says which check reads what; a part with a check
    of the CUDA source has that source compiled by the grader, in a tool jail, so that the source
    it reads is the source of the code it inspects). The checks read the launched code only
    (``inspect.launched_texts``: the entries of the launch plan and what they call), or the
    listings ``texts(builder, arch, art)`` returns instead (e.g. the instructions a GPU executed),
    named in the report by ``evidence`` (``EVIDENCE``, or the label itself; ``texts`` may return
    (listings, label) to name the evidence of one builder and arch). A kernel that does
    no work at the part's shape (no CTA launched, or no MMA and no TMA instruction emitted) is
    reported as such and gets nothing for that arch. ``extra(builder, art)`` -> (ok, message,
    measurements) is a further check of the lab's (its launch plan, its PTX). Each (builder,
    arch) is compiled once and scores an equal share; an exception in a check is the part's error
    verdict, never a pass."""
    p = ctx.part.params
    names = builder_names(p)
    args = builder_args(p)
    own_ptx = any(inspect.MECHANISMS[m].where == "cuda" for m in ctx.part.mechanisms)
    label = EVIDENCE.get(evidence, evidence)
    scores, lines, meas, voided = [], [], {}, []
    for name in names:
        builder = student(module, name)
        per_arch, where = [], meas if len(names) == 1 else meas.setdefault(name, {})
        for arch in p["archs"]:
            kw = dict(args)
            if kw.get("num_sms") == "arch":      # a persistent kernel compiled for the track's reference GPU
                kw["num_sms"] = hardware.SPECS[hardware.TRACK_DEFAULT[arch]].sm_count
            shape = ", ".join(f"{k}={v}" for k, v in kw.items())
            try:
                art = build.compile_only(builder(**kw), arch, want_sass=True, own_ptx=own_ptx)
            except NotImplementedError:
                raise
            except build.LaunchesNoCTA as e:
                scores.append(0.0)
                where[arch] = {"degenerate": e.reason}
                per_arch.append(f"{arch}: the kernel degenerates at the build shape ({shape}): {e.reason}. "
                                "The build part is graded at this shape: the kernel must do its work there")
                continue
            except build.BuildError as e:
                if machine_failed(e):           # the part's verdict is the machine's: graded again
                    raise
                scores.append(0.0)
                per_arch.append(f"{arch}: does not build: {explain_build_error(e)}")
                continue
            ran = None
            if texts is not None:
                listings, named = texts(name, arch, art), label
            else:
                listings, named = inspect.launched_texts(art), label
                ran = prove_by_execution(builder, ctx, name, arch)
                if ran is not None and ran.failed:      # like dead code: no static evidence is trusted then
                    voided.append(f"{name} on {arch}: the kernel failed in the profiled run")
                    scores.append(0.0)
                    where[arch] = {"evidence": ran.evidence, "profiled_s": ran.seconds}
                    per_arch.append(f"{arch}: compiled; {ran.evidence}. On this GPU a mechanism counts only when "
                                    "the GPU shows it executed: make the kernel run correctly at this shape")
                    continue
                if ran is not None:
                    named = ran.evidence
                    if ran.sass is not None:
                        static_ok = {c.name for c in inspect.check_all(ctx.part.mechanisms, listings) if c.ok}
                        listings = dict(listings, sass=ran.sass, sass_launched=listings.get("sass", ""))
            if isinstance(listings, tuple):
                listings, named = listings[0], EVIDENCE.get(listings[1], listings[1])
            listings = dict(listings, **(ctx.check_data or {}))
            idle = degenerate(art, listings, ctx.part.mechanisms)
            if idle:
                scores.append(0.0)
                where[arch] = {"degenerate": idle, "evidence": named}
                per_arch.append(f"{arch}: compiled, but the kernel degenerates at the build shape ({shape}): {idle}. "
                                "The build part is graded at this shape: the kernel must do its work there")
                continue
            checks = inspect.check_all(ctx.part.mechanisms, listings)
            good = all(c.ok for c in checks)
            where[arch] = {c.name: c.count for c in checks}
            where[arch]["evidence"] = named
            if art.plan:
                where[arch]["ctas"] = sum(math.prod(ln["grid"]) for ln in art.plan["launches"])
            line = f"{arch}: compiled; {named}; " + "; ".join(c.message for c in checks)
            if ran is not None and ran.sass is not None:
                dead = sorted(c.name for c in checks if not c.ok and c.name in static_ok)
                if dead:
                    voided.append(f"{name} on {arch}: {', '.join(dead)} in the code but never executed")
                if ran.correct is False:
                    line += f"; note: the profiled run's output was wrong ({ran.message[:300]})"
                where[arch]["profiled_s"] = ran.seconds
                where[arch]["profiled_with"] = ran.batch
            if extra is not None:
                ok, msg, m = extra(name, art)
                good, line = good and ok, line + "; " + msg
                where[arch].update(m)
            scores.append(1.0 if good else 0.0)
            per_arch.append(line)
        lines.append((f"{name}: " if len(names) > 1 else "") + " | ".join(per_arch))
    if voided:                # the GPU showed a mechanism only in dead code: no static evidence is trusted
        meas["dead_code"] = voided
        return Outcome(0.0, "mechanisms not shown to execute on this GPU (" + "; ".join(voided) + "): the part "
                       "scores nothing, on every arch || " + " || ".join(lines), meas)
    return Outcome(sum(scores) / len(scores), " || ".join(lines), meas)



# ---------------------------------------------------------------- which run proves a build part
# (grader/executed.py counts what ran)

def correctness_run(lab_spec, name: str, arch: str):
    """(kernel part, problem, first public shape) of the lab's correctness part that runs builder
    ``name`` on ``arch``'s track, or None when no correctness part runs it."""
    for part in lab_spec.parts:
        p = part.params
        if part.kind != "kernel" or part.thresholds or "problem" not in p or not p.get("public_shapes"):
            continue
        b = p.get("builder", p.get("builders"))
        if isinstance(b, dict):
            b = by_track(b).get(arch)
        names = [b] if isinstance(b, str) else list(b or [])
        if name in names:
            prob = problems.get(p["problem"])
            shapes = sorted((prob.shape(s) for s in p["public_shapes"]), key=lambda s: _size(prob, s))
            small = [s for s in shapes if _size(prob, s) <= PROFILE_WORK]
            return part, prob, (small or shapes)[-1]
    return None


# The largest public shape whose work (bytes moved plus FLOPs) stays under this is profiled: the
# instrumented replay is slow, and the smallest shape may not reach every path of the kernel.
PROFILE_WORK = 2e10


def _size(prob, shape) -> float:
    w = prob.work(shape)
    return w.bytes + w.flops


def prove_by_execution(builder, ctx, name: str, arch: str) -> executed.Executed | None:
    """The executed instructions of builder ``name``'s kernel in the lab's correctness run, on
    this GPU; None where that cannot apply (no GPU of ``arch`` here, or no correctness part runs
    this builder: then the part is checked statically and says so)."""
    dev = ctx.device
    if not dev.present or dev.track != arch:
        return None
    found = correctness_run(ctx.lab, name, arch)
    if found is None:
        return executed.Executed(None, f"no correctness part of {ctx.lab.lab} runs {name}, so nothing shows it executing")
    part, prob, shape = found
    kw = builder_kwargs(part.params, lambda: dev.sm_count)
    try:
        with spans.span("profiled_build"):
            art = build.compile_only(builder(*prob.builder_args(shape), **kw), arch)
    except build.BuildError as e:
        if machine_failed(e):
            raise
        return executed.Executed(None, f"it does not build at {prob.describe(shape)}: {explain_build_error(e)}",
                                 correct=False, failed=True)
    job = {"lab": ctx.lab.lab, "part": part.id, "problem": prob.name, "shape": list(shape),
           "seed": ctx.seed, "case": 0}
    with spans.span("profile"):     # parts asking at about the same time share one run of the profiler
        res = executed.BATCHER.profile(executed.Job(art.plan, art.cubin, art.ptx, job, gpu=dev.uuid))
    res.message = f"{prob.describe(shape)} ({part.id}'s first case): {res.message}" if res.message else res.message
    return res


# The instructions that do a GEMM's or an attention kernel's work: tensor-core MMAs and TMA.
_WORK_MECHANISMS = {"tcgen05_mma", "tcgen05_mma_2cta", "tcgen05_mma_tmem_a", "wgmma", "wgmma_ss", "wgmma_rs",
                    "tma_load", "tma_store", "tma_multicast"}
_WORK_SASS = re.compile(r"\b(?:UTC\w*MMA|HGMMA|UTMALDG|UTMASTG)\b")


def degenerate(art, texts: dict[str, str], mechanisms) -> str | None:
    """Why the compiled kernel does no work at its build shape, or None. Zero CTAs: a grid
    extent of 0 in its launch plan (the host code TIRx generated, which TVM would launch as one
    CTA; ``build.no_cta``). No work: a part that checks MMA or TMA mechanisms and a SASS of the
    launched code (``texts``) that holds none of them (the code that would issue them was folded
    away, e.g. a tile loop whose trip count is zero)."""
    idle = build.no_cta(art.plan)
    if idle:
        return idle
    if set(mechanisms) & _WORK_MECHANISMS and texts.get("sass") and not _WORK_SASS.search(texts["sass"]):
        return ("it emits no MMA and no TMA instruction (no UTC*MMA, HGMMA, UTMALDG or UTMASTG in the SASS of "
                "the launched code: the code that issues them was compiled away)")
    return None


# TIRx calls that apache-tvm 0.26 accepts in a kernel but cannot lower: the error they end in,
# the call, and what works instead. Matched on the code generator named in the traceback (where
# the error was raised in this process) or on the error's own text (the grader's child reports
# only that).
KNOWN_LOWERING_FAILURES = [
    {"codegen": "codegen_ptx_wgmma_noop_barrier",
     "error": "'BufferLoad' object has no attribute 'dtype'",
     "call": "T.ptx.wgmma.noop_barrier(reg)",
     "instead": ("an empty inline-asm fence of the register through T.cuda.func_call, "
                 "asm volatile(\"\" : \"+f\"(r) :: \"memory\"), as the notebook's fence_accumulators does")},
]


def machine_failed(e: BaseException) -> bool:
    """A build that failed on the grading machine (a tool jail that could not run, ptxas stopped
    without a word twice and could not assemble a known-good kernel either), not on the kernel: the part's verdict is then the infrastructure one
    (grader/verdict.py), never a build failure scored against the student."""
    return toolchain.tool_jail_failure(e) is not None


def explain_build_error(e: BaseException) -> str:
    """The compiler's message, and, for a call known not to lower in apache-tvm 0.26, which call
    it is and what to use instead."""
    msg = str(e)
    frames, seen, cause = [], set(), e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        tb = cause.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        cause = cause.__cause__ or cause.__context__
    for known in KNOWN_LOWERING_FAILURES:
        if known["codegen"] in frames or known["codegen"] in msg:
            return (f"{msg}. This error comes from {known['call']}, which apache-tvm 0.26 cannot lower; "
                    f"use {known['instead']}")
        if known["error"] in msg:
            return (f"{msg}. This is the error apache-tvm 0.26 gives for {known['call']}, which it cannot "
                    f"lower; if the kernel uses it, use {known['instead']}")
    codegen = [f for f in frames if f.startswith("codegen_")]
    if codegen:
        return f"{msg} (raised by TVM's code generator {codegen[-1]})"
    return msg


def sync() -> None:
    """Wait for the GPU's queued work, at most timing.HANG_S seconds (then timing.KernelHang).
    Kernel runners call this instead of torch.cuda.synchronize(): a deadlocked kernel is caught
    within a minute of its launch, not at the end of the part's time limit."""
    timing.sync()


def end_student_code(ctx: Context) -> None:
    """Before timing: stop the submission's process and everything it started, so that nothing of
    the student's runs while the grader measures."""
    hook = getattr(ctx, "end_student_code", None)
    if hook is not None:
        hook()


def require_gpu(ctx: Context) -> hardware.GPUSpec:
    if not ctx.device.present:
        raise RuntimeError(f"this part needs a GPU: {ctx.device.reason}")
    return ctx.device.spec


def perf_outcome(ctx: Context, ratio: float, measurements: dict[str, Any], what: str) -> Outcome:
    """Credit for a same-run ratio against the part's threshold row for this GPU."""
    th, row_note = ctx.part.threshold_for(ctx.device.spec)
    frac = timing.credit(ratio, th.floor, th.full)
    measurements.update({"ratio": ratio, "threshold_full": th.full, "threshold_floor": th.floor,
                         "threshold_row": row_note, "threshold_status": th.status})
    msg = (f"{what}: {ratio:.3f}x (full credit at {th.full:g}x, none at or below {th.floor:g}x; "
           f"{row_note}, {th.status})")
    return Outcome(frac, msg, measurements)


def timed_ratio(ctx: Context, kernel: Callable[[], Any] | timing.Rotation, kernel_work: Work, baseline_name: str,
                baseline: Callable[[], Any] | timing.Rotation, baseline_work: Work, metric: str,
                measurements: dict[str, Any] | None = None,
                extras: dict[str, tuple[Callable[[], Any] | timing.Rotation, Work]] | None = None) -> Outcome:
    """Time the submission and a same-run baseline interleaved (each call's argument set rotated
    and its outputs poisoned, then L2 flushed, all untimed; timing.Rotation), reject a timed call
    whose check fails (the kernel's rotation checks each timed call: timing's docstring) and
    physically impossible times, and grade the ratio of their rates against the part's threshold
    row. ``metric`` is "bandwidth" (bytes/s) or "flops" (FLOP/s). ``extras`` are timed in the same
    rotation and recorded (rates in the measurements), not graded."""
    gpu = require_gpu(ctx)
    end_student_code(ctx)
    runs = {"kernel": (kernel, kernel_work), baseline_name: (baseline, baseline_work), **(extras or {})}
    rotations = {name: timing.as_rotation(fn) for name, (fn, _) in runs.items()}
    clocks_before = timing.read_clocks()
    meas = dict(measurements or {})
    try:
        stats = timing.measure_interleaved(rotations, timing.CudaEventClock(), timing.L2Flusher(gpu.l2_mib << 20))
    except timing.WrongTimedCall as e:
        meas["checked_calls"] = {name: rot.checked for name, rot in rotations.items() if rot.check is not None}
        return Outcome(0.0, str(e), meas, verdict="failed")
    clocks_after = timing.read_clocks()
    for name, s in stats.items():
        meas[name] = {**s.summary(), "argument_sets": len(rotations[name].calls),
                      "checked_calls": rotations[name].checked}
    meas.update({"clocks_before": clocks_before, "clocks_after": clocks_after, "gpu": ctx.device.driver_name})
    unit = "TB/s" if metric == "bandwidth" else "TFLOP/s"
    rates = {}
    for name, (_, work) in runs.items():
        t = stats[name].median
        if name in ("kernel", baseline_name):
            bad = timing.check_floor(t, timing.physical_floor(gpu, bytes_moved=work.bytes, flops=work.flops))
            if bad:
                return Outcome(0.0, f"{name}: {bad}", meas, verdict="failed")
        rates[name] = (work.bytes if metric == "bandwidth" else work.flops) / t / 1e12
        meas[f"{name}_{unit}"] = rates[name]
    k, b = rates["kernel"], rates[baseline_name]
    return perf_outcome(ctx, k / b, meas, f"{k:.2f} {unit} vs {baseline_name} {b:.2f} {unit} on {ctx.device.driver_name}")


def figure(module, name: str, *args) -> list[dict]:
    """What the plotting function ``name`` drew when called with ``args`` and a fresh path: one
    dict per axes (xscale, yscale, lines [[x, y], ...], points, images, texts, labels). The
    grader reads it from the sandboxed child; a notebook's own check cell draws it here."""
    recorder = _RECORDER.get()
    if recorder is not None:
        return recorder.figure(module, name, *args)
    fn = student(module, name)
    if hasattr(fn, "figure"):
        return fn.figure(*args)
    import tempfile

    from .child import draw
    with tempfile.TemporaryDirectory() as d:
        return draw(fn, list(args), os.path.join(d, "figure.png"))


def chunked_bijection(offset, rows: int, cols: int, chunk: int, name: str = "offset") -> tuple[bool, str]:
    """(ok, what is wrong): ``offset(i, j)`` maps the rows x cols tile one to one onto
    [0, rows * cols) and keeps every run of ``chunk`` elements of a row whole and aligned (what a
    kernel needs to move 16 bytes at a time). Lab 3's transpose layout, in the grader and in the
    student edition."""
    n, seen = rows * cols, set()
    for i in range(rows):
        for j in range(cols):
            o = offset(i, j)
            try:
                o = int(o)
            except (TypeError, ValueError):
                return False, f"{name}({i}, {j}) returned {o!r}, not an int"
            if not 0 <= o < n:
                return False, f"{name}({i}, {j}) = {o} lies outside the tile [0, {n})"
            seen.add(o)
            if j % chunk and o != int(offset(i, j - j % chunk)) + j % chunk:
                return False, (f"the {chunk}-element chunk of ({i}, {j - j % chunk}) is not kept whole: "
                               f"{name}({i}, {j}) = {o}")
            if j % chunk == 0 and o % chunk:
                return False, f"{name}({i}, {j}) = {o} does not start a chunk (not a multiple of {chunk})"
    if len(seen) != n:
        return False, f"{name}: two elements share an offset ({n - len(seen)} offsets unused)"
    return True, f"{name} is a bijection with whole, aligned chunks"


def near(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def hidden_count(ctx: Context) -> int:
    """How many hidden cases a part draws: none when only the public cases are graded."""
    return 0 if ctx.public_only else ctx.part.params["hidden_cases"]

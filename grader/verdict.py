"""Grade a part and give its verdict: the one rule that turns what a part's grading function
returns or raises into a report.PartResult. The command line's grading (grader/run.py), the GPU
harness (grader/harness.py), the notebook's check cells (grader/notebook.py) and the tests call
:func:`grade_part`; nothing else turns an exception into a verdict.

The rule, in order:

- a timing.KernelHang is not a verdict: it goes on to the caller, whose process must be restarted
  (the harness) or told to restart (the notebook);
- the grading machine failing (the jail could not be set up, the GPU harness could not start, a
  tool jail that failed before its tool ran) is the ``infrastructure`` verdict: never the
  student's error, counted apart, and ``check`` exits non-zero (grader/cli.py);
- a submission that stops at a ``todo(...)`` (NotImplementedError) is ``failed``: not implemented;
- anything else that went wrong is ``error``, said in the student's terms.

**What a report shows of the submission.** One child answers every part of a run (and the GPU
harness asks that child for kernels), so a function can record the hidden inputs one part gives
it and give them back in a later call of any part: a public case's answer, an exception, a
builder's error, a print. Which text was made from what cannot be told, so the rule is by run,
not by case. In a run that grades hidden cases (not ``public_only``), a report shows nothing the
submission produced while it was called, for any case of any part: no returned value (a wrong
public case shows its public inputs, the expected answer and "wrong answer"), no exception's
text or traceback (the case and the exception's type: a built-in's name, one of the grader's, or
"an exception of its own class"), no printed output (grader/run.py's notes give its length). What
it shows of the submission is what grading is: which cases were right, the first exception's
type, how its process ended; a few bits per part, never the inputs themselves. What stays is
what the grader wrote (its messages; a sandbox failure without the child's output) and what the
cells printed or raised as a child first ran them: a fresh child in a fresh jail, which has
answered no call and so has seen no hidden input. Every such message points to the details: the
part's check cell, or ``python -m grader check LAB --public``, grades the public cases alone and
shows everything. A grading function that writes its own messages follows the same rule
(grading.grade_calls does: ``ctx.public_only`` says whether answers may be shown).
"""
from __future__ import annotations

import builtins
import re
from typing import Callable

from . import dispatch, grading, report, sandbox, submission, timing, toolchain
from .context import CaseFailed, Context

PERF_TRIALS = 3

_MISSING = re.compile(r"the notebook defines no (\w+)\(\)")
_GRADERS_MISSING = re.compile(r"the notebook defines no \w+\(\): keep the function names of the skeleton")
_CHILD_MISSING = re.compile(r"(\w+)\(\) raised LookupError: the notebook defines no (\w+)\(\): keep the function "
                            r"names of the skeleton(?:\n|$)")
_KNOWN_ERRORS = {"BuildFailed", "BuildError", "AssemblyFailed", "DiagnosticError", "TVMError", "InternalError",
                 "StudentError", "HostCodeRefused", "CheckFailed",
                 "LaunchError", "PlanRejected", "AcceleratorError", "WrongTimedCall"}   # a kernel's failures on the GPU


def grade_part(module, ctx: Context, lower: Callable | None = None,
               describe: Callable[[BaseException], str] | None = None) -> report.PartResult:
    """Grade ``ctx.part`` on ``module`` (a jailed child's proxy, a notebook's namespace, a test's
    stand-in) with the lab's grading function (grader/dispatch.py) and give its verdict.
    ``lower``: how a kernel part's kernels are built (the notebook's own way); ``describe``: how
    an exception is said when its text may be shown (default: its type and message)."""
    try:
        outcome = dispatch.grade(ctx.lab.lab, ctx.part.id, module, ctx, lower=lower)
    except timing.KernelHang:
        raise
    except Exception as e:  # noqa: BLE001 - anything else is this part's verdict, never a crash
        return exception_result(ctx, e, describe)
    return ctx.to_result(outcome)


def exception_result(ctx: Context, e: BaseException,
                     describe: Callable[[BaseException], str] | None = None) -> report.PartResult:
    """The verdict of a part whose grading raised ``e`` (see the module's docstring)."""
    problem = infrastructure_problem(e)
    if problem is not None:
        return infrastructure_result(ctx, problem)
    if not shows_output(ctx):
        return _said_by_type(ctx, e)
    if isinstance(e, CaseFailed):
        e = e.error
    if isinstance(e, sandbox.SandboxFailure):
        return ctx.error_result(report.ERROR, str(e))
    if not_implemented(e):
        return ctx.error_result(report.FAILED, "not implemented yet: " + todo_line(e))
    return ctx.error_result(report.ERROR, (describe or _plain)(e))


def _said_by_type(ctx: Context, e: BaseException) -> report.PartResult:
    """A run that grades hidden cases: the exception by its case and its type, nothing the
    submission wrote; the grader's own words (a sandbox failure without the child's output, a
    function the notebook does not define) as they are."""
    if isinstance(e, sandbox.SandboxFailure):
        return ctx.error_result(report.ERROR, _without_output(str(e)))
    if _grader_made(e):
        return ctx.error_result(report.ERROR, _plain(e))
    error = e.error if isinstance(e, CaseFailed) else e
    missing = _missing_function(error)
    if missing:              # said in the grader's words; :func:`explain` names the cell that is why
        return ctx.error_result(report.ERROR, f"the notebook defines no {missing}(): keep the function names "
                                              "of the skeleton")
    where = e.label if isinstance(e, CaseFailed) else "this part's grading"
    said = f"{where} raised {exception_name(error)}; {grading.NOT_SHOWN.format(lab=ctx.lab.lab)}"
    if not_implemented(error):
        return ctx.error_result(report.FAILED, f"not implemented yet ({said})")
    return ctx.error_result(report.ERROR, said)


def infrastructure_result(ctx: Context, problem: str) -> report.PartResult:
    return ctx.error_result(report.INFRASTRUCTURE, "not graded: the grading machine failed, not your submission "
                                                   f"({problem.strip()[:2000]}); the part must be graded again")


def infrastructure_problem(e: BaseException) -> str | None:
    """What failed on the grading machine, when ``e`` is such a failure, else None: the sandbox's
    JailSetupFailed (said on a pipe the child never holds: a submission cannot forge it; a child
    that exits with the jail's own status 125 and prints "jail: ..." is the submission's doing);
    and a tool jail (ptxas, NVRTC) of the grader's whose only output is the jail's own
    error (the whole message in the grader's words: a compile error the child reports starts with
    the builder's call, and whatever it ends with is the submission's, neither a verdict of the
    machine nor text to show)."""
    if isinstance(e, sandbox.JailSetupFailed):
        return str(e)
    return toolchain.tool_jail_failure(e)


def shows_output(ctx: Context) -> bool:
    """Whether this part's report may show what the submission produced (its answers, its
    exceptions' text, what it printed): only when no hidden case is graded in the run."""
    return ctx.public_only


def _grader_made(e: BaseException) -> bool:
    """Exceptions whose whole text the grader wrote: the sandbox's (the child's printed output is
    cut off apart, :func:`_without_output`) and a function the notebook does not define."""
    return isinstance(e, sandbox.SandboxFailure) or (isinstance(e, AttributeError)
                                                     and bool(_GRADERS_MISSING.fullmatch(str(e))))


def _missing_function(e: BaseException) -> str | None:
    """The function the grader called, when the child answered that the notebook does not define
    it, in the child's own words for that function and nothing else (so its answer says one
    thing the grader can check in the notebook itself: grader/submission.py's cause_of_missing);
    else None."""
    m = _CHILD_MISSING.match(str(e))
    if getattr(e, "error_type", None) == "LookupError" and m and m.group(1) == m.group(2):
        return m.group(1)
    return None


def _without_output(text: str) -> str:
    """A sandbox failure's message without what the child printed while it answered calls (it may
    have printed a hidden case's inputs); what it printed while its cells ran, before any call, stays."""
    if "before it was ready" in text or "running the notebook's cells" in text or "last output:" not in text:
        return text
    return text.split("last output:", 1)[0].rstrip("; \n") + " (what it printed is not shown when hidden cases are graded)"


def exception_name(e: BaseException) -> str:
    """The type of an exception, as a hidden case may say it: a Python built-in exception's name or
    one of the grader's and the compiler's; any other name (a class the submission made, whose name
    could be anything) is "an exception of its own class". A child's error keeps the type it named."""
    name = getattr(e, "error_type", None) or type(e).__name__
    if not isinstance(name, str):
        return "an exception"
    builtin = getattr(builtins, name, None)
    if (isinstance(builtin, type) and issubclass(builtin, BaseException)) or name in _KNOWN_ERRORS:
        return name
    return "an exception of its own class"


def not_implemented(e: BaseException) -> bool:
    return isinstance(e, NotImplementedError) or "is not implemented yet" in str(e)


def todo_line(e: BaseException) -> str:
    """The line of a not-implemented error that says what to write."""
    for line in str(e).splitlines():
        if "not implemented" in line:
            line = re.sub(r"^(error:\s*)", "", line.strip())
            return line.split("not implemented yet: ", 1)[-1] if "not implemented yet: " in line else line
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _plain(e: BaseException) -> str:
    from . import remote
    if isinstance(e, remote.StudentError):
        return str(e)
    return f"{type(e).__name__}: {str(e)[:3000]}" if str(e) else type(e).__name__


def explain(message: str, module: submission.Module, cell_errors: list[str]) -> str:
    """A part's message with its cause first: a function the notebook does not define because
    its cell was left out (a syntax error) or raised when run is said as that cell's problem,
    once, in place of the missing name."""
    m = _MISSING.search(message)
    if not m:
        return message
    name = m.group(1)
    cause = module.cause_of_missing(name)
    if cause is None:
        raised = [c.splitlines()[0] for c in cell_errors]
        if raised:
            cause = (f"{name}() is not defined; cells that raised when run (the first may be why): "
                     + " | ".join(raised[:3]))
    return cause or message


def perf_trials(first: report.PartResult, again: Callable[[], report.PartResult], where: str = "") -> report.PartResult:
    """Measure a performance part below full credit again (``again``: in fresh processes when
    grading, in the notebook's process in a check cell), at most PERF_TRIALS trials; keep the best."""
    trials = [first]
    while (trials[-1].verdict in (report.PARTIAL, report.FAILED) and "ratio" in trials[-1].measurements
           and len(trials) < PERF_TRIALS):
        trials.append(again())
    best = max(trials, key=lambda r: (r.points, r.measurements.get("ratio", 0)))
    if len(trials) > 1:
        best.measurements["trials"] = [{"points": r.points, "ratio": r.measurements.get("ratio"),
                                        "verdict": r.verdict} for r in trials]
        ratios = ", ".join(f"{r.measurements['ratio']:.3f}x" for r in trials if "ratio" in r.measurements)
        best.message += f" (best of {len(trials)} trials{where}: {ratios})"
    return best

"""The wgmma accumulator-hazard check (part ``sass_hazard`` of Labs 4 and 5), as the student edition
runs it. The course grader's own check is ``grade_sass`` of grader/labs/lab4_gemm.py (and Lab 5's
wrapper of it, which compiles the persistent builders for the arch's reference GPU); those modules
hold the labs' references, so the edition leaves them out and grades the part with this function
instead (grader/edition/release.py, ``EDITION_CHECKS``). It reads nothing but the student's own
kernels: it compiles each builder the part names for its arch (no GPU), takes the SASS of the
launched functions, and runs the scan of grader/inspect.py over it. It gives the same points and
message as the course grader's check (tests/test_thin_spots.py compares the two)."""
from __future__ import annotations

from .. import build, grading, hardware, inspect
from ..context import Context, Outcome


def _not_implemented(e: Exception) -> bool:
    return isinstance(e, NotImplementedError) or "is not implemented yet" in str(e)


def _builder(module, name: str, persistent: set, arch: str):
    """The student's builder ``name``; a persistent one is given the SM count of the arch's
    reference GPU (132 CTAs for sm_90a), as the course grader gives it."""
    fn = grading.student(module, name)
    if name not in persistent:
        return fn
    num_sms = hardware.SPECS[hardware.TRACK_DEFAULT[arch]].sm_count
    return lambda *shape: fn(*shape, num_sms=num_sms)


def grade_sass(module, ctx: Context) -> Outcome:
    """A kernel without an early accumulator read earns its share of the points; one kernel with
    an early read costs all of them (ptxas adds a missing wait by itself in some kernels and not
    in others, so one clean kernel says little about the next)."""
    p = ctx.part.params
    persistent = set(p.get("persistent", ()))
    shares, lines, meas, todo = [], [], {}, []
    for name, shape in zip(p["builders"], p["shapes"]):
        try:
            kernel = _builder(module, name, persistent, p["arch"])(*shape)
            art = build.compile_only(kernel, p["arch"], want_sass=True)
        except build.BuildError as e:
            shares.append(0.0)
            if _not_implemented(e):
                todo.append(f"{name}: {str(e).splitlines()[0]}")
                lines.append(f"{name}: not implemented")
            else:
                lines.append(f"{name}: does not build: {grading.explain_build_error(e)[:700]}")
            continue
        except Exception as e:  # noqa: BLE001 - a todo() left in one kernel; anything else is raised
            if not _not_implemented(e):
                raise
            shares.append(0.0)
            todo.append(f"{name}: {str(e).splitlines()[0]}")
            lines.append(f"{name}: not implemented")
            continue
        if not art.sass:
            raise RuntimeError("no SASS: cuobjdump was not found (install nvidia-cuda-cuobjdump)")
        ok, msg, m = inspect.accumulator_hazards(inspect.launched_texts(art)["sass"])
        shares.append(1.0 if ok else 0.0)
        meas[name] = dict(m, evidence=inspect.STATIC)
        lines.append(f"{name} {'x'.join(map(str, shape))}: {msg}")
    if len(todo) == len(shares):
        raise NotImplementedError(todo[0])
    early = [line for line, name in zip(lines, p["builders"]) if meas.get(name, {}).get("early_reads")]
    if early:
        return Outcome(0.0, "accumulator hazard: " + " | ".join(early) + " | all kernels: " + " | ".join(lines),
                       meas)
    return Outcome(sum(shares) / len(shares), " | ".join(lines), meas)

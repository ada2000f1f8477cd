"""Per-lab grading functions. Each lab module exposes ``GRADERS``: part id -> function
``(submission_module, ctx) -> Outcome``. Numbers (shapes, tolerances, thresholds) come
from the lab's spec file, never from these modules.

A part without an entry in ``GRADERS`` is graded by the default runner of its kind
(grader/runners.py): a kernel part that names its ``problem`` (grader/problems.py) runs the
shared correctness or speed runner, a build part ``common.build_part``. So a lab whose kernels
compute a declared problem adds spec data, not grading code."""
from __future__ import annotations

import importlib
from typing import Callable


def _graders(lab: str) -> dict:
    name = f"{__name__}.{lab}"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return {}                      # a lab made of declared parts only
    return getattr(mod, "GRADERS", {})


def grading_function(lab: str, part) -> Callable:
    """The lab's own function for ``part``, else the default runner of the part's kind."""
    fn = _graders(lab).get(part.id)
    if fn is not None:
        return fn
    from .. import runners
    fn = runners.default_for(part)
    if fn is None:
        extra = " (a kernel part must name its problem in params)" if part.kind == "kernel" else ""
        raise KeyError(f"{lab} has no grading function for part {part.id!r} and no default runner for "
                       f"its kind {part.kind!r}{extra}")
    return fn


def grade(lab: str, part_id: str, module, ctx):
    if ctx.part.id != part_id:
        raise ValueError(f"grade({lab!r}, {part_id!r}) given the context of part {ctx.part.id!r}")
    return grading_function(lab, ctx.part)(module, ctx)

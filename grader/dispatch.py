"""Which function grades a part: the one dispatch used by the command line and the worker
processes (grader/run.py), the GPU harness (grader/harness.py), the notebook's check cells
(grader/notebook.py) and the tests.

A lab's module (grader/labs/<lab>.py, its hooks described in grader/labs/__init__.py) may give a
part its own grading function in ``GRADERS``, or declare a CPU question as data in ``QUESTIONS``
(graded by ``grading.grade_question``); every other part is graded by the default runner of its
kind (grader/runners.py): a kernel part that names its problem (grader/problems.py) by the
shared correctness or speed runner, a build part by ``grading.build_part``."""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Callable

from . import grading, runners
from .context import Context, Outcome


def _hook(lab: str, name: str) -> dict:
    module_name = f"grader.labs.{lab}"
    try:
        mod = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        return {}                      # a lab made of declared parts only
    return getattr(mod, name, {})


# What a static check compares a kernel against, given by the lab module (hashed in the student
# edition's table, whose lab modules read it from there): mechanism -> (the key the check reads
# among its texts, the lab module's hook, part id -> data).
CHECK_DATA = {"wgmma_desc_fields": ("desc_fields", "DESC_FIELDS"),        # the operand tiles' descriptor fields
              "wgmma_epilogue_places": ("acc_places", "ACC_PLACES")}      # where the epilogue stores each register


def check_data(lab: str, part) -> dict:
    """{texts key: the lab's data for ``part``, or None} for each mechanism of the part in CHECK_DATA."""
    return {key: _hook(lab, hook).get(part.id) for m, (key, hook) in CHECK_DATA.items() if m in part.mechanisms}


def lab_graders(lab: str) -> dict[str, Callable[..., Outcome]]:
    """The lab module's ``GRADERS``: its own grading functions."""
    return _hook(lab, "GRADERS")


def lab_questions(lab: str) -> dict[str, grading.Question]:
    """The lab module's ``QUESTIONS``: CPU questions declared as data."""
    return _hook(lab, "QUESTIONS")


def grading_function(lab: str, part) -> Callable[..., Outcome]:
    """The lab's own function for ``part``, else its declared question's runner, else the default
    runner of the part's kind."""
    fn = lab_graders(lab).get(part.id)
    if fn is not None:
        return fn
    question = lab_questions(lab).get(part.id)
    if question is not None:
        return functools.partial(grading.grade_question, question)
    fn = runners.default_for(part)
    if fn is None:
        extra = " (a kernel part must name its problem in params)" if part.kind == "kernel" else ""
        raise KeyError(f"{lab} has no grading function for part {part.id!r} and no default runner for "
                       f"its kind {part.kind!r}{extra}")
    return fn


def grade(lab: str, part_id: str, module, ctx: Context, lower: Callable | None = None) -> Outcome:
    """Grade ``part_id`` of ``lab`` on ``module`` (the submission: a jailed child's proxy, a
    notebook's namespace, a test's stand-in). ``lower``: how a kernel part's kernels are compiled
    and loaded, when not the grader's way for a submission (the notebook's own kernels); its
    ``prefetch``, if it has one, is given every kernel of a part before the first is lowered."""
    if ctx.part.id != part_id:
        raise ValueError(f"grade({lab!r}, {part_id!r}) given the context of part {ctx.part.id!r}")
    fn = grading_function(lab, ctx.part)
    if ctx.check_data is None:
        ctx = dataclasses.replace(ctx, check_data=check_data(lab, ctx.part))
    if lower is not None and fn is runners.kernel_part:
        return runners.kernel_part(module, ctx, runners.Env(lower=lower, prefetch=getattr(lower, "prefetch", None)))
    return fn(module, ctx)

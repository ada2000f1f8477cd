"""Per-lab grading functions. Each lab module exposes ``GRADERS``: part id -> function
``(submission_module, ctx) -> Outcome``. Numbers (shapes, tolerances, thresholds) come
from the lab's spec file, never from these modules."""
from __future__ import annotations

import importlib


def grade(lab: str, part_id: str, module, ctx):
    mod = importlib.import_module(f"{__name__}.{lab}")
    try:
        fn = mod.GRADERS[part_id]
    except KeyError:
        raise KeyError(f"{lab} has no grading function for part {part_id!r}") from None
    return fn(module, ctx)

"""Helpers called from the lab notebooks' test cells.

- ``check(lab, part, globals())`` runs the public cases on the live objects of the
  notebook, in the notebook's process, and raises AssertionError with the grader's
  message when the part is not fully right. Students run it while they work.
- ``grade(lab, part)`` is what the hidden grade cells call during ``nbgrader autograde``:
  it grades the notebook file on disk exactly as ``python -m grader check`` does (own
  subprocess, timeout, hidden cases) and returns the points, which nbgrader takes as
  partial credit. It writes nothing to stderr (nbgrader would read that as an error).
"""
from __future__ import annotations

import os
import types

from . import hardware, inputs, labs, report, run, spec
from .context import Context


def check(lab: str, part_id: str, namespace: dict) -> report.PartResult:
    lab_spec = spec.load(lab)
    part = lab_spec.part(part_id)
    device = hardware.detect()
    if part.needs_gpu and not device.present:
        print(f"{lab}/{part_id}: skipped, this part needs a GPU ({device.reason})")
        return report.PartResult(lab, part_id, part.title, 0.0, part.points, report.SKIPPED,
                                 device.reason, True)
    ctx = Context(lab_spec, part, inputs.PUBLIC_SEED, device, public_only=True)
    outcome = labs.grade(lab, part_id, types.SimpleNamespace(**namespace), ctx)
    res = ctx.to_result(outcome)
    print(report.format_line(res))
    assert res.verdict == report.PASSED, res.message
    return res


def grade(lab: str, part_id: str, notebook_dir: str | None = None) -> float:
    folder = notebook_dir or os.getcwd()
    results = run.check_lab(lab, folder, inputs.run_seed(), hardware.detect(), parts=[part_id],
                            progress=lambda msg: None)
    res = results[0]
    print(report.format_line(res))
    return report.nbgrader_score(res)

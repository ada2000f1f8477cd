"""Helpers called from the lab notebooks' test cells.

- ``check(lab, part, globals())`` runs the public cases on the live objects of the
  notebook, in the notebook's process, and raises AssertionError with the grader's
  message when the part is not fully right. Students run it while they work.
- ``grade(lab, part)`` is what the locked graded cells call. It is not a source of scores:
  ``nbgrader autograde`` never runs the notebook (grader/nbgrader_autograde.py grades the saved
  file with ``python -m grader check`` and fills the graded cells in). Run by a student, it says
  so and, for convenience, grades the part's public cases on the saved notebook in the cwd
  (``python -m grader check LAB --submission NOTEBOOK --part PART --public``, a subprocess) and
  prints the verdict line. It returns nothing and writes nothing to stderr.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import types

from . import hardware, inputs, labs, report, spec
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


def grade(lab: str, part_id: str, notebook_dir: str | None = None) -> None:
    folder = os.path.abspath(notebook_dir or os.getcwd())
    notebook = os.path.join(folder, spec.load(lab).notebook)
    target = notebook if os.path.isfile(notebook) else folder
    print(f"{lab}/{part_id}: graded cells are filled in by the autograder, which grades the saved "
          "notebook (hidden cases, in its own processes); running this cell gives no points.")
    print(f"Public cases of the saved notebook (save it first): python -m grader check {lab} "
          f"--submission {target} --part {part_id} --public")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET_SEED"}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="grader-public-") as tmp:
        path = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "grader", "check", lab, "--submission", target, "--part", part_id,
               "--public", "--json", path]
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, errors="replace", timeout=_PUBLIC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"  the public check did not finish within {_PUBLIC_TIMEOUT_S} s")
            return None
        try:
            with open(path) as f:
                rows = [r for r in json.load(f)["results"] if r.get("part") == part_id]
        except (OSError, ValueError, KeyError, TypeError):
            rows = None
        if not rows:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            print(f"  the public check gave no verdict (exit status {proc.returncode})"
                  + "".join(f"\n    {line}" for line in tail))
            return None
        fields = {f.name for f in dataclasses.fields(report.PartResult)}
        for r in rows:
            print(report.format_line(report.PartResult(**{k: v for k, v in r.items() if k in fields})))
    return None


_PUBLIC_TIMEOUT_S = 900

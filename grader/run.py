"""Grading a lab: extract the submission's module, apply the static rules, then grade each
part in its own subprocess (or skip it, saying why)."""
from __future__ import annotations

import os
import tempfile
from typing import Callable

from . import hardware, report, sandbox, spec, submission

SOLUTIONS_DIR = os.path.join(sandbox.REPO_ROOT, "solutions")


def reference_notebook(lab: str) -> str:
    return os.path.join(SOLUTIONS_DIR, lab, spec.load(lab).notebook)


def check_lab(lab: str, submission_path: str | None, seed: int, device: hardware.Device,
              parts: list[str] | None = None, public_only: bool = False,
              progress: Callable[[str], None] = report.print_progress) -> list[report.PartResult]:
    lab_spec = spec.load(lab)
    selected = [p for p in lab_spec.parts if parts is None or p.id in parts]
    if parts:
        unknown = set(parts) - {p.id for p in lab_spec.parts}
        if unknown:
            raise KeyError(f"{lab} has no part(s) {sorted(unknown)}")

    def all_parts(verdict: str, message: str) -> list[report.PartResult]:
        return [report.PartResult(lab, p.id, p.title, 0.0, p.points, verdict, message, p.needs_gpu)
                for p in selected]

    try:
        nb = submission.find_notebook(submission_path or os.path.join(SOLUTIONS_DIR, lab), lab_spec.notebook)
        workdir = tempfile.mkdtemp(prefix=f"grader-{lab}-")
        module_path = submission.write_module(nb, workdir)
    except submission.SubmissionError as e:
        return all_parts(report.ERROR, str(e))
    with open(module_path) as f:
        violations = submission.static_violations(f.read())
    if violations:
        return all_parts(report.FAILED, "rejected by the static rules: " + "; ".join(violations))

    results = []
    for i, part in enumerate(selected, 1):
        head = f"[{lab} {i}/{len(selected)}] {part.id}: {part.title}"
        if part.needs_gpu and not device.present:
            results.append(report.PartResult(lab, part.id, part.title, 0.0, part.points, report.SKIPPED,
                                             f"skipped: needs a GPU ({device.reason})", True))
            progress(f"{head} ... skipped (no GPU)")
            continue
        progress(f"{head} ... running (timeout {part.timeout_s:g} s)")
        res = sandbox.run_part(lab, part, module_path, seed, public_only=public_only,
                               workdir=os.path.join(workdir, part.id))
        results.append(res)
        progress(f"{head} ... {res.verdict} ({res.points:g}/{res.max_points:g})")
    return results


def device_facts(device: hardware.Device) -> dict:
    facts = {"present": device.present, "name": device.driver_name or None,
             "row": device.spec.name if device.spec else None, "row_note": device.row_note,
             "track": device.track, "reason": device.reason or None}
    if device.present:
        from . import timing
        facts["clocks"] = timing.read_clocks()
    return facts

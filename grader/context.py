"""What a lab's grading function is given (the part, the seed, the GPU) and the
Outcome it returns, turned into a PartResult."""
from __future__ import annotations

import dataclasses
from typing import Any

from . import hardware, hints, report, spec


@dataclasses.dataclass
class Outcome:
    fraction: float                  # of the part's points, in [0, 1]
    message: str
    measurements: dict[str, Any] = dataclasses.field(default_factory=dict)
    verdict: str | None = None       # derived from fraction unless given


@dataclasses.dataclass
class Context:
    lab: spec.LabSpec
    part: spec.Part
    seed: int
    device: hardware.Device
    public_only: bool = False
    end_student_code: Any = None     # called before timing: stops the submission's processes
    on_mismatch: Any = None          # told of every wrong kernel output (what, got, expected, tolerance)
    check_data: Any = None           # what a build part's static checks compare against (dispatch.check_data)

    def to_result(self, outcome: Outcome) -> report.PartResult:
        frac = min(1.0, max(0.0, outcome.fraction))
        verdict = outcome.verdict or (report.PASSED if frac >= 1.0 else
                                      report.PARTIAL if frac > 0 else report.FAILED)
        return report.PartResult(self.lab.lab, self.part.id, self.part.title,
                                 round(frac * self.part.points, 4), self.part.points, verdict,
                                 hints.same_for_every_arch(outcome.message), self.part.needs_gpu,
                                 outcome.measurements)

    def error_result(self, verdict: str, message: str) -> report.PartResult:
        return report.PartResult(self.lab.lab, self.part.id, self.part.title, 0.0, self.part.points,
                                 verdict, message, self.part.needs_gpu, {})


class CaseFailed(Exception):
    """The submission raised on one case of a table of calls (grading.grade_calls); the verdict
    (grader/verdict.py) decides what of it is shown. ``label``: the case as a message may name it
    (a public call with its arguments, or "hidden case #k"); ``error``: what was raised;
    ``clean``: no hidden case of the table had run before it, so text the submission produced
    can carry public inputs only. Its own text names the case and the exception's type, nothing
    the submission wrote."""

    def __init__(self, label: str, error: BaseException, hidden: bool, clean: bool):
        super().__init__(f"{label} raised an exception")
        self.label, self.error, self.hidden, self.clean = label, error, hidden, clean


@dataclasses.dataclass(frozen=True)
class Work:
    """What one call must do at least: bytes through HBM and FLOPs (for the floor and the rates)."""
    bytes: float = 0.0
    flops: float = 0.0

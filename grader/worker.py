"""Entry point of the grading subprocess: ``python -m grader.worker JOB.json``.

Imports the submission module, calls the lab's grading function for one part, and
writes a PartResult as JSON to the job's private result file.
"""
from __future__ import annotations

import json
import sys
import traceback

from . import hardware, labs, report, spec, submission
from .context import Context


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    lab_spec = spec.load(job["lab"])
    part = lab_spec.part(job["part"])
    device = hardware.detect()
    ctx = Context(lab_spec, part, job["seed"], device, public_only=job["public_only"])
    try:
        module = submission.import_module(job["module_path"])
        outcome = labs.grade(lab_spec.lab, part.id, module, ctx)
        res = ctx.to_result(outcome)
    except NotImplementedError as e:
        res = ctx.error_result(report.FAILED, f"not implemented: {e}" if str(e) else "not implemented")
    except Exception as e:  # noqa: BLE001 - any student exception becomes a verdict
        if "is not implemented yet" in str(e):  # todo() inside a kernel, reported by TIRx's parser
            res = ctx.error_result(report.FAILED, "not implemented: " + str(e).splitlines()[0])
        else:
            tb = traceback.format_exc(limit=-4)
            res = ctx.error_result(report.ERROR, f"{type(e).__name__}: {e}\n{tb}")
    with open(job["result_path"], "w") as f:
        json.dump(res.to_dict(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

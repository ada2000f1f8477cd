"""Every graded part runs in a subprocess of its own, with a timeout.

A kernel that deadlocks (an mbarrier wait that never completes), faults or takes the
process down gets a verdict saying so, and the grader goes on with the next part. The
worker writes its result to a private file, never to stdout, so nothing a submission
prints can forge a result.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from . import report

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HANG_HINT = ("likely a barrier wait that never completes (an mbarrier phase that never flips, "
             "or an expect_tx byte count that does not match the bytes the copies deliver)")


@dataclasses.dataclass
class Job:
    lab: str
    part: str
    module_path: str
    seed: int
    result_path: str
    public_only: bool = False


def _tail(path: str, n: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def run_part(lab: str, part, module_path: str, seed: int, public_only: bool = False,
             timeout_s: float | None = None, workdir: str | None = None) -> report.PartResult:
    """Grade one part in a fresh Python process; always returns a PartResult."""
    timeout = part.timeout_s if timeout_s is None else timeout_s
    workdir = workdir or tempfile.mkdtemp(prefix=f"grader-{lab}-{part.id}-")
    os.makedirs(workdir, exist_ok=True)
    job = Job(lab, part.id, os.path.abspath(module_path), seed,
              os.path.join(workdir, "result.json"), public_only)
    job_path = os.path.join(workdir, "job.json")
    with open(job_path, "w") as f:
        json.dump(dataclasses.asdict(job), f)
    log_path = os.path.join(workdir, "worker.log")
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET_SEED"}
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")

    def result(verdict: str, message: str, **measurements) -> report.PartResult:
        return report.PartResult(lab, part.id, part.title, 0.0, part.points, verdict, message,
                                 part.needs_gpu, measurements)

    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "grader.worker", job_path], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=os.path.dirname(job.module_path),
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            what = HANG_HINT if part.needs_gpu else "an endless loop or far too much work"
            return result(report.ERROR, f"timed out after {timeout:g} s: {what}. "
                          f"The process was killed; last output:\n{_tail(log_path, 8)}",
                          elapsed_s=time.monotonic() - start)
    elapsed = time.monotonic() - start
    if os.path.exists(job.result_path):
        with open(job.result_path) as f:
            data = json.load(f)
        data.setdefault("measurements", {})["elapsed_s"] = round(elapsed, 3)
        return report.PartResult(**data)
    if rc < 0:
        how = f"killed by signal {signal.Signals(-rc).name}"
    else:
        how = f"exited with code {rc}"
    return result(report.ERROR, f"the worker {how} before reporting a result "
                  f"(a crash in the kernel or the driver?); last output:\n{_tail(log_path)}",
                  elapsed_s=elapsed)

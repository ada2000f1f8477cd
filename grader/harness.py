"""The GPU harness: ``python -I``-started ``grader.harness.main([FD])`` (sandbox.trusted_command), a
trusted process started by the grader (grader/run.py) with the secret seed removed from its
environment.

It grades GPU parts with grader/verdict.py (the lab's grading function and its verdict): makes
the inputs and the float64 references, turns each kernel's PTX and launch plan into a cubin it
assembled and launches itself (grader/launch.py), compares, and times with its own CUDA events.
No submission code runs here, host code included: calls to the submission (a kernel builder) go
through the grading process to the sandboxed child (remote.BrokerBackend), and before a kernel is timed the child
and everything it started are stopped.

A kernel that does not finish within timing.HANG_S seconds of a wait is reported as a hang and
this process exits (its CUDA context cannot be recovered); the grader starts a fresh one.
"""
from __future__ import annotations

import os
import socket
import sys

from . import channel, hardware, report, sandbox, spec, timing, verdict
from .context import Context
from .remote import BrokerBackend, RemoteSubmission


def grade(job: dict, backend: BrokerBackend, device) -> report.PartResult:
    lab_spec = spec.load(job["lab"])
    part = lab_spec.part(job["part"])
    ctx = Context(lab_spec, part, int(job["seed"]), device, public_only=bool(job["public_only"]),
                  end_student_code=backend.end)
    timing.HANG_S = float(part.params.get("hang_s", timing.HANG_S))
    return verdict.grade_part(RemoteSubmission(backend), ctx)


def main(argv: list[str]) -> int:
    sandbox.protect_grader()
    sandbox.require_isolation("--unsafe-no-sandbox" in argv[1:])
    sock = socket.socket(fileno=int(argv[0]))
    backend = BrokerBackend(sock)
    device = hardware.detect()
    channel.send(sock, {"ready": True})
    while True:
        try:
            job = channel.recv(sock)
        except channel.ChannelClosed:
            return 0
        try:
            res = grade(job, backend, device)
        except timing.KernelHang as e:
            channel.send(sock, {"hang": str(e)})
            os._exit(3)
        channel.send(sock, {"result": res.to_dict()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

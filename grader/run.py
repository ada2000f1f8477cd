"""Grading a lab: the trusted side of the boundary described in grader/sandbox.py.

1. The notebook is read as untrusted data and turned into a module file with a line map
   (grader/submission.py); static advice is collected, never scored.
2. One sandboxed child runs the notebook's cells once for the whole lab (an import that never
   ends costs one time limit) and answers calls as plain JSON (grader/remote.py). A part that
   crashes or times out the child costs that part; the next part gets a fresh child.
3. CPU parts are graded here: this process makes the cases, sends only their inputs, and
   compares the answers it gets back.
4. GPU parts are graded in the GPU harness (grader/harness.py), a trusted process that asks
   this one for kernel libraries; before timing, the child is stopped. A deadlocked kernel is
   caught by the harness within ``hang_s`` of its launch; a harness that stops answering is
   killed at the part's time limit.
5. A performance part below full credit is measured again in a fresh harness (at most
   ``PERF_TRIALS`` trials in all); the best trial counts and the report lists every trial.
Temporary folders are removed and every process is stopped before check_lab returns.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable

from . import channel, hardware, labs, remote, report, sandbox, spec, submission, timing
from .context import Context

SOLUTIONS_DIR = os.path.join(sandbox.REPO_ROOT, "solutions")
PERF_TRIALS = 3
GPU_LOCK = "/tmp/grader-gpu-{}.lock"  # one per GPU (its UUID); only the grader's own user may open it
SECRET_ENV = "GRADER_SECRET_SEED"


def reference_notebook(lab: str) -> str:
    return os.path.join(SOLUTIONS_DIR, lab, spec.load(lab).notebook)


def _not_implemented(e: BaseException) -> bool:
    return isinstance(e, NotImplementedError) or "is not implemented yet" in str(e)


def outcome_to_result(ctx: Context, grade: Callable) -> report.PartResult:
    """Run a part's grading function and turn whatever happens into a PartResult."""
    try:
        return ctx.to_result(grade())
    except timing.KernelHang:
        raise
    except sandbox.SandboxFailure as e:
        return ctx.error_result(report.ERROR, str(e))
    except remote.StudentError as e:
        if _not_implemented(e):
            return ctx.error_result(report.FAILED, "not implemented: " + str(e).split(": ", 1)[-1].splitlines()[0])
        return ctx.error_result(report.ERROR, str(e))
    except Exception as e:  # noqa: BLE001 - anything else is this part's verdict, never a crash
        if _not_implemented(e):
            first = str(e).splitlines()[0] if str(e) else "not implemented"
            return ctx.error_result(report.FAILED, f"not implemented: {first}")
        return ctx.error_result(report.ERROR, f"{type(e).__name__}: {str(e)[:3000]}")


class Harness:
    """The GPU harness process, started on first use and again after a hang or a crash."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None

    def start(self) -> None:
        self.close()
        mine, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        env["PYTHONPATH"] = sandbox.REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "grader.harness", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), env=env, cwd=tempfile.gettempdir(),
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        sandbox.register_child(self.proc.pid)
        theirs.close()
        self.sock = mine
        channel.recv(self.sock, 300)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            sandbox.kill_tree(self.proc, None)
            self.proc = None

    def grade(self, job: dict, backend: remote.ChildBackend, part: spec.Part, gpu_id: str = "") -> report.PartResult:
        """Grade one GPU part under the GPU's lock, shared by correctness parts and exclusive for
        timed parts: parts graded by other grader processes (several labs at once, a batch) may
        run beside a correctness check but never beside a timed kernel."""
        import fcntl
        path = GPU_LOCK.format("".join(c for c in gpu_id if c.isalnum() or c == "-") or "0")
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        if os.fstat(fd).st_uid != os.geteuid():      # made by someone else (a child, in /tmp): replace it
            os.close(fd)
            os.unlink(path)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if part.thresholds else fcntl.LOCK_SH)
            return self._grade(job, backend, part)
        finally:
            os.close(fd)

    def _grade(self, job: dict, backend: remote.ChildBackend, part: spec.Part) -> report.PartResult:
        def error(msg: str) -> report.PartResult:
            return report.PartResult(job["lab"], part.id, part.title, 0.0, part.points, report.ERROR, msg, True)

        if self.proc is None or self.proc.poll() is not None:
            self.start()
        deadline = time.monotonic() + part.timeout_s
        backend.deadline = deadline
        channel.send(self.sock, job)
        while True:
            deadline = max(deadline, backend.deadline)      # the child's start-up is not the part's time
            try:
                msg = channel.recv(self.sock, max(0.0, deadline - time.monotonic()))
            except channel.ChannelTimeout:
                self.close()
                return error(f"timed out after {part.timeout_s:g} s: {sandbox.HANG_HINT}. The process was killed.")
            except (channel.ChannelClosed, channel.BadMessage) as e:
                rc = self.proc.poll() if self.proc else None
                self.close()
                return error(f"the GPU harness ended while running your kernel (exit {rc}: a crash in the kernel "
                             f"or the driver, e.g. an illegal memory access?) ({e})")
            if "need" in msg:
                channel.send(self.sock, remote.serve_broker_request(backend, msg["need"]))
            elif "hang" in msg:
                self.close()
                return error(f"timed out: a kernel did not finish within {part.params.get('hang_s', timing.HANG_S):g} s "
                             f"of its launch: {sandbox.HANG_HINT}. The process was killed.")
            elif "result" in msg:
                return report.PartResult(**msg["result"])


def _perf_trials(first: report.PartResult, again: Callable[[], report.PartResult]) -> report.PartResult:
    """Measure a performance part below full credit again (fresh processes); keep the best."""
    trials = [first]
    while (trials[-1].verdict in (report.PARTIAL, report.FAILED) and "ratio" in trials[-1].measurements
           and len(trials) < PERF_TRIALS):
        trials.append(again())
    best = max(trials, key=lambda r: (r.points, r.measurements.get("ratio", 0)))
    if len(trials) > 1:
        best.measurements["trials"] = [{"points": r.points, "ratio": r.measurements.get("ratio"),
                                        "verdict": r.verdict} for r in trials]
        best.message += f" (best of {len(trials)} trials in fresh processes)"
    return best


def check_lab(lab: str, submission_path: str | None, seed: int, device: hardware.Device,
              parts: list[str] | None = None, public_only: bool = False,
              progress: Callable[[str], None] = report.print_progress,
              notes: list[str] | None = None, hide: list[str] | None = None) -> list[report.PartResult]:
    """Grade ``parts`` (default: all) of ``lab`` for the notebook at ``submission_path`` (or the
    reference solution). Always returns one PartResult per selected part. ``notes`` receives
    advice and per-cell problems; ``hide`` lists folders the child must not see."""
    lab_spec = spec.load(lab)
    if parts:
        unknown = set(parts) - {p.id for p in lab_spec.parts}
        if unknown:
            raise KeyError(f"{lab} has no part(s) {sorted(unknown)}")
    selected = [p for p in lab_spec.parts if not parts or p.id in parts]
    notes = notes if notes is not None else []
    workdir = tempfile.mkdtemp(prefix=f"grader-{lab}-")
    session = harness = None
    try:
        try:
            nb = submission.find_notebook(submission_path or os.path.join(SOLUTIONS_DIR, lab), lab_spec.notebook)
            module = submission.write_module(nb, os.path.join(workdir, "module"))
        except submission.SubmissionError as e:
            return [report.PartResult(lab, p.id, p.title, 0.0, p.points, report.ERROR, str(e), p.needs_gpu)
                    for p in selected]
        notes += module.problems + submission.advice(module)
        folder = os.path.dirname(os.path.abspath(nb))
        shared = {"/", tempfile.gettempdir(), os.path.expanduser("~"), sandbox.REPO_ROOT}
        hidden = list(hide or []) + ([folder] if folder not in shared else [])
        session = sandbox.ChildSession(module.path, hide=hidden,
                                       limits=sandbox.Limits(cpu_s=int(sum(p.timeout_s for p in selected)) + 600))
        trusted = os.path.join(workdir, "libraries")
        os.makedirs(trusted)
        backend = remote.ChildBackend(session, trusted, module.relocate,
                                      import_timeout=float(lab_spec.raw.get("import_timeout_s", 180)))
        harness = Harness()
        results = {}
        # CPU parts first, then GPU correctness, then timed parts: timing stops the child, and
        # every restart costs running the cells again. The report keeps the spec's order.
        order = sorted(selected, key=lambda p: (p.needs_gpu, bool(p.thresholds)))
        for part in order:
            i = selected.index(part) + 1
            head = f"[{lab} {i}/{len(selected)}] {part.id}: {part.title}"
            if part.needs_gpu and not device.present:
                results[part.id] = report.PartResult(lab, part.id, part.title, 0.0, part.points, report.SKIPPED,
                                                 f"skipped: needs a GPU ({device.reason})", True)
                progress(f"{head} ... skipped (no GPU)")
                continue
            progress(f"{head} ... running (time limit {part.timeout_s:g} s)")
            start = time.monotonic()
            if part.needs_gpu:
                job = {"lab": lab, "part": part.id, "seed": seed, "public_only": public_only}

                def run_once(job=job, part=part):
                    harness.close()
                    return harness.grade(job, backend, part, device.uuid)

                res = harness.grade(job, backend, part, device.uuid)
                if part.thresholds:
                    res = _perf_trials(res, run_once)
            else:
                backend.deadline = start + part.timeout_s
                ctx = Context(lab_spec, part, seed, device, public_only=public_only)
                res = outcome_to_result(ctx, lambda: labs.grade(lab, part.id, remote.RemoteSubmission(backend), ctx))
            res.message = module.relocate(res.message)
            if module.problems and res.verdict in (report.ERROR, report.FAILED):
                res.message += "\nCells left out of your module: " + " | ".join(module.problems)
            if backend.cell_errors and res.verdict in (report.ERROR, report.FAILED):
                res.message += "\nCells that raised when run: " + " | ".join(c.splitlines()[0] for c in backend.cell_errors)
            res.measurements["elapsed_s"] = round(time.monotonic() - start, 3)
            res.measurements.setdefault("sandbox", session.level)
            results[part.id] = res
            progress(f"{head} ... {res.verdict} ({res.points:.2f}/{res.max_points:g})")
        if backend.cell_errors:
            notes += [f"{c.splitlines()[0]}" for c in backend.cell_errors]
        if session.output().strip():
            notes.append("your cells printed (first and last lines kept): " + session.output()[-2000:])
        return [results[p.id] for p in selected]
    finally:
        if session is not None:
            session.close()
        if harness is not None:
            harness.close()
        shutil.rmtree(workdir, ignore_errors=True)


def device_facts(device: hardware.Device) -> dict:
    facts = {"present": device.present, "name": device.driver_name or None,
             "row": device.spec.name if device.spec else None, "row_note": device.row_note,
             "track": device.track, "reason": device.reason or None}
    if device.present:
        facts["clocks"] = timing.read_clocks()
    return facts


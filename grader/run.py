"""Grading a lab: the trusted side of the boundary described in grader/sandbox.py.

1. The notebook is read as untrusted data and turned into a module file with a line map
   (grader/submission.py); static advice is collected, never scored.
2. Sandboxed children (see :func:`default_workers`) each run the notebook's cells once
   (an import that never ends costs one time limit) and answer calls as plain JSON
   (grader/remote.py); untimed parts are spread over them. A part that crashes or times out a
   child costs that part; the next part gets a fresh child.
3. CPU parts are graded here: this process makes the cases, sends only their inputs, and
   compares the answers it gets back.
4. GPU parts are graded in GPU harnesses (grader/harness.py), trusted processes that ask this
   one for kernel libraries; a lab's workers share them, and they start ahead, while the
   children build kernels. The kernels of the GPU parts are built ahead, spread over the
   children with the untimed parts, into a table shared by the workers (remote.Builds): the same
   builder with the same arguments is built and exported once. Before timing, the child is
   stopped; a timed part whose kernels were built ahead starts no child again. A deadlocked kernel is
   caught by the harness within ``hang_s`` of its launch; a harness that stops answering is
   killed at the part's time limit.
5. A performance part below full credit is measured again in a fresh harness (at most
   ``verdict.PERF_TRIALS`` trials in all); the best trial counts and the report lists every trial.
Temporary folders are removed and every process is stopped before check_lab returns.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Callable

from . import (build, channel, dispatch, executed, hardware, remote, report, sandbox, spans, spec, submission, timing,
               verdict)
from .context import Context

SOLUTIONS_DIR = os.path.join(sandbox.REPO_ROOT, "solutions")
MAX_WORKERS = 8
GPU_LOCK = "gpu-{}.lock"              # one per GPU (its UUID), in the grader's private folder
SECRET_ENV = "GRADER_SECRET_SEED"


def reference_notebook(lab: str) -> str:
    return os.path.join(SOLUTIONS_DIR, lab, spec.load(lab).notebook)


class Harness:
    """The GPU harness process, started on first use (or ahead, :meth:`prestart`) and again after
    a hang or a crash."""

    def __init__(self, unsafe: bool = False) -> None:
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._starting: threading.Thread | None = None
        self.unsafe = unsafe

    def prestart(self) -> None:
        """Start the process in the background (importing torch and making a CUDA context take
        seconds): the first part that needs it waits only for what is left. A start that fails
        here is tried again, in the open, on first use."""
        def start_quietly() -> None:
            try:
                self.start()
            except Exception:  # noqa: BLE001 - first use starts it again and reports
                self._close_process()
        self._starting = threading.Thread(target=start_quietly, daemon=True)
        self._starting.start()

    def _wait_started(self) -> None:
        if self._starting is not None and self._starting is not threading.current_thread():
            self._starting.join()
            self._starting = None

    def start(self) -> None:
        self._close_process()
        mine, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        # Isolated: python -I with the grader's own module path, in its private folder.
        args = [str(theirs.fileno())] + (["--unsafe-no-sandbox"] if self.unsafe else [])
        self.proc = subprocess.Popen(sandbox.trusted_command("harness", *args), pass_fds=(theirs.fileno(),), env=env,
                                     cwd=sandbox.private_dir(), stdin=subprocess.DEVNULL, start_new_session=True)
        sandbox.register_child(self.proc.pid)
        theirs.close()
        self.sock = mine
        channel.recv(self.sock, 300)

    def close(self) -> None:
        self._wait_started()
        self._close_process()

    def _close_process(self) -> None:
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
        name = GPU_LOCK.format("".join(c for c in gpu_id if c.isalnum() or c == "-") or "0")
        fd = os.open(os.path.join(sandbox.private_dir(), name), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        mode = "exclusive" if part.thresholds else "shared"
        try:
            with spans.span("gpu_lock_wait", mode=mode):
                fcntl.flock(fd, fcntl.LOCK_EX if part.thresholds else fcntl.LOCK_SH)
            with spans.span("gpu_lock_held", mode=mode):
                return self._grade(job, backend, part)
        finally:
            os.close(fd)

    def _grade(self, job: dict, backend: remote.ChildBackend, part: spec.Part) -> report.PartResult:
        def error(msg: str) -> report.PartResult:
            return report.PartResult(job["lab"], part.id, part.title, 0.0, part.points, report.ERROR, msg, True)

        self._wait_started()
        if self.proc is None or self.proc.poll() is not None:
            try:
                self.start()
            except (OSError, channel.ChannelClosed, channel.ChannelTimeout, channel.BadMessage,
                    sandbox.SandboxFailure) as e:
                rc = self.proc.poll() if self.proc else None
                self.close()
                return report.PartResult(job["lab"], part.id, part.title, 0.0, part.points, report.INFRASTRUCTURE,
                                         f"not graded: the GPU harness could not start (exit {rc}: {type(e).__name__}: "
                                         f"{e}); the grading machine failed, not your submission: the part must be "
                                         "graded again", True)
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
                reply = remote.serve_broker_request(backend, msg["need"])
                if isinstance(msg["need"], dict) and msg["need"].get("op") == "export":
                    reply = build.with_cubin(reply, str(msg["need"].get("arch")))
                channel.send(self.sock, reply)
            elif "hang" in msg:
                self.close()
                return error(f"timed out: a kernel did not finish within {part.params.get('hang_s', timing.HANG_S):g} s "
                             f"of its launch: {sandbox.HANG_HINT}. The process was killed.")
            elif "result" in msg:
                return report.PartResult(**msg["result"])


def default_workers(labs_at_once: int = 1) -> int:
    """Children per lab: one per two cores, at most eight, for one lab alone; one per four cores,
    at most four, when several labs are graded at once (``check all``)."""
    cores = os.cpu_count() or 1
    if labs_at_once > 1:
        return max(1, min(MAX_WORKERS // 2, cores // 4))
    return max(1, min(MAX_WORKERS, cores // 2))


class _Harnesses:
    """The GPU harnesses of one lab's grading, shared by its workers: a GPU part takes whichever
    is free (a harness is not tied to a child: it asks the grading process for kernels through
    the backend of the part's worker). With ``prestart`` they start at once, in the background,
    while the children build kernels."""

    def __init__(self, n: int, prestart: bool, unsafe: bool = False) -> None:
        import queue
        self.all = [Harness(unsafe) for _ in range(n)]
        self._free: queue.Queue = queue.Queue()
        for h in self.all:
            if prestart:
                h.prestart()
            self._free.put(h)

    def grade(self, job: dict, backend: remote.ChildBackend, part: spec.Part, gpu_id: str,
              fresh: bool = False) -> report.PartResult:
        """Grade a GPU part on a free harness; ``fresh``: in a new process (a trial again)."""
        h = self._free.get()
        try:
            if fresh:
                h.close()
            return h.grade(job, backend, part, gpu_id)
        finally:
            self._free.put(h)

    def keep_one(self) -> None:
        """Before the timed parts (no part is running): only the first harness is kept."""
        import queue
        for h in self.all[1:]:
            h.close()
        self.all = self.all[:1]
        self._free = queue.Queue()
        self._free.put(self.all[0])

    def close(self) -> None:
        for h in self.all:
            h.close()


class _Worker:
    """One sandboxed child: it runs the notebook's cells."""

    def __init__(self, module_path: str, cpu_s: int, relocate, import_timeout: float, builds: remote.Builds,
                 unsafe: bool, hide: list[str]) -> None:
        self.session = sandbox.ChildSession(module_path, limits=sandbox.Limits(cpu_s=cpu_s), unsafe=unsafe, hide=hide)
        self.backend = remote.ChildBackend(self.session, relocate, import_timeout=import_timeout, builds=builds)

    def close(self) -> None:
        self.session.close()


@dataclasses.dataclass
class _BuildAhead:
    """One kernel a GPU part will ask for, built (and exported for the GPU's arch) by whichever
    worker is free, before the part runs: kernels compile in parallel, and a timed part whose
    kernels are all built needs no child at all (remote.Builds)."""
    part: spec.Part
    name: str
    args: tuple
    kwargs: dict


def builds_ahead(lab_spec: spec.LabSpec, parts: list[spec.Part], seed: int, device: hardware.Device,
                 public_only: bool) -> list[_BuildAhead]:
    """The kernels the GPU parts of ``parts`` that use the default kernel runner will build, each
    (builder, arguments) once: a kernel two parts use is planned for the untimed one (graded
    first, see :func:`pool_order`)."""
    from . import runners
    out, seen = [], set()
    for part in sorted(parts, key=lambda p: bool(p.thresholds)):
        if not (part.needs_gpu and part.kind == "kernel" and dispatch.grading_function(lab_spec.lab, part)
                is runners.DEFAULT_RUNNERS["kernel"]):
            continue
        ctx = Context(lab_spec, part, seed, device, public_only=public_only)
        try:
            calls = runners.planned_calls(ctx, device.sm_count)
        except Exception:  # noqa: BLE001 - a part the planner cannot read reports it itself
            continue
        for name, args, kw in calls:
            key = (name, tuple(args), tuple(sorted(kw.items())))
            if key not in seen:
                seen.add(key)
                out.append(_BuildAhead(part, name, tuple(args), dict(kw)))
    return out


@dataclasses.dataclass
class _TimedTurn:
    """A timed part's place in the pool: the worker that takes it grades the part once every
    untimed GPU part of the lab has its verdict (its kernels are checked, and none hung), while
    the other workers go on; the GPU's exclusive lock keeps every other kernel off the GPU while
    it is timed."""
    part: spec.Part


class _TimedGate:
    """When a timed part of a lab may run in its pool: once every untimed GPU part has its
    verdict and the kernels built ahead for the part are built (so that it never waits for a
    build while it holds the GPU). If an untimed GPU part timed out while other parts ran beside
    it (``regraded``: it is graded again alone after the pool), or its grading failed, the timed
    parts wait until after the pool instead."""

    def __init__(self, untimed: list[str], regraded: bool, ahead: list[_BuildAhead] = ()) -> None:
        self._left = set(untimed)
        self._cond = threading.Condition()
        self._again = False
        self._regraded = regraded
        self._building: dict[str, int] = {}
        for job in ahead:
            self._building[job.part.id] = self._building.get(job.part.id, 0) + 1

    def built(self, part_id: str) -> None:
        """One kernel built ahead for ``part_id`` is done (built, or failed: the part reports it)."""
        with self._cond:
            self._building[part_id] = self._building.get(part_id, 1) - 1
            self._cond.notify_all()

    def done(self, part_id: str, result: report.PartResult | None) -> None:
        with self._cond:
            if part_id not in self._left:
                return
            self._left.discard(part_id)
            if result is None or (result.verdict == report.ERROR and "timed out" in result.message):
                self._again = True
            self._cond.notify_all()

    def wait(self, part_id: str = "") -> bool:
        """Block until every untimed GPU part has its verdict and ``part_id``'s kernels are built;
        True: time the part now, False: after the pool."""
        with self._cond:
            self._cond.wait_for(lambda: not self._left and self._building.get(part_id, 0) <= 0)
            return not self._again or not self._regraded


def pool_order(cpu: list[spec.Part], gpu_untimed: list[spec.Part], ahead: list[_BuildAhead],
               timed: list[spec.Part] = ()) -> list:
    """The order the workers take the work in: the CPU parts (longest time limit first, so that
    no long part starts last); the GPU parts that build their own kernels; then each GPU
    correctness part right after the kernels built ahead for it (it starts while later kernels
    build; a kernel still being built when the part asks for it is waited for, not built twice);
    the timed parts' kernels last, each timed part (a :class:`_TimedTurn`) right after its own."""
    by_part: dict[str, list[_BuildAhead]] = {}
    for job in ahead:
        by_part.setdefault(job.part.id, []).append(job)
    own = [p for p in gpu_untimed if p.id not in by_part]
    order: list = list(cpu) + own
    for p in gpu_untimed:
        if p.id in by_part:
            order += by_part.pop(p.id) + [p]
    for p in timed:
        order += by_part.pop(p.id, []) + [_TimedTurn(p)]
    for jobs in by_part.values():
        order += jobs
    return order


def _build_ahead(w: _Worker, job: _BuildAhead, arch: str) -> None:
    """Build one kernel into the shared table; whatever goes wrong is the part's to report (its
    builder call then fails at once with the same verdict, without a second time limit)."""
    w.backend.deadline = time.monotonic() + job.part.timeout_s
    try:
        reply = w.backend.call(job.name, list(job.args), job.kwargs, keep_failure=True)
        if "kernel" in reply:
            build.with_cubin(w.backend.export(int(reply["kernel"]), arch), arch)     # ptxas now, not under the GPU's lock
    except sandbox.SandboxFailure:
        pass


def check_lab(lab: str, submission_path: str | None, seed: int, device: hardware.Device,
              parts: list[str] | None = None, public_only: bool = False,
              progress: Callable[[str], None] = report.print_progress,
              notes: list[str] | None = None, hide: list[str] | None = None,
              workers: int | None = None, unsafe: bool = False) -> list[report.PartResult]:
    """Grade ``parts`` (default: all) of ``lab`` for the notebook at ``submission_path`` (or the
    reference solution). Always returns one PartResult per selected part. ``notes`` receives
    advice and per-cell problems; ``hide`` lists folders covered in the child's view should they
    lie inside an allowed folder (other students' work, the report's folder). Raises sandbox.IsolationUnavailable when the children cannot be
    jailed here, unless ``unsafe`` (``--unsafe-no-sandbox``: every part's report says so).

    Untimed parts (CPU and GPU correctness) and the kernels of GPU parts (built ahead) are spread
    over ``workers`` children (default :func:`default_workers`), each running the cells once. A
    timed part starts once every untimed GPU part has its verdict, while the workers finish the
    rest (the GPU's exclusive lock keeps other kernels off the GPU while it is timed). A GPU part
    that timed out while other parts ran beside it is graded again alone before its verdict is
    final, and the timed parts then wait for it: they run last, after the other children are
    stopped."""
    lab_spec = spec.load(lab)
    sandbox.require_isolation(unsafe)
    if parts:
        unknown = set(parts) - {p.id for p in lab_spec.parts}
        if unknown:
            raise KeyError(f"{lab} has no part(s) {sorted(unknown)}")
    selected = [p for p in lab_spec.parts if not parts or p.id in parts]
    notes = notes if notes is not None else []
    workdir = tempfile.mkdtemp(prefix=f"grader-{lab}-")
    pool: list[_Worker] = []
    harnesses: _Harnesses | None = None
    try:
        try:
            nb = submission.find_notebook(submission_path or os.path.join(SOLUTIONS_DIR, lab), lab_spec.notebook)
            module = submission.write_module(nb, os.path.join(workdir, "module"))
        except submission.SubmissionError as e:
            return [report.PartResult(lab, p.id, p.title, 0.0, p.points, report.ERROR, str(e), p.needs_gpu)
                    for p in selected]
        notes += module.problems + submission.advice(module)
        cpu_s = int(sum(p.timeout_s for p in selected)) + 600

        builds = remote.Builds()

        def new_worker() -> _Worker:
            w = _Worker(module.path, cpu_s, module.relocate, float(lab_spec.raw.get("import_timeout_s", 180)), builds,
                        unsafe, list(hide or []) + [os.path.dirname(os.path.abspath(nb))])
            pool.append(w)
            return w

        results: dict[str, report.PartResult] = {}
        ahead = builds_ahead(lab_spec, selected, seed, device, public_only) if device.present else []
        built = [0]                      # kernels built ahead so far (progress lines)
        done_lock = threading.Lock()

        deferred: list[spec.Part] = []           # timed parts that wait for a part graded again alone

        def grade_part(w: _Worker, part) -> None:
            if isinstance(part, _TimedTurn):
                if gate.wait(part.part.id):
                    grade_part(w, part.part)
                else:
                    deferred.append(part.part)
                return
            ahead_of = isinstance(part, _BuildAhead)
            try:
                with spans.grading(lab, part.part.id if ahead_of else part.id, "build_ahead" if ahead_of else "part"):
                    graded(w, part)
            finally:
                if ahead_of:
                    gate.built(part.part.id)
                else:
                    gate.done(part.id, results.get(part.id))

        def graded(w: _Worker, part) -> None:
            if isinstance(part, _BuildAhead):
                t0 = time.monotonic()
                _build_ahead(w, part, device.track)
                with done_lock:
                    built[0] += 1
                    progress(f"[{lab}] built ahead {built[0]}/{len(ahead)}: {part.name}{part.args}"
                             f" for {part.part.id} ({time.monotonic() - t0:.1f} s)")
                return
            i = selected.index(part) + 1
            head = f"[{lab} {i}/{len(selected)}] {part.id}: {part.title}"
            if part.needs_gpu and not device.present:
                results[part.id] = report.PartResult(lab, part.id, part.title, 0.0, part.points, report.SKIPPED,
                                                     f"skipped: needs a GPU ({device.reason})", True)
                progress(f"{head} ... skipped (no GPU)")
                return
            progress(f"{head} ... running (time limit {part.timeout_s:g} s)")
            start = time.monotonic()
            if part.needs_gpu:
                job = {"lab": lab, "part": part.id, "seed": seed, "public_only": public_only}

                def run_once(job=job, part=part):
                    return harnesses.grade(job, w.backend, part, device.uuid, fresh=True)

                res = harnesses.grade(job, w.backend, part, device.uuid)
                if part.thresholds:
                    res = verdict.perf_trials(res, run_once, " in fresh processes")
            else:
                w.backend.deadline = start + part.timeout_s
                ctx = Context(lab_spec, part, seed, device, public_only=public_only)
                res = verdict.grade_part(remote.RemoteSubmission(w.backend), ctx)
            res.message = verdict.explain(module.relocate(res.message), module, w.backend.cell_errors)
            res.measurements["elapsed_s"] = round(time.monotonic() - start, 3)
            res.measurements.setdefault("sandbox", w.session.level)
            results[part.id] = res
            progress(f"{head} ... {res.verdict} ({res.points:.2f}/{res.max_points:g}) "
                     f"in {res.measurements['elapsed_s']:.1f} s")

        cpu = sorted((p for p in selected if not p.needs_gpu), key=lambda p: -p.timeout_s)
        gpu_untimed = [p for p in selected if p.needs_gpu and not p.thresholds]
        timed = [p for p in selected if p.needs_gpu and p.thresholds]
        queue = pool_order(cpu, gpu_untimed, ahead, timed)
        if ahead:
            progress(f"[{lab}] building {len(ahead)} kernels of the GPU parts ahead, in parallel")
        n = max(1, min(workers or default_workers(), len(queue)))
        gate = _TimedGate([p.id for p in gpu_untimed], regraded=n > 1 and device.present, ahead=ahead)
        harnesses = _Harnesses(max(1, min(n, len(gpu_untimed))), prestart=device.present and bool(gpu_untimed or timed),
                               unsafe=unsafe)
        _in_pool(n, queue, new_worker, grade_part)
        if n > 1 and device.present:
            for p in gpu_untimed:        # a hang beside other kernels may be theirs: grade it again alone
                if results[p.id].verdict == report.ERROR and "timed out" in results[p.id].message:
                    for w in pool[1:]:
                        w.close()
                    harnesses.keep_one()
                    grade_part(pool[0], p)
        for w in pool[1:]:
            w.close()
        harnesses.keep_one()
        main = pool[0] if pool else new_worker()
        for part in [p for p in timed if p in deferred]:
            grade_part(main, part)
        errors = list(dict.fromkeys(c for w in pool for c in w.backend.cell_errors))
        notes += [f"{c.splitlines()[0]}" for c in errors]
        printed = main.session.output().strip()
        if printed and public_only:
            notes.append("your cells printed (first and last lines kept): " + printed[-2000:])
        elif printed:                    # what a function printed while it was called may hold a hidden case
            notes.append(f"your cells printed {len(printed)} characters, not shown when hidden cases are graded "
                         "(what your functions print can carry their inputs): the notebook shows them")
        return [results[p.id] for p in selected]
    finally:
        for w in pool:
            w.close()
        if harnesses is not None:
            harnesses.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _in_pool(n: int, parts: list, new_worker: Callable[[], _Worker], grade_part) -> None:
    """Grade ``parts`` in order on ``n`` workers (threads, each with its own child). A worker
    whose part waits for a profiled run that another holder makes builds kernels ahead meanwhile
    (the next :class:`_BuildAhead` of the queue, with its own child, which the waiting part is not
    using): the wait holds no worker idle."""
    queue = list(parts)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def ahead() -> int | None:
        return next((k for k, p in enumerate(queue) if isinstance(p, _BuildAhead)), None)

    def waiting() -> bool:
        with lock:
            return ahead() is not None

    def meanwhile(w: _Worker) -> Callable[[], None]:
        def work() -> None:
            with lock:
                i = ahead()
                if i is None:
                    return
                job = queue.pop(i)
            deadline = w.backend.deadline            # the waiting part's, restored for it
            try:
                grade_part(w, job)
            except Exception as e:  # noqa: BLE001 - the pool re-raises it, as a failure of the job's own turn
                failures.append(e)
            finally:
                w.backend.deadline = deadline
        return work

    def loop(w: _Worker) -> None:
        with executed.meanwhile(meanwhile(w), waiting):
            while True:
                with lock:
                    if not queue:
                        return
                    p = queue.pop(0)
                try:
                    grade_part(w, p)
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                    failures.append(e)
                    return

    if n == 1:
        if queue:
            loop(new_worker())
        if failures:
            raise failures[0]
        return

    workers = [new_worker() for _ in range(n)]
    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


def device_facts(device: hardware.Device) -> dict:
    facts = {"present": device.present, "name": device.driver_name or None,
             "row": device.spec.name if device.spec else None, "row_note": device.row_note,
             "track": device.track, "reason": device.reason or None}
    if device.present:
        facts["clocks"] = timing.read_clocks()
    return facts


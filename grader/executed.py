"""Which instructions of a launched kernel the GPU executed: mechanisms proved by execution.

A build part's mechanism checks (grader/inspect.py) read instructions. Read from the cubin alone,
an instruction proves nothing about what runs: it may sit in an entry the launch plan never
launches, or in a branch (or under a predicate) that is never taken. So, on a GPU of the part's
architecture, the grader runs the kernel of the lab's correctness run once more, in a trusted
process of its own, under NVIDIA Nsight Compute (``ncu``), whose SourceCounters section counts,
for every SASS instruction of every profiled kernel, how many warp instructions were issued and
on how many threads the guard predicate was true. The mechanism checks then read a listing of
the executed instructions only: an instruction counts when at least one thread executed it with
its predicate true. The same run checks the kernel's output against the reference, so the
evidence comes from a run that did the work.

What runs where:

- The profiled process is started with ``python -I`` and the grader's own module path
  (sandbox.trusted_command); it loads the grader's own cubin of the child's PTX through the CUDA
  driver (grader/launch.py: device code only, the validated launch plan), on inputs it makes
  itself. No byte of the student's runs on the CPU there.
- ``ncu`` collects counters only between the profiled process's cudaProfilerStart and
  cudaProfilerStop, which bracket the submitted kernel's launches (``--profile-from-start off``),
  and only for the kernels the plan launches (``--kernel-name``), each launch once: no kernel of
  torch's (the inputs, the reference) is ever read as the submission's, whatever its name.
- Build parts that ask at about the same time share one run of ncu (:class:`Batcher`): one start
  of ncu and of a Python process with torch for all their kernels, whichever grading process
  (each lab of ``check all`` has its own) asked. The launches are read back in order, each
  against its own plan's kernel names.
- A kernel that fails in the profiled run (it does not load, faults, or does not finish) is not a
  machine that cannot profile: nothing shows its mechanisms executing, so its build part scores
  nothing (``Executed.failed``); the kernels after it are profiled again in a new process (the
  failed one took the CUDA context with it).
- Counters need permission: root, or ``NVreg_RestrictProfilingToAdminUsers=0`` for the
  ``nvidia`` kernel module (in a container, also the capability the runtime gives for profiling,
  e.g. ``--cap-add SYS_ADMIN``). Where ``ncu`` is missing or the driver refuses the counters, the
  part is checked statically (launched entries only) and its report says why.

Cost, measured on an H200 (16 host cores): the profiled run takes 4-6 s more than the same run
without ``ncu`` (its start, the instrumented replay of a small kernel).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

from . import spans

NCU_SECTION = ["--section", "SourceCounters", "--page", "source", "--print-source", "sass", "--csv"]
REFUSED = ("ERR_NVGPUCTRPERM", "does not have permission", "Profiling is not supported")
EXECUTED_COLUMN = "Predicated-On Thread Instructions Executed"
ISSUED_COLUMN = "Instructions Executed"
PROFILE_TIMEOUT_S = 240
PROFILE_ATTEMPTS = 3
# The driver lets one profiling session collect counters at a time; another at once fails with this.
BUSY = "a driver resource was unavailable"
REFUSED_WHY = ("the GPU driver refused its performance counters (they need root, or the "
               "nvidia module option NVreg_RestrictProfilingToAdminUsers=0)")


@dataclasses.dataclass
class Executed:
    """The outcome of one profiled run: ``sass`` is a listing in cuobjdump's form holding only the
    instructions that executed (None when the counters could not be read, with ``why``)."""
    sass: str | None
    why: str = ""
    correct: bool | None = None
    message: str = ""
    instructions: int = 0          # instructions of the launched kernels in the listing
    executed: int = 0              # of those, executed on at least one thread
    seconds: float = 0.0           # of the ncu run that profiled it
    failed: bool = False           # the kernel itself failed in the profiled run (why says how)
    batch: int = 1                 # kernels profiled in that run

    @property
    def evidence(self) -> str:
        if self.failed:
            return f"not shown to execute: the kernel failed in the profiled correctness run ({self.why})"
        if self.sass is None:
            return f"static (launched entries only; dead code not excluded): {self.why}"
        return (f"executed (hardware counters: {self.executed} of {self.instructions} instructions of the "
                "launched kernel ran in the correctness run)")


def ncu_path() -> str | None:
    """Nsight Compute's command line, from PATH or the CUDA toolkit."""
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", "ncu")):
            return os.path.join(root, "bin", "ncu")
    return None


# ---------------------------------------------------------------- reading ncu's source page

def parse_source_blocks(text: str) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """ncu's ``--page source --print-source sass --csv`` output: one block per profiled launch, in
    the order of the launches, as (kernel name, its instructions in order as (SASS, warp
    instructions issued, thread instructions executed with the predicate on))."""
    blocks: list[tuple[str, list[tuple[str, int, int]]]] = []
    header: dict[str, int] | None = None
    for row in csv.reader(line for line in text.splitlines() if line.startswith('"')):
        if not row:
            continue
        if row[0] == "Kernel Name" and len(row) > 1:
            blocks.append((row[1], []))
            header = None
        elif row[0] == "Address" and blocks:
            header = {col: i for i, col in enumerate(row)}
            if EXECUTED_COLUMN not in header or "Source" not in header:
                raise ValueError(f"ncu's source page lacks the column {EXECUTED_COLUMN!r}")
        elif header is not None and len(row) >= len(header):
            issued = _count(row[header.get(ISSUED_COLUMN, header[EXECUTED_COLUMN])])
            blocks[-1][1].append((row[header["Source"]].strip(), issued, _count(row[header[EXECUTED_COLUMN]])))
    return blocks


def merge_launches(blocks) -> dict[str, list[tuple[str, int, int]]]:
    """Per kernel name, its instructions with the counts of all its launches added up."""
    kernels: dict[str, list[tuple[str, int, int]]] = {}
    for name, rows in blocks:
        seen = kernels.get(name)
        if seen is None or [r[0] for r in seen] != [r[0] for r in rows]:
            kernels[name] = rows if seen is None else seen
            continue
        kernels[name] = [(a[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(seen, rows)]
    return kernels


def parse_source_page(text: str) -> dict[str, list[tuple[str, int, int]]]:
    """The source page read per kernel name (the counts of a kernel launched more than once added up)."""
    return merge_launches(parse_source_blocks(text))


def _count(cell: str) -> int:
    cell = cell.replace(",", "").strip()
    try:
        return int(float(cell))
    except ValueError:
        return 0


def executed_listing(kernels: dict[str, list[tuple[str, int, int]]]) -> tuple[str, int, int]:
    """(listing, instructions, executed): the instructions that executed on at least one thread
    with their predicate true, in cuobjdump's form (a ``Function :`` line per kernel, one
    ``/*offset*/ instruction ;`` line per instruction), so that the checks of grader/inspect.py
    read it as they read a disassembly."""
    lines, total, ran = [], 0, 0
    for name, rows in kernels.items():
        lines.append(f"\t\tFunction : {name}")
        for i, (sass, _, on) in enumerate(rows):
            total += 1
            if on > 0:
                ran += 1
                lines.append(f"        /*{i * 16:04x}*/                   {sass.rstrip(' ;')} ;")
    return "\n".join(lines) + "\n", total, ran


# ---------------------------------------------------------------- the profiled run

@dataclasses.dataclass
class Job:
    """One kernel to profile: its launch plan, the grader's cubin of its PTX, and the inputs to run
    it on (lab, part, problem, shape, seed, case)."""
    plan: dict
    cubin: bytes
    ptx: str
    inputs: dict
    gpu: str = ""           # the UUID of the GPU whose grading lock the run shares while it runs


def profile(plan: dict, cubin: bytes, ptx: str, job: dict, timeout: float = PROFILE_TIMEOUT_S) -> Executed:
    """Run the kernel of ``plan`` once on the inputs ``job`` names, under ncu, in a trusted process;
    return what executed and whether the output was right. Never raises for a machine that cannot
    profile: the reason is in ``why``."""
    return profile_many([Job(plan, cubin, ptx, job)], timeout)[0]


def profile_many(jobs: list[Job], timeout: float = PROFILE_TIMEOUT_S) -> list[Executed]:
    """Profile ``jobs`` in as few runs of ncu as possible (one, unless a kernel fails: the context
    is lost with it, and the jobs after it run again in a new process). Each run pays ncu's start
    and the start of a Python process with torch once, whatever the number of kernels."""
    ncu = ncu_path()
    if ncu is None:
        why = "Nsight Compute (ncu) is not installed here, so executed instructions cannot be counted"
        return [Executed(None, why) for _ in jobs]
    out: list[Executed] = []
    while len(out) < len(jobs):
        out += _one_run(ncu, jobs[len(out):], timeout)
    # A run that showed nothing of a kernel through no fault of the kernel's (the process wrote no
    # outcome, ncu's page lacked its launch) is the machine's hiccup, seen now and then when labs
    # are graded side by side: the kernel is profiled once more, alone, before its part falls back
    # to the static reading. A refusal of the counters would only be refused again.
    for i, (job, first) in enumerate(zip(jobs, out)):
        if first.sass is None and not first.failed and REFUSED_WHY not in first.why:
            again = _one_run(ncu, [job], timeout)[0]
            if again.sass is None and not again.failed:
                again.why = f"{first.why}; profiled again alone: {again.why}"
            out[i] = again
    return out


def _one_run(ncu: str, jobs: list[Job], timeout: float) -> list[Executed]:
    """One ncu process over ``jobs`` in order. Returns the outcomes of a prefix of them (at least
    one): all of them, or up to and including a kernel that failed (the jobs after it are run
    again by the caller)."""
    from . import sandbox
    d = tempfile.mkdtemp(prefix="executed-", dir=sandbox.private_dir())
    t0 = time.monotonic()
    limit = timeout + 30.0 * (len(jobs) - 1)
    try:
        for i, job in enumerate(jobs):
            with open(os.path.join(d, f"kernel-{i}.cubin"), "wb") as f:
                f.write(job.cubin)
            with open(os.path.join(d, f"kernel-{i}.ptx"), "w") as f:
                f.write(job.ptx)
        with open(os.path.join(d, "jobs.json"), "w") as f:
            json.dump([{**job.inputs, "plan": job.plan, "gpu_lock": gpu_lock_path(job.gpu)} for job in jobs], f)
        names = sorted({ln["name"] for job in jobs for ln in job.plan["launches"]})
        launches = sum(len(job.plan["launches"]) for job in jobs)
        regex = "regex:^(" + "|".join(_re_escape(n) for n in names) + ")$"
        # Counters are collected between the profiled process's cudaProfilerStart and Stop only,
        # which bracket the submitted kernel's launches: no kernel of torch's (inputs, reference)
        # is ever profiled, whatever name the submission gives its kernel.
        cmd = [ncu, *NCU_SECTION, "--profile-from-start", "off", "--kernel-name", regex,
               "--launch-count", str(launches), *sandbox.trusted_command("profiled", d)]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                                                               "CUDA_PATH", "CUDA_HOME", "HOME", "TMPDIR")}
        env["TMPDIR"] = d
        timed_out = False
        for attempt in range(PROFILE_ATTEMPTS):
            try:
                with _one_profiler():
                    with spans.span("ncu", kernels=len(jobs)):
                        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=d, env=env)
                out, stdout, code = proc.stdout + "\n" + proc.stderr, proc.stdout, proc.returncode
            except subprocess.TimeoutExpired as e:
                stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                out, code, timed_out = stdout, None, True
                break
            if BUSY not in out:
                break
            time.sleep(1.0 + attempt)
        if any(r in out for r in REFUSED):
            return [Executed(None, REFUSED_WHY) for _ in jobs]
        results = _results(d)
        hang = f"the kernel did not finish in the profiled run ({limit:g} s under the profiler): does it hang?"
        if timed_out and results and results[-1].get("ended"):
            results[-1]["message"] = hang
        elif timed_out and len(results) < len(jobs):
            # the kernel after the last one reported did not finish: that is the kernel's doing
            results.append({"failed": True, "message": hang})
        if not results:
            tail = "\n".join(out.strip().splitlines()[-8:])
            why = f"the profiled run failed (exit {code}): {tail[-1500:]}"
            return [Executed(None, why) for _ in jobs]
        try:
            blocks = parse_source_blocks(stdout)
        except ValueError as e:
            k = next((i for i, r in enumerate(results) if r.get("failed")), None)
            if k is None:
                return [Executed(None, str(e)) for _ in jobs]
            # A kernel that ended the run can leave its page cut off (a trap does): it failed all
            # the same, and the kernels before it are profiled again in a run of their own.
            failed = Executed(None, str(results[k].get("message", ""))[:1500], correct=False, failed=True)
            return (profile_many(jobs[:k], timeout) if k else []) + [failed]
        done: list[Executed] = []
        for job, result in zip(jobs, results):
            if result.get("failed"):        # the kernel could not run: nothing shows its mechanisms executing
                done.append(Executed(None, str(result.get("message", ""))[:1500], correct=False, failed=True))
                break
            if result.get("infrastructure"):      # the grader's own failure: this kernel is checked statically
                done.append(Executed(None, f"the profiled run failed: {str(result.get('message', ''))[:1500]}"))
                break
            wanted = [ln["name"] for ln in job.plan["launches"]]
            mine, blocks = blocks[:len(wanted)], blocks[len(wanted):]
            if [name for name, _ in mine] != wanted:
                got = ", ".join(name for name, _ in mine) or "nothing"
                done.append(Executed(None, f"ncu reported {got} where the plan launches {', '.join(wanted)}"))
                continue
            listing, total, ran = executed_listing(merge_launches(mine))
            done.append(Executed(listing, correct=bool(result.get("ok")), message=str(result.get("message", "")),
                                 instructions=total, executed=ran))
        seconds = round(time.monotonic() - t0, 2)
        for e in done:
            e.seconds, e.batch = seconds, len(jobs)
        if not done:
            return [Executed(None, "the profiled run reported nothing") for _ in jobs]
        return done
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _results(d: str) -> list[dict]:
    """The profiled process's outcomes, one JSON line per job, in order (written as each finishes).
    A kernel marked as launching with no outcome after the mark ended the run: it failed."""
    try:
        with open(os.path.join(d, "results.jsonl")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out, launching = [], None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if isinstance(rec, dict) and "launching" in rec:
            launching = rec
            continue
        launching = None
        out.append(rec)
    if lines and launching is not None:     # the process ended while the kernel loaded or ran: the kernel's doing
        out.append({"failed": True, "ended": True, "message": "the kernel ended the profiled run (a trap, a fault or an error "
                                               "while it loaded or ran: the process was stopped before it could "
                                               "report)"})
    return out


class Batcher:
    """One queue of profiled runs for the machine (for each GPU), shared by every grading process
    and thread: a request is a file in the grader's private folder, and whoever next holds the
    queue's lock runs every request waiting by then (its own and those of other labs' processes)
    in one run of ncu, and writes each request's outcome back beside it. So a request made while a
    run is under way, in this process or another, joins the next run; nothing waits for a request
    that has not been made. A request whose run died with its holder is run again by the next
    holder (nobody else can be running it: running needs the lock); one whose asker has died is
    dropped.
    Requests and outcomes are JSON (a cubin as base64), written by the grader's processes only.
    While a thread waits for a run that another holder makes, it does the other work its grading
    pool hands it (:func:`meanwhile`) between polls, so that a wait holds no grading worker idle."""

    POLL_S = 0.05

    def __init__(self, root: str | None = None) -> None:
        self._root = root

    def _folder(self, job: Job) -> str:
        from . import sandbox
        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        key = "".join(c for c in f"{job.gpu}-{devices}" if c.isalnum() or c in "-_,") or "0"
        d = os.path.join(self._root or sandbox.private_dir(), f"profiler-queue-{key}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        return d

    def profile(self, job: Job) -> Executed:
        import fcntl
        d = self._folder(job)
        rid = f"{time.time_ns():020d}-{os.getpid()}-{threading.get_ident()}"
        _write_json(os.path.join(d, rid + ".job"), _job_record(job))
        answer = os.path.join(d, rid + ".result")
        fd = os.open(os.path.join(d, "queue.lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            while True:
                locked = False
                while not os.path.exists(answer) and not locked:
                    with spans.span("profiler_wait"):       # idle: the work done meanwhile has its own spans
                        while not os.path.exists(answer) and not locked:
                            try:
                                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                                locked = True
                            except BlockingIOError:
                                if _work_waiting():
                                    break
                                time.sleep(self.POLL_S)
                    if not locked and not os.path.exists(answer):
                        _other_work()
                try:
                    if os.path.exists(answer):
                        return _take_result(answer)
                    self._drain(d)
                finally:
                    if locked:
                        fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _drain(self, d: str) -> None:
        """Run every request waiting in ``d`` without an outcome (those made since the last run, and
        any whose run ended with its holder) in one batch; the caller holds the queue's lock."""
        names = sorted(n[:-len(".job")] for n in os.listdir(d) if n.endswith(".job"))
        claimed = []
        for rid in names:
            path = os.path.join(d, rid + ".job")
            if not _alive(int(rid.split("-")[1])):       # its process is gone: nobody waits for it
                for leftover in (path, os.path.join(d, rid + ".result")):
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
                continue
            if os.path.exists(os.path.join(d, rid + ".result")):
                continue
            try:
                with open(path) as f:
                    claimed.append((rid, _job_from(json.load(f))))
            except FileNotFoundError:       # its asker took its outcome since the listing: nothing to run
                continue
            except (OSError, ValueError, KeyError) as e:
                _write_json(os.path.join(d, rid + ".result"),
                            dataclasses.asdict(Executed(None, f"the profiled run's request was unreadable: {e}")))
        if not claimed:
            return
        try:
            results = profile_many([j for _, j in claimed])
        except BaseException as e:  # noqa: BLE001 - every waiting part gets the reason
            results = [Executed(None, f"the profiled run failed: {type(e).__name__}: {e}") for _ in claimed]
        for (rid, _), r in zip(claimed, results):
            _write_json(os.path.join(d, rid + ".result"), dataclasses.asdict(r))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _job_record(job: Job) -> dict:
    import base64
    return {"plan": job.plan, "cubin": base64.b64encode(job.cubin).decode(), "ptx": job.ptx,
            "inputs": job.inputs, "gpu": job.gpu}


def _job_from(rec: dict) -> Job:
    import base64
    return Job(rec["plan"], base64.b64decode(rec["cubin"]), rec["ptx"], rec["inputs"], rec["gpu"])


def _write_json(path: str, obj) -> None:
    """Write ``obj`` to ``path`` at once: a reader sees the whole file or none."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _take_result(path: str) -> Executed:
    with open(path) as f:
        rec = json.load(f)
    # the request goes first: a holder listing the folder meanwhile never finds a request that
    # lacks its outcome only because the outcome was just taken (it would run it again)
    for suffix in (".job", ".result"):
        with contextlib.suppress(OSError):
            os.unlink(path[:-len(".result")] + suffix)
    return Executed(**rec)


BATCHER = Batcher()

_idle = threading.local()       # what this thread does while it waits for someone else's profiled run


@contextlib.contextmanager
def meanwhile(work, waiting):
    """While the block runs, a wait of this thread for a profiled run that another holder makes
    calls ``work()`` whenever ``waiting()`` says there is other work: ``work`` does one short piece
    of it (or nothing, if another thread took it first). Work never runs inside work."""
    old = getattr(_idle, "hooks", None)
    _idle.hooks = (work, waiting)
    try:
        yield
    finally:
        _idle.hooks = old


def _work_waiting() -> bool:
    hooks = getattr(_idle, "hooks", None)
    return bool(hooks and hooks[1]())


def _other_work() -> None:
    hooks = getattr(_idle, "hooks", None)
    if hooks is None:
        return
    _idle.hooks = None
    try:
        hooks[0]()
    finally:
        _idle.hooks = hooks


@contextlib.contextmanager
def _one_profiler():
    """One profiled run at a time on this machine (labs graded side by side would otherwise start
    their profilers at once, and the driver refuses all but one). The GPU's grading lock is not
    held here: the profiled process takes it, shared, around its own work on the GPU (inputs,
    reference, the kernel, the check), not while Python, torch and ncu start, so a timed part of
    another lab waits only for that work."""
    import fcntl
    from . import sandbox
    fd = os.open(os.path.join(sandbox.private_dir(), "profiler.lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        with spans.span("profiler_wait"):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _re_escape(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in name)


GPU_LOCK = "gpu-{}.lock"          # the grading lock of one GPU (its UUID), in the grader's private folder


def gpu_lock_path(uuid: str) -> str:
    """The file of the GPU's grading lock, in the grader's private folder."""
    from . import sandbox
    return os.path.join(sandbox.private_dir(), GPU_LOCK.format("".join(c for c in uuid if c.isalnum() or c == "-") or "0"))


def gpu_lock(uuid: str, exclusive: bool, path: str | None = None) -> int:
    """Take the GPU's grading lock (shared by correctness runs, exclusive for timed runs) and
    return its file descriptor; closing it releases the lock."""
    import fcntl
    fd = os.open(path or gpu_lock_path(uuid), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    return fd

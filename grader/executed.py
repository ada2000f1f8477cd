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
- ``ncu`` profiles only the kernels the plan launches (``--kernel-name``), each launch once.
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
import time

NCU_SECTION = ["--section", "SourceCounters", "--page", "source", "--print-source", "sass", "--csv"]
REFUSED = ("ERR_NVGPUCTRPERM", "does not have permission", "Profiling is not supported")
EXECUTED_COLUMN = "Predicated-On Thread Instructions Executed"
ISSUED_COLUMN = "Instructions Executed"
PROFILE_TIMEOUT_S = 240
PROFILE_ATTEMPTS = 3
# The driver lets one profiling session collect counters at a time; another at once fails with this.
BUSY = "a driver resource was unavailable"


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
    seconds: float = 0.0

    @property
    def evidence(self) -> str:
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

def parse_source_page(text: str) -> dict[str, list[tuple[str, int, int]]]:
    """ncu's ``--page source --print-source sass --csv`` output: for each profiled kernel (by name;
    the counts of a kernel launched more than once are added up), its instructions in order as
    (SASS, warp instructions issued, thread instructions executed with the predicate on)."""
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
    kernels: dict[str, list[tuple[str, int, int]]] = {}
    for name, rows in blocks:
        seen = kernels.get(name)
        if seen is None or [r[0] for r in seen] != [r[0] for r in rows]:
            kernels[name] = rows if seen is None else seen
            continue
        kernels[name] = [(a[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(seen, rows)]
    return kernels


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

def profile(plan: dict, cubin: bytes, ptx: str, job: dict, timeout: float = PROFILE_TIMEOUT_S) -> Executed:
    """Run the kernel of ``plan`` once on the inputs ``job`` names (lab, part, problem, shape,
    seed, case), under ncu, in a trusted process; return what executed and whether the output
    was right. Never raises for a machine that cannot profile: the reason is in ``why``."""
    from . import sandbox
    ncu = ncu_path()
    if ncu is None:
        return Executed(None, "Nsight Compute (ncu) is not installed here, so executed instructions cannot be counted")
    names = sorted({ln["name"] for ln in plan["launches"]})
    d = tempfile.mkdtemp(prefix="executed-", dir=sandbox.private_dir())
    t0 = time.monotonic()
    try:
        with open(os.path.join(d, "kernel.cubin"), "wb") as f:
            f.write(cubin)
        with open(os.path.join(d, "kernel.ptx"), "w") as f:
            f.write(ptx)
        with open(os.path.join(d, "job.json"), "w") as f:
            json.dump({**job, "plan": plan}, f)
        regex = "regex:^(" + "|".join(_re_escape(n) for n in names) + ")$"
        cmd = [ncu, *NCU_SECTION, "--kernel-name", regex, "--launch-count", str(len(plan["launches"])),
               *sandbox.trusted_command("profiled", d)]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                                                               "CUDA_PATH", "CUDA_HOME", "HOME", "TMPDIR")}
        env["TMPDIR"] = d
        for attempt in range(PROFILE_ATTEMPTS):
            try:
                with _one_profiler():
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=d, env=env)
            except subprocess.TimeoutExpired:
                return Executed(None, f"the profiled run did not finish in {timeout:g} s")
            out = proc.stdout + "\n" + proc.stderr
            if BUSY not in out:
                break
            time.sleep(1.0 + attempt)
        if any(r in out for r in REFUSED):
            return Executed(None, "the GPU driver refused its performance counters (they need root, or the "
                            "nvidia module option NVreg_RestrictProfilingToAdminUsers=0)")
        try:
            with open(os.path.join(d, "result.json")) as f:
                result = json.load(f)
        except (OSError, ValueError):
            tail = "\n".join(out.strip().splitlines()[-8:])
            return Executed(None, f"the profiled run failed (exit {proc.returncode}): {tail[-1500:]}")
        try:
            kernels = parse_source_page(proc.stdout)
        except ValueError as e:
            return Executed(None, str(e))
        missing = [n for n in names if n not in kernels]
        if missing:
            return Executed(None, f"ncu reported no counters for {', '.join(missing)}")
        listing, total, ran = executed_listing({n: kernels[n] for n in names})
        return Executed(listing, correct=bool(result.get("ok")), message=str(result.get("message", "")),
                        instructions=total, executed=ran, seconds=round(time.monotonic() - t0, 2))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def _one_profiler():
    """One profiled run at a time on this machine (labs graded side by side would otherwise start
    their profilers at once, and the driver refuses all but one)."""
    import fcntl
    from . import sandbox
    fd = os.open(os.path.join(sandbox.private_dir(), "profiler.lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _re_escape(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in name)


GPU_LOCK = "gpu-{}.lock"          # the grading lock of one GPU (its UUID), in the grader's private folder


def gpu_lock(uuid: str, exclusive: bool) -> int:
    """Take the GPU's grading lock (shared by correctness runs, exclusive for timed runs) and
    return its file descriptor; closing it releases the lock."""
    import fcntl
    from . import sandbox
    name = GPU_LOCK.format("".join(c for c in uuid if c.isalnum() or c == "-") or "0")
    fd = os.open(os.path.join(sandbox.private_dir(), name), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    return fd

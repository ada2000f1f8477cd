"""Grading a whole class on one host: ``python -m grader batch LAB SUBMISSIONS_DIR --out RESULTS_DIR``.

Submissions are found in nbgrader's layout (``submitted/<student>/<lab>/<notebook>``; the
folder given may be the course root holding ``submitted/``) and as a flat folder of
``<student>.ipynb`` files. Each submission is graded by the grader's own CLI in a subprocess
(``python -m grader check LAB --submission NB --json ... --gradescope ...``), so a batch
grades exactly what ``check`` grades.

Workers: one per visible GPU (``CUDA_VISIBLE_DEVICES`` pinned to that GPU in the worker's
process); where there is a GPU, a submission's CPU parts run as a separate piece on CPU
workers (``CUDA_VISIBLE_DEVICES=""``), spread over the remaining cores, and the two pieces'
reports are merged. Without a GPU, as many CPU workers as cores (bounded by memory).

Results, per student, under ``RESULTS_DIR/<lab>/<student>/``, written as each finishes:

- ``report.json``   the grader's report (schema in grader/report.py), merged over pieces
- ``results.json``  Gradescope's results.json
- ``status.json``   written last: state, the fingerprint that decides ``--resume``, timings
- ``<piece>.report.json``, ``<piece>.results.json``, ``<piece>.log``, ``<piece>.status.json``
  for each piece the submission was graded in (``all``, or ``cpu`` and ``gpu``)

``--resume`` skips a student (or one piece) whose status says done with the same
fingerprint: the SHA-256 of the notebook, the lab's ``thresholds_version``, the parts
selected, ``--public``, whether GPU parts were graded on a GPU, and the seed's fingerprint
(the one reports carry: "public", or "secret (fingerprint ...)" of ``GRADER_SECRET_SEED`` under
the course key). Anything else (never graded, crashed, timed out, changed) is graded again.
A ``--resume`` whose seed differs from the one the results on disk were graded with stops
before grading anything (:func:`resume_seed_problem`): regrading part of a class with other
inputs would mix two sets of hidden cases, or put public results over secret ones. Interrupting
a batch (Ctrl-C, SIGTERM) kills the running graders and loses nothing that had finished.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterable

from .. import report, sandbox, spec

REPO_ROOT = sandbox.REPO_ROOT
STARTUP_S = 180.0          # added to the parts' timeouts: interpreter, torch and TVM imports
GIB = 1 << 30
MEM_PER_WORKER = 2 * GIB   # a grader process with torch and TVM loaded, and its part worker

DONE = "done"              # the CLI wrote a valid report
CRASHED = "crashed"        # the CLI exited without one
TIMEOUT = "timeout"        # the CLI ran past the pieces' time limit and was killed
INCOMPLETE = "incomplete"  # student level: some piece did not finish (a low score is still DONE)
INFRASTRUCTURE = "infrastructure"  # a report with the grading machine's failure in it (report.INFRASTRUCTURE
                                   # verdicts): kept, counted apart, graded again by --resume


# ------------------------------------------------------------------ discovery

@dataclasses.dataclass(frozen=True)
class Submission:
    student: str
    lab: str
    path: str        # the notebook, or the folder that should have held it

    def digest(self) -> str:
        if not os.path.isfile(self.path):
            return "missing:" + hashlib.sha256(self.path.encode()).hexdigest()[:16]
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def mtime(self) -> float | None:
        try:
            return os.path.getmtime(self.path)
        except OSError:
            return None


def _valid_student(name: str) -> bool:
    return bool(name) and not name.startswith((".", "_")) and os.sep not in name


def _notebook_in(folder: str, notebook: str) -> str:
    """The lab's notebook in a folder; else its only notebook; else the folder (the grader then
    reports that it holds no notebook)."""
    candidate = os.path.join(folder, notebook)
    if os.path.isfile(candidate):
        return candidate
    found = sorted(f for f in os.listdir(folder) if f.endswith(".ipynb") and not f.startswith("."))
    return os.path.join(folder, found[0]) if len(found) == 1 else folder


def discover(lab: str, root: str) -> list[Submission]:
    """Every submission of ``lab`` under ``root``: nbgrader's ``<student>/<lab>/`` folders (under
    ``root/submitted`` when that exists), ``<student>/<notebook>`` folders, and ``<student>.ipynb``
    files. A student found both ways is taken from the nbgrader folder."""
    notebook = spec.load(lab).notebook
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no such folder: {root}")
    base = os.path.join(root, "submitted") if os.path.isdir(os.path.join(root, "submitted")) else root
    found: dict[str, Submission] = {}
    flat: dict[str, Submission] = {}
    for entry in sorted(os.listdir(base)):
        path = os.path.join(base, entry)
        if os.path.isdir(path) and _valid_student(entry):
            if os.path.isdir(os.path.join(path, lab)):
                found[entry] = Submission(entry, lab, os.path.abspath(_notebook_in(os.path.join(path, lab), notebook)))
            elif os.path.isfile(os.path.join(path, notebook)):
                found[entry] = Submission(entry, lab, os.path.abspath(os.path.join(path, notebook)))
        elif entry.endswith(".ipynb") and os.path.isfile(path) and _valid_student(entry[:-6]):
            flat[entry[:-6]] = Submission(entry[:-6], lab, os.path.abspath(path))
    for student, sub in flat.items():
        found.setdefault(student, sub)
    return [found[s] for s in sorted(found)]


# ------------------------------------------------------------------ plan: pieces and fingerprints

@dataclasses.dataclass(frozen=True)
class Piece:
    name: str                 # "all", "cpu" or "gpu"
    parts: tuple[str, ...]
    needs_gpu: bool           # holds GPU parts that will be graded on a GPU
    timeout_s: float


@dataclasses.dataclass
class Options:
    lab: str
    results_dir: str
    parts: list[str] | None = None
    public: bool = False
    gpu: bool = False         # GPU parts are graded on a GPU (a GPU worker or a Slurm GPU task)
    split: bool = False       # CPU parts as a piece of their own on CPU workers
    hide: tuple = ()          # folders of the class's submissions: no submission's code sees them

    @property
    def lab_dir(self) -> str:
        return os.path.join(self.results_dir, self.lab)


def selected_parts(lab: str, parts: list[str] | None) -> list[spec.Part]:
    lab_spec = spec.load(lab)
    if parts:
        unknown = sorted(set(parts) - {p.id for p in lab_spec.parts})
        if unknown:
            raise KeyError(f"{lab} has no part(s) {unknown}; parts: {', '.join(p.id for p in lab_spec.parts)}")
    return [p for p in lab_spec.parts if not parts or p.id in parts]


def pieces(opts: Options) -> list[Piece]:
    sel = selected_parts(opts.lab, opts.parts)

    def piece(name: str, ps: list[spec.Part]) -> Piece:
        return Piece(name, tuple(p.id for p in ps), opts.gpu and any(p.needs_gpu for p in ps),
                     STARTUP_S + sum(p.timeout_s for p in ps))
    cpu = [p for p in sel if not p.needs_gpu]
    gpu = [p for p in sel if p.needs_gpu]
    if opts.split and opts.gpu and cpu and gpu:
        return [piece("cpu", cpu), piece("gpu", gpu)]
    return [piece("all", sel)]


SECRET_ENV = "GRADER_SECRET_SEED"
PUBLIC_SEED_WARNING = ("grading with the PUBLIC seed: hidden cases are ones students can reproduce; "
                       f"set {SECRET_ENV}")


def seed_fingerprint() -> str:
    """The seed the graders of this batch will use, as reports name it: "public", or "secret
    (fingerprint ...)" of GRADER_SECRET_SEED under the course key (never the secret itself)."""
    from .. import inputs      # imports torch: only when a batch runs, not for `--help`
    return inputs.seed_label(inputs.seed_of(os.environ.get(SECRET_ENV)))


def recorded_seeds(lab_dir: str) -> dict[str, list[str]]:
    """{seed fingerprint: students} of every result under ``lab_dir`` (students' and pieces'
    status files)."""
    found: dict[str, list[str]] = {}
    for student in sorted(os.listdir(lab_dir)) if os.path.isdir(lab_dir) else []:
        d = os.path.join(lab_dir, student)
        if not _valid_student(student) or not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith("status.json"):
                fp = (read_json(os.path.join(d, name)) or {}).get("fingerprint")
                if isinstance(fp, dict) and "seed" in fp:
                    names = found.setdefault(str(fp["seed"]), [])
                    if student not in names:
                        names.append(student)
    return found


def resume_seed_problem(results_dir: str, lab: str) -> str | None:
    """Why ``--resume`` must stop before grading anything, or None: the results on disk were
    graded with another seed than this run's (say the secret one, and this run has none)."""
    lab_dir = os.path.join(results_dir, lab)
    current = seed_fingerprint()
    other = {seed: students for seed, students in recorded_seeds(lab_dir).items() if seed != current}
    if not other:
        return None
    before = "; ".join(f"{seed} ({len(students)} student(s), e.g. {students[0]})" for seed, students in other.items())
    unset = f" ({SECRET_ENV} is not set)" if current == "public" else ""
    return (f"--resume: the results in {lab_dir} were graded with the seed {before}, and this run's seed is "
            f"{current}{unset}. Resuming would grade the rest of the class with other inputs and hidden cases. "
            f"Set {SECRET_ENV} to the secret of the run being resumed (with the same course key, "
            f"GRADER_SEED_KEY_FILE), or run without --resume to grade every submission again with this seed.")


def fingerprint(sub: Submission, opts: Options, parts: Iterable[str], needs_gpu: bool,
                digest: str | None = None) -> dict[str, Any]:
    """What a result depends on; ``--resume`` regrades when any of it differs."""
    return {"notebook_sha256": digest or sub.digest(),
            "thresholds_version": spec.load(opts.lab).thresholds_version,
            "parts": list(parts), "public": opts.public, "gpu": needs_gpu, "seed": seed_fingerprint()}


def full_fingerprint(sub: Submission, opts: Options, digest: str | None = None) -> dict[str, Any]:
    ps = pieces(opts)
    parts = [p for pc in ps for p in pc.parts]
    order = [p.id for p in selected_parts(opts.lab, opts.parts)]
    return fingerprint(sub, opts, sorted(parts, key=order.index), any(pc.needs_gpu for pc in ps), digest)


# ------------------------------------------------------------------ files

def student_dir(opts: Options, student: str) -> str:
    return os.path.join(opts.lab_dir, student)


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: Any) -> None:
    """Atomically (a file that exists is complete)."""
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def load_report(path: str) -> dict[str, Any] | None:
    try:
        return report.load_json(path)
    except (OSError, ValueError, TypeError):
        return None


def is_done(status: dict | None, fp: dict) -> bool:
    return bool(status) and status.get("state") == DONE and status.get("fingerprint") == fp


def _machine_failures(rep: dict[str, Any]) -> list[str]:
    """The parts of a report the grading machine failed to grade (the infrastructure verdict)."""
    return [r["part"] for r in rep.get("results", []) if r.get("verdict") == INFRASTRUCTURE]


# ------------------------------------------------------------------ grading one piece

_running: dict[int, subprocess.Popen] = {}
_running_lock = threading.Lock()


def _log_tail(path: str, n: int = 12) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-n:])
    except OSError:
        return ""


def grade_piece(sub: Submission, opts: Options, piece: Piece, env_extra: dict[str, str] | None = None,
                stop: threading.Event | None = None, digest: str | None = None) -> dict[str, Any] | None:
    """Run the grader's CLI on one piece of one submission and write ``<piece>.status.json``.
    Returns the status, or None when the batch was interrupted (nothing is written then)."""
    d = student_dir(opts, sub.student)
    os.makedirs(d, exist_ok=True)
    rep, gs, log = (os.path.join(d, f"{piece.name}.{x}") for x in ("report.json", "results.json", "log"))
    status_path = os.path.join(d, f"{piece.name}.status.json")
    for p in (status_path, rep, gs):
        if os.path.exists(p):
            os.remove(p)
    fp = fingerprint(sub, opts, piece.parts, piece.needs_gpu, digest)
    cmd = sandbox.trusted_command("cli", "check", opts.lab, "--submission", sub.path, "--json", rep,
                                  "--gradescope", gs)      # python -I: nothing imported from the working folder
    for folder in (*opts.hide, opts.results_dir):     # other students' notebooks and results
        cmd += ["--hide", os.path.abspath(folder)]
    for p in piece.parts:
        cmd += ["--part", p]
    if opts.public:
        cmd.append("--public")
    if not piece.needs_gpu:
        cmd += ["--workers", "1"]        # CPU pieces already run one per core
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    started = time.time()
    state, detail, rc = DONE, "", None
    with open(log, "w") as logf:
        logf.write(f"# {' '.join(cmd)}\n# host {socket.gethostname()}, CUDA_VISIBLE_DEVICES="
                   f"{env.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=d,
                                start_new_session=True, preexec_fn=_die_with_parent)
        with _running_lock:
            _running[proc.pid] = proc
        try:
            rc = proc.wait(timeout=piece.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            state, detail = TIMEOUT, f"the grader ran past {piece.timeout_s:g} s and was killed"
        finally:
            with _running_lock:
                _running.pop(proc.pid, None)
    if stop is not None and stop.is_set():
        return None
    elapsed = time.time() - started
    rep_data = load_report(rep) if state == DONE else None
    if state == DONE and rep_data is None:
        state = CRASHED
        detail = f"the grader exited with code {rc} without a valid report; last output:\n{_log_tail(log)}"
    elif state == DONE and _machine_failures(rep_data):
        state = INFRASTRUCTURE
        detail = ("the grading machine failed for " + ", ".join(_machine_failures(rep_data))
                  + " (not the submission's fault; see the report, then grade again with --resume)")
    status = {"student": sub.student, "lab": opts.lab, "piece": piece.name, "notebook": sub.path,
              "state": state, "detail": detail, "returncode": rc, "fingerprint": fp,
              "started": _stamp(started), "elapsed_s": round(elapsed, 2), "host": socket.gethostname(),
              "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
              "slurm": _slurm_ids()}
    write_json(status_path, status)
    return status


def _slurm_ids() -> dict[str, str] | None:
    ids = {k: os.environ[k] for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID")
           if k in os.environ}
    return ids or None


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


try:   # resolved here, not between fork and exec (no dlopen in a forked child of a threaded process)
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def _die_with_parent() -> None:
    """In the grader's process, between fork and exec: SIGKILL it when the thread that started it
    dies (the batch process, even by SIGKILL); the grader's sandboxed children die with it in turn."""
    if _prctl is not None:
        _prctl(1, int(signal.SIGKILL), 0, 0, 0)   # PR_SET_PDEATHSIG


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM first (the grader then stops its children and removes its temporary folders),
    SIGKILL after five seconds."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_running() -> None:
    with _running_lock:
        procs = list(_running.values())
    for proc in procs:              # all at once: each grader cleans up in parallel
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        _kill(proc)


# ------------------------------------------------------------------ merging pieces

def _synth_results(opts: Options, part_ids: Iterable[str], message: str) -> list[report.PartResult]:
    lab_spec = spec.load(opts.lab)
    out = []
    for pid in part_ids:
        p = lab_spec.part(pid)
        out.append(report.PartResult(opts.lab, p.id, p.title, 0.0, p.points, report.ERROR, message,
                                     p.needs_gpu, {"batch": "not graded"}))
    return out


def finalize(sub: Submission, opts: Options, digest: str | None = None) -> dict[str, Any]:
    """Merge the pieces' reports into ``report.json`` and ``results.json`` and write
    ``status.json`` (last). A piece that did not finish gives its parts an error verdict
    saying why, so every student has a report."""
    d = student_dir(opts, sub.student)
    os.makedirs(d, exist_ok=True)
    digest = digest or sub.digest()
    ps = pieces(opts)
    order = [p.id for p in selected_parts(opts.lab, opts.parts)]
    results: list[report.PartResult] = []
    piece_info, reports = {}, {}
    for pc in ps:
        st = read_json(os.path.join(d, f"{pc.name}.status.json"))
        rep = None
        fp = fingerprint(sub, opts, pc.parts, pc.needs_gpu, digest)
        if is_done(st, fp) or (st and st.get("state") == INFRASTRUCTURE and st.get("fingerprint") == fp):
            rep = load_report(os.path.join(d, f"{pc.name}.report.json"))
        elif st and st.get("state") == DONE:   # graded, but not this notebook or with other options
            st = {"state": "stale", "detail": "the result on disk is of another notebook or other options"}
        if rep is not None:
            reports[pc.name] = rep
            results += [report.PartResult(**r) for r in rep["results"]]
            piece_info[pc.name] = {k: st.get(k) for k in ("state", "elapsed_s", "returncode", "host",
                                                          "cuda_visible_devices", "slurm", "started")}
        else:
            why = (st or {}).get("detail") or "the grader never finished this submission"
            state = (st or {}).get("state", "missing")
            results += _synth_results(opts, pc.parts, f"not graded ({state}): {why.splitlines()[0]}")
            piece_info[pc.name] = {"state": state, "detail": why}
    results.sort(key=lambda r: order.index(r.part) if r.part in order else len(order))
    main = reports.get("gpu") or reports.get("all") or next(iter(reports.values()), None) or {}
    merged = report.Report(results, main.get("gpu", {}), main.get("seed"), sub.path,
                           versions=main.get("versions", {}),
                           **({"created": main["created"]} if "created" in main else {}))
    merged.write_json(os.path.join(d, "report.json.tmp"))
    os.replace(os.path.join(d, "report.json.tmp"), os.path.join(d, "report.json"))
    if len(ps) == 1 and ps[0].name in reports and os.path.exists(os.path.join(d, f"{ps[0].name}.results.json")):
        shutil.copyfile(os.path.join(d, f"{ps[0].name}.results.json"), os.path.join(d, "results.json.tmp"))
    else:
        report.write_gradescope(merged, os.path.join(d, "results.json.tmp"))
    os.replace(os.path.join(d, "results.json.tmp"), os.path.join(d, "results.json"))
    machine = [r.part for r in results if r.verdict == INFRASTRUCTURE]
    state = INCOMPLETE if len(reports) < len(ps) else INFRASTRUCTURE if machine else DONE
    errors = [r.part for r in results if r.verdict == report.ERROR]
    status = {"student": sub.student, "lab": opts.lab, "notebook": sub.path, "state": state,
              "unreadable": notebook_problem(sub), "infrastructure": machine,
              "fingerprint": full_fingerprint(sub, opts, digest), "notebook_mtime": sub.mtime(),
              "points": merged.points, "max_points": merged.max_points,
              "verdicts": {r.part: r.verdict for r in results}, "errors": errors,
              "pieces": piece_info, "elapsed_s": round(sum((v.get("elapsed_s") or 0) for v in piece_info.values()), 2),
              "finished": _stamp(time.time())}
    write_json(os.path.join(d, "status.json"), status)
    return status


def grade_student(sub: Submission, opts: Options, env_extra: dict[str, str] | None = None,
                  resume: bool = True) -> dict[str, Any]:
    """Every piece of one submission, in this thread (Slurm tasks use this)."""
    digest = sub.digest()
    for pc in pieces(opts):
        st = read_json(os.path.join(student_dir(opts, sub.student), f"{pc.name}.status.json"))
        if resume and is_done(st, fingerprint(sub, opts, pc.parts, pc.needs_gpu, digest)):
            continue
        grade_piece(sub, opts, pc, env_extra, digest=digest)
    return finalize(sub, opts, digest)


# ------------------------------------------------------------------ workers

def visible_gpus() -> list[str]:
    """GPU ids a worker can be pinned to: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's list;
    none with GRADER_CPU_ONLY=1."""
    if os.environ.get("GRADER_CPU_ONLY") == "1":
        return []
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [d.strip() for d in cvd.split(",") if d.strip()]
        return [] if ids[:1] == ["-1"] else ids
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip().isdigit()] if out.returncode == 0 else []


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def memory_bound_workers() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(1, int(line.split()[1]) * 1024 // MEM_PER_WORKER)
    except OSError:
        pass
    return 1 << 16


@dataclasses.dataclass
class Slot:
    name: str                   # "gpu0", "cpu3"
    env: dict[str, str]
    queues: tuple[str, ...]     # which queues it takes work from, in order


def make_slots(gpus: list[str], cpu_workers: int | None) -> list[Slot]:
    cores = cpu_count()
    slots = [Slot(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": g}, ("gpu", "cpu")) for g in gpus]
    if cpu_workers is None:   # the cores no GPU worker takes, as far as memory allows
        n_cpu = min(cores - len(gpus), memory_bound_workers() - len(gpus))
    else:
        n_cpu = cpu_workers
    n_cpu = max(n_cpu, 0 if gpus else 1)
    threads = str(max(1, cores // max(1, n_cpu + len(gpus))))
    for i in range(n_cpu):
        env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}
        slots.append(Slot(f"cpu{i}", env, ("cpu",)))
    return slots


# ------------------------------------------------------------------ progress

def fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """students done / left / with grading errors and an ETA; a bar redrawn in place on a terminal,
    a line per finished student otherwise. "With grading errors" counts students whose grading
    did not finish or whose notebook could not be graded (a crash, a time limit, an unreadable
    notebook): their results need a look, whatever their score. A student who simply scored low
    is not counted."""

    def __init__(self, lab: str, total: int, done: int = 0, errors: int = 0, stream=None, width: int = 28):
        self.lab, self.total, self.done, self.errors = lab, total, done, errors
        self.machine = 0
        self.resumed = done
        self.start = time.monotonic()
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = width
        self._lock = threading.Lock()

    def line(self) -> str:
        left = self.total - self.done
        fill = int(self.width * self.done / self.total) if self.total else self.width
        graded = self.done - self.resumed
        elapsed = time.monotonic() - self.start
        eta = fmt_s(elapsed / graded * left) if graded and left else ("0m00s" if not left else "--")
        return (f"{self.lab} [{'#' * fill}{'.' * (self.width - fill)}] {self.done}/{self.total} done, "
                f"{left} left, {self.errors} with grading errors"
                + (f", {self.machine} with machine failures" if self.machine else "")
                + f" | {fmt_s(elapsed)} elapsed, ETA {eta}")

    def show(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + self.line())
            self.stream.flush()

    def finished(self, status: dict[str, Any]) -> None:
        with self._lock:
            self.done += 1
            self.errors += has_grading_errors(status)
            self.machine += has_machine_failures(status)
            msg = (f"{status['student']}: {status['points']:g}/{status['max_points']:g} points"
                   + (f", notebook not graded: {status['unreadable']}" if status.get("unreadable") else
                      f", errors in {', '.join(status['errors'])}" if status.get("errors") else "")
                   + (f", the grading machine failed for {', '.join(status.get('infrastructure') or [])}"
                      if status["state"] == INFRASTRUCTURE else
                      "" if status["state"] == DONE else " (grading did not finish)")
                   + f" [{status.get('elapsed_s', 0):.1f} s]")
            if self.tty:
                self.stream.write("\r\x1b[K  " + msg + "\n" + self.line())
            else:
                self.stream.write(f"  {msg}\n  {self.line()}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def notebook_problem(sub: Submission) -> str:
    """Why the submission's notebook cannot be graded at all (missing, not JSON, not a notebook
    of this lab), as the grader says it; "" when it can be read. Reads the file as data only."""
    from .. import submission
    try:
        submission.read_cells(submission.find_notebook(sub.path, spec.load(sub.lab).notebook))
    except submission.SubmissionError as e:
        return str(e)
    return ""


def has_grading_errors(status: dict[str, Any]) -> bool:
    """A grading error, as the README defines it: grading did not finish (the grader crashed or
    ran past its time limit) or the notebook could not be graded (missing, unreadable). The
    submission's own errors (a syntax error, an exception, a kernel that hangs) are verdicts of
    its parts, graded 0 like a wrong answer: not grading errors."""
    return status.get("state") not in (DONE, INFRASTRUCTURE) or bool(status.get("unreadable"))


def has_machine_failures(status: dict[str, Any]) -> bool:
    """The grading machine failed on some part (the infrastructure verdict): counted apart from
    grading errors; its points are no grade, and --resume grades it again."""
    return status.get("state") == INFRASTRUCTURE


# ------------------------------------------------------------------ the batch

def plan(subs: list[Submission], opts: Options, resume: bool) -> tuple[list[tuple[Submission, str]], list[dict]]:
    """(submissions to grade with their digests, statuses of those already done)."""
    todo, done = [], []
    for sub in subs:
        digest = sub.digest()
        st = read_json(os.path.join(student_dir(opts, sub.student), "status.json"))
        if resume and is_done(st, full_fingerprint(sub, opts, digest)) and \
                load_report(os.path.join(student_dir(opts, sub.student), "report.json")) is not None:
            done.append(st)
        else:
            todo.append((sub, digest))
    return todo, done


def run_batch(subs: list[Submission], opts: Options, slots: list[Slot], resume: bool = False,
              progress: Progress | None = None) -> list[dict[str, Any]]:
    """Grade ``subs`` on ``slots``; returns the statuses of the students graded here. Raises
    KeyboardInterrupt (after killing the running graders) when interrupted."""
    todo, _ = plan(subs, opts, resume)
    queues: dict[str, queue.Queue] = {"gpu": queue.Queue(), "cpu": queue.Queue()}
    remaining: dict[str, set[str]] = {}
    by_name = {}
    for sub, digest in todo:
        by_name[sub.student] = (sub, digest)
        remaining[sub.student] = set()
        for pc in pieces(opts):
            st = read_json(os.path.join(student_dir(opts, sub.student), f"{pc.name}.status.json"))
            if resume and is_done(st, fingerprint(sub, opts, pc.parts, pc.needs_gpu, digest)):
                continue
            remaining[sub.student].add(pc.name)
            queues["gpu" if pc.needs_gpu else "cpu"].put((sub, pc, digest))
    finished: queue.Queue = queue.Queue()
    stop = threading.Event()

    def worker(slot: Slot) -> None:
        while not stop.is_set():
            item, qname = None, None
            for qname in slot.queues:
                try:
                    item = queues[qname].get_nowait()
                    break
                except queue.Empty:
                    continue
            if item is None:
                return
            sub, pc, digest = item
            env = slot.env if qname == "gpu" else {**slot.env, "CUDA_VISIBLE_DEVICES": ""}
            try:
                st = grade_piece(sub, opts, pc, env, stop, digest)
            except Exception as e:  # noqa: BLE001 - a worker must not die silently
                st = {"student": sub.student, "lab": opts.lab, "piece": pc.name, "notebook": sub.path,
                      "state": CRASHED, "detail": f"batch worker error: {e!r}", "fingerprint": None}
                os.makedirs(student_dir(opts, sub.student), exist_ok=True)
                write_json(os.path.join(student_dir(opts, sub.student), f"{pc.name}.status.json"), st)
                print(f"{sub.student}: batch worker error: {e!r}", file=sys.stderr, flush=True)
            if st is None:
                return
            finished.put((sub.student, pc.name))

    results = []
    for student in [s for s, r in remaining.items() if not r]:   # every piece already done
        sub, digest = by_name[student]
        st = finalize(sub, opts, digest)
        results.append(st)
        if progress:
            progress.finished(st)
    pending = {s for s, r in remaining.items() if r}
    threads = [threading.Thread(target=worker, args=(slot,), daemon=True, name=slot.name) for slot in slots]
    for t in threads:
        t.start()
    try:
        while pending:
            try:
                student, piece_name = finished.get(timeout=0.5)
            except queue.Empty:
                if progress:
                    progress.show()
                if not any(t.is_alive() for t in threads) and finished.empty():
                    break
                continue
            remaining[student].discard(piece_name)
            if not remaining[student]:
                pending.discard(student)
                sub, digest = by_name[student]
                st = finalize(sub, opts, digest)
                results.append(st)
                if progress:
                    progress.finished(st)
    except BaseException:
        stop.set()
        kill_running()
        for t in threads:
            t.join(timeout=10)
        raise
    for t in threads:
        t.join()
    return results


# ------------------------------------------------------------------ summary (shared with collect)

def lab_statuses(results_dir: str, lab: str) -> dict[str, dict[str, Any]]:
    d = os.path.join(results_dir, lab)
    out = {}
    if not os.path.isdir(d):
        return out
    for student in sorted(os.listdir(d)):
        st = read_json(os.path.join(d, student, "status.json"))
        if _valid_student(student) and isinstance(st, dict) and "state" in st:
            out[student] = st
    return out


def write_summary(results_dir: str, lab: str) -> dict[str, Any]:
    """``RESULTS_DIR/<lab>/summary.json``: one line per student (state, points, errors)."""
    sts = lab_statuses(results_dir, lab)
    summary = {"lab": lab, "students": len(sts),
               "done": sum(s["state"] == DONE for s in sts.values()),
               "grading_errors": sorted(s for s, st in sts.items() if has_grading_errors(st)),
               "machine_failures": sorted(s for s, st in sts.items() if has_machine_failures(st)),
               "results": {s: {k: st.get(k) for k in ("state", "points", "max_points", "errors", "finished")}
                           for s, st in sts.items()}}
    write_json(os.path.join(results_dir, lab, "summary.json"), summary)
    return summary

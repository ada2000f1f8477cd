"""Grading a whole class on a Slurm cluster.

``python -m grader batch LAB SUBMISSIONS_DIR --out RESULTS_DIR --slurm`` writes a job array
(one task per submission, or per ``--slurm-chunk`` submissions; ``--gres=gpu:1``; a time limit
from the lab's part timeouts; account, partition and the rest from options or a config
file), submits it with ``sbatch`` and waits for it with ``squeue`` (``--no-wait`` returns at
once). Each task grades its submissions exactly as ``batch`` does on one host (the grader's
CLI in a subprocess, on the GPU Slurm gave the task) and writes the same result files under
``RESULTS_DIR/<lab>/<student>/``; the cluster's nodes must see RESULTS_DIR, the submissions
and this repository at the same paths (a shared file system).

``python -m grader collect RESULTS_DIR`` merges what the tasks wrote (pieces into each
student's report, ``RESULTS_DIR/<lab>/summary.json``) and lists the tasks that died (a
student of theirs without a finished result), with Slurm's state for them when ``sacct`` or
``scontrol`` still knows it; ``--resubmit`` submits those tasks again, alone
(``sbatch --array=<their indices>``), and ``--wait`` waits for the array first.

The run's files live in ``RESULTS_DIR/<lab>/slurm/<stamp>/``: ``job.sh`` (the array script),
``manifest.json`` (tasks, their students and fingerprints, the job ids), ``task-<i>.out``.

Config file (TOML; ``--slurm-config FILE``, else ``$GRADER_SLURM_CONFIG``, else
``~/.config/grader/slurm.toml``), every key optional, command-line options win::

    account = "course-gpu"
    partition = "gpu"
    qos = "normal"
    gres = "gpu:1"              # per task
    cpus_per_task = 4
    mem = "32G"
    time_minutes = 30           # default: from the lab's part timeouts
    chunk = 1                   # submissions per task
    max_parallel = 8            # array throttle: %8
    python = "/shared/venv/bin/python"   # default: this interpreter
    setup = ["module load cuda/13.0"]    # shell lines run before the grader
    sbatch_args = ["--constraint=h200"]  # extra #SBATCH lines
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from typing import Any

from .. import spec
from . import batch

CONFIG_ENV = "GRADER_SLURM_CONFIG"
DEFAULT_CONFIG = os.path.join("~", ".config", "grader", "slurm.toml")
TIME_MARGIN = 1.25          # the array's time limit: the parts' timeouts (and start-up) x this
MIN_TIME_MINUTES = 5
LIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
               "RESIZING", "STAGE_OUT", "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED"}


class SlurmError(RuntimeError):
    pass


@dataclasses.dataclass
class SlurmConfig:
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    gres: str = "gpu:1"
    cpus_per_task: int | None = None   # Slurm's default (1) when unset
    mem: str | None = None
    time_minutes: int | None = None
    chunk: int = 1
    max_parallel: int | None = None
    python: str = sys.executable
    setup: list[str] = dataclasses.field(default_factory=list)
    sbatch_args: list[str] = dataclasses.field(default_factory=list)
    poll_s: float = 15.0


def config_path(explicit: str | None = None) -> str | None:
    for path in (explicit, os.environ.get(CONFIG_ENV), os.path.expanduser(DEFAULT_CONFIG)):
        if path and (path == explicit or os.path.exists(path)):
            return path
    return None


def load_config(path: str | None) -> SlurmConfig:
    cfg = SlurmConfig()
    if not path:
        return cfg
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    fields = {f.name: f for f in dataclasses.fields(SlurmConfig)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise SlurmError(f"{path}: unknown key(s) {unknown}; known: {', '.join(sorted(fields))}")
    for key, value in raw.items():
        setattr(cfg, key, value)
    return cfg


def resolve_config(args) -> SlurmConfig:
    """The config file, then the command line's options over it."""
    cfg = load_config(config_path(getattr(args, "slurm_config", None)))
    for opt, key in (("account", "account"), ("partition", "partition"), ("qos", "qos"), ("gres", "gres"),
                     ("cpus_per_task", "cpus_per_task"), ("mem", "mem"), ("slurm_time", "time_minutes"),
                     ("slurm_chunk", "chunk"), ("slurm_max_parallel", "max_parallel"),
                     ("slurm_poll", "poll_s")):
        value = getattr(args, opt, None)
        if value is not None:
            setattr(cfg, key, value)
    if cfg.chunk < 1:
        raise SlurmError("chunk must be at least 1")
    return cfg


# ------------------------------------------------------------------ the array script

def time_limit_minutes(lab: str, parts: list[str] | None, chunk: int, margin: float = TIME_MARGIN) -> int:
    """Enough for ``chunk`` submissions whose every selected part runs to its timeout."""
    per_submission = batch.STARTUP_S + sum(p.timeout_s for p in batch.selected_parts(lab, parts))
    return max(MIN_TIME_MINUTES, math.ceil(per_submission * chunk * margin / 60))


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def render_script(lab: str, run_dir: str, manifest_path: str, n_tasks: int, cfg: SlurmConfig,
                  minutes: int) -> str:
    throttle = f"%{cfg.max_parallel}" if cfg.max_parallel else ""
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=grade-{lab}",
             f"#SBATCH --array=0-{n_tasks - 1}{throttle}",
             f"#SBATCH --time={minutes}",
             f"#SBATCH --output={os.path.join(run_dir, 'task-%a.out')}",
             "#SBATCH --export=ALL"]
    if cfg.gres:
        lines.append(f"#SBATCH --gres={cfg.gres}")
    for key in ("cpus_per_task", "account", "partition", "qos", "mem"):
        if getattr(cfg, key):
            lines.append(f"#SBATCH --{key.replace('_', '-')}={getattr(cfg, key)}")
    lines += [f"#SBATCH {a}" for a in cfg.sbatch_args]
    lines += ["# Written by python -m grader batch --slurm: one task grades its submissions "
              "(the tasks in manifest.json).", "set -u"]
    lines += list(cfg.setup)
    lines += [f"cd {shlex.quote(batch.REPO_ROOT)}",
              f"export PYTHONPATH={shlex.quote(batch.REPO_ROOT)}${{PYTHONPATH:+:$PYTHONPATH}}",
              f"exec {shlex.quote(cfg.python)} -m grader.classroom.slurm task {shlex.quote(manifest_path)}", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ talking to Slurm

def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    if not shutil.which(cmd[0]):
        raise SlurmError(f"{cmd[0]} is not on PATH: is this a Slurm login node?")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def sbatch(script: str, array: list[int] | None = None) -> str:
    """Submit; returns the job id."""
    cmd = ["sbatch", "--parsable"]
    if array is not None:
        cmd.append("--array=" + ",".join(str(i) for i in array))
    proc = _run(cmd + [script])
    if proc.returncode != 0:
        raise SlurmError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return parse_sbatch(proc.stdout)


def parse_sbatch(out: str) -> str:
    """``sbatch --parsable`` prints ``<jobid>`` or ``<jobid>;<cluster>``."""
    m = re.match(r"\s*(\d+)", out.strip().splitlines()[-1] if out.strip() else "")
    if not m:
        raise SlurmError(f"cannot read a job id from sbatch's output {out!r}")
    return m.group(1)


def _expand(ids: str) -> list[int]:
    """Array task ids as squeue prints them: ``3``, ``[2-5%4]``, ``1,4-6``."""
    out = []
    for piece in ids.strip("[]").split("%")[0].split(","):
        if "-" in piece:
            lo, hi = piece.split("-", 1)
            if lo.isdigit() and hi.isdigit():
                out += range(int(lo), int(hi) + 1)
        elif piece.isdigit():
            out.append(int(piece))
    return out


def live_tasks(job_ids: list[str]) -> dict[tuple[str, int], str]:
    """(job id, task index) -> state (with the reason when pending, e.g. ``PENDING (Resources)``),
    for the array tasks still pending or running."""
    if not job_ids:
        return {}
    proc = _run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%F %K %T %r"])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:    # every job already left the queue
            return {}
        raise SlurmError(f"squeue failed: {proc.stderr.strip()}")
    live = {}
    for line in proc.stdout.splitlines():
        fields = line.split(None, 3)
        if len(fields) >= 3 and fields[2] in LIVE_STATES:
            state = fields[2] + (f" ({fields[3]})" if fields[2] == "PENDING" and len(fields) > 3 else "")
            for i in _expand(fields[1]):
                live[(fields[0], i)] = state
    return live


def final_states(job_id: str) -> dict[int, str]:
    """Slurm's last word on each array task: sacct where accounting is on, else scontrol (which
    remembers a job for MinJobAge seconds); {} when neither knows."""
    states: dict[int, str] = {}
    try:
        proc = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State"])
        if proc.returncode == 0:
            for line in proc.stdout.splitlines():
                m = re.match(rf"{job_id}_(\d+)\|(\S+)", line)
                if m:
                    states[int(m.group(1))] = m.group(2)
        if states:
            return states
        proc = _run(["scontrol", "-o", "show", "job", job_id])
        if proc.returncode == 0:
            for line in proc.stdout.splitlines():
                t = re.search(r"\bArrayTaskId=(\d+)\b", line)
                s = re.search(r"\bJobState=(\S+)", line)
                if t and s:
                    states[int(t.group(1))] = s.group(1)
    except (SlurmError, subprocess.TimeoutExpired):
        pass
    return states


# ------------------------------------------------------------------ manifests

def manifests(results_dir: str, lab: str) -> list[str]:
    return sorted(glob.glob(os.path.join(results_dir, lab, "slurm", "*", "manifest.json")))


def manifest_options(m: dict[str, Any]) -> batch.Options:
    return batch.Options(m["lab"], m["results_dir"], m["parts"], m["public"], gpu=m["gpu"], split=False,
                         hide=tuple(m.get("hide", ())))


def latest_job_per_task(m: dict[str, Any]) -> dict[int, str]:
    out = {}
    for s in m.get("submissions", []):
        for i in s["tasks"]:
            out[i] = s["job_id"]
    return out


def task_students_done(m: dict[str, Any], index: int) -> list[bool]:
    opts = manifest_options(m)
    out = []
    for entry in m["tasks"][index]:
        st = batch.read_json(os.path.join(batch.student_dir(opts, entry["student"]), "status.json"))
        out.append(batch.is_done(st, entry["fingerprint"]))
    return out


# ------------------------------------------------------------------ batch --slurm

def cmd_batch_slurm(args, subs: list[batch.Submission], results_dir: str) -> int:
    try:
        cfg = resolve_config(args)
    except (SlurmError, OSError, tomllib.TOMLDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    opts = batch.Options(args.lab, results_dir, args.part, args.public, gpu="gpu" in (cfg.gres or ""), split=False,
                         hide=(os.path.abspath(args.submissions),))
    os.makedirs(opts.lab_dir, exist_ok=True)
    todo, done = batch.plan(subs, opts, args.resume)
    if not todo:
        print(f"{args.lab}: all {len(subs)} submissions already graded and unchanged; nothing to submit")
        batch.write_summary(results_dir, args.lab)
        return 0
    if not args.resume:   # a fresh grading: the tasks must not take old results for done
        for sub, _ in todo:
            for f in glob.glob(os.path.join(batch.student_dir(opts, sub.student), "*status.json")):
                os.remove(f)
    try:
        manifest_path, job_id, n_tasks = submit_array(todo, opts, cfg)
    except (SlurmError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = os.path.dirname(manifest_path)
    print(f"{args.lab}: {len(subs)} submissions; "
          + (f"{len(done)} already graded (--resume); " if args.resume else "")
          + f"submitted job {job_id}: {n_tasks} task(s) of up to {cfg.chunk} submission(s), "
          f"--gres={cfg.gres}, time limit {time_limit(cfg, opts)} min; files in {run_dir}", flush=True)
    if args.no_wait:
        print(f"not waiting (--no-wait): watch with `squeue -j {job_id}`, then "
              f"`python -m grader collect {results_dir}`")
        return 0
    progress = batch.Progress(args.lab, len(subs), done=len(done),
                              errors=sum(batch.has_grading_errors(s) for s in done))
    try:
        wait(manifest_path, cfg.poll_s, progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"\nstopped waiting; job {job_id} goes on (scancel {job_id} to stop it); "
              f"`python -m grader collect {results_dir} --wait` collects later", file=sys.stderr)
        return 130
    progress.close()
    return collect(results_dir, [args.lab])


def time_limit(cfg: SlurmConfig, opts: batch.Options) -> int:
    return cfg.time_minutes or time_limit_minutes(opts.lab, opts.parts, cfg.chunk)


def submit_array(todo: list[tuple[batch.Submission, str]], opts: batch.Options,
                 cfg: SlurmConfig) -> tuple[str, str, int]:
    if not shutil.which("sbatch"):
        raise SlurmError("sbatch is not on PATH: run this on a Slurm login node")
    run_dir = os.path.join(opts.lab_dir, "slurm", time.strftime("%Y%m%d-%H%M%S"))
    while os.path.exists(run_dir):
        run_dir += "x"
    os.makedirs(run_dir)
    tasks = [[{"student": sub.student, "path": sub.path,
               "fingerprint": batch.full_fingerprint(sub, opts, digest)} for sub, digest in group]
             for group in chunks(todo, cfg.chunk)]
    manifest_path = os.path.join(run_dir, "manifest.json")
    script = os.path.join(run_dir, "job.sh")
    with open(script, "w") as f:
        f.write(render_script(opts.lab, run_dir, manifest_path, len(tasks), cfg, time_limit(cfg, opts)))
    os.chmod(script, 0o755)
    m = {"lab": opts.lab, "results_dir": opts.results_dir, "parts": opts.parts, "public": opts.public,
         "gpu": opts.gpu, "hide": list(opts.hide), "script": script, "created": batch._stamp(time.time()), "tasks": tasks,
         "submissions": []}
    batch.write_json(manifest_path, m)
    job_id = sbatch(script)
    m["submissions"].append({"job_id": job_id, "tasks": list(range(len(tasks))),
                             "submitted": batch._stamp(time.time())})
    batch.write_json(manifest_path, m)
    return manifest_path, job_id, len(tasks)


def wait(manifest_path: str, poll_s: float, progress: batch.Progress | None = None) -> None:
    """Until no task of the manifest's jobs is pending or running."""
    failures = 0
    seen: set[str] = set()
    reasons_shown: set[str] = set()
    while True:
        m = batch.read_json(manifest_path)
        job_ids = sorted({s["job_id"] for s in m["submissions"]})
        try:
            live = live_tasks(job_ids)
            failures = 0
        except (SlurmError, subprocess.TimeoutExpired) as e:
            failures += 1
            if failures >= 10:
                raise SlurmError(f"squeue keeps failing: {e}") from e
            live = {("?", -1): "UNKNOWN"}
        if progress is not None:
            opts = manifest_options(m)
            for group in m["tasks"]:
                for entry in group:
                    st = batch.read_json(os.path.join(batch.student_dir(opts, entry["student"]), "status.json"))
                    if entry["student"] not in seen and batch.is_done(st, entry["fingerprint"]):
                        seen.add(entry["student"])
                        progress.finished(st)
            progress.show()
        if not live:
            return
        # A reason that will not go away by waiting (PartitionConfig: more CPUs, memory or time
        # than the partition allows; a bad account) is worth seeing at once.
        for reason in sorted({s for s in live.values() if s.startswith("PENDING (")} - reasons_shown):
            if not re.search(r"\((None|Resources|Priority|JobArrayTaskLimit|BeginTime)\)", reason):
                print(f"\nwaiting: tasks {reason}; see `squeue -r -j {','.join(sorted({j for j, _ in live}))}`",
                      file=sys.stderr, flush=True)
            reasons_shown.add(reason)
        time.sleep(poll_s)


# ------------------------------------------------------------------ the task (runs on a node)

def run_task(manifest_path: str, index: int) -> int:
    m = batch.read_json(manifest_path)
    opts = manifest_options(m)
    entries = m["tasks"][index]
    print(f"task {index}: {len(entries)} submission(s) of {m['lab']} on {os.uname().nodename}, "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}", flush=True)
    bad = 0
    for entry in entries:
        sub = batch.Submission(entry["student"], m["lab"], entry["path"])
        t0 = time.monotonic()
        st = batch.grade_student(sub, opts, resume=True)
        bad += st["state"] != batch.DONE
        print(f"  {sub.student}: {st['state']}, {st['points']:g}/{st['max_points']:g} points"
              + (f", errors in {', '.join(st['errors'])}" if st["errors"] else "")
              + f" [{time.monotonic() - t0:.1f} s]", flush=True)
    return 1 if bad else 0


# ------------------------------------------------------------------ collect

def collect_lab(results_dir: str, lab: str, out=sys.stdout) -> tuple[dict[str, Any], list[tuple[str, int, str]]]:
    """Finalize what Slurm tasks left, write the summary, and find dead tasks.
    Returns (summary, [(manifest path, task index, why)])."""
    dead = []
    for path in manifests(results_dir, lab):
        m = batch.read_json(path)
        if not m or not m.get("submissions"):   # written, but sbatch refused it
            continue
        opts = manifest_options(m)
        latest = latest_job_per_task(m)
        try:
            live = live_tasks(sorted(set(latest.values())))
        except SlurmError:
            live = {}
        states: dict[str, dict[int, str]] = {}
        for index, group in enumerate(m["tasks"]):
            job = latest.get(index)
            if (job, index) in live:
                continue
            missing = []
            for entry, ok in zip(group, task_students_done(m, index)):
                if ok:
                    continue
                # merges a piece the task graded but did not merge, or records "not graded"
                st = batch.finalize(batch.Submission(entry["student"], lab, entry["path"]), opts)
                if not batch.is_done(st, entry["fingerprint"]):
                    missing.append(entry["student"])
            if missing:
                if job not in states:
                    states[job] = final_states(job) if job else {}
                slurm_state = states[job].get(index, "unknown to Slurm now")
                dead.append((path, index, f"job {job}_{index} ({slurm_state}): no finished result for "
                                          f"{', '.join(missing)}; log {os.path.join(os.path.dirname(path), f'task-{index}.out')}"))
    summary = batch.write_summary(results_dir, lab)
    return summary, dead


def labs_in(results_dir: str) -> list[str]:
    return [lab for lab in spec.lab_names() if os.path.isdir(os.path.join(results_dir, lab))]


def collect(results_dir: str, labs: list[str] | None = None, resubmit: bool = False,
            tasks: list[int] | None = None, wait_first: bool = False, poll_s: float = 15.0) -> int:
    results_dir = os.path.abspath(results_dir)
    labs = labs or labs_in(results_dir)
    if not labs:
        print(f"error: no lab results under {results_dir}", file=sys.stderr)
        return 2
    rc = 0
    for lab in labs:
        if wait_first:
            for path in manifests(results_dir, lab):
                wait(path, poll_s)
        summary, dead = collect_lab(results_dir, lab)
        print(f"{lab}: {summary['students']} students with results, {summary['done']} graded, "
              f"{len(summary['grading_errors'])} with grading errors"
              f"{': ' + ', '.join(summary['grading_errors']) if summary['grading_errors'] else ''}"
              + (f"; {len(summary['machine_failures'])} with machine failures (infrastructure, not graded: "
                 f"grade them again): {', '.join(summary['machine_failures'])}" if summary["machine_failures"] else ""))
        for _, index, why in dead:
            print(f"  dead task {index}: {why}")
        if dead and not resubmit:
            print(f"  resubmit them alone with: python -m grader collect {results_dir} --lab {lab} --resubmit")
        if resubmit:
            by_manifest: dict[str, list[int]] = {}
            if tasks:   # exactly these tasks of the latest array, dead or not
                by_manifest = {manifests(results_dir, lab)[-1]: sorted(set(tasks))} if manifests(results_dir, lab) else {}
            else:
                for path, index, _ in dead:
                    by_manifest.setdefault(path, []).append(index)
            for path, indices in by_manifest.items():
                m = batch.read_json(path)
                bad = [i for i in indices if not 0 <= i < len(m["tasks"])]
                if bad:
                    raise SlurmError(f"no task {bad} in {path} (tasks 0-{len(m['tasks']) - 1})")
                job_id = sbatch(m["script"], sorted(indices))
                m["submissions"].append({"job_id": job_id, "tasks": sorted(indices),
                                         "submitted": batch._stamp(time.time())})
                batch.write_json(path, m)
                print(f"  resubmitted task(s) {', '.join(map(str, sorted(indices)))} as job {job_id}")
                if wait_first:
                    wait(path, poll_s)
            if by_manifest and wait_first:
                summary, dead = collect_lab(results_dir, lab)
                print(f"{lab} after resubmission: {summary['done']}/{summary['students']} graded; "
                      f"{len(dead)} dead task(s)")
                for _, index, why in dead:
                    print(f"  dead task {index}: {why}")
            elif by_manifest:
                dead = []   # resubmitted and not waited for: not an error now
        not_done = summary["students"] - summary["done"]
        if dead or not_done:
            rc = 1
    return rc


def cmd_collect(args) -> int:
    try:
        return collect(args.results, args.lab, args.resubmit, args.task, args.wait, args.poll)
    except SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# ------------------------------------------------------------------ CLI

def add_batch_options(p) -> None:
    g = p.add_argument_group("Slurm (with --slurm)")
    g.add_argument("--slurm", action="store_true", help="submit a Slurm job array instead of grading here")
    g.add_argument("--no-wait", action="store_true", help="return once submitted (then: grader collect)")
    g.add_argument("--slurm-config", help=f"TOML config (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG})")
    g.add_argument("--account")
    g.add_argument("--partition")
    g.add_argument("--qos")
    g.add_argument("--gres", help="per task (default gpu:1)")
    g.add_argument("--cpus-per-task", type=int)
    g.add_argument("--mem")
    g.add_argument("--slurm-time", type=int, metavar="MINUTES",
                   help="time limit per task (default: from the lab's part timeouts)")
    g.add_argument("--slurm-chunk", type=int, metavar="N", help="submissions per task (default 1)")
    g.add_argument("--slurm-max-parallel", type=int, metavar="N", help="array throttle (%%N)")
    g.add_argument("--slurm-poll", type=float, metavar="SECONDS", help="squeue polling interval (default 15)")


def register(subparsers) -> None:
    c = subparsers.add_parser("collect", help="merge what batch (Slurm tasks) wrote; list and resubmit dead tasks")
    c.add_argument("results", metavar="RESULTS_DIR")
    c.add_argument("--lab", action="append", help="only this lab (repeatable; default: every lab found)")
    c.add_argument("--wait", action="store_true", help="wait for the Slurm jobs still queued or running first")
    c.add_argument("--resubmit", action="store_true", help="resubmit the dead tasks, alone")
    c.add_argument("--task", type=int, action="append", help="with --resubmit: only this task index (repeatable)")
    c.add_argument("--poll", type=float, default=15.0, help="squeue polling interval in seconds (default 15)")
    c.set_defaults(func=cmd_collect)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "task":
        index = int(argv[2]) if len(argv) > 2 else int(os.environ["SLURM_ARRAY_TASK_ID"])
        return run_task(argv[1], index)
    print("usage: python -m grader.classroom.slurm task MANIFEST [INDEX]  (run by the job array)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

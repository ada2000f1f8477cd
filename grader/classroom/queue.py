"""The public check on the course's GPUs, through Slurm: feedback for a student without a GPU.

``python -m grader queue-check LAB --submission NOTEBOOK`` copies the saved notebook into a job
folder, submits one Slurm job on the course's GPU partition (``--gres=gpu:1``, a time limit from
the lab's part timeouts) that runs ``python -m grader check LAB --submission <copy> --public``
(the students' code in the grader's jail, as always), waits for it, and prints the job's output:
the report the check cells print on a GPU, with every part's verdict. ``--no-wait`` returns once
the job is queued; ``--part`` checks only some parts.

The instructor sets the queue in a TOML file, found at ``--queue-config FILE``, else
``$GRADER_QUEUE_CONFIG``, else ``/etc/grader/queue.toml`` (on the cluster's login node); every key
is optional::

    partition = "gpu"            # the GPU partition (default: Slurm's default partition)
    gres = "gpu:1"
    account = "course-gpu"
    qos = "course"
    max_in_flight = 1            # a student's checks queued or running at once
    max_per_hour = 6             # a student's checks submitted in the last hour
    time_minutes = 20            # default: from the lab's part timeouts
    python = "/shared/course/venv/bin/python"   # default: this interpreter
    setup = ["module load cuda/13.0"]
    sbatch_args = ["--constraint=h200"]
    spool = "~/.cache/grader/queue"   # job folders; must be on a file system the GPU nodes see

The two limits are counted here, from ``squeue`` (checks in flight) and the student's own list of
submissions in the spool folder (checks per hour): they keep the queue fair for students who use
this command. Limits no one can get around are Slurm's: a QOS on the partition with
``MaxJobsPerUser`` / ``MaxSubmitJobsPerUser`` (``sacctmgr``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib

from .. import spec

CONFIG_ENV = "GRADER_QUEUE_CONFIG"
SYSTEM_CONFIG = "/etc/grader/queue.toml"
JOB_NAME = "grader-queue-check"
EXIT_MARK = "queue-check: grader exit status "
HOUR_S = 3600.0


class QueueError(RuntimeError):
    pass


@dataclasses.dataclass
class QueueConfig:
    partition: str | None = None
    gres: str = "gpu:1"
    account: str | None = None
    qos: str | None = None
    max_in_flight: int = 1
    max_per_hour: int = 6
    time_minutes: int | None = None
    python: str = sys.executable
    setup: list[str] = dataclasses.field(default_factory=list)
    sbatch_args: list[str] = dataclasses.field(default_factory=list)
    spool: str = os.path.join("~", ".cache", "grader", "queue")
    poll_s: float = 5.0


def config_path(explicit: str | None = None) -> str | None:
    for path in (explicit, os.environ.get(CONFIG_ENV), SYSTEM_CONFIG):
        if path and (path == explicit or os.path.exists(path)):
            return path
    return None


def load_config(path: str | None) -> QueueConfig:
    cfg = QueueConfig()
    if not path:
        return cfg
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise QueueError(f"the queue's config {path} cannot be read: {e}") from e
    known = {f.name for f in dataclasses.fields(QueueConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise QueueError(f"{path}: unknown key(s) {unknown}; known: {', '.join(sorted(known))}")
    for key, value in raw.items():
        setattr(cfg, key, value)
    return cfg


# ------------------------------------------------------------------ the job

def render_script(lab: str, notebook: str, job_dir: str, cfg: QueueConfig, minutes: int,
                  parts: list[str] | None) -> str:
    from . import batch
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={JOB_NAME}",
             f"#SBATCH --time={minutes}",
             f"#SBATCH --output={os.path.join(job_dir, 'job.out')}"]
    if cfg.gres:
        lines.append(f"#SBATCH --gres={cfg.gres}")
    for key in ("partition", "account", "qos"):
        if getattr(cfg, key):
            lines.append(f"#SBATCH --{key}={getattr(cfg, key)}")
    lines += [f"#SBATCH {a}" for a in cfg.sbatch_args]
    check = [cfg.python, "-m", "grader", "check", lab, "--submission", notebook, "--public"]
    check += [a for p in (parts or []) for a in ("--part", p)]
    lines += [f"# Written by python -m grader queue-check: the public check of {lab} on a GPU of the course.",
              "set -u",
              "unset GRADER_SECRET_SEED GRADER_SEED_FD   # the public cases only, whoever submits",
              *cfg.setup,
              f"cd {shlex.quote(batch.REPO_ROOT)}",
              f"export PYTHONPATH={shlex.quote(batch.REPO_ROOT)}",
              'echo "queue-check: job ${SLURM_JOB_ID} on $(hostname), GPU(s) ${CUDA_VISIBLE_DEVICES:-none}"',
              shlex.join(check),
              f'echo "{EXIT_MARK}$?"', ""]
    return "\n".join(lines)


def time_limit(lab: str, parts: list[str] | None, cfg: QueueConfig) -> int:
    from . import slurm
    return cfg.time_minutes or slurm.time_limit_minutes(lab, parts, 1)


# ------------------------------------------------------------------ the student's limits

def jobs_in_flight(user: str) -> list[tuple[str, str]]:
    """(job id, state) of the user's queued checks still pending or running."""
    from . import slurm
    proc = slurm._run(["squeue", "-h", "-u", user, "-n", JOB_NAME, "-o", "%i %T"])
    if proc.returncode != 0:
        raise QueueError(f"squeue failed: {proc.stderr.strip() or proc.stdout.strip()}")
    out = []
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] in slurm.LIVE_STATES:
            out.append((fields[0], fields[1]))
    return out


def ledger_path(spool: str) -> str:
    return os.path.join(spool, "submitted.json")


def recent_submissions(spool: str, now: float) -> list[float]:
    try:
        with open(ledger_path(spool)) as f:
            stamps = json.load(f)
    except (OSError, ValueError):
        return []
    return sorted(t for t in stamps if isinstance(t, (int, float)) and now - HOUR_S < t <= now)


def record_submission(spool: str, now: float) -> None:
    stamps = recent_submissions(spool, now) + [now]
    tmp = ledger_path(spool) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stamps, f)
    os.replace(tmp, ledger_path(spool))


def refusal(in_flight: list[tuple[str, str]], recent: list[float], cfg: QueueConfig, now: float) -> str | None:
    """Why the course's limits refuse another check now, or None."""
    if cfg.max_in_flight and len(in_flight) >= cfg.max_in_flight:
        jobs = ", ".join(f"job {j} ({s.lower()})" for j, s in in_flight)
        return (f"you have {len(in_flight)} check(s) queued or running ({jobs}); the course allows "
                f"{cfg.max_in_flight} at a time. Wait for it to finish (squeue --me), or cancel it "
                f"(scancel <job>) and submit again")
    if cfg.max_per_hour and len(recent) >= cfg.max_per_hour:
        next_at = time.strftime("%H:%M", time.localtime(recent[-cfg.max_per_hour] + HOUR_S))
        return (f"you have submitted {len(recent)} checks in the last hour; the course allows "
                f"{cfg.max_per_hour} an hour. The next one can go at {next_at}")
    return None


# ------------------------------------------------------------------ waiting

def job_state(job_id: str) -> tuple[str, str]:
    """(state, reason or node) while Slurm lists the job; ("", "") once it left the queue."""
    from . import slurm
    proc = slurm._run(["squeue", "-h", "-j", job_id, "-o", "%T|%R"])
    if proc.returncode != 0 or not proc.stdout.strip():
        return "", ""
    state, _, where = proc.stdout.strip().splitlines()[0].partition("|")
    return state, where


def final_state(job_id: str) -> str:
    from . import slurm
    for cmd, pattern in ((["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], r"^(\S+)"),
                         (["scontrol", "-o", "show", "job", job_id], r"\bJobState=(\S+)")):
        try:
            proc = slurm._run(cmd)
        except (slurm.SlurmError, subprocess.TimeoutExpired):
            continue
        m = re.search(pattern, proc.stdout.strip(), re.M) if proc.returncode == 0 else None
        if m:
            return m.group(1)
    return "unknown to Slurm now"


def wait(job_id: str, poll_s: float, out=sys.stdout) -> None:
    from . import slurm
    said = None
    while True:
        state, where = job_state(job_id)
        if not state or state not in slurm.LIVE_STATES:
            return
        reason = where.strip("()")
        words = ((f"queued ({reason})" if reason not in ("", "None") else "queued") if state == "PENDING" else
                 f"running on {where}" if state == "RUNNING" else state.lower())
        if words != said:
            print(f"job {job_id}: {words}", file=out, flush=True)
            said = words
        time.sleep(poll_s)


def report(job_dir: str, job_id: str, out=sys.stdout) -> int:
    """Print the job's output; the grader's exit status, or 1 when the job died before it ended."""
    path = os.path.join(job_dir, "job.out")
    for _ in range(20):   # the node's file system may show the last lines a moment later
        text = open(path, errors="replace").read() if os.path.exists(path) else ""
        if EXIT_MARK in text:
            break
        time.sleep(0.5)
    m = re.search(re.escape(EXIT_MARK) + r"(\d+)", text)
    print(re.sub(re.escape(EXIT_MARK) + r"\d+\n?", "", text), end="", file=out)
    if m:
        return int(m.group(1))
    print(f"\nerror: job {job_id} ended before the check finished (Slurm: {final_state(job_id)}); "
          f"its output is {path}", file=out)
    return 1


# ------------------------------------------------------------------ the command

def cmd_queue_check(args) -> int:
    if args.lab not in spec.lab_names():
        print(f"error: no lab {args.lab!r}; labs: {', '.join(spec.lab_names())}", file=sys.stderr)
        return 2
    if not os.path.isfile(args.submission):
        print(f"error: {args.submission} is not a file: name your saved notebook (.ipynb)", file=sys.stderr)
        return 2
    if not shutil.which("sbatch"):
        print("error: sbatch is not on PATH: run this on the cluster's login node", file=sys.stderr)
        return 2
    try:
        path = config_path(args.queue_config)
        cfg = load_config(path)
        if args.part:
            known = {p.id for p in spec.load(args.lab).parts}
            bad = [p for p in args.part if p not in known]
            if bad:
                raise QueueError(f"no part {', '.join(bad)} in {args.lab}; parts: {', '.join(sorted(known))}")
        spool = os.path.abspath(os.path.expanduser(cfg.spool))
        os.makedirs(spool, exist_ok=True)
        user = os.environ.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name
        now = time.time()
        why = refusal(jobs_in_flight(user), recent_submissions(spool, now), cfg, now)
        if why:
            print(f"not submitted: {why}.", file=sys.stderr)
            return 4
        job_dir = os.path.join(spool, f"{args.lab}-{time.strftime('%Y%m%d-%H%M%S')}")
        while os.path.exists(job_dir):
            job_dir += "x"
        os.makedirs(job_dir)
        notebook = os.path.join(job_dir, os.path.basename(args.submission))
        shutil.copyfile(args.submission, notebook)
        minutes = time_limit(args.lab, args.part, cfg)
        script = os.path.join(job_dir, "job.sh")
        with open(script, "w") as f:
            f.write(render_script(args.lab, notebook, job_dir, cfg, minutes, args.part))
        from . import slurm
        job_id = slurm.sbatch(script)
        record_submission(spool, now)
    except (QueueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - Slurm's errors (SlurmError, a timeout) said plainly
        print(f"error: the check could not be submitted: {e}", file=sys.stderr)
        return 2
    print(f"{args.lab}: submitted job {job_id} (the public check of {args.submission} as saved now) to "
          f"partition {cfg.partition or '(Slurm default)'}, --gres={cfg.gres}, time limit {minutes} min; "
          f"queue settings: {path or 'defaults (no config file)'}", flush=True)
    if args.no_wait:
        print(f"not waiting (--no-wait): `squeue -j {job_id}` shows it; the report will be in "
              f"{os.path.join(job_dir, 'job.out')}")
        return 0
    try:
        wait(job_id, cfg.poll_s)
    except KeyboardInterrupt:
        print(f"\nstopped waiting; job {job_id} goes on (scancel {job_id} stops it); its report will be in "
              f"{os.path.join(job_dir, 'job.out')}", file=sys.stderr)
        return 130
    return report(job_dir, job_id)


def register(subparsers) -> None:
    q = subparsers.add_parser(
        "queue-check", help="the public check of a saved notebook as a Slurm job on the course's GPUs")
    q.add_argument("lab")
    q.add_argument("--submission", required=True, help="your saved notebook (.ipynb)")
    q.add_argument("--part", action="append", help="check only this part (repeatable)")
    q.add_argument("--queue-config", metavar="FILE",
                   help=f"the queue's settings (default: ${CONFIG_ENV}, else {SYSTEM_CONFIG})")
    q.add_argument("--no-wait", action="store_true", help="return once the job is queued")
    q.set_defaults(func=cmd_queue_check)

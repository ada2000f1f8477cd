"""The class tools' subcommands: ``batch`` (every submission of a lab, on this host's GPUs or
through Slurm), ``collect`` (a Slurm run's results) and ``gradebook`` (one table for the class)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

from .. import spec
from . import batch, gradebook, slurm



def _install_signal_handlers() -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    return lambda: [signal.signal(s, h) for s, h in old.items()]


def cmd_batch(args) -> int:
    if args.lab not in spec.lab_names():
        print(f"error: no lab {args.lab!r}; labs: {', '.join(spec.lab_names())}", file=sys.stderr)
        return 2
    try:
        subs = batch.discover(args.lab, args.submissions)
        batch.selected_parts(args.lab, args.part)
    except (FileNotFoundError, KeyError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if not subs:
        print(f"error: no submissions of {args.lab} under {args.submissions} (looked for "
              f"submitted/<student>/{args.lab}/ and <student>.ipynb)", file=sys.stderr)
        return 2
    results_dir = os.path.abspath(args.out)
    if args.resume:
        why = batch.resume_seed_problem(results_dir, args.lab)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
    if not args.public and not os.environ.get(batch.SECRET_ENV):
        print(f"warning: {batch.PUBLIC_SEED_WARNING}", file=sys.stderr, flush=True)
    if args.slurm:
        return slurm.cmd_batch_slurm(args, subs, results_dir)
    gpus = batch.visible_gpus() if args.gpus is None else [g for g in args.gpus.split(",") if g.strip()]
    slots = batch.make_slots(gpus, args.cpu_workers)
    opts = batch.Options(args.lab, results_dir, args.part, args.public, gpu=bool(gpus),
                   split=any(s.queues == ("cpu",) for s in slots), hide=(os.path.abspath(args.submissions),))
    os.makedirs(opts.lab_dir, exist_ok=True)
    todo, done = batch.plan(subs, opts, args.resume)
    n_gpu, n_cpu = len(gpus), sum(s.queues == ("cpu",) for s in slots)
    print(f"{args.lab}: {len(subs)} submissions under {args.submissions}; "
          + (f"{len(done)} already graded and unchanged (--resume), " if args.resume else "")
          + f"{len(todo)} to grade on {n_gpu} GPU worker(s) "
          + (f"({', '.join(gpus)}) " if gpus else "") + f"and {n_cpu} CPU worker(s); results in {opts.lab_dir}",
          flush=True)
    progress = batch.Progress(args.lab, len(subs), done=len(done), errors=sum(batch.has_grading_errors(s) for s in done))
    restore = _install_signal_handlers()
    try:
        batch.run_batch(subs, opts, slots, resume=args.resume, progress=progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"\ninterrupted: the running graders were stopped; {progress.done} of {len(subs)} students "
              f"have results; rerun with --resume to grade the rest", file=sys.stderr)
        return 130
    finally:
        restore()
    progress.close()
    summary = batch.write_summary(results_dir, args.lab)
    st = batch.lab_statuses(results_dir, args.lab)
    machine = [s.student for s in subs if batch.has_machine_failures(st.get(s.student, {}))]
    not_finished = [s.student for s in subs if st.get(s.student, {}).get("state") != batch.DONE
                    and s.student not in machine]
    print(f"{args.lab}: {len(subs) - len(not_finished) - len(machine)}/{len(subs)} graded in "
          f"{batch.fmt_s(time.monotonic() - progress.start)}; "
          f"{len(summary['grading_errors'])} with grading errors"
          f"{': ' + ', '.join(summary['grading_errors']) if summary['grading_errors'] else ''}; "
          + (f"{len(machine)} with machine failures (infrastructure): {', '.join(machine)}; " if machine else "")
          + f"summary in {os.path.join(opts.lab_dir, 'summary.json')}")
    if not_finished:
        print(f"grading did not finish for: {', '.join(not_finished)} (rerun with --resume)", file=sys.stderr)
    if machine:
        print(f"the grading machine failed (not the students' code) for: {', '.join(machine)}; their reports say "
              f"what failed: fix it and rerun with --resume", file=sys.stderr)
    return 1 if not_finished or machine else 0


def register(subparsers) -> None:
    b = subparsers.add_parser("batch", help="grade every submission of a lab (all GPUs of this host, or Slurm)",
                              description="Grade every submission under SUBMISSIONS (nbgrader's submitted/"
                                          "<student>/<lab>/ or a flat folder of <student>.ipynb).")
    b.add_argument("lab")
    b.add_argument("submissions", metavar="SUBMISSIONS_DIR")
    b.add_argument("--out", required=True, metavar="RESULTS_DIR", help="results go to RESULTS_DIR/<lab>/<student>/")
    b.add_argument("--resume", action="store_true",
                   help="keep results whose notebook, thresholds version and options are unchanged; the "
                        "seed must be the one the results were graded with (set GRADER_SECRET_SEED again)")
    b.add_argument("--part", action="append", help="grade only this part (repeatable; passed to check)")
    b.add_argument("--public", action="store_true", help="public cases only (passed to check)")
    b.add_argument("--gpus", help="comma-separated GPU ids to use (default: CUDA_VISIBLE_DEVICES or all; '' for none)")
    b.add_argument("--cpu-workers", type=int,
                   help="workers for CPU parts (default: one per core not taken by a GPU worker)")
    slurm.add_batch_options(b)
    b.set_defaults(func=cmd_batch)
    slurm.register(subparsers)
    gradebook.register(subparsers)

"""Command line: ``python -m grader check [LAB|all] [--submission PATH] [--json FILE]
[--gradescope FILE]`` grades a lab (by default the reference solutions of every lab) on
this machine. ``python -m grader generate`` regenerates the student versions."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import hardware, inputs, report, run, spec


def cmd_check(args) -> int:
    labs = spec.lab_names() if args.lab == "all" else [args.lab]
    for lab in labs:
        if lab not in spec.lab_names():
            print(f"error: no lab {lab!r}; labs: {', '.join(spec.lab_names())}", file=sys.stderr)
            return 2
    if args.submission and len(labs) > 1:
        print("error: --submission grades one lab: name it (e.g. check lab1_roofline --submission ...)",
              file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else inputs.run_seed()
    device = hardware.detect()
    if device.present:
        print(f"GPU: {device.driver_name}; graded with {device.row_note}; track {device.track}")
    else:
        print(f"No GPU ({device.reason}): CPU parts are graded, GPU parts are skipped.")
    print(f"Submission: {args.submission or 'reference solutions (solutions/)'}; seed "
          f"{'secret' if seed != inputs.PUBLIC_SEED else 'public'}")
    results = []
    for lab in labs:
        results += run.check_lab(lab, args.submission, seed, device, parts=args.part,
                                 public_only=args.public)
    print(report.format_table(results))
    rep = report.Report(results, run.device_facts(device), seed,
                        os.path.abspath(args.submission) if args.submission else "solutions")
    if args.json:
        rep.write_json(args.json)
        print(f"wrote {args.json}")
    if args.gradescope:
        report.write_gradescope(rep, args.gradescope)
        print(f"wrote {args.gradescope}")
    bad = [r for r in results if r.verdict in (report.FAILED, report.ERROR)]
    return 1 if (bad and args.strict) else 0


def cmd_generate(args) -> int:
    """nbgrader generate_assignment for every lab (or the one named), into assignments/."""
    labs = spec.lab_names() if args.lab == "all" else [args.lab]
    root = run.sandbox.REPO_ROOT
    for lab in labs:
        print(f"generating assignments/{lab} from solutions/{lab} ...")
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", lab, "--force",
                               "--CourseDirectory.root=" + root], cwd=root)
        if proc.returncode:
            return proc.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grader", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="grade a lab on this machine")
    c.add_argument("lab", nargs="?", default="all", help="lab folder name, or 'all' (default)")
    c.add_argument("--submission", help="a student's notebook, or a folder holding it")
    c.add_argument("--part", action="append", help="grade only this part (repeatable)")
    c.add_argument("--json", help="write the full report (schema in grader/report.py) here")
    c.add_argument("--gradescope", help="write Gradescope's results.json here")
    c.add_argument("--seed", type=int, help="override the input seed (default: GRADER_SECRET_SEED, else public)")
    c.add_argument("--public", action="store_true", help="public cases only (what students see)")
    c.add_argument("--strict", action="store_true", help="exit 1 when any part fails or errs")
    c.set_defaults(func=cmd_check)
    g = sub.add_parser("generate", help="regenerate assignments/ from solutions/ with nbgrader")
    g.add_argument("lab", nargs="?", default="all")
    g.set_defaults(func=cmd_generate)
    args = ap.parse_args(argv)
    return args.func(args)

"""Command line: ``python -m grader check [LAB|all] [--submission PATH] [--json FILE]
[--gradescope FILE]`` grades a lab (by default the reference solutions of every lab) on
this machine. ``python -m grader generate`` regenerates the student versions;
``python -m grader compile LAB`` writes the generated code of a lab's kernels for reading."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

# Only light modules here: `python -m grader --help` must not import torch or TVM. The
# modules that do (inputs, run) are imported by the commands that use them.
from . import hardware, report, sandbox, spec


EXIT_NOT_GRADED = 4   # some part has the infrastructure verdict (2: a wrong command, 3: no jail here)


def cmd_check(args) -> int:
    from . import inputs, run
    labs = spec.lab_names() if args.lab == "all" else [args.lab]
    for lab in labs:
        if lab not in spec.lab_names():
            print(f"error: no lab {lab!r}; labs: {', '.join(spec.lab_names())}", file=sys.stderr)
            return 2
    if args.submission and len(labs) > 1:
        print("error: --submission grades one lab: name it (e.g. check lab1_roofline --submission ...)",
              file=sys.stderr)
        return 2
    seed = inputs.seed_of(args.seed) if args.seed is not None else inputs.run_seed()
    device = hardware.detect()
    if device.present:
        print(f"GPU: {device.driver_name}; graded with {device.row_note}; track {device.track}", flush=True)
    else:
        print(f"No GPU ({device.reason}): CPU parts are graded, GPU parts are skipped.", flush=True)
    # flushed: the lines of the children this command starts go to the same output, in order after these
    print(f"Submission: {args.submission or 'reference solutions (solutions/)'}; inputs {inputs.seed_label(seed)}",
          flush=True)
    outputs = [os.path.dirname(os.path.abspath(p)) for p in (args.json, args.gradescope) if p]
    try:                  # made now: a report folder that cannot be made fails before the grading, not after
        for folder in outputs:
            os.makedirs(folder, exist_ok=True)
    except OSError as e:
        print(f"error: cannot make the report's folder: {e}", file=sys.stderr)
        return 2
    outputs += [os.path.abspath(p) for p in (args.hide or [])]
    try:
        level = sandbox.require_isolation(args.unsafe_no_sandbox)
    except sandbox.IsolationUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    print(f"Student code runs in: {level}", flush=True)
    results, notes = [], []
    if len(labs) > 1 and args.jobs > 1:
        results, notes = _check_labs_in_parallel(labs, args, seed, device.present)
        labs = []
    for lab in labs:
        try:
            results += run.check_lab(lab, args.submission, seed, device, parts=args.part,
                                     public_only=args.public, notes=notes, hide=outputs,
                                     workers=args.workers, unsafe=args.unsafe_no_sandbox)
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        except Exception as e:  # noqa: BLE001 - a report is always written
            lab_spec = spec.load(lab)
            results += [report.PartResult(lab, p.id, p.title, 0.0, p.points, report.INFRASTRUCTURE,
                                          f"the grader failed on this lab: {type(e).__name__}: {e}", p.needs_gpu)
                        for p in lab_spec.parts if not args.part or p.id in args.part]
    print(report.format_table(results))
    for n in notes:
        print(f"  note: {n[:500]}")
    rep = report.Report(results, run.device_facts(device), inputs.seed_label(seed),
                        os.path.abspath(args.submission) if args.submission else "solutions", notes=notes)
    if args.json:
        rep.write_json(args.json)
        print(f"wrote {args.json}")
    if args.gradescope:
        report.write_gradescope(rep, args.gradescope)
        print(f"wrote {args.gradescope}")
    bad = [r for r in results if r.verdict in (report.FAILED, report.ERROR)]
    if report.not_graded(results):
        return EXIT_NOT_GRADED       # the machine failed: never a silent 0, whatever --strict says
    return 1 if (bad and args.strict) else 0


def _check_labs_in_parallel(labs: list[str], args, seed: int, gpu: bool):
    """One `grader check LAB` process per lab, ``args.jobs`` at a time. Their CPU parts run side by
    side; their GPU parts take turns (run.Harness holds a lock on the GPU while it grades). The
    seed goes to each through a pipe, never the command line (other users can read that)."""
    import tempfile
    import time

    from . import inputs, run
    from . import report as report_mod
    tmp = tempfile.mkdtemp(prefix="grader-all-")
    # The longest labs start first (their GPU parts' time limits stand for their length), so that
    # no long lab starts when the others are done and runs alone at the end.
    pending, running, done = sorted(labs, key=lambda lab: -_expected_length(lab, gpu)), {}, {}
    started: dict[str, float] = {}
    try:
        while pending or running:
            while pending and len(running) < args.jobs:
                lab = pending.pop(0)
                out = os.path.join(tmp, f"{lab}.json")
                r, w = os.pipe()
                os.write(w, inputs.handover(seed))
                os.close(w)
                env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET_SEED"}
                env["GRADER_SEED_FD"] = str(r)
                cmd = sandbox.trusted_command("cli", "check", lab, "--json", out, "--jobs", "1")
                cmd += ["--unsafe-no-sandbox"] if args.unsafe_no_sandbox else []
                cmd += [a for p in (args.part or []) for a in ("--part", p)] + (["--public"] if args.public else [])
                cmd += [a for h in (args.hide or []) for a in ("--hide", h)]
                cmd += ["--workers", str(args.workers or run.default_workers(min(args.jobs, len(labs))))]
                log = open(os.path.join(tmp, f"{lab}.log"), "w")
                running[lab] = (subprocess.Popen(cmd, env=env, pass_fds=(r,), stdout=log, stderr=subprocess.STDOUT), out, log)
                os.close(r)
                started[lab] = time.monotonic()
                print(f"[{lab}] started ({len(running)} running, {len(pending)} waiting)", flush=True)
            time.sleep(0.2)
            for lab, (proc, out, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[lab]
                try:
                    done[lab] = report_mod.load_json(out)
                except (OSError, ValueError) as e:
                    with open(os.path.join(tmp, f"{lab}.log")) as f:
                        tail = f.read()[-2000:]
                    done[lab] = {"results": [dict(lab=lab, part=p.id, title=p.title, points=0.0, max_points=p.points,
                                                  verdict=report.ERROR, message=f"grading {lab} failed ({e}): {tail}",
                                                  needs_gpu=p.needs_gpu) for p in spec.load(lab).parts
                                             if not args.part or p.id in args.part], "notes": []}
                got = sum(r["points"] for r in done[lab]["results"])
                total = sum(r["max_points"] for r in done[lab]["results"])
                print(f"[{lab}] done in {time.monotonic() - started[lab]:.0f} s: {got:.2f} / {total:g}", flush=True)
    finally:
        for proc, _, log in running.values():
            proc.kill()
            log.close()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    results = [report.PartResult(**{k: v for k, v in r.items()}) for lab in labs for r in done[lab]["results"]]
    notes = [n for lab in labs for n in done[lab].get("notes", [])]
    return results, notes


def _expected_length(lab: str, gpu: bool) -> float:
    """A lab's grading time, roughly: its GPU parts' time limits on a GPU (they hold the machine's
    GPU in turn), its CPU parts' elsewhere."""
    parts = spec.load(lab).parts
    return sum(p.timeout_s for p in parts if p.needs_gpu == gpu) + 1e-3 * len(parts)


def cmd_generate(args) -> int:
    """nbgrader generate_assignment for every lab (or the one named), into assignments/ only.
    nbgrader's gradebook is left alone (``--no-db``): a lab is registered there when the
    instructor releases it (``nbgrader generate_assignment <lab>``), so that ``nbgrader export``
    gives no student a 0 for a lab not handed out yet."""
    labs = spec.lab_names() if args.lab == "all" else [args.lab]
    root = sandbox.REPO_ROOT
    for lab in labs:
        print(f"generating assignments/{lab} from solutions/{lab} ...")
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", lab, "--force", "--no-db",
                               "--CourseDirectory.root=" + root], cwd=root)
        if proc.returncode:
            return proc.returncode
    return 0


def cmd_compile(args) -> int:
    """Compile a lab's kernels for every arch its build parts name, without a GPU, and write
    the CUDA source, PTX, cubin and SASS for reading. The notebook's cells run in the jail, as
    when grading (a notebook is someone's code, whoever runs this command)."""
    import shutil
    import tempfile

    from . import build, grading, inspect, remote, run, submission
    lab_spec = spec.load(args.lab)
    try:
        sandbox.require_isolation(args.unsafe_no_sandbox)
        nb = submission.find_notebook(args.submission or os.path.join(run.SOLUTIONS_DIR, args.lab), lab_spec.notebook)
    except (sandbox.IsolationUnavailable, submission.SubmissionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    tmp = tempfile.mkdtemp(prefix="grader-compile-")
    session = None
    try:
        mod = submission.write_module(nb, tmp)
        for p in mod.problems:
            print(f"note: {p}")
        session = sandbox.ChildSession(mod.path, unsafe=args.unsafe_no_sandbox)
        backend = remote.ChildBackend(session, mod.relocate)
        return _compile_all(args, lab_spec, remote.RemoteSubmission(backend), build, inspect, grading)
    finally:
        if session is not None:
            session.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _compile_all(args, lab_spec, module, build, inspect, grading) -> int:
    from . import dispatch
    os.makedirs(args.out, exist_ok=True)
    status = 0
    jobs = [(part, name, arch) for part in lab_spec.parts if part.kind == "build"
            for name in grading.builder_names(part.params) for arch in part.params["archs"]]
    for part, name, arch in jobs:
        stem = os.path.join(args.out, f"{name}.{arch}")
        try:
            kw = grading.builder_args(part.params)
            if kw.get("num_sms") == "arch":
                kw["num_sms"] = hardware.SPECS[hardware.TRACK_DEFAULT[arch]].sm_count
            art = build.compile_only(getattr(module, name)(**kw), arch, want_sass=True)
        except Exception as e:  # noqa: BLE001 - report and go on with the next kernel
            print(f"{name} for {arch}: FAILED: {str(e).splitlines()[0]}")
            status = 1
            continue
        for ext, data in (("cu", art.cuda_source), ("ptx", art.ptx), ("sass", art.sass), ("ptxas.log", art.ptxas_log)):
            with open(f"{stem}.{ext}", "w") as f:
                f.write(data)
        with open(f"{stem}.cubin", "wb") as f:
            f.write(art.cubin)
        texts = dict(inspect.launched_texts(art), **dispatch.check_data(lab_spec.lab, part))
        checks = inspect.check_all(part.mechanisms, texts)
        print(f"{name} for {arch}: {stem}.{{cu,ptx,cubin,sass}}" + "".join(f"\n    {c.message}" for c in checks))
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grader", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="grade a lab on this machine")
    c.add_argument("lab", nargs="?", default="all", help="lab folder name, or 'all' (default)")
    c.add_argument("--submission", help="a student's notebook, or a folder holding it")
    c.add_argument("--part", action="append", help="grade only this part (repeatable)")
    c.add_argument("--json", help="write the full report (schema in grader/report.py) here")
    c.add_argument("--gradescope", help="write Gradescope's results.json here")
    c.add_argument("--seed", metavar="SECRET",
                   help="the secret seed, any string; the same inputs and hidden cases as GRADER_SECRET_SEED "
                        "with that value (default: GRADER_SECRET_SEED, else the public seed). Other users of "
                        "this machine can read a command line: prefer the variable")
    c.add_argument("--public", action="store_true", help="public cases only (what students see)")
    c.add_argument("--strict", action="store_true", help="exit 1 when any part fails or errs")
    c.add_argument("--hide", action="append", metavar="DIR",
                   help="a folder the submission's code must not see (other students' work; repeatable)")
    c.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                   help="labs graded at once when grading several (GPU parts still take turns)")
    c.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="grade where the jail cannot be made (no user/mount namespaces): the students' code then "
                        "runs unisolated, and every part's report says so. Never for real grades")
    c.add_argument("--workers", type=int, default=None,
                   help="sandboxed children per lab for its untimed parts and kernel builds (default: one "
                        "per two cores, at most eight; one per four cores, at most four, per lab when "
                        "several labs are graded at once)")
    c.set_defaults(func=cmd_check)
    g = sub.add_parser("generate", help="regenerate assignments/ from solutions/ with nbgrader (writes assignments/ "
                                        "only; nbgrader's gradebook is left alone)")
    g.add_argument("lab", nargs="?", default="all")
    g.set_defaults(func=cmd_generate)
    k = sub.add_parser("compile", help="compile a lab's kernels for sm_90a/sm_100a (no GPU needed) and "
                                       "write CUDA, PTX, cubin and SASS")
    k.add_argument("lab")
    k.add_argument("--submission", help="a notebook (default: the reference solution)")
    k.add_argument("--out", default="build/kernels", help="output folder (default: build/kernels)")
    k.add_argument("--unsafe-no-sandbox", action="store_true", help="run the notebook without the jail")
    k.set_defaults(func=cmd_compile)
    from .edition import commands as edition  # python -m grader release DIR: the student edition
    edition.register(sub)
    from .classroom import commands as classroom  # a whole class: batch, collect, gradebook
    classroom.register(sub)
    from .classroom import queue  # python -m grader queue-check: the public check as a Slurm job on a GPU
    queue.register(sub)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.command == "check":
        from . import inputs
        inputs.restart_without_secret(argv)
        sandbox.protect_grader()
        import signal
        # A terminated grader (a batch stopped with SIGTERM) still stops its children and removes
        # its temporary folders: SystemExit runs the cleanup of every run in progress.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return args.func(args)

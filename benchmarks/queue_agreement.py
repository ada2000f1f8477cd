"""Does the queued public check (``python -m grader queue-check``) tell a student what the check
cells tell them? (GPU only.)

    python benchmarks/queue_agreement.py --lab lab2_tma --out DIR
    python benchmarks/queue_agreement.py --lab lab2_tma --out DIR --slurm-shim   # a GPU machine without Slurm

For every part of the lab, on the reference solution: the points and speed ratio of the
notebook's check cell (``grader.notebook.check``, as the notebook runs it on a GPU), and those of
the report that ``queue-check`` prints after its Slurm job ran ``grader check LAB --public`` on
the GPU. They agree when the points are equal and the ratios are within ``--tolerance`` (5%).

``--slurm-shim`` puts stand-ins for ``sbatch``, ``squeue`` and ``sacct`` first on PATH: ``sbatch``
runs the job script at once, on this machine, with its output where ``#SBATCH --output`` says.
What the job runs is the same; Slurm's scheduling is not exercised (the course's CI tests that,
on a one-node Slurm). Writes ``DIR/queue_agreement.json`` and ``DIR/queue_agreement.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REPORT_LINE = re.compile(r"^\s*\[(\w+)\s*\]\s+(\w+)/(\w+)\s+([\d.]+) / ([\d.]+)\s+(.*)$")
RATIO = re.compile(r"ratio to [^:]*: ([\d.]+)x")

SBATCH = """#!/bin/sh
# sbatch stand-in: run the job script now; its output where '#SBATCH --output=' says
for a; do script="$a"; done
out=$(sed -n 's/^#SBATCH --output=//p' "$script")
SLURM_JOB_ID=1 bash "$script" > "$out" 2>&1
echo 1
"""


def shim(folder: str) -> str:
    """A folder with sbatch, squeue and sacct stand-ins (see the module's text)."""
    os.makedirs(folder, exist_ok=True)
    for name, text in (("sbatch", SBATCH), ("squeue", "#!/bin/sh\nexit 0\n"),
                       ("sacct", "#!/bin/sh\necho COMPLETED\n")):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    return folder


def check_cells(lab: str, folder: str) -> dict[str, dict]:
    from speed_agreement import reference_module, via_check

    from grader import spec
    module = reference_module(lab, folder)
    out = {}
    for part in spec.load(lab).parts:
        t0 = time.monotonic()
        row = via_check(lab, part.id, vars(module))
        out[part.id] = {"points": row.get("points"), "ratio": row.get("ratio"), "verdict": row.get("verdict"),
                        "seconds": round(time.monotonic() - t0, 1)}
    return out


def queued(lab: str, work: str, use_shim: bool) -> tuple[dict[str, dict], str, float]:
    from grader import spec
    env = dict(os.environ)
    if use_shim:
        env["PATH"] = shim(os.path.join(work, "bin")) + os.pathsep + env["PATH"]
    python = sys.executable
    if os.environ.get("PYTHONPATH"):        # the job sets PYTHONPATH to the course: keep this one's too
        python = os.path.join(work, "python")
        with open(python, "w") as f:
            f.write(f"#!/bin/sh\nPYTHONPATH={os.environ['PYTHONPATH']}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
        os.chmod(python, 0o755)
    cfg = os.path.join(work, "queue.toml")
    with open(cfg, "w") as f:
        f.write(f'spool = "{os.path.join(work, "spool")}"\npython = "{python}"\npoll_s = 1\n')
    nb = os.path.join(ROOT, "solutions", lab, spec.load(lab).notebook)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", "queue-check", lab, "--submission", nb,
                           "--queue-config", cfg], capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    parts = {}
    for line in text.splitlines():
        m = REPORT_LINE.match(line)
        if m and m.group(2) == lab:
            r = RATIO.search(m.group(6))
            parts[m.group(3)] = {"points": float(m.group(4)), "ratio": float(r.group(1)) if r else None,
                                 "verdict": m.group(1).lower()}
    return parts, text, seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="lab2_tma")
    ap.add_argument("--out", required=True)
    ap.add_argument("--slurm-shim", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("needs a GPU: the check cells and the queued check run kernels", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="queue-agreement-")
    print(f"[{args.lab}] check cells ...", flush=True)
    cells = check_cells(args.lab, os.path.join(work, "module"))
    print(f"[{args.lab}] queued check ...", flush=True)
    queue, text, seconds = queued(args.lab, work, args.slurm_shim)
    rows, agree = [], True
    for part, c in cells.items():
        q = queue.get(part, {})
        same_points = q.get("points") is not None and abs(q["points"] - (c["points"] or 0)) < 1e-6
        ratio_ok = True
        if c["ratio"] or q.get("ratio"):
            ratio_ok = bool(c["ratio"] and q.get("ratio")) and abs(q["ratio"] / c["ratio"] - 1) <= args.tolerance
        agree &= same_points and ratio_ok
        rows.append({"part": part, "check_cell": c, "queued": q, "agree": same_points and ratio_ok})
    result = {"lab": args.lab, "gpu": torch.cuda.get_device_name(0), "slurm_shim": args.slurm_shim,
              "tolerance": args.tolerance, "queued_seconds": round(seconds, 1), "agree": agree, "parts": rows,
              "queued_output": text[-20000:]}
    with open(os.path.join(args.out, "queue_agreement.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# {args.lab}: queued public check against the check cells ({result['gpu']})", "",
             f"`python benchmarks/queue_agreement.py --lab {args.lab} --out DIR"
             + (" --slurm-shim`" if args.slurm_shim else "`"), "",
             "| part | check cell | queued | agree |", "|---|---|---|---|"]
    for r in rows:
        c, q = r["check_cell"], r["queued"]
        fmt = lambda d: f"{d.get('points')}" + (f" ({d['ratio']:.3f}x)" if d.get("ratio") else "")  # noqa: E731
        lines.append(f"| {r['part']} | {fmt(c)} | {fmt(q)} | {'yes' if r['agree'] else 'NO'} |")
    lines += ["", f"queued check: {seconds:.0f} s from submission to the printed report; "
              f"{'all parts agree' if agree else 'PARTS DISAGREE'} (points equal, ratios within "
              f"{args.tolerance:.0%})"]
    with open(os.path.join(args.out, "queue_agreement.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

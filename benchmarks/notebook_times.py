"""Run each lab's notebook top to bottom in a Jupyter kernel, as a student would, and record the
time of every cell.

    python benchmarks/notebook_times.py --lab all --out DIR
    python benchmarks/notebook_times.py --lab lab1_roofline --out DIR          # one lab
    python benchmarks/notebook_times.py --lab lab2_tma --lab lab3_layout_swizzle --out DIR
    python benchmarks/notebook_times.py --lab all --out DIR --no-final         # without the last cell

Each notebook (the reference, ``solutions/<lab>/<lab>.ipynb``, by default; ``--edition
assignments`` runs the student version) is copied into ``DIR/work/<lab>/`` and executed there with
nbclient, in a fresh kernel whose ``grader`` is this checkout's (PYTHONPATH), one cell at a time,
errors recorded and execution continued. Written to DIR:

- ``times.json``: the machine (cores, GPU), the commit, and per lab every cell's index, kind
  (``setup``, ``answer``, ``check``, ``graded``, ``grade-notebook`` for the last cell that grades the
  saved notebook, ``other``), part, first line, seconds and status (``ok``, ``error`` with the
  error's name and first line, or ``skipped`` when the cell says it needs a GPU);
- ``times.md``: the same as tables, with per-kind totals and the goals checked;
- ``executed/<lab>.ipynb``: the executed notebooks, outputs included, for reading.

Speed agreement: the last cell is run as ``grade_notebook(LAB, report_json=...)`` (the grader's
report is also written as JSON), and after the last cell the kernel is asked for its check cells'
verdicts (``grader.notebook.last_result``). Every part with a speed ratio is then listed with the
ratio its check cell printed next to the grader's for the same saved notebook, and the goal is
that they are within 5% of each other (on a GPU; without one neither ratio exists).

The exit status is 1 when any cell of any lab ended in an error, else 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The labs are the specs in grader/specs/ (read without importing the grader: the kernel does).
LABS = sorted(f[:-len(".toml")] for f in os.listdir(os.path.join(ROOT, "grader", "specs")) if f.endswith(".toml"))

# Goals for a whole notebook, in seconds: (lab, "cpu" or "gpu") -> limit. A lab without a row has
# only the goal that no cell ends in an error.
GOALS = {("lab1_roofline", "cpu"): 60.0, ("lab6_flash_attention", "gpu"): 300.0}
# A check cell of a CPU question and a graded cell should take under this, in seconds.
CELL_GOALS = {"graded": 1.0, "check-cpu": 1.0}
# The check cell's speed ratio and the grader's may differ by at most this fraction.
AGREEMENT = 0.05
GRADER_REPORT = "grader-report.json"
# Run in the notebook's kernel after its last cell: what its check cells found, part by part.
CHECK_RESULTS = """\
import json as _json
from grader import notebook as _notebook, spec as _spec
_found = {{}}
for _p in _spec.load({lab!r}).parts:
    _r = _notebook.last_result({lab!r}, _p.id)
    if _r is not None:
        _found[_p.id] = {{"verdict": _r.verdict, "points": _r.points, "ratio": (_r.measurements or {{}}).get("ratio")}}
with open("check-results.json", "w") as _f:
    _json.dump(_found, _f)
"""

# What a cell prints when it did nothing for want of a GPU (check cells, and the labs' GPU-only cells).
SKIP_MARKS = ("[SKIP]", "skipped, this part needs a GPU", "no GPU here")


def source(cell) -> str:
    s = cell.get("source", "")
    return s if isinstance(s, str) else "".join(s)


def classify(cell) -> tuple[str, str | None]:
    """(kind, part) of a notebook cell."""
    if cell.get("cell_type") != "code":
        return "markdown", None
    meta = cell.get("metadata", {}).get("nbgrader", {})
    text = source(cell)
    if meta.get("grade"):
        gid = meta.get("grade_id", "")
        return "graded", gid[len("test_"):] if gid.startswith("test_") else gid
    if meta.get("solution"):
        return "answer", meta.get("grade_id")
    if text.lstrip().startswith("grade_notebook("):
        return "grade-notebook", None
    if text.lstrip().startswith("check("):
        try:
            part = text.split(",")[1].strip().strip("\"'")
        except IndexError:
            part = None
        return "check", part
    if meta.get("grade_id") == "setup" or "from grader.notebook import" in text:
        return "setup", None
    return "other", None


def output_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", "") if isinstance(out.get("text"), str) else "".join(out["text"]))
        elif out.get("output_type") in ("execute_result", "display_data"):
            t = out.get("data", {}).get("text/plain", "")
            parts.append(t if isinstance(t, str) else "".join(t))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(parts)


def status_of(cell) -> tuple[str, str]:
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        e = errors[0]
        first = (str(e.get("evalue", "")).strip().splitlines() or [""])[0]
        return "error", f"{e.get('ename')}: {first[:200]}"
    text = output_text(cell)
    if any(m in text for m in SKIP_MARKS):
        return "skipped", "needs a GPU"
    return "ok", ""


def part_needs_gpu(lab: str) -> dict:
    sys.path.insert(0, ROOT)
    try:
        from grader import spec
        return {p.id: p.needs_gpu for p in spec.load(lab).parts}
    except Exception:  # noqa: BLE001 - the table still comes out without this column
        return {}
    finally:
        sys.path.remove(ROOT)


def run_lab(lab: str, out: str, src: str, timeout: int, final: bool, kernel: str, edition: str = "") -> dict:
    """Run the notebook ``src`` top to bottom in a copy under ``out/work/<lab>/``; every cell's time."""
    import nbformat
    from nbclient import NotebookClient

    work = os.path.join(out, "work", lab)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    path = os.path.join(work, f"{lab}.ipynb")
    shutil.copy(src, path)
    nb = nbformat.read(path, as_version=4)
    if not final:
        nb.cells = [c for c in nb.cells if classify(c)[0] != "grade-notebook"]
    for c in nb.cells:   # the grader's report kept as JSON, for the speed agreement
        if classify(c)[0] == "grade-notebook" and "report_json" not in source(c):
            c.source = source(c).replace(f'grade_notebook("{lab}")', f'grade_notebook("{lab}", report_json="{GRADER_REPORT}")', 1)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=True,
                            resources={"metadata": {"path": work}})
    cells = []
    t_start = time.perf_counter()
    with client.setup_kernel(cwd=work):
        t_kernel = time.perf_counter() - t_start
        for i, cell in enumerate(nb.cells):
            kind, part = classify(cell)
            if kind == "markdown":
                continue
            t0 = time.perf_counter()
            try:
                client.execute_cell(cell, i)
            except Exception as e:  # noqa: BLE001 - a timeout or a dead kernel: record it, stop
                cells.append(_row(i, cell, kind, part, time.perf_counter() - t0, "error",
                                  f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"))
                break
            status, why = status_of(cell)
            if kind == "grade-notebook" and status == "skipped":   # its report lists skipped parts: it ran
                status, why = "ok", ""
            cells.append(_row(i, cell, kind, part, time.perf_counter() - t0, status, why))
        total = time.perf_counter() - t_start
        try:     # not a cell of the notebook: not timed, not saved
            nb.cells.append(nbformat.v4.new_code_cell(CHECK_RESULTS.format(lab=lab)))
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        except Exception as e:  # noqa: BLE001 - the timings stand without it
            print(f"[{lab}] could not read the check cells' results: {type(e).__name__}: {e}", flush=True)
        finally:
            if nb.cells and "check-results.json" in source(nb.cells[-1]):
                nb.cells.pop()
    os.makedirs(os.path.join(out, "executed"), exist_ok=True)
    nbformat.write(nb, os.path.join(out, "executed", f"{lab}.ipynb"))
    gpu_parts = part_needs_gpu(lab)
    for c in cells:
        if c["kind"] == "check" and c["part"] in gpu_parts:
            c["needs_gpu"] = gpu_parts[c["part"]]
    return {"lab": lab, "edition": edition, "kernel_start_s": round(t_kernel, 3), "total_s": round(total, 3),
            "cells": cells, "speed": agreement(work)}


def agreement(work: str) -> list[dict]:
    """Per part with a speed ratio: the check cell's ratio and the grader's for the saved notebook."""
    try:
        with open(os.path.join(work, "check-results.json")) as f:
            checks = json.load(f)
    except (OSError, ValueError):
        checks = {}
    try:
        with open(os.path.join(work, GRADER_REPORT)) as f:
            graded = {r["part"]: r for r in json.load(f)["results"]}
    except (OSError, ValueError, KeyError, TypeError):
        graded = {}
    rows = []
    for part in sorted(set(checks) | set(graded)):
        c = (checks.get(part) or {}).get("ratio")
        g = ((graded.get(part) or {}).get("measurements") or {}).get("ratio")
        if c is None and g is None:
            continue
        diff = abs(c - g) / g if c is not None and g else None
        rows.append({"part": part, "check": c, "grader": g, "diff": None if diff is None else round(diff, 4),
                     "check_points": (checks.get(part) or {}).get("points"),
                     "grader_points": (graded.get(part) or {}).get("points")})
    return rows


def _row(i, cell, kind, part, seconds, status, why) -> dict:
    first = next((ln for ln in source(cell).splitlines() if ln.strip()), "")
    return {"index": i, "kind": kind, "part": part, "first_line": first[:90], "seconds": round(seconds, 3),
            "status": status, "why": why}


def machine() -> dict:
    info = {"host": platform.node(), "cores": os.cpu_count(), "python": platform.python_version(),
            "when": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
        info["commit"] = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                        text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["commit"] = ""
    try:
        import torch
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        info["gpu"] = None
    return info


def summary(lab_run: dict) -> dict:
    by_kind: dict[str, float] = {}
    for c in lab_run["cells"]:
        by_kind[c["kind"]] = by_kind.get(c["kind"], 0.0) + c["seconds"]
    errors = [c for c in lab_run["cells"] if c["status"] == "error"]
    final = sum(c["seconds"] for c in lab_run["cells"] if c["kind"] == "grade-notebook")
    return {"by_kind": {k: round(v, 3) for k, v in by_kind.items()}, "errors": len(errors),
            "without_final_s": round(lab_run["total_s"] - final, 3), "final_s": round(final, 3)}


def goals(lab_run: dict, gpu: bool) -> list[str]:
    """Each goal as a line: 'met' or 'NOT met', with the numbers."""
    lines = []
    s = summary(lab_run)
    lines.append(f"no error cell: {'met' if not s['errors'] else 'NOT met'} ({s['errors']} error cells)")
    limit = GOALS.get((lab_run["lab"], "gpu" if gpu else "cpu"))
    if limit is not None:
        t = lab_run["total_s"]
        lines.append(f"top to bottom <= {limit:g} s: {'met' if t <= limit else 'NOT met'} ({t:.1f} s, "
                     f"{s['without_final_s']:.1f} s without the last cell)")
    graded = [c["seconds"] for c in lab_run["cells"] if c["kind"] == "graded"]
    if graded:
        worst = max(graded)
        lines.append(f"every graded cell < {CELL_GOALS['graded']:g} s: "
                     f"{'met' if worst < CELL_GOALS['graded'] else 'NOT met'} (slowest {worst:.2f} s)")
    speed = lab_run.get("speed") or []
    if speed:
        apart = [r for r in speed if r["diff"] is None or r["diff"] > AGREEMENT]
        lines.append(f"check cells' speed ratios within {AGREEMENT:.0%} of the grader's: "
                     f"{'met' if not apart else 'NOT met'} ({len(speed) - len(apart)} of {len(speed)} parts)")
    cpu_checks = [c["seconds"] for c in lab_run["cells"] if c["kind"] == "check" and c.get("needs_gpu") is False
                  and not _is_build(lab_run["lab"], c["part"])]
    if cpu_checks:
        worst = max(cpu_checks)
        lines.append(f"every check of a CPU question (no kernel to build) < {CELL_GOALS['check-cpu']:g} s: "
                     f"{'met' if worst < CELL_GOALS['check-cpu'] else 'NOT met'} (slowest {worst:.2f} s)")
    return lines


def _is_build(lab: str, part: str | None) -> bool:
    """Parts that compile kernels (build parts, SASS checks; no GPU needed): their time is their
    kernels' builds, not a CPU question's."""
    sys.path.insert(0, ROOT)
    try:
        from grader import spec
        p = spec.load(lab).part(part) if part is not None else None
        return p is not None and (p.kind == "build" or "builder" in p.params or "builders" in p.params)
    except Exception:  # noqa: BLE001
        return False
    finally:
        sys.path.remove(ROOT)


def markdown(data: dict) -> str:
    m = data["machine"]
    gpu = bool(m.get("gpu"))
    lines = ["# Notebook cell times", "",
             f"Host {m.get('host')} ({m.get('cores')} cores), GPU: {m.get('gpu') or 'none'}; commit "
             f"{m.get('commit')}; {m.get('when')}. Command: `{data['command']}`.", ""]
    for run in data["labs"]:
        s = summary(run)
        lines += [f"## {run['lab']} ({run['edition']})", "",
                  f"Total {run['total_s']:.1f} s top to bottom (kernel start {run['kernel_start_s']:.1f} s; "
                  f"{s['without_final_s']:.1f} s without the last cell, which grades the saved notebook: "
                  f"{s['final_s']:.1f} s). By kind: "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(s["by_kind"].items(), key=lambda kv: -kv[1]))
                  + ".", ""]
        lines += [f"- {g}" for g in goals(run, gpu)] + [""]
        if run.get("speed"):
            lines += ["| speed part | check cell ratio | grader ratio | apart | points: check, grader |",
                      "|---|---:|---:|---:|---|"]
            for r in run["speed"]:
                fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
                apart = "-" if r["diff"] is None else f"{r['diff']:.1%}"
                lines.append(f"| {r['part']} | {fmt(r['check'])} | {fmt(r['grader'])} | {apart} | "
                             f"{r['check_points']}, {r['grader_points']} |")
            lines.append("")
        lines += ["| cell | kind | part | seconds | status | first line |", "|---:|---|---|---:|---|---|"]
        for c in run["cells"]:
            status = c["status"] + (f": {c['why']}" if c["why"] and c["status"] == "error" else "")
            first = c["first_line"].replace("|", "\\|")
            lines.append(f"| {c['index']} | {c['kind']} | {c['part'] or ''} | {c['seconds']:.2f} | {status} | "
                         f"`{first}` |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", action="append", required=True, help="a lab folder name, or 'all' (repeatable)")
    ap.add_argument("--out", required=True, help="folder for times.json, times.md and the executed notebooks")
    ap.add_argument("--edition", choices=["solutions", "assignments"], default="solutions",
                    help="the reference notebooks (default) or the student versions")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds one cell may take (default 1800)")
    ap.add_argument("--no-final", action="store_true", help="leave out the last cell (grading the saved notebook)")
    ap.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    args = ap.parse_args(argv)
    labs = LABS if "all" in args.lab else args.lab
    unknown = [lab for lab in labs if lab not in LABS]
    if unknown:
        ap.error(f"no lab {unknown[0]!r}; labs: {', '.join(LABS)}")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    # The kernel imports this checkout's grader and draws without a display.
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.pop("GRADER_SECRET_SEED", None)
    data = {"machine": machine(), "command": "python benchmarks/notebook_times.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "labs": []}
    for lab in labs:
        print(f"[{lab}] running ...", flush=True)
        src = os.path.join(ROOT, args.edition, lab, f"{lab}.ipynb")
        run = run_lab(lab, out, src, args.timeout, not args.no_final, args.kernel, args.edition)
        data["labs"].append(run)
        s = summary(run)
        print(f"[{lab}] {run['total_s']:.1f} s, {s['errors']} error cell(s)", flush=True)
        with open(os.path.join(out, "times.json"), "w") as f:     # written after every lab
            json.dump(data, f, indent=1)
        with open(os.path.join(out, "times.md"), "w") as f:
            f.write(markdown(data))
    print(markdown(data))
    return 1 if any(summary(r)["errors"] for r in data["labs"]) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Do a notebook's speed check and the grader's speed part agree? (GPU only.)

    python benchmarks/speed_agreement.py --out DIR                      # every lab's speed parts
    python benchmarks/speed_agreement.py --lab lab2_tma --part e_speed --repeat 5 --out DIR
    python benchmarks/speed_agreement.py --lab lab4_gemm --part s3_speed --paths check,grader --out DIR

(``benchmarks/notebook_times.py`` puts one check-cell ratio beside the grader's for every speed
part as it runs the notebooks; this script repeats a part to separate noise from a difference.)

For each speed part, on the reference solution, public inputs, ``--repeat`` times each:

- ``check``: the notebook's check cell, ``grader.notebook.check`` (kernels from
  ``compile_kernel``: the launch plan and PTX of the kernel, assembled and launched through the
  CUDA driver as the grader's harness does, build.local_kernel);
- ``grader``: ``python -m grader check LAB --part PART --public`` (the jailed child lowers the
  kernel, the GPU harness assembles, launches and times it);
- ``executable``: the path the notebooks' check cells took before (``tvm.compile``'s Executable
  called directly, which looks ``main`` up again at every call), through the same runner and
  timing code, to show what the difference was;

and, per kernel, the host time of one launch through the Executable and through the loaded
library's function (a launch that takes longer on the host than the L2 flush before it takes
on the GPU is counted in the kernel's time). Writes ``DIR/speed_agreement.json`` and
``DIR/speed_agreement.md``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from grader import spec  # noqa: E402

LABS = spec.lab_names()
PATHS = ("check", "grader", "executable")


def speed_parts(labs: list[str]) -> list[tuple[str, str]]:
    """The parts graded on a speed ratio (a threshold table), lab by lab."""
    return [(lab, p.id) for lab in labs for p in spec.load(lab).parts if p.thresholds]


def reference_module(lab: str, folder: str):
    import importlib.util

    from grader import spec, submission
    nb = os.path.join(ROOT, "solutions", lab, spec.load(lab).notebook)
    written = submission.write_module(nb, folder)
    mod_spec = importlib.util.spec_from_file_location(f"reference_{lab}", getattr(written, "path", written))
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def via_check(lab: str, part: str, namespace: dict) -> dict:
    from grader import notebook
    try:
        notebook.check(lab, part, namespace)
    except notebook.CheckFailed:
        pass
    return _row(notebook.last_result(lab, part))


def via_executable(lab: str, part: str, namespace: dict) -> dict:
    """The former notebook path: the runner and timing code, with tvm.compile's Executable."""
    import types

    from grader import build, hardware, inputs, runners, spec
    from grader.context import Context
    lab_spec = spec.load(lab)
    ctx = Context(lab_spec, lab_spec.part(part), inputs.PUBLIC_SEED, hardware.detect(), public_only=True)
    env = runners.Env(lower=lambda built: build.lower(built))
    return _row(ctx.to_result(runners.kernel_part(types.SimpleNamespace(**namespace), ctx, env)))


def via_grader(lab: str, part: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "report.json")
        env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET_SEED"}
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.run([sys.executable, "-m", "grader", "check", lab, "--part", part, "--public",
                               "--json", out], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        try:
            with open(out) as f:
                rows = [r for r in json.load(f)["results"] if r["part"] == part]
        except (OSError, ValueError, KeyError):
            rows = []
        if not rows:
            return {"verdict": "error", "message": (proc.stdout + proc.stderr)[-2000:], "ratio": None}
        from grader import report
        return _row(report.PartResult(**rows[0]))


def _row(res) -> dict:
    m = res.measurements or {}
    return {"verdict": res.verdict, "points": res.points, "max_points": res.max_points, "ratio": m.get("ratio"),
            "trials": m.get("trials"), "message": res.message}


def launch_overhead(lab: str, part: str, namespace: dict, calls: int = 2000) -> dict:
    """Host microseconds per launch: the Executable called directly, and the loaded library's
    ``main`` (what the grader and the check cells call), on the part's first shape."""
    import torch

    from grader import build, hardware, inputs, notebook, problems, runners, spec
    from grader.context import Context
    lab_spec = spec.load(lab)
    ctx = Context(lab_spec, lab_spec.part(part), inputs.PUBLIC_SEED, hardware.detect(), public_only=True)
    p = ctx.part.params
    prob = problems.get(p["problem"])
    shape = prob.shape(p["shapes"][0])
    builder = namespace[runners.speed_builder(p, ctx)]
    prim = builder(*prob.builder_args(shape))
    ins = prob.make_inputs(lab, part, shape, 0, 0, "cuda")
    tensors = {**ins, **prob.make_outputs(shape, "cuda")}
    args = prob.args(tensors, {**prob.draw_scalars(lab, part, 0, 0), **p.get("scalars", {})})
    out = {}
    for name, fn in (("executable", build.lower(prim)[0]), ("loaded", notebook.compile_kernel(prim))):
        fn(*args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        host = (time.perf_counter() - t0) / calls
        torch.cuda.synchronize()
        out[name] = round(host * 1e6, 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", help="one lab; default: all")
    ap.add_argument("--part", help="one part of --lab; default: its speed parts")
    ap.add_argument("--paths", default=",".join(PATHS),
                    help="which of check, grader, executable to time (default: all three)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("needs a GPU: nothing to compare here")
        return 2
    paths = [p for p in args.paths.split(",") if p]
    if not set(paths) <= set(PATHS):
        ap.error(f"--paths: choose among {', '.join(PATHS)}")
    jobs = [(args.lab, args.part)] if args.lab and args.part else speed_parts([args.lab] if args.lab else LABS)
    os.makedirs(args.out, exist_ok=True)
    data = {"gpu": torch.cuda.get_device_name(0), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "parts": []}
    tmp = tempfile.mkdtemp(prefix="speed-agreement-")
    for lab, part in jobs:
        ns = vars(reference_module(lab, os.path.join(tmp, lab)))
        entry = {"lab": lab, "part": part, "check": [], "grader": [], "executable": []}
        for i in range(args.repeat):
            for name, fn in (("check", functools.partial(via_check, lab, part, ns)),
                             ("grader", functools.partial(via_grader, lab, part)),
                             ("executable", functools.partial(via_executable, lab, part, ns))):
                if name not in paths:
                    continue
                try:
                    row = fn()
                except Exception as e:  # noqa: BLE001 - one path failing must not hide the others
                    row = {"verdict": "error", "ratio": None, "message": f"{type(e).__name__}: {e}"[:2000]}
                entry[name].append(row)
                print(f"[{lab}/{part} {i + 1}/{args.repeat}] {name:<10} {row['verdict']:<8} ratio {row['ratio']}",
                      flush=True)
        try:
            if "executable" not in paths:
                raise RuntimeError("not measured (--paths)")
            entry["launch_host_us"] = launch_overhead(lab, part, ns)
        except Exception as e:  # noqa: BLE001
            entry["launch_host_us"] = {"executable": None, "loaded": None, "error": f"{type(e).__name__}: {e}"[:500]}
        print(f"[{lab}/{part}] host time per launch (us): {entry['launch_host_us']}", flush=True)
        data["parts"].append(entry)
        with open(os.path.join(args.out, "speed_agreement.json"), "w") as f:
            json.dump(data, f, indent=1)
    lines = [f"# Notebook check vs grader, speed parts ({data['gpu']}, {data['when']})", "",
             "| part | check (median ratio) | grader | former notebook path (Executable) | host us/launch: Executable, loaded |",
             "|---|---|---|---|---|"]
    for e in data["parts"]:
        def med(name):
            r = [x["ratio"] for x in e[name] if x["ratio"] is not None]
            return f"{statistics.median(r):.3f} ({', '.join(f'{x:.3f}' for x in r)})" if r else "-"
        lh = e["launch_host_us"]
        lines.append(f"| {e['lab']}/{e['part']} | {med('check')} | {med('grader')} | {med('executable')} | "
                     f"{lh['executable']}, {lh['loaded']} |")
    with open(os.path.join(args.out, "speed_agreement.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

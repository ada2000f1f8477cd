"""Every timed call of a speed part, with the GPU's clock and power beside it. (GPU only.)

    python benchmarks/ratio_trace.py --lab lab4_gemm --part s4_speed --out DIR
    python benchmarks/ratio_trace.py --lab lab4_gemm --part s3_speed --bursts 6 --burst-s 8 --idle-s 3 --out DIR

The reference kernel of the part (its first shape) and the part's baseline take turns, L2
overwritten before each call, as the grader times them, in ``--bursts`` bursts of ``--burst-s``
seconds with ``--idle-s`` seconds of idle GPU between them; with ``--cover both`` (the default)
the bursts take turns with and without the grader's cover (timing.CudaEventClock: a spin queued
before the start event, so that the host's time to queue the call is not counted). Meanwhile nvidia-smi is read about
every 0.1 s (SM clock, power, throttle reasons). Writes and prints ``DIR/ratio_trace.md``: per
second of each burst, the median ratio and clock, to show how long a state of the GPU lasts
and what the ratio does in it (``--raw`` adds ``DIR/ratio_trace.json``, every call and reading).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from speed_agreement import reference_module  # noqa: E402

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


def smi_reader(readings: list, stop: threading.Event, t0: float) -> None:
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if stop.is_set():
                break
            try:
                clock, power, reasons = [x.strip() for x in line.split(",")]
                readings.append((time.perf_counter() - t0, float(clock), float(power), reasons))
            except ValueError:
                continue
    finally:
        proc.terminate()


def summary(data: dict) -> str:
    """Per second of each burst: the median time ratio (baseline / kernel), both medians, and
    the median SM clock and power nvidia-smi read in that second."""
    covers = data.get("covers") or ["off"] * data["bursts"]
    lines = [f"# Speed ratio, second by second ({data['gpu']}, {data['when']})", "",
             f"{data['lab']}/{data['part']} at {data['shape']}: the reference kernel and {data['baseline']} "
             f"in turns, {data['bursts']} bursts of {data['burst_s']:g} s, {data['idle_s']:g} s idle between them. "
             f"Cover: the spin queued before the start event (timing.CudaEventClock).", "",
             "| burst | cover | second | ratio | kernel ms | baseline ms | SM MHz | W | calls |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    calls, readings = data["calls"], data["smi"]
    for b in range(data["bursts"]):
        mine = [c for c in calls if c[1] == b]
        if not mine:
            continue
        first = mine[0][0]
        for sec in range(int(data["burst_s"])):
            win = [c for c in mine if sec <= c[0] - first < sec + 1]
            k = [c[3] for c in win if c[2] == "kernel"]
            bl = [c[3] for c in win if c[2] != "kernel"]
            smi = [r for r in readings if first + sec <= r[0] < first + sec + 1]
            if not k or not bl:
                continue
            mhz = f"{statistics.median(r[1] for r in smi):.0f}" if smi else "-"
            watt = f"{statistics.median(r[2] for r in smi):.0f}" if smi else "-"
            lines.append(f"| {b} | {covers[b]} | {sec} | {statistics.median(bl) / statistics.median(k):.3f} | "
                         f"{statistics.median(k) * 1e3:.3f} | {statistics.median(bl) * 1e3:.3f} | {mhz} | {watt} | {len(k)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", required=True)
    ap.add_argument("--part", required=True)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--burst-s", type=float, default=8.0)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--cover", choices=("both", "on", "off"), default="both")
    ap.add_argument("--raw", action="store_true", help="also write every call and reading (megabytes)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("needs a GPU: nothing to trace here")
        return 2
    from grader import hardware, inputs, notebook, problems, runners, spec, timing
    from grader.context import Context
    lab_spec = spec.load(args.lab)
    ctx = Context(lab_spec, lab_spec.part(args.part), inputs.PUBLIC_SEED, hardware.detect(), public_only=True)
    p = ctx.part.params
    prob = problems.get(p["problem"])
    shape = prob.shape(p["shapes"][0])
    ns = vars(reference_module(args.lab, tempfile.mkdtemp(prefix="ratio-trace-")))
    kernel = notebook.compile_kernel(ns[runners.speed_builder(p, ctx)](*prob.builder_args(shape)))
    ins = prob.make_inputs(args.lab, args.part, shape, inputs.PUBLIC_SEED, 0, "cuda")
    tensors = {**ins, **prob.make_outputs(shape, "cuda")}
    scalars = {**prob.draw_scalars(args.lab, args.part, inputs.PUBLIC_SEED, 0), **p.get("scalars", {})}
    call_args = prob.args(tensors, scalars)
    base = prob.baseline(ins, scalars, shape)
    fns = {"kernel": lambda: kernel(*call_args), prob.baseline_name: base.fn}
    clocks = {"on": timing.CudaEventClock(), "off": timing.CudaEventClock(cover_cycles=0)}
    covers = ["on", "off"] if args.cover == "both" else [args.cover]
    flush = timing.L2Flusher(ctx.device.spec.l2_mib << 20)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    calls, readings, stop = [], [], threading.Event()
    t0 = time.perf_counter()
    reader = threading.Thread(target=smi_reader, args=(readings, stop, t0), daemon=True)
    reader.start()
    time.sleep(args.idle_s)
    for b in range(args.bursts):
        clock = clocks[covers[b % len(covers)]]
        start = time.perf_counter()
        while time.perf_counter() - start < args.burst_s:
            for name, fn in fns.items():
                flush()
                calls.append((time.perf_counter() - t0, b, name, clock.time_call(fn)))
        time.sleep(args.idle_s)
    stop.set()
    data = {"gpu": torch.cuda.get_device_name(0), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "lab": args.lab, "part": args.part, "shape": list(shape), "baseline": prob.baseline_name,
            "bursts": args.bursts, "covers": [covers[b % len(covers)] for b in range(args.bursts)],
            "burst_s": args.burst_s, "idle_s": args.idle_s,
            "calls": calls, "smi": readings}
    os.makedirs(args.out, exist_ok=True)
    if args.raw:
        with open(os.path.join(args.out, "ratio_trace.json"), "w") as f:
            json.dump(data, f)
    text = summary(data)
    with open(os.path.join(args.out, "ratio_trace.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

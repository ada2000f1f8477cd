#!/usr/bin/env python
"""Lab 6's reference Hopper kernels at long sequences, against SDPA's cuDNN and FLASH backends.

    python benchmarks/lab6/long_sequences.py --out DIR                 # about 2 minutes on an H200
    python benchmarks/lab6/long_sequences.py --out DIR --cpu-dry-run   # no GPU: compile only

The graded speed shapes stop at seq 8192 (a grading run must stay short); this script measures
the lengths the lab's goal names, 4096, 8192 and 16384, the same way: B = --batch, 32 query heads
over 8 KV heads, head dim 128, fp16, causal and not. For each step in --steps and each shape it
  * builds the solution notebook's hopper_attn_stepN (untraced: the graded kernel),
  * checks --rows sampled query rows of O and the LSE against grader.problems.attention_reference
    (float64), with the course's tolerance, O and LSE prefilled with NaN,
  * times the kernel, cuDNN SDPA and FLASH SDPA (FlashAttention-2) in the same process, each the
    median of --reps CUDA-event timings with L2 flushed before each call, in --rounds interleaved
    rounds (the median of the rounds is reported).
FLOPs: 4·B·Hq·Sq·Sk·D, visible pairs only when causal (grader.problems.attention_flops).
Writes DIR/long_sequences.json and prints a table. Exit status 0 only if every kernel was correct.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from reference_timelines import REPO, check, gpu_problem, log, notebook_kernels  # noqa: E402
from timeline_gpu_demo import median_ms, record_failure, start_traced_run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqs", type=int, nargs="*", default=[4096, 8192, 16384])
    ap.add_argument("--steps", type=int, nargs="*", default=[5])
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=400.0)
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args()
    torch, arch, props, summary = start_traced_run(args, log)
    from grader import build, problems
    B, HQ, HKV, D = args.batch, args.heads_q, args.heads_kv, 128
    summary["device"] = "no GPU: compiled for sm_90a" if props is None else f"{props.name}, {props.multi_processor_count} SMs"
    summary["rows"] = []
    hk = notebook_kernels()
    path = os.path.join(args.out, "long_sequences.json")
    all_ok = True
    for S in args.seqs:
        if props is not None:
            ins, O, LSE, rows, tols, flush = gpu_problem(torch, B, S, HQ, HKV, D, args.rows, seed=S)
        for causal in (False, True):
            shape = problems.ATTENTION.shape([B, S, S, HQ, HKV, D, causal])
            base = {"cudnn": problems._sdpa("CUDNN_ATTENTION", ins, shape),
                    "flash": problems._sdpa("FLASH_ATTENTION", ins, shape)} if props is not None else {}
            for step in args.steps:
                r = {"step": step, "seq": S, "causal": causal, "batch": B, "heads_q": HQ, "heads_kv": HKV}
                summary["rows"].append(r)
                try:
                    t = time.time()
                    func = getattr(hk, f"hopper_attn_step{step}")(B, S, S, HQ, HKV, D, causal)
                    if props is None:
                        build.compile_only(func, arch)
                        r["status"] = f"compiled for {arch}"
                        log(f"step {step} seq {S} causal={causal}: compiled ({time.time() - t:.1f} s)")
                        continue
                    ex, _ = build.lower(func)
                    O.fill_(float("nan"))
                    LSE.fill_(float("nan"))
                    ex(ins["Q"], ins["K"], ins["V"], O, LSE)
                    torch.cuda.synchronize()
                    ref = problems.attention_reference(ins, rows=rows, causal=causal)
                    r["check"] = check(O, LSE, ref, rows, tols, torch)
                    all_ok &= r["check"]["ok"]
                    fns = {"kernel": lambda: ex(ins["Q"], ins["K"], ins["V"], O, LSE), **base}
                    per = {k: [] for k in fns}
                    for _ in range(args.rounds):
                        for k, fn in fns.items():
                            per[k].append(median_ms(fn, torch, args.reps, flush))
                    flops = problems.attention_flops(shape)
                    r["ms"] = {k: statistics.median(v) for k, v in per.items()}
                    r["ms_rounds"] = per
                    r["tflops"] = {k: flops / v / 1e9 for k, v in r["ms"].items()}
                    r["ratio_cudnn"] = r["ms"]["cudnn"] / r["ms"]["kernel"]
                    r["ratio_flash"] = r["ms"]["flash"] / r["ms"]["kernel"]
                    r["status"] = "done" if r["check"]["ok"] else "WRONG"
                    log(f"step {step} seq {S:5d} {'causal' if causal else 'full  '}: correct={r['check']['ok']} "
                        f"kernel {r['tflops']['kernel']:.0f} TFLOP/s, cuDNN {r['tflops']['cudnn']:.0f}, "
                        f"FLASH {r['tflops']['flash']:.0f}: {r['ratio_cudnn']:.3f}x cuDNN, "
                        f"{r['ratio_flash']:.2f}x FLASH")
                except Exception as e:  # noqa: BLE001 - record, go on
                    all_ok = False
                    record_failure(r, e, f"step {step} seq {S} causal={causal}", log)
                with open(path, "w") as f:
                    json.dump(summary, f, indent=1, default=str)
        if props is not None:
            del ins, O, LSE, flush
            torch.cuda.empty_cache()
    summary["all_ok"] = all_ok
    with open(path, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    log(f"done; all correct: {all_ok}; {path} ({REPO})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Timelines of the reference Hopper kernels of Lab 5 (steps 5, 7 and 9) on an H100/H200.

    python benchmarks/lab5/reference_timelines.py --out DIR            # < 90 s on an H200
    python benchmarks/lab5/reference_timelines.py --out DIR --cpu-dry-run   # no GPU: compile only

The builders are the solution notebook's hopper_step5, hopper_step7 and hopper_step9 (loaded the
way hopper_gpu_check.py loads them); ``trace=True`` gives the same kernel with trace points
(grader.timeline, %clock stamps). For each step, at --size^3 (default 4096^3):
  * builds the untraced kernel(A, B, D) and the traced kernel(A, B, D, prof),
  * checks both against torch (fp32 reference A.float() @ B.float().T; D prefilled with NaN;
    pass when max |D - ref| <= 1e-2 * sqrt(K) / 8 * std(ref), as hopper_gpu_check.py),
  * times both (median of --reps CUDA-event timings, L2 flushed before each): the tracing overhead,
  * decodes the trace of one warm launch (the buffer zeroed before it).
Writes to DIR:
  timeline_step{5,7,9}.json   events of CTAs --ctas (cut after --tiles output tiles of each CTA,
                              to keep the files small) + meta: shape, times, overhead, checks,
                              decode info, and summarize() over ALL CTAs of the launch
  timeline_step{5,7,9}.png    those CTAs drawn with grader.timeline
  summary.json                everything above but the events
The lecture (lectures/lab5_gemm_pipeline/figures.py) draws from the JSON files once they are copied
to reports/h200/lab5/. Exit status 0 only if every kernel (traced and untraced) was correct.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, *[os.pardir] * 2))
NOTEBOOK = os.path.join(REPO, "solutions", "lab5_gemm_pipeline", "lab5_gemm_pipeline.ipynb")
sys.path[:0] = [HERE, REPO]

import numpy as np  # noqa: E402

from grader import timeline as tl  # noqa: E402

STEPS = [5, 7, 9]
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


from hopper_gpu_check import notebook_kernels  # noqa: E402  (the solution notebook's builders)
from timeline_gpu_demo import (build_traced_pair, median_ms, record_failure, save_png,  # noqa: E402
                               start_traced_run)


def check(D, ref, K, torch):
    err = (D.float() - ref).abs().max().item()
    tol = 1e-2 * math.sqrt(K) / 8 * ref.std().item()
    nans = int(torch.isnan(D).sum().item())
    return {"ok": bool(math.isfinite(err) and err <= tol and nans == 0),
            "max_abs_err": err if math.isfinite(err) else str(err), "tolerance": tol, "nan_count": nans}


def cut(events, ctas, tiles):
    """The events of ``ctas``, each CTA cut after the store of its ``tiles``-th output tile (the
    last store of its last row that starts before the epilogue of tile ``tiles + 1``; the whole
    CTA if it has no more tiles)."""
    kept, cuts = [], {}
    for c in ctas:
        ev = [e for e in events if e.cta == c]
        if not ev:
            continue
        last_row = max(e.group for e in ev)
        epi = sorted(e.start_ns for e in ev if e.group == last_row and e.kind == "epilogue" and e.stage == 0)
        t_cut = math.inf
        if len(epi) > tiles:
            t_cut = max([e.end_ns for e in ev if e.group == last_row and e.kind == "store"
                         and e.start_ns < epi[tiles]] or [epi[tiles]])
        cuts[c] = None if t_cut == math.inf else round(t_cut / 1e3, 3)
        kept += [e for e in ev if e.start_ns < t_cut]
    for e in kept:                                       # shorter JSON: 0.1 ns is plenty
        e.start_ns, e.end_ns = round(e.start_ns, 1), round(e.end_ns, 1)
    return kept, cuts


def build_all(hk, step, M, N, K, num_sms, arch):
    extra = () if step == 5 else (num_sms,)
    return build_traced_pair(getattr(hk, f"hopper_step{step}"), (M, N, K) + extra, arch)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--steps", type=int, nargs="*", default=STEPS)
    ap.add_argument("--ctas", type=int, nargs="*", default=[0, 1], help="CTAs kept in the JSON and drawn")
    ap.add_argument("--tiles", type=int, default=2, help="output tiles of each kept CTA kept in the JSON")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds before the script gives up (a hang)")
    ap.add_argument("--num-sms", type=int, default=132, help="SM count for --cpu-dry-run")
    ap.add_argument("--cpu-dry-run", action="store_true", help="no GPU: compile every kernel for sm_90a, run nothing")
    args = ap.parse_args()
    dry = args.cpu_dry_run
    torch, arch, props, summary = start_traced_run(args, log)
    import tvm
    M = N = K = args.size
    summary.update({"shape": {"M": M, "N": N, "K": K}, "steps": {}})
    if dry:
        num_sms = args.num_sms
        summary["device"] = f"no GPU: compiled for sm_90a, num_sms={num_sms}"
    else:
        num_sms = props.multi_processor_count
        summary["device"] = f"{props.name}, {num_sms} SMs"
    summary["num_sms"] = num_sms
    log("toolchain:", summary["toolchain"], "| tvm", summary["tvm"], "| torch", summary["torch"], "|", summary["device"])
    hk = notebook_kernels()

    def save():
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)

    if not dry:
        gen = torch.Generator(device="cuda").manual_seed(0)
        A = torch.randn(M, K, device="cuda", generator=gen).half()
        B = torch.randn(N, K, device="cuda", generator=gen).half()
        ref = A.float() @ B.float().T
        D = torch.empty(M, N, device="cuda", dtype=torch.float16)
        flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        summary["torch_matmul_ms"] = median_ms(lambda: torch.matmul(A, B.T), torch, args.reps, flush)

    all_ok = True
    for step in args.steps:
        r = summary["steps"][f"step{step}"] = {}
        try:
            kernels = build_all(hk, step, M, N, K, num_sms, arch)
            (ex0, _, info0), (ex1, _, info1) = kernels[False], kernels[True]
            r["untraced_build"], r["traced_build"] = info0, info1
            roles, length = info1["roles"], info1["buffer_len"]
            assert info0["trace_points_in_source"] == 0 and info1["trace_points_in_source"] > 0
            log(f"step {step}: built (untraced {info0['compile_s']} s, traced {info1['compile_s']} s), "
                f"rows {roles}, trace buffer {length * 8 / 2**20:.1f} MiB")
            if dry:
                r["status"] = "compiled"
                save()
                continue
            zeros = np.zeros(length, dtype=np.uint64)
            prof = tvm.runtime.tensor(zeros, device=tvm.cuda())
            D.fill_(float("nan"))
            ex0(A, B, D)
            torch.cuda.synchronize()
            r["untraced_check"] = check(D, ref, K, torch)
            D.fill_(float("nan"))
            ex1(A, B, D, prof)                           # warm-up launch, checked too
            torch.cuda.synchronize()
            r["traced_check"] = check(D, ref, K, torch)
            prof.copyfrom(zeros)
            D.fill_(float("nan"))
            ex1(A, B, D, prof)                           # the launch whose trace is kept
            torch.cuda.synchronize()
            r["traced_check_decoded_launch"] = check(D, ref, K, torch)
            raw = prof.numpy()
            ok = all(r[c]["ok"] for c in ("untraced_check", "traced_check", "traced_check_decoded_launch"))
            all_ok &= ok
            r["untraced_ms"] = median_ms(lambda: ex0(A, B, D), torch, args.reps, flush)
            r["traced_ms"] = median_ms(lambda: ex1(A, B, D, prof), torch, args.reps, flush)
            r["untraced_tflops"] = 2.0 * M * N * K / r["untraced_ms"] / 1e9
            r["ratio_to_torch"] = summary["torch_matmul_ms"] / r["untraced_ms"]
            r["overhead_pct"] = 100.0 * (r["traced_ms"] / r["untraced_ms"] - 1)
            log(f"step {step}: correct={ok} (max err untraced {r['untraced_check']['max_abs_err']}, traced "
                f"{r['traced_check_decoded_launch']['max_abs_err']}); untraced {r['untraced_ms']:.3f} ms "
                f"({r['untraced_tflops']:.0f} TFLOP/s), traced {r['traced_ms']:.3f} ms: {r['overhead_pct']:+.1f}%")
            events, dinfo = tl.decode(raw, roles, return_info=True)
            r["decode_info"] = dinfo.__dict__
            r["events_total"] = len(events)
            r["summary_by_role"] = tl.summarize(events)           # over all CTAs
            r["summary_kept_ctas"] = tl.summarize(events, ctas=args.ctas)
            kept, cuts = cut(events, args.ctas, args.tiles)
            r["kept"] = {"ctas": args.ctas, "tiles": args.tiles, "cut_us": cuts, "events": len(kept)}
            log(f"step {step}: {len(events)} events; {dinfo}; by role: {json.dumps(r['summary_by_role'])}")
            meta = {k: v for k, v in r.items()}
            meta.update(step=step, shape=summary["shape"], device=summary["device"], roles=roles,
                        torch_matmul_ms=summary["torch_matmul_ms"])
            tl.events_to_json(kept, os.path.join(args.out, f"timeline_step{step}.json"), **meta)
            save_png(kept, os.path.join(args.out, f"timeline_step{step}.png"),
                     f"hopper_step{step}, {M}x{N}x{K}, {summary['device']}: CTAs {', '.join(map(str, args.ctas))}", log)
            r["status"] = "done" if ok else "WRONG"
        except Exception as e:  # noqa: BLE001 - report, go on (a CUDA fault ends the run)
            all_ok = False
            if record_failure(r, e, f"step {step}", log) and not dry:
                save()
                break
        save()
    summary["all_ok"] = all_ok
    summary["wall_s"] = round(time.time() - T0, 1)
    save()
    log(f"done in {summary['wall_s']} s; all {'compiled' if dry else 'correct'}: {all_ok}; outputs in {args.out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

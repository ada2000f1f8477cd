#!/usr/bin/env python
"""Timelines of the reference Hopper attention kernels of Lab 6 (steps 4 and 5) on an H100/H200.

    python benchmarks/lab6/reference_timelines.py --out DIR               # < 90 s on an H200
    python benchmarks/lab6/reference_timelines.py --out DIR --cpu-dry-run # no GPU: compile only

The builders are the solution notebook's hopper_attn_step4 and hopper_attn_step5 (loaded the way
benchmarks/lab5/reference_timelines.py loads Lab 5's); ``trace=True`` gives the same
kernel with trace points (grader.timeline, %clock stamps; rows: producer, consumer 0, consumer 1).
At B = 4, seq_q = seq_k = --seq (default 4096), 32 query heads over 8 KV heads, head dim 128, for
each step, non-causal and causal:
  * builds the untraced kernel(Q, K, V, O, LSE) and the traced kernel(Q, K, V, O, LSE, prof),
  * checks both against grader.problems.attention_reference (float64) on --rows sampled query
    rows, with the course's tolerance (attention_tolerances); O and LSE prefilled with NaN,
  * times both (median of --reps CUDA-event timings, L2 flushed before each): the tracing overhead,
  * decodes the trace of one warm launch (the buffer zeroed before it), all of its CTAs (as
    grader.timeline.show does; a few seconds for 4096 CTAs).
Writes to DIR:
  timeline_attn_step{4,5}[_causal].json   events of CTAs --ctas, each cut after --turns turns of
                              its consumers (to keep the files small), + meta: shape, times,
                              overhead, checks, decode info, and summarize() over all CTAs
  timeline_attn_step{4,5}[_causal].png    those CTAs drawn with grader.timeline
  summary.json                everything above but the events
The lecture (lectures/lab6_flash_attention/figures.py) draws timeline_attn_step4.json once it is
copied to reports/h200/lab6/. Exit status 0 only if every kernel (traced and untraced) was correct.
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
NOTEBOOK = os.path.join(REPO, "solutions", "lab6_flash_attention", "lab6_flash_attention.ipynb")
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from grader import timeline as tl  # noqa: E402

STEPS = [4, 5]
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


sys.path.insert(0, os.path.join(REPO, "benchmarks", "lab5"))
from hopper_gpu_check import load_notebook  # noqa: E402
from timeline_gpu_demo import (build_traced_pair, median_ms, record_failure, save_png,  # noqa: E402
                               start_traced_run)


def notebook_kernels():
    """Lab 6's builders from the solution notebook."""
    return load_notebook(NOTEBOOK, "lab6_kernels")


def check(O, LSE, ref, rows, tols, torch):
    """The sampled rows of O [B, Sq, Hq, D] and LSE [B, Hq, Sq] against the float64 reference."""
    from grader import compare
    co = compare.compare(O.index_select(1, rows), ref["O"], tols["O"], "O")
    cl = compare.compare(LSE.index_select(2, rows), ref["LSE"], tols["LSE"], "LSE")
    return {"ok": bool(co.ok and cl.ok), "rows_checked": int(rows.numel()),
            "O": co.message, "LSE": cl.message,
            "max_abs_err_O": co.max_abs_err if math.isfinite(co.max_abs_err) else str(co.max_abs_err),
            "max_abs_err_LSE": cl.max_abs_err if math.isfinite(cl.max_abs_err) else str(cl.max_abs_err)}


def gpu_problem(torch, B, S, HQ, HKV, D, n_rows, seed):
    """Seeded fp16 Q [B, S, HQ, D], K and V [B, S, HKV, D] on the GPU, the outputs O and LSE, the
    sorted query rows checked, the course's tolerances for these inputs, and a 256 MiB buffer
    whose writes flush L2 between timed calls."""
    from grader import problems
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ins = {"Q": torch.randn(B, S, HQ, D, device="cuda", generator=gen).half(),
           "K": torch.randn(B, S, HKV, D, device="cuda", generator=gen).half(),
           "V": torch.randn(B, S, HKV, D, device="cuda", generator=gen).half()}
    O = torch.empty(B, S, HQ, D, device="cuda", dtype=torch.float16)
    LSE = torch.empty(B, HQ, S, device="cuda", dtype=torch.float32)
    rows = torch.randperm(S, generator=torch.Generator().manual_seed(1))[:n_rows].sort().values.to("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    return ins, O, LSE, rows, problems.attention_tolerances(ins, D), flush


def cut(events, ctas, turns):
    """The events of ``ctas``, each CTA cut at the end of the ``turns``-th MMA of its last row
    (consumer 1); the whole CTA if it makes no more turns."""
    kept, cuts = [], {}
    for c in ctas:
        ev = [e for e in events if e.cta == c]
        if not ev:
            continue
        last_row = max(e.group for e in ev)
        mma = sorted(e.end_ns for e in ev if e.group == last_row and e.kind == "mma")
        t_cut = mma[turns - 1] if len(mma) > turns else math.inf
        cuts[c] = None if t_cut == math.inf else round(t_cut / 1e3, 3)
        kept += [e for e in ev if e.start_ns <= t_cut]
    for e in kept:                                       # shorter JSON: 0.1 ns is plenty
        e.start_ns, e.end_ns = round(e.start_ns, 1), round(e.end_ns, 1)
    return kept, cuts


def build_pair(hk, step, shape, arch):
    pair = build_traced_pair(getattr(hk, f"hopper_attn_step{step}"), tuple(shape), arch)
    return {traced: (ex, info) for traced, (ex, _, info) in pair.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--steps", type=int, nargs="*", default=STEPS)
    ap.add_argument("--ctas", type=int, nargs="*", default=[0, 1], help="CTAs kept in the JSON and drawn")
    ap.add_argument("--turns", type=int, default=12, help="turns of each kept CTA's consumers kept in the JSON")
    ap.add_argument("--rows", type=int, default=256, help="query rows checked against the reference")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds before the script gives up (a hang)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="no GPU: compile every kernel for sm_90a, run nothing")
    args = ap.parse_args()
    dry = args.cpu_dry_run
    torch, arch, props, summary = start_traced_run(args, log)
    import tvm
    from grader import problems
    B, S, HQ, HKV, D = args.batch, args.seq, args.heads_q, args.heads_kv, 128
    summary.update({"shape": {"batch": B, "seq_q": S, "seq_k": S, "heads_q": HQ, "heads_kv": HKV, "head_dim": D},
                    "kernels": {}})
    summary["device"] = ("no GPU: compiled for sm_90a" if dry
                         else f"{props.name}, {props.multi_processor_count} SMs")
    log("toolchain:", summary["toolchain"], "| tvm", summary["tvm"], "| torch", summary["torch"], "|", summary["device"])
    hk = notebook_kernels()

    def save():
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)

    if not dry:
        ins, O, LSE, rows, tols, flush = gpu_problem(torch, B, S, HQ, HKV, D, args.rows, seed=0)
        refs = {}

        def run(ex, *extra):
            O.fill_(float("nan"))
            LSE.fill_(float("nan"))
            ex(ins["Q"], ins["K"], ins["V"], O, LSE, *extra)
            torch.cuda.synchronize()

    all_ok, fault = True, False
    for step in args.steps:
        for causal in (False, True):
            key = f"attn_step{step}" + ("_causal" if causal else "")
            shape = (B, S, S, HQ, HKV, D, causal)
            pshape = problems.ATTENTION.shape(list(shape))
            r = summary["kernels"][key] = {"step": step, "causal": causal}
            try:
                kernels = build_pair(hk, step, shape, arch)
                (ex0, info0), (ex1, info1) = kernels[False], kernels[True]
                r["untraced_build"], r["traced_build"] = info0, info1
                roles, length = info1["roles"], info1["buffer_len"]
                assert info0["trace_points_in_source"] == 0 and info1["trace_points_in_source"] > 0
                log(f"{key}: built (untraced {info0['compile_s']} s, traced {info1['compile_s']} s), "
                    f"rows {roles}, trace buffer {length * 8 / 2**20:.1f} MiB")
                if dry:
                    ok = not info0.get("spills") and not info1.get("spills")
                    all_ok &= ok
                    r["status"] = "compiled" if ok else "SPILLS"
                    log(f"{key}: ptxas (traced): {'; '.join(info1['ptxas'])}")
                    save()
                    continue
                if causal not in refs:
                    refs[causal] = problems.attention_reference(ins, rows=rows, causal=causal)
                ref = refs[causal]
                zeros = np.zeros(length, dtype=np.uint64)
                prof = tvm.runtime.tensor(zeros, device=tvm.cuda())
                run(ex0)
                r["untraced_check"] = check(O, LSE, ref, rows, tols, torch)
                run(ex1, prof)                               # warm-up launch, checked too
                r["traced_check"] = check(O, LSE, ref, rows, tols, torch)
                prof.copyfrom(zeros)
                run(ex1, prof)                               # the launch whose trace is kept
                r["traced_check_decoded_launch"] = check(O, LSE, ref, rows, tols, torch)
                raw = prof.numpy()
                ok = all(r[c]["ok"] for c in ("untraced_check", "traced_check", "traced_check_decoded_launch"))
                all_ok &= ok
                args5 = (ins["Q"], ins["K"], ins["V"], O, LSE)
                r["untraced_ms"] = median_ms(lambda: ex0(*args5), torch, args.reps, flush)
                r["traced_ms"] = median_ms(lambda: ex1(*args5, prof), torch, args.reps, flush)
                r["untraced_tflops"] = problems.attention_flops(pshape) / r["untraced_ms"] / 1e9
                r["overhead_pct"] = 100.0 * (r["traced_ms"] / r["untraced_ms"] - 1)
                log(f"{key}: correct={ok} (max err O untraced {r['untraced_check']['max_abs_err_O']}, traced "
                    f"{r['traced_check_decoded_launch']['max_abs_err_O']}); untraced {r['untraced_ms']:.3f} ms "
                    f"({r['untraced_tflops']:.0f} TFLOP/s), traced {r['traced_ms']:.3f} ms: {r['overhead_pct']:+.1f}%")
                if not ok:
                    log(f"{key}: WRONG: {json.dumps({c: r[c] for c in ('untraced_check', 'traced_check')})}")
                events, dinfo = tl.decode(raw, roles, return_info=True)
                r["decode_info"] = dinfo.__dict__
                r["events_total"] = len(events)
                r["ctas_decoded"] = len({e.cta for e in events})
                r["summary_by_role"] = tl.summarize(events)           # over every CTA
                r["summary_kept_ctas"] = tl.summarize(events, ctas=args.ctas)
                kept, cuts = cut(events, args.ctas, args.turns)
                r["kept"] = {"ctas": args.ctas, "turns": args.turns, "cut_us": cuts, "events": len(kept)}
                log(f"{key}: {len(events)} events; {dinfo}; by role: {json.dumps(r['summary_by_role'])}")
                meta = dict(r)
                meta.update(shape=summary["shape"], device=summary["device"], roles=roles)
                tl.events_to_json(kept, os.path.join(args.out, f"timeline_{key}.json"), **meta)
                save_png(kept, os.path.join(args.out, f"timeline_{key}.png"),
                         f"hopper_attn_step{step}{' causal' if causal else ''}, B={B}, {S}x{S}, {HQ}/{HKV} heads, "
                         f"{summary['device']}: CTAs {', '.join(map(str, args.ctas))}", log)
                r["status"] = "done" if ok else "WRONG"
            except Exception as e:  # noqa: BLE001 - report, go on (a CUDA fault ends the run)
                all_ok = False
                if record_failure(r, e, key, log) and not dry:
                    fault = True
                    break
            save()
        if fault:
            break
    summary["all_ok"] = all_ok
    summary["wall_s"] = round(time.time() - T0, 1)
    save()
    log(f"done in {summary['wall_s']} s; all {'compiled without spills' if dry else 'correct'}: {all_ok}; "
        f"outputs in {args.out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The untraced Hopper attention kernels are the kernels they were before the trace points went in.

    python benchmarks/lab6/untraced_unchanged.py [--rev e1bd6a3] [--steps 3 4 5]

For each of hopper_attn_step3..5 and each shape (below: GQA 8, MQA, MHA; causal and not; tails in
seq_q and seq_k; seq_q > seq_k), builds ``hopper_attn_stepN(..., trace=False)`` of the solution
notebook in the work tree and ``hopper_attn_stepN(...)`` of the notebook at git revision ``--rev``
(the last one before the builders took ``trace``: the kernels graded 43/43 on the H200), lowers
both to CUDA source for sm_90a (no GPU needed) and compares them. Prints one line per kernel,
"identical" when the two sources are byte for byte the same, and exits nonzero if any pair differs
beyond names and whitespace (the first differing lines are printed).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, *[os.pardir] * 2))
REL = "solutions/lab6_flash_attention/lab6_flash_attention.ipynb"
sys.path.insert(0, REPO)

# (batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal)
SHAPES = [
    (4, 4096, 4096, 32, 8, 128, False),     # the timeline shape, GQA 4
    (4, 4096, 4096, 32, 8, 128, True),
    (2, 1000, 777, 16, 2, 128, True),       # GQA 8, tails, seq_q > seq_k
    (2, 1000, 777, 16, 2, 128, False),
    (2, 777, 777, 8, 1, 128, False),        # MQA (GQA 8 over one KV head)
    (1, 128, 4096, 32, 1, 128, True),       # MQA 32, one query tile
    (1, 300, 500, 4, 4, 128, True),         # MHA
]


sys.path.insert(0, os.path.join(REPO, "benchmarks", "lab5"))
from untraced_unchanged import load, notebook_at, same_source  # noqa: E402  (Lab 5's: the same comparison)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="e1bd6a3", help="git revision of the notebook before tracing")
    ap.add_argument("--steps", type=int, nargs="*", default=[3, 4, 5])
    args = ap.parse_args()
    old, new = notebook_at(args.rev, REL, "lab6_old"), load(os.path.join(REPO, REL), "lab6_new")
    bad = 0
    for step in args.steps:
        for shape in SHAPES:
            b, sq, sk, hq, hkv, _, causal = shape
            label = f"hopper_attn_step{step} B={b} Sq={sq} Sk={sk} Hq={hq} Hkv={hkv}{' causal' if causal else ''}"
            bad += not same_source(label, getattr(old, f"hopper_attn_step{step}")(*shape),
                                   getattr(new, f"hopper_attn_step{step}")(*shape, trace=False))
    print("all untraced kernels unchanged" if not bad else f"{bad} kernels differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

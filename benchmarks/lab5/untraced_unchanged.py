#!/usr/bin/env python
"""The untraced Hopper kernels are the kernels they were before the trace points went in.

    python benchmarks/lab5/untraced_unchanged.py [--rev 21bd922] [--shapes 256x256x128 1000x776x512]

For each of hopper_step5..9 and each shape, builds ``hopper_stepN(..., trace=False)`` of the
solution notebook in the work tree and ``hopper_stepN(...)`` of the notebook at git revision
``--rev`` (before the builders took ``trace``), lowers both to CUDA source for sm_90a (no GPU
needed) and compares them after normalizing names and whitespace. Prints one line per kernel and
exits nonzero if any pair differs (the first differing lines are printed).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, *[os.pardir] * 2))
REL = "solutions/lab5_gemm_pipeline/lab5_gemm_pipeline.ipynb"
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), REPO]

from hopper_gpu_check import load_notebook as load  # noqa: E402



def normalize(src: str) -> str:
    """Kernel and parameter names, comments and blank space do not count."""
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"\b(kernel|traced|untraced|main|default_function)(_kernel)?\w*", "K", src)
    return "\n".join(" ".join(line.split()) for line in src.splitlines() if line.strip())


def notebook_at(rev: str, rel: str, name: str):
    """The builders of the notebook ``rel`` as it was at git revision ``rev``."""
    path = os.path.join(tempfile.mkdtemp(prefix=f"{name}-"), os.path.basename(rel))
    with open(path, "wb") as f:
        f.write(subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=REPO, check=True, capture_output=True).stdout)
    return load(path, name)


def same_source(label: str, f_old, f_new) -> bool:
    """Compare the CUDA source (sm_90a) of two kernels, print the verdict (and a diff if they
    differ beyond names and blank space)."""
    from grader.build import lower
    s_old, s_new = lower(f_old, "sm_90a")[1], lower(f_new, "sm_90a")[1]
    exact = s_old == s_new
    same = exact or normalize(s_old) == normalize(s_new)
    print(f"{label}: {'identical' if exact else 'same up to names/whitespace' if same else 'DIFFERENT'}"
          f" ({len(s_new.splitlines())} lines of CUDA)", flush=True)
    if not same:
        diff = difflib.unified_diff(normalize(s_old).splitlines(), normalize(s_new).splitlines(), lineterm="", n=1)
        print("\n".join(list(diff)[:40]))
    return same


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="21bd922", help="git revision of the notebook before tracing")
    ap.add_argument("--shapes", nargs="*", default=["256x256x128", "1000x776x512", "4096x4096x4096"])
    ap.add_argument("--steps", type=int, nargs="*", default=[5, 6, 7, 8, 9])
    ap.add_argument("--num-sms", type=int, default=132)
    args = ap.parse_args()
    old, new = notebook_at(args.rev, REL, "lab5_old"), load(os.path.join(REPO, REL), "lab5_new")
    bad = 0
    for step in args.steps:
        for shape in args.shapes:
            M, N, K = (int(x) for x in shape.split("x"))
            extra = () if step == 5 else (args.num_sms,)
            bad += not same_source(f"hopper_step{step} {shape}", getattr(old, f"hopper_step{step}")(M, N, K, *extra),
                                   getattr(new, f"hopper_step{step}")(M, N, K, *extra, trace=False))
    print("all untraced kernels unchanged" if not bad else f"{bad} kernels differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

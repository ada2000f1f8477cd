#!/usr/bin/env python
"""Run a solution notebook's timeline cells (the ``show(...)`` calls) as a student's notebook would.

    python benchmarks/lab5/notebook_show_cells.py NOTEBOOK --out DIR

Without Jupyter: the notebook's module cells (its builders, as the grader reads them), then every
code cell that defines ``hopper``/``num_sms`` or calls ``show(``, in the notebook's order, are
written to DIR/cells.py and run there (in DIR, so the PNGs the cells save land in DIR). The
timeline summaries they print go to standard output. Exit status: that of the cells.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, *[os.pardir] * 2))
sys.path.insert(0, REPO)

MARKERS = ("show(", "hopper =", "num_sms =")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from grader import submission
    os.makedirs(args.out, exist_ok=True)
    module = submission.write_module(os.path.abspath(args.notebook), args.out)
    with open(args.notebook, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    extra = []
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        if c["cell_type"] == "code" and any(m in src for m in MARKERS) and "def show(" not in src:
            extra.append(f"# ---- notebook cell {i}\n{src}\n")
    if not any("show(" in e for e in extra):
        sys.exit(f"{args.notebook}: no cell calls show(")
    path = os.path.join(args.out, "cells.py")
    with open(module.path, encoding="utf-8") as f:
        body = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write("import matplotlib\nmatplotlib.use('Agg')\n" + body + "\n" + "\n".join(extra))
    print(f"running {len(extra)} cells of {args.notebook} after its module cells: {path}", flush=True)
    os.chdir(args.out)
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()

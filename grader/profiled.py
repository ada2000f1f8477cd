"""The profiled run of grader/executed.py: started by ``ncu`` as ``python -I`` with the grader's
own module path (sandbox.trusted_command); launches the grader's own cubin of a submitted kernel
once, on inputs it makes itself, checks the output against the reference and writes
``result.json`` in its job folder. No byte of the student's runs on the CPU here."""
from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    """The profiled process: launch the grader's cubin once on the job's inputs and check the output."""
    d = argv[0]
    import torch
    from . import launch, problems, runners, timing
    with open(os.path.join(d, "job.json")) as f:
        job = json.load(f)
    with open(os.path.join(d, "kernel.cubin"), "rb") as f:
        cubin = f.read()
    with open(os.path.join(d, "kernel.ptx")) as f:
        ptx = f.read()
    prob = problems.get(job["problem"])
    shape = prob.shape(job["shape"])
    kernel = launch.Kernel(job["plan"], cubin, ptx)
    lab, part, seed, case = job["lab"], job["part"], int(job["seed"]), int(job.get("case", 0))
    ins = prob.make_inputs(lab, part, shape, seed, case, "cuda")
    scalars = prob.draw_scalars(lab, part, seed, case)
    ref, tol = runners.frozen(prob.reference(ins, scalars, shape)), prob.tolerance(shape, ins)
    given = {k: t.clone() for k, t in ins.items()}
    outs = prob.make_outputs(shape, "cuda")
    kernel(*prob.args({**given, **outs}, scalars))
    timing.sync()
    res = runners.check(prob, outs, ref, tol, prob.describe(shape), originals=ins, given=given)
    torch.cuda.synchronize()
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump({"ok": res.ok, "message": res.message}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

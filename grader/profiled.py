"""The profiled run of grader/executed.py: started by ``ncu`` as ``python -I`` with the grader's
own module path (sandbox.trusted_command). For each job of its folder, in order, it loads the
grader's own cubin of a submitted kernel, makes the inputs and the reference itself, launches the
kernel once between cudaProfilerStart and cudaProfilerStop (ncu counts nothing else), checks the
output, and appends its outcome to ``results.jsonl``, after a line that marks the kernel as
launching. A kernel that fails to load or to run ends the process there (its CUDA context is
lost, or ncu ends the process): its line, or the mark without one, says so, and the grader runs
the jobs after it again. No byte of the student's runs on the CPU here."""
from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    d = argv[0]
    import torch
    from . import executed, launch, problems, runners, timing
    with open(os.path.join(d, "jobs.json")) as f:
        jobs = json.load(f)
    torch.cuda.init()
    # The GPU's grading lock, shared (as a correctness run's): from here on this process works on
    # the GPU, and a timed part of another lab must not run beside it. Released when it ends.
    if jobs:
        executed.gpu_lock("", exclusive=False, path=jobs[0]["gpu_lock"])
    with open(os.path.join(d, "results.jsonl"), "a") as log:
        def record(**result) -> None:
            log.write(json.dumps(result) + "\n")
            log.flush()

        for i, job in enumerate(jobs):
            try:                          # the grader's own work: a failure here is not the kernel's
                with open(os.path.join(d, f"kernel-{i}.cubin"), "rb") as f:
                    cubin = f.read()
                with open(os.path.join(d, f"kernel-{i}.ptx")) as f:
                    ptx = f.read()
                prob = problems.get(job["problem"])
                shape = prob.shape(job["shape"])
                lab, part, seed, case = job["lab"], job["part"], int(job["seed"]), int(job.get("case", 0))
                ins = prob.make_inputs(lab, part, shape, seed, case, "cuda")
                scalars = prob.draw_scalars(lab, part, seed, case)
                ref, tol = runners.frozen(prob.reference(ins, scalars, shape)), prob.tolerance(shape, ins)
                given = {k: t.clone() for k, t in ins.items()}
                outs = prob.make_outputs(shape, "cuda")
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                record(ok=False, infrastructure=True, message=f"{type(e).__name__}: {e}")
                return 0
            # From here on, an end of this process without the kernel's line (ncu ends it when the
            # kernel traps or faults) is the kernel's failure: grader/executed.py reads this mark.
            record(launching=i)
            try:                          # the kernel's: loading, launching, running
                kernel = launch.Kernel(job["plan"], cubin, ptx)
                torch.cuda.profiler.start()
                try:
                    kernel(*prob.args({**given, **outs}, scalars))
                    timing.sync()
                finally:
                    torch.cuda.profiler.stop()
            except Exception as e:  # noqa: BLE001
                record(ok=False, failed=True, message=f"{type(e).__name__}: {str(e)[:1000]}")
                return 0
            res = runners.check(prob, outs, ref, tol, prob.describe(shape), originals=ins, given=given)
            torch.cuda.synchronize()
            record(ok=bool(res.ok), message=res.message)
            kernel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

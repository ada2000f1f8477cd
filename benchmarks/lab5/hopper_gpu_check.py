#!/usr/bin/env python
"""Correctness and speed of the Lab 5 Hopper kernels (the solution notebook's hopper_step5..9) on an H100/H200.

    python benchmarks/lab5/hopper_gpu_check.py --out DIR            # everything, a few minutes
    python benchmarks/lab5/hopper_gpu_check.py --out DIR --quick    # correctness + the 4096^3 timing only

Each step (5..9) runs in its own child process, so that one step that fails, crashes or hangs
(a deadlocked pipeline never returns) cannot stop the others: the children compile their kernels
in parallel on the CPU, then take turns on the GPU (a file lock), each GPU phase under a
watchdog. Results are written as they come (DIR/step<N>.json) and gathered into
DIR/hopper_results.json; a table is printed at the end.

Correctness: A, B ~ N(0, 1) in fp16, D prefilled with NaN (an element the kernel never writes
shows up), reference A.float() @ B.float().T; pass when max |D - ref| <= 1e-2 * sqrt(K) / 8 *
std(ref) (fp16 rounding of the output gives about 2e-3 * std(ref)).

Timing: CUDA events around each call, the kernel and torch.matmul(A, B.T, out=...) alternating in
the same loop, a 256 MB write before every call (L2 flushed; it also hides the host-side launch
cost), warm-up first, the median of --reps calls. TFLOP/s = 2 M N K / time; ratio = torch time /
kernel time (> 1: faster than torch.matmul).

Without a GPU the script only builds every kernel (tvm.compile for sm_90a) and says so.
"""
import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, *[os.pardir] * 2))
NOTEBOOK = os.path.join(REPO, "solutions", "lab5_gemm_pipeline", "lab5_gemm_pipeline.ipynb")


def load_notebook(notebook, name):
    """A solution notebook's module cells (its builders) imported as module ``name``, the way the
    course's tests import reference code (the grader itself never imports a notebook)."""
    import importlib.util
    import tempfile
    sys.path.insert(0, REPO)
    from grader import submission
    module = submission.write_module(notebook, tempfile.mkdtemp(prefix=f"{name}-"))
    spec = importlib.util.spec_from_file_location(name, module.path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def notebook_kernels():
    """Lab 5's builders hopper_step5..9 from the solution notebook."""
    return load_notebook(NOTEBOOK, "lab5_kernels")


STEPS = [5, 6, 7, 8, 9]
CORRECTNESS_SHAPES = [(256, 256, 64), (128, 256, 128), (1000, 776, 512), (4096, 4096, 4096), (2304, 3840, 1024)]
TIMING_SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 4096), (8192, 4096, 14336)]
QUICK_TIMING_SHAPES = [(4096, 4096, 4096)]


def shape_key(shape):
    return "x".join(str(v) for v in shape)


def finite(x):
    """JSON has no NaN/inf: write them as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


# ------------------------------------------------------------------------------------ worker

class Worker:
    def __init__(self, args):
        self.args = args
        self.step = args.worker
        self.path = os.path.join(args.out, f"step{self.step}.json")
        self.res = {"step": self.step, "status": "started", "error": None, "builds": {},
                    "correctness": {}, "timing": {}, "notes": []}
        self.lock = threading.Lock()
        self.save()

    def save(self):
        with self.lock:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.res, f, indent=1, default=str)
            os.replace(tmp, self.path)

    def run(self):
        try:
            self._run()
            if self.res["status"] in ("compiled", "gpu"):
                self.res["status"] = "done"
        except Exception as e:  # noqa: BLE001 - recorded, the parent carries on
            self.res["status"] = "error"
            self.res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}"
        self.save()

    def _run(self):
        t0 = time.time()
        sys.path.insert(0, HERE)
        import torch
        import tvm
        try:                                   # the course's toolchain setup, when available
            sys.path.insert(0, REPO)
            from grader import build as course_build
            self.res["toolchain"] = course_build.configure_toolchain()
        except Exception as e:  # noqa: BLE001
            self.res["toolchain"] = f"tvm defaults ({type(e).__name__}: {e})"
        hk = notebook_kernels()

        gpu = torch.cuda.is_available()
        if gpu:
            major, minor = torch.cuda.get_device_capability(0)
            arch = self.args.arch or f"sm_{major}{minor}" + ("a" if major >= 9 else "")
            props = torch.cuda.get_device_properties(0)
            num_sms = props.multi_processor_count
            self.res["device"] = f"{props.name}, {num_sms} SMs, {arch}"
            if major != 9:
                self.res["notes"].append(f"not a Hopper GPU ({arch}): the sm_90a kernels will not run here")
        else:
            arch = self.args.arch or "sm_90a"
            num_sms = self.args.num_sms
            self.res["device"] = f"no GPU: build only for {arch}, num_sms={num_sms}"
        self.res["num_sms"] = num_sms
        # as Lab 4 on the GPU: Target("cuda") (it detects sm_90a on an H200); an explicit arch
        # for builds without a GPU or when --arch is given
        if gpu and not self.args.arch:
            target = tvm.target.Target("cuda")
        else:
            target = tvm.target.Target({"kind": "cuda", "arch": arch})
        self.res["target"] = str(target)
        builder = getattr(hk, f"hopper_step{self.step}")
        self.res["import_seconds"] = round(time.time() - t0, 2)

        self.res["status"] = "compiling"
        correctness = [tuple(s) for s in CORRECTNESS_SHAPES]
        timing = [tuple(s) for s in (QUICK_TIMING_SHAPES if self.args.quick else TIMING_SHAPES)]
        if self.args.fake:                      # small shapes: torch on the CPU plays the GPU
            correctness, timing = correctness[:3], [(512, 512, 512)]
        kernels = {}
        for shape in dict.fromkeys(correctness + timing):          # ordered, no duplicates
            t1 = time.time()
            key = shape_key(shape)
            try:
                M, N, K = shape
                func = builder(M, N, K) if self.step == 5 else builder(M, N, K, num_sms)
                with target:
                    kernels[shape] = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")
                self.res["builds"][key] = {"ok": True, "seconds": round(time.time() - t1, 2)}
            except Exception as e:  # noqa: BLE001
                self.res["builds"][key] = {"ok": False, "seconds": round(time.time() - t1, 2),
                                           "error": f"{type(e).__name__}: {str(e)[-3000:]}"}
            self.save()
        self.res["status"] = "compiled"
        self.save()
        if self.args.fake:                      # self-test of this script without a GPU
            kernels = {shape: fake_kernel(torch, self.args.fake) for shape in kernels}
            gpu = True
            self.res["notes"].append(f"FAKE run ({self.args.fake}): torch on the CPU stands in for the kernels")
        if not gpu:
            self.res["notes"].append("no GPU: kernels built, nothing run")
            return

        # ---- GPU phase: only once every sibling has compiled (no CPU-heavy neighbours while
        # timing), one child at a time (a file lock), under a watchdog
        t_wait = time.time()
        self.wait_for_siblings()
        lock_file = open(os.path.join(self.args.out, ".gpu.lock"), "w")
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        self.res["gpu_wait_seconds"] = round(time.time() - t_wait, 2)
        self.res["status"] = "gpu"
        self.res["gpu_phase_started"] = time.time()     # the parent's watchdog reads this
        self.save()

        def watchdog():
            self.res["status"] = "timeout"
            self.res["error"] = (f"GPU phase of step {self.step} still running after {self.args.gpu_timeout} s "
                                 f"(a hang: a pipeline barrier that never completes?); the process was killed")
            self.save()
            os._exit(3)

        timer = threading.Timer(self.args.gpu_timeout, watchdog)
        timer.daemon = True
        timer.start()
        try:
            self.gpu_phase(torch, kernels, correctness, timing)
        finally:
            timer.cancel()
            self.res["gpu_phase_finished"] = time.time()
            self.save()
            fcntl.flock(lock_file, fcntl.LOCK_UN)

    def wait_for_siblings(self):
        deadline = time.time() + self.args.sibling_wait
        while time.time() < deadline:
            waiting = False
            for step in self.args.siblings:
                try:
                    with open(os.path.join(self.args.out, f"step{step}.json")) as f:
                        status = json.load(f).get("status")
                except (OSError, ValueError):
                    status = None
                if status in (None, "started", "compiling"):
                    waiting = True
            if not waiting:
                return
            time.sleep(0.5)

    def gpu_phase(self, torch, kernels, correctness, timing):
        dev = "cpu" if self.args.fake else "cuda"
        cuda = FakeCuda() if self.args.fake else torch.cuda
        gen = torch.Generator(device=dev)
        gen.manual_seed(1234)

        def inputs(M, N, K):
            A = torch.randn(M, K, device=dev, generator=gen).half()
            B = torch.randn(N, K, device=dev, generator=gen).half()
            return A, B

        for shape in correctness:
            key = shape_key(shape)
            if shape not in kernels:
                self.res["correctness"][key] = {"ok": False, "error": "did not build"}
                continue
            M, N, K = shape
            try:
                A, B = inputs(M, N, K)
                D = torch.full((M, N), float("nan"), device=dev, dtype=torch.float16)
                kernels[shape](A, B, D)
                cuda.synchronize()
                ref = A.float() @ B.float().T
                err = (D.float() - ref).abs().max().item()
                scale = ref.std().item()
                tol = 1e-2 * math.sqrt(K) / 8 * scale
                self.res["correctness"][key] = {"ok": bool(err <= tol), "max_abs_err": finite(err),
                                                "tolerance": tol, "ref_std": scale,
                                                "nan_count": int(torch.isnan(D).sum().item())}
                del A, B, D, ref
            except Exception as e:  # noqa: BLE001
                self.res["correctness"][key] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[-2000:]}"}
            self.save()

        flush = None if self.args.no_flush else torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        for shape in timing:
            key = shape_key(shape)
            if shape not in kernels:
                self.res["timing"][key] = {"error": "did not build"}
                continue
            M, N, K = shape
            try:
                A, B = inputs(M, N, K)
                Dk = torch.empty(M, N, device=dev, dtype=torch.float16)
                Dt = torch.empty(M, N, device=dev, dtype=torch.float16)
                fn = kernels[shape]

                def run_kernel():
                    fn(A, B, Dk)

                def run_torch():
                    torch.matmul(A, B.T, out=Dt)

                for _ in range(self.args.warmup):
                    run_kernel()
                    cuda.synchronize()
                    run_torch()
                cuda.synchronize()
                tk, tt = [], []
                for _ in range(self.args.reps):
                    for f, acc in ((run_kernel, tk), (run_torch, tt)):
                        if flush is not None:
                            flush.zero_()
                        start = cuda.Event(enable_timing=True)
                        end = cuda.Event(enable_timing=True)
                        start.record()
                        f()
                        end.record()
                        cuda.synchronize()
                        acc.append(start.elapsed_time(end))
                mk, mt = sorted(tk)[len(tk) // 2], sorted(tt)[len(tt) // 2]
                flops = 2.0 * M * N * K
                diff = (Dk.float() - Dt.float()).abs().max().item()
                self.res["timing"][key] = {
                    "kernel_ms": mk, "torch_ms": mt,
                    "kernel_tflops": flops / mk / 1e9, "torch_tflops": flops / mt / 1e9,
                    "ratio": mt / mk, "max_abs_diff_vs_torch": finite(diff),
                    "kernel_ms_min": min(tk), "torch_ms_min": min(tt)}
                del A, B, Dk, Dt
            except Exception as e:  # noqa: BLE001
                self.res["timing"][key] = {"error": f"{type(e).__name__}: {str(e)[-2000:]}"}
            self.save()
            cuda.empty_cache()


class FakeCuda:
    """--fake: stands in for torch.cuda (host timers) to exercise this script without a GPU."""

    class Event:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        pass


def fake_kernel(torch, mode):
    def run(A, B, D):
        if mode == "hang":
            while True:                      # holds the GIL: only the parent can stop this
                pass
        if mode == "gilhang":                # C code holding the GIL (like a blocked CUDA call might)
            import re
            re.match(r"(a+)+$", "a" * 64 + "b")
        if mode == "sleep":
            time.sleep(3600)                 # releases the GIL: the child's own watchdog fires
        D.copy_((A.float() @ B.float().T).half())
        if mode == "wrong":
            D[0, 0] += 100.0
    return run


# ------------------------------------------------------------------------------------ parent

def run_parent(args):
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    procs = {}
    common = ["--out", args.out, "--reps", str(args.reps), "--warmup", str(args.warmup),
              "--gpu-timeout", str(args.gpu_timeout), "--num-sms", str(args.num_sms),
              "--sibling-wait", str(args.sibling_wait), "--siblings", *[str(s) for s in args.steps]]
    if args.quick:
        grading.append("--quick")
    if args.no_flush:
        grading.append("--no-flush")
    if args.arch:
        common += ["--arch", args.arch]
    if args.fake:
        common += ["--fake", args.fake]
    for step in args.steps:
        path = os.path.join(args.out, f"step{step}.json")
        if os.path.exists(path):
            os.remove(path)
    logs = {}

    def start(step):
        log = open(os.path.join(args.out, f"step{step}.log"), "w")
        logs[step] = log
        procs[step] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(step)] + common,
                                       stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    pending = list(args.steps)
    while pending or procs:
        while pending and len(procs) < args.jobs:
            start(pending.pop(0))
        for step, p in list(procs.items()):
            if p.poll() is not None:
                procs.pop(step)
                logs[step].close()
                continue
            # watchdog from outside: a kernel that never returns may hold the child's GIL
            path = os.path.join(args.out, f"step{step}.json")
            try:
                with open(path) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                continue
            started = r.get("gpu_phase_started")
            if started and not r.get("gpu_phase_finished") and time.time() - started > args.gpu_timeout + 10:
                p.kill()
                p.wait()
                procs.pop(step)
                logs[step].close()
                r["status"] = "timeout"
                r["error"] = (f"GPU phase of step {step} still running after {args.gpu_timeout + 10:.0f} s "
                              f"(a hang: a pipeline barrier that never completes?); killed by the parent")
                with open(path, "w") as f:
                    json.dump(r, f, indent=1, default=str)
                print(f"step {step}: GPU phase timed out, killed")
        if time.time() - t0 > args.deadline:
            for step, p in procs.items():
                p.kill()
                print(f"step {step}: killed at the {args.deadline} s deadline")
            procs.clear()
            pending.clear()
        time.sleep(0.2)

    results = {"device": None, "num_sms": None, "quick": args.quick, "wall_seconds": None, "steps": {},
               "criteria": {"correct": "max|D - ref| <= 1e-2 * sqrt(K) / 8 * std(ref), ref = A.float() @ B.float().T",
                            "ratio": "torch.matmul time / kernel time (median of reps, alternating, L2 flushed)"}}
    for step in args.steps:
        path = os.path.join(args.out, f"step{step}.json")
        try:
            with open(path) as f:
                r = json.load(f)
        except Exception as e:  # noqa: BLE001
            log_tail = ""
            try:
                with open(os.path.join(args.out, f"step{step}.log")) as f:
                    log_tail = f.read()[-3000:]
            except OSError:
                pass
            r = {"step": step, "status": "no result", "error": f"{type(e).__name__}: {e}\n{log_tail}"}
        if r.get("status") in ("started", "compiling", "compiled", "gpu"):
            r["status"] = f"crashed or killed (while {r.get('status')})"
            try:
                with open(os.path.join(args.out, f"step{step}.log")) as f:
                    r["error"] = (r.get("error") or "") + f.read()[-3000:]
            except OSError:
                pass
        results["device"] = results["device"] or r.get("device")
        results["num_sms"] = results["num_sms"] or r.get("num_sms")
        results["steps"][f"step{step}"] = r
    results["wall_seconds"] = round(time.time() - t0, 1)
    out_path = os.path.join(args.out, "hopper_results.json")
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print_table(results, args)
    print(f"\nwritten: {out_path} ({results['wall_seconds']} s)")
    ok = all(r.get("status") == "done" and r.get("correctness") and all(c.get("ok") for c in r["correctness"].values())
             for r in results["steps"].values())
    return 0 if ok else 1


def print_table(results, args):
    print(f"device: {results['device']}")
    steps = results["steps"]
    print("\ncorrectness: max |D - ref| (tolerance), FAIL marks a miss")
    cshapes = [shape_key(s) for s in CORRECTNESS_SHAPES]
    print(f"{'step':<6}{'status':<10}" + "".join(f"{s:>22}" for s in cshapes))
    for name, r in steps.items():
        cells = []
        for s in cshapes:
            c = (r.get("correctness") or {}).get(s)
            b = (r.get("builds") or {}).get(s)
            if c is None:
                cells.append("build failed" if b and not b.get("ok") else "-")
            elif "error" in c:
                cells.append("ERROR")
            else:
                err = c["max_abs_err"]
                err_s = f"{err:.3g}" if isinstance(err, (int, float)) else str(err)
                cells.append(f"{err_s} ({c['tolerance']:.2g}){'' if c['ok'] else ' FAIL'}")
        print(f"{name:<6}{str(r.get('status')):<10}" + "".join(f"{c:>22}" for c in cells))
    print("\nspeed: kernel TFLOP/s / torch TFLOP/s = ratio")
    tshapes = [shape_key(s) for s in (QUICK_TIMING_SHAPES if args.quick else TIMING_SHAPES)]
    print(f"{'step':<6}" + "".join(f"{s:>26}" for s in tshapes))
    for name, r in steps.items():
        cells = []
        for s in tshapes:
            t = (r.get("timing") or {}).get(s)
            if t is None:
                cells.append("-")
            elif "error" in t:
                cells.append("ERROR")
            else:
                cells.append(f"{t['kernel_tflops']:.0f}/{t['torch_tflops']:.0f} = {t['ratio']:.2f}x")
        print(f"{name:<6}" + "".join(f"{c:>26}" for c in cells))
    for name, r in steps.items():
        if r.get("error"):
            print(f"\n{name} error: {r['error'][:1500]}")
        for s, b in (r.get("builds") or {}).items():
            if not b.get("ok"):
                print(f"\n{name} build {s}: {b.get('error', '')[:800]}")
        for s, c in (r.get("correctness") or {}).items():
            if "error" in c:
                print(f"\n{name} correctness {s}: {c['error'][:800]}")
        for s, t in (r.get("timing") or {}).items():
            if "error" in t:
                print(f"\n{name} timing {s}: {t['error'][:800]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for hopper_results.json and per-step files")
    ap.add_argument("--quick", action="store_true", help="correctness shapes and the 4096^3 timing only")
    ap.add_argument("--steps", type=int, nargs="*", default=STEPS)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=len(STEPS), help="child processes at once (they compile in parallel)")
    ap.add_argument("--gpu-timeout", type=float, default=60.0, help="seconds a step may spend on the GPU")
    ap.add_argument("--deadline", type=float, default=225.0, help="seconds before the remaining children are killed")
    ap.add_argument("--no-flush", action="store_true", help="do not overwrite L2 before each timed call")
    ap.add_argument("--arch", default=None, help="override the target arch (default: the GPU's, e.g. sm_90a)")
    ap.add_argument("--num-sms", type=int, default=132, help="SM count for builds without a GPU")
    ap.add_argument("--sibling-wait", type=float, default=90.0, help=argparse.SUPPRESS)
    ap.add_argument("--siblings", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fake", choices=["ok", "wrong", "hang", "gilhang", "sleep"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.worker is not None:
        Worker(args).run()
        return 0
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())

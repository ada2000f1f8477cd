"""Compiling TIRx kernels: for the GPU present, or compile-only for sm_90a and sm_100a on
a machine without a GPU, using pip's CUDA packages (NVRTC, CCCL headers, ptxas and
cuobjdump) rather than whatever toolkit the machine happens to have.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from typing import Any, Callable

from . import spans
from .toolchain import BuildError, configure_toolchain, nvrtc_options, nvrtc_ptx, target, tool


@dataclasses.dataclass
class Artifacts:
    arch: str
    cuda_source: str
    ptx: str = ""
    cubin: bytes = b""
    sass: str = ""
    ptxas_log: str = ""     # ptxas -v: registers, shared memory, spills, warnings
    plan: dict | None = None  # the launch plan (grader/devcode.py): grid, TMA descriptors, ...


def lower(kernel, arch: str | None = None):
    """(callable kernel, CUDA source) for the GPU present, or for ``arch``.

    ``kernel`` is a PrimFunc (a notebook's own check cells: compiled here with ``tvm.compile``)
    or a KernelRef (the grader: the jailed child lowers it and sends PTX and a launch plan; this
    side assembles the PTX itself and launches the cubin through the CUDA driver,
    grader/launch.py). Without a GPU of ``arch`` the callable is None."""
    from .remote import KernelRef
    if isinstance(kernel, KernelRef):
        return launch_submitted(kernel, arch)
    import tvm
    configure_toolchain()
    tgt = target(arch)
    with tgt:
        ex = tvm.compile(tvm.IRModule({"main": kernel}), target=tgt, tir_pipeline="tirx")
    return ex, ex.mod.imports[0].inspect_source()


def device_arch() -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


class LaunchesNoCTA(BuildError):
    """The kernel launches no CTA at the shape it was built for; ``reason`` says so (no_cta)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def no_cta(plan) -> str | None:
    """Why a launch plan launches no CTA, or None: a grid extent of 0 as the host code computed it
    (``declared_grid``; TVM would launch one CTA for it), i.e. a tile count that rounds down to
    zero. Reads untrusted data without trusting its shape (launch.validate checks the rest)."""
    launches = plan.get("launches") if isinstance(plan, dict) else None
    for ln in launches if isinstance(launches, list) else []:
        grid = ln.get("declared_grid", ln.get("grid")) if isinstance(ln, dict) else None
        if isinstance(grid, list) and any(type(x) is int and x <= 0 for x in grid):
            return "it launches no CTA (a grid of 0: a tile count that rounds down to zero)"
    return None


def _submitted_code(ref, arch: str) -> dict:
    from . import launch
    from .remote import BuildFailed
    try:
        code = ref.device_code(arch)
    except BuildFailed as e:
        raise BuildError(str(e)) from None
    idle = no_cta(code.get("plan") if isinstance(code, dict) else None)
    if idle:           # said first: its grid of 1 CTA would also fail the plan's cluster rules
        raise LaunchesNoCTA(f"{ref.builder}{ref.args} for {arch}: the kernel does no work at this shape: {idle}", idle)
    try:
        launch.validate(code["plan"])
        launch.check_against_ptx(code["plan"], code["ptx"])
    except launch.PlanRejected as e:
        raise BuildError(f"{ref.builder}{ref.args} for {arch}: the grader cannot launch this kernel: {e}") from None
    return code


def assembled(ptx: str, arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of PTX the grader assembles itself (in a tool jail), kept per process."""
    import hashlib
    from . import launch
    key = (hashlib.sha256(ptx.encode()).hexdigest(), arch)
    if key not in _ASSEMBLED:
        try:
            with spans.span("ptxas", arch=arch):
                _ASSEMBLED[key] = launch.assemble(ptx, arch)
        except launch.AssemblyFailed as e:
            raise BuildError(str(e)) from None
    return _ASSEMBLED[key]


_ASSEMBLED: dict[tuple, tuple[bytes, str]] = {}


def reassembled(ptx: str, arch: str) -> tuple[bytes, str]:
    """:func:`assembled` made anew (ptxas run again), in place of the one kept."""
    import hashlib
    _ASSEMBLED.pop((hashlib.sha256(ptx.encode()).hexdigest(), arch), None)
    return assembled(ptx, arch)


def with_cubin(reply: dict, arch: str) -> dict:
    """An export's reply with the grader's own cubin of its PTX (assembled: kept per process,
    so a kernel built ahead is assembled once, before any part takes the GPU's lock) for the
    harness, which would otherwise run ptxas again while it holds the lock. A PTX that does not
    assemble goes without: the harness assembles it and reports the error as before."""
    code = reply.get("code")
    if not isinstance(code, dict) or not isinstance(code.get("ptx"), str):
        return reply
    try:
        cubin, log = assembled(code["ptx"], arch)
    except BuildError:
        return reply
    import base64
    return {**reply, "code": {**code, "cubin_b64": base64.b64encode(cubin).decode(), "ptxas_log": log}}


def launch_submitted(ref, arch: str | None = None):
    """A submitted kernel ready to run on this GPU: the grader's own cubin of the child's PTX,
    launched by launch.Kernel from the validated plan. Without a GPU of ``arch``: (None, source)."""
    import torch
    gpu = torch.cuda.is_available()
    arch = arch or (device_arch() if gpu else "sm_90a")
    code = _submitted_code(ref, arch)
    if not gpu or arch != device_arch():
        return None, code["cuda_source"]
    from . import launch
    given = code.get("cubin_b64")
    if isinstance(given, str):      # assembled by the grading process already (with_cubin)
        import base64
        import hashlib
        _ASSEMBLED.setdefault((hashlib.sha256(code["ptx"].encode()).hexdigest(), arch),
                              (base64.b64decode(given), str(code.get("ptxas_log", ""))))
    cubin, _ = assembled(code["ptx"], arch)
    import json
    key = (cubin, arch, json.dumps(code["plan"], sort_keys=True))     # kernels of two shapes may share a cubin
    if key not in _LOADED:
        try:
            _LOADED[key] = launch.Kernel(code["plan"], cubin, code["ptx"])
        except (launch.PlanRejected, launch.LaunchError) as e:
            raise BuildError(f"{ref.builder}{ref.args}: {e}") from None
    return _LOADED[key], code["cuda_source"]


_LOADED: dict[tuple, object] = {}


def local_kernel(prim_func, arch: str | None = None):
    """(callable, CUDA source) of a PrimFunc in this process, launched the way the grader launches
    a submitted kernel: the same launch plan, the PTX assembled by ptxas, the cubin loaded and
    launched through the CUDA driver by launch.Kernel (a notebook's own check cells: its own
    code, so no jail). The notebook's timings are then those of the launch path the grader times."""
    from . import launch
    arch = arch or device_arch()
    source, plan, ptx = _lowered_here(prim_func, arch)
    cubin, _ = launch.assemble(ptx, arch, unsafe=True)
    return launch.Kernel(plan, cubin, ptx), source


def compile_only(kernel, arch: str, want_sass: bool = False, own_ptx: bool = False) -> Artifacts:
    """CUDA source, PTX, cubin (and SASS) for ``arch`` without a GPU. Raises BuildError with the
    compiler's message (e.g. a tcgen05 instruction built for sm_90a). For a KernelRef the PTX
    comes from the jailed child and the cubin is the grader's own assembly of it: the code a
    mechanism check reads is the code the harness would launch."""
    from .remote import KernelRef
    if isinstance(kernel, KernelRef):
        code = _submitted_code(kernel, arch)
        if own_ptx:                    # a check reads the source: inspect the code made from that source
            code = dict(code, ptx=jailed_nvrtc(code["cuda_source"], arch))
            from . import launch
            try:
                launch.check_against_ptx(code["plan"], code["ptx"])
            except launch.PlanRejected as e:
                raise BuildError(f"{kernel.builder}{kernel.args} for {arch}: the kernel's source and its launch "
                                 f"plan disagree: {e}") from None
        art = Artifacts(arch, code["cuda_source"], code["ptx"], plan=code["plan"])
        art.cubin, art.ptxas_log = assembled(code["ptx"], arch)
        if want_sass:
            from . import launch
            art.sass = checked_sass(art, launch.disassemble, lambda: reassembled(code["ptx"], arch))
        return art
    try:
        src, plan, ptx = _lowered_here(kernel, arch)
    except BuildError:
        raise
    except Exception as e:  # noqa: BLE001 - a TIRx parse/lowering error is the student's verdict
        from . import hints          # a lowering TIRx could not find: a few lines, not TVM's table
        raise BuildError(f"TIRx lowering for {arch} failed: {type(e).__name__}: {hints.explain(e) or e}") from e
    art = Artifacts(arch, src, ptx, plan=plan)
    art.cubin, art.ptxas_log = assemble(ptx, arch, src, target(arch))
    if want_sass:
        art.sass = checked_sass(art, disassemble, lambda: assemble(ptx, arch, src, target(arch)))
    return art


SASS_ATTEMPTS = 3


def checked_sass(art: Artifacts, disassemble_: Callable[[bytes], str],
                 reassemble: Callable[[], tuple[bytes, str]]) -> str:
    """cuobjdump's listing of ``art.cubin``, held against the PTX it was assembled from
    (inspect.sass_gap: a launched entry without its section, a wgmma or tcgen05 MMA of the
    launched PTX with no tensor-core instruction in the listing). A listing with such a gap is
    not taken at its word: the PTX is assembled and disassembled again, up to ``SASS_ATTEMPTS``
    times in all, and the first listing without a gap is the one the checks read. A gap that
    every attempt shows is the kernel's own (ptxas removed code it could prove dead) and is
    graded as it is. Each gap is said on stderr, for the grading log."""
    import sys
    from . import inspect
    sass = ""
    for attempt in range(1, SASS_ATTEMPTS + 1):
        sass = disassemble_(art.cubin)
        if not sass and tool("cuobjdump") is None:
            return ""                  # no disassembler here: the callers say so
        gap = inspect.sass_gap(art.plan, art.ptx, sass)
        if gap is None:
            return sass
        print(f"grader: the SASS listing of a {art.arch} kernel (attempt {attempt} of {SASS_ATTEMPTS}, "
              f"{len(sass)} characters) does not match its PTX: {gap}", file=sys.stderr, flush=True)
        if attempt < SASS_ATTEMPTS:
            art.cubin, art.ptxas_log = reassemble()
    return sass


_COMPILED: dict[tuple, Artifacts] = {}


def by_structure(cache: dict, prim_func, arch: str, make: Callable[[], Any]):
    """``make()`` for (prim_func, arch), kept in ``cache`` for the life of the process: a later
    PrimFunc structurally equal to one seen before (builders make a new one at every call) gets
    the same result."""
    import tvm_ffi
    key = (int(tvm_ffi.structural_hash(prim_func)), arch)
    for func, got in cache.get(key, []):
        if tvm_ffi.structural_equal(func, prim_func):
            return got
    got = make()
    cache.setdefault(key, []).append((prim_func, got))
    return got


def _lowered_here(prim_func, arch: str) -> tuple:
    """devcode.lowered of a PrimFunc lowered in this process (a notebook's check cells, the
    tests), once per kernel and arch: the build parts of several steps, and a notebook's build
    and GPU checks, often ask for the same kernel at the same shape."""
    from . import devcode
    src, plan, ptx = by_structure(_LOWERED, prim_func, arch, lambda: in_fresh_thread(devcode.lowered, prim_func, arch))
    return src, plan, ptx if isinstance(ptx, str) else ptx.result()


def prefetch(prim_funcs, arch: str | None = None) -> None:
    """Lower each of ``prim_funcs`` for ``arch`` now and start its NVRTC compile in a worker
    process (toolchain.nvrtc_later), so that a later ``local_kernel`` of the same kernel only
    waits for the PTX: a check cell's kernels then compile side by side, while this process
    lowers the next one and runs the ones before. A kernel whose lowering fails is left for
    ``local_kernel`` to fail on in its turn."""
    from . import devcode
    arch = arch or device_arch()
    for prim_func in prim_funcs:
        try:
            by_structure(_LOWERED, prim_func, arch,
                         lambda f=prim_func: in_fresh_thread(devcode.lowered, f, arch, later=True))
        except Exception:  # noqa: BLE001 - reported where the kernel is asked for, in its order
            continue


def in_fresh_thread(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` run in a new thread; its result, or its exception raised here.
    TIRx's parser reads every frame of the calling thread's stack (inspect.stack) at each
    prim_func and macro it parses, when a kernel is built and again when it is lowered; under a
    Jupyter cell (or pytest) the stack is deep, and reading it takes about as long as the parse
    itself. A new thread's stack holds the call alone. Nothing runs at the same time: the
    caller waits."""
    import threading
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller as it is
            box["error"] = e
    worker = threading.Thread(target=run, name="tirx-build", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box.pop("error")
    return box["value"]


_LOWERED: dict[tuple, list] = {}


def compile_source(src: str, arch: str, want_sass: bool = False) -> Artifacts:
    """NVRTC to PTX, ptxas to cubin, cuobjdump to SASS. Results are kept per (source, arch) for
    the life of the process: several parts often inspect the same kernel."""
    import hashlib
    key = (hashlib.sha256(src.encode()).hexdigest(), arch, want_sass)
    if key not in _COMPILED:
        _COMPILED[key] = _compile_source(src, arch, want_sass)
    return dataclasses.replace(_COMPILED[key])


def jailed_nvrtc(src: str, arch: str) -> str:
    """CUDA source the child sent, compiled to PTX by NVRTC in a tool jail (the grader's own
    modules only; no student code runs there, and an #include reads only what the jail holds)."""
    from . import sandbox
    # toolchain.nvrtc_ptx needs neither TVM nor torch: the process imports the toolchain alone
    # (a fraction of a second) and compiles once (without precompiled headers).
    code = ("import sys; sys.path[:0] = ['/course'] + sys.argv[3:]; "
            "from grader import toolchain; "
            "open('/sandbox/k.ptx', 'w').write(toolchain.nvrtc_ptx(open('/sandbox/k.cu').read(), sys.argv[1]))")
    import sys
    rc, log, out = sandbox.run_tool([sys.executable, "-I", "-c", code, arch, "k"] + sandbox.python_dirs(),
                                    {"k.cu": src.encode()}, ["k.ptx"], course=True)
    if rc != 0 or "k.ptx" not in out:
        raise BuildError(f"NVRTC compilation for {arch} failed: {log.strip()[-2000:]}")
    return out["k.ptx"].decode(errors="replace")


def _compile_source(src: str, arch: str, want_sass: bool) -> Artifacts:
    tgt = target(arch)
    ptx_text = nvrtc_ptx(src, arch)
    art = Artifacts(arch, src, ptx_text)
    art.cubin, art.ptxas_log = assemble(ptx_text, arch, src, tgt)
    if want_sass:
        art.sass = checked_sass(art, disassemble, lambda: assemble(ptx_text, arch, src, tgt))
    return art


def assemble(ptx: str, arch: str, src: str, tgt) -> tuple[bytes, str]:
    """PTX to cubin with pip's ptxas (a fraction of a second; ``-v`` reports registers and
    spills); without ptxas, NVRTC compiles the CUDA source again."""
    exe = tool("ptxas")
    if exe is None:
        from tvm.support import nvcc
        with tgt:
            return bytes(nvcc.compile_cuda(src, "cubin", arch=arch, compiler="nvrtc", options=nvrtc_options())), ""
    with tempfile.TemporaryDirectory() as d:
        ptx_path, cubin_path = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx_path, "w") as f:
            f.write(ptx)
        out = subprocess.run([exe, f"-arch={arch}", "-v", "--register-usage-level=10", "-o", cubin_path, ptx_path],
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise BuildError(f"ptxas for {arch} failed: {out.stderr.strip()[-2000:]}")
        with open(cubin_path, "rb") as f:
            return f.read(), out.stderr


def disassemble(cubin: bytes) -> str:
    exe = tool("cuobjdump")
    if exe is None:
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True, timeout=120)
    return out.stdout if out.returncode == 0 else ""

"""Compiling TIRx kernels: for the GPU present, or compile-only for sm_90a and sm_100a on
a machine without a GPU, using pip's CUDA packages (NVRTC, CCCL headers, ptxas and
cuobjdump) rather than whatever toolkit the machine happens to have.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import tempfile


class BuildError(Exception):
    pass


@functools.lru_cache(maxsize=1)
def pip_cuda_root() -> str | None:
    """The CUDA folder of pip's nvidia-cuda-* packages (site-packages/nvidia/cu13) when it holds
    everything NVRTC needs (the runtime headers and CCCL), else None."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        root = os.path.join(base, "cu13")
        if (os.path.exists(os.path.join(root, "include", "cuda_runtime.h"))
                and os.path.isdir(os.path.join(root, "include", "cccl", "cuda", "std"))):
            return root
    return None


def configure_toolchain() -> str:
    """Point TVM's NVRTC path at a complete CUDA folder; returns a description for reports.

    An explicitly set CUDA_PATH wins; then pip's CUDA packages (the same on every machine);
    then TVM's own search (nvcc on PATH, /usr/local/cuda).
    """
    if "CUDA_PATH" in os.environ:
        return f"CUDA_PATH={os.environ['CUDA_PATH']} (set by the environment)"
    root = pip_cuda_root()
    if root is None:
        if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"):
            return "system CUDA toolkit (nvcc on PATH or /usr/local/cuda)"
        raise BuildError("no CUDA headers: install the course's pip packages "
                         "(nvidia-cuda-nvrtc, nvidia-cuda-cccl, nvidia-cuda-nvcc) or set CUDA_PATH")
    os.environ["CUDA_PATH"] = root
    # tvm.compile's own NVRTC call (used when a GPU is present) takes extra options from here.
    os.environ.setdefault("TVM_CUDA_NVRTC_EXTRA_OPTS", f"-I{os.path.join(root, 'include', 'cccl')}")
    return f"CUDA_PATH={root} (pip packages)"


def nvrtc_options() -> list[str]:
    root = os.environ.get("CUDA_PATH") or pip_cuda_root() or ""
    opts = []
    for cand in (os.path.join(root, "include", "cccl"), os.path.join(root, "targets", "x86_64-linux", "include", "cccl")):
        if os.path.isdir(cand):
            opts.append(f"-I{cand}")
    pip_root = pip_cuda_root()
    if pip_root and os.path.isdir(os.path.join(pip_root, "include", "cccl")):
        opts.append(f"-I{os.path.join(pip_root, 'include', 'cccl')}")
    return list(dict.fromkeys(opts))


def tool(name: str) -> str | None:
    """A CUDA command-line tool (ptxas, cuobjdump, nvdisasm): pip's first, then PATH."""
    root = pip_cuda_root()
    if root and os.path.exists(os.path.join(root, "bin", name)):
        return os.path.join(root, "bin", name)
    return shutil.which(name)


def target(arch: str | None = None):
    import tvm
    if arch is None:
        return tvm.target.Target("cuda")
    return tvm.target.Target({"kind": "cuda", "arch": arch})


@dataclasses.dataclass
class Artifacts:
    arch: str
    cuda_source: str
    ptx: str = ""
    cubin: bytes = b""
    sass: str = ""
    ptxas_log: str = ""     # ptxas -v: registers, shared memory, spills, warnings


INCLUDE = re.compile(r"^\s*#\s*include\s*(.*)$", re.M)
SAFE_INCLUDE = re.compile(r"^<(?!.*\.\.)[\w][\w/.+-]*>$")


def check_source(src: str) -> None:
    """CUDA source compiled in a grader process may include only toolkit headers by name."""
    for m in INCLUDE.finditer(src):
        target_ = m.group(1).strip()
        if not SAFE_INCLUDE.match(target_):
            raise BuildError(f"the kernel's CUDA source includes {target_!r}: only toolkit headers (<...>) are allowed")


def lower(kernel, arch: str | None = None):
    """(callable kernel, CUDA source) for the GPU present, or for ``arch``.

    ``kernel`` is a PrimFunc (a notebook's own check cells: compiled here) or a KernelRef (the
    grader: the sandboxed child compiles and exports it, this side vets the library and loads it;
    without a GPU only the source is returned, with None for the callable)."""
    from .remote import KernelRef
    if isinstance(kernel, KernelRef):
        return load_library(kernel, arch)
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


def load_library(ref, arch: str | None = None):
    from . import artifact
    import torch
    gpu = torch.cuda.is_available()
    arch = arch or (device_arch() if gpu else "sm_90a")
    path = ref.library(arch)
    if path in _LOADED:                  # vetted and loaded already in this process
        return _LOADED[path]
    try:
        kind, code = artifact.device_code(path)
    except artifact.Rejected as e:
        raise BuildError(str(e)) from None
    if kind == "cuda":
        check_source(code)
    if not gpu or arch != device_arch():
        return None, code if kind == "cuda" else ""
    import tvm
    import tvm_ffi
    try:
        artifact.vet(path, set(tvm_ffi.registry.list_global_func_names()))
    except artifact.Rejected as e:
        raise BuildError(f"kernel library rejected: {e}") from None
    lib = tvm.runtime.load_module(path)
    _LOADED[path] = (lib["main"], code if kind == "cuda" else _inspect(lib))
    return _LOADED[path]


_LOADED: dict[str, tuple] = {}


def _inspect(lib) -> str:
    try:
        return lib.imports[0].inspect_source()
    except Exception:  # noqa: BLE001 - the source is for reading only
        return ""


def compile_only(kernel, arch: str, want_sass: bool = False) -> Artifacts:
    """CUDA source, PTX and cubin for ``arch`` without a GPU. Raises BuildError with the
    compiler's message (e.g. a tcgen05 instruction built for sm_90a). For a KernelRef the source
    is read out of the library the child exported, and compiled here."""
    from .remote import BuildFailed, KernelRef
    if isinstance(kernel, KernelRef):
        from . import artifact
        try:
            kind, code = artifact.device_code(kernel.library(arch))
        except (BuildFailed, artifact.Rejected) as e:
            raise BuildError(str(e)) from None
        if kind == "cuda":
            check_source(code)
            return compile_source(code, arch, want_sass)
        if kind == "ptx":
            art = Artifacts(arch, "", code)
            art.cubin, art.ptxas_log = assemble(code, arch, "", target(arch))
        else:
            art = Artifacts(arch, "", "", cubin=code)
        if want_sass:
            art.sass = disassemble(art.cubin)
        return art
    try:
        _, src = lower(kernel, arch)
    except Exception as e:  # noqa: BLE001 - a TIRx parse/lowering error is the student's verdict
        raise BuildError(f"TIRx lowering for {arch} failed: {type(e).__name__}: {e}") from e
    return compile_source(src, arch, want_sass)


_COMPILED: dict[tuple, Artifacts] = {}


def compile_source(src: str, arch: str, want_sass: bool = False) -> Artifacts:
    """NVRTC to PTX, ptxas to cubin, cuobjdump to SASS. Results are kept per (source, arch) for
    the life of the process: several parts often inspect the same kernel."""
    import hashlib
    key = (hashlib.sha256(src.encode()).hexdigest(), arch, want_sass)
    if key not in _COMPILED:
        _COMPILED[key] = _compile_source(src, arch, want_sass)
    return dataclasses.replace(_COMPILED[key])


def _compile_source(src: str, arch: str, want_sass: bool) -> Artifacts:
    from tvm.support import nvcc
    configure_toolchain()
    tgt = target(arch)
    try:
        with tgt:
            ptx = bytes(nvcc.compile_cuda(src, "ptx", arch=arch, compiler="nvrtc", options=nvrtc_options()))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"NVRTC compilation for {arch} failed: {e}") from e
    ptx_text = ptx.decode(errors="replace").rstrip("\x00")
    art = Artifacts(arch, src, ptx_text)
    art.cubin, art.ptxas_log = assemble(ptx_text, arch, src, tgt)
    if want_sass:
        art.sass = disassemble(art.cubin)
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

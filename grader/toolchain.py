"""The CUDA toolchain the course compiles with: pip's CUDA packages (NVRTC, CCCL headers,
ptxas, cuobjdump) rather than whatever toolkit the machine happens to have, TVM's CUDA target
for an arch, and NVRTC from CUDA source to PTX. Used by the child (grader/devcode.py, in the
jail) and by the grader's side (grader/build.py, grader/launch.py) alike."""
from __future__ import annotations

import functools
import os
import shutil


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


def nvrtc_ptx(src: str, arch: str) -> str:
    """CUDA source to PTX text with NVRTC (BuildError with NVRTC's log)."""
    from tvm.support import nvcc
    configure_toolchain()
    try:
        with target(arch):
            ptx = bytes(nvcc.compile_cuda(src, "ptx", arch=arch, compiler="nvrtc", options=nvrtc_options()))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"NVRTC compilation for {arch} failed: {e}") from e
    return ptx.decode(errors="replace").rstrip("\x00")

"""The CUDA toolchain the course compiles with: pip's CUDA packages (NVRTC, CCCL headers,
ptxas, cuobjdump) rather than whatever toolkit the machine happens to have, TVM's CUDA target
for an arch, and NVRTC from CUDA source to PTX. Used by the child (grader/devcode.py, in the
jail) and by the grader's side (grader/build.py, grader/launch.py) alike."""
from __future__ import annotations

import functools
import os
import re
import shutil


class BuildError(Exception):
    pass


# A tool jail of the grader's (NVRTC, ptxas) that failed before or without its tool's own word:
# "<tool> for <arch> failed: jail: ..." is the grading machine's failure, never the kernel's.
_TOOL_JAIL_FAILED = re.compile(r"(?:NVRTC compilation|ptxas) for \w+ failed: (jail: [^\n]*)\s*")


def tool_jail_failure(e: BaseException) -> str | None:
    """What failed on the grading machine, when ``e`` is a build failure of a tool jail's own
    (the whole message in the grader's words), else None."""
    tool = _TOOL_JAIL_FAILED.fullmatch(str(e))
    if type(e).__name__ in ("BuildError", "AssemblyFailed") and tool:
        return tool.group(1)
    return None


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


# What tvm.support.nvcc's NVRTC path (apache-tvm 0.26) puts before a kernel's source, and the
# options it compiles with: nvrtc_ptx compiles the same program, so the PTX is the same byte for
# byte (tests/grader/test_toolchain.py compares the two on Lab 4's step 4, for both archs).
_TVM_NVRTC_PREAMBLE = """#include <cuda/std/cstdint>
using cuda::std::uint8_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::int8_t;
using cuda::std::int16_t;
using cuda::std::int32_t;
using cuda::std::int64_t;

// NVRTC uses asm/volatile instead of __asm__/__volatile__
#ifndef __asm__
#define __asm__ asm
#endif
#ifndef __volatile__
#define __volatile__ volatile
#endif

// NVRTC does not pull in the host <math.h>, so INFINITY is undefined. Provide it
// from libcu++ (same float +inf value nvcc's <math.h> yields).
#include <cuda/std/limits>
#ifndef INFINITY
#define INFINITY (::cuda::std::numeric_limits<float>::infinity())
#endif

"""
_TENSOR_MAP = ("struct alignas(64) CUtensorMap_st {\n  unsigned long long opaque[16];\n};\n"
               "typedef struct CUtensorMap_st CUtensorMap;\n\n")
# NVRTC's automatic precompiled header (-pch) covers the #include lines a program starts with:
# parsing the CCCL headers is about 1 s of every compile, and with -pch a process parses them
# once. So the program starts with the headers TVM's preamble includes and then those the
# kernel's source starts with, in that order, which is the order TVM's program first includes
# them in (so the PTX stays TVM's); the same lines further down are then no-ops.
_PREAMBLE_HEADERS = "#include <cuda/std/cstdint>\n#include <cuda/std/limits>\n"


def _leading_includes(code: str) -> str:
    lines = []
    for line in code.splitlines():
        if line.strip().startswith("#include <"):
            lines.append(line.strip() + "\n")
        elif line.strip():
            break
    return "".join(lines)


def nvrtc_program(src: str) -> str:
    """The program NVRTC compiles for a kernel's CUDA source: TVM's (cuda.h stripped, the
    CUtensorMap type defined where the kernel uses it, TVM's preamble) after the headers it
    starts by including."""
    code = "\n".join(line for line in src.splitlines() if line.strip() != "#include <cuda.h>")
    headers = _PREAMBLE_HEADERS + _leading_includes(code)
    if "CUtensorMap" in code:
        code = _TENSOR_MAP + code
    return headers + _TVM_NVRTC_PREAMBLE + code


def cuda_root() -> str:
    """The CUDA folder TVM's NVRTC path takes its headers from (tvm.support.nvcc.find_cuda_path,
    without importing TVM: a jailed compile has no use for it)."""
    if "CUDA_PATH" in os.environ:
        return os.environ["CUDA_PATH"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.realpath(os.path.join(nvcc, "../.."))
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    raise BuildError("no CUDA folder: set CUDA_PATH or install the course's pip packages")


def ptxas_flags() -> list[str]:
    """The ptxas options TVM's NVRTC path passes on (tvm.support.nvcc._ptxas_option_flags)."""
    import shlex
    return ["-v", f"--register-usage-level={os.environ.get('TVM_CUDA_PTXAS_REG_LEVEL', '10')}",
            "--warn-on-local-memory-usage"] + shlex.split(os.environ.get("TVM_CUDA_PTXAS_EXTRA_OPTS", ""))


def nvrtc_flags(arch: str) -> list[str]:
    """TVM's NVRTC options for ``arch`` (its include folders, macros, fast math, ptxas flags),
    then the course's (nvrtc_options)."""
    import platform
    import shlex
    cuda = cuda_root()
    arch_inc = os.path.join(cuda, "targets", f"{platform.machine()}-{platform.system().lower()}", "include")
    incs = [p for p in (os.path.join(cuda, "include"), arch_inc) if os.path.isdir(p)]
    if os.path.isdir(os.path.join(arch_inc, "cccl")):
        incs.append(os.path.join(arch_inc, "cccl"))
    flags = [f"--gpu-architecture={arch}", "-default-device", "--device-int128"] + [f"-I{p}" for p in incs]
    flags += [f"-D{m}=" for m in ("__NV_SILENCE_DEPRECATION_BEGIN", "__NV_SILENCE_DEPRECATION_END",
                                  "__NV_SILENCE_HOST_DEPRECATION_BEGIN", "__NV_SILENCE_HOST_DEPRECATION_END")]
    flags += [f"-U__CUDA_NO_{m}__" for m in ("HALF_OPERATORS", "HALF_CONVERSIONS", "BFLOAT16_OPERATORS",
                                             "BFLOAT16_CONVERSIONS", "BFLOAT162_OPERATORS", "BFLOAT162_CONVERSIONS")]
    flags += ["--use_fast_math"] + [f"--ptxas-options={f}" for f in ptxas_flags()]
    flags += shlex.split(os.environ.get("TVM_CUDA_NVRTC_EXTRA_OPTS", ""))
    return flags + nvrtc_options()


def reuse_headers(on: bool = True) -> None:
    """Whether this process's compiles keep NVRTC's precompiled headers for the next ones (off by
    default). Worth it in a process that compiles many kernels and can spare the room: a
    notebook's kernel, the test session. The headers are files of 200-350 MB each (one per
    arch and header set), in a folder of this process's own, removed when it exits; the
    grader's children and tool jails, with a small /tmp, leave it off. ``GRADER_NVRTC_HEADERS=0``
    in the environment keeps it off everywhere."""
    _PCH["on"] = on and os.environ.get("GRADER_NVRTC_HEADERS") != "0"


_PCH: dict = {"on": False, "dir": None}


def _pch_dir() -> str:
    if _PCH["dir"] is None:
        import atexit
        import tempfile
        _PCH["dir"] = tempfile.mkdtemp(prefix="nvrtc-headers-")
        atexit.register(shutil.rmtree, _PCH["dir"], True)
    return _PCH["dir"]


def nvrtc_ptx(src: str, arch: str, reuse: bool | None = None) -> str:
    """CUDA source to PTX text with NVRTC (BuildError with NVRTC's log): the PTX TVM's NVRTC path
    makes. ``reuse``: keep the parsed headers for the next compiles (default: reuse_headers).
    A compile that fails with them is tried again without, and the process stops keeping them."""
    if reuse is None:
        reuse = _PCH["on"]
    if not reuse:
        return _nvrtc(src, arch, [])
    try:
        return _nvrtc(src, arch, ["-pch", f"--pch-dir={_pch_dir()}"])
    except BuildError:
        ptx = _nvrtc(src, arch, [])          # the kernel's own error, if it has one
        _PCH["on"] = False                   # else the headers were the trouble (no room to write them)
        return ptx


def _nvrtc(src: str, arch: str, extra: list[str]) -> str:
    from cuda.bindings import nvrtc
    configure_toolchain()
    flags = nvrtc_flags(arch) + extra
    if extra:
        _size_header_heap(nvrtc)
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(nvrtc_program(src).encode(), b"tvm_kernels.cu", 0, None, None)
    if err != ok:
        raise BuildError(f"NVRTC compilation for {arch} failed: cannot create the program ({err})")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), [f.encode() for f in flags])
        if err != ok:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise BuildError(f"NVRTC compilation for {arch} failed:\n{log.decode(errors='replace').rstrip(chr(0))}")
        if extra:
            _grow_header_heap(nvrtc, prog)
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(prog, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return ptx.decode(errors="replace").rstrip("\x00")


_HEAP = 1 << 30


@functools.lru_cache(maxsize=1)
def _size_header_heap(nvrtc) -> None:
    """NVRTC maps the precompiled headers it uses into a heap of fixed size (256 MiB by default),
    and resizing it drops those it holds. The headers of a tcgen05 kernel (cuda/barrier and
    cooperative_groups) need about 350 MB of it and those of a wgmma kernel about 210 MB, and a
    process that compiles both keeps both: so the heap is sized before the first."""
    _, have = nvrtc.nvrtcGetPCHHeapSize()
    if have < _HEAP:
        nvrtc.nvrtcSetPCHHeapSize(_HEAP)


def _grow_header_heap(nvrtc, prog) -> None:
    """Headers that did not fit: the heap grows by what they need (up to 4 GiB), and the next
    compile makes them."""
    (status,) = nvrtc.nvrtcGetPCHCreateStatus(prog)
    if status != nvrtc.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
        return
    _, need = nvrtc.nvrtcGetPCHHeapSizeRequired(prog)
    _, have = nvrtc.nvrtcGetPCHHeapSize()
    if have + need <= 4 * _HEAP:
        nvrtc.nvrtcSetPCHHeapSize(have + need)


# ---------------------------------------------------------------- NVRTC in worker processes
#
# NVRTC takes most of a kernel's build (about 1.2 s of 1.7 s for an attention kernel), and a
# check cell builds a kernel per shape, one after the other. In this process the compiles
# cannot overlap: NVRTC holds a lock of its own for most of a compile, so threads gain little.
# ``nvrtc_later`` hands the compile to a pool of fresh Python processes (spawned, not forked:
# the notebook's process has CUDA and threads) that import this module alone, so a cell's
# kernels compile side by side while it builds the next kernel's source or runs the last one.
# The workers keep no precompiled headers (hundreds of MB each on disk). The PTX is NVRTC's of
# the same source with the same options: byte for byte what nvrtc_ptx gives.

def nvrtc_workers() -> int:
    """How many worker processes compile at once: ``GRADER_NVRTC_WORKERS``, else one per two
    cores up to six (a check cell's shapes); 0 or 1 compiles in this process."""
    raw = os.environ.get("GRADER_NVRTC_WORKERS")
    if raw is not None:
        return max(0, int(raw))
    return min(6, (os.cpu_count() or 1) // 2)


_POOL: dict = {"pool": None, "size": 0}


def _pool():
    import concurrent.futures
    import multiprocessing
    n = nvrtc_workers()
    if n < 2:
        return None
    if _POOL["pool"] is None or _POOL["size"] != n:
        if _POOL["pool"] is not None:
            _POOL["pool"].shutdown(wait=False, cancel_futures=True)
        _POOL["pool"] = concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
        _POOL["size"] = n
    return _POOL["pool"]


def _nvrtc_plain(src: str, arch: str) -> str:
    return _nvrtc(src, arch, [])


class Later:
    """The PTX of one source, compiled by a worker process (or here, when there is none)."""

    def __init__(self, src: str, arch: str, future=None):
        self.src, self.arch, self.future = src, arch, future

    def result(self) -> str:
        """The PTX, or the compile's BuildError. A worker that died (killed, out of memory) takes
        down the pool, not the compile: the source is compiled here instead."""
        if self.future is not None:
            import concurrent.futures.process
            try:
                return self.future.result()
            except concurrent.futures.process.BrokenProcessPool:
                _POOL["pool"] = None
        return nvrtc_ptx(self.src, self.arch)


def nvrtc_later(src: str, arch: str) -> Later:
    """``nvrtc_ptx(src, arch)`` started in a worker process when there are workers
    (nvrtc_workers); ``result()`` waits for it. Without workers, ``result()`` compiles here."""
    pool = _pool()
    if pool is None:
        return Later(src, arch)
    try:
        return Later(src, arch, pool.submit(_nvrtc_plain, src, arch))
    except RuntimeError:                      # a broken or shut-down pool: compile here
        _POOL["pool"] = None
        return Later(src, arch)

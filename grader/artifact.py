"""Kernel libraries made by the sandboxed child, checked before the grader uses them.

The child compiles the student's kernel with ``tvm.compile`` and exports it as a shared library
(host code, plus the CUDA module embedded in it). The grader never trusts that file:

- ``device_code(path)`` reads the embedded device code (CUDA source, cubin or PTX) out of the
  file's bytes without loading it; compile-only parts compile or disassemble it themselves
  (grader/build.py) and inspect that SASS, so comments or forged listings cannot satisfy a
  mechanism check.
- ``vet(path)`` runs before the GPU harness loads a library: its host code may only use TVM's
  runtime interface (undefined symbols from an allowlist: TVM FFI entry points, compiler
  runtime helpers, memory and math functions), may not contain system-call instructions, may
  not need other libraries than libc/libm, and may not name any packed function registered in
  the harness other than TVM's CUDA runtime helpers (a registered Python function reached from
  host code would run Python instead of a kernel).

Why a library and not IR: apache-tvm 0.26's IR serialization (``tvm.ir.save_json``) crashes on
TIR nodes and TVMScript does not round-trip TIRx kernels, so IR cannot cross the process
boundary. The residual risk is a hand-forged library built to evade these checks; the checks
make every route a TVM-generated library can take explicit.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess

ALLOWED_SYMBOL = re.compile(
    r"^(TVMFFI\w*|__TVMFFI\w*|TVMBackend\w*|__tvm\w*|__cxa_finalize|__gmon_start__|_ITM_\w+"
    r"|__truncsfhf2|__extendhfsf2|__truncdfhf2|__gnu_[hf]2\w*|__stack_chk_fail"
    r"|memcpy|memset|memmove|memcmp"
    r"|(?:sqrt|exp|exp2|expm1|log|log2|log1p|pow|fma|fmod|tanh|sin|cos|tan|erf|floor|ceil|round|trunc|fabs|hypot)f?)$")
ALLOWED_LIBS = re.compile(r"^(libc\.so\.\d+|libm\.so\.\d+|ld-linux[\w.-]*)$")
ALLOWED_PACKED = {"__tvm_set_device", "runtime.cuTensorMapEncodeTiled", "runtime.cuTensorMapEncodeIm2col",
                  "__tvm_ffi_main"}
SYSCALL = re.compile(r"\t(syscall|sysenter|int\s+\$0x80)\b")


class Rejected(Exception):
    """The library breaks a rule; the message says which."""


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise Rejected(f"cannot check the kernel library: {name} (binutils) is not installed")
    return exe


def _run(args: list[str]) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise Rejected(f"not a shared library the grader can read ({out.stderr.strip()[:200]})")
    return out.stdout


def vet(path: str, registered: set[str] | frozenset = frozenset()) -> list[str]:
    """Raise Rejected when the library may do more than launch its kernels; return the names of
    the packed functions it refers to (for the report)."""
    undefined = [ln.split()[-1] for ln in _run([_tool("nm"), "-D", "--undefined-only", path]).splitlines()
                 if ln.strip()]
    bad = sorted({s.split("@")[0] for s in undefined if not ALLOWED_SYMBOL.match(s.split("@")[0])})
    if bad:
        raise Rejected(f"the kernel's host code calls functions outside TVM's runtime: {', '.join(bad[:10])}")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _run([_tool("readelf"), "-d", path]))
    bad = [n for n in needed if not ALLOWED_LIBS.match(n)]
    if bad:
        raise Rejected(f"the kernel library needs other libraries: {', '.join(bad)}")
    if SYSCALL.search(_run([_tool("objdump"), "-d", "--no-show-raw-insn", path])):
        raise Rejected("the kernel library contains system-call instructions")
    with open(path, "rb") as f:
        data = f.read()
    strings = {s.decode() for s in re.findall(rb"[\x21-\x7e]{3,200}", data)}
    named = sorted(s for s in strings & set(registered) if s not in ALLOWED_PACKED)
    if named:
        raise Rejected(f"the kernel's host code names packed functions outside TVM's CUDA runtime: {', '.join(named[:10])}")
    return sorted(strings & (set(registered) | ALLOWED_PACKED))


def _prefixed_text(data: bytes, marker: bytes) -> str | None:
    """The length-prefixed UTF-8 string of TVM's module serialization that contains ``marker``."""
    first = data.find(marker)
    if first < 0:
        return None
    for start in range(first, max(8, first - (4 << 20)), -1):
        (n,) = struct.unpack_from("<Q", data, start - 8)
        if first - start < n <= len(data) - start and n < (64 << 20):
            try:
                text = data[start:start + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if "\x00" not in text:
                return text
    return None


def _embedded_cubin(data: bytes) -> bytes | None:
    """An ELF for the CUDA machine (e_machine 190) embedded in the library, cut at its end."""
    at = data.find(b"\x7fELF", 1)
    while at > 0:
        if len(data) >= at + 64 and data[at + 4] == 2:
            machine, = struct.unpack_from("<H", data, at + 18)
            phoff, shoff = struct.unpack_from("<QQ", data, at + 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, at + 54)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            if machine == 190 and at + end <= len(data):
                for i in range(shnum):           # sections may lie after the header tables
                    h = at + shoff + i * shentsize
                    if h + 64 > len(data):
                        break
                    sh_type, = struct.unpack_from("<I", data, h + 4)
                    off, size = struct.unpack_from("<QQ", data, h + 24)
                    if sh_type != 8:             # SHT_NOBITS occupies no bytes in the file
                        end = max(end, off + size)
                for i in range(phnum):
                    h = at + phoff + i * phentsize
                    if h + 56 <= len(data):
                        off, = struct.unpack_from("<Q", data, h + 8)
                        filesz, = struct.unpack_from("<Q", data, h + 32)
                        end = max(end, off + filesz)
                if at + end <= len(data):
                    return data[at:at + end]
        at = data.find(b"\x7fELF", at + 1)
    return None


def device_code(path: str) -> tuple[str, object]:
    """The device code embedded in an exported TVM library, read from its bytes without loading
    it: ("cuda", source) when the library was made without a GPU, else ("cubin", bytes) or
    ("ptx", text). Raises Rejected when there is none."""
    with open(path, "rb") as f:
        data = f.read()
    src = _prefixed_text(data, b"__global__")
    if src is not None:
        return "cuda", src
    cubin = _embedded_cubin(data)
    if cubin is not None:
        return "cubin", cubin
    ptx = _prefixed_text(data, b".target sm_")
    if ptx is not None:
        return "ptx", ptx
    raise Rejected("the kernel library holds no CUDA kernel (no source, cubin or PTX)")

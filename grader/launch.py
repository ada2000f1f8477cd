"""How many CTAs a kernel launches, without running it.

A compile-only part sees the kernel's device code, and device code does not hold the grid: a
kernel whose tile count is zero at the part's small shape (``T.cta_id([M // 512 * ...])`` with
M = 256) compiles to the same SASS as one that launches hundreds of CTAs, and would pass every
mechanism check while doing nothing. The grid is in the host code that launches it:

- ``primfunc_ctas(func)``: a TIRx PrimFunc (a notebook's own check cells) declares it in
  ``T.cta_id([...])``, a ``ScopeIdDef`` of the kernel -> cta scope.
- ``library_ctas(path)``: a kernel library exported by the grader's child (grading) launches
  each device function through a packed call whose last arguments are the launch parameters,
  named in the library's device-module metadata (``blockIdx.x``, ``threadIdx.x``, ...); their
  values are immediates stored into the call's argument array, which ``objdump`` shows.

Both return None when they cannot tell (a form they do not know): then nothing is concluded.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess

_SCOPE_DEF = re.compile(r'T\.ScopeIdDef\(\[[^\]]*\],\s*\[([^\]]*)\],\s*"kernel",\s*"cta"\)')


def primfunc_ctas(func) -> int | None:
    """CTAs launched by a TIRx PrimFunc: the product of its kernel -> cta extents."""
    try:
        import tvm
    except ImportError:
        return None
    extents: list[str] = []

    def visit(node):
        if type(node).__name__ == "ScopeIdDefStmt":
            m = _SCOPE_DEF.search(str(getattr(node, "def")))
            if m:
                extents.extend(x.strip() for x in m.group(1).split(","))

    try:
        tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    except Exception:  # noqa: BLE001 - not a PrimFunc this module understands
        return None
    if not extents or not all(re.fullmatch(r"\d+", e) for e in extents):
        return None
    return math.prod(int(e) for e in extents)


# The metadata of a CUDA device module in a TVM library: per function its name (twice), its
# argument types, then its launch-parameter tags, each string prefixed by its length (8 bytes).
_TAG = rb"(?:clusterCtaIdx|preferredClusterCtaIdx|blockIdx|threadIdx)\.[xyz]|tirx\.use_dyn_shared_memory"


def _launch_tags(data: bytes, name: str) -> list[str] | None:
    n = name.encode()
    head = re.compile(re.escape(bytes([len(n)]) + b"\0" * 7 + n) * 2)
    m = head.search(data)
    if not m:
        return None
    pos = m.end()
    nargs = int.from_bytes(data[pos:pos + 8], "little")
    pos += 8 + 4 * nargs                      # argument types, 4 bytes each
    ntags = int.from_bytes(data[pos:pos + 8], "little")
    pos += 8
    tags = []
    for _ in range(ntags):
        length = int.from_bytes(data[pos:pos + 8], "little")
        tag = data[pos + 8:pos + 8 + length]
        if not re.fullmatch(_TAG, tag):
            return None
        tags.append(tag.decode())
        pos += 8 + length
    return tags


_CALLEE = re.compile(r"<\.tvm_func\.([\w.]+)>")
_STORE_IMM = re.compile(r"movq\s+\$0x([0-9a-f]+),(0x[0-9a-f]+)?\(%rsp\)")
_STORE_ANY = re.compile(r"mov\w*\s+\S+,(0x[0-9a-f]+)?\(%rsp\)")
_NARGS = re.compile(r"mov\s+\$0x([0-9a-f]+),%edx")
_ARGS_BASE = re.compile(r"(?:lea\s+(0x[0-9a-f]+)?\(%rsp\)|mov\s+%rsp),%rsi")


def library_ctas(path: str) -> dict[str, int | None] | None:
    """{device function: CTAs per launch} for the kernels a library launches (None for a launch
    whose grid is not an immediate); None when the library's form is not the one known here."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        out = subprocess.run([objdump, "-d", "--no-show-raw-insn", path], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    lines = out.stdout.splitlines()
    found: dict[str, int | None] = {}
    for i, line in enumerate(lines):
        m = _CALLEE.search(line)
        if not m or not line.split("\t")[-1].startswith("mov "):
            continue                         # the call site loads the handle with mov, not lea
        name = m.group(1)
        tags = _launch_tags(data, name)
        if tags is None:
            continue                         # a packed function that is not a device kernel
        # the stores into the argument array: back from the handle lookup of this function
        # (lea <.tvm_func.NAME>, lea <__tvm_func_handle_init.NAME>, call) to the previous call
        j = i
        while j > 0 and not (_CALLEE.search(lines[j - 1]) and "lea " in lines[j - 1]
                             and _CALLEE.search(lines[j - 1]).group(1) == name):
            j -= 1
            if i - j > 12:
                return None
        j -= 1
        while j > 0 and "call " not in lines[j - 1]:
            j -= 1
        block = lines[j:i + 8]
        nargs = next((int(x.group(1), 16) for x in map(_NARGS.search, block) if x), None)
        base = next((int(x.group(1) or "0", 16) for x in map(_ARGS_BASE.search, block) if x), None)
        if nargs is None or base is None or nargs < len(tags):
            return None
        values: dict[int, int | None] = {}
        for ln in lines[j:i]:
            s = _STORE_ANY.search(ln)
            if s:
                off = int(s.group(1) or "0", 16)
                imm = _STORE_IMM.search(ln)
                values[off] = int(imm.group(1), 16) if imm else None
        grid = 1
        for k, tag in enumerate(tags):
            if not tag.startswith("blockIdx."):
                continue
            slot = nargs - len(tags) + k
            v = values.get(base + 16 * slot + 8)
            if v is None:
                grid = None
                break
            grid *= v
        found[name] = grid
    return found or None

"""Mechanism checks: does the generated code use the hardware path the part is about?

A part's spec lists mechanism names; each name maps to an instruction pattern searched in code
the grader itself compiled from the kernel's CUDA source: the SASS of the cubin (comments in PTX
or CUDA cannot satisfy a check: SASS has none), or, where SASS cannot tell two things apart, the
PTX that NVRTC made from that source, read as instructions (comments, strings and directives
removed, one instruction per line). A check passes when the pattern occurs at least
``min_count`` times.

Checks read the launched code only (``launched_texts``): the SASS sections and PTX bodies of the
entries the launch plan launches and of the functions they call, transitively. An entry the plan
does not launch (a decoy holding every instruction a check looks for) is never read. This is a
static reading: code inside a launched entry that never runs (a dead branch) is not excluded;
``STATIC`` says so in every build part's report. ``grading.build_part`` takes other listings
(e.g. of the instructions a GPU executed) in its place, with their own provenance label.

Three checks read more than one listing (``Mechanism.check``):

- ``mbarrier_expect_tx``: a remote ``mbarrier.arrive.expect_tx`` (the book's 2-CTA cluster arms
  the leader's barrier through ``remote_view(0)``) assembles to ``SYNCS.ARRIVE.TRANS64.RED`` with
  a byte-count register, and so does an arrive that ptxas itself emits for a 2-CTA TMEM
  allocation (``tcgen05.alloc.cta_group::2``). So the PTX instruction counts, confirmed by an
  arrive with a transaction count in the SASS; with SASS alone only the forms no setup code
  produces count (see ``SYNCS_ARRIVE``).
- ``mma_smem_swizzled``: the swizzle mode of every tensor-core shared-memory descriptor, read from
  the descriptor-encoding calls of the CUDA source (their last argument is the mode).
- ``mbarrier_ring*``: the stages of the kernel's ring: the number of distinct mbarriers that
  TMA loads complete on (the barrier operand of ``cp.async.bulk.tensor ...
  mbarrier::complete_tx``), the addresses followed through the PTX (``ring_stages``); the
  warp-specialized ring also needs its full, empty and accumulator barriers initialised.
- ``mma_smem_swizzled`` reads the CUDA source as a whole (static, like the others).

The wgmma accumulator-hazard check reads the same SASS.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Callable

# cuobjdump's forms of the mbarrier arrive (ptxas 13 for sm_90a and sm_100a; one instruction of
# PTX each, checked with ptxas):
#   mbarrier.arrive.expect_tx.shared::cta  [bar], tx      SYNCS.ARRIVE.TRANS64 RZ, [UR4], R0
#   mbarrier.arrive.expect_tx.shared::cluster [bar], tx   SYNCS.ARRIVE.TRANS64.RED RZ, [UR4], R0
#   mbarrier.expect_tx [bar], tx (either space)           SYNCS.ARRIVE.TRANS64.RED.A0TR RZ, [UR4], R0
#   mbarrier.arrive [bar]                                 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ
#   mbarrier.arrive.shared::cluster [bar]                 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4], RZ
#   mbarrier.arrive [bar], count                          SYNCS.ARRIVE.TRANS64.ART0 RZ, [UR4], R0
# ptxas's own code for tcgen05.alloc.cta_group::2 holds one SYNCS.ARRIVE.TRANS64.RED with a
# register (4 bytes of the TMEM address sent to the peer CTA), so that form alone proves nothing.
_SYNCS = r"\bSYNCS\.ARRIVE\.TRANS64{mods}\s+RZ,\s*\[[^\]]*\],\s*(?:U?R\d+|0x[0-9a-f]+)"
SYNCS_ARRIVE = {
    "arrive_tx": re.compile(_SYNCS.format(mods="")),                 # this CTA: arrive and bytes
    "expect_tx": re.compile(_SYNCS.format(mods=r"(?:\.RED)?\.A0TR")),  # bytes only
    "remote_arrive_tx": re.compile(_SYNCS.format(mods=r"\.RED")),    # another CTA's barrier (or ptxas's)
    "no_tx": re.compile(r"\bSYNCS\.ARRIVE\.TRANS64(?:\.RED)?\.A(?:1|R)T0\b"),  # arrivals, no bytes
}
PTX_EXPECT_TX = re.compile(
    r"^[ \t]*(?:@!?%?\w+[ \t]+)?mbarrier\.(?:arrive(?:_drop)?\.expect_tx|expect_tx)\.[\w:.]*[ \t][^;]*;", re.M)
PTX_MBARRIER_INIT = re.compile(r"^[ \t]*(?:@!?%?\w+[ \t]+)?mbarrier\.init\.[\w:.]*[ \t][^;]*;", re.M)
# The swizzle argument of TVM's descriptor encoders (0 none, 1 32B, 2 64B, 3 128B, 4 128B with
# 32-byte atomicity), in the generated CUDA source.
DESCRIPTOR_CALLS = ("tvm_builtin_ptx_tcgen05_encode_matrix_descriptor", "ptx_wgmma_encode_matrix_descriptor")
SWIZZLE_NAMES = {0: "SWIZZLE_NONE", 1: "32B", 2: "64B", 3: "128B", 4: "128B (32B atoms)"}


def strip_comments(code: str) -> str:
    """PTX or CUDA without its comments (``//`` to the end of the line, ``/* ... */``) and without
    the contents of string literals, so that neither can satisfy a check."""
    return _COMMENT_OR_STRING.sub(lambda m: '""' if m.group(0).startswith('"') else " ", code)


_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', re.S)


@dataclasses.dataclass
class CheckResult:
    name: str
    ok: bool
    count: int
    message: str


@dataclasses.dataclass(frozen=True)
class Mechanism:
    name: str
    description: str
    where: str          # "ptx", "cuda" or "sass": the listing the pattern is searched in
    pattern: str
    min_count: int = 1
    # a check that reads more than one listing: (mechanism, texts) -> CheckResult
    custom: Callable[["Mechanism", dict], CheckResult] | None = None

    def check(self, texts: dict[str, str]) -> CheckResult:
        if self.custom is not None:
            return self.custom(self, texts)
        text = texts.get(self.where, "")
        if not text:
            return CheckResult(self.name, False, 0, f"{self.description}: no {self.where.upper()} to inspect")
        if self.where == "ptx":
            text = "\n".join(ptx_instructions(text))
        elif self.where == "cuda":
            text = strip_comments(text)
        count = len(re.findall(self.pattern, text, flags=re.M))
        ok = count >= self.min_count
        need = f", at least {self.min_count} needed" if self.min_count > 1 and not ok else ""
        return CheckResult(self.name, ok, count,
                           f"{self.description}: {'found' if ok else 'MISSING'} ({count} in {self.where.upper()}{need})")


# ---------------------------------------------------------------- the launched code

STATIC = "static (launched entries only; dead code not excluded)"

_PTX_FUNCTION = re.compile(r"(?<![\w$.])\.(entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)")
_LABELS = re.compile(r"^\s*(?:[A-Za-z_$][\w$]*:(?!:)\s*)+")
_NAME = re.compile(r"(?<![\w$%.])[A-Za-z_$][\w$]*")


def ptx_instructions(ptx: str) -> list[str]:
    """The instructions of PTX text (a module or a function body), one string each, ending in
    ``;``, whitespace collapsed: comments, strings, directives (``.reg``, ``.entry ...``, ...),
    labels and scope braces removed. What a PTX check reads: a word in a comment, in a string
    or after the last instruction is not an instruction."""
    return list(_instructions(ptx))


@functools.lru_cache(maxsize=64)
def _instructions(ptx: str) -> tuple[str, ...]:
    out, buf = [], []
    for ch in strip_comments(ptx):
        if ch in "{}":
            head = _LABELS.sub("", "".join(buf)).strip()
            if not head or (head.startswith(".") and "=" not in head):
                buf = []                 # a scope brace, or the brace that opens a function body
                continue
        if ch == ";":
            ins = " ".join(_LABELS.sub("", "".join(buf)).split())
            buf = []
            if ins and not ins.startswith(".") and ins not in ("{", "}"):
                out.append(ins + ";")
            continue
        buf.append(ch)
    return tuple(out)


def ptx_functions(ptx: str) -> dict[str, tuple[str, str]]:
    """Each function of a PTX module that has a body: name -> (``"entry"`` or ``"func"``, body
    text without comments or strings). Declarations without a body (``.extern .func``) are left
    out."""
    code, out, pos = strip_comments(ptx), {}, 0
    while True:
        m = _PTX_FUNCTION.search(code, pos)
        if m is None:
            return out
        i = m.end()
        while i < len(code) and code[i].isspace():
            i += 1
        if i < len(code) and code[i] == "(":                 # the parameter list
            depth = 0
            while i < len(code):
                depth += {"(": 1, ")": -1}.get(code[i], 0)
                i += 1
                if depth == 0:
                    break
        brace, semi = code.find("{", i), code.find(";", i)
        if brace < 0 or (0 <= semi < brace):                 # a declaration
            pos = max(i, semi + 1)
            continue
        depth, j = 0, brace
        while j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
            if depth == 0:
                break
        out.setdefault(m.group(2), (m.group(1), code[brace + 1:j - 1]))
        pos = j


def _opcode(ins: str) -> tuple[str, str]:
    """(opcode, operands) of one instruction of ``ptx_instructions``, its guard removed."""
    body = re.sub(r"^@!?%?[\w$]+\s+", "", ins).rstrip(";").strip()
    op, _, rest = body.partition(" ")
    return op, rest


def ptx_callees(body: str, functions) -> set[str]:
    """The ``.func`` functions a body calls or takes the address of (any use of the name outside
    a branch), so that code reached through a call is read too."""
    names = set()
    for ins in ptx_instructions(body):
        op, rest = _opcode(ins)
        if op.startswith(("bra", "brx")):
            continue
        names.update(n for n in _NAME.findall(rest) if functions.get(n, ("",))[0] == "func")
    return names


_SASS_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$", re.M)
_SASS_CALL_TARGET = re.compile(r"\bCALL\.[^;\n]*?`\(([^)`\s]+)\)")


def sass_functions(sass: str) -> dict[str, str]:
    """cuobjdump's listing split into its ``Function : <name>`` sections: name -> section text
    (a section ends at the next one, or at the next architecture's listing)."""
    out, marks = {}, list(_SASS_FUNCTION.finditer(sass))
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(sass)
        arch = sass.find("code for sm_", m.end(), end)
        out[m.group(1)] = out.get(m.group(1), "") + sass[m.start():arch if arch >= 0 else end]
    return out


def launched_functions(plan: dict | None, ptx: str, sass: str = "") -> list[str]:
    """The entries the launch plan launches and every function they call, transitively, in the
    PTX (calls and taken addresses) and in the SASS (``CALL`` targets cuobjdump names). Without
    a plan, every entry of the PTX."""
    funcs = ptx_functions(ptx)
    sections = sass_functions(sass) if sass else {}
    if plan and plan.get("launches"):
        todo = [ln["name"] for ln in plan["launches"]]
    else:
        todo = [n for n, (kind, _) in funcs.items() if kind == "entry"]
    seen: list[str] = []
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.append(name)
        if name in funcs:
            todo.extend(sorted(ptx_callees(funcs[name][1], funcs)))
        if name in sections:
            todo.extend(_SASS_CALL_TARGET.findall(sections[name]))
    return seen


def launched_texts(art) -> dict[str, str]:
    """The listings the mechanism checks read for a compiled kernel ``art`` (build.Artifacts):
    ``sass``, the cuobjdump sections of the launched functions (``launched_functions``);
    ``ptx``, their PTX instructions, one per line, under an ``.entry NAME;``/``.func NAME;``
    line naming each function; ``cuda``, the CUDA source as it is (its one check reads the descriptors of
    the whole source). A static reading: see ``STATIC``."""
    names = launched_functions(art.plan, art.ptx or "", art.sass or "")
    funcs = ptx_functions(art.ptx or "")
    sections = sass_functions(art.sass) if art.sass else {}
    ptx_lines = []
    for name in names:
        if name in funcs:
            ptx_lines.append(f".{funcs[name][0]} {name};")
            ptx_lines.extend(ptx_instructions(funcs[name][1]))
    return {"sass": "".join(sections[n] for n in names if n in sections),
            "ptx": "\n".join(ptx_lines) + ("\n" if ptx_lines else ""),
            "cuda": art.cuda_source or ""}


# ---------------------------------------------------------------- the stages of a ring

# A value in the PTX, as far as the ring check follows it: None (unknown, possibly an address),
# or (symbol, c, s): symbol + c + k * s for some integer k (s = 0: exactly symbol + c; symbol
# None: a plain integer). Congruences join: a loop-carried index stays bounded to its stride.
_UNKNOWN_INT = (None, 0, 1)
_NO_DEST = ("st", "red", "bar", "barrier", "fence", "membar", "bra", "brx", "call", "ret", "exit", "trap",
            "cp", "prefetch", "setmaxnreg", "griddepcontrol", "tcgen05", "wgmma", "stmatrix", "multimem",
            "discard", "applypriority", "nanosleep", "mbarrier.init", "mbarrier.inval")
_INT = re.compile(r"^(-?)(0[xX][0-9a-fA-F]+|\d+)U?$")
_ADDRESS = re.compile(r"^\[\s*([^\]\s+]+)\s*(?:\+\s*(-?\s*(?:0[xX][0-9a-fA-F]+|\d+)))?\s*\]$")


def _operands(rest: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in rest:
        depth += {"[": 1, "{": 1, "(": 1, "]": -1, "}": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _join(a, b):
    if a is None or b is None or a[0] != b[0]:
        return None
    s = math.gcd(a[2], b[2], abs(a[1] - b[1]))
    return (a[0], a[1] % s if s else a[1], s)


def _values(instrs: list[str]) -> Callable:
    """The value (see above) of an operand of one function's instructions, flow-insensitive:
    every definition of a register joins into its value, iterated to a fixed point."""
    parsed = []
    for ins in instrs:
        op, rest = _opcode(ins)
        ops = _operands(rest)
        dests = []
        if ops and not op.startswith(_NO_DEST) and not ops[0].startswith("["):
            if ops[0].startswith("{"):           # a vector of registers: each an unknown integer
                dests = [d.strip() for d in ops[0].strip("{}").split(",")]
                op, ops = "vector", [ops[0]]
            else:
                dests = [d.strip() for d in ops[0].split("|")]
        parsed.append((op, ops, dests))
    regs = {d for _, _, ds in parsed for d in ds}
    env: dict = {}
    bottom = object()

    def ev(tok):
        tok = tok.strip()
        m = _INT.match(tok)
        if m:
            return (None, int(m.group(2), 0) * (-1 if m.group(1) else 1), 0)
        if tok in regs:
            return env.get(tok, bottom)
        if tok.startswith("%") or not re.fullmatch(r"[A-Za-z_$][\w$]*", tok):
            return _UNKNOWN_INT                   # a special register (%tid.x, ...), a float literal
        return (tok, 0, 0)                         # a symbol: a shared variable, a parameter

    def step(op, ops):
        src = [ev(o) for o in ops[1:]]
        if any(v is bottom for v in src):
            return bottom
        base = op.split(".")[0]
        if base in ("mov", "cvt", "cvta", "mapa") and src:
            return src[0]
        if base == "selp" and len(src) >= 2:
            return _join(src[0], src[1])
        if None in src:
            return None
        if base in ("add", "sub") and len(src) == 2:
            a, b = src
            if b[0] is not None and (base == "add" or a[0] != b[0]):
                if base == "add" and a[0] is None:
                    a, b = b, a
                else:
                    return None
            sign = 1 if base == "add" else -1
            sym = a[0] if b[0] is None else None
            return (sym, a[1] + sign * b[1], math.gcd(a[2], b[2]))
        if base in ("shl", "mul", "mad") and len(src) >= 2 and src[0][0] is None and src[1][0] is None:
            a, b = src[0], src[1]
            if base == "shl":
                b = (None, 1 << b[1], 0) if b[2] == 0 and 0 <= b[1] < 64 else _UNKNOWN_INT
            if a[2] and b[2]:
                prod = _UNKNOWN_INT
            else:
                prod = (None, a[1] * b[1], abs(a[1] * b[2] + b[1] * a[2]) if a[2] or b[2] else 0)
            if base == "mad" and len(src) >= 3:
                c = src[2]
                return None if c is None else (c[0], prod[1] + c[1], math.gcd(prod[2], c[2]))
            return prod
        return None if any(v[0] is not None for v in src) else _UNKNOWN_INT

    for _ in range(64):
        changed = False
        for op, ops, dests in parsed:
            if not dests:
                continue
            v = step(op, ops)
            if v is bottom:
                continue
            for d in dests:
                new = v if d not in env else _join(env[d], v)
                if d not in env or new != env[d]:
                    env[d], changed = new, True
        if not changed:
            break
    else:
        env.update((r, None) for r in regs)      # no fixed point: every register unknown
    return ev


def _address(tok: str, ev):
    m = _ADDRESS.match(tok.strip())
    if not m:
        return None
    v = ev(m.group(1))
    if not isinstance(v, tuple):
        return None
    off = int(m.group(2).replace(" ", ""), 0) if m.group(2) else 0
    return (v[0], v[1] + off, v[2])


@dataclasses.dataclass
class Ring:
    stages: int            # distinct mbarriers the TMA loads complete on
    barriers: int          # distinct mbarriers initialised
    names: list            # the stages' barriers, as shared variable + byte offset
    unresolved: int        # barrier operands whose address could not be followed


def _name(addr) -> str:
    sym, c, s = addr
    text = sym or str(c) if not c or not sym else f"{sym}+{c}"
    return text + (f"+{s}k" if s else "")


_LISTING_HEADER = re.compile(r"^\.(?:entry|func) [\w$]+;$", re.M)


def ring_stages(ptx: str) -> Ring:
    """The ring of the PTX functions in ``ptx`` (a ``launched_texts`` listing, or a module): its
    stages are the distinct mbarriers that TMA loads complete on (the barrier operand of
    ``cp.async.bulk.tensor ... mbarrier::complete_tx``, or of a bulk copy); without any TMA load,
    those ``expect_tx`` arms. Not a count of ``mbarrier.init``: the barriers of the MMA, of the
    empty slots and of the accumulator are not stages. A barrier address is followed through the
    PTX's integer arithmetic to a shared variable plus a byte offset; one indexed at run time
    (``bar[stage]``) reaches the initialised barriers of its array (its offset modulo its stride).
    A known limit: loads of one buffer split over several barriers (A on one, B on another)
    count as that many stages."""
    if _LISTING_HEADER.search(ptx):              # a launched_texts listing: split at its headers
        chunks = [ptx_instructions(c) for c in _LISTING_HEADER.split(ptx)]
    else:                                        # a module: its functions
        chunks = [ptx_instructions(body) for _, body in ptx_functions(ptx).values()] or [ptx_instructions(ptx)]
    inits, loads, armed = [], [], []
    for instrs in chunks:
        ev = _values(instrs)
        for ins in instrs:
            op, rest = _opcode(ins)
            ops = _operands(rest)
            if op.startswith("mbarrier.init") and ops:
                inits.append(_address(ops[0], ev))
            elif op.startswith("cp.async.bulk.tensor") and "mbarrier::complete_tx" in op and len(ops) >= 3:
                loads.append(_address(ops[2], ev))
            elif op.startswith("cp.async.bulk.") and "mbarrier::complete_tx" in op and len(ops) >= 4:
                loads.append(_address(ops[3], ev))
            elif re.match(r"mbarrier\.(?:arrive(?:_drop)?\.expect_tx|expect_tx)\b", op):
                bar = [o for o in ops if o.startswith("[")]
                armed.append(_address(bar[0], ev) if bar else None)
    exact_inits = {(a[0], a[1]) for a in inits if a is not None and a[2] == 0}
    barriers = len(exact_inits) + sum(1 for a in inits if a is None or a[2])
    reached, unresolved = set(), 0
    for a in loads or armed:
        if a is None:
            unresolved += 1
        elif a[2] == 0:
            reached.add((a[0], a[1]))
        else:
            hits = {b for b in exact_inits if b[0] == a[0] and (b[1] - a[1]) % a[2] == 0}
            unresolved += not hits
            reached |= hits
    names = [_name((s, c, 0)) for s, c in sorted(reached, key=lambda b: (b[0] or "", b[1]))]
    return Ring(len(reached), barriers, names, unresolved)


def _ring(m: Mechanism, texts: dict[str, str]) -> CheckResult:
    """``mbarrier_ring`` (min_count 2: stages) and ``mbarrier_ring_ws`` (also 6 mbarriers
    initialised: a full and an empty barrier per stage, the accumulator's full and empty)."""
    ptx = texts.get("ptx", "")
    if not ptx:
        return CheckResult(m.name, False, 0, f"{m.description}: no PTX to inspect")
    ring = ring_stages(ptx)
    need_bars = 6 if m.name == "mbarrier_ring_ws" else 0
    ok = ring.stages >= m.min_count and ring.barriers >= need_bars
    where = f"{ring.stages} stage(s): TMA loads complete on {ring.stages} mbarrier(s)" + (
        f" ({', '.join(ring.names)})" if ring.names else "")
    if need_bars:
        where += f"; {ring.barriers} mbarriers initialised"
    need = []
    if ring.stages < m.min_count:
        need.append(f"at least {m.min_count} stages needed")
    if ring.barriers < need_bars:
        need.append(f"at least {need_bars} mbarriers needed")
    if ring.unresolved and not ok:
        need.append(f"{ring.unresolved} barrier address(es) computed at run time could not be followed")
    tail = "".join(f", {n}" for n in need)
    return CheckResult(m.name, ok, ring.stages, f"{m.description}: {'found' if ok else 'MISSING'} ({where} in PTX{tail})")


def _expect_tx(m: Mechanism, texts: dict[str, str]) -> CheckResult:
    """The PTX instruction where there is PTX (confirmed by an arrive with a byte count in the
    SASS when there is SASS); the SASS forms that only an expect_tx produces where there is not."""
    ptx, sass = texts.get("ptx", ""), texts.get("sass", "")
    seen = {k: len(p.findall(sass)) for k, p in SYNCS_ARRIVE.items()}
    in_sass = seen["arrive_tx"] + seen["expect_tx"] + seen["remote_arrive_tx"]
    notes = []
    if seen["no_tx"]:
        notes.append(f"{seen['no_tx']} arrive(s) without a byte count (SYNCS.ARRIVE.TRANS64...A1T0/ART0) do not count")
    if ptx:
        count = len(PTX_EXPECT_TX.findall("\n".join(ptx_instructions(ptx))))
        if count and sass and not in_sass:
            return CheckResult(m.name, False, count, f"{m.description}: MISSING ({count} in PTX, but no "
                               "arrive with a byte count in the SASS: the instruction was compiled away)")
        ok = count >= m.min_count
        where = f"{count} mbarrier.arrive.expect_tx / mbarrier.expect_tx in PTX"
        if ok and sass:
            where += f", {in_sass} SYNCS.ARRIVE.TRANS64 with a byte count in SASS"
        if not ok and seen["remote_arrive_tx"]:
            notes.append(f"the SASS's {seen['remote_arrive_tx']} SYNCS.ARRIVE.TRANS64.RED with a register "
                         "is ptxas's own (a 2-CTA TMEM allocation), not the kernel's")
    elif sass:
        count = seen["arrive_tx"] + seen["expect_tx"]
        ok = count >= m.min_count
        where = f"{count} in SASS"
        if seen["remote_arrive_tx"]:
            notes.append(f"{seen['remote_arrive_tx']} SYNCS.ARRIVE.TRANS64.RED (a remote arrive.expect_tx, or "
                         "ptxas's own for a 2-CTA TMEM allocation) cannot be told apart without the PTX")
    else:
        return CheckResult(m.name, False, 0, f"{m.description}: no PTX or SASS to inspect")
    note = "".join(f", {n}" for n in notes) if notes and not ok else ""
    return CheckResult(m.name, ok, count, f"{m.description}: {'found' if ok else 'MISSING'} ({where}{note})")


def descriptor_swizzles(cuda: str) -> list[int | None]:
    """The swizzle argument of every tensor-core shared-memory descriptor encoded in ``cuda``
    (None where it is not a literal), comments and strings removed."""
    code, modes = strip_comments(cuda), []
    for name in DESCRIPTOR_CALLS:
        for m in re.finditer(r"(?<![\w.])" + name + r"\s*\(", code):
            if re.search(r"\bvoid\s*$", code[max(0, m.start() - 40):m.start()]):
                continue                                # the helper's definition, not a call
            depth, i = 1, m.end()
            while i < len(code) and depth:
                depth += {"(": 1, ")": -1}.get(code[i], 0)
                i += 1
            args, depth, last = code[m.end():i - 1], 0, 0
            for j, ch in enumerate(args):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if ch == "," and depth == 0:
                    last = j + 1
            lit = args[last:].strip()
            modes.append(int(lit) if re.fullmatch(r"\d+", lit) else None)
    return modes


def _swizzled(m: Mechanism, texts: dict[str, str]) -> CheckResult:
    cuda = texts.get("cuda", "")
    if not cuda:
        return CheckResult(m.name, False, 0, f"{m.description}: no CUDA source to inspect")
    modes = descriptor_swizzles(cuda)
    if not modes:
        return CheckResult(m.name, False, 0, f"{m.description}: MISSING (no shared-memory descriptor in the CUDA source)")
    bad = [x for x in modes if not x]
    named = ", ".join(f"{n} x {SWIZZLE_NAMES.get(x, f'mode {x}') if x is not None else 'not a constant'}"
                      for x, n in sorted(((x, modes.count(x)) for x in set(modes)), key=str))
    if bad:
        return CheckResult(m.name, False, len(modes) - len(bad),
                           f"{m.description}: MISSING ({len(bad)} of {len(modes)} descriptors unswizzled or with a "
                           f"mode that is not a constant: {named}. Allocate the operand tiles with "
                           "mma_shared_layout(..., SWIZZLE_128B_ATOM, ...))")
    return CheckResult(m.name, True, len(modes), f"{m.description}: found ({named})")


MECHANISMS = {m.name: m for m in [
    Mechanism("vector_load_128", "128-bit vector loads from global memory", "sass", r"\bLDG\.E\.128\b"),
    Mechanism("vector_store_128", "128-bit vector stores to global memory", "sass", r"\bSTG\.E\.128\b"),
    Mechanism("tma_load", "TMA tensor loads (UTMALDG)", "sass", r"\bUTMALDG\b"),
    Mechanism("tma_store", "TMA tensor stores (UTMASTG)", "sass", r"\bUTMASTG\b"),
    Mechanism("tma_multicast", "TMA loads multicast to a cluster (UTMALDG...MULTICAST)", "sass",
              r"\bUTMALDG\S*MULTICAST"),
    Mechanism("mbarrier_expect_tx", "mbarrier arrive with a transaction count (expect_tx)", "ptx",
              PTX_EXPECT_TX.pattern, custom=_expect_tx),
    Mechanism("mbarrier_try_wait", "mbarrier waits with a phase (try_wait)", "sass",
              r"\bSYNCS\.PHASECHK\.TRANS64\.TRYWAIT\b"),
    Mechanism("mbarrier_ring", "a ring of at least two stages (distinct mbarriers the TMA loads complete on)",
              "ptx", "", min_count=2, custom=_ring),
    Mechanism("mbarrier_ring_ws", "a ring of at least two stages (distinct mbarriers the TMA loads complete on) "
              "and an accumulator hand-over (at least 6 mbarriers initialised: full and empty per stage, "
              "accumulator full and empty)", "ptx", "", min_count=2, custom=_ring),
    Mechanism("mma_smem_swizzled", "tensor-core operands in swizzled shared memory (the swizzle mode of every "
              "shared-memory descriptor)", "cuda", "", custom=_swizzled),
    Mechanism("wgmma", "Hopper warpgroup MMA (HGMMA)", "sass", r"\bHGMMA\."),
    Mechanism("wgmma_ss", "wgmma with A from shared memory (HGMMA R, gdesc[...])", "sass",
              r"\bHGMMA\.\S+\s+R\d+,\s*gdesc\["),
    Mechanism("wgmma_rs", "wgmma with A from registers (HGMMA R, R, gdesc[...]: wgmma.mma_async ... {a regs})", "sass",
              r"\bHGMMA\.\S+\s+R\d+,\s*R\d+,\s*gdesc\["),
    Mechanism("named_barrier_arrive", "arrivals on a named barrier without waiting (bar.arrive: BAR.ARV id, "
              "count), the hand-over of a ping-pong", "sass", r"\bBAR\.ARV\s+(?:0x[1-9a-f][0-9a-f]*|R\d+),\s*0x[0-9a-f]+"),
    Mechanism("exp2_mufu", "exp2 on the special-function unit (MUFU.EX2)", "sass", r"\bMUFU\.EX2\b"),
    Mechanism("tcgen05_mma_tmem_a", "tcgen05.mma with its A operand in tensor memory (UTC*MMA tmem[...], gdesc[...])",
              "sass", r"\bUTC\w*MMA(?:\.\w+)*\s+tmem\["),
    Mechanism("tmem_load", "tensor memory to registers (tcgen05.ld: LDTM)", "sass", r"\bLDTM\b"),
    Mechanism("tmem_store", "registers to tensor memory (tcgen05.st: STTM)", "sass", r"\bSTTM\b"),
    Mechanism("tcgen05_mma", "Blackwell tensor-core MMA (UTC*MMA)", "sass", r"\bUTC\w*MMA\b"),
    Mechanism("tmem_alloc", "Tensor memory allocation (UTCATOMSWS)", "sass", r"\bUTCATOMSWS\b"),
    Mechanism("setmaxnreg", "register reallocation between warpgroups (USETMAXREG)", "sass", r"\bUSETMAXREG\b"),
    Mechanism("setmaxnreg_inc", "registers raised for a warpgroup (setmaxnreg.inc: USETMAXREG.TRY_ALLOC)", "sass",
              r"\bUSETMAXREG\.TRY_ALLOC\b"),
    Mechanism("setmaxnreg_dec", "registers given back by a warpgroup (setmaxnreg.dec: USETMAXREG.DEALLOC)", "sass",
              r"\bUSETMAXREG\.DEALLOC\b"),
    Mechanism("cluster_barrier", "a barrier across the CTAs of a cluster (UCGABAR)", "sass", r"\bUCGABAR_(?:ARV|WAIT)\b"),
    Mechanism("tcgen05_mma_2cta", "a pair of CTAs issuing one MMA (tcgen05.mma.cta_group::2: UTC*MMA.2CTA)", "sass",
              r"\bUTC\w*MMA(?:\.\w+)*\.2CTA\b"),
]}


def check(name: str, texts: dict[str, str]) -> CheckResult:
    """Run mechanism ``name`` against ``texts`` ({"ptx": ..., "cuda": ..., "sass": ...}: what the
    grader compiled; pass every listing it has)."""
    return MECHANISMS[name].check(texts)


def check_all(names, texts: dict[str, str]) -> list[CheckResult]:
    return [check(n, texts) for n in names]


# ---------------------------------------------------------------- the wgmma accumulator hazard

_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_REG = re.compile(r"\bR(\d+)(?:\.(64|128))?\b")
_HGMMA = re.compile(r"HGMMA\.64x(\d+)x\d+\.F32\S*\s+R(\d+)")
_FINAL_WAIT = re.compile(r"gsb0,\s*0x0\b")


def accumulator_hazards(sass: str) -> tuple[bool, str, dict]:
    """Scan SASS in listing order. The accumulator registers are the destinations of the HGMMA
    (wgmma) instructions. From an HGMMA until the next ``WARPGROUP.DEPBAR.LE gsb0, 0x0``
    (``wgmma.wait_group 0``) a wgmma may still be writing them, so no other instruction may
    read one of them. Returns (ok, message, measurements)."""
    instrs = [m.group(1) for m in _INSTR.finditer(sass)]
    acc: set[int] = set()
    for ins in instrs:
        m = _HGMMA.search(ins)
        if m:
            n, base = int(m.group(1)), int(m.group(2))
            acc.update(range(base, base + n // 2))
    meas = {"hgmma": sum(1 for i in instrs if "HGMMA" in i), "accumulator_registers": len(acc)}
    if not acc:
        return False, "no HGMMA (wgmma) instruction with an fp32 accumulator in the SASS", meas
    pending, waits, bad = False, 0, []
    for ins in instrs:
        body = re.sub(r"^@!?U?P\w+\s+", "", ins)
        words = body.split()
        op = words[0] if words else ""
        if op.startswith("HGMMA"):
            pending = True
            continue
        if op.startswith("WARPGROUP.DEPBAR") and _FINAL_WAIT.search(body):
            pending = False
            waits += 1
            continue
        if not pending or op.startswith("WARPGROUP"):
            continue
        operands = body[len(op):].split(",")
        sources = operands if op.startswith(("ST", "RED", "ATOM")) else operands[1:]
        regs: set[int] = set()
        for s in sources:
            for r in _REG.finditer(s):
                width = {None: 1, "64": 2, "128": 4}[r.group(2)]
                regs.update(range(int(r.group(1)), int(r.group(1)) + width))
        if regs & acc:
            bad.append(ins)
    meas.update({"final_waits": waits, "early_reads": len(bad)})
    if waits == 0:
        return False, "no WARPGROUP.DEPBAR.LE gsb0, 0x0 (wgmma.wait_group 0) after the wgmma instructions", meas
    if bad:
        return False, (f"{len(bad)} instruction(s) read accumulator registers while a wgmma may still be "
                       f"writing them (before WARPGROUP.DEPBAR.LE gsb0, 0x0), first: `{bad[0]}`"), meas
    return True, f"no accumulator read before the wgmma wait ({waits} wait(s), {len(acc)} accumulator registers)", meas

"""The PTX analysis under the mechanism checks: facts read from PTX text, no verdicts.

Parsing: a module's functions (``ptx_functions``), a body's instructions, one per line, without
comments, strings, directives or labels (``ptx_instructions``), the functions a body calls
(``ptx_callees``), and a body's labels, control-flow graph, post-dominators and natural loops
(``_flow_graph``, ``_postdominators``). Values: an operand followed through the integer arithmetic to a symbol (a
shared variable, a kernel parameter ``<kernel>_param_<k>``) plus a constant and a stride
(``_values``), and what a register is computed from, to a fixed point (``_flow``). On them, the
facts that grader/inspect.py's checks judge: the stages of a TMA ring (``ring_stages``), the
expect_tx byte counts against the TMA boxes completing on the same barrier (``tx_byte_counts``,
its findings said in sentences the check quotes), each tensor parameter's global accesses
(``tensor_accesses``), CTA-wide barriers reached by one branch of the thread index while the
other side waits (``divergent_cta_barriers``) and the functions that hold an instruction
(``functions_with``).

The input is a PTX module, or the listings of ``inspect.launched_texts`` (``ptx``, ``ptx_module``
and the launch plan). This module imports nothing of the grader; grader/inspect.py imports it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Callable

# ---------------------------------------------------------------- instructions and functions

def strip_comments(code: str) -> str:
    """PTX or CUDA without its comments (``//`` to the end of the line, ``/* ... */``) and without
    the contents of string literals, so that neither can satisfy a check."""
    return _COMMENT_OR_STRING.sub(lambda m: '""' if m.group(0).startswith('"') else " ", code)


_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', re.S)


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
    return dict(_functions(ptx))


@functools.lru_cache(maxsize=16)
def _functions(ptx: str) -> dict[str, tuple[str, str]]:
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


# ---------------------------------------------------------------- values followed through the PTX

# A value in the PTX, as far as this module follows it: None (unknown, possibly an address),
# or (symbol, c, s): symbol + c + k * s for some integer k (s = 0: exactly symbol + c; symbol
# None: a plain integer). Congruences join: a loop-carried index stays bounded to its stride.
_UNKNOWN_INT = (None, 0, 1)
_NO_DEST = ("st", "red", "bar", "barrier", "fence", "membar", "bra", "brx", "call", "ret", "exit", "trap",
            "cp", "prefetch", "setmaxnreg", "griddepcontrol", "tcgen05", "wgmma", "stmatrix", "multimem",
            "discard", "applypriority", "nanosleep", "mbarrier.init", "mbarrier.inval")
_INT = re.compile(r"^(-?)(0[xX][0-9a-fA-F]+|\d+)U?$")
_ADDRESS = re.compile(r"^\[\s*([^\]\s+]+)\s*(?:\+\s*(-?\s*(?:0[xX][0-9a-fA-F]+|\d+)))?\s*\]$")


def _operands(rest: str) -> list[str]:
    return list(_operands_of(rest))


@functools.lru_cache(maxsize=1 << 16)
def _operands_of(rest: str) -> tuple[str, ...]:
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
    return tuple(out)


def _join(a, b):
    if a is None or b is None or a[0] != b[0]:
        return None
    s = math.gcd(a[2], b[2], abs(a[1] - b[1]))
    return (a[0], a[1] % s if s else a[1], s)


def _values(instrs: list[str]) -> Callable:
    """The value (see above) of an operand of one function's instructions, flow-insensitive:
    every definition of a register joins into its value, iterated to a fixed point."""
    return _values_of(tuple(instrs))


@functools.lru_cache(maxsize=32)
def _values_of(instrs: tuple[str, ...]) -> Callable:
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


# ---------------------------------------------------------------- the stages of a ring

@dataclasses.dataclass
class Ring:
    stages: int            # distinct mbarriers the TMA loads complete on
    barriers: int          # distinct mbarriers initialised
    names: list            # the stages' barriers, as shared variable + byte offset
    unresolved: int        # barrier operands whose address could not be followed
    indexed: list = dataclasses.field(default_factory=list)   # operands indexed at run time ("pool+8k")


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
    With such an operand the count is an upper bound (the index's range is not followed), and
    ``indexed`` names the operand.
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
    reached, unresolved, indexed = set(), 0, []
    for a in loads or armed:
        if a is None:
            unresolved += 1
        elif a[2] == 0:
            reached.add((a[0], a[1]))
        else:
            hits = {b for b in exact_inits if b[0] == a[0] and (b[1] - a[1]) % a[2] == 0}
            unresolved += not hits
            reached |= hits
            where = _name(a)
            if hits and where not in indexed:
                indexed.append(where)
    names = [_name((s, c, 0)) for s, c in sorted(reached, key=lambda b: (b[0] or "", b[1]))]
    return Ring(len(reached), barriers, names, unresolved, indexed)


# ---------------------------------------------------------------- the code, function by function

@dataclasses.dataclass(frozen=True)
class _Unit:
    """One function of the launched code: its name, ``entry`` or ``func``, its PTX source with
    labels and scopes (None where only the instruction listing is at hand) and its instructions."""
    name: str
    kind: str
    body: str | None
    instrs: tuple


def _units(texts: dict) -> list[_Unit]:
    """The functions of ``texts``: those of ``ptx_module`` (inspect.launched_texts), else those of a
    ``ptx`` listing (split at its ``.entry NAME;`` headers: no labels) or of a PTX module."""
    module = texts.get("ptx_module") or ""
    ptx = texts.get("ptx") or ""
    if module or not _LISTING_HEADER.search(ptx):
        funcs = ptx_functions(module or ptx)
        if funcs:
            return [_Unit(n, k, b, _instructions(b)) for n, (k, b) in funcs.items()]
        return [_Unit("", "", ptx, _instructions(ptx))] if ptx.strip() else []
    heads = _LISTING_HEADER.findall(ptx)
    chunks = _LISTING_HEADER.split(ptx)[1:]
    return [_Unit(h.split()[1].rstrip(";"), h.split()[0][1:], None, _instructions(c)) for h, c in zip(heads, chunks)]


def functions_with(texts: dict, opcode: str) -> list[str]:
    """The names of the functions of ``texts`` (as ``_units`` reads them) with an instruction
    whose opcode starts with ``opcode`` (``"setmaxnreg"``: every ``setmaxnreg.inc``/``.dec``)."""
    return [u.name for u in _units(texts) if any(_opcode(i)[0].startswith(opcode) for i in u.instrs)]


def _launch_of(plan, name: str) -> dict | None:
    for ln in (plan or {}).get("launches") or []:
        if isinstance(ln, dict) and ln.get("name") == name:
            return ln
    return None


def _param_index(sym, unit: _Unit) -> int | None:
    """k for the symbol ``<function>_param_<k>`` (how NVRTC names a kernel's parameters)."""
    if not isinstance(sym, str) or not unit.name:
        return None
    m = re.fullmatch(re.escape(unit.name) + r"_param_(\d+)", sym)
    return int(m.group(1)) if m else None


def _regs(text: str) -> list[str]:
    return re.findall(r"%[\w$]+(?:\.[xyz])?|(?<![\w$.%])[A-Za-z_$][\w$]*", text)


def _dests(op: str, ops: list[str]) -> list[str]:
    """The registers an instruction writes: its first operand (a register, ``d|p``, or a vector
    of registers), unless the instruction writes none (a store, a barrier, a branch, ...)."""
    if not ops or op.startswith(_NO_DEST) or ops[0].startswith("["):
        return []
    if op.startswith("mbarrier.") and not op.startswith(("mbarrier.try_wait", "mbarrier.test_wait")):
        return []
    return [r for r in re.split(r"[{},|\s]+", ops[0]) if r.startswith("%") or re.fullmatch(r"[A-Za-z_$][\w$]*", r)]


def _flow(instrs, transfer: Callable) -> dict[str, frozenset]:
    """A flow-insensitive forward analysis over one function's instructions: each register's
    value is the union of ``transfer(op, ops, guard, env)`` over the instructions that write it,
    iterated to a fixed point (``env``: the current values, a register -> frozenset)."""
    parsed = []
    for ins in instrs:
        g = _GUARD.match(ins)
        op, rest = _opcode(ins)
        ops = _operands(rest)
        dests = _dests(op, ops)
        parsed.append((op, ops, g.group(2) if g else None, dests))
    env: dict[str, frozenset] = {}
    for _ in range(64):
        changed = False
        for op, ops, guard, dests in parsed:
            val = transfer(op, ops, guard, env)
            if not val:
                continue
            for d in dests:
                new = env.get(d, frozenset()) | val
                if new != env.get(d):
                    env[d], changed = new, True
        if not changed:
            break
    return env


def _sources(ops: list[str], env) -> frozenset:
    out = frozenset()
    for o in ops[1:]:
        for r in _regs(o):
            out |= env.get(r, frozenset())
    return out


_GUARD = re.compile(r"^@(!?)(%?[\w$]+)\s+")

# ---------------------------------------------------------------- expect_tx byte counts

# Bytes of one element of a tensor map's data type (the launch plan's dtype names).
_ELEMENT_BYTES = {"uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint16": 2, "int16": 2,
                  "float16": 2, "bfloat16": 2, "uint32": 4, "int32": 4, "float32": 4, "uint64": 8, "int64": 8,
                  "float64": 8}
_TYPE_BITS = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16, "e4m3": 8,
              "e5m2": 8, "b32": 32, "u32": 32, "s32": 32, "f32": 32, "f16x2": 32, "bf16x2": 32, "tf32": 32,
              "b64": 64, "u64": 64, "s64": 64, "f64": 64, "b128": 128}
_MAX_CLUSTER = 16


def _access_bits(op: str) -> int | None:
    """Bits moved by one thread's memory instruction: vector length times element type."""
    parts = op.split(".")
    bits = next((_TYPE_BITS[p] for p in reversed(parts) if p in _TYPE_BITS), None)
    vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d+", p)), 1)
    return bits * vec if bits else None


def box_bytes(tmap: dict) -> int | None:
    """Bytes one TMA load of this tensor map (a launch plan's ``tensormaps`` entry) delivers: the
    box, element strides applied, times the element size (a box partly out of bounds still
    counts in full: the hardware fills it)."""
    try:
        esize = _ELEMENT_BYTES[tmap["dtype"]]
        strides = tmap.get("element_strides") or [1] * len(tmap["box"])
        return math.prod(-(-int(b) // int(s)) for b, s in zip(tmap["box"], strides)) * esize
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


@dataclasses.dataclass
class _TxSite:
    bar: tuple | None          # the barrier's address (see _values), None: not followed
    bytes: int | None          # bytes armed or delivered, None: not known statically
    what: str                  # how a message names it
    multicast: bool = False
    pair: bool = False         # cta_group::2: the pair's loads complete on one barrier
    mask_ctas: int | None = None
    remote: bool = False       # an arrive on a barrier of another CTA (shared::cluster)
    loops: tuple = ()          # (function, the loops it runs in): sites of one place run equally often


@dataclasses.dataclass
class TxReport:
    armed: int = 0                                  # expect_tx instructions
    checked: list = dataclasses.field(default_factory=list)   # barriers whose counts were checked
    wrong: list = dataclasses.field(default_factory=list)     # what is wrong, one sentence each
    unchecked: list = dataclasses.field(default_factory=list)  # what could not be checked, and why


def _tx_sites(unit: _Unit, plan) -> tuple[list[_TxSite], list[_TxSite]]:
    """(arms, completions) of one function: every expect_tx with its byte count, and every
    instruction that completes bytes on an mbarrier (TMA tensor loads with the bytes of their
    box, bulk copies, cluster launch control, st.async)."""
    if unit.body is not None:
        stmts, _, block_of, loops = _flow_graph(unit.body)
        instrs = [t for k, t, _ in stmts if k == "ins"]
        place = [(unit.name, loops[b]) for b in block_of]
    else:
        instrs = list(unit.instrs)
        place = [(unit.name, None)] * len(instrs)
    ev = _values(instrs)
    launch = _launch_of(plan, unit.name) if unit.kind == "entry" else None
    args = (launch or {}).get("args") or []
    maps = (plan or {}).get("tensormaps") or []
    arms, done = [], []

    def const(tok):
        v = ev(tok)
        return v[1] if isinstance(v, tuple) and v[0] is None and v[2] == 0 else None

    for at, ins in enumerate(instrs):
        op, rest = _opcode(ins)
        ops = _operands(rest)
        if re.match(r"mbarrier\.(?:arrive(?:_drop)?\.expect_tx|expect_tx)\b", op) and ops:
            bar = next((o for o in ops if o.startswith("[")), None)
            arms.append(_TxSite(_address(bar, ev) if bar else None, const(ops[-1]), ins,
                                remote="shared::cluster" in op, loops=place[at]))
        elif "mbarrier::complete_tx" not in op:
            continue
        elif op.startswith("cp.async.bulk.tensor") and len(ops) >= 3:
            nbytes, what = None, "a TMA load"
            m = re.match(r"\[\s*([^,\s\]]+)", ops[1])
            v = ev(m.group(1)) if m else None
            k = _param_index(v[0], unit) if isinstance(v, tuple) else None
            arg = args[k] if k is not None and k < len(args) and isinstance(args[k], dict) else {}
            tm = arg.get("tensormap")
            if isinstance(tm, int) and 0 <= tm < len(maps) and not re.search(r"im2col|gather|scatter", op):
                nbytes = box_bytes(maps[tm])
                box = "x".join(str(b) for b in maps[tm].get("box", ()))
                what = f"a TMA load of box {box} {maps[tm].get('dtype')} ({nbytes} bytes)"
            mc = ".multicast::cluster" in op
            ctas = None
            if mc and len(ops) >= 4:
                ctas = _mask_ctas(ops[3], instrs)
            done.append(_TxSite(_address(ops[2], ev), nbytes, what, mc, "cta_group::2" in op, ctas,
                                loops=place[at]))
        elif op.startswith("cp.async.bulk.") and len(ops) >= 4:
            done.append(_TxSite(_address(ops[3], ev), const(ops[2]), "a bulk copy",
                                ".multicast::cluster" in op, "cta_group::2" in op,
                                _mask_ctas(ops[4], instrs) if len(ops) >= 5 else None, loops=place[at]))
        else:                                    # cluster launch control, st.async, red.async
            bar = [o for o in ops if o.startswith("[")]
            bits = 128 if op.startswith("clusterlaunchcontrol") else _access_bits(op)
            done.append(_TxSite(_address(bar[-1], ev) if bar else None, bits // 8 if bits else None,
                                f"`{op}`", loops=place[at]))
    return arms, done


def _mask_ctas(tok: str, instrs) -> int | None:
    """How many CTAs a multicast mask names, where the PTX shows it: a constant, or a constant
    shifted (``shl``) by a CTA rank, the book's way of picking the CTAs of a pair."""
    defs: dict[str, list] = {}
    for ins in instrs:
        op, rest = _opcode(ins)
        ops = _operands(rest)
        if len(ops) >= 2 and not ops[0].startswith("["):
            defs.setdefault(ops[0], []).append((op.split(".")[0], ops[1:]))

    def count(t, depth=0):
        m = _INT.match(t.strip())
        if m:
            return bin(int(m.group(2), 0) & 0xFFFF).count("1")
        got = defs.get(t.strip())
        if depth > 8 or not got or len(got) != 1:
            return None
        base, src = got[0]
        if base in ("mov", "cvt") and src:
            return count(src[0], depth + 1)
        if base == "shl" and src:                # a mask moved to another pair keeps its CTAs
            return count(src[0], depth + 1)
        return None
    n = count(tok)
    return n if n else None


def _overlap(a, b) -> bool:
    if a is None or b is None:
        return True
    if a[0] != b[0]:
        return False
    g = math.gcd(a[2], b[2])
    return (a[1] - b[1]) % g == 0 if g else a[1] == b[1]


def _bar_name(a) -> str:
    if a is None:
        return "a barrier whose address is computed at run time"
    return _name((a[0], a[1], 0)) + (f" + {a[2]}*i" if a[2] else "")


def _reachable_sums(target: int, items: list[tuple[int, int, int]]) -> bool:
    """Whether ``target`` = sum of b * c over ``items`` (b, c_min, c_max), each c in its range."""
    g = 0
    for b, _, _ in items:
        g = math.gcd(g, b)
    g = math.gcd(g, target)
    if not g:
        return target == 0
    top, mask = target // g, (1 << (target // g + 1)) - 1
    reach = 1
    for b, lo, hi in items:
        step, nxt = b // g, 0
        for c in range(lo, hi + 1):
            if step * c > top:
                break
            nxt |= reach << (step * c)
        reach = nxt & mask
        if not reach:
            return False
    return bool(reach >> top & 1)


def tx_byte_counts(texts: dict) -> TxReport:
    """Does every expect_tx announce the bytes that the TMA loads completing on its barrier bring?

    The arms (``mbarrier.arrive.expect_tx``/``mbarrier.expect_tx``) and the completions
    (``cp.async.bulk.tensor ... mbarrier::complete_tx``, whose bytes are the box of its tensor map
    in the launch plan, and the other instructions that complete bytes) are grouped by barrier:
    addresses followed through the PTX (``_values``); an address indexed by a stage
    (``bar[stage]``) groups with every barrier it can reach. In a CTA of its own (no multicast,
    no 2-CTA pair, no arrive on another CTA's barrier) a group's counts must add up to its
    loads' bytes exactly: each arrive covers the loads of its phase, and the code that arms a
    barrier and the code that loads into it run equally often. Where other CTAs' loads land on
    the barrier too (multicast, ``cta_group::2``, a remote arrive), their share cannot be read
    from one CTA's code: the counts must then be a sum of the loads' bytes, each load counted at
    least once and at most as many times as CTAs can deliver it (the CTAs of its multicast mask
    where the PTX shows them, else of the cluster; twice for a CTA pair). A count in a register
    the PTX does not fix is reported as not checked, never failed."""
    plan = texts.get("plan") or {}
    rep = TxReport()
    arms, done = [], []
    for unit in _units(texts):
        a, d = _tx_sites(unit, plan)
        arms += a
        done += d
    rep.armed = len(arms)
    if not arms:
        return rep
    cluster = 1
    for ln in plan.get("launches") or []:
        for key in ("cluster", "preferred_cluster"):
            if isinstance(ln, dict) and isinstance(ln.get(key), list):
                cluster = max(cluster, math.prod(x for x in ln[key] if isinstance(x, int)))
    if not plan:
        cluster = _MAX_CLUSTER
    # union-find over the sites whose barriers may be the same
    sites = arms + done
    parent = list(range(len(sites)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for i in range(len(sites)):
        for j in range(i):
            if _overlap(sites[i].bar, sites[j].bar):
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(sites)):
        groups.setdefault(find(i), []).append(i)
    for members in groups.values():
        e = [sites[i] for i in members if i < len(arms)]
        d = [sites[i] for i in members if i >= len(arms)]
        if not e:
            continue
        where = _where(e)
        if any(s.bytes is None for s in e):
            rep.unchecked.append(f"the byte count of an expect_tx on {where} is in a register computed at run "
                                 "time: byte count not checked statically")
            continue
        armed = sum(s.bytes for s in e)
        if armed <= 0:
            continue
        if not d:
            if any(s.bar is None for s in e):
                rep.unchecked.append(f"expect_tx on {where}: no TMA load found on it, byte count not checked "
                                     "statically")
            else:
                rep.wrong.append(f"expect_tx announces {armed} bytes on {where}, but no TMA load completes on that "
                                 "barrier: its phase never completes")
            continue
        if any(s.bytes is None for s in d):
            rep.unchecked.append(f"expect_tx on {where}: a load whose bytes are not known statically completes "
                                 "on it, byte count not checked statically")
            continue
        brought = sum(s.bytes for s in d)
        loads = _loads_text(d)
        places: dict[tuple, tuple[list, list]] = {}
        for s in e:
            places.setdefault(s.loops, ([], []))[0].append(s)
        for s in d:
            places.setdefault(s.loops, ([], []))[1].append(s)
        # every arm next to loads and every load next to arms (in the same loops): each place's
        # code runs as often as its arms, so its counts must add up to its loads
        paired = all(pa and pd for pa, pd in places.values())
        clustered = any(s.multicast or s.pair or s.remote for s in d + e)
        if not clustered and paired:
            off = [(pa, pd) for pa, pd in places.values() if sum(s.bytes for s in pa) != sum(s.bytes for s in pd)]
            if not off:
                said = (f"{armed} bytes" if len(e) == 1 else
                        f"{len(e)} expect_tx in the code (unrolled or in several places) announce {armed} bytes in all")
                rep.checked.append(f"{where}: {said} = {loads}")
                continue
            pa, pd = off[0]
            a, b = sum(s.bytes for s in pa), sum(s.bytes for s in pd)
            said = (f"expect_tx announces {a} bytes on {_where(pa)}" if len(pa) == 1 else
                    f"{len(pa)} expect_tx on {_where(pa)} announce {a} bytes in all")
            rep.wrong.append(f"{said}, but the TMA loads completing on {'it' if len(pa) == 1 else 'them'}"
                             f"{'' if len(places) == 1 else ' in the same loop'} bring {b} ({_loads_text(pd)})" + (
                                 ": too few, the barrier's phase completes before the data has landed" if a < b else
                                 ": too many, the barrier's phase never completes"))
            continue
        items = []
        for s in d:
            most = (s.mask_ctas or cluster) if s.multicast else 1
            if s.remote or any(x.remote for x in e):
                most = max(most, cluster)
            most *= 2 if s.pair else 1
            if not paired:                       # loads in a loop of their own: any number of times
                most = max(most, armed // s.bytes if s.bytes else 1)
            items.append((s.bytes, 1, max(1, min(most, armed))))
        if _reachable_sums(armed, items):
            if clustered:
                rep.checked.append(f"{where}: {armed} bytes, a sum that {loads} can make together with what the "
                                   "cluster's other CTAs may deliver to this barrier (a multicast load, the pair's "
                                   "other CTA); how many of those arrive is not followed")
            else:
                rep.unchecked.append(f"expect_tx on {where}: its loads run in a loop of their own, byte count "
                                     f"checked only as a sum of whole boxes ({armed} bytes from {loads})")
            continue
        if clustered:
            rep.wrong.append(f"expect_tx announces {armed} bytes on {where}, which the TMA loads completing on it "
                             f"({loads}, each delivered by at most {cluster} CTA(s) of the cluster"
                             f"{', twice for a CTA pair' if any(s.pair for s in d) else ''}) cannot add up to")
        else:
            rep.wrong.append(f"expect_tx announces {armed} bytes on {where}, which is no sum of whole boxes of the TMA "
                             f"loads completing on it ({loads})")
    return rep


def _where(sites: list[_TxSite]) -> str:
    """The barriers of ``sites``, as messages name them (at most three)."""
    bars = sorted({s.bar for s in sites if s.bar is not None}, key=lambda a: (a[0] or "", a[1], a[2]))
    names = [_bar_name(a) for a in bars] + [_bar_name(None)] * any(s.bar is None for s in sites)
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _loads_text(d: list[_TxSite]) -> str:
    kinds: dict[str, int] = {}
    for s in d:
        w = s.what + (" multicast" if s.multicast else "") + (" to a CTA pair" if s.pair else "")
        kinds[w] = kinds.get(w, 0) + 1
    return " + ".join(f"{n} x {w}" if n > 1 else w for w, n in kinds.items())


# ---------------------------------------------------------------- global accesses per tensor

_NOT_GLOBAL = ("shared", "local", "param", "const", "shared::cta", "shared::cluster")


def _global_access(op: str, ops: list[str], ev_const) -> tuple[str, str, int | None] | None:
    """("load" or "store", the address operand, bits per thread) of an instruction that reads or
    writes global memory through an address (generic addresses included), else None."""
    parts = op.split(".")
    if any(p in _NOT_GLOBAL for p in parts[1:]):
        if not (parts[0] == "cp" and "global" in parts):
            return None
    if parts[0] in ("ld", "ldu") and len(ops) >= 2 and ops[1].startswith("["):
        return "load", ops[1], _access_bits(op)
    if parts[0] == "st" and len(parts) > 1 and parts[1] not in ("async", "bulk") and ops and ops[0].startswith("["):
        return "store", ops[0], _access_bits(op)
    if parts[0] in ("red", "atom") and "async" not in parts:
        addr = next((o for o in ops if o.startswith("[")), None)
        return ("store", addr, _access_bits(op)) if addr else None
    if op.startswith("cp.async.") and not op.startswith("cp.async.bulk") and "global" in parts and len(ops) >= 3:
        size = ev_const(ops[2])
        return "load", ops[1], size * 8 if size else None
    return None


@dataclasses.dataclass
class Accesses:
    """A tensor's global loads or stores: bits per access -> count; ``shared``: accesses whose
    address is computed from this tensor and another one (not counted for either)."""
    bits: dict = dataclasses.field(default_factory=dict)
    shared: int = 0

    def wide(self, bits: int = 128) -> int:
        return sum(n for b, n in self.bits.items() if b is not None and b >= bits)

    def total(self) -> int:
        return sum(self.bits.values())


def tensor_accesses(texts: dict) -> dict[str, dict[str, Accesses]]:
    """The global loads and stores of each tensor parameter of the launched code: {"load": {name:
    Accesses}, "store": {...}}. An access belongs to the parameter its address is computed from,
    followed through the PTX from the ``ld.param`` of that parameter (any arithmetic, and a
    pointer kept in local or shared memory); a value loaded from global memory is data, not an
    address. Parameters are named by the launch plan (``parameter k`` without one); scalars of
    the plan are left out, and so is the code of a called function (NVRTC inlines the kernel's
    own functions)."""
    plan = texts.get("plan") or {}
    sig = plan.get("signature") or []
    out: dict[str, dict[str, Accesses]] = {"load": {}, "store": {}}
    for unit in _units(texts):
        if unit.kind != "entry":
            continue                              # a callee's parameters are not the kernel's
        launch = _launch_of(plan, unit.name)
        args = (launch or {}).get("args") or []

        def name_of(k):
            arg = args[k] if k < len(args) and isinstance(args[k], dict) else None
            if arg is None:
                return f"parameter {k}"
            i = arg.get("tensor")
            if not isinstance(i, int):
                return None                       # a scalar, a tensor map
            known = 0 <= i < len(sig) and isinstance(sig[i], dict)
            return sig[i].get("name", f"tensor {i}") if known else f"tensor {i}"

        kept = frozenset()

        def transfer(op, ops, guard, env):
            nonlocal kept
            base = op.split(".")[0]
            if op.startswith("ld.param") and len(ops) >= 2:
                m = re.match(r"\[\s*([\w$]+)", ops[1])
                k = _param_index(m.group(1), unit) if m else None
                return frozenset() if k is None else frozenset({k})
            if base in ("ld", "ldu", "atom", "red", "tcgen05", "tex", "suld"):
                parts = op.split(".")
                return kept if ("local" in parts or "shared" in parts) and base == "ld" else frozenset()
            if base == "st":
                parts = op.split(".")
                if ("local" in parts or "shared" in parts) and len(ops) >= 2:
                    kept = kept | frozenset().union(*(env.get(r, frozenset()) for r in _regs(ops[1])))
                return frozenset()
            val = _sources(ops, env)
            for o in ops[1:]:
                k = _param_index(o.strip(), unit)
                if k is not None:
                    val |= {k}
            return val
        while True:                               # until no more pointers reach memory
            before = kept
            env = _flow(unit.instrs, transfer)
            if kept == before:
                break
        ev = _values(list(unit.instrs))

        def ev_const(tok):
            v = ev(tok)
            return v[1] if isinstance(v, tuple) and v[0] is None and v[2] == 0 else None
        for ins in unit.instrs:
            op, rest = _opcode(ins)
            acc = _global_access(op, _operands(rest), ev_const)
            if acc is None:
                continue
            kind, addr, bits = acc
            m = re.match(r"\[\s*([^\]\s+]+)", addr)
            params = env.get(m.group(1), frozenset()) if m else frozenset()
            if m and _param_index(m.group(1), unit) is not None:
                params = frozenset({_param_index(m.group(1), unit)})
            names = {n for n in (name_of(k) for k in params) if n}
            if len(names) == 1:
                a = out[kind].setdefault(names.pop(), Accesses())
                a.bits[bits] = a.bits.get(bits, 0) + 1
            else:
                for n in names:
                    out[kind].setdefault(n, Accesses()).shared += 1
    return out


# ---------------------------------------------------------------- CTA-wide barriers in a branch

_THREAD_REGS = re.compile(r"%(?:tid|laneid|warpid|lanemask_\w+)\b")


def _statements(body: str) -> list[tuple[str, str, str | None]]:
    """The labels and instructions of a PTX function body in order: ("label", id, None) or
    ("ins", text, the id of a branch's target), a label id unique in the function (labels inside
    an inline-asm ``{ }`` scope are local to it, and a branch names the innermost one)."""
    events, stack, next_scope, buf = [], [0], 1, []

    def labels(text):
        m = _LABELS.match(text)
        if m:
            for name in re.findall(r"([A-Za-z_$][\w$]*)\s*:", m.group(0)):
                events.append(("label", name, tuple(stack)))
        return text[m.end():] if m else text
    for ch in strip_comments(body):
        if ch in "{}":
            text = "".join(buf)
            head = _LABELS.sub("", text).strip()
            if not head or (head.startswith(".") and "=" not in head):
                labels(text)
                buf = []
                if ch == "{":
                    stack.append(next_scope)
                    next_scope += 1
                elif len(stack) > 1:
                    stack.pop()
                continue
        if ch == ";":
            ins = " ".join(labels("".join(buf)).split())
            buf = []
            if ins and not ins.startswith("."):
                events.append(("ins", ins + ";", tuple(stack)))
            continue
        buf.append(ch)
    defined = {(chain[-1], name) for kind, name, chain in events if kind == "label"}

    def resolve(name, chain):
        for s in reversed(chain):
            if (s, name) in defined:
                return f"{s}:{name}"
        return None
    out = []
    for kind, text, chain in events:
        if kind == "label":
            out.append(("label", f"{chain[-1]}:{text}", None))
            continue
        op, rest = _opcode(text)
        out.append(("ins", text, resolve(rest.strip(), chain) if op.split(".")[0] == "bra" else None))
    return out


@dataclasses.dataclass
class _Cfg:
    blocks: list            # instructions of each block
    succ: list              # successor block indices (len(blocks): the exit)


def _cfg(stmts) -> _Cfg:
    blocks, starts, cur, targets = [], {}, [], []
    for kind, text, target in stmts:
        if kind == "label":
            if cur:
                blocks.append(cur)
                targets.append(None)
                cur = []
            starts[text] = len(blocks)
            continue
        cur.append(text)
        op = _opcode(text)[0].split(".")[0]
        if op in ("bra", "brx", "ret", "exit", "trap"):
            blocks.append(cur)
            targets.append(target)
            cur = []
    blocks.append(cur)
    targets.append(None)
    exit_node, succ = len(blocks), []
    for i, b in enumerate(blocks):
        last = b[-1] if b else ""
        op = _opcode(last)[0] if last else ""
        base = op.split(".")[0]
        guarded = bool(_GUARD.match(last))
        nxt = [i + 1] if i + 1 < len(blocks) else [exit_node]
        if base == "bra":
            t = starts.get(targets[i], exit_node)
            succ.append([t] + (nxt if guarded else []))
        elif base == "brx":
            succ.append(sorted(set(starts.values())) or nxt)
        elif base in ("ret", "exit", "trap"):
            succ.append([exit_node] + (nxt if guarded else []))
        else:
            succ.append(nxt)
    return _Cfg(blocks, succ)


def _dominators(succ: list, root: int) -> dict[int, int]:
    """The immediate dominator of every node reachable from ``root`` in the graph ``succ`` (node
    -> successors), by Cooper, Harvey and Kennedy's iteration; the root is its own."""
    pred: dict[int, list] = {}
    for x, ss in enumerate(succ):
        for y in ss:
            pred.setdefault(y, []).append(x)
    order, seen, stack = [], {root}, [(root, iter(succ[root]))]
    while stack:                                  # reverse post-order from the root
        x, it = stack[-1]
        nxt = next((y for y in it if y not in seen), None)
        if nxt is None:
            order.append(x)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(succ[nxt])))
    order.reverse()
    index = {x: k for k, x in enumerate(order)}
    idom: dict[int, int] = {root: root}

    def meet(a, b):
        while a != b:
            while index[a] > index[b]:
                a = idom[a]
            while index[b] > index[a]:
                b = idom[b]
        return a
    changed = True
    while changed:
        changed = False
        for x in order[1:]:
            done = [p for p in pred.get(x, []) if p in idom]
            if not done:
                continue
            new = done[0]
            for p in done[1:]:
                new = meet(new, p)
            if idom.get(x) != new:
                idom[x], changed = new, True
    return idom


def _postdominators(cfg: _Cfg) -> list[int | None]:
    """The immediate post-dominator of every block (the exit: len(blocks)): the dominators of
    the reversed graph from the exit; a block that cannot reach the exit is given an edge to it."""
    n = len(cfg.blocks)
    reverse = [[] for _ in range(n + 1)]
    for i, ss in enumerate(cfg.succ):
        for y in ss:
            reverse[y].append(i)
    reach, todo = {n}, [n]
    while todo:
        for p in reverse[todo.pop()]:
            if p not in reach:
                reach.add(p)
                todo.append(p)
    for i in range(n):
        if i not in reach:
            reverse[n].append(i)
    ipdom = _dominators(reverse, n)
    return [ipdom.get(i) for i in range(n)] + [None]


def _loops(cfg: _Cfg) -> list[frozenset]:
    """The natural loops each block belongs to, as the set of their headers (a back edge goes
    from a block to a header that dominates it)."""
    n = len(cfg.blocks)
    succ = [[y for y in ss if y < n] for ss in cfg.succ]
    idom = _dominators(succ, 0) if n else {}

    def dominates(h, x):
        while x in idom:
            if x == h:
                return True
            if idom[x] == x:
                return False
            x = idom[x]
        return False
    pred = [[] for _ in range(n)]
    for x, ss in enumerate(succ):
        for y in ss:
            pred[y].append(x)
    inside: list[set] = [set() for _ in range(n)]
    for x, ss in enumerate(succ):
        for h in ss:
            if dominates(h, x):               # a back edge x -> h: the loop of h
                body, todo = {h}, [x]
                while todo:
                    y = todo.pop()
                    if y not in body:
                        body.add(y)
                        todo.extend(pred[y])
                for y in body:
                    inside[y].add(h)
    return [frozenset(s) for s in inside]


@functools.lru_cache(maxsize=16)
def _flow_graph(body: str) -> tuple:
    """(statements, control-flow graph, the block of each instruction, the loops of each block)
    of a function body."""
    stmts = _statements(body)
    cfg = _cfg(stmts)
    block_of = [b for b, instrs in enumerate(cfg.blocks) for _ in instrs]
    return stmts, cfg, block_of, _loops(cfg)


@dataclasses.dataclass
class DivergentBarrier:
    function: str
    barrier: str             # the instruction
    branch: str              # the branch on the thread index it is under
    waits: str               # what the threads that do not reach it wait on instead


def _cta_wide(op: str, ops: list[str], ev, threads: int | None) -> bool:
    """A barrier that waits for every thread of the CTA: bar.sync / barrier.sync (and .red)
    without a thread count (``bar.sync a``; ``bar.red.op d, a, c``), or with a count of at
    least the CTA's threads."""
    base = op.replace(".cta.", ".").split(".")
    if base[0] not in ("bar", "barrier") or len(base) < 2 or base[1] not in ("sync", "red"):
        return False
    count_at = 1 if base[1] == "sync" else 2
    if len(ops) <= count_at + (base[1] == "red"):
        return True
    v = ev(ops[count_at])
    return bool(threads and isinstance(v, tuple) and v[0] is None and v[2] == 0 and v[1] >= threads)


def divergent_cta_barriers(texts: dict) -> tuple[list[DivergentBarrier], int, bool]:
    """CTA-wide barriers (``bar.sync 0``: ``__syncthreads``, ``T.cuda.cta_sync``) that only the
    threads of a branch on the thread index reach, while the threads of the other side wait for
    something that only the barrier's threads can give them after passing it (an mbarrier they
    arrive on, a named barrier they reach): neither side moves, a hang on a GPU (the warp-
    specialized consumer that calls ``__syncthreads()`` while its producer waits for a free
    slot). ``(found, CTA-wide barriers read, read)``: read is False where the PTX has no labels
    to follow.

    The branches a barrier is under are its control dependences (transitively: a loop inside a
    branch), from the post-dominators of the function's control-flow graph; a branch is on the
    thread index when its predicate is computed from ``%tid``/``%laneid`` (or an
    ``elect.sync``), through any arithmetic. Not reported: a barrier after the join of such a
    branch (every thread reaches it); one whose other threads do not wait for its threads (they
    leave the kernel, and the hardware releases a barrier that waits only for exited threads:
    a final ``__syncthreads()`` of one role before it frees tensor memory); one that the other
    side can reach as well (a loop around the branch)."""
    plan = texts.get("plan") or {}
    found, total, read = [], 0, False
    for unit in _units(texts):
        if unit.body is None:
            continue
        read = True
        stmts, cfg, _, _ = _flow_graph(unit.body)
        instrs = [t for k, t, _ in stmts if k == "ins"]
        launch = _launch_of(plan, unit.name) if unit.kind == "entry" else None
        threads = math.prod(launch["block"]) if launch and isinstance(launch.get("block"), list) else None
        ev = _values(instrs)

        def transfer(op, ops, guard, env):
            if op.startswith("elect.sync") or any(_THREAD_REGS.search(o) for o in ops[1:]):
                return frozenset({"tid"})
            if guard and env.get(guard):
                return frozenset({"tid"})
            if op.split(".")[0] in ("ld", "ldu", "atom", "tcgen05", "wgmma"):
                return frozenset()
            return _sources(ops, env)
        env = _flow(instrs, transfer)
        n = len(cfg.blocks)
        ipdom = _postdominators(cfg)
        cd: list[set] = [set() for _ in range(n + 1)]
        for a in range(n):
            if len(set(cfg.succ[a])) < 2:
                continue
            for s in set(cfg.succ[a]):
                x = s
                while x is not None and x != ipdom[a] and x != n:
                    cd[x].add(a)
                    nxt = ipdom[x]
                    x = None if nxt == x else nxt

        def on_thread(a):
            last = cfg.blocks[a][-1] if cfg.blocks[a] else ""
            g = _GUARD.match(last)
            return bool(g and env.get(g.group(2)))

        def reach(start):
            seen, todo = set(), [start]
            while todo:
                x = todo.pop()
                if x in seen:
                    continue
                seen.add(x)
                if x < n:
                    todo.extend(cfg.succ[x])
            return seen

        def events(blocks):
            """(waits, signals) of the instructions of ``blocks``: what each waits on or signals,
            as ("mbarrier", address), ("named", id) or ("cluster", None)."""
            waits, signals = [], []
            for x in sorted(blocks):
                for ins in cfg.blocks[x] if x < n else []:
                    op, rest = _opcode(ins)
                    ops = _operands(rest)
                    bar = next((o for o in ops if o.startswith("[")), None)
                    addr = _address(bar, ev) if bar else None
                    if op.startswith(("mbarrier.try_wait", "mbarrier.test_wait")):
                        waits.append((("mbarrier", addr), ins))
                    elif op.startswith(("mbarrier.arrive", "mbarrier.complete_tx", "tcgen05.commit",
                                        "cp.async.mbarrier.arrive")) or "mbarrier::complete_tx" in op:
                        if "mbarrier::complete_tx" in op:      # the barrier is the last address
                            brackets = [o for o in ops if o.startswith("[")]
                            addr = _address(brackets[-1], ev) if brackets else None
                        signals.append(("mbarrier", addr))
                    elif op.startswith(("bar.", "barrier.")) and not _cta_wide(op, ops, ev, threads):
                        if op.startswith("barrier.cluster"):
                            (waits if ".wait" in op else signals).append(
                                (("cluster", None), ins) if ".wait" in op else ("cluster", None))
                            continue
                        v = ev(ops[0]) if ops else None
                        key = ("named", v[1] if isinstance(v, tuple) and v[0] is None and v[2] == 0 else None)
                        signals.append(key)
                        if ".sync" in op or ".red" in op:
                            waits.append((key, ins))
            return waits, signals

        def depends(wait, signals):
            kind, what = wait
            for k, w in signals:
                if k != kind:
                    continue
                if kind == "mbarrier" and _overlap(what, w):
                    return True
                if kind == "named" and (what is None or w is None or what == w):
                    return True
                if kind == "cluster":
                    return True
            return False

        def stuck(s, b):
            """What the threads that go to block s wait on, which only the threads at barrier
            block b can release after passing b (an mbarrier they arrive on, a named barrier
            they reach): None where there is no such wait."""
            other = reach(s)
            if b in other:
                return None
            after = set().union({b}, *(reach(x) for x in cfg.succ[b]))
            signals = events(after)[1]
            return next((ins for w, ins in events(other)[0] if depends(w, signals)), None)
        for b in range(n):
            for ins in cfg.blocks[b]:
                op, rest = _opcode(ins)
                if not _cta_wide(op, _operands(rest), ev, threads):
                    continue
                total += 1
                g = _GUARD.match(ins)
                if g and env.get(g.group(2)):           # a barrier predicated on the thread index
                    after = set().union({b}, *(reach(x) for x in cfg.succ[b]))
                    waits, signals = events(after)
                    w = next((i for w, i in waits if depends(w, signals)), None)
                    if w:
                        found.append(DivergentBarrier(unit.name, ins, ins, w))
                    continue
                ancestors, todo = set(), [b]
                while todo:
                    x = todo.pop()
                    for a in cd[x]:
                        if a not in ancestors:
                            ancestors.add(a)
                            todo.append(a)
                for a in sorted(ancestors):
                    if not on_thread(a):
                        continue
                    hit = next((w for w in (stuck(s, b) for s in sorted(set(cfg.succ[a]))) if w), None)
                    if hit:
                        found.append(DivergentBarrier(unit.name, ins, cfg.blocks[a][-1], hit))
                        break
    return found, total, read

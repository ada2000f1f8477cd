"""Where a kernel's epilogue puts each accumulator register, read from the CUDA source the grader
compiled, without a GPU.

TIRx writes the epilogue of a register-accumulator kernel as plain statements: integer index
arithmetic on ``threadIdx``/``blockIdx``, ``pair[j] = ((half)acc[k]);`` conversions and stores
into the output pointer (``*(half2*)(D_ptr + offset) = *(half2*)(pair_ptr + 0);``). This module
follows those statements, thread by thread, through the kernel's loops and branches (integer
declarations, ``for`` loops with constant bounds, ``if`` on integers) and records which
accumulator register each stored element came from. Everything else in the kernel is passed over.

Nothing is executed: expressions are parsed by the small integer-expression reader below (no
``eval``), which knows C's integer operators, casts, ``min``/``max`` and ``__shfl_sync`` and
refuses anything else (``Unknown``): a kernel whose epilogue leaves that subset is "not checked".
"""
from __future__ import annotations

import re
import time

THREAD_NAMES = {"threadIdx.x": "x", "threadIdx.y": "y", "threadIdx.z": "z"}
BLOCK_NAMES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
TYPES = {"int", "uint", "unsigned", "int32_t", "uint32_t", "int64_t", "uint64_t", "long", "short", "char",
         "bool", "half", "float", "signed"}
MAX_LINE = 4000          # a longer line is not read (the patterns below would backtrack on it)
MAX_STEPS = 3_000_000    # statements followed for all threads together: beyond, not checked
MAX_SECONDS = 20.0       # and the time to follow them (long expressions cost more than one step)
WIDTHS = {"half": 1, "half2": 2, "uint1": 2, "uint2": 4, "uint4": 8, "float2": None, "float4": None}


class Unknown(Exception):
    """An expression or statement outside the subset this module follows."""


# ---------------------------------------------------------------- integer expressions

_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|\d+)[uUlL]*|([A-Za-z_]\w*(?:\.[xyzw])?)|"
                    r"(<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^<>()!~,?:\[\]]))")


def _tokens(text: str) -> list:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise Unknown(f"cannot read {text[pos:pos + 20]!r}")
        num, name, op = m.groups()
        out.append(("num", _wrap(int(num, 0))) if num else ("name", name) if name else ("op", op))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _cdiv(a: int, b: int) -> int:
    if b == 0:
        raise Unknown("division by zero")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _cmod(a: int, b: int) -> int:
    return a - b * _cdiv(a, b)


def _wrap(v: int) -> int:
    """A value kept to 64 bits, as a C integer is (Python's would grow without bound: a source that
    squares a number in a loop, or shifts 1 by 2^40, must not exhaust the grader's memory)."""
    return (v + (1 << 63)) % (1 << 64) - (1 << 63)


def _shift(a: int, b: int, left: bool) -> int:
    if not 0 <= b < 64:
        raise Unknown(f"a shift by {b}")
    return _wrap(a << b) if left else a >> b


_BINARY = [  # lowest precedence first
    {"||": lambda a, b: int(bool(a) or bool(b))},
    {"&&": lambda a, b: int(bool(a) and bool(b))},
    {"|": lambda a, b: a | b},
    {"^": lambda a, b: a ^ b},
    {"&": lambda a, b: a & b},
    {"==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b)},
    {"<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b),
     ">=": lambda a, b: int(a >= b)},
    {"<<": lambda a, b: _shift(a, b, True), ">>": lambda a, b: _shift(a, b, False)},
    {"+": lambda a, b: _wrap(a + b), "-": lambda a, b: _wrap(a - b)},
    {"*": lambda a, b: _wrap(a * b), "/": _cdiv, "%": _cmod},
]


class _Parser:
    """Recursive descent over the tokens of one expression; returns a function of the thread's
    environment (a dict of names to ints, with the thread index under ``threadIdx.x``)."""

    def __init__(self, text: str):
        self.toks, self.i = _tokens(text), 0

    def parse(self):
        fn = self.ternary()
        if self.i != len(self.toks):
            raise Unknown(f"unexpected {self.toks[self.i][1]!r}")
        return fn

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else ("end", None)

    def take(self, op=None):
        tok = self.peek()
        if op is not None and tok != ("op", op):
            raise Unknown(f"expected {op!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def ternary(self):
        cond = self.binary(0)
        if self.peek() == ("op", "?"):
            self.take("?")
            yes = self.ternary()
            self.take(":")
            no = self.ternary()
            return lambda env: yes(env) if cond(env) else no(env)
        return cond

    def binary(self, level):
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[0] == "op" and self.peek()[1] in _BINARY[level]:
            f = _BINARY[level][self.take()[1]]
            right = self.binary(level + 1)
            left = (lambda f, a, b: lambda env: f(a(env), b(env)))(f, left, right)
        return left

    def unary(self):
        tok = self.peek()
        if tok in (("op", "-"), ("op", "!"), ("op", "~"), ("op", "+")):
            self.take()
            inner = self.unary()
            return {"-": lambda env: _wrap(-inner(env)), "!": lambda env: int(not inner(env)),
                    "~": lambda env: ~inner(env), "+": inner}[tok[1]]
        if tok == ("op", "(") and self._is_cast():
            self.i += 3 if self.toks[self.i + 2] == ("op", ")") else 4
            return self.unary()
        return self.primary()

    def _is_cast(self) -> bool:
        t = self.toks
        i = self.i
        if i + 2 < len(t) and t[i + 1][0] == "name" and t[i + 1][1] in TYPES:
            if t[i + 2] == ("op", ")"):
                return True
            return i + 3 < len(t) and t[i + 2][0] == "name" and t[i + 2][1] in TYPES and t[i + 3] == ("op", ")")
        return False

    def primary(self):
        kind, val = self.take()
        if kind == "num":
            return lambda env: val
        if kind == "op" and val == "(":
            inner = self.ternary()
            self.take(")")
            return inner
        if kind != "name":
            raise Unknown(f"unexpected {val!r}")
        if self.peek() == ("op", "("):
            return self.call(val)
        if self.peek() == ("op", "["):
            raise Unknown(f"an array element ({val}[...]) in an index")
        return lambda env: _lookup(env, val)

    def call(self, name):
        self.take("(")
        args = []
        while self.peek() != ("op", ")"):
            args.append(self.ternary())
            if self.peek() == ("op", ","):
                self.take(",")
        self.take(")")
        if name in ("min", "max") and len(args) == 2:
            f = min if name == "min" else max
            return lambda env: f(args[0](env), args[1](env))
        if name == "__shfl_sync" and len(args) == 4:
            value, lane, width = args[1], args[2], args[3]

            def shfl(env):
                w = width(env)
                if w <= 0 or w & (w - 1):
                    raise Unknown("__shfl_sync width")
                src = dict(env, **{"threadIdx.x": (env["threadIdx.x"] & ~(w - 1)) + lane(env)})
                return value({k: v for k, v in src.items() if k in THREAD_NAMES or k in BLOCK_NAMES})
            return shfl
        raise Unknown(f"a call of {name}")


def _lookup(env: dict, name: str) -> int:
    try:
        v = env[name]
    except KeyError:
        raise Unknown(f"{name} is not a value this check follows") from None
    if v is None:
        raise Unknown(f"{name} is not a value this check follows")
    return v


def expression(text: str):
    """A function of the environment computing the C integer expression ``text`` (``Unknown`` if
    it is outside the subset)."""
    return _Parser(text).parse()


# ---------------------------------------------------------------- statements

_FOR = re.compile(r"for \((?:int|int64_t) (\w+) = (.+); \1 < (.+); \+\+\1\) \{$")
_IF = re.compile(r"if \((.+)\) \{$")
_DECL = re.compile(r"(?:int|uint|int32_t|uint32_t|int64_t|long|unsigned int) (\w+) = (.+);$")
_ASSIGN = re.compile(r"(\w+(?:\.[xyzw])?) = (.+);$")        # an int, or a component of an int2/int4
_VDECL = re.compile(r"(int2|int4) (\w+);$")
_VMAKE = re.compile(r"(int2|int4) (\w+) = make_(?:int2|int4)\((.+)\);$")
_HLOAD = re.compile(r"half2 (\w+) = \*\(half2\*\)\((\w+) \+ (.+)\);$")   # two converted values, read as one
_SSTORE = re.compile(r"\(\(half\*\)(\w+)\)\[(.+)\] = (\w+)\.([xy]);$")   # one of them into a half array
_LANES = "xyzw"
_ASSIGNMENT = re.compile(r"<<=|>>=|(?<![=!<>])=(?!=)")   # the first assignment operator of a statement
_CONVERT = re.compile(r"(\w+)\[(.+?)\] = \(\(half\)(\w+)\[(.+?)\]\);$")
_VSTORE = re.compile(r"\*\((\w+)\*\)\((\w+) \+ (.+)\) = \*\((\w+)\*\)\((\w+) \+ (.+)\);$")


def _compile(text: str):
    """``expression(text)``, or, outside the subset, a function that says so when it is run (a
    statement the epilogue never reaches may hold anything)."""
    try:
        return expression(text)
    except (Unknown, RecursionError) as e:
        why = str(e) if isinstance(e, Unknown) else "an expression nested too deeply"

        def refuse(env):
            raise Unknown(why)
        return refuse


def _tree(lines: list, i: int, out: str):
    """The statements from line ``i`` to the closing brace of their block: (nodes, next line,
    whether the block ended in ``} else {``, whose line is then the next one)."""
    nodes = []
    while i < len(lines):
        s = lines[i].strip()
        i += 1
        if len(s) > MAX_LINE:
            if out in s:
                nodes.append(("opaque", s[:80]))
            continue
        if s == "}":
            return nodes, i, False
        if s == "} else {":
            return nodes, i - 1, True
        if s.startswith("} else"):
            raise Unknown(f"a branch this check does not follow: {s[:60]}")
        m = _FOR.match(s)
        if m:
            body, i = _block(lines, i, out)
            nodes.append(("for", m.group(1), _compile(m.group(2)), _compile(m.group(3)), body, _stores(body)))
            continue
        m = _IF.match(s)
        if m:
            yes, i, has_else = _tree(lines, i, out)
            no = []
            if has_else:          # this if's own else (an if without one ends at its "}")
                no, i = _block(lines, i + 1, out)
            nodes.append(("if", _compile(m.group(1)), yes, no, _stores(yes) or _stores(no)))
            continue
        if s.endswith("{"):
            body, i = _block(lines, i, out)           # a scope of its own
            nodes.extend(body)
            continue
        m = _VSTORE.match(s)
        if m and m.group(2) == out:
            width = WIDTHS.get(m.group(1))
            if not width or m.group(4) != m.group(1):
                nodes.append(("opaque", s))
            else:
                nodes.append(("vstore", width, _compile(m.group(3)), m.group(5), _compile(m.group(6))))
            continue
        m = _CONVERT.match(s)
        if m:
            kind = "store" if m.group(1) == out else "convert"
            nodes.append((kind, m.group(1), _compile(m.group(2)), m.group(3), _compile(m.group(4))))
            continue
        m = _VDECL.match(s)
        if m:
            nodes.append(("vdecl", m.group(2), 2 if m.group(1) == "int2" else 4))
            continue
        m = _VMAKE.match(s)
        if m:
            parts = _split_args(m.group(3))
            nodes.append(("vmake", m.group(2), [_compile(a) for a in parts] if len(parts) <= 4 else None))
            continue
        m = _HLOAD.match(s)
        if m:
            nodes.append(("hload", m.group(1), m.group(2), _compile(m.group(3))))
            continue
        m = _SSTORE.match(s)
        if m and m.group(1) == out:
            nodes.append(("sstore", _compile(m.group(2)), m.group(3), "xy".index(m.group(4))))
            continue
        m = _DECL.match(s) or _ASSIGN.match(s)
        if m:
            nodes.append(("int", m.group(1), _compile(m.group(2)), bool(_DECL.match(s))))
            continue
        a = _ASSIGNMENT.search(s)
        if a and not s.startswith(("if", "for", "while")) and re.search(rf"\b{re.escape(out)}\b", s[:a.start()]):
            nodes.append(("opaque", s))             # a store into the output this check cannot read
    return nodes, i


def _block(lines: list, i: int, out: str):
    """A block that cannot have an else (a loop's, a scope's, an else's own): (nodes, next line)."""
    nodes, i, has_else = _tree(lines, i, out)
    if has_else:
        raise Unknown("an else after a block that is not an if's")
    return nodes, i


def _split_args(text: str) -> list:
    """The arguments of a call, split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    return parts + [text[start:]]


def _stores(nodes) -> bool:
    """Whether ``nodes`` store into the output or convert a register (a loop's or branch's own
    answer is computed once, when the tree is read, and kept as its last field)."""
    return any(n[0] in ("vstore", "store", "sstore", "opaque", "convert", "hload")
               or (n[0] in ("for", "if") and n[-1]) for n in nodes)


def _run(nodes, env: dict, pairs: dict, out: list, budget: list) -> None:
    for n in nodes:
        budget[0] -= 1
        if budget[0] < 0:
            raise Unknown(f"the epilogue takes more than {MAX_STEPS} statements to follow")
        if budget[0] % 1024 == 0 and time.monotonic() > budget[1]:
            raise Unknown(f"the epilogue takes more than {MAX_SECONDS:.0f} s to follow")
        kind = n[0]
        if kind == "int":
            _, name, fn, declared = n
            if declared or name in env:
                try:
                    env[name] = fn(env)
                except Unknown:
                    env[name] = None
        elif kind == "for":
            _, var, lo, hi, body, has = n
            if not has:
                continue
            for v in range(lo(env), hi(env)):
                env[var] = v
                _run(body, env, pairs, out, budget)
        elif kind == "if":
            _, cond, yes, no, has = n
            if not has:
                continue
            _run(yes if cond(env) else no, env, pairs, out, budget)
        elif kind == "convert":
            _, buf, idx, src, reg = n
            pairs[(buf, idx(env))] = (src, reg(env))
        elif kind == "store":
            _, _, idx, src, reg = n
            out.append((idx(env), (src, reg(env))))
        elif kind == "vstore":
            _, width, idx, buf, start = n
            base, first = idx(env), start(env)
            for e in range(width):
                if (buf, first + e) not in pairs:
                    raise Unknown(f"{buf}[{first + e}] holds no converted accumulator value")
                out.append((base + e, pairs[(buf, first + e)]))
        elif kind == "vdecl":
            _, name, lanes = n
            for c in _LANES[:lanes]:
                env[f"{name}.{c}"] = None
        elif kind == "vmake":
            _, name, fns = n
            for c, fn in zip(_LANES, fns or []):
                try:
                    env[f"{name}.{c}"] = fn(env)
                except Unknown:
                    env[f"{name}.{c}"] = None
        elif kind == "hload":
            _, name, buf, start = n
            first = start(env)
            for e in range(2):
                if (buf, first + e) not in pairs:
                    raise Unknown(f"{buf}[{first + e}] holds no converted accumulator value")
                pairs[("half2", name, e)] = pairs[(buf, first + e)]
        elif kind == "sstore":
            _, idx, vec, e = n
            if ("half2", vec, e) not in pairs:
                raise Unknown(f"{vec} holds no converted accumulator value")
            out.append((idx(env), pairs[("half2", vec, e)]))
        elif kind == "opaque":
            raise Unknown(f"a store this check cannot read: {n[1][:80]}")


def kernel_body(cuda: str) -> list:
    """The lines of the ``__global__`` function's body (the last definition in the source)."""
    lines = cuda.splitlines()
    starts = [i for i, s in enumerate(lines) if "__global__" in s and s.rstrip().endswith("{")]
    if not starts:
        raise Unknown("no __global__ function in the CUDA source")
    return lines[starts[-1] + 1:]


def output_pointer(cuda: str, name: str) -> str:
    """The CUDA name of the kernel parameter ``name`` (TIRx appends ``_ptr``)."""
    return f"{name}_ptr" if re.search(rf"\b{name}_ptr\b", cuda) else name


def epilogue_places(cuda: str, threads: int, out: str = "D", block=(0, 0, 0), pointer: str | None = None) -> dict:
    """{thread: [(element offset, (accumulator buffer, register)), ...]}: every element the threads
    of CTA ``block`` store into the output ``out`` (or into the CUDA array ``pointer``), in order,
    with the register it came from. Raises ``Unknown`` where the epilogue leaves the subset this
    module follows."""
    ptr = pointer or output_pointer(cuda, out)
    try:
        nodes, _, _ = _tree(kernel_body(cuda), 0, ptr)
    except RecursionError:
        raise Unknown("blocks nested too deeply") from None
    if not _stores(nodes):
        raise Unknown(f"no store into {out} converts an accumulator register")
    places, budget = {}, [MAX_STEPS, time.monotonic() + MAX_SECONDS]
    for t in range(threads):
        env = {"threadIdx.x": t, "threadIdx.y": 0, "threadIdx.z": 0,
               **dict(zip(BLOCK_NAMES, block))}
        stored: list = []
        try:
            _run(nodes, env, {}, stored, budget)
        except RecursionError:
            raise Unknown("an expression nested too deeply") from None
        places[t] = stored
    return places


_TMA_STORE = re.compile(r"ptx_cp_async_bulk_tensor_shared_to_global\w*\(\(?&\(\(\(half\*\)(\w+)\)\[(\d{1,12})\]\)\)?,")


def tma_store_source(cuda: str) -> tuple[str, int]:
    """(CUDA array, element offset) of the shared-memory tile the kernel's TMA stores read: the
    lowest start among its stores (a tile stored in column blocks starts at its first)."""
    found = {(m.group(1), int(m.group(2))) for m in _TMA_STORE.finditer("\n".join(kernel_body(cuda)))}
    if not found:
        raise Unknown("no TMA store of an fp16 shared-memory tile found")
    if len({p for p, _ in found}) != 1:
        raise Unknown("TMA stores from more than one shared-memory array")
    return min(found, key=lambda f: f[1])


# ---------------------------------------------------------------- the check against the fragment

_WGMMA_CALL = re.compile(r"^\s*ptx_wgmma_mma_async_\w+\((.*)\);\s*$", re.M)


def wgmma_blocks(cuda: str, buf: str) -> list:
    """The first register of ``buf`` that each wgmma call of the kernel names, per call, when every
    call passes a run of consecutive registers ``buf[s] .. buf[s + n - 1]`` (register i of the
    instruction's fragment is ``buf[s + i]``); ``Unknown`` otherwise."""
    starts = []
    for m in _WGMMA_CALL.finditer(cuda):
        regs = re.findall(rf"\b{re.escape(buf)}\[([^\]]*)\]", m.group(1))
        if not regs:
            continue
        if not all(r.strip().isdigit() for r in regs):
            raise Unknown("a wgmma names its accumulator registers by computed indices")
        idx = [int(r) for r in regs]
        if idx != list(range(idx[0], idx[0] + len(idx))) or idx[0] % len(idx):
            raise Unknown("a wgmma's accumulator registers are not one aligned run")
        starts.append((idx[0], len(idx)))
    return starts


def _orders(blocks: list, regs: int) -> list:
    """The register maps to try: the kernel's accumulator runs taken in the declared order, and,
    where a kernel's runs are whole m64 halves, in any order of the halves (a kernel may pair its
    first run with the second half of the tile, in its MMAs and its epilogue alike)."""
    runs = sorted(set(blocks))
    if not runs:
        return [lambda k: k]
    n = runs[0][1]
    if any(length != n for _, length in runs) or len(runs) * n != regs or len(runs) > 4:
        raise Unknown("the wgmmas' accumulator runs do not cover the accumulator once")
    import itertools
    starts = [s for s, _ in runs]
    return [(lambda perm: lambda k: perm[k // n] * n + k % n)({s // n: p for s, p in zip(starts, order)})
            for order in itertools.permutations(range(len(runs)))]

class Places:
    """Where the epilogue of a build part must put each accumulator register (the course
    grader's, from the lab module): ``offsets[t][k]`` is the element of the output, as an offset
    from its start, that thread ``t`` of CTA ``block`` stores from its register ``k``; ``cols`` is the
    output's row length (for messages). The student edition holds the same answer hashed, thread
    by thread (grader/edition/tables.py), with the same ``threads``, ``regs``, ``cols`` and ``fits``."""

    def __init__(self, offsets: list, cols: int, block=(0, 0, 0), via: str | None = None):
        self.offsets, self.cols, self.block = [list(o) for o in offsets], cols, tuple(block)
        self.threads, self.regs = len(offsets), len(offsets[0])
        self.via = via      # None: stores into the output; "tma_store": into the tile a TMA store reads

    def fits(self, thread: int, got: list) -> bool:
        return got == self.offsets[thread]


def check_places(cuda: str, places, out: str = "D") -> tuple[bool | None, str]:
    """(verdict, what was found) over one or more CTAs' places (a ``Places`` or a list of them):
    False as soon as one CTA's threads misplace a register, True when every CTA's do not, None
    (not checked) where the epilogue leaves the subset this module follows."""
    if not isinstance(places, (list, tuple)) or len(places) == 1:
        return _check_block(cuda, places[0] if isinstance(places, (list, tuple)) else places, out)
    said, verdicts = [], []
    for p in places:
        ok, msg = _check_block(cuda, p, out)
        name = f"CTA {p.block[:2]}" if any(p.block) else "CTA 0"
        if ok is False:
            return False, f"{name}: {msg}"
        verdicts.append(ok)
        said.append(f"{name}: {msg}")
    return (None if None in verdicts else True), "; ".join(said)


def _check_block(cuda: str, places, out: str) -> tuple[bool | None, str]:
    """check_places for the threads of one CTA, ``places.block``."""
    via = places.via
    try:
        if via == "tma_store":       # offsets into the tile the TMA store reads, from its start
            ptr, base = tma_store_source(cuda)
            stored = epilogue_places(cuda, places.threads, block=places.block, pointer=ptr)
            stored = {t: [(off - base, src) for off, src in rows] for t, rows in stored.items()}
            out = "the TMA store's shared-memory tile"
        else:
            stored = epilogue_places(cuda, places.threads, out, block=places.block)
    except Unknown as e:
        return None, f"not checked ({e})"
    buffers = {buf for rows in stored.values() for _, (buf, _) in rows}
    if len(buffers) != 1:
        return None, f"not checked (the stores into {out} convert values of {len(buffers)} buffers)"
    try:
        orders = _orders(wgmma_blocks(cuda, next(iter(buffers))), places.regs)
    except Unknown as e:
        return None, f"not checked ({e})"
    by_reg = []                         # per thread: {register: [offsets it is stored at]}
    for t in range(places.threads):
        regs: dict = {}
        for off, (_, k) in stored[t]:
            regs.setdefault(k, []).append(off)
        by_reg.append(regs)
    best = None
    for canonical in orders:
        wrong, first = [], None
        for t, regs in enumerate(by_reg):
            got = [None] * places.regs
            for k, offs in regs.items():
                if 0 <= k < places.regs and len(offs) == 1:
                    got[canonical(k)] = offs[0]
            if not places.fits(t, got):
                wrong.append(t)
                if first is None:
                    first = (t, regs)
        if best is None or len(wrong) < len(best[0]):
            best = (wrong, first)
    wrong, first = best
    (buf,) = buffers
    if not wrong:
        return True, f"each of {places.threads} threads stores its {places.regs} registers of {buf} in place"
    t, regs = first
    twice = sorted(k for k, offs in regs.items() if len(offs) > 1)
    never = [k for k in range(places.regs) if k not in regs]
    where = ((lambda off: f"element {off}") if via == "tma_store" else   # noqa: E731 (swizzled: no (row, col) to show)
             (lambda off: f"{out}[{off // places.cols}][{off % places.cols}]"))
    shown = ", ".join(f"{buf}[{k}] -> {where(regs[k][0])}" for k in sorted(regs)[:4] if len(regs[k]) == 1)
    extra = (f"; stored twice: {', '.join(map(str, twice[:6]))}" if twice else "") + \
            (f"; never stored: {', '.join(map(str, never[:6]))}{' ...' if len(never) > 6 else ''}" if never else "")
    return False, (f"{len(wrong)} of {places.threads} threads store registers where the wgmma accumulator does not "
                   f"hold them; thread {t} stores {shown}{extra}")

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

import math
import re
import time

THREAD_NAMES = {"threadIdx.x": "x", "threadIdx.y": "y", "threadIdx.z": "z"}
BLOCK_NAMES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
CLUSTER_NAMES = ("tvm_builtin_cluster_ctaid_x", "tvm_builtin_cluster_ctaid_y", "tvm_builtin_cluster_ctaid_z")
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
        if num and len(num) > 24:
            raise Unknown(f"a number of {len(num)} digits")
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
                return value({k: v for k, v in src.items() if k in THREAD_NAMES or k in BLOCK_NAMES
                              or k in CLUSTER_NAMES})
            return shfl
        if name in CLUSTER_NAMES and not args:        # the CTA's rank in its cluster, along x, y or z
            return lambda env: _lookup(env, name)
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
_TMA_STORE = re.compile(r"ptx_cp_async_bulk_tensor_shared_to_global_(\d)d\((.*)\);$")
_COMMIT = re.compile(r"ptx_cp_async_bulk_tensor_commit_group\(\);$")          # closes a bulk group of TMA stores
_WAIT = re.compile(r"ptx_cp_async_bulk_wait_group(?:_read)?_(\d+)\(\);$")      # all but the last n groups have read
# a barrier of the CTA or of a warpgroup
_SYNC = re.compile(r"(?:tvm_builtin_cuda_(?:cta|warpgroup)_sync|__syncthreads)\(.*\);$")
_TMA_SOURCE = re.compile(r"\(?&\(\(\(half\*\)(\w+)\)\[(.+)\]\)\)?$")       # (&(((half*)pool)[start]))
_TMA_MAP = re.compile(r"\(\(unsigned long long\)\(&\((\w+)\)\)\)$")         # ((unsigned long long)(&(D_tensormap)))


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
        if _SYNC.match(s):
            nodes.append(("sync",))
            continue
        if _COMMIT.match(s):
            nodes.append(("commit",))
            continue
        m = _WAIT.match(s)
        if m and len(m.group(1)) < 4:
            nodes.append(("wait", int(m.group(1))))
            continue
        m = _TMA_STORE.match(s)
        if m:
            nodes.append(_tma_node(int(m.group(1)), _split_args(m.group(2)), s))
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


def _tma_node(rank: int, args: list, line: str) -> tuple:
    """A TMA store (shared tile -> global tensor): ("tma", array, start, tensor map, coordinates),
    or ("tma?", line) where its arguments are not in the form TIRx writes."""
    src, tmap = (_TMA_SOURCE.match(args[0].strip()), _TMA_MAP.match(args[1].strip())) if len(args) == 3 + rank \
        else (None, None)
    if not (src and tmap):
        return ("tma?", line)
    return ("tma", src.group(1), _compile(src.group(2)), tmap.group(1), [_compile(a) for a in args[3:]])


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
    return any(n[0] in ("vstore", "store", "sstore", "opaque", "convert", "hload", "tma", "tma?", "sync", "commit",
                        "wait")
               or (n[0] in ("for", "if") and n[-1]) for n in nodes)


def _run(nodes, env: dict, pairs: dict, out: list, budget: list, tma: list) -> None:
    """Follow ``nodes`` for one thread: the elements it stores go to ``out`` as (offset, (buffer,
    register), epoch), the TMA stores it issues to ``tma`` as [array, start, tensor map,
    coordinates, epoch, bulk group, epoch at which a wait saw it read]; the epoch counts the
    barriers the thread has passed."""
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
                _run(body, env, pairs, out, budget, tma)
        elif kind == "if":
            _, cond, yes, no, has = n
            if not has:
                continue
            _run(yes if cond(env) else no, env, pairs, out, budget, tma)
        elif kind == "convert":
            _, buf, idx, src, reg = n
            pairs[(buf, idx(env))] = (src, reg(env))
        elif kind == "store":
            _, _, idx, src, reg = n
            out.append((idx(env), (src, reg(env)), env["__epoch"]))
        elif kind == "vstore":
            _, width, idx, buf, start = n
            base, first = idx(env), start(env)
            for e in range(width):
                if (buf, first + e) not in pairs:
                    raise Unknown(f"{buf}[{first + e}] holds no converted accumulator value")
                out.append((base + e, pairs[(buf, first + e)], env["__epoch"]))
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
            out.append((idx(env), pairs[("half2", vec, e)], env["__epoch"]))
        elif kind == "tma":
            _, arr, start, tmap, coords = n
            tma.append([arr, start(env), tmap, tuple(c(env) for c in coords), env["__epoch"], None, None])
        elif kind == "sync":
            env["__epoch"] += 1
        elif kind == "commit":
            for store in tma:
                if store[5] is None:
                    store[5] = env["__groups"]
            env["__groups"] += 1
        elif kind == "wait":
            for store in tma:
                if store[5] is not None and store[5] < env["__groups"] - n[1] and store[6] is None:
                    store[6] = env["__epoch"]
        elif kind == "tma?":
            raise Unknown(f"a TMA store this check cannot read: {n[1][:80]}")
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


def _follow(cuda: str, threads, ptr: str, out: str, block, cluster=(1, 1, 1)) -> tuple[dict, set]:
    """({thread: [(element offset into ``ptr``, (accumulator buffer, register), epoch), ...]}, {TMA
    store issued by any thread}) for the ``threads`` (CTA thread indices) of CTA ``block``, in
    clusters of ``cluster`` CTAs."""
    try:
        nodes, _, _ = _tree(kernel_body(cuda), 0, ptr)
    except RecursionError:
        raise Unknown("blocks nested too deeply") from None
    if not _stores(nodes):
        raise Unknown(f"no store into {out} converts an accumulator register")
    places, issued, budget = {}, set(), [MAX_STEPS, time.monotonic() + MAX_SECONDS]
    for t in threads:
        env = {"threadIdx.x": t, "threadIdx.y": 0, "threadIdx.z": 0, "__epoch": 0, "__groups": 0,
               **dict(zip(BLOCK_NAMES, block)), **{n: b % c for n, b, c in zip(CLUSTER_NAMES, block, cluster)}}
        stored: list = []
        tma: list = []
        try:
            _run(nodes, env, {}, stored, budget, tma)
        except RecursionError:
            raise Unknown("an expression nested too deeply") from None
        places[t] = stored
        issued.update(tuple(store) for store in tma)
    return places, issued


def epilogue_places(cuda: str, threads, out: str = "D", block=(0, 0, 0), pointer: str | None = None) -> dict:
    """{thread: [(element offset, (accumulator buffer, register)), ...]}: every element the
    ``threads`` (a count from thread 0, or CTA thread indices) of CTA ``block`` store into the
    output ``out`` (or into the CUDA array ``pointer``), in order, with the register it came from.
    Raises ``Unknown`` where the epilogue leaves the subset this module follows."""
    threads = range(threads) if isinstance(threads, int) else threads
    stored = _follow(cuda, threads, pointer or output_pointer(cuda, out), out, block)[0]
    return {t: [(off, src) for off, src, _ in rows] for t, rows in stored.items()}


_TMA_ARRAY = re.compile(r"ptx_cp_async_bulk_tensor_shared_to_global_\dd\(\(?&\(\(\(half\*\)(\w+)\)\[")
MAX_BOX_ELEMENTS = 1 << 22     # the elements of all TMA stores followed together: beyond, not checked
MAX_WRITES_AT = 256            # writes into one element of the tile: beyond, not checked
RACED = -1                                  # the place of a write a TMA store may or may not read
SWIZZLE_BITS = {0: 0, 1: 1, 2: 2, 3: 3}     # CUtensorMapSwizzle none, 32B, 64B, 128B: Swizzle<B, 4, 3>


def tma_store_array(cuda: str) -> str:
    """The CUDA array (shared memory) the kernel's fp16 TMA stores read."""
    found = set(_TMA_ARRAY.findall("\n".join(kernel_body(cuda))))
    if not found:
        raise Unknown("no TMA store of an fp16 shared-memory tile found")
    if len(found) != 1:
        raise Unknown("TMA stores from more than one shared-memory array")
    return found.pop()


def _tensor_maps(cuda: str, plan: dict) -> tuple[dict, dict]:
    """({CUDA parameter name: the launch plan's TMA descriptor} for the kernel's tensor-map
    parameters, the plan's launch of the kernel)."""
    lines = cuda.splitlines()
    heads = [s for s in lines if "__global__" in s and s.rstrip().endswith("{")]
    m = re.search(r"(\w+)\(([^()]*)\)\s*\{\s*$", heads[-1]) if heads else None
    if not m:
        raise Unknown("no __global__ function in the CUDA source")
    launches = [ln for ln in (plan or {}).get("launches", []) if ln.get("name") == m.group(1)]
    if not launches:
        raise Unknown(f"the launch plan does not launch {m.group(1)}")
    maps = {}
    for name, arg in zip([p.split()[-1] for p in _split_args(m.group(2))], launches[0].get("args", [])):
        if isinstance(arg, dict) and "tensormap" in arg:
            maps[name] = plan["tensormaps"][arg["tensormap"]]
    return maps, launches[0]


def _box_elements(tm: dict, start: int, coords: tuple):
    """(shared element offset, global element offset) of each element an fp16 TMA store of
    descriptor ``tm`` moves from the tile at element ``start`` of its array to ``coords`` (innermost
    first). The box is packed innermost dimension first; a swizzle XORs bits 4.. of each byte
    address with bits 7.. (the pool's start is taken as aligned, as the kernels' layouts take it).
    Elements outside the tensor are not stored (TMA clips them)."""
    rank = tm.get("rank")
    if tm.get("dtype") != "float16" or rank not in (1, 2, 3, 4, 5) or len(coords) != rank \
            or tm.get("interleave") != 0 or tm.get("offset") != 0 or list(tm.get("element_strides", [])) != [1] * rank:
        raise Unknown("a TMA store whose descriptor is not a plain fp16 one of its coordinates' rank")
    box, sizes, strides = list(tm["box"]), list(tm["sizes"]), [2] + list(tm["strides"])
    bits = SWIZZLE_BITS.get(tm.get("swizzle"))
    if bits is None or (bits and box[0] * 2 != 16 << bits) or (box[0] * 2) % 16 or any(st % 2 for st in strides):
        raise Unknown(f"a TMA store box of {box[0]} fp16 elements inner with swizzle mode {tm.get('swizzle')}")
    mask = (1 << bits) - 1
    index = [0] * rank
    for linear in range(math.prod(box)):
        rest = linear
        for d in range(rank):
            rest, index[d] = divmod(rest, box[d])
        at = [c + i for c, i in zip(coords, index)]
        if all(0 <= x < n for x, n in zip(at, sizes)):
            byte = 2 * (start + linear)
            yield (byte ^ (((byte >> 7) & mask) << 4)) // 2, sum(x * st for x, st in zip(at, strides)) // 2


def tma_epilogue_places(cuda: str, plan: dict, threads, out: str = "D", block=(0, 0, 0)) -> dict:
    """epilogue_places for an epilogue that writes a shared-memory tile and TMA-stores it into
    ``out``, for the ``threads`` (CTA thread indices) of CTA ``block``. Each TMA store the CTA
    issues (its start, box, swizzle and coordinates, from the launch plan) reads, at each element of
    its box, the value last written there before the barrier that precedes it: the write of the
    latest barrier epoch before the store's. That write's register is placed at the store's element
    of ``out``. Writes of different threads in that same epoch race: both are placed there (one of
    them wrongly). A tile reused chunk after chunk is followed chunk by chunk: a write at or after the
    store's epoch races with the store's read of the tile unless the issuing thread waited for the
    store's bulk group to be read before a barrier that precedes the write; such a write's register
    is placed at ``RACED`` as well."""
    ptr = tma_store_array(cuda)
    maps, launch = _tensor_maps(cuda, plan)
    written, issued = _follow(cuda, threads, ptr, out, block, tuple(launch.get("cluster") or (1, 1, 1)))
    writes: dict = {}                  # shared element -> [(epoch, order, thread, register)]
    for t, rows in written.items():
        for order, (off, src, epoch) in enumerate(rows):
            at = writes.setdefault(off, [])
            if len(at) >= MAX_WRITES_AT:
                raise Unknown(f"one element of the tile is written more than {MAX_WRITES_AT} times")
            at.append((epoch, order, t, src))
    boxes = [maps[st[2]]["box"] for st in issued if st[2] in maps]
    if sum(math.prod(b) for b in boxes if all(isinstance(x, int) and 0 < x <= 256 for x in b)) > MAX_BOX_ELEMENTS \
            or not all(all(isinstance(x, int) and 0 < x <= 256 for x in b) for b in boxes):
        raise Unknown(f"the TMA stores move more than {MAX_BOX_ELEMENTS} elements, or a box extent is outside 1..256")
    places: dict = {t: [] for t in written}
    stores = 0
    for arr, start, tmap, coords, epoch, _, read_by in sorted(issued, key=lambda st: (st[4], st[1], repr(st[3]))):
        tm = maps.get(tmap)
        if tm is None:
            raise Unknown(f"a TMA store through {tmap}, which is not a tensor-map parameter of the kernel")
        if arr != ptr or plan["signature"][tm["tensor"]]["name"] != out:
            continue
        stores += 1
        for smem, g in _box_elements(tm, start, coords):
            there = writes.get(smem, ())
            before = [w for w in there if w[0] < epoch]
            if before:
                last = max(w[0] for w in before)
                for t in {w[2] for w in before if w[0] == last}:
                    _, _, _, src = max(w for w in before if w[0] == last and w[2] == t)
                    places[t].append((g, src))
            for _, _, t, src in (w for w in there if w[0] >= epoch and (read_by is None or w[0] <= read_by)):
                places[t].append((RACED, src))      # written while the store may still be reading
    if not stores:
        raise Unknown(f"no TMA store of this CTA writes {out}")
    return places


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
    by thread (grader/edition/tables.py), with the same ``threads``, ``regs``, ``cols`` and ``fits``.
    The threads are the CTA's first ones (warp-specialized kernels: see RelativePlaces). An edge
    tile's registers whose elements lie outside the output have the offset None (never stored);
    ``size``, the output's element count, lets a store past its end be named as such."""
    first = 0

    def __init__(self, offsets: list, cols: int, block=(0, 0, 0), via: str | None = None, size: int | None = None):
        self.offsets, self.cols, self.block = [list(o) for o in offsets], cols, tuple(block)
        self.threads, self.regs = len(offsets), len(offsets[0])
        self.via = via      # None: stored into the output; "tma_store": through the tile TMA stores read
        self.size = size

    def fits(self, thread: int, got: list) -> bool:
        return got == self.offsets[thread]


def check_places(cuda: str, places, out: str = "D", plan: dict | None = None) -> tuple[bool | None, str]:
    """(verdict, what was found) over one or more CTAs' places (a ``Places`` or a list of them):
    False as soon as one CTA's threads misplace a register, True when every CTA's do not, None
    (not checked) where the epilogue leaves the subset this module follows. ``plan``, the launch
    plan, gives the TMA stores' descriptors (places reached ``via`` a TMA store)."""
    if not isinstance(places, (list, tuple)) or len(places) == 1:
        return _check_block(cuda, places[0] if isinstance(places, (list, tuple)) else places, out, plan)
    said, verdicts = [], []
    for p in places:
        ok, msg = _check_block(cuda, p, out, plan)
        name = f"CTA {p.block[:2]}" if any(p.block) else "CTA 0"
        if ok is False:
            return False, f"{name}: {msg}"
        verdicts.append(ok)
        said.append(f"{name}: {msg}")
    return (None if None in verdicts else True), "; ".join(said)


def _followed(cuda: str, places, out: str, plan: dict | None):
    """(threads, {thread: [(offset in out, (buffer, register))]}, buffer), or (None, verdict, message)
    where the stores cannot be judged, for the threads ``places`` names."""
    threads = range(places.first, places.first + places.threads)
    try:
        if places.via == "tma_store":       # through the shared tile and the TMA stores that read it
            if not plan:
                raise Unknown("no launch plan to read the TMA stores' boxes from")
            try:
                stored = tma_epilogue_places(cuda, plan, threads, out, block=places.block)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
                raise Unknown(f"the launch plan's TMA descriptors are not in the form the grader writes "
                              f"({type(e).__name__})") from None
        else:
            stored = epilogue_places(cuda, threads, out, block=places.block)
    except Unknown as e:
        return None, None, f"not checked ({e})"
    buffers = {buf for rows in stored.values() for _, (buf, _) in rows}
    if not buffers and places.via == "tma_store":
        return None, False, (f"no value the threads write into the shared tile reaches {out}: each TMA store reads "
                             "parts of the tile that nothing was written to before the barrier preceding the store "
                             "(a store issued with no barrier after the writes reads the tile before they land)")
    if len(buffers) != 1:
        return None, None, f"not checked (the stores into {out} convert values of {len(buffers)} buffers)"
    return threads, stored, buffers.pop()


def _by_register(stored: dict, threads) -> dict:
    """{thread: {register: [offsets it is stored at]}}."""
    by_reg = {t: {} for t in threads}
    for t in threads:
        for off, (_, k) in stored[t]:
            by_reg[t].setdefault(k, []).append(off)
    return by_reg


def _faults(regs: dict, ks, buf: str, out: str, cols: int, via: str = "") -> str:
    """Where registers ``ks`` of one thread (``regs``: register -> offsets) went (``via`` says how),
    and what went wrong."""
    raced = [k for k in ks if RACED in regs.get(k, ())]
    placed = {k: [o for o in regs.get(k, ()) if o != RACED] for k in ks}
    twice = [k for k in ks if len(placed[k]) > 1]
    never = [k for k in ks if not placed[k]]
    shown = ", ".join(f"{buf}[{k}] -> {out}[{placed[k][0] // cols}][{placed[k][0] % cols}]"
                      for k in [k for k in ks if len(placed[k]) == 1][:4])

    def said(what, ks):
        return f"; {what}: {', '.join(map(str, ks[:6]))}{' ...' if len(ks) > 6 else ''}" if ks else ""
    return shown + via + said("written while a TMA store may still be reading the tile (no barrier after the store's "
                        "issue, or no wait for its bulk group before that barrier)", raced) \
        + said("stored twice", twice) + said("never stored", never)


def _check_block(cuda: str, places, out: str, plan: dict | None) -> tuple[bool | None, str]:
    """check_places for the threads of one CTA, ``places.block``."""
    if getattr(places, "relative", False):
        return _check_relative(cuda, places, out, plan)
    threads, stored, buf = _followed(cuda, places, out, plan)
    if threads is None:
        return stored, buf
    try:
        orders = _orders(wgmma_blocks(cuda, buf), places.regs)
    except Unknown as e:
        return None, f"not checked ({e})"
    by_reg = list(_by_register(stored, threads).values())
    size = getattr(places, "size", None)
    if size is not None:
        past = [(t, k, o) for t, regs in enumerate(by_reg) for k, offs in regs.items() for o in offs
                if o != RACED and not 0 <= o < size]
        if past:
            t, k, o = past[0]
            return False, (f"{len({t for t, _, _ in past})} of {places.threads} threads store registers outside "
                           f"{out} ({size // places.cols} rows of {places.cols}); thread {t} stores {buf}[{k}] at "
                           f"{out}[{o // places.cols}][{o % places.cols}], past its last row: an edge tile's "
                           "store needs a bound")
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
    if not wrong:
        kept = sum(1 for regs in by_reg for k in range(places.regs) if not regs.get(k))
        if kept:
            return True, (f"each of {places.threads} threads stores its registers of {buf} in place, and the "
                          f"{kept} registers of elements outside {out} (an edge tile) nowhere")
        return True, f"each of {places.threads} threads stores its {places.regs} registers of {buf} in place"
    t, regs = first
    via = " (through the shared tile and its TMA stores)" if places.via == "tma_store" else ""
    return False, (f"{len(wrong)} of {places.threads} threads store registers where the wgmma accumulator does not "
                   f"hold them; thread {t} stores " + _faults(regs, range(places.regs), buf, out, places.cols, via))


class RelativePlaces:
    """Places known up to where each wgmma's block of the tile sits (warp-specialized kernels whose
    consumers' share of the tile is the student's choice): ``rel[n][t][k]`` is the offset in the
    output, from where register 0 of the warpgroup's thread 0 lands, at which register k of
    thread t of an m64 x 2n wgmma fragment (n registers) belongs. The warpgroups begin at CTA
    thread ``first``, ``group`` threads each, ``threads`` in all; together their registers must
    cover ``tile`` (row, col, rows, cols of the output ``out``, seen as rows of ``cols`` elements)
    once; a tile whose row and col are None may be any tile of that size (which tile a CTA holds
    is the kernel's choice). The edition holds ``rel`` hashed."""
    relative = True

    def __init__(self, rel: dict, cols: int, tile, block=(0, 0, 0), via: str | None = None, first: int = 0,
                 threads: int = 128, group: int = 128, out: str = "D"):
        self.rel, self.cols, self.tile, self.block, self.via = rel, cols, tuple(tile), tuple(block), via
        self.first, self.threads, self.group, self.out = first, threads, group, out

    def fits(self, n: int, thread: int, got: list) -> bool:
        return n in self.rel and got == self.rel[n][thread]


def _check_relative(cuda: str, places, out: str, plan: dict | None) -> tuple[bool | None, str]:
    """check_places for ``RelativePlaces``: within each wgmma's run of registers, every thread's
    registers land where the fragment puts them relative to the run's first register of the
    warpgroup's thread 0; the runs of all warpgroups together cover the tile once."""
    out = places.out
    threads, stored, buf = _followed(cuda, places, out, plan)
    if threads is None:
        return stored, buf
    try:
        runs = sorted(set(wgmma_blocks(cuda, buf)))
    except Unknown as e:
        return None, f"not checked ({e})"
    if not runs or len({n for _, n in runs}) != 1 or runs[0][1] not in places.rel:
        return None, "not checked (the wgmmas' accumulator runs are not of one fragment size the check knows)"
    by_reg = _by_register(stored, threads)
    wrong, first = 0, None
    for w in range(places.threads // places.group):
        lead = places.first + w * places.group
        for start, n in runs:
            anchor = by_reg[lead].get(start, [])
            base = anchor[0] if len(anchor) == 1 and anchor[0] != RACED else None
            for i in range(places.group):
                regs = by_reg[lead + i]
                got = [regs[start + k][0] - base if base is not None and len(regs.get(start + k, [])) == 1
                       and regs[start + k][0] != RACED else None for k in range(n)]
                if not places.fits(n, i, got):
                    wrong += 1
                    if first is None:
                        first = (lead + i, start, n, regs)
    if first:
        t, start, n, regs = first
        return False, (f"{wrong} of {places.threads * len(runs)} (thread, wgmma) pairs store registers out of the "
                       f"shape of the wgmma fragment; thread {t}, the wgmma on {buf}[{start}] .. "
                       f"{buf}[{start + n - 1}]: "
                       + _faults(regs, range(start, start + n), buf, out, places.cols))
    row0, col0, rows, cols = places.tile
    got = sorted(off for t in threads for offs in by_reg[t].values() for off in offs)
    if row0 is None:                    # which tile the CTA holds is the kernel's: the block it starts
        row0, col0 = divmod(got[0], places.cols) if got else (0, 0)
        col0 = min((off % places.cols for off in got), default=0)
        if row0 % rows or col0 % cols:
            return False, (f"each wgmma's registers keep the fragment's shape, but the CTA's block starts at "
                           f"{out}[{row0}][{col0}], which is not the corner of a {rows} x {cols} tile")
    want = sorted((row0 + r) * places.cols + col0 + c for r in range(rows) for c in range(cols))
    if got != want:
        import collections
        seen = collections.Counter(got)
        twice = sum(1 for v in seen.values() if v > 1)
        missing = len(set(want) - set(seen))
        return False, (f"each wgmma's registers keep the fragment's shape, but together they do not cover the "
                       f"{rows} x {cols} tile once: {twice} elements stored more than once, {missing} never "
                       f"(two warpgroups, or two wgmmas, store their blocks over each other)")
    return True, (f"each of {places.threads} threads stores its registers in the shape of the wgmma fragment "
                  f"({len(runs)} wgmma run{'s' if len(runs) > 1 else ''} of {runs[0][1]} registers per thread), "
                  f"and together they cover the {rows} x {cols} tile once")

"""The student edition's grading of CPU parts from recorded tables: the table format
(``grader/public/<lab>.json``, arguments and expected answers as JSON), the comparisons, and
``table_graders(lab)``, the ``GRADERS`` of a lab in the edition. Shipped in the edition; the
tables are recorded by grader/edition/release.py on the instructors' side."""
from __future__ import annotations

import functools
import importlib
import json
import os

from .. import compare, spec

TABLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "public")
COURSE_GRADER_ONLY = "checked by the course grader (not in the student edition)"
_TUPLE, _OFFSET, _SEALED = "__tuple__", "__offset__", "__sealed__"


# ---------------------------------------------------------------- the tables (JSON)

def encode(x):
    """A JSON-able form of a case's arguments or answer; tuples stay tuples through decode()."""
    if isinstance(x, TableOffset):
        return {_OFFSET: x.name}
    if isinstance(x, Sealed):
        return {_SEALED: x.digest, "salt": x.salt}
    if isinstance(x, tuple):
        return {_TUPLE: [encode(v) for v in x]}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x) or _TUPLE in x or _OFFSET in x:
            raise TypeError(f"cannot record a dictionary with keys {list(x)!r}")
        return {k: encode(v) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "__index__"):
        return int(x.__index__())
    raise TypeError(f"cannot record an object of type {type(x).__name__}")


def decode(x, offsets: dict | None = None):
    if isinstance(x, list):
        return [decode(v, offsets) for v in x]
    if isinstance(x, dict):
        if _TUPLE in x:
            return tuple(decode(v, offsets) for v in x[_TUPLE])
        if _OFFSET in x:
            o = (offsets or {})[x[_OFFSET]]
            return TableOffset(x[_OFFSET], o["shape"], o["values"])
        if _SEALED in x:
            return Sealed(x[_SEALED], x["salt"])
        return {k: decode(v, offsets) for k, v in x.items()}
    return x


try:   # the grader's table of a function of (i, j), which can cross to a sandboxed submission
    from ..remote import Table2D as _TableBase
except ImportError:  # pragma: no cover - a grader without one
    _TableBase = object


class TableOffset(_TableBase):
    """An offset function ``offset(r, c)`` of a tile, given by its values in row-major order (the
    layouts lab 3's address-pattern functions are called with)."""

    def __init__(self, name: str, shape, values):
        self.name, self.shape, self.values = name, tuple(shape), list(values)
        cols = self.shape[1]
        self.table = [self.values[r * cols:(r + 1) * cols] for r in range(self.shape[0])]

    def __call__(self, r, c):
        return self.values[int(r) * self.shape[1] + int(c)]

    def __repr__(self) -> str:
        return f"<offset: {self.name}>"


class Sealed:
    """The answer of a public case that the table must not show (a function whose few inputs the
    public cases would otherwise answer all of: the spec's ``sealed_public``): its hash only, salted
    with the case, so that a check can tell a right answer from a wrong one without holding it."""

    def __init__(self, digest: str, salt: str):
        self.digest, self.salt = digest, salt

    @staticmethod
    def of(answer, salt: str) -> "Sealed":
        return Sealed(_digest(answer, salt), salt)

    def matches(self, answer) -> bool:
        try:
            return _digest(answer, self.salt) == self.digest
        except Exception:  # noqa: BLE001 - an odd answer (not JSON-able, an iterator that raises) is a wrong one
            return False

    def __repr__(self) -> str:
        return "<sealed answer>"


def _digest(answer, salt: str) -> str:
    """The salted hash of an answer as "same" compares it (compare.normalize: lists and tuples
    alike, 2.0 == 2; any other iterable stands for a list)."""
    import hashlib
    if not isinstance(answer, (list, tuple, dict, str)) and hasattr(answer, "__iter__"):
        answer = list(answer)
    text = json.dumps(compare.normalize(answer), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{salt}\n{text}".encode()).hexdigest()


def _salt(*key) -> str:
    """A sealed value's salt: its case (or tile), so that equal answers of two cases hash apart."""
    import hashlib
    return hashlib.sha256(json.dumps(list(key), sort_keys=True).encode()).hexdigest()[:16]


def seal_cases(fn: str, cases: list) -> list:
    """``[[args, expected], ...]`` (encoded) with each expected answer sealed (see :class:`Sealed`)."""
    return [[args, encode(Sealed.of(decode(expected), _salt(fn, args)))] for args, expected in cases]


class SealedTile:
    """An operand tile of a build part's wgmma descriptors (the check ``wgmma_desc_fields``) as the
    edition holds it: its name, which fields the hardware does not read (``None`` in the course
    grader's pattern), and the hash of the others. ``fits(fields)`` says whether a descriptor's
    (LBO, SBO, swizzle) are the tile's, without the table holding them."""

    def __init__(self, name: str, wild: list, sealed: Sealed):
        self.name, self.wild, self.sealed = name, [bool(w) for w in wild], sealed

    def fits(self, fields) -> bool:
        return self.sealed.matches([None if w else int(f) for w, f in zip(self.wild, fields)])


def seal_tiles(part_id: str, tiles: list) -> list:
    """The course grader's ``DESC_FIELDS`` of one part, [(name, (lbo or None, sbo, swizzle))], as the
    edition's table holds them (see :class:`SealedTile`)."""
    return [{"name": name, "wild": [x is None for x in pattern], "seal": encode(Sealed.of(list(pattern), _salt(part_id, name)))}
            for name, pattern in tiles]


class SealedPlaces:
    """A build part's accumulator places (the check ``wgmma_epilogue_places``, fragment.Places) as
    the edition holds them: each thread's list of output offsets hashed, so that ``fits(thread,
    got)`` tells right from wrong without the table holding the fragment."""

    first = 0

    def __init__(self, cols: int, regs: int, seals: list, block=(0, 0, 0), via: str | None = None,
                 size: int | None = None):
        self.cols, self.regs, self.seals, self.block, self.via = cols, regs, seals, tuple(block), via
        self.threads, self.size = len(seals), size

    def fits(self, thread: int, got: list) -> bool:
        return self.seals[thread].matches(got)


class SealedRelativePlaces:
    """fragment.RelativePlaces as the edition holds them: per wgmma width and thread, the
    fragment's offsets hashed."""
    relative = True

    def __init__(self, cols: int, tile, seals: dict, block=(0, 0, 0), via: str | None = None, first: int = 0,
                 threads: int = 128, group: int = 128, out: str = "D"):
        self.cols, self.tile, self.seals, self.block, self.via = cols, tuple(tile), seals, tuple(block), via
        self.first, self.threads, self.group, self.out = first, threads, group, out
        self.rel = {int(n): None for n in seals}

    def fits(self, n: int, thread: int, got: list) -> bool:
        return str(n) in self.seals and self.seals[str(n)][thread].matches(got)


def _seal_relative(part_id: str, p) -> dict:
    return {"kind": "relative", "cols": p.cols, "tile": list(p.tile), "block": list(p.block), "via": p.via,
            "first": p.first, "threads": p.threads, "group": p.group, "out": p.out,
            "seals": {str(n): [encode(Sealed.of(p.rel[n][t], _salt(part_id, "acc-rel", n, t))) for t in range(p.group)]
                      for n in p.rel}}


def _unseal(e: dict):
    if e.get("kind") == "relative":
        return SealedRelativePlaces(e["cols"], e["tile"], {n: [decode(s) for s in v] for n, v in e["seals"].items()},
                                    e["block"], e["via"], e["first"], e["threads"], e["group"], e["out"])
    return SealedPlaces(e["cols"], e["regs"], [decode(s) for s in e["seals"]], e["block"], e["via"], e.get("size"))


def _seal_exact(part_id: str, p) -> dict:
    return {"cols": p.cols, "regs": p.regs, "block": list(p.block), "via": p.via, "size": p.size,
            "seals": [encode(Sealed.of(p.offsets[t], _salt(part_id, "acc", list(p.block), t)))
                      for t in range(p.threads)]}


def seal_places(part_id: str, places: list) -> list:
    """The course grader's ``ACC_PLACES`` of one part (a Places per CTA checked, or RelativePlaces)
    as the edition's table holds them."""
    return [(_seal_relative if getattr(p, "relative", False) else _seal_exact)(part_id, p) for p in places]


def sealed_acc_places(lab: str) -> dict:
    """The edition's ``ACC_PLACES`` of a lab: part id -> SealedPlaces (or SealedRelativePlaces),
    from its table."""
    return {part: [_unseal(e) for e in entries]
            for part, entries in load_table(lab).get("acc_places", {}).items()}


def sealed_desc_fields(lab: str) -> dict:
    """The edition's ``DESC_FIELDS`` of a lab: part id -> [(name, SealedTile)], from its table."""
    entries = load_table(lab).get("desc_fields", {})
    return {part: [(e["name"], SealedTile(e["name"], e["wild"], decode(e["seal"]))) for e in tiles]
            for part, tiles in entries.items()}


@functools.lru_cache(maxsize=None)
def load_table(lab: str) -> dict:
    with open(os.path.join(TABLES_DIR, f"{lab}.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------- comparisons (as the labs make them)

def _evaluate(layout, r: int, c: int, shape) -> dict:
    """A TIRx layout at logical (r, c) of ``shape``: {axis: value}, zero entries dropped."""
    return {str(k): int(v) for k, v in layout.apply(r, c, shape=list(shape)).items() if int(v) != 0}


def _layout(got, exp, how):
    """``got`` must be a TIRx layout that gives the recorded values at the recorded elements."""
    from tvm.tirx.layout import Layout
    if not (isinstance(got, Layout) or getattr(got, "is_layout", False)):   # here, or in a sandbox
        return False, f"returned {type(got).__name__}, not a TileLayout/ComposeLayout"
    for i, j, want in exp["points"]:
        have = _evaluate(got, i, j, exp["shape"])
        if have != want:
            return False, f"at ({i}, {j}) apply gives {have}, expected {want}"
    return True, ""


def _sealed(got, exp, how):
    """``got`` must be the answer whose hash the table holds (exact comparison, as "same")."""
    if exp.matches(got):
        return True, ""
    return False, f"got {_short(got)}; this public case's answer is sealed (the check keeps only its hash)"


# The comparisons of compare.ANSWERS (the grader's own), the edition's check of a TIRx layout,
# and of a sealed answer.
COMPARE = {**compare.ANSWERS, "layout": _layout, "sealed": _sealed}


def _short(x, limit: int = 90) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 5] + " ...]"


# ---------------------------------------------------------------- what a part checks besides its cases

def _figure(module, extra: dict, offsets: dict) -> tuple[bool, str]:
    """The plotting function draws something; what it draws is the course grader's business."""
    from .. import grading
    axes = grading.figure(module, extra["fn"], *decode(extra["args"], offsets))
    drawn = any(ax.get("lines") or ax.get("points") or ax.get("images") for ax in axes)
    msg = f"{extra['fn']} drew a figure" if drawn else f"{extra['fn']} saved no figure (or an empty one)"
    return drawn, msg + "; its content is checked by the course grader"


def _chunked_bijection(module, extra: dict, offsets: dict) -> tuple[bool, str]:
    """An offset function of a tile that is a bijection onto the tile and keeps every chunk of
    ``chunk`` elements whole and aligned (what lab 3's transpose kernel needs to store 16 bytes
    at a time). Its bank conflicts are the course grader's to score (``own_counts`` shows them)."""
    from .. import grading
    (rows, cols), chunk = extra["shape"], extra["chunk"]
    return grading.chunked_bijection(grading.student(module, extra["fn"]), rows, cols, chunk, extra["fn"])


def _own_counts(module, extra: dict, offsets: dict) -> tuple[None, str]:
    """Not scored: a design's cost counted with the submission's own functions (lab 3: its address
    patterns on its transpose layout, counted by its wavefront counter), beside what the design
    needs. A signal where the edition holds no counter of its own; the course grader counts with
    its own model."""
    from .. import grading
    from ..remote import Table2D
    rows, cols = extra["shape"]
    count = grading.student(module, extra["counter"])
    parts = []
    try:
        layout = Table2D(grading.student(module, extra["fn"]), rows, cols)
        for pattern in extra["patterns"]:
            make = grading.student(module, pattern["fn"])
            worst = max(int(count(make(layout, *args), pattern["width"])) for args in pattern["args"])
            parts.append(f"{pattern['fn']} up to {worst} wavefronts (the design needs {pattern['needs']})")
    except Exception as e:   # noqa: BLE001 - whatever the submission raised, said and not scored
        return None, f"{extra['fn']} not counted: {type(e).__name__}: {str(e)[:200]}"
    return None, (f"{extra['fn']}, counted with your {', '.join(p['fn'] for p in extra['patterns'])} and "
                  f"{extra['counter']}: " + ", ".join(parts) + " (not scored here: the course grader counts with its own)")


EXTRAS = {"figure": _figure, "chunked_bijection": _chunked_bijection, "own_counts": _own_counts}


# ---------------------------------------------------------------- grading a part

def grade_from_table(entry: dict, module, ctx):
    """Grade a part from its recorded public cases (grading.grade_calls, as the course grader
    grades a declared question): the share of cases answered right, and half of the points for
    the part's other checks when it has some (a figure, a layout's shape)."""
    from ..context import Outcome
    from .. import grading
    offsets = entry.get("offsets", {})
    calls = []
    for chk in entry["checks"]:
        fn, how = grading.student(module, chk["fn"]), chk["compare"]
        same = functools.partial(_with_how, COMPARE[how["kind"]], how)
        for args, expected in decode(chk["cases"], offsets):
            calls.append(grading.Call(chk["fn"], functools.partial(_label, chk["fn"], args),
                                      functools.partial(fn, *args), expected, same))
    table = grading.grade_calls(calls, noun="public cases", per_function=True)
    frac, msg = table.fraction, table.message + " (the course grader adds hidden ones)"
    extras = [EXTRAS[e["kind"]](module, e, offsets) for e in entry.get("extras", [])]
    scored = [ok for ok, _ in extras if ok is not None]     # None: said, not scored
    if scored:
        frac = 0.5 * frac + 0.5 * sum(scored) / len(scored)
    if extras:
        msg += " | " + " | ".join(m for _, m in extras)
    if entry.get("note"):
        msg += " | " + entry["note"]
    return Outcome(frac, msg, table.measurements)


def _with_how(compare_fn, how, got, expected):
    return compare_fn(got, expected, how)


def _label(fn: str, args) -> str:
    return f"{fn}({', '.join(_short(a) for a in args)})"


def course_grader_only(module, ctx):
    from ..context import Outcome
    from ..report import SKIPPED
    return Outcome(0.0, COURSE_GRADER_ONLY, verdict=SKIPPED)


def _shipped(target: str):
    module_name, _, qualname = target.partition(":")

    def grade(module, ctx):
        fn = importlib.import_module(module_name)
        for attr in qualname.split("."):
            fn = getattr(fn, attr)
        return fn(module, ctx)
    return grade


def table_graders(lab: str) -> dict:
    """``GRADERS`` of a lab in the student edition (see the module's docstring). A part graded by
    the default runner of its kind is left out: grader/labs falls back to that runner."""
    table = load_table(lab)
    graders = {}
    for part in spec.load(lab).parts:
        if part.id in table["parts"]:
            graders[part.id] = functools.partial(grade_from_table, table["parts"][part.id])
        elif part.id in table.get("shipped", {}):
            graders[part.id] = _shipped(table["shipped"][part.id])
        elif part.id not in table.get("default_runner", []):
            graders[part.id] = course_grader_only
    return graders

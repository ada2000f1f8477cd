"""Compiler errors in the course's words.

TIRx reports a tile operation it cannot lower (``Tx.copy_async``, ``Tx.copy``, ...) as a table
of every lowering it tried, each row with the operation's whole IR, hundreds of columns wide.
:func:`explain` turns such a report into a few lines: which operation, why each lowering
declined, and, for the failures this course knows (a swizzled shared-memory tile that does not
start on its swizzle atom's boundary), what the course teaches to do instead. TVM's own advice
in those rows (``dispatch="tma_explicit"``) is left out: the course's kernels use ``tma_auto``.

:func:`same_for_every_arch` says a build failure that is the same on every arch once; and
:func:`install_excepthook` makes a TIRx parse error that reaches the top of a script print its
own text (the line and the reason), where TVM's hook prints only a note about TVM_BACKTRACE.
"""
from __future__ import annotations

import dataclasses
import re
import sys

_HEADER = re.compile(r"TIRx schedule dispatch failed: op=(\S+) target=(\S+)")
_TVM_ADVICE = re.compile(r";?\s*use dispatch=\"tma_explicit\"[^|]*$")
_SHARED_OFFSET = re.compile(r"shared slice offset=(.+?)B must preserve (\d+)B alignment(?: \((\w+)\))?")
_SHARED_BUFFER = re.compile(r"^(\w+) = T\.Buffer\(.*scope=\"shared[^\"]*\"")
_ARCH = r"sm_\d+[a-z]?"
LECTURE_SWIZZLE = 'lectures/lab2_tma, "Swizzling, the 128-byte inner box and 3D boxes"'

# How the course names the tile operations TIRx reports by their IR names.
_OP_NAMES = {"tirx.tile.copy_async": "Tx.copy_async", "tirx.tile.copy": "Tx.copy"}


@dataclasses.dataclass
class Variant:
    """One row of a dispatch report: a lowering TIRx tried and why it did not apply."""
    name: str
    reason: str = ""
    call: str = ""                                   # the operation, as TIRx prints it
    buffers: dict[str, str] = dataclasses.field(default_factory=dict)   # name -> declaration


def dispatch_report(text: str) -> tuple[str, list[Variant]] | None:
    """(operation, variants tried) of a TIRx dispatch failure report in ``text``, or None."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if _HEADER.search(ln)), None)
    if start is None:
        return None
    op = _HEADER.search(lines[start]).group(1)
    rule = next((ln for ln in lines[start + 1:] if ln.startswith("+-")), None)
    cut = rule.index("+", 1) if rule else None        # where the variant column ends
    variants: list[Variant] = []
    in_call = False
    for ln in lines[start + 1:]:
        if ln.startswith("+"):
            continue
        if not ln.startswith("|"):
            if variants or (rule and ln.strip()):
                break                                 # the table has ended
            continue
        if cut is not None and len(ln) > cut and ln[cut] == "|":
            name, cell = ln[1:cut].strip(), ln[cut + 1:].rstrip().rstrip("|").strip()
        else:
            parts = ln.strip("|").split(" | ", 1)
            name, cell = (parts[0].strip(), parts[1].strip()) if len(parts) == 2 else ("", parts[0].strip())
        if name == "Variant" and cell == "Error":
            continue
        if name:
            variants.append(Variant(re.sub(r"\s*\(prio=\d+\)$", "", name)))
            in_call = False
        if not variants:
            continue
        v = variants[-1]
        if not v.reason:
            v.reason = cell
        elif cell == "opcall:":
            in_call = True
        elif in_call:
            if cell.startswith("Traceback") or cell.startswith("File "):
                in_call = False
            elif m := _SHARED_BUFFER.match(cell):
                v.buffers[m.group(1)] = cell
            elif re.match(r"^T\.\w+(\.\w+)*\(", cell) and not v.call:
                v.call = cell
    return op, variants


def _reason(v: Variant) -> str:
    """A variant's reason without TIRx's prefixes and TVM's advice."""
    text = re.sub(r"^(declined|rejected:?|exception)\s*[—-]+\s*", "", v.reason)
    text = re.sub(rf"^{re.escape(v.name)} stage=[\w-]+:\s*", "", text)
    return _TVM_ADVICE.sub("", text).strip()


def _shorten(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[:width - 5] + " ...)"


def _swizzle_advice(op: str, v: Variant, m: re.Match) -> str:
    """The course's words for a swizzled shared-memory slice that does not start on its atom."""
    offset, swizzle, status = m.group(1), int(m.group(2)), m.group(3) or ""
    atom = 8 * swizzle                   # TVM checks the swizzle's span; the course asks for its atom
    names = [n for n, decl in v.buffers.items() if "ComposeLayout" in decl] or list(v.buffers)
    buf = f"`{names[0]}`" if names else "the shared-memory tile"
    where = (f"starts at byte {offset} of shared memory" if offset.strip().isdigit()
             else f"starts at byte offset {offset} of shared memory")
    verdict = "not a multiple of" if status == "disproven" else "not provably a multiple of"
    index = _unaligned_index(offset, atom)
    if index is None:
        fix = (f"Fix: allocate the mbarriers first, then call pool.move_base_to({atom}) before allocating the "
               f"swizzled tiles (see {LECTURE_SWIZZLE}).")
    else:
        term, var, stride = index
        fix = (f"Fix: the base is on an atom, but the term `{term}` is not: the index `{var}` moves the tile by "
               f"{stride} byte(s), the stride TIRx gives that dimension. A dimension of extent 1 (a ring of one "
               "stage) has no stride of its own: index it with an expression that folds to a constant there, "
               "not with a variable the compiler cannot see through.")
    return "\n".join([
        f"{_OP_NAMES.get(op, op)} cannot be lowered: the shared-memory tile {buf} {where}, {verdict} {atom}.",
        f"Why: TMA computes the {swizzle}-byte swizzle from shared-memory address bits, and the pattern repeats "
        f"every {atom} bytes (one swizzle atom: 8 rows of {swizzle} bytes); only a tile that starts on an atom "
        "boundary receives the layout your code reads.",
        fix,
    ] + ([f"The copy: {_shorten(v.call)}"] if v.call else []))


_TERM_STRIDE = re.compile(r"^(.*\S)\s*\*\s*(\d+)$")


def _unaligned_index(offset: str, atom: int) -> tuple[str, str, int] | None:
    """For an offset ``a * s + ... + c`` whose constant ``c`` is a multiple of the atom: the first
    term, its index and its stride ``s`` that is not (a term without ``* s`` moves by one byte);
    None otherwise, or when the offset has parentheses."""
    if "(" in offset:
        return None
    terms = [t.strip() for t in offset.split(" + ")]
    if sum(int(t) for t in terms if t.isdigit()) % atom:
        return None
    for t in terms:
        if not t.isdigit():
            m = _TERM_STRIDE.match(t)
            var, stride = (m.group(1), int(m.group(2))) if m else (t, 1)
            if stride % atom:
                return t, var, stride
    return None


def explain(e_or_text) -> str | None:
    """A few lines for a TIRx dispatch failure (``e_or_text``: the exception or its text), or
    None when it is not one."""
    text = e_or_text if isinstance(e_or_text, str) else str(e_or_text)
    found = dispatch_report(text)
    if found is None:
        return None
    op, variants = found
    for v in variants:
        m = _SHARED_OFFSET.search(v.reason)
        if m and int(m.group(2)) >= 32:              # a swizzled tile (32, 64 or 128 bytes)
            return _swizzle_advice(op, v, m)
    name = _OP_NAMES.get(op, op)
    call = next((v.call for v in variants if v.call), "")
    if not variants:
        lines = [f"{name} cannot be lowered: TIRx has no lowering of it for this target."]
    elif len(variants) == 1:
        lines = [f"{name} cannot be lowered: TIRx's only lowering of it declined:"]
    else:
        lines = [f"{name} cannot be lowered: each of TIRx's {len(variants)} lowerings of it declined:"]
    lines += [f"  {v.name}: {_reason(v)}" for v in variants]
    if call:
        lines.append(f"The operation: {_shorten(call)}")
    return "\n".join(lines)


_SEGMENT = re.compile(rf" \| (?={_ARCH}: )")
_FIRST = re.compile(rf"^(\w+: )?({_ARCH}): ", re.S)


def same_for_every_arch(message: str) -> str:
    """A build part's message with a failure that reads the same for every arch said once:
    "sm_90a: does not build: X for sm_90a | sm_100a: does not build: X for sm_100a" becomes
    "sm_90a and sm_100a: does not build: X for sm_90a and sm_100a". Other messages are returned
    as they are (builders are separated by " || ", archs by " | ")."""
    pieces = []
    for piece in message.split(" || "):
        segments = _SEGMENT.split(piece)
        first = _FIRST.match(segments[0])
        if len(segments) < 2 or first is None:
            pieces.append(piece)
            continue
        prefix = first.group(1) or ""
        segments[0] = segments[0][len(prefix):]
        archs, bodies = [], []
        for seg in segments:
            arch, _, body = seg.partition(": ")
            archs.append(arch)
            bodies.append(body.replace(arch, "{arch}"))
        if len(set(bodies)) == 1 and bodies[0].startswith("does not build:"):
            names = " and ".join(archs) if len(archs) == 2 else ", ".join(archs)
            pieces.append(f"{prefix}{names}: " + bodies[0].replace("{arch}", names))
        else:
            pieces.append(piece)
    return " || ".join(pieces)


def install_excepthook() -> None:
    """Make a TIRx parse error (tvm.error.DiagnosticError) that ends a script print its own text:
    the error, the file and line, the kernel's line and the caret. TVM's hook, installed when
    ``tvm`` is imported, prints only "note: run with `TVM_BACKTRACE=1` environment variable to
    display a backtrace" for it. Installed once; other exceptions go to the hook before it."""
    import tvm  # noqa: F401 - TVM installs its hook at import: ours must wrap it, not the other way
    previous = sys.excepthook
    if getattr(previous, "course_hint", False):
        return

    def hook(etype, value, tb):
        if etype.__name__ != "DiagnosticError" or not etype.__module__.startswith("tvm"):
            return previous(etype, value, tb)
        import traceback
        frames = [f for f in traceback.extract_tb(tb) if "site-packages" not in f.filename
                  and "dist-packages" not in f.filename]
        where = "".join(traceback.format_list(frames[-4:]))
        sys.stderr.write(("Traceback (most recent call last):\n" + where if where else "")
                         + f"DiagnosticError (your TIRx kernel does not parse): {value}\n")
        import multiprocessing       # as TVM's hook does: no child process outlives the error
        for child in multiprocessing.active_children():
            child.terminate()
        return None

    hook.course_hint = True
    sys.excepthook = hook

"""Mechanism checks: does the generated code use the hardware path the part is about?

This module holds the mechanisms (``MECHANISMS``), the listings they read (``launched_texts``)
and the checks that turn what they find into a ``CheckResult`` and its message. What a check
needs from the PTX beyond a pattern (its functions and instructions, values followed to a
symbol plus a constant, the control flow, and the facts read from them) comes from
grader/ptxflow.py, which imports nothing from here.

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

Several checks read more than one listing (``Mechanism.custom``), or the launch plan and the
ptxas log that ``launched_texts`` hands over with the listings:

- ``mbarrier_expect_tx``: a remote ``mbarrier.arrive.expect_tx`` (the book's 2-CTA cluster arms
  the leader's barrier through ``remote_view(0)``) assembles to ``SYNCS.ARRIVE.TRANS64.RED`` with
  a byte-count register, and so does an arrive that ptxas itself emits for a 2-CTA TMEM
  allocation (``tcgen05.alloc.cta_group::2``). So the PTX instruction counts, confirmed by an
  arrive with a transaction count in the SASS; with SASS alone only the forms no setup code
  produces count (see ``SYNCS_ARRIVE``).
- ``mma_smem_swizzled``: the swizzle mode of every tensor-core shared-memory descriptor, read from
  the descriptor-encoding calls of the CUDA source as a whole (their last argument is the mode).
- ``mbarrier_ring*``: the stages of the kernel's ring: the number of distinct mbarriers that
  TMA loads complete on (the barrier operand of ``cp.async.bulk.tensor ...
  mbarrier::complete_tx``), the addresses followed through the PTX (``ptxflow.ring_stages``); the
  warp-specialized ring also needs its full, empty and accumulator barriers initialised.
- ``mbarrier_expect_tx`` also checks the byte counts: the expect_tx counts on a barrier must add
  up to the bytes of the TMA loads completing on it, each load the box of its tensor map in the
  launch plan (``ptxflow.tx_byte_counts``); a count the PTX does not fix is said to be unchecked.
- ``vector_load_128``/``vector_store_128``: 128-bit accesses in the SASS, and in the PTX for every
  tensor the kernel reads (writes), the parameter each address is computed from
  (``ptxflow.tensor_accesses``): one input read with 128-bit loads does not cover another.
- ``cta_barrier_uniform``: no CTA-wide barrier (``bar.sync 0``) reached only by the threads of a
  branch on the thread index while the others wait for them: a hang on a GPU, found in the
  PTX's control flow (``ptxflow.divergent_cta_barriers``).
- ``setmaxnreg*``: USETMAXREG in the SASS, and no "'setmaxnreg' ignored" from ptxas for a launched
  function with setmaxnreg in its PTX (the kernel attribute it needs: ``SETMAXNREG_FIX``).

The wgmma accumulator-hazard check reads the same SASS.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

from .ptxflow import (divergent_cta_barriers, functions_with, ptx_callees, ptx_functions, ptx_instructions,
                      ring_stages, strip_comments, tensor_accesses, tx_byte_counts)

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
# The swizzle argument of TVM's descriptor encoders (0 none, 1 32B, 2 64B, 3 128B, 4 128B with
# 32-byte atomicity), in the generated CUDA source.
DESCRIPTOR_CALLS = ("tvm_builtin_ptx_tcgen05_encode_matrix_descriptor", "ptx_wgmma_encode_matrix_descriptor")
SWIZZLE_NAMES = {0: "SWIZZLE_NONE", 1: "32B", 2: "64B", 3: "128B", 4: "128B (32B atoms)"}


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


_TENSOR_CORE_PAIRS = ((re.compile(r"\bwgmma\.mma_async"), re.compile(r"\bHGMMA\b"), "wgmma.mma_async", "HGMMA"),
                      (re.compile(r"\btcgen05\.mma\b"), re.compile(r"\bUTC\w*MMA\b"), "tcgen05.mma", "UTC*MMA"))


def sass_gap(plan: dict | None, ptx: str, sass: str) -> str | None:
    """Why cuobjdump's listing ``sass`` cannot be the whole of the code assembled from ``ptx``,
    or None: an empty listing, an entry the plan launches (defined in the PTX) with no section,
    or a tensor-core MMA in the launched PTX with none in the launched SASS. A check reading such
    a listing would judge a kernel by code it does not have (build.checked_sass)."""
    if not sass.strip():
        return "the listing is empty"
    funcs, sections = ptx_functions(ptx), sass_functions(sass)
    names = launched_functions(plan, ptx, sass)
    missing = [n for n in names if n in funcs and funcs[n][0] == "entry" and n not in sections]
    if missing:
        return f"no section for the launched entry {missing[0]}"
    ptx_text = "".join(funcs[n][1] for n in names if n in funcs)
    sass_text = "".join(sections.get(n, "") for n in names)
    for in_ptx, in_sass, ptx_name, sass_name in _TENSOR_CORE_PAIRS:
        if in_ptx.search(ptx_text) and not in_sass.search(sass_text):
            return f"the launched PTX has {ptx_name}, the launched SASS no {sass_name}"
    return None


def launched_texts(art) -> dict:
    """The listings the mechanism checks read for a compiled kernel ``art`` (build.Artifacts):
    ``sass``, the cuobjdump sections of the launched functions (``launched_functions``);
    ``ptx``, their PTX instructions, one per line, under an ``.entry NAME;``/``.func NAME;``
    line naming each function; ``ptx_module``, the same functions as PTX source with their labels
    and scopes (comments and strings removed), for the checks that follow the control flow;
    ``cuda``, the CUDA source as it is (its one check reads the descriptors of the whole source);
    ``plan``, the launch plan (its tensor maps and parameters: what the TMA byte counts and the
    per-tensor vector accesses are checked against); ``ptxas_log``, what ptxas said when it
    assembled the code (an ignored ``setmaxnreg``). A static reading: see ``STATIC``."""
    names = launched_functions(art.plan, art.ptx or "", art.sass or "")
    funcs = ptx_functions(art.ptx or "")
    sections = sass_functions(art.sass) if art.sass else {}
    ptx_lines, module = [], []
    for name in names:
        if name in funcs:
            ptx_lines.append(f".{funcs[name][0]} {name};")
            ptx_lines.extend(ptx_instructions(funcs[name][1]))
            module.append(f".{funcs[name][0]} {name}()\n{{{funcs[name][1]}}}\n")
    return {"sass": "".join(sections[n] for n in names if n in sections),
            "ptx": "\n".join(ptx_lines) + ("\n" if ptx_lines else ""),
            "ptx_module": "".join(module),
            "cuda": art.cuda_source or "",
            "plan": getattr(art, "plan", None),
            "ptxas_log": getattr(art, "ptxas_log", "") or ""}


# ---------------------------------------------------------------- the checks of their own (Mechanism.custom)

def _ring(m: Mechanism, texts: dict[str, str]) -> CheckResult:
    """``mbarrier_ring`` (min_count 2: stages) and ``mbarrier_ring_ws`` (also 6 mbarriers
    initialised: a full and an empty barrier per stage, the accumulator's full and empty)."""
    ptx = texts.get("ptx", "")
    if not ptx:
        return CheckResult(m.name, False, 0, f"{m.description}: no PTX to inspect")
    ring = ring_stages(ptx)
    need_bars = 6 if m.name == "mbarrier_ring_ws" else 0
    ok = ring.stages >= m.min_count and ring.barriers >= need_bars
    where = f"{ring.stages} stage(s) used at the build shape: TMA loads complete on {ring.stages} mbarrier(s)" + (
        f" ({', '.join(ring.names)})" if ring.names else "")
    if ring.indexed:      # an upper bound: a barrier array indexed at run time, its index's range not followed
        where = (f"up to {ring.stages} stage(s): TMA loads complete on a barrier indexed at run time "
                 f"({'; '.join(ring.indexed)}), counted as every initialised mbarrier that index can reach"
                 + (f" ({', '.join(ring.names)})" if ring.names else ""))
    if need_bars:
        where += f"; {ring.barriers} mbarriers initialised"
    if ring.unresolved and ok:
        where += (f"; {ring.unresolved} more barrier operand(s) computed at run time not followed, so the ring may "
                  "have more stages than this")
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
    if ok and ptx and texts.get("plan"):
        rep = tx_byte_counts(texts)
        if rep.wrong:
            more = f" (and {len(rep.wrong) - 1} more)" if len(rep.wrong) > 1 else ""
            return CheckResult(m.name, False, count, (
                f"{m.description}: WRONG BYTE COUNT ({where}; {rep.wrong[0]}{more}). An expect_tx must announce "
                "the bytes of the TMA loads that complete on its barrier in that phase: for each load, the product "
                "of its box extents times the element size. Too few let the consumer read a tile before it has "
                "landed; too many hang the kernel on a GPU"))
        if rep.checked:
            more = f" (and {len(rep.checked) - 1} more barrier(s))" if len(rep.checked) > 1 else ""
            where += f"; byte counts match the TMA boxes: {rep.checked[0]}{more}"
        if rep.unchecked:
            more = f" (and {len(rep.unchecked) - 1} more)" if len(rep.unchecked) > 1 else ""
            where += f"; {rep.unchecked[0]}{more}"
    return CheckResult(m.name, ok, count, f"{m.description}: {'found' if ok else 'MISSING'} ({where}{note})")


def _call_args(code: str, name: str):
    """The arguments (split at the top level, stripped) of every call of ``name`` in ``code``,
    less the helper's definition."""
    for m in re.finditer(r"(?<![\w.])" + name + r"\s*\(", code):
        if re.search(r"\bvoid\s*$", code[max(0, m.start() - 40):m.start()]):
            continue                                # the helper's definition, not a call
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        args, depth, start, parts = code[m.end():i - 1], 0, 0, []
        for j, ch in enumerate(args + ","):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                parts.append(args[start:j].strip())
                start = j + 1
        yield parts


def descriptor_swizzles(cuda: str) -> list[int | None]:
    """The swizzle argument of every tensor-core shared-memory descriptor encoded in ``cuda``
    (None where it is not a literal), comments and strings removed."""
    code = strip_comments(cuda)
    return [int(parts[-1]) if re.fullmatch(r"\d+", parts[-1]) else None
            for name in DESCRIPTOR_CALLS for parts in _call_args(code, name)]


def wgmma_descriptor_fields(cuda: str) -> list[tuple[int, int, int] | None]:
    """(LBO, SBO, swizzle) of every wgmma shared-memory descriptor encoded in ``cuda`` (the
    arguments of ``ptx_wgmma_encode_matrix_descriptor(desc, start, lbo, sbo, swizzle)``), None
    for a call whose three fields are not all literals; comments and strings removed."""
    out = []
    for parts in _call_args(strip_comments(cuda), "ptx_wgmma_encode_matrix_descriptor"):
        fields = parts[2:5]
        ok = len(fields) == 3 and all(re.fullmatch(r"\d+", f) for f in fields)
        out.append(tuple(int(f) for f in fields) if ok else None)
    return out


def _desc_fields(m: Mechanism, texts: dict) -> CheckResult:
    """``wgmma_desc_fields``: every wgmma descriptor of the kernel encodes the fields of one of the
    step's operand tiles, and each tile's fields are encoded somewhere. The tiles come with the
    texts (``desc_fields``: [(name, (lbo or None, sbo, swizzle))], None for an LBO the hardware does
    not read), from the lab module of the course grader, or sealed in the student edition's table
    (a tile that says itself whether fields fit it, grader/edition/tables.py). Messages name the
    tiles and the fields the kernel encodes, never the expected ones."""
    tiles = texts.get("desc_fields")
    if tiles is None:
        return CheckResult(m.name, True, 0, f"{m.description}: checked by the course grader (no tiles' fields "
                                            "given to this check)")
    found, missing = _descriptors(m, texts, wgmma_descriptor_fields, "no wgmma descriptor encoded")
    if missing:
        return missing
    if any(f is None for f in found):
        return CheckResult(m.name, True, len(found), f"{m.description}: not checked (a descriptor's fields are not "
                                                     "constants the builder computed)")

    def fits(f, want):                  # a pattern, or a tile that matches itself (the edition's sealed ones)
        if hasattr(want, "fits"):
            return want.fits(f)
        return all(w is None or w == x for w, x in zip(want, f))
    names = ", ".join(n for n, _ in tiles)
    odd = sorted({f for f in found if not any(fits(f, want) for _, want in tiles)})
    missing = [n for n, want in tiles if not any(fits(f, want) for f in found)]
    shown = ", ".join(f"({a}, {b}, {c}) x {found.count((a, b, c))}" for a, b, c in sorted(set(found)))
    if odd or missing:
        why = []
        if odd:
            why.append(f"(LBO, SBO, swizzle) = {', '.join(map(str, odd))} describe{'s' if len(odd) == 1 else ''} none "
                       f"of this step's operand tiles ({names})")
        if missing:
            why.append(f"no descriptor has the fields of {', '.join(missing)}")
        return CheckResult(m.name, False, len(found), (
            f"{m.description}: WRONG ({'; '.join(why)}. Encoded: {shown}. The fields follow from each tile's "
            "layout and major-ness (part a); a wrong field reads the wrong elements on a GPU, with no error)"))
    return CheckResult(m.name, True, len(found), f"{m.description}: ok (each of {names}; encoded: {shown})")


def _epilogue_places(m: Mechanism, texts: dict) -> CheckResult:
    """``wgmma_epilogue_places``: the epilogue stores every accumulator register of the threads of
    the CTAs the lab names (CTA 0, and one more where there is a grid) at the element of the output
    the wgmma fragment gives it, read from the CUDA source by following
    the index arithmetic thread by thread (grader/fragment.py). The answer comes with the texts
    (``acc_places``), from the lab module, or hashed per thread in the student edition. A kernel
    whose epilogue this reading cannot follow is not checked here (its correctness part still runs
    it on a GPU)."""
    from . import fragment
    places = texts.get("acc_places")
    if places is None:
        return CheckResult(m.name, True, 0, f"{m.description}: checked by the course grader (no fragment given "
                                            "to this check)")
    cuda = texts.get("cuda", "")
    if not cuda:
        return CheckResult(m.name, False, 0, f"{m.description}: no CUDA source to inspect")
    ok, said = fragment.check_places(cuda, places, plan=texts.get("plan"))
    if ok is None:
        return CheckResult(m.name, True, 0, f"{m.description}: {said}")
    if not ok and "store needs a bound" in said:        # an edge tile stored past the output's end
        return CheckResult(m.name, False, 0, f"{m.description}: WRONG ({said}; on a GPU such a kernel writes memory "
                                             "it was not given)")
    if not ok:
        return CheckResult(m.name, False, 0, (
            f"{m.description}: WRONG ({said}. The wgmma accumulator fragment, Lab 4's part a mapping "
            "wgmma_acc_coord, is the map the epilogue must follow; on a GPU such a kernel writes a permuted output)"))
    return CheckResult(m.name, True, len(places) if isinstance(places, list) else 1, f"{m.description}: ok ({said})")


def _descriptors(m: Mechanism, texts: dict, read, none: str):
    """(what ``read`` finds in the CUDA source, None), or ([], the failing result) where there is
    no source or nothing is found (``none`` says what is missing)."""
    cuda = texts.get("cuda", "")
    if not cuda:
        return [], CheckResult(m.name, False, 0, f"{m.description}: no CUDA source to inspect")
    found = read(cuda)
    if not found:
        return [], CheckResult(m.name, False, 0, f"{m.description}: MISSING ({none} in the CUDA source)")
    return found, None


def _swizzled(m: Mechanism, texts: dict[str, str]) -> CheckResult:
    modes, missing = _descriptors(m, texts, descriptor_swizzles, "no shared-memory descriptor")
    if missing:
        return missing
    bad = [x for x in modes if not x]
    named = ", ".join(f"{n} x {SWIZZLE_NAMES.get(x, f'mode {x}') if x is not None else 'not a constant'}"
                      for x, n in sorted(((x, modes.count(x)) for x in set(modes)), key=str))
    if bad:
        return CheckResult(m.name, False, len(modes) - len(bad),
                           f"{m.description}: MISSING ({len(bad)} of {len(modes)} descriptors unswizzled or with a "
                           f"mode that is not a constant: {named}. Allocate the operand tiles with "
                           "mma_shared_layout(..., SWIZZLE_128B_ATOM, ...))")
    return CheckResult(m.name, True, len(modes), f"{m.description}: found ({named})")


def _vector(m: Mechanism, texts: dict) -> CheckResult:
    """``vector_load_128``/``vector_store_128``: 128-bit accesses in the SASS (``m.pattern``), and,
    where there is PTX, for every tensor the launched code reads (writes): 128-bit loads (stores)
    of that tensor (``ptxflow.tensor_accesses``), not only of another one."""
    kind = "load" if m.name == "vector_load_128" else "store"
    sass = texts.get("sass", "")
    if not sass:
        return CheckResult(m.name, False, 0, f"{m.description}: no SASS to inspect")
    count = len(re.findall(m.pattern, sass, flags=re.M))
    ok, where = count >= m.min_count, [f"{count} in SASS"]
    if texts.get("ptx") or texts.get("ptx_module"):
        acc = tensor_accesses(texts)[kind]
        per, bad = [], []
        for name, a in acc.items():
            if a.wide():
                per.append(f"{name}: 128-bit {kind}s found ({a.wide()} of {a.total()})")
            elif a.total():
                widths = sorted({b for b in a.bits if b}, reverse=True)
                per.append(f"{name}: only {' and '.join(f'{b}-bit' for b in widths) or 'narrower'} {kind}s "
                           f"({a.total()})")
                bad.append(name)
            elif a.shared:
                per.append(f"{name}: its {a.shared} {kind}(s) use addresses computed from more than one tensor")
                bad.append(name)
        if per:
            where.append("per tensor in PTX: " + "; ".join(per))
        elif count:
            where.append(f"no global {kind} of the PTX could be traced to a tensor parameter")
        if bad:
            ok = False
            verb = "read with 128-bit loads" if kind == "load" else "written with 128-bit stores"
            where.append(f"every tensor the kernel {'reads' if kind == 'load' else 'writes'} must be {verb} "
                         f"(16 bytes per thread: 8 halves, 4 floats), {', '.join(bad)} is not")
    return CheckResult(m.name, ok, count, f"{m.description}: {'found' if ok else 'MISSING'} ({'; '.join(where)})")


def _barriers_uniform(m: Mechanism, texts: dict) -> CheckResult:
    """No CTA-wide barrier that only the threads of a branch on the thread index reach
    (``ptxflow.divergent_cta_barriers``)."""
    if not (texts.get("ptx") or texts.get("ptx_module")):
        return CheckResult(m.name, False, 0, f"{m.description}: no PTX to inspect")
    found, total, read = divergent_cta_barriers(texts)
    if not read:
        return CheckResult(m.name, True, 0, f"{m.description}: not checked (no PTX with its labels to follow)")
    if not found:
        return CheckResult(m.name, True, 0, f"{m.description}: ok ({total} bar.sync without a thread count; none "
                                            "reached by the threads of a branch on the thread index while the "
                                            "others wait for them)")
    f = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return CheckResult(m.name, False, len(found), (
        f"{m.description}: WILL HANG ON A GPU (`{f.barrier}` in {f.function or 'the kernel'}{more} waits for every "
        f"thread of the CTA, but only the threads of a branch on the thread index (`{f.branch}`) reach it, while the "
        f"others wait at `{f.waits}`: they never arrive, so the kernel hangs on a GPU. Synchronise only the threads "
        "of the branch, with a named barrier and their count: T.cuda.warpgroup_sync(id) for one warpgroup "
        "(bar.sync id, 128), T.ptx.bar.sync(id, threads) otherwise, id 1 to 15; keep T.cuda.cta_sync() where "
        "every thread reaches it)"))


_HGMMA = re.compile(r"\bHGMMA\.\S+")
_TNSP_B = re.compile(r"gdesc\[[^\]]*\]\S*\.tnspB\b")


def _b_mn_major(m: Mechanism, texts: dict) -> CheckResult:
    """Every wgmma reads its B operand as MN-major: ``.tnspB`` on the descriptor of each HGMMA
    (wgmma.mma_async's imm-trans-b = 1). A kernel whose B is stored K x N and read as K-major
    computes with the wrong elements of B, and only a GPU run would show it otherwise. Read in the
    SASS of the launched code (``sass_launched`` where the executed listing replaced ``sass``): a
    rule on every HGMMA is only stricter there, and the listing's text comes from the disassembler
    the rule was written against."""
    sass = texts.get("sass_launched") or texts.get("sass") or ""
    lines = [ln for ln in sass.splitlines() if _HGMMA.search(ln)]
    if not lines:
        return CheckResult(m.name, False, 0, f"{m.description}: MISSING (no HGMMA in the SASS)")
    k_major = [ln for ln in lines if not _TNSP_B.search(ln)]
    if k_major:
        return CheckResult(m.name, False, len(lines) - len(k_major), (
            f"{m.description}: MISSING ({len(k_major)} of {len(lines)} HGMMA read B as K-major, without .tnspB, "
            f"e.g. `{_HGMMA.search(k_major[0]).group(0)} ...`: this B is stored K x N, so a row of its tile runs "
            "along N; the wgmma must be told that B is MN-major, and its descriptor must describe an MN-major tile)"))
    return CheckResult(m.name, True, len(lines), f"{m.description}: found (all {len(lines)} HGMMA with .tnspB)")


SETMAXNREG_IGNORED = re.compile(r"[^\n]*'setmaxnreg' ignored[^\n]*")
SETMAXNREG_FIX = ("setmaxnreg works only when ptxas knows the kernel's register count at entry, i.e. when the "
                  "kernel declares its threads per CTA and one CTA per SM (__launch_bounds__(threads, 1)); in "
                  "TIRx, put T.attr({\"tirx.launch_bounds_min_blocks_per_sm\": 1}) at the top of the kernel body, "
                  "after T.device_entry()")


def _setmaxnreg(m: Mechanism, texts: dict) -> CheckResult:
    """``setmaxnreg*``: the instruction in the SASS, and no launched function whose setmaxnreg
    ptxas dropped: it says "'setmaxnreg' ignored" (C7508) for a kernel whose register count at
    entry it does not know, and emits no USETMAXREG for it. The warning names no function: a
    launched function with setmaxnreg in its PTX and no USETMAXREG in its SASS section is the one."""
    plain = dataclasses.replace(m, custom=None).check(texts)
    warning = SETMAXNREG_IGNORED.search(texts.get("ptxas_log") or "")
    if not warning:
        return plain
    sections = sass_functions(texts.get("sass") or "")
    with_it = functions_with(texts, "setmaxnreg")
    ignored = [n for n in with_it if not (n in sections and re.search(r"\bUSETMAXREG\b", sections[n]))]
    if with_it and not ignored:
        return plain                     # said of a function the plan does not launch
    said = " ".join(warning.group(0).replace("ptxas info    :", "").split())
    who = f" in {', '.join(ignored)}" if any(ignored) else ""
    return CheckResult(m.name, False, plain.count, f"{m.description}: IGNORED by ptxas{who} (\"{said}\"; "
                       f"{plain.count} in SASS): {SETMAXNREG_FIX}")


MECHANISMS = {m.name: m for m in [
    Mechanism("vector_load_128", "128-bit vector loads from global memory", "sass", r"\bLDG\.E\.128\b",
              custom=_vector),
    Mechanism("vector_store_128", "128-bit vector stores to global memory", "sass", r"\bSTG\.E\.128\b",
              custom=_vector),
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
    Mechanism("wgmma_desc_fields", "wgmma descriptors with the fields of the step's operand tiles (LBO, SBO, "
              "swizzle of each tile, read from the CUDA source)", "cuda", "", custom=_desc_fields),
    Mechanism("wgmma_epilogue_places", "an epilogue that stores each wgmma accumulator register at its element "
              "of the output (the index arithmetic of the CUDA source followed thread by thread, through the shared "
              "tile and its TMA stores where there are some)", "cuda", "",
              custom=_epilogue_places),
    Mechanism("wgmma_b_mn_major", "wgmma reading an MN-major B (every HGMMA's descriptor with .tnspB)", "sass", "",
              custom=_b_mn_major),
    Mechanism("named_barrier_arrive", "arrivals on a named barrier without waiting (bar.arrive: BAR.ARV id, "
              "count), the hand-over of a ping-pong", "sass", r"\bBAR\.ARV\s+(?:0x[1-9a-f][0-9a-f]*|R\d+),\s*0x[0-9a-f]+"),
    Mechanism("exp2_mufu", "exp2 on the special-function unit (MUFU.EX2)", "sass", r"\bMUFU\.EX2\b"),
    Mechanism("tcgen05_mma_tmem_a", "tcgen05.mma with its A operand in tensor memory (UTC*MMA tmem[...], gdesc[...])",
              "sass", r"\bUTC\w*MMA(?:\.\w+)*\s+tmem\["),
    Mechanism("tmem_load", "tensor memory to registers (tcgen05.ld: LDTM)", "sass", r"\bLDTM\b"),
    Mechanism("tmem_store", "registers to tensor memory (tcgen05.st: STTM)", "sass", r"\bSTTM\b"),
    Mechanism("tcgen05_mma", "Blackwell tensor-core MMA (UTC*MMA)", "sass", r"\bUTC\w*MMA\b"),
    Mechanism("tmem_alloc", "Tensor memory allocation (UTCATOMSWS)", "sass", r"\bUTCATOMSWS\b"),
    Mechanism("setmaxnreg", "register reallocation between warpgroups (USETMAXREG)", "sass", r"\bUSETMAXREG\b",
              custom=_setmaxnreg),
    Mechanism("setmaxnreg_inc", "registers raised for a warpgroup (setmaxnreg.inc: USETMAXREG.TRY_ALLOC)", "sass",
              r"\bUSETMAXREG\.TRY_ALLOC\b", custom=_setmaxnreg),
    Mechanism("setmaxnreg_dec", "registers given back by a warpgroup (setmaxnreg.dec: USETMAXREG.DEALLOC)", "sass",
              r"\bUSETMAXREG\.DEALLOC\b", custom=_setmaxnreg),
    Mechanism("cluster_barrier", "a barrier across the CTAs of a cluster (UCGABAR)", "sass", r"\bUCGABAR_(?:ARV|WAIT)\b"),
    Mechanism("tcgen05_mma_2cta", "a pair of CTAs issuing one MMA (tcgen05.mma.cta_group::2: UTC*MMA.2CTA)", "sass",
              r"\bUTC\w*MMA(?:\.\w+)*\.2CTA\b"),
    Mechanism("cta_barrier_uniform", "CTA-wide barriers reached by every thread (bar.sync without a thread count: "
              "__syncthreads, T.cuda.cta_sync)", "ptx", "", custom=_barriers_uniform),
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

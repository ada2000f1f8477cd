"""Mechanism checks: does the generated code use the hardware path the part is about?

A part's spec lists mechanism names; each name maps to an instruction pattern searched in code
the grader itself compiled from the kernel's CUDA source: the SASS of the cubin (comments in PTX
or CUDA cannot satisfy a check: SASS has none), or, where SASS cannot tell two things apart, the
PTX that NVRTC made from that source, with its comments removed. A check passes when the pattern
occurs at least ``min_count`` times.

Three checks read more than one listing (``Mechanism.check``):

- ``mbarrier_expect_tx``: a remote ``mbarrier.arrive.expect_tx`` (the book's 2-CTA cluster arms
  the leader's barrier through ``remote_view(0)``) assembles to ``SYNCS.ARRIVE.TRANS64.RED`` with
  a byte-count register, and so does an arrive that ptxas itself emits for a 2-CTA TMEM
  allocation (``tcgen05.alloc.cta_group::2``). So the PTX instruction counts, confirmed by an
  arrive with a transaction count in the SASS; with SASS alone only the forms no setup code
  produces count (see ``SYNCS_ARRIVE``).
- ``mma_smem_swizzled``: the swizzle mode of every tensor-core shared-memory descriptor, read from
  the descriptor-encoding calls of the CUDA source (their last argument is the mode).
- ``mbarrier_ring*``: how many mbarriers the kernel initialises (``mbarrier.init`` in the PTX),
  which bounds the stages of its ring from below.

The wgmma accumulator-hazard check reads the same SASS.
"""
from __future__ import annotations

import dataclasses
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
        if self.where in ("ptx", "cuda"):
            text = strip_comments(text)
        count = len(re.findall(self.pattern, text, flags=re.M))
        ok = count >= self.min_count
        need = f", at least {self.min_count} needed" if self.min_count > 1 and not ok else ""
        return CheckResult(self.name, ok, count,
                           f"{self.description}: {'found' if ok else 'MISSING'} ({count} in {self.where.upper()}{need})")


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
        count = len(PTX_EXPECT_TX.findall(strip_comments(ptx)))
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
    Mechanism("mbarrier_ring", "a ring of at least two stages: at least 4 mbarriers initialised (mbarrier.init: "
              "a full and an empty barrier per stage)", "ptx", PTX_MBARRIER_INIT.pattern, min_count=4),
    Mechanism("mbarrier_ring_ws", "a ring of at least two stages and an accumulator hand-over: at least 6 "
              "mbarriers initialised (mbarrier.init: full and empty per stage, accumulator full and empty)",
              "ptx", PTX_MBARRIER_INIT.pattern, min_count=6),
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

"""Mechanism checks: does the generated code use the hardware path the part is about?

A part's spec lists mechanism names; each name maps to an instruction pattern searched in the
SASS of the cubin the grader itself compiled from the kernel's CUDA source (comments in PTX or
CUDA cannot satisfy a check: SASS has none). A check passes when the pattern occurs at least
``min_count`` times. The wgmma accumulator-hazard check reads the same SASS.
"""
from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Mechanism:
    name: str
    description: str
    where: str          # "ptx", "cuda" or "sass"
    pattern: str
    min_count: int = 1


MECHANISMS = {m.name: m for m in [
    Mechanism("vector_load_128", "128-bit vector loads from global memory", "sass", r"\bLDG\.E\.128\b"),
    Mechanism("vector_store_128", "128-bit vector stores to global memory", "sass", r"\bSTG\.E\.128\b"),
    Mechanism("tma_load", "TMA tensor loads (UTMALDG)", "sass", r"\bUTMALDG\b"),
    Mechanism("tma_store", "TMA tensor stores (UTMASTG)", "sass", r"\bUTMASTG\b"),
    Mechanism("tma_multicast", "TMA loads multicast to a cluster (UTMALDG...MULTICAST)", "sass",
              r"\bUTMALDG\S*MULTICAST"),
    Mechanism("mbarrier_expect_tx", "mbarrier arrive with a transaction count (expect_tx)", "sass",
              r"\bSYNCS\.ARRIVE\.TRANS64\s"),     # a plain arrive is SYNCS.ARRIVE.TRANS64.A1T0
    Mechanism("mbarrier_try_wait", "mbarrier waits with a phase (try_wait)", "sass",
              r"\bSYNCS\.PHASECHK\.TRANS64\.TRYWAIT\b"),
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


@dataclasses.dataclass
class CheckResult:
    name: str
    ok: bool
    count: int
    message: str


def check(name: str, texts: dict[str, str]) -> CheckResult:
    """Run mechanism ``name`` against ``texts`` ({"ptx": ..., "cuda": ..., "sass": ...})."""
    m = MECHANISMS[name]
    text = texts.get(m.where, "")
    if not text:
        return CheckResult(name, False, 0, f"{m.description}: no {m.where.upper()} to inspect")
    count = len(re.findall(m.pattern, text))
    ok = count >= m.min_count
    msg = f"{m.description}: {'found' if ok else 'MISSING'} ({count} in {m.where.upper()})"
    return CheckResult(name, ok, count, msg)


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

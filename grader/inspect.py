"""Mechanism checks: does the generated code use the hardware path the part is about?

A part's spec lists mechanism names; each name maps to a pattern searched in one kind of
generated text (PTX, CUDA source or SASS). A check passes when the pattern occurs at
least ``min_count`` times.
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
    Mechanism("vector_load_128", "128-bit vector loads from global memory", "ptx",
              r"\bld\.global(?:\.[a-z0-9_:]+)*\.v4\.(?:b32|u32|s32|f32)\b|\bld\.global(?:\.[a-z0-9_:]+)*\.v2\.(?:b64|u64|s64|f64)\b"),
    Mechanism("vector_store_128", "128-bit vector stores to global memory", "ptx",
              r"\bst\.global(?:\.[a-z0-9_:]+)*\.v4\.(?:b32|u32|s32|f32)\b|\bst\.global(?:\.[a-z0-9_:]+)*\.v2\.(?:b64|u64|s64|f64)\b"),
    Mechanism("tma_load", "TMA tensor loads (cp.async.bulk.tensor, global to shared)", "ptx",
              r"cp\.async\.bulk\.tensor\.[1-5]d\.shared::cluster\.global"),
    Mechanism("tma_store", "TMA tensor stores (cp.async.bulk.tensor, shared to global)", "ptx",
              r"cp\.async\.bulk\.tensor\.[1-5]d\.global\.shared::cta"),
    Mechanism("mbarrier_expect_tx", "mbarrier arrive with expected transaction bytes", "ptx",
              r"mbarrier\.arrive\.expect_tx"),
    Mechanism("wgmma", "Hopper warpgroup MMA (wgmma.mma_async)", "ptx", r"wgmma\.mma_async"),
    Mechanism("tcgen05_mma", "Blackwell tensor-core MMA (tcgen05.mma)", "ptx", r"tcgen05\.mma"),
    Mechanism("tmem_alloc", "Tensor memory allocation (tcgen05.alloc)", "ptx", r"tcgen05\.alloc"),
    Mechanism("setmaxnreg", "register reallocation between warpgroups (setmaxnreg)", "ptx", r"setmaxnreg"),
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

"""Build parts that check more than the mechanisms in the SASS: the tensor maps of Lab 2's TMA
kernels (and the stream's build at a ring of one stage), the shared-memory staging of Lab 3's transposes, and the wgmma accumulator hazard of
Labs 4 and 5. They hold no reference answer, so the student
edition ships this module and its check cells, ``check --public`` and ``compile`` all check these
parts (grader/edition/release.py)."""
from __future__ import annotations

import re

from .. import build, grading, hardware, inspect
from ..context import Context, Outcome

SWIZZLE_CODES = {0: "none", 1: "32B", 2: "64B", 3: "128B"}   # CUtensorMapSwizzle values
REQUIRED_SWIZZLE = 3        # Lab 2's build parts require CU_TENSOR_MAP_SWIZZLE_128B


def maps_of_plan(plan: dict) -> list[dict]:
    """The tensor maps of a launch plan (grader/devcode.py), as the lab shows them: the tensor's
    name, dims and box innermost first, strides in bytes, swizzle code."""
    names = [p["name"] for p in plan["signature"]]
    return [{"tensor": names[m["tensor"]], "rank": m["rank"], "global_dims": tuple(m["sizes"]),
             "global_strides": tuple(m["strides"]), "box_dims": tuple(m["box"]), "swizzle": m["swizzle"]}
            for m in plan["tensormaps"]]


def tensor_maps(prim_func, arch: str) -> list[dict]:
    """The tensor maps a kernel's host code encodes (``cuTensorMapEncodeTiled`` calls), read from
    the lowered host TIR: the same reading the grader makes of every submitted kernel."""
    from .. import devcode
    host, device = devcode.lower(prim_func, arch)
    return maps_of_plan(devcode.plan(prim_func, host, device))


def swizzle_check(name: str, art) -> tuple[bool, str, dict]:
    """Every tensor map of the kernel's launch plan (the descriptors the harness would encode)
    uses the 128-byte swizzle (the lesson of Lab 2)."""
    maps = maps_of_plan(art.plan)
    meas = {"tensor_maps": maps}
    if not maps:
        return False, "no tensor map in the host code: the kernel uses no TMA", meas
    text = "; ".join(f"{m['tensor']}: dims {m['global_dims']}, box {m['box_dims']}, "
                     f"swizzle {SWIZZLE_CODES.get(m['swizzle'], m['swizzle'])}" for m in maps)
    bad = [m["tensor"] for m in maps if m["swizzle"] != REQUIRED_SWIZZLE]
    if bad:
        return False, (f"tensor maps: {text}; MISSING the 128B swizzle on {', '.join(bad)} (allocate the SMEM "
                       "tile with mma_shared_layout(..., SWIZZLE_128B_ATOM, ...))"), meas
    return True, f"tensor maps: {text}", meas


def tma_build(module, ctx: Context) -> Outcome:
    """Lab 2: compile-only mechanism checks, then the swizzle of every tensor map of the plan."""
    return grading.build_part(module, ctx, swizzle_check)


# The stream of part e is also built with a ring of one stage, the shallowest depth of its
# correctness cases (grader/specs/lab2_tma.toml, problem "affine_ring"): a ring written for one
# depth shows here, without a GPU.
RING_DEPTH_ALSO_BUILT = 1


def tma_stream_build(module, ctx: Context) -> Outcome:
    """Lab 2 part e: part d's checks at the build shape, and the stream builds (for the same
    arch) with a ring of ``RING_DEPTH_ALSO_BUILT`` stage(s) as well."""
    p = ctx.part.params

    def also_at_one_stage(name: str, art) -> tuple[bool, str, dict]:
        ok, msg, meas = swizzle_check(name, art)
        depth = RING_DEPTH_ALSO_BUILT
        try:
            build.compile_only(grading.student(module, name)(M=p["M"], N=p["N"], stages=depth), art.arch)
        except build.BuildError as e:
            if grading.machine_failed(e):
                raise
            return False, (f"{msg}; MISSING: with stages={depth} the stream does not build "
                           f"({grading.explain_build_error(e)[:600]}): the ring must work at every depth"), meas
        return ok, f"{msg}; builds with stages={depth} too", meas
    return grading.build_part(module, ctx, also_at_one_stage)


_SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(?:\.[\w.]*)?[\s;]")


def staged_transpose(name: str, art) -> tuple[bool, str, dict]:
    """Lab 3: the tile goes through shared memory (STS and LDS instructions in the SASS of the
    launched code), and the swizzled kernel computes an XOR of its addresses (an ``xor``
    instruction in the PTX of the launched code, which ptxas folds into LOP3 with other logic).
    Instructions only: words in comments, strings or unlaunched entries do not count (static:
    inspect.STATIC)."""
    texts = inspect.launched_texts(art)
    ops = _SASS_OPCODE.findall(texts["sass"])
    xors = [i for i in inspect.ptx_instructions(texts["ptx"]) if re.match(r"(?:@!?%?\w+\s+)?xor\.b\d+\s", i)]
    found = {"STS": ops.count("STS"), "LDS": ops.count("LDS"), "xor": len(xors)}
    problems = []
    if not (found["STS"] and found["LDS"]):
        problems.append(f"MISSING: the tile is not staged in shared memory ({found['STS']} STS and {found['LDS']} "
                        "LDS in the SASS of the launched kernel; both needed)")
    if name.endswith("swizzled") and not found["xor"]:
        problems.append("MISSING: no XOR in the swizzled kernel (no xor instruction in the PTX of the launched code)")
    ok_msg = f"staged in shared memory ({found['STS']} STS, {found['LDS']} LDS)" + (
        f" with an XOR swizzle ({found['xor']} xor)" if name.endswith("swizzled") else "")
    return not problems, "; ".join(problems) or ok_msg, found


def transpose_build(module, ctx: Context) -> Outcome:
    """Lab 3: both transposes compile with their mechanisms, stage the tile in shared memory, and
    the swizzled one computes an XOR (each kernel once)."""
    return grading.build_part(module, ctx, staged_transpose)


# ---------------------------------------------------------------- Labs 4 and 5: sass_hazard

def _not_implemented(e: Exception) -> bool:
    return isinstance(e, NotImplementedError) or "is not implemented yet" in str(e)


def _builder(module, name: str, persistent: set, arch: str):
    """The student's builder ``name``; a persistent one is given the SM count of the arch's
    reference GPU (132 CTAs for sm_90a), as the course grader gives it."""
    fn = grading.student(module, name)
    if name not in persistent:
        return fn
    num_sms = hardware.SPECS[hardware.TRACK_DEFAULT[arch]].sm_count
    return lambda *shape: fn(*shape, num_sms=num_sms)


def accumulator_hazard(module, ctx: Context) -> Outcome:
    """Labs 4 and 5, ``sass_hazard``: the SASS of the launched code of each Hopper kernel the part
    names (compiled, no GPU) scanned for a wgmma accumulator read before its wait
    (``inspect.accumulator_hazards``). A kernel without an early read earns its share of the
    points; one kernel with an early read costs all of them (ptxas adds a missing wait by itself
    in some kernels and not in others, so one clean kernel says little about the next). Builders
    named in ``persistent`` are compiled for the arch's reference GPU (132 CTAs for sm_90a)."""
    p = ctx.part.params
    persistent = set(p.get("persistent", ()))
    shares, lines, meas, todo = [], [], {}, []
    for name, shape in zip(p["builders"], p["shapes"]):
        try:
            kernel = _builder(module, name, persistent, p["arch"])(*shape)
            art = build.compile_only(kernel, p["arch"], want_sass=True)
        except build.BuildError as e:
            shares.append(0.0)
            if _not_implemented(e):
                todo.append(f"{name}: {str(e).splitlines()[0]}")
                lines.append(f"{name}: not implemented")
            else:
                lines.append(f"{name}: does not build: {grading.explain_build_error(e)[:700]}")
            continue
        except Exception as e:  # noqa: BLE001 - a todo() left in one kernel; anything else is raised
            if not _not_implemented(e):
                raise
            shares.append(0.0)
            todo.append(f"{name}: {str(e).splitlines()[0]}")
            lines.append(f"{name}: not implemented")
            continue
        if not art.sass:
            raise RuntimeError("no SASS: cuobjdump was not found (install nvidia-cuda-cuobjdump)")
        ok, msg, m = inspect.accumulator_hazards(inspect.launched_texts(art)["sass"])
        shares.append(1.0 if ok else 0.0)
        meas[name] = dict(m, evidence=inspect.STATIC)
        lines.append(f"{name} {'x'.join(map(str, shape))}: {msg}")
    if len(todo) == len(shares):
        raise NotImplementedError(todo[0])
    early = [line for line, name in zip(lines, p["builders"]) if meas.get(name, {}).get("early_reads")]
    if early:
        return Outcome(0.0, "accumulator hazard: " + " | ".join(early) + " | all kernels: " + " | ".join(lines),
                       meas)
    return Outcome(sum(shares) / len(shares), " | ".join(lines), meas)

"""Build parts that check more than the mechanisms in the SASS: the tensor maps of Lab 2's TMA
kernels and the CUDA source of Lab 3's transposes. They hold no reference answer, so the student
edition ships this module and its check cells, ``check --public`` and ``compile`` all check these
parts (grader/release.py)."""
from __future__ import annotations

from .. import build
from ..context import Context, Outcome
from . import common

SWIZZLE_CODES = {0: "none", 1: "32B", 2: "64B", 3: "128B"}   # CUtensorMapSwizzle values
REQUIRED_SWIZZLE = 3        # Lab 2's build parts require CU_TENSOR_MAP_SWIZZLE_128B


def tensor_maps(prim_func, arch: str) -> list[dict]:
    """The tensor maps a kernel's host code encodes (``cuTensorMapEncodeTiled`` calls), read from
    the lowered host TIR: dims and box innermost first, strides in bytes, swizzle code."""
    import tvm
    from tvm.target import Target
    build.configure_toolchain()
    tgt = build.target(arch)
    host = Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    with tgt:
        mod = tvm.tirx.transform.BindTarget(Target(tgt).with_host(host))(tvm.IRModule({"main": prim_func}))
        pipeline, _, _ = tvm.tirx.get_tir_pipeline("tirx")
        mod = pipeline(mod)
    calls = []

    def visit(node):
        if (isinstance(node, tvm.ir.Call) and len(node.args) > 4 and isinstance(node.args[0], tvm.tirx.StringImm)
                and node.args[0].value == "runtime.cuTensorMapEncodeTiled"):
            calls.append(node.args)

    for func in mod.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            tvm.tirx.stmt_functor.post_order_visit(func.body, visit)

    def val(a):
        return int(a.value) if hasattr(a, "value") else str(a)

    maps = []
    for args in calls:
        rank = val(args[3])
        i = 5
        dims = tuple(val(a) for a in args[i:i + rank]); i += rank
        strides = tuple(val(a) for a in args[i:i + rank - 1]); i += rank - 1
        box = tuple(val(a) for a in args[i:i + rank]); i += 2 * rank   # skip element strides
        swizzle = val(args[i + 1])
        name = str(args[1]).removesuffix("_tensormap")
        maps.append({"tensor": name, "rank": rank, "global_dims": dims, "global_strides": strides,
                     "box_dims": box, "swizzle": swizzle})
    return maps


def tma_build(module, ctx: Context) -> Outcome:
    """Lab 2: compile-only mechanism checks (common.build_part), then the swizzle of every tensor
    map the host code encodes: each must use the 128-byte swizzle (the lesson of the lab)."""
    out = common.build_part(module, ctx)
    p = ctx.part.params
    builder = common.student(module, p["builder"])
    try:
        maps = tensor_maps(builder(**common.builder_args(p)), p["archs"][0])
    except Exception:  # noqa: BLE001 - already reported by build_part when it does not lower
        return out
    out.measurements["tensor_maps"] = maps
    if not maps:
        return Outcome(0.0, out.message + " | no tensor map in the host code: the kernel uses no TMA",
                       out.measurements)
    text = "; ".join(f"{m['tensor']}: dims {m['global_dims']}, box {m['box_dims']}, "
                     f"swizzle {SWIZZLE_CODES.get(m['swizzle'], m['swizzle'])}" for m in maps)
    bad = [m for m in maps if m["swizzle"] != REQUIRED_SWIZZLE]
    if bad:
        return Outcome(0.0, out.message + f" | tensor maps: {text}; MISSING the 128B swizzle on "
                       + ", ".join(m["tensor"] for m in bad)
                       + " (allocate the SMEM tile with mma_shared_layout(..., SWIZZLE_128B_ATOM, ...))",
                       out.measurements)
    return Outcome(out.fraction, out.message + f" | tensor maps: {text}", out.measurements)


def _staged_transpose(name: str, cuda_source: str) -> list[str]:
    problems = []
    if "__shared__" not in cuda_source:
        problems.append("MISSING: no shared-memory buffer in the CUDA source")
    if name.endswith("swizzled") and "^" not in cuda_source:
        problems.append("MISSING: no XOR in the swizzled kernel's CUDA source")
    return problems


def transpose_build(module, ctx: Context) -> Outcome:
    """Lab 3: both transposes compile with their mechanisms (common.build_part, each kernel once),
    stage the tile in shared memory, and the swizzled one computes an XOR (its CUDA source)."""
    return common.build_part(module, ctx, source_checks=_staged_transpose)

"""A TIRx kernel as device code plus launch data: what the grader runs instead of a library.

A kernel built by ``tvm.compile`` is a host library: machine code that unpacks the arguments,
fills TMA descriptors and launches the CUDA kernels. Loading such a library runs its code, and
no inspection of an ELF file can make that safe. So the grader never loads one. Where a
submission's kernel is built (the sandboxed child, grader/child.py) this module lowers the
PrimFunc with the same TIRx pipeline as ``tvm.compile`` and writes down, as plain data:

- the CUDA source of the device module, compiled there to PTX with NVRTC;
- the launch plan, read from the host function TIRx generated: the kernel's signature (tensor
  parameters with shape and dtype, scalar parameters with dtype), and for each CUDA kernel it
  launches, its name, grid, block, cluster and dynamic shared memory, and its arguments, each
  a tensor's address (plus a constant byte offset), a scalar parameter, a constant, or a TMA
  descriptor described by its encode arguments (tensor, dtype, rank, sizes, strides, box,
  element strides, interleave, swizzle, L2 promotion, out-of-bounds fill).

Host code that does anything else (loops, conditions, arithmetic on run-time values, other
packed functions) is refused with a message: the course's kernels launch fixed grids on
fixed shapes. The trusted side (grader/launch.py) validates the plan, assembles the PTX itself
and launches the result through the CUDA driver; nothing the child wrote runs on its CPU.
"""
from __future__ import annotations

import json

PLAN_VERSION = 1
ENCODE_TILED = "runtime.cuTensorMapEncodeTiled"
SET_DEVICE = "__tvm_set_device"
TENSORMAP_ARGS_FIXED = 4            # interleave, swizzle, l2 promotion, oob fill


class HostCodeRefused(Exception):
    """The kernel's host function does something the grader cannot launch from plain data."""


def _ops():
    """TIR node classes (apache-tvm 0.26 keeps Call and Var in tvm.ir)."""
    import types

    import tvm
    from tvm import tirx
    names = ["IntImm", "FloatImm", "Evaluate", "SeqStmt", "Bind", "DeclBuffer", "AttrStmt", "AssertStmt",
             "IfThenElse", "For", "While", "stmt_functor"]
    ns = types.SimpleNamespace(**{n: getattr(tirx, n) for n in names})
    ns.Call, ns.Var = tvm.ir.Call, (tvm.ir.Var, tirx.Var)
    return ns


def lower(func, arch: str):
    """(host IRModule before finalization, device IRModules by target): ``tvm.tirx.build``'s steps
    1-5 for a CUDA target of ``arch``, without generating host code."""
    import tvm
    from tvm.tirx.build import split_host_device_mods
    from . import toolchain
    toolchain.configure_toolchain()
    tgt = toolchain.target(arch)
    with tgt:
        mod = tvm.IRModule({"main": func})
        host = "llvm" if tvm.runtime.enabled("llvm") else "c"
        mod = tvm.tirx.transform.BindTarget(tvm.target.Target(tgt).with_host(tvm.target.Target(host)))(mod)
        pipeline, _, finalize_device = tvm.tirx.get_tir_pipeline("tirx")
        mod = pipeline(mod)
        host_mod, device_mods = split_host_device_mods(mod)
        device_mods = {t: finalize_device()(m) for t, m in device_mods.items()}
    return host_mod, device_mods


def device_module(device_mods, arch: str, compiler=None):
    """The CUDA runtime module of the device code. A TVM built with CUDA compiles the source as
    it makes the module, through the global function ``tvm_callback_cuda_compile`` (to a cubin
    that nothing here uses); while the module is made that function is the course's NVRTC
    (toolchain.nvrtc_ptx), so the module holds the PTX (ptx_of) and the kernel is compiled once.
    A TVM without CUDA calls no compiler. ``compiler(code, arch)`` in place of NVRTC: the text
    the module keeps as its PTX (``_COMPILED_APART``: none, the PTX is made elsewhere)."""
    import tvm_ffi
    from tvm.tirx.build import codegen_build
    from . import toolchain
    name = "tvm_callback_cuda_compile"
    tvm_default = tvm_ffi.get_global_func(name, allow_missing=True)
    compiler = compiler or toolchain.nvrtc_ptx
    tvm_ffi.register_global_func(name, lambda code, *rest: compiler(code, arch).encode(), override=True)
    try:
        with toolchain.target(arch):
            mods = [codegen_build(m, t) for t, m in device_mods.items() if len(m.functions)]
    finally:
        if tvm_default is not None:
            tvm_ffi.register_global_func(name, tvm_default, override=True)
    if len(mods) != 1:
        raise HostCodeRefused(f"the kernel has {len(mods)} device modules; the grader launches one CUDA module")
    return mods[0]


def ptx_of(module) -> str | None:
    """The PTX TVM made itself, when it made PTX (not a cubin)."""
    try:
        text = module.inspect_source("ptx")
    except Exception:  # noqa: BLE001 - no PTX kept: compile the source instead
        return None
    return text if ".entry" in text and ".version" in text and "__global__" not in text else None


# ---------------------------------------------------------------- the plan

def _signature(func) -> list[dict]:
    """The PrimFunc's parameters: tensors (shape, dtype) and scalars (dtype)."""
    out = []
    for p in func.params:
        kind = type(p.ty).__name__
        if kind == "PrimType":
            out.append({"name": p.name, "kind": "scalar", "dtype": str(p.ty.dtype)})
            continue
        if kind != "BufferType":
            raise HostCodeRefused(f"parameter {p.name} is a {kind}; a kernel takes tensors and scalars")
        shape = []
        for s in p.shape:
            if not hasattr(s, "value"):
                raise HostCodeRefused(f"tensor {p.name} has a symbolic shape ({s}); the course's kernels take "
                                      "fixed shapes (build one kernel per shape)")
            shape.append(int(s.value))
        if len(p.strides) or not (hasattr(p.elem_offset, "value") and int(p.elem_offset.value) == 0):
            raise HostCodeRefused(f"tensor {p.name} declares strides or an offset; the grader passes compact tensors")
        out.append({"name": p.name, "kind": "tensor", "shape": shape, "dtype": str(p.dtype)})
    return out


class _Reader:
    """Reads the host function's statements into a plan, refusing what it does not know."""

    def __init__(self, signature: list[dict], device_funcs: dict):
        self.t = _ops()
        self.sig = signature
        self.devices = device_funcs
        self.env: dict = {}             # var -> bound expression (Bind, DeclBuffer data)
        self.maps: dict = {}            # tensormap var -> index in plan["tensormaps"]
        self.tensormaps: list[dict] = []
        self.launches: list[dict] = []

    # ---- expressions
    def _param_of(self, expr) -> int:
        """The index of the packed argument an expression reads (tvm_struct_get(args, i, ...))."""
        found = set()

        def visit(e):
            if isinstance(e, self.t.Call) and e.op.name == "tirx.tvm_struct_get" and len(e.args) >= 3:
                base = e.args[0]
                if isinstance(base, self.t.Var) and base.name == "args" and hasattr(e.args[1], "value"):
                    found.add(int(e.args[1].value))
        self.t.stmt_functor.post_order_visit(self.t.Evaluate(expr), visit)
        if len(found) != 1:
            raise HostCodeRefused(f"a launch argument computed in host code ({expr}): pass tensors, scalars or constants")
        return found.pop()

    def _resolve(self, e, depth=0):
        """Follow variables bound earlier and buffer data pointers to their definitions."""
        while depth < 50:
            if isinstance(e, self.t.Call) and e.op.name == "tirx.buffer_data" and e.args[0] in self.env:
                e = self.env[e.args[0]]
            elif isinstance(e, self.t.Var) and e in self.env:
                e = self.env[e]
            else:
                return e
            depth += 1
        return e

    def pointer(self, expr) -> dict:
        """A tensor's address plus a constant byte offset."""
        offset = 0
        e = self._resolve(expr)
        while isinstance(e, self.t.Call) and e.op.name in ("tirx.handle_add_byte_offset", "tirx.reinterpret"):
            if e.op.name == "tirx.handle_add_byte_offset":
                if not hasattr(e.args[1], "value"):
                    raise HostCodeRefused(f"a pointer offset computed in host code ({e.args[1]})")
                offset += int(e.args[1].value)
            e = self._resolve(e.args[0])
        is_data = (isinstance(e, self.t.Call) and e.op.name == "tirx.tvm_struct_get"
                   and [getattr(a, "value", None) for a in e.args[1:3]] == [0, 1])
        if not is_data:
            raise HostCodeRefused(f"a pointer argument that is not a tensor's data ({expr})")
        i = self._param_of(self._resolve(e.args[0]))
        if i >= len(self.sig) or self.sig[i]["kind"] != "tensor":
            raise HostCodeRefused(f"a pointer argument that is not a tensor parameter ({expr})")
        return {"tensor": i, "offset": offset}

    def value(self, expr, dtype: str) -> dict:
        """A launch argument of a non-pointer type: a constant or a scalar parameter."""
        e = self._resolve(expr)
        if isinstance(e, (self.t.IntImm, self.t.FloatImm)):
            return {"const": e.value, "dtype": dtype}
        if isinstance(expr, self.t.Var):
            i = self._param_of(e)
            if i < len(self.sig) and self.sig[i]["kind"] == "scalar" and self.sig[i]["dtype"] == dtype:
                return {"scalar": i, "dtype": dtype}
        raise HostCodeRefused(f"a launch argument computed in host code ({expr}): pass tensors, scalars or constants")

    def const_int(self, expr, what: str) -> int:
        import tvm
        e = tvm.arith.Analyzer().simplify(self._resolve(expr))
        if not isinstance(e, self.t.IntImm):
            raise HostCodeRefused(f"{what} is computed at run time ({expr}); the grader launches fixed launch data")
        return int(e.value)

    # ---- statements
    def stmt(self, s) -> None:
        t = self.t
        if isinstance(s, t.SeqStmt):
            for x in s.seq:
                self.stmt(x)
        elif isinstance(s, t.Bind):
            v = s.value
            if isinstance(v, t.Call) and v.op.name == "tirx.tvm_stack_alloca" and str(v.args[0].value) == "tensormap":
                self.maps[s.var] = None
            self.env[s.var] = v
        elif isinstance(s, t.DeclBuffer):
            self.env[s.buffer] = s.data
        elif isinstance(s, t.AttrStmt):
            self.stmt(s.body)
        elif isinstance(s, t.AssertStmt):
            pass                        # TVM's argument checks: the grader checks arguments itself
        elif isinstance(s, t.IfThenElse) and self._only_asserts(s):
            pass                        # "if strides given: assert compact"
        elif isinstance(s, t.Evaluate):
            self.evaluate(s.value)
        elif type(s).__name__ == "Return":
            pass
        else:
            raise HostCodeRefused(f"the kernel's host code has a {type(s).__name__} statement; the grader launches "
                                  "straight-line launch data only (no host loops or conditions)")

    def _only_asserts(self, s) -> bool:
        ok = [True]

        def visit(n):
            if isinstance(n, (self.t.Evaluate, self.t.Bind, self.t.For, self.t.While, self.t.DeclBuffer)):
                ok[0] = False
        self.t.stmt_functor.post_order_visit(s, visit)
        return ok[0]

    def evaluate(self, e) -> None:
        t = self.t
        if isinstance(e, (t.IntImm,)):
            return
        if not (isinstance(e, t.Call) and e.op.name == "tirx.tvm_call_packed"):
            raise HostCodeRefused(f"the kernel's host code evaluates {e}; the grader launches kernels only")
        name = str(e.args[0].value)
        args = list(e.args[1:])
        if name == SET_DEVICE:
            return
        if name == ENCODE_TILED:
            self.encode(args)
            return
        if name in self.devices:
            self.launch(name, args)
            return
        raise HostCodeRefused(f"the kernel's host code calls the packed function {name!r}; the grader launches "
                              f"CUDA kernels and builds TMA descriptors ({ENCODE_TILED}) only")

    def encode(self, args) -> None:
        var = args[0]
        if var not in self.maps or self.maps[var] is not None:
            raise HostCodeRefused("a TMA descriptor encoded into something other than a fresh descriptor")
        dtype = str(args[1].value)
        rank = self.const_int(args[2], "a TMA descriptor's rank")
        n = 4 + rank + (rank - 1) + rank + rank + TENSORMAP_ARGS_FIXED
        if not 1 <= rank <= 5 or len(args) != n:
            raise HostCodeRefused(f"a TMA descriptor with rank {rank} and {len(args)} encode arguments")
        ints = [self.const_int(a, "a TMA descriptor field") for a in args[4:]]
        d = {"dtype": dtype, "rank": rank, **self.pointer(args[3])}
        d["sizes"], ints = ints[:rank], ints[rank:]
        d["strides"], ints = ints[:rank - 1], ints[rank - 1:]
        d["box"], ints = ints[:rank], ints[rank:]
        d["element_strides"], ints = ints[:rank], ints[rank:]
        d["interleave"], d["swizzle"], d["l2_promotion"], d["oob_fill"] = ints
        self.maps[var] = len(self.tensormaps)
        self.tensormaps.append(d)

    def launch(self, name: str, args) -> None:
        func = self.devices[name]
        tags = [str(x) for x in func.attrs.get("tirx.kernel_launch_params", [])]
        params = list(func.params)
        if len(args) != len(params) + len(tags):
            raise HostCodeRefused(f"kernel {name}: {len(args)} launch arguments for {len(params)} parameters "
                                  f"and {len(tags)} launch values")
        kargs = []
        for p, a in zip(params, args[:len(params)]):
            kind = type(p.ty).__name__
            if kind == "PointerType" and "TensorMap" in str(p.ty):
                if a not in self.maps or self.maps[a] is None:
                    raise HostCodeRefused(f"kernel {name}: a TMA descriptor argument that was never encoded")
                kargs.append({"tensormap": self.maps[a]})
            elif kind == "PointerType":
                kargs.append(self.pointer(a))
            elif kind == "PrimType":
                kargs.append(self.value(a, str(p.ty.dtype)))
            else:
                raise HostCodeRefused(f"kernel {name}: a parameter of type {p.ty}")
        dims = {"grid": [1, 1, 1], "block": [1, 1, 1], "cluster": [1, 1, 1], "preferred_cluster": [1, 1, 1]}
        declared = [1, 1, 1]            # the grid as computed, 0 included (TVM launches 1 CTA for 0)
        smem = 0
        values = args[len(params):]
        for tag, v in zip(tags, values):
            if tag == "tirx.use_dyn_shared_memory":
                smem = self.const_int(v, f"kernel {name}'s dynamic shared memory")
            elif tag.startswith(("blockIdx.", "threadIdx.", "clusterCtaIdx.", "preferredClusterCtaIdx.")) and tag[-1] in "xyz":
                key = {"b": "grid", "t": "block", "c": "cluster", "p": "preferred_cluster"}[tag[0]]
                n = self.const_int(v, f"kernel {name}'s {tag} extent")
                dims[key]["xyz".index(tag[-1])] = max(1, n)
                if key == "grid":
                    declared["xyz".index(tag[-1])] = n
            else:
                raise HostCodeRefused(f"kernel {name} asks for a launch feature the grader does not provide ({tag})")
        self.launches.append({"name": name, "args": kargs, "shared_bytes": smem, "declared_grid": declared, **dims})


def plan(func, host_mod, device_mods) -> dict:
    """The launch plan of a lowered kernel (see the module's docstring)."""
    t = _ops()
    sig = _signature(func)
    devices = {}
    for m in device_mods.values():
        for gv, f in m.functions.items():
            devices[gv.name_hint] = f
    entry = [f for f in host_mod.functions.values() if f.attrs.get("tirx.is_entry_func", False)]
    if len(entry) != 1:
        raise HostCodeRefused(f"{len(entry)} host entry functions; a kernel has one")
    r = _Reader(sig, devices)
    r.stmt(entry[0].body)
    if not r.launches:
        raise HostCodeRefused("the kernel's host code launches no CUDA kernel")
    del t
    return {"version": PLAN_VERSION, "signature": sig, "tensormaps": r.tensormaps, "launches": r.launches}


def lowered(func, arch: str, later: bool = False) -> tuple:
    """(CUDA source, launch plan, PTX) of ``func`` for ``arch``: what the child exports, what a
    notebook's check cell launches, what a compile-only part of a PrimFunc inspects. With
    ``later``, the third element is a toolchain.Later whose ``result()`` is the PTX: the source
    is compiled by a worker process while this one goes on (a check cell's next shapes)."""
    from . import toolchain
    host_mod, device_mods = lower(func, arch)
    module = device_module(device_mods, arch, _compiled_apart if later else None)
    src = module.inspect_source()
    p = plan(func, host_mod, device_mods)
    if later:
        return src, p, toolchain.nvrtc_later(src, arch)
    return src, p, ptx_of(module) or toolchain.nvrtc_ptx(src, arch)


def _compiled_apart(code: str, arch: str) -> str:
    """What a TVM with CUDA keeps as the module's PTX when the PTX is made elsewhere: a comment
    (TVM takes text that starts with '/' for PTX, and loads it only when the module is called,
    which this module never is)."""
    return "// compiled apart from this module\n"


def export(func, arch: str, out_stem: str) -> dict:
    """Lower ``func`` for ``arch`` and write ``<out_stem>.json`` (plan, CUDA source) and
    ``<out_stem>.ptx`` (NVRTC's PTX of that source). Returns the file names."""
    src, p, ptx = lowered(func, arch)
    with open(out_stem + ".json", "w") as f:
        json.dump({"plan": p, "arch": arch, "cuda_source": src}, f)
    with open(out_stem + ".ptx", "w") as f:
        f.write(ptx)
    return {"json": out_stem + ".json", "ptx": out_stem + ".ptx"}

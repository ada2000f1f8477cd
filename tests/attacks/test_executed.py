"""Mechanisms proved by execution (grader/executed.py).

An instruction in the cubin proves nothing about what runs: it may sit in an entry the launch plan
never launches, in a branch never taken, or under a predicate that is never true. On a GPU of the
part's arch the grader counts executed instructions with the hardware's counters (Nsight Compute's
SourceCounters) and the checks read only what executed. The CPU tests here check the reading of
ncu's source page and that a listing of executed instructions leaves out what did not run; the GPU
tests attack the build part of Lab 1 with a dead branch and an unlaunched entry."""
import json
import os

import pytest

from grader import executed, grading, hardware, inputs, inspect, report, run, spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOLUTION = os.path.join(ROOT, "solutions", "lab1_roofline", "lab1_roofline.ipynb")

HEADER = ('"Address","Source","Instructions Executed","Thread Instructions Executed",'
          '"Predicated-On Thread Instructions Executed"')


def _page(kernels: dict[str, list[tuple[str, int, int]]]) -> str:
    """A source page in ncu's CSV form: per kernel, (SASS, warp instructions, predicated-on threads)."""
    lines = ["==PROF== Connected to process 1 (/usr/bin/python3)", "some output of the program"]
    for name, rows in kernels.items():
        lines += [f'"Kernel Name","{name}",', HEADER]
        for i, (sass, warps, on) in enumerate(rows):
            lines.append(f'"0x{0x7000 + 16 * i:x}","      {sass}","{warps}","{warps * 32}","{on}"')
    return "\n".join(lines) + "\n"


LIVE = [("LDG.E.U16.CONSTANT R2, desc[UR4][R4.64]", 64, 2048), ("STG.E.U16 desc[UR4][R6.64], R2", 64, 2048),
        ("EXIT", 64, 2048)]
DEAD = [("@P0 LDG.E.128.CONSTANT R8, desc[UR4][R4.64]", 64, 0),      # issued, predicate never true
        ("STG.E.128 desc[UR4][R6.64], R8", 0, 0)]                     # in a branch never taken


def test_the_source_page_is_read_per_kernel_and_launches_add_up():
    text = _page({"torch_kernel": [("FFMA R1, R2, R3, R4", 10, 320)], "scale_add_kernel": LIVE + DEAD})
    text += _page({"scale_add_kernel": LIVE + DEAD})                        # a second launch
    kernels = executed.parse_source_page(text)
    assert set(kernels) == {"torch_kernel", "scale_add_kernel"}
    rows = kernels["scale_add_kernel"]
    assert [r[0] for r in rows] == [r[0] for r in LIVE + DEAD]
    assert rows[0][2] == 2 * 2048 and rows[3] == (DEAD[0][0], 128, 0)


def test_instructions_that_did_not_execute_are_not_in_the_listing():
    listing, total, ran = executed.executed_listing({"scale_add_kernel": LIVE + DEAD})
    assert (total, ran) == (5, 3)
    assert "LDG.E.128" not in listing and "STG.E.128" not in listing
    static = "\n".join(f"        /*{16 * i:04x}*/ {s} ;" for i, (s, _, _) in enumerate(LIVE + DEAD))
    for name in ("vector_load_128", "vector_store_128"):
        assert inspect.check(name, {"sass": static}).ok            # the cubin holds them ...
        assert not inspect.check(name, {"sass": listing}).ok       # ... but they never ran


def test_a_page_without_the_executed_column_is_refused():
    text = '"Kernel Name","k",\n"Address","Source","Instructions Executed"\n"0x0","EXIT","1"\n'
    with pytest.raises(ValueError, match="Predicated-On"):
        executed.parse_source_page(text)


def test_without_ncu_the_evidence_is_static_and_says_why(monkeypatch):
    monkeypatch.setattr(executed, "ncu_path", lambda: None)
    res = executed.profile({"launches": [{"name": "k"}]}, b"", "", {})
    assert res.sass is None and "not installed" in res.why
    assert res.evidence.startswith("static (launched entries only; dead code not excluded)")


def test_every_build_part_that_a_correctness_run_proves_is_found():
    """Each build part's builders, for the archs the course has GPUs of, are run by a correctness
    part of the same lab (or the report says the part is static)."""
    found, missing = 0, []
    for lab in spec.lab_names():
        lab_spec = spec.load(lab)
        for part in lab_spec.parts:
            if part.kind != "build":
                continue
            names = part.params.get("builders") or [part.params["builder"]]
            for name in names if isinstance(names, list) else [names]:
                for arch in part.params["archs"]:
                    if grading.correctness_run(lab_spec, name, arch) is None:
                        missing.append(f"{lab}.{part.id}: {name} ({arch})")
                    else:
                        found += 1
    assert found >= 10, (found, missing)


# ---------------------------------------------------------------- on a GPU

DEAD_BRANCH = '''
THREADS = 256
VECS = 4
LANES = 8
TILE = THREADS * VECS * LANES


def build_scale_add(n):
    assert n % TILE == 0

    @T.prim_func
    def scale_add(x_ptr: T.handle, y_ptr: T.handle, out_ptr: T.handle, alpha: T.float32):
        X = T.match_buffer(x_ptr, (n,), "float16", align=16)
        Y = T.match_buffer(y_ptr, (n,), "float16", align=16)
        OUT = T.match_buffer(out_ptr, (n,), "float16", align=16)
        T.device_entry()
        cta = T.cta_id([n // TILE])
        tid = T.thread_id([THREADS])
        x_reg = T.alloc_local((VECS * LANES,), "float16")
        y_reg = T.alloc_local((VECS * LANES,), "float16")
        o_reg = T.alloc_local((VECS * LANES,), "float16")
        if alpha > T.float32(1.0e30):
            for v in T.unroll(VECS):
                i = T.meta_var(cta * TILE + (v * THREADS + tid) * LANES)
                x_reg.vstore([v * LANES], X.vload([i], dtype="float16x8"))
                y_reg.vstore([v * LANES], Y.vload([i], dtype="float16x8"))
            for j in T.unroll(VECS * LANES):
                o_reg[j] = T.Cast("float16", alpha * T.Cast("float32", x_reg[j]) + T.Cast("float32", y_reg[j]))
            for v in T.unroll(VECS):
                i = T.meta_var(cta * TILE + (v * THREADS + tid) * LANES)
                OUT.vstore([i], o_reg.vload([v * LANES], dtype="float16x8"))
        else:
            for e in T.serial(VECS * LANES):
                i = T.meta_var(cta * TILE + e * THREADS + tid)
                OUT[i] = T.Cast("float16", alpha * T.Cast("float32", X[i]) + T.Cast("float32", Y[i]))

    return scale_add
'''


def _with_builder(tmp_path, source: str) -> str:
    """The reference notebook with its build_scale_add cell replaced by ``source``."""
    with open(SOLUTION) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if "def build_scale_add" in src:
            cell["source"] = source
            break
    else:
        raise AssertionError("no build_scale_add cell")
    d = tmp_path / "student"
    d.mkdir()
    path = d / "lab1_roofline.ipynb"
    path.write_text(json.dumps(nb))
    return str(path)


def _b_build(nb):
    dev = hardware.detect()
    res = run.check_lab("lab1_roofline", nb, inputs.PUBLIC_SEED, dev, parts=["b_build", "b_correct"],
                        progress=lambda m: None)
    return {r.part: r for r in res}


def _counters_here() -> bool:
    return hardware.detect().present and executed.ncu_path() is not None and os.geteuid() == 0


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_the_reference_is_proved_by_execution(tmp_path):
    if not _counters_here():
        pytest.skip("needs a GPU, Nsight Compute and root for the counters")
    r = _b_build(SOLUTION)["b_build"]
    assert r.points == r.max_points, r.message
    assert "executed (hardware counters" in r.message, r.message


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_vector_accesses_in_a_branch_never_taken_do_not_count(tmp_path):
    if not _counters_here():
        pytest.skip("needs a GPU, Nsight Compute and root for the counters")
    res = _b_build(_with_builder(tmp_path, DEAD_BRANCH))
    assert res["b_correct"].verdict == report.PASSED, res["b_correct"].message    # the scalar path is right
    build = res["b_build"]
    arch = hardware.detect().track
    assert f"{arch}: compiled; executed (hardware counters" in build.message, build.message
    assert "MISSING" in build.message and "never executed" in build.message, build.message
    assert build.points == 0, build.message              # the static sm_100a half is not trusted either


# Forged device code for Lab 1, made by a module cell of the notebook: the child's export is
# replaced, and every kernel asked for is answered with the PTX NVRTC makes of ``source`` (in
# this test, for the GPU's arch) and a launch plan for that call's n that launches ``launched``.
def _forging_lab1(source: str, launched: str) -> str:
    from grader import build, toolchain
    arch = build.device_arch()
    ptx = toolchain.nvrtc_ptx(source, arch, reuse=False).replace(f".target {arch}", ".target __ARCH__")
    return ("import json, grader.devcode as _d\n"
            f"_PTX = {ptx!r}\n"
            "def _forged(func, arch, stem):\n"
            "    n = int(func.params[0].shape[0])\n"
            "    t = {'kind': 'tensor', 'shape': [n], 'dtype': 'float16'}\n"
            "    plan = {'version': 1, 'tensormaps': [], 'signature': [dict(t, name='x'), dict(t, name='y'),\n"
            "            dict(t, name='out'), {'name': 'alpha', 'kind': 'scalar', 'dtype': 'float32'}],\n"
            f"            'launches': [{{'name': {launched!r}, 'grid': [n // 256, 1, 1], 'block': [256, 1, 1],\n"
            "                          'cluster': [1, 1, 1], 'shared_bytes': 0, 'args': [{'tensor': 0}, {'tensor': 1},\n"
            "                          {'tensor': 2}, {'scalar': 3, 'dtype': 'float32'}]}]}\n"
            "    open(stem + '.ptx', 'w').write(_PTX.replace('__ARCH__', arch))\n"
            "    open(stem + '.json', 'w').write(json.dumps({'plan': plan, 'arch': arch, 'cuda_source': '// forged'}))\n"
            "    return {'json': stem + '.json', 'ptx': stem + '.ptx'}\n"
            "_d.export = _forged\n")


SCALAR_BODY = ("unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "  out[i] = __float2half(alpha * __half2float(x[i]) + __half2float(y[i]));\n")
SIGNATURE = "(const __half* x, const __half* y, __half* out, float alpha)"

# The launched entry does the work with 16-bit accesses; an entry nobody launches holds the 128-bit ones.
DECOY_ENTRY = ("#include <cuda_fp16.h>\n"
               f'extern "C" __global__ void scale_add{SIGNATURE} {{\n  {SCALAR_BODY}}}\n'
               f'extern "C" __global__ void decoy{SIGNATURE} {{\n'
               "  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "  ((uint4*)out)[i] = ((const uint4*)x)[i];\n}\n")


def _profiled_n(arch: str) -> int:
    part, prob, shape = grading.correctness_run(spec.load("lab1_roofline"), "build_scale_add", arch)
    return int(prob.builder_args(shape)[0])


# The 128-bit accesses in a branch never taken, and a trap at the one shape the grader profiles
# (the kernel's grid there): before, a profiled run that failed was read statically instead.
def _trap_at_profiled_shape(grid: int) -> str:
    return ("#include <cuda_fp16.h>\n"
            f'extern "C" __global__ void scale_add{SIGNATURE} {{\n'
            f"  if (gridDim.x == {grid}u) __trap();\n"
            "  if (alpha > 1.0e30f) {\n"
            "    unsigned int v = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    ((uint4*)out)[v] = ((const uint4*)x)[v];\n"
            "    return;\n  }\n"
            f"  {SCALAR_BODY}}}\n")


def _forged_notebook(tmp_path, cell: str) -> str:
    """The reference notebook with ``cell`` added as a module cell."""
    from test_attacks import _extra_cell
    d = tmp_path / "student"
    d.mkdir()
    with open(SOLUTION) as f:
        (d / "lab1_roofline.ipynb").write_text(f.read())
    return _extra_cell(str(d / "lab1_roofline.ipynb"), cell)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_a_decoy_entry_scores_nothing(tmp_path):
    if not _counters_here():
        pytest.skip("needs a GPU, Nsight Compute and root for the counters")
    nb = _forged_notebook(tmp_path, _forging_lab1(DECOY_ENTRY, "scale_add"))
    res = _b_build(nb)
    assert res["b_correct"].verdict == report.PASSED, res["b_correct"].message      # the launched entry works
    build = res["b_build"]
    assert build.points == 0 and "executed (hardware counters" in build.message, build.message
    assert "128-bit vector loads from global memory: MISSING" in build.message, build.message


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_a_kernel_that_fails_at_the_profiled_shape_scores_nothing(tmp_path):
    if not _counters_here():
        pytest.skip("needs a GPU, Nsight Compute and root for the counters")
    arch = hardware.detect().track
    nb = _forged_notebook(tmp_path, _forging_lab1(_trap_at_profiled_shape(_profiled_n(arch) // 256), "scale_add"))
    res = _b_build(nb)
    build = res["b_build"]
    assert build.points == 0, build.message
    assert "not shown to execute: the kernel failed in the profiled correctness run" in build.message, build.message
    correct = res["b_correct"]      # the trap fires on the correctness run's first case too: a CUDA error, named
    assert correct.points < correct.max_points, correct.message
    assert "own class" not in correct.message, correct.message


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_a_kernel_with_module_state_scores_nothing(tmp_path):
    if not hardware.detect().present:
        pytest.skip("needs a GPU")
    counter = DECOY_ENTRY.split('extern "C" __global__ void decoy')[0].replace(
        'extern "C"', '__device__ unsigned int launches;\nextern "C"').replace(
        "  out[i] =", "  if (atomicAdd(&launches, 1u) >= 2u * gridDim.x * blockDim.x) return;\n  out[i] =")
    nb = _forged_notebook(tmp_path, _forging_lab1(counter, "scale_add"))
    res = run.check_lab("lab1_roofline", nb, inputs.PUBLIC_SEED, hardware.detect(),
                        parts=["b_build", "b_correct", "b_speed"], progress=lambda m: None)
    for r in res:           # the grader's refusal; its text is shown where no hidden case is graded
        assert r.points == 0, (r.part, r.message)
        assert ("module-scope global memory (launches" in r.message if r.part == "b_build"
                else "raised BuildError" in r.message), (r.part, r.message)

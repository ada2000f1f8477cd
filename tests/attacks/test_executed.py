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

"""Attacks on the grader, one test per class: each edits the untouched student notebook (or the
reference) the way a student who wants points without the work would, grades it exactly as
`python -m grader check` does, and asserts that the attacked part gets nothing (or an error
verdict) and that the grader stays whole. Each test can fail: it asserts on the score the
attack aims at, and the control tests show that an honest answer in the same place scores."""
import json
import os
import subprocess
import sys
import time

import pytest

from grader import artifact, build, hardware, inputs, inspect, report, run, sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDENT = os.path.join(ROOT, "assignments", "lab1_roofline", "lab1_roofline.ipynb")
SOLUTION = os.path.join(ROOT, "solutions", "lab1_roofline", "lab1_roofline.ipynb")
TODO = 'todo("a_flops")'


def _notebook(tmp_path, body, base=STUDENT, marker=TODO, name="lab1_roofline.ipynb"):
    """The notebook ``base`` with the a_flops answer replaced by ``body`` (indented into op_flops),
    and extra module cells appended where ``body`` starts with '#CELL'."""
    with open(base) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if marker in src:
            cell["source"] = src.replace(marker, body.replace("\n", "\n    "))
            break
    else:
        raise AssertionError("marker not found")
    d = tmp_path / "student"
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(nb))
    return str(d / name)


def _extra_cell(nb_path, source):
    with open(nb_path) as f:
        nb = json.load(f)
    nb["cells"].insert(2, {"cell_type": "code", "metadata": {"tags": ["module"]}, "source": source,
                           "outputs": [], "execution_count": None})
    with open(nb_path, "w") as f:
        json.dump(nb, f)
    return nb_path


def _grade(nb, parts=("a_flops",), seed=inputs.PUBLIC_SEED):
    res = run.check_lab("lab1_roofline", nb, seed, hardware.detect(), parts=list(parts), progress=lambda m: None)
    return {r.part: r for r in res}


def _isolated() -> bool:
    """Root with mount namespaces: the child gets its own user and a filtered view of the files."""
    import shutil
    return (os.geteuid() == 0 and shutil.which("unshare") is not None
            and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0)


# ---------------------------------------------------------------- control

@pytest.mark.slow
def test_control_an_honest_answer_scores(tmp_path):
    honest = ('k = op["kind"]\n'
              'if k == "elementwise":\n    return op["n"] * op["flops_per_element"]\n'
              'if k == "reduction":\n    return op["rows"] * op["cols"]\n'
              'if k == "gemm":\n    return 2 * op["m"] * op["n"] * op["k"]\n'
              'f = 4 * op["batch"] * op["heads"] * op["seq"] ** 2 * op["head_dim"]\n'
              'return f / 2 if op["causal"] else f')
    r = _grade(_notebook(tmp_path, honest))["a_flops"]
    assert r.verdict == report.PASSED, r.message


# ---------------------------------------------------------------- forging the result

@pytest.mark.slow
def test_objects_that_equal_everything_get_nothing(tmp_path):
    body = "class Any:\n    def __eq__(self, o): return True\n    def __float__(self): return 0.0\nreturn Any()"
    r = _grade(_notebook(tmp_path, body))["a_flops"]
    assert r.points == 0 and "plain numbers" in r.message


@pytest.mark.slow
def test_patching_the_grader_or_builtins_from_a_cell_changes_nothing(tmp_path):
    nb = _notebook(tmp_path, "return -1")
    _extra_cell(nb, "import importlib, builtins, base64\n"
                    "c = importlib.import_module('grader.' + 'compare')\n"
                    "setattr(c, 'close_scalar', lambda *a, **k: True)\n"
                    "exec(base64.b64decode(b'aW1wb3J0IG1hdGg7IG1hdGguaXNjbG9zZSA9IGxhbWJkYSAqYSwgKiprOiBUcnVl'))\n"
                    "builtins.__dict__['abs'] = lambda x: 0\n")
    r = _grade(nb)["a_flops"]
    assert r.points == 0 and r.verdict == report.FAILED, r.message


@pytest.mark.slow
def test_expected_values_are_nowhere_in_reach(tmp_path):
    body = ("import gc, inspect, os\n"
            "for fr in inspect.stack():\n"
            "    for k, v in fr.frame.f_locals.items():\n"
            "        if k in ('expected', 'exp', 'cases'): return v\n"
            "for o in gc.get_objects():\n"
            "    if isinstance(o, dict) and 'expected' in o: return o['expected']\n"
            "for p in (os.getppid(), 1):\n"
            "    try: open(f'/proc/{p}/mem', 'rb').read(1)\n"
            "    except OSError: pass\n"
            "return -1")
    r = _grade(_notebook(tmp_path, body))["a_flops"]
    assert r.points == 0, r.message


@pytest.mark.slow
def test_a_process_that_outlives_the_grader_cannot_rewrite_the_report(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    report_path = out / "report.json"
    marker = tmp_path / "daemon-was-here"
    daemon = (f"import os, time, atexit, json\n"
              f"def forge():\n"
              f"    for path in ({str(report_path)!r}, {str(marker)!r}):\n"
              f"        try:\n"
              f"            open(path, 'w').write(json.dumps({{'points': 16}}))\n"
              f"        except OSError:\n"
              f"            pass\n"
              f"atexit.register(forge)\n"
              f"if os.fork() == 0:\n"
              f"    os.setsid()\n"
              f"    if os.fork() == 0:\n"
              f"        import ctypes\n"
              f"        ctypes.CDLL(None).prctl(15, b'forger-d41d8', 0, 0, 0)\n"
              f"        time.sleep(4)\n"
              f"        forge()\n"
              f"        os._exit(0)\n"
              f"    os._exit(0)\n")
    nb = _extra_cell(_notebook(tmp_path, "return -1"), daemon)
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops",
                        "--submission", nb, "--json", str(report_path)],
                       cwd=ROOT, env=dict(os.environ, GRADER_CPU_ONLY="1"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    first = report_path.read_text()
    time.sleep(6)                                   # the daemon would have written by now
    assert report_path.read_text() == first and json.loads(first)["points"] == 0
    assert not marker.exists() or not _isolated()   # as its own user it cannot write outside its scratch
    survivors = subprocess.run(["pgrep", "-x", "forger-d41d8"], capture_output=True, text=True).stdout.split()
    assert survivors == [], "a child process outlived the grader"


@pytest.mark.slow
def test_the_secret_seed_appears_in_no_output(tmp_path):
    body = ("import os, glob\n"
            "seen = dict(os.environ)\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try: seen[p] = open(p, 'rb').read().decode(errors='replace')\n"
            "    except OSError: pass\n"
            "print(seen)\n"
            "raise RuntimeError(repr(seen)[:3000])")
    nb = _notebook(tmp_path, body)
    rep = tmp_path / "r.json"
    secret = "918273645"
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops",
                        "--submission", nb, "--json", str(rep), "--gradescope", str(tmp_path / "g.json")],
                       cwd=ROOT, env=dict(os.environ, GRADER_CPU_ONLY="1", GRADER_SECRET_SEED=secret),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "RuntimeError" in rep.read_text()        # the attack ran and its message is in the report
    for text in (p.stdout, p.stderr, rep.read_text(), (tmp_path / "g.json").read_text()):
        assert secret not in text


@pytest.mark.slow
@pytest.mark.skipif(not _isolated(), reason="hiding files from the child needs root (a mount namespace)")
def test_reference_answers_and_solutions_are_out_of_reach(tmp_path):
    body = ("import importlib\n"
            "try:\n"
            "    return importlib.import_module('grader.labs.lab1_roofline').ref_flops(op)\n"
            "except Exception:\n"
            "    pass\n"
            f"open({os.path.join(ROOT, 'solutions', 'lab1_roofline', 'lab1_roofline.ipynb')!r}).read()\n"
            "return -1")
    r = _grade(_notebook(tmp_path, body))["a_flops"]
    assert r.points == 0 and "No such file" in r.message, r.message


# ---------------------------------------------------------------- bad input and resources

@pytest.mark.slow
@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe not utf-8", b'{"cells": [{"cell_type": "code", "source": 5}]}'])
def test_bad_notebooks_always_get_a_report(tmp_path, content):
    nb = tmp_path / "lab1_roofline.ipynb"
    nb.write_bytes(content)
    rep = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--submission", str(nb),
                        "--json", str(rep)], cwd=ROOT, env=dict(os.environ, GRADER_CPU_ONLY="1"),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    data = json.loads(rep.read_text())
    assert data["points"] == 0 and {r["verdict"] for r in data["results"]} <= {"error", "skipped"}


@pytest.mark.slow
def test_a_flood_of_output_stays_out_of_the_report(tmp_path):
    nb = _notebook(tmp_path, "import sys\nsys.stdout.write('x' * (64 << 20))\nreturn -1")
    notes = []
    res = run.check_lab("lab1_roofline", nb, inputs.PUBLIC_SEED, hardware.detect(), parts=["a_flops"],
                        progress=lambda m: None, notes=notes)
    assert res[0].points == 0
    assert len(json.dumps([r.to_dict() for r in res]) + json.dumps(notes)) < 200_000


@pytest.mark.slow
@pytest.mark.parametrize("body, words", [
    ("while True:\n    pass", "timed out"),
    ("raise SystemExit(0)", "SystemExit"),
    ("import os\nos._exit(3)", "exited with code 3"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "SIGSEGV"),
])
def test_loops_exits_and_crashes_cost_one_part(tmp_path, monkeypatch, body, words):
    import dataclasses

    from grader import spec
    lab = spec.load("lab1_roofline")
    short = dataclasses.replace(lab, parts=tuple(dataclasses.replace(p, timeout_s=8) if p.id == "a_flops" else p
                                                 for p in lab.parts))
    monkeypatch.setattr(spec, "load", lambda name: short)
    nb = _notebook(tmp_path, body, base=SOLUTION, marker='kind = op["kind"]')
    res = _grade(nb, parts=("a_flops", "a_bytes"))
    assert res["a_flops"].points == 0 and words in res["a_flops"].message, res["a_flops"].message
    assert res["a_bytes"].verdict == report.PASSED, res["a_bytes"].message   # a fresh child goes on


@pytest.mark.slow
def test_an_import_that_never_ends_costs_one_time_limit(tmp_path, monkeypatch):
    from grader import spec
    lab = spec.load("lab1_roofline")
    monkeypatch.setitem(lab.raw, "import_timeout_s", 6)
    monkeypatch.setattr(spec, "load", lambda name: lab)
    nb = _extra_cell(_notebook(tmp_path, "return -1"), "while True:\n    pass\n")
    start = time.monotonic()
    res = _grade(nb, parts=("a_flops", "a_bytes", "a_predict"))
    assert time.monotonic() - start < 30
    assert all(r.verdict == report.ERROR and "did not finish in 6 s" in r.message for r in res.values())


@pytest.mark.slow
def test_a_comment_or_a_syntax_error_costs_only_its_own_part(tmp_path):
    nb = _notebook(tmp_path, "# as torch.matmul counts FLOPs\nreturn -1", base=STUDENT)
    with open(nb) as f:
        data = json.load(f)
    for cell in data["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if 'todo("a_bytes")' in src:
            cell["source"] = "def op_bytes(op:\n"
    with open(SOLUTION) as f:
        sol = {c["metadata"].get("nbgrader", {}).get("grade_id"): c["source"] for c in json.load(f)["cells"]}
    for cell in data["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "a_predict":
            cell["source"] = sol["a_predict"]
    with open(nb, "w") as f:
        json.dump(data, f)
    notes = []
    res = {r.part: r for r in run.check_lab("lab1_roofline", nb, inputs.PUBLIC_SEED, hardware.detect(),
                                            parts=["a_flops", "a_bytes", "a_predict"], progress=lambda m: None,
                                            notes=notes)}
    assert res["a_flops"].verdict == report.FAILED          # a wrong answer, not a rejected lab
    assert "op_bytes" in res["a_bytes"].message and "syntax error" in " ".join(notes)
    assert any(n.startswith("cell ") and "(a_bytes)" in n for n in notes)
    assert "submission.py" not in json.dumps([r.to_dict() for r in res.values()]) + json.dumps(notes)
    assert "op_bytes" in res["a_predict"].message           # predict needs op_bytes: that part fails too
    assert not any("matmul" in n for n in notes)            # comments are not advice


# ---------------------------------------------------------------- kernels

def test_comments_cannot_satisfy_a_mechanism_check():
    src = ('extern "C" __global__ void k(const float* x, float* y) {\n'
           '  // ld.global.v4.u32 st.global.v4.u32 wgmma.mma_async cp.async.bulk.tensor LDG.E.128 HGMMA\n'
           '  asm volatile("// wgmma.mma_async.sync.aligned HGMMA.64x128x16 UTMALDG");\n'
           '  y[threadIdx.x] = x[threadIdx.x];\n}\n')
    art = build.compile_source(src, "sm_90a", want_sass=True)
    assert art.sass
    for c in inspect.check_all(["vector_load_128", "wgmma", "tma_load"], {"sass": art.sass}):
        assert not c.ok, c.message


def test_cuda_sources_may_not_include_files():
    for bad in ('#include "/proc/self/environ"\n', "#include </etc/passwd>\n", '#include "../secret.h"\n'):
        with pytest.raises(build.BuildError, match="includes"):
            build.check_source(bad + "__global__ void k() {}\n")
    build.check_source("#include <cuda_fp16.h>\n#include <cuda/std/cstdint>\n__global__ void k() {}\n")


def _shared_lib(tmp_path, code):
    c, so = tmp_path / "lib.c", tmp_path / "lib.so"
    c.write_text(code)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(c)], check=True)
    return str(so)


@pytest.mark.skipif(not all(map(__import__("shutil").which, ("gcc", "nm", "objdump", "readelf"))),
                    reason="needs gcc and binutils")
@pytest.mark.parametrize("code, why", [
    ('#include <stdlib.h>\nint __tvm_ffi_main(void) { return system("touch /tmp/x"); }\n', "outside TVM's runtime"),
    ('int __tvm_ffi_main(void) { long r; __asm__ volatile("syscall" : "=a"(r) : "a"(39)); return (int)r; }\n',
     "system-call"),
    ('const char* name = "testing.echo";\nint __tvm_ffi_main(void) { return name[0]; }\n', "packed functions"),
])
def test_kernel_libraries_that_could_run_host_code_are_rejected(tmp_path, code, why):
    so = _shared_lib(tmp_path, code)
    with pytest.raises(artifact.Rejected, match=why):
        artifact.vet(so, {"testing.echo", "__tvm_set_device"})


@pytest.mark.skipif(not __import__("shutil").which("gcc"), reason="needs gcc")
def test_a_plain_library_passes_the_vetting(tmp_path):
    so = _shared_lib(tmp_path, 'int __tvm_ffi_main(void) { return 0; }\n')
    assert artifact.vet(so, {"testing.echo"}) == ["__tvm_ffi_main"]


@pytest.mark.slow
def test_a_builder_that_returns_no_kernel_gets_nothing(tmp_path):
    """The kernel parts take a kernel library from the child, never a Python callable."""
    nb = _notebook(tmp_path, "return lambda *args: None", base=STUDENT, marker='todo("b_kernel")')
    r = _grade(nb, parts=("b_build",))["b_build"]
    assert r.points == 0, r.message


@pytest.mark.gpu
def test_torch_in_place_of_a_kernel_gets_nothing_on_the_gpu(tmp_path):
    """Patching the grader's build module from a cell (the old way to run torch instead of a
    kernel) has no effect: the grader's modules live in other processes."""
    cell = ("import importlib, torch\n"
            "b = importlib.import_module('grader.build')\n"
            "b.lower = lambda *a, **k: ((lambda x, y, out, alpha: out.copy_(alpha * x + y)), '')\n"
            "torch.cuda.Event.elapsed_time = lambda self, end: 1e-9\n")
    nb = _extra_cell(_notebook(tmp_path, "return 0"), cell)
    res = _grade(nb, parts=("b_correct", "b_speed"))
    assert all(r.points == 0 for r in res.values()), [r.message for r in res.values()]


def test_sandbox_level_is_what_the_machine_allows(tmp_path):
    m = tmp_path / "submission.py"
    m.write_text("# ---- cell 1\nimport os\n")
    s = sandbox.ChildSession(str(m))
    try:
        s.start(120)
        if _isolated():
            assert s.level.startswith(("mount namespace + own user", "own user", "rlimits only (no mount namespace")), s.level
        else:
            assert s.level == "rlimits"
    finally:
        s.close()
    assert s.scratch is None


@pytest.mark.slow
def test_a_grading_run_leaves_no_temporary_folders(tmp_path, monkeypatch):
    import tempfile
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    nb = _notebook(tmp_path, "return -1")
    res = _grade(nb, parts=("a_flops", "b_build"))
    assert res["a_flops"].verdict == report.FAILED, res["a_flops"].message      # it really ran
    assert os.listdir(scratch) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback concerns a grader running as root")
def test_without_mount_namespaces_the_child_still_runs_and_says_how(tmp_path, monkeypatch):
    def refuse(*a):
        raise sandbox.NamespaceUnavailable(1, "Operation not permitted")
    monkeypatch.setattr(sandbox, "_isolate_mounts", refuse)     # the forked child inherits this
    m = tmp_path / "submission.py"
    m.write_text("# ---- cell 1\ndef f():\n    return 7\n")
    s = sandbox.ChildSession(str(m))
    try:
        s.start(120)
        assert "no mount namespace" in s.level, s.level
        assert s.request({"op": "call", "name": "f", "args": []}, 30) == {"value": 7}
    finally:
        s.close()


@pytest.mark.slow
@pytest.mark.skipif(not _isolated(), reason="hiding files from the child needs root (a mount namespace)")
def test_other_students_notebooks_are_out_of_reach(tmp_path):
    """A class's submissions folder (what `grader batch` hides): copying a classmate's answer
    from there fails."""
    subs = tmp_path / "submissions"
    (subs / "alice").mkdir(parents=True)
    alice = subs / "alice" / "lab1_roofline.ipynb"
    alice.write_text(open(SOLUTION).read())
    body = ("import json\n"
            f"cells = json.load(open({str(alice)!r}))['cells']\n"
            "src = [''.join(c['source']) for c in cells if 'def op_flops' in ''.join(c['source'])][0]\n"
            "ns = {}\n"
            "exec(src, ns)\n"
            "return ns['op_flops'](op)")
    nb = _notebook(tmp_path, body)
    rep = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops",
                        "--submission", nb, "--json", str(rep), "--hide", str(subs)],
                       cwd=ROOT, env=dict(os.environ, GRADER_CPU_ONLY="1"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(rep.read_text())["results"][0]
    assert r["points"] == 0 and ("No such file" in r["message"] or "Permission denied" in r["message"]), r["message"]

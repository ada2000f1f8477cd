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

from grader import build, hardware, inputs, inspect, report, run, sandbox

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


def _grade(nb, parts=("a_flops",), seed=inputs.PUBLIC_SEED, public_only=False):
    """``public_only``: as a check cell grades, showing what the submission answered, raised or
    printed (a run with hidden cases shows none of it: grader/verdict.py)."""
    res = run.check_lab("lab1_roofline", nb, seed, hardware.detect(), parts=list(parts), progress=lambda m: None,
                        public_only=public_only)
    return {r.part: r for r in res}


def _isolated() -> bool:
    """Root with namespaces: the child gets its own user besides its own view of the files."""
    return os.geteuid() == 0 and sandbox.isolation_problem() is None


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
    r = _grade(_notebook(tmp_path, body), public_only=True)["a_flops"]
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
    assert not marker.exists()                      # the jail has no path to the grader's folders
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
def test_reference_answers_and_solutions_are_out_of_reach(tmp_path):
    body = ("import importlib\n"
            "try:\n"
            "    return importlib.import_module('grader.labs.lab1_roofline').ref_flops(op)\n"
            "except Exception:\n"
            "    pass\n"
            f"open({os.path.join(ROOT, 'solutions', 'lab1_roofline', 'lab1_roofline.ipynb')!r}).read()\n"
            "return -1")
    r = _grade(_notebook(tmp_path, body), public_only=True)["a_flops"]
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
def test_a_notebook_that_exits_while_its_cells_run_is_told_how(tmp_path):
    """A process that ends before it is ready (here: a module cell that exits) is reported with
    how it ended and what it printed, for each part, and the parts score nothing."""
    nb = _extra_cell(_notebook(tmp_path, "return 0", base=SOLUTION, marker='kind = op["kind"]'),
                     "import os\nprint('about to leave', flush=True)\nos._exit(7)\n")
    res = _grade(nb, parts=("a_flops",))
    msg = res["a_flops"].message
    assert res["a_flops"].points == 0
    assert "exited with code 7 before it was ready" in msg and "about to leave" in msg, msg


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
    assert res["a_bytes"].message.startswith("cell ") and "(a_bytes): SyntaxError at line 1" in res["a_bytes"].message
    assert "op_bytes() is not defined" in res["a_bytes"].message and "SyntaxError" in " ".join(notes)
    assert "child.py" not in json.dumps([r.to_dict() for r in res.values()])       # no grader frames
    assert any(n.startswith("cell ") and "(a_bytes)" in n for n in notes)
    assert "submission.py" not in json.dumps([r.to_dict() for r in res.values()]) + json.dumps(notes)
    # predict needs op_bytes: that part fails too (graded with hidden cases: by the exception's type)
    assert "raised NameError" in res["a_predict"].message, res["a_predict"].message
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


@pytest.mark.slow
def test_a_builder_that_returns_no_kernel_gets_nothing(tmp_path):
    """The kernel parts take PTX and a launch plan from the child, never a Python callable."""
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
        assert s.level == ("jail: namespaces, allow-listed files, own user" if os.geteuid() == 0 else
                           "jail: user namespace, allow-listed files"), s.level
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
    left = os.listdir(scratch)
    assert left in ([], [f"grader-private-{os.geteuid()}"]), left                 # the grader's lock folder
    for root, dirs, files in os.walk(scratch):                                   # holds locks only
        assert all(f.endswith(".lock") for f in files) and root.count(os.sep) - str(scratch).count(os.sep) <= 1, (root, dirs, files)


@pytest.mark.slow
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
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops", "--public",
                        "--submission", nb, "--json", str(rep), "--hide", str(subs)],
                       cwd=ROOT, env=dict(os.environ, GRADER_CPU_ONLY="1"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(rep.read_text())["results"][0]
    assert r["points"] == 0 and ("No such file" in r["message"] or "Permission denied" in r["message"]), r["message"]

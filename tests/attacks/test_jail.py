"""Attacks on the jailed grader (grader/sandbox.py, grader/jail.py): each test is an attack that
gave full marks or read the answer key before the jail, graded exactly as `python -m grader check`
does, and asserts that it gets nothing. They share the helpers of test_attacks.py."""
import json
import os
import subprocess
import sys
import time

import pytest
from test_attacks import ROOT, SOLUTION, _extra_cell, _grade, _notebook

from grader import build, hardware, inputs, report, sandbox


# ---------------------------------------------------------------- the jail (grader v3)
# Each test below is an attack that gave full marks or read the key before the jail: the child
# saw the whole machine but a list of hidden folders, shared /tmp with the grader, and handed
# over a shared library that the GPU harness loaded.

def _raise_found(paths, extra=""):
    """A body for op_flops: tries to read each path and raises with those it could read."""
    return ("import os\nfound = []\n"
            f"for p in {paths!r}:\n"
            "    try:\n"
            "        with open(p, 'rb') as f:\n"
            "            f.read(64)\n"
            "        found.append(p)\n"
            "    except OSError:\n"
            "        pass\n" + extra +
            "raise RuntimeError('readable: ' + repr(found))")


@pytest.mark.slow
def test_the_child_reads_nothing_of_the_course_but_what_it_is_given(tmp_path):
    """The answer key by every route: the solutions, the reference answers of the grader, the
    checkout's .git, another checkout of the course, a gradebook, the grader's home."""
    other = tmp_path / "other-checkout" / "solutions"
    other.mkdir(parents=True)
    (other / "lab1_roofline.ipynb").write_text("{}")
    gradebook = tmp_path / "course" / "gradebook.db"
    gradebook.parent.mkdir()
    gradebook.write_text("alice@example.edu")
    paths = [os.path.join(ROOT, "solutions", "lab1_roofline", "lab1_roofline.ipynb"),
             os.path.join(ROOT, "grader", "labs", "lab1_roofline.py"), os.path.join(ROOT, ".git", "HEAD"),
             os.path.join(ROOT, "README.md"), str(other / "lab1_roofline.ipynb"), str(gradebook),
             os.path.expanduser("~/.bashrc"), "/etc/shadow", "/etc/hostname"]
    git = ("import subprocess\n"
           "try:\n"
           f"    out = subprocess.run(['git', '-C', {ROOT!r}, 'show', 'HEAD:README.md'], capture_output=True).stdout\n"
           "    found += ['git show'] if out else []\n"
           "except OSError:\n"
           "    pass\n"
           "found += [d for d in os.listdir('/') if d not in ('bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'usr',\n"
           "          'etc', 'dev', 'proc', 'tmp', 'sandbox', 'course', 'opt') and not any(\n"
           "          p.startswith('/' + d + '/') for p in __import__('sys').path)]\n")
    r = _grade(_notebook(tmp_path, _raise_found(paths, git)), public_only=True)["a_flops"]
    assert "readable: []" in r.message, r.message


@pytest.mark.slow
def test_the_working_folder_is_not_in_the_jail(tmp_path, monkeypatch):
    """`cd classfolder && python -m grader check lab1_roofline --submission alice/...`: the working
    folder is sys.path[0], and the allow-list took every folder of sys.path: the child printed a
    classmate's solution. The allow-list now comes from the Python installation alone."""
    classfolder = tmp_path / "class"
    bob = classfolder / "bob" / "lab1_roofline.ipynb"
    bob.parent.mkdir(parents=True)
    bob.write_text(open(SOLUTION).read())
    os.chmod(bob, 0o644)
    monkeypatch.chdir(classfolder)
    monkeypatch.syspath_prepend(str(classfolder))
    r = _grade(_notebook(tmp_path, _raise_found([str(bob), str(classfolder / "bob")])), public_only=True)["a_flops"]
    assert "readable: []" in r.message, r.message


@pytest.mark.slow
def test_files_planted_in_tmp_and_shm_never_reach_the_grader(tmp_path):
    """A fake `grader` package in /tmp (the harness once ran with /tmp as its working folder),
    files in /dev/shm and lock folders: the child's /tmp and /dev/shm are its own."""
    tag = f"planted-{os.getpid()}-{time.monotonic_ns()}"
    body = ("import os\n"
            f"os.makedirs('/tmp/grader-{tag}/grader', exist_ok=True)\n"
            f"open('/tmp/grader-{tag}/grader/harness.py', 'w').write('raise SystemExit')\n"
            f"open('/dev/shm/{tag}', 'w').write('x')\n"
            f"os.makedirs('/tmp/grader-private-{tag}', exist_ok=True)\n"
            "return -1")
    r = _grade(_notebook(tmp_path, body), public_only=True)["a_flops"]
    assert "got -1" in r.message, r.message                     # the planting ran without an error
    for p in (f"/tmp/grader-{tag}", f"/dev/shm/{tag}", f"/tmp/grader-private-{tag}"):
        assert not os.path.exists(p), p


def test_trusted_processes_import_nothing_from_their_working_folder(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "grader" / "cli.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    p = subprocess.run(sandbox.trusted_command("cli", "--help"), cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=120)
    assert p.returncode == 0 and "usage" in p.stdout, p.stderr
    assert not marker.exists()


def _evil_library(tmp_path) -> bytes:
    """A shared library whose constructor would write a marker: what a forged kernel library did."""
    import shutil
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to make the forged library")
    marker = tmp_path / "constructor-ran"
    c = tmp_path / "evil.c"
    c.write_text("#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {\n"
                 f'  FILE* f = fopen("{marker}", "w"); if (f) {{ fputs("x", f); fclose(f); }}\n}}\n'
                 "int __tvm_ffi_main(void) { return 0; }\n")
    so = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(c)], check=True)
    return so.read_bytes()


def _forging_cell(files: dict[str, bytes], reply: dict) -> str:
    """A module cell that replaces the child's kernel export: it writes ``files`` (with __ARCH__
    replaced by the arch asked for) and answers ``reply`` (names of files in the scratch folder)
    whatever kernel is asked for."""
    import base64
    blobs = {k: base64.b64encode(v).decode() for k, v in files.items()}
    return ("import base64, os, grader.devcode as _d\n"
            f"_blobs = {blobs!r}\n"
            "def _forged(func, arch, stem):\n"
            "    d = os.path.dirname(stem)\n"
            "    for name, b in _blobs.items():\n"
            "        open(os.path.join(d, name), 'wb').write(base64.b64decode(b).replace(b'__ARCH__', arch.encode()))\n"
            f"    return {{k: os.path.join(d, v) for k, v in {reply!r}.items()}}\n"
            "_d.export = _forged\n")


@pytest.mark.slow
def test_a_forged_library_is_never_loaded(tmp_path):
    """The child hands over a shared library instead of PTX and a plan: the grader reads files
    as data only, so the build part errs and the library's constructor never runs."""
    so = _evil_library(tmp_path)
    nb = _extra_cell(_notebook(tmp_path, "return -1", base=SOLUTION, marker='kind = op["kind"]'),
                     _forging_cell({"k.so": so}, {"json": "k.so", "ptx": "k.so"}))
    r = _grade(nb, parts=("b_build",))["b_build"]
    assert r.points == 0 and r.verdict == report.ERROR, r.message
    assert not (tmp_path / "constructor-ran").exists()


_TRIVIAL_PTX = (".version 8.0\n.target __ARCH__\n.address_size 64\n"
                "// LDG.E.128 STG.E.128 ld.global.v4.u32 st.global.v4.u32\n"
                ".visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1, .param .u64 k_param_2,"
                " .param .f32 k_param_3)\n{\n ret;\n}\n")


def _trivial_plan(n=1048576):
    t = {"kind": "tensor", "shape": [n], "dtype": "float16"}
    return {"version": 1, "signature": [dict(t, name="x"), dict(t, name="y"), dict(t, name="out"),
                                        {"name": "alpha", "kind": "scalar", "dtype": "float32"}],
            "tensormaps": [], "launches": [{"name": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "cluster": [1, 1, 1],
                                            "shared_bytes": 0, "args": [{"tensor": 0, "offset": 0}, {"tensor": 1, "offset": 0},
                                                                        {"tensor": 2, "offset": 0},
                                                                        {"scalar": 3, "dtype": "float32"}]}]}


@pytest.mark.slow
def test_forged_device_code_cannot_satisfy_a_mechanism_check(tmp_path):
    """CUDA source that shows every mechanism, PTX that names them in comments, a kernel that
    does nothing: the checks read the SASS of the grader's own assembly of that PTX."""
    meta = json.dumps({"plan": _trivial_plan(), "arch": "__ARCH__",
                       "cuda_source": "// LDG.E.128 STG.E.128\n__global__ void k() { asm(\"ld.global.v4.u32\"); }\n"})
    files = {"k.json": meta.encode(), "k.ptx": _TRIVIAL_PTX.encode()}
    nb = _extra_cell(_notebook(tmp_path, "return -1", base=SOLUTION, marker='kind = op["kind"]'),
                     _forging_cell(files, {"json": "k.json", "ptx": "k.ptx"}))
    r = _grade(nb, parts=("b_build",))["b_build"]
    assert r.points == 0 and "MISSING" in r.message, r.message


@pytest.mark.slow
def test_include_tricks_read_nothing_outside_the_jail(tmp_path, monkeypatch):
    """#include spelled with comments, line splices and digraphs: CUDA text is compiled by NVRTC
    inside the student's jail, where the files it names do not exist."""
    import dataclasses

    from grader import spec
    lab = spec.load("lab1_roofline")
    slow = dataclasses.replace(lab, parts=tuple(dataclasses.replace(p, timeout_s=600) for p in lab.parts))
    monkeypatch.setattr(spec, "load", lambda name: slow)
    sol = os.path.join(ROOT, "solutions", "lab1_roofline", "lab1_roofline.ipynb")
    spellings = [f'# /* */ include "{sol}"', f'#inc\\\nlude "{sol}"', f'%:include "/proc/{os.getpid()}/environ"']
    body = ("from grader import toolchain\ng = globals()\n"
            "if 'reached' not in g:                  # tried at the first case only\n"
            "    g['reached'] = 0\n"
            f"    for inc in {spellings!r}:\n"
            "        try:\n"
            "            toolchain.nvrtc_ptx(inc + '\\n__global__ void k() {}\\n', 'sm_90a')\n"
            "            g['reached'] += 1\n"
            "        except Exception as e:\n"
            "            g['reached'] += 'cannot open source file' not in str(e)\n"
            "return -1 - 1000 * g['reached']")
    r = _grade(_notebook(tmp_path, body), parts=("a_flops",), public_only=True)["a_flops"]
    assert "got -1," in r.message, r.message


@pytest.mark.slow
def test_the_child_has_no_network(tmp_path):
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port, accepted = srv.getsockname()[1], []

    def serve():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not accepted:
            try:
                accepted.append(srv.accept())
            except (socket.timeout, OSError):
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    body = ("import socket\nfor host in ('127.0.0.1', 'localhost'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=3).sendall(b'answers')\n"
            "        return 1\n"
            "    except OSError:\n"
            "        pass\n"
            "return -1")
    try:
        r = _grade(_notebook(tmp_path, body), public_only=True)["a_flops"]
    finally:
        accepted.append(None) if not accepted else None
        t.join(5)
        srv.close()
    assert "got -1," in r.message and accepted == [None], r.message


def test_without_namespaces_grading_refuses_unless_told_not_to(tmp_path):
    """A container that maps only root (no user id for the child, no way to jail it): `check`
    stops with the missing feature and the fix; --unsafe-no-sandbox grades and says so per part."""
    import shutil
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "--map-root-user", "true"],
                                                          capture_output=True).returncode != 0:
        pytest.skip("cannot make a user namespace here to play the part of such a container")
    cmd = ["unshare", "--user", "--map-root-user", sys.executable, "-m", "grader", "check", "lab1_roofline",
           "--part", "a_flops", "--json", str(tmp_path / "r.json")]
    env = dict(os.environ, GRADER_CPU_ONLY="1", GRADER_SEED_KEY_FILE=str(tmp_path / "key"))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 3 and "namespaces" in p.stderr and "--unsafe-no-sandbox" in p.stderr, p.stderr
    assert not (tmp_path / "r.json").exists()
    p = subprocess.run(cmd + ["--unsafe-no-sandbox"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "r.json").read_text())["results"]
    assert res[0]["points"] == 2 and res[0]["measurements"]["sandbox"].startswith("NONE"), res


@pytest.mark.slow
def test_as_an_ordinary_user_the_child_is_jailed_in_a_user_namespace(tmp_path):
    """Graded by an ordinary user: the child still sees only the allow-list (it once rewrote
    grader/grading.py and ~/.bashrc of that user)."""
    import pwd
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    probe = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                            sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                            f"'import grader, torch, tvm; open({os.path.join(ROOT, 'README.md')!r})'], check=True)"],
                           cwd="/", capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    if probe.returncode != 0:
        pytest.skip("the interpreter or the checkout is not readable by an ordinary user on this machine")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    os.chmod(tmp_path, 0o755)
    nb = _notebook(tmp_path, _raise_found([os.path.join(ROOT, "README.md"), str(home)]))
    os.chmod(os.path.dirname(nb), 0o755)
    os.chmod(nb, 0o644)
    rep = home / "r.json"
    p = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                        sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops", "--public",
                        "--submission", nb, "--json", str(rep)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, HOME=str(home), PYTHONPATH=ROOT, GRADER_CPU_ONLY="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(rep.read_text())["results"][0]
    assert "readable: []" in r["message"] and r["measurements"]["sandbox"] == "jail: user namespace, allow-listed files"


def test_any_string_is_a_secret_seed_and_a_small_one_cannot_be_brute_forced(tmp_path, monkeypatch):
    """The secret seed is any string, derived by HMAC-SHA256 under a course key: a small integer's
    hidden cases cannot be reproduced by trying candidates without the key."""
    from grader.labs import lab1_roofline
    from grader import spec
    from grader.context import Context
    monkeypatch.setenv("GRADER_SEED_KEY_FILE", str(tmp_path / "seed.key"))
    seed = inputs.derive_secret("7")
    assert seed.bit_length() > 128 and inputs.derive_secret("correct horse") != seed
    assert oct(os.stat(tmp_path / "seed.key").st_mode & 0o777) == "0o600"
    lab = spec.load("lab1_roofline")
    ctx = Context(lab, lab.part("a_flops"), seed, hardware.detect())
    hidden = lab1_roofline.op_cases(ctx)[len(lab1_roofline.PUBLIC_OPS):]
    assert hidden

    def first_hidden(s):
        return lab1_roofline.op_cases(Context(lab, lab.part("a_flops"), s, hardware.detect()))[len(lab1_roofline.PUBLIC_OPS)]
    monkeypatch.setenv("GRADER_SEED_KEY_FILE", str(tmp_path / "attacker.key"))
    tried = [first_hidden(s) for s in range(2000)] + [first_hidden(inputs.derive_secret(str(s))) for s in range(200)]
    assert hidden[0] not in tried


@pytest.mark.slow
def test_a_word_as_the_secret_seed_grades(tmp_path):
    rep = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops", "--json", str(rep)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GRADER_CPU_ONLY="1", GRADER_SECRET_SEED="correct horse battery staple",
                                GRADER_SEED_KEY_FILE=str(tmp_path / "k")))
    assert p.returncode == 0, p.stderr
    data = json.loads(rep.read_text())
    assert data["results"][0]["points"] == 2 and data["seed"].startswith("secret"), data["seed"]


@pytest.mark.slow
def test_feedback_never_shows_a_hidden_case(tmp_path):
    """Right on the public cases, and on a hidden one it returns its input: the message names
    the hidden case by number only, so resubmitting cannot collect hidden inputs or answers."""
    from grader.labs import lab1_roofline
    honest = ('k = op["kind"]\n'
              f'if op not in {lab1_roofline.PUBLIC_OPS!r}:\n    return repr(op)\n'
              'if k == "elementwise":\n    return op["n"] * op["flops_per_element"]\n'
              'if k == "reduction":\n    return op["rows"] * op["cols"]\n'
              'if k == "gemm":\n    return 2 * op["m"] * op["n"] * op["k"]\n'
              'f = 4 * op["batch"] * op["heads"] * op["seq"] ** 2 * op["head_dim"]\n'
              'return f / 2 if op["causal"] else f')
    r = _grade(_notebook(tmp_path, honest), seed=123456789)["a_flops"]
    assert r.points < 2 and "hidden case #1" in r.message, r.message
    assert "kind" not in r.message and "expected" not in r.message, r.message
    pub = ('return -1')
    r = _grade(_notebook(tmp_path, pub), seed=123456789)["a_flops"]
    assert "'kind': 'elementwise'" in r.message and "expected" in r.message, r.message   # public: everything


@pytest.mark.gpu
def test_a_forged_library_gets_nothing_on_the_gpu(tmp_path):
    """On the GPU parts too, the harness loads no file of the child's as code: a library whose
    constructor would patch the harness gets 0 on every GPU part, and its constructor never runs."""
    so = _evil_library(tmp_path)
    meta = json.dumps({"plan": _trivial_plan(), "arch": build.device_arch(), "cuda_source": ""})
    files = {"k.so": so, "k.json": meta.encode()}
    nb = _extra_cell(_notebook(tmp_path, "return -1", base=SOLUTION, marker='kind = op["kind"]'),
                     _forging_cell(files, {"json": "k.json", "ptx": "k.so"}))
    res = _grade(nb, parts=("b_correct", "b_speed"))
    assert all(r.points == 0 for r in res.values()), [r.message for r in res.values()]
    assert not (tmp_path / "constructor-ran").exists()

"""The jail's allow-list and limits (grader/jail.py, grader/sandbox.py): the Python installation
is in wherever it lies, nothing else of the machine is (the working folder, the course key), and
the child can hold neither the machine's processes nor its disk nor a namespace of its own.

Most tests start one jailed child (:class:`sandbox.ChildSession`, exactly as grading does) on a
small module and call its functions; the venv tests grade the reference notebook with
``python -m grader check`` started from that venv's interpreter."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from grader import sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _need_jail():
    if os.geteuid() != 0:
        pytest.skip("runs the child as root does (a user id of its own): run the suite as root")
    problem = sandbox.isolation_problem()
    if problem:
        pytest.skip(f"no jail on this machine: {problem}")


def _start(tmp_path, source: str, limits=None, hide=()) -> sandbox.ChildSession:
    """A jailed child whose one cell is ``source``."""
    _need_jail()
    mod = tmp_path / "module" / "submission.py"
    mod.parent.mkdir(exist_ok=True)
    mod.write_text("# ---- cell 1\n" + textwrap.dedent(source))
    session = sandbox.ChildSession(str(mod), limits=limits, hide=list(hide))
    session.start(120)
    assert not session.cell_errors, session.cell_errors
    return session


def _call(session, name: str):
    reply = session.request({"op": "call", "name": name, "args": [], "kwargs": {}}, 120)
    assert "value" in reply, reply
    return reply["value"]


READABLE = """
def readable(paths):
    found = []
    for p in paths:
        try:
            with open(p, 'rb') as f:
                f.read(64)
            found.append(p)
        except OSError:
            pass
    return found
"""


# ---------------------------------------------------------------- 1. the allow-list: the installation only

def test_the_allow_list_takes_no_folder_of_sys_path_outside_the_installation(tmp_path, monkeypatch):
    """Started from a class folder (sys.path[0]), a script's folder or with PYTHONPATH at a home
    folder, `check` once bound those folders into the child (graded: test_jail.py,
    test_the_working_folder_is_not_in_the_jail)."""
    classfolder, script, home = tmp_path / "class", tmp_path / "scripts", tmp_path / "home"
    for d in (classfolder, script, home):
        d.mkdir()
    monkeypatch.chdir(classfolder)
    for d in (home, script, classfolder):
        monkeypatch.syspath_prepend(str(d))
    monkeypatch.setenv("HOME", str(home))
    dirs = sandbox.python_dirs()
    assert not [d for d in dirs if d.startswith(str(tmp_path))], dirs
    assert os.path.realpath(sys.prefix) in dirs and os.path.realpath(sys.base_prefix) in dirs, dirs
    import site
    assert all(any(os.path.realpath(s).startswith(d) for d in dirs)
               for s in site.getsitepackages() if os.path.isdir(s)), dirs


# ---------------------------------------------------------------- 2. the installation, wherever it lies

def _farm_venv(where) -> str:
    """A virtual environment at ``where`` made of links: its interpreter is this one's, its
    site-packages this one's (torch, TVM, the course), its prefix ``where``. Returns its python."""
    import site
    sites = [s for s in site.getsitepackages() if os.path.isdir(s)]
    if not sites:
        pytest.skip("this interpreter has no site-packages folder to link to")
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    os.makedirs(os.path.join(where, "bin"))
    os.makedirs(os.path.join(where, "lib", ver))
    os.symlink(os.path.realpath(sys.executable), os.path.join(where, "bin", "python"))
    os.symlink(os.path.realpath(sites[0]), os.path.join(where, "lib", ver, "site-packages"))
    with open(os.path.join(where, "pyvenv.cfg"), "w") as f:
        f.write(f"home = {os.path.dirname(os.path.realpath(sys.executable))}\n"
                "include-system-site-packages = false\n"
                f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    python = os.path.join(where, "bin", "python")
    out = subprocess.run([python, "-c", "import sys, torch; print(sys.prefix)"], capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.strip() != str(where):
        pytest.skip(f"could not make a linked virtual environment here: {out.stderr[-300:]}")
    return python


def _check_with(python, cwd, tmp_path, *extra):
    rep = tmp_path / "out" / "r.json"
    rep.parent.mkdir(exist_ok=True)
    env = dict(os.environ, GRADER_CPU_ONLY="1", GRADER_SEED_KEY_FILE=str(tmp_path / "key" / "seed.key"))
    env.pop("PYTHONPATH", None)
    p = subprocess.run([python, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops", "--json", str(rep),
                        *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(rep.read_text())["results"][0]


@pytest.mark.slow
def test_a_venv_inside_the_checkout_grades(tmp_path):
    """`/repo/.venv`: the probe once asked that the checkout's path be absent from the jail, which
    the venv's folder inside it makes present, and refused to grade (exit 3, "namespaces")."""
    _need_jail()
    repo = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "grader"), repo / "grader", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "solutions", "lab1_roofline"), repo / "solutions" / "lab1_roofline",
                    ignore=shutil.ignore_patterns("__pycache__", "*.png"))
    python = _farm_venv(repo / ".venv")
    r = _check_with(python, repo, tmp_path)
    assert r["points"] == r["max_points"] and r["measurements"]["sandbox"].startswith("jail"), r


@pytest.mark.slow
def test_a_venv_inside_the_submission_folder_grades(tmp_path):
    """The submission's folder is covered in the child's view; a venv inside it (a student
    grading their own work) was covered with it: 'jail: No such file or directory: .../python'."""
    _need_jail()
    sub = tmp_path / "alice"
    sub.mkdir()
    shutil.copy(os.path.join(ROOT, "solutions", "lab1_roofline", "lab1_roofline.ipynb"), sub)
    python = _farm_venv(sub / ".venv")
    r = _check_with(python, ROOT, tmp_path, "--submission", str(sub / "lab1_roofline.ipynb"))
    assert r["points"] == r["max_points"], r


def test_a_hidden_folder_above_an_allowed_one_leaves_it_visible(tmp_path, monkeypatch):
    """The mount order: a hidden folder that holds an allowed one is covered first, the allowed
    one shows through it; a hidden folder inside an allowed one is covered after it."""
    outer = tmp_path / "outer"
    (outer / "allowed").mkdir(parents=True)
    (outer / "allowed" / "seen.txt").write_text("x")
    (outer / "secret.txt").write_text("x")
    (outer / "allowed" / "inner").mkdir()
    (outer / "allowed" / "inner" / "secret.txt").write_text("x")
    for p in (tmp_path, outer, outer / "allowed", outer / "allowed" / "inner"):
        os.chmod(p, 0o755)
    real = sandbox.python_dirs
    monkeypatch.setattr(sandbox, "python_dirs", lambda: real() + [str(outer / "allowed")])
    s = _start(tmp_path, READABLE, hide=[str(outer), str(outer / "allowed" / "inner")])
    try:
        paths = [str(outer / "allowed" / "seen.txt"), str(outer / "secret.txt"),
                 str(outer / "allowed" / "inner" / "secret.txt")]
        reply = s.request({"op": "call", "name": "readable", "args": [paths], "kwargs": {}}, 120)
        assert reply.get("value") == [paths[0]], reply
    finally:
        s.close()


def test_a_jail_that_cannot_start_is_the_graders_failure_not_the_students(tmp_path, monkeypatch):
    """A jail that cannot be set up (exit 125 of jail.py) says so, with a type of its own; a
    child that fakes it (prints 'jail: ...' and exits 125) is the student's failure."""
    _need_jail()
    real = sandbox.jail_config

    def broken(*a, **k):
        cfg = real(*a, **k)
        cfg["argv"] = ["/nonexistent/python"] + cfg["argv"][1:]
        return cfg
    monkeypatch.setattr(sandbox, "jail_config", broken)
    with pytest.raises(sandbox.JailSetupFailed, match="the grader could not start the jail: .*nonexistent"):
        _start(tmp_path, "x = 1\n")
    monkeypatch.setattr(sandbox, "jail_config", real)
    with pytest.raises(sandbox.SandboxFailure) as e:
        _start(tmp_path, "import os, sys\nsys.stderr.write('jail: mount failed\\n')\nsys.stderr.flush()\nos._exit(125)\n")
    assert not isinstance(e.value, sandbox.JailSetupFailed), e.value


# ---------------------------------------------------------------- 3. the course key

def test_the_course_key_is_hidden_even_inside_an_allowed_folder(tmp_path, monkeypatch):
    """An ordinary user's child once read ~/.config/modern-gpu-kernels/seed.key (the home folder
    was allowed). Wherever the key lies, its folder is not in the child's view."""
    site = tmp_path / "site"
    key = site / "keys" / "seed.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(os.urandom(32))
    (site / "pkg.py").write_text("x = 1\n")
    for p in (tmp_path, site, key.parent):
        os.chmod(p, 0o755)
    os.chmod(key, 0o644)                          # a careless mode: the mounts must hide it anyway
    real = sandbox.python_dirs
    monkeypatch.setattr(sandbox, "python_dirs", lambda: real() + [str(site)])
    monkeypatch.setenv("GRADER_SEED_KEY_FILE", str(key))
    s = _start(tmp_path, READABLE)
    try:
        paths = [str(site / "pkg.py"), str(key)]
        reply = s.request({"op": "call", "name": "readable", "args": [paths], "kwargs": {}}, 120)
        assert reply.get("value") == [paths[0]], reply
    finally:
        s.close()


# ---------------------------------------------------------------- 4. processes

FORK = """
def fork(n):
    import os, signal
    kids = []
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
    for k in kids:
        os.kill(k, signal.SIGKILL)
        os.waitpid(k, 0)
    return len(kids)
"""


def test_a_fork_bomb_is_stopped_as_root(tmp_path):
    limits = sandbox.Limits(processes=64)
    s = _start(tmp_path, FORK, limits=limits)
    try:
        reply = s.request({"op": "call", "name": "fork", "args": [200], "kwargs": {}}, 120)
        assert reply.get("value", 999) < 64, reply
    finally:
        s.close()


def _as_ordinary_user(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with this interpreter as the user 'nobody', in a mount namespace of the test's
    own where the interpreter's installation is traversable (root's home folder is often 0700)."""
    import pwd
    import tempfile
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip("needs root, unshare and setpriv to act as an ordinary user")
    nobody = pwd.getpwnam("nobody")
    work = tempfile.mkdtemp(prefix="as-user-", dir="/tmp")
    try:
        os.chmod(work, 0o755)
        script = os.path.join(work, "as_user.py")
        with open(script, "w") as f:
            f.write(code)
        os.chown(work, nobody.pw_uid, nobody.pw_gid)
        home = os.path.realpath(os.path.expanduser("~"))
        inside = sorted({p for p in (os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix))
                         if p.startswith(home + "/")})
        setup = ""
        if inside:
            keep = os.path.join(work, "keep")
            setup = " && ".join(f"mkdir -p {keep}/{i} && mount --bind {p} {keep}/{i}" for i, p in enumerate(inside))
            setup += f" && mount -t tmpfs -o mode=0755 tmpfs {home} && " + " && ".join(
                f"mkdir -p {p} && mount --move {keep}/{i} {p}" for i, p in enumerate(inside)) + " && "
        cmd = (setup + f"exec setpriv --reuid={nobody.pw_uid} --regid={nobody.pw_gid} --clear-groups "
               f"{sys.executable} {script}")
        env = dict(os.environ, HOME=work, PYTHONPATH=ROOT, TMPDIR=work)
        return subprocess.run(["unshare", "-m", "sh", "-c", cmd], cwd="/", env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_fork_bomb_is_stopped_as_an_ordinary_user():
    """RLIMIT_NPROC was set only as root: an ordinary user's child forked 600 of 600. Since
    Linux 5.14 it counts the processes of the user namespace, so it holds there too."""
    code = textwrap.dedent(f"""
        import json, os, sys, tempfile
        from grader import sandbox
        problem = sandbox.isolation_problem()
        if problem:
            print(json.dumps({{"skip": problem}}))
            sys.exit(0)
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "submission.py"), "w") as f:
            f.write("# ---- cell 1\\n" + {FORK!r})
        s = sandbox.ChildSession(os.path.join(d, "submission.py"), limits=sandbox.Limits(processes=64))
        s.start(120)
        try:
            print(json.dumps(s.request({{"op": "call", "name": "fork", "args": [200], "kwargs": {{}}}}, 120)))
        finally:
            s.close()
    """)
    p = _as_ordinary_user(code)
    if p.returncode != 0 and "setpriv" in p.stderr:
        pytest.skip(f"cannot act as an ordinary user here: {p.stderr[-300:]}")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    reply = json.loads(p.stdout.strip().splitlines()[-1])
    if "skip" in reply:
        pytest.skip(f"an ordinary user has no user namespaces here: {reply['skip']}")
    assert reply.get("value", 999) < 64, reply


# ---------------------------------------------------------------- 5. disk

WRITE = """
def fill(folder, limit):
    import errno, os
    total, err = 0, None
    block = b'x' * (1 << 20)
    try:
        with open(os.path.join(folder, 'big'), 'wb') as f:
            while total < limit:
                f.write(block)
                f.flush()
                total += len(block)
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
    try:
        os.remove(os.path.join(folder, 'big'))
    except OSError:
        pass
    return [total, err]

def answer():
    return 42
"""


def test_the_scratch_is_bounded_and_grading_goes_on(tmp_path):
    """The child wrote 2 GB into its scratch folder on the host disk. Its scratch, /tmp and
    /dev/shm are now one size-limited file system of its own: writing past the limit fails
    (in each of them, together), the host disk gets nothing, and the child still answers."""
    limits = sandbox.Limits()
    limits.scratch_bytes = 32 << 20
    s = _start(tmp_path, WRITE, limits=limits)
    try:
        for folder in ("/sandbox", "/tmp", "/dev/shm"):
            reply = s.request({"op": "call", "name": "fill", "args": [folder, 96 << 20], "kwargs": {}}, 120)
            total, err = reply.get("value", [None, None])
            assert err == "ENOSPC" and total <= 32 << 20, (folder, reply)
        assert _call(s, "answer") == 42
        host = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(s.scratch) for f in fs)
        assert host < 1 << 20, host
    finally:
        s.close()


# ---------------------------------------------------------------- 6. no namespace of its own

NEST = """
def nest():
    import ctypes, os, subprocess, threading
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    pid = os.fork()                                  # plain fork, threads: still allowed
    if pid == 0:
        os._exit(libc.unshare(0x10000000) == 0)      # CLONE_NEWUSER
    out['unshare'] = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
    try:
        out['unshare -U'] = subprocess.run(['unshare', '-U', 'true'], capture_output=True).returncode
    except OSError as e:
        out['unshare -U'] = str(e)
    t = threading.Thread(target=lambda: out.setdefault('thread', 1))
    t.start()
    t.join()
    return out
"""


def test_the_child_cannot_make_a_user_namespace(tmp_path):
    """A user namespace made in the jail gives every capability inside it (mounts of its own,
    and the kernel's attack surface that comes with them)."""
    s = _start(tmp_path, NEST)
    try:
        out = _call(s, "nest")
        assert out["unshare"] == 0 and out["unshare -U"] != 0 and out["thread"] == 1, out
    finally:
        s.close()


PRIORITY = """
import os
def priority():
    got = {"nice": os.getpriority(os.PRIO_PROCESS, 0)}
    for target in (0, 10, -5):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, target)
            got[str(target)] = "raised"
        except OSError as e:
            got[str(target)] = type(e).__name__
    got["after"] = os.getpriority(os.PRIO_PROCESS, 0)
    return got
"""


def test_the_child_runs_below_the_grader_and_cannot_raise_its_priority(tmp_path):
    """A child's threads left spinning would otherwise compete with the GPU harness while a call
    is timed (the host's delay before a launch counts in the call's time): the child runs at
    niceness 19, and no call of its own brings it back up (RLIMIT_NICE 0, no CAP_SYS_NICE)."""
    s = _start(tmp_path, PRIORITY)
    try:
        got = _call(s, "priority")
    finally:
        s.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) < 19
    assert got == {"nice": 19, "0": "PermissionError", "10": "PermissionError", "-5": "PermissionError",
                   "after": 19}, got

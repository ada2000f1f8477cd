"""The trust boundary: no byte a student produced runs on the CPU in a process that holds a
secret, an expected value, a timer, a lock or a result.

The design, and why it holds:

1. **Student code runs only in a jail** (grader/jail.py): new user, mount, network, IPC and PID
   namespaces; a root file system built from an *allow-list*: the operating system's program and
   library folders (``/usr``, ``/lib*``, a few files of ``/etc``) and the Python installation,
   read-only; the child's side of the grader (``/course``: the modules child, channel,
   toolchain, devcode and the package timeline, copied there, nothing else of the course); its
   own scratch folder (``/sandbox``), ``/tmp`` and ``/dev/shm``; and ``/dev/null``-like nodes.
   No GPU, no network, no view of other processes. The Python installation is taken from the
   installation alone (:func:`python_dirs`: its prefixes, the interpreter's folder, its
   site-packages folders), never from ``sys.path`` at large, whose first entry is the working
   folder or a script's folder: a class folder someone grades from is not in the child's view.
   It is in wherever it lies, even inside a folder the child must not see (a venv in the
   checkout, in the submission's folder, pyenv in a home folder): the jail covers such a folder
   with an empty file system and binds the installation through it. The checkout, its ``.git``,
   the solutions, other checkouts, gradebooks and home folders are not hidden: they were never
   put there (or are covered where they hold an allowed folder). The course key's folder
   (grader/inputs.py) is covered wherever an allowed folder holds it. As root the child also
   takes a user id of its own (no other process has it); as an ordinary user the user namespace
   maps it to that user, with no capability left once it runs; in both, a seccomp filter refuses
   it a user namespace of its own (where it would have every capability). Every process it
   starts dies with it (PID 1 of its namespace), and the grader kills its process group and, as
   root, every process of its user id.

   **Limits** (:class:`Limits`), the same as root and as an ordinary user: CPU time, memory,
   open files, the size of one file, and processes (``RLIMIT_NPROC``, counted per user
   namespace since Linux 5.14, so a fork bomb stops at the limit in either mode). The disk: all
   the child can write (its scratch folder, ``/tmp``, ``/dev/shm``) lies in one tmpfs of
   ``scratch_bytes`` made by the jail, so the total it writes is bounded and nothing it writes
   reaches the host's disk (``RLIMIT_FSIZE`` bounds one file only; a quota on the host folder
   would need root, and a disk image a loop device). The bytes are memory, charged to the
   child's memory like any other. Priority: the child runs at niceness 19 and cannot raise it,
   so threads it leaves spinning cannot keep the GPU harness's host side waiting while a call is
   timed (a timed call whose launch the host delays would count the wait). The grader never reads a file of the child's: the kernel's
   PTX and launch plan come over the socket as a message of bounded size (2. below). Trusted
   tools (ptxas, cuobjdump) still write their named outputs into a host folder, read back with
   size limits (:func:`read_scratch_file`).
2. **The child answers with data only** (grader/channel.py): plain JSON for functions, and for a
   kernel its PTX and a launch plan (grader/devcode.py), sent in a message of bounded size and
   validated field by field. No library, no pickle, no object of the child's crosses over.
3. **The grader runs no host code of the child's.** The GPU harness (grader/harness.py) assembles
   the PTX to a cubin in a tool jail (ptxas sees only that file), loads the cubin through the
   CUDA driver (device code only) and launches it with launch data it validated and built
   itself: grid, block, cluster, shared memory, arguments it takes from its own tensors, and TMA
   descriptors it encodes itself after checking that each stays inside its tensor. Mechanism
   checks read the SASS of that same cubin (disassembled in a tool jail), so what is inspected is
   what would run. CUDA source is compiled to PTX by NVRTC inside the student's jail: an
   ``#include`` there reads only what the jail holds.
4. **Trusted processes start isolated**: ``python -I`` with the grader's own module path and a
   private working folder (:func:`trusted_command`), so nothing planted in a working folder or in
   ``/tmp`` is imported; locks live in a folder only the grader's user can write
   (:func:`private_dir`).

Without user and mount namespaces (a container that forbids them, a kernel without
unprivileged user namespaces) none of this holds, and grading refuses to start
(:class:`IsolationUnavailable`, with the fix) unless the instructor passes
``--unsafe-no-sandbox``: then the child is an ordinary process with an empty environment and
resource limits only, and every part's report says so (``measurements.sandbox``).
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from . import channel

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAIL = os.path.join(REPO_ROOT, "grader", "jail.py")
# The grader's modules the child needs (and a graded kernel may import: grader.timeline, a package).
CHILD_MODULES = ("channel.py", "child.py", "hints.py", "toolchain.py", "devcode.py", "timeline")
SCRATCH, COURSE = "/sandbox", "/course"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt/conda")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "localtime",
             "hosts", "fonts", "alternatives", "matplotlibrc")
CHILD_DEVICES = ("null", "zero", "full", "random", "urandom")
UNSAFE = "NONE: --unsafe-no-sandbox (the child could read and write whatever the grader's user can)"

HANG_HINT = ("likely a barrier wait that never completes (an mbarrier phase that never flips, "
             "or an expect_tx byte count that does not match the bytes the copies deliver)")

import ctypes  # noqa: E402

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 4, 36, 1
OUTPUT_KEEP = 16 << 10


class IsolationUnavailable(OSError):
    """This machine does not let the grader make the namespaces the jail needs."""


class SandboxFailure(Exception):
    """The child died, timed out or broke the protocol; the message says which, for the student."""


class JailSetupFailed(SandboxFailure):
    """The jail could not be set up (grader/jail.py exited 125 before the child's code ran, and
    said so on a pipe the child never holds): the machine's problem or the grader's, not the
    student's. The message starts with "the grader could not start the jail"."""


def protect_grader() -> None:
    """Called once by every grader process: not dumpable (a same-user process cannot trace it or
    read its memory or environment through /proc) and a subreaper (orphans of children come
    back to it, to be killed)."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@dataclasses.dataclass
class Limits:
    cpu_s: int = 1800
    memory_bytes: int = 32 << 30
    file_bytes: int = 512 << 20
    open_files: int = 1024
    processes: int = 256
    scratch_bytes: int = 1 << 30          # the child's scratch, /tmp and /dev/shm together (memory)
    nice: int = 19                        # below the grader's processes: a busy jail never delays a timed call


# ---------------------------------------------------------------- trusted places

def private_dir() -> str:
    """A folder only the grader's user can enter (locks, the child's course copy, jail roots).
    One that exists with another owner or open permissions is refused, not used."""
    path = os.path.join(tempfile.gettempdir(), f"grader-private-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    import stat as _stat
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxFailure(f"{path} exists but is not a private folder of this user: remove it and grade again")
    return path


def trusted_path() -> list[str]:
    """Where trusted grader processes import from: the course, then the entries of ``sys.path``
    that lie in the Python installation (:func:`python_dirs`): never the working folder, a
    script's folder or a home folder, where a file planted beside a notebook could be imported."""
    out, installed = [REPO_ROOT], python_dirs()
    for p in sys.path:
        if (p and os.path.isabs(p) and os.path.isdir(p) and p not in out
                and any(_is_inside(os.path.realpath(p), d) for d in installed)):
            out.append(p)
    return out


def trusted_command(module: str, *args: str) -> list[str]:
    """``python -I`` running ``grader.<module>.main(args)`` with :func:`trusted_path` only: neither
    the working folder nor PYTHONPATH nor user site folders are searched for modules."""
    code = (f"import sys; sys.path[:0] = {trusted_path()!r}; from grader.{module} import main; "
            "sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-c", code, *args]


# ---------------------------------------------------------------- the allow-list

def _is_inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def python_dirs() -> list[str]:
    """The Python installation (real paths): its prefixes, the interpreter's own installation,
    its site-packages folders, the user's site-packages folder (that folder alone) when this
    interpreter searches it, and the entries of ``sys.path`` that lie inside those. No other
    entry of ``sys.path``: not the working folder, a script's folder, ``PYTHONPATH``, a home
    folder. Never ``/`` nor a folder that holds the home folder. The course itself is not needed
    (the child imports its side of the grader from ``/course``), so an editable install of it
    brings nothing in."""
    import site
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    prefixes.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    roots = prefixes | {os.path.realpath(p) for p in site.getsitepackages()}
    path = {os.path.realpath(p) for p in sys.path if p and os.path.isabs(p)}
    user = site.getusersitepackages()
    if user and os.path.realpath(user) in path:
        roots.add(os.path.realpath(user))
    dirs = {d for d in roots if os.path.isdir(d)}
    dirs |= {p for p in path if os.path.exists(p) and any(_is_inside(p, r) for r in dirs)}
    home = os.path.realpath(os.path.expanduser("~"))
    dirs |= set(_pythonpath_dirs(home))
    return sorted(d for d in dirs if d != "/" and not _is_inside(home, d))


def _pythonpath_dirs(home: str) -> list[str]:
    """The folders ``PYTHONPATH`` names where the grader started: packages an instructor installed
    with ``pip install --target`` and the like. Never the working folder, the checkout, or a folder
    that holds the home folder, the working folder or the checkout (each would bring in more than
    packages)."""
    cwd, repo = os.path.realpath(os.getcwd()), os.path.realpath(REPO_ROOT)
    out = []
    for p in _STARTED_PYTHONPATH.split(os.pathsep):
        if not p or not os.path.isabs(p) or not os.path.isdir(p):
            continue
        p = os.path.realpath(p)
        if any(_is_inside(x, p) for x in (home, cwd, repo)) or _is_inside(p, repo) or p == cwd:
            continue
        out.append(p)
    return out


_STARTED_PYTHONPATH = os.environ.get("PYTHONPATH", "")


def allow_list(extra_ro: list[tuple[str, str]] = ()) -> dict:
    """The jail's read-only binds, symbolic links and course folders to cover."""
    ro, links = [], []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            links.append([d, os.readlink(d)])
        elif os.path.isdir(d):
            ro.append([d, d])
    for name in ETC_FILES:
        p = os.path.join("/etc", name)
        if os.path.exists(p):
            ro.append([os.path.realpath(p), p])
    for d in python_dirs():
        if not any(_is_inside(d, s) for s, _ in ro):
            ro.append([d, d])
    cuda = os.environ.get("CUDA_PATH")
    if cuda and os.path.isdir(cuda):
        ro.append([os.path.realpath(cuda), os.path.realpath(cuda)])
    ro += [list(x) for x in extra_ro]
    repo = os.path.realpath(REPO_ROOT)
    hide = [repo] if any(_is_inside(repo, s) for s, _ in ro) else []    # a checkout under /usr or /opt
    return {"ro": ro, "symlinks": links, "hide": hide}


def key_covers(binds: list[list[str]]) -> list[str]:
    """Where the course key's folder would show in the jail (an allowed folder holds it): the
    paths to cover. JailSetupFailed when the key's folder is itself an allowed folder (covering
    it would cover the installation): the key needs a folder of its own."""
    from .keyfile import seed_key_path
    key = seed_key_path()
    folders = {os.path.dirname(os.path.abspath(key)), os.path.dirname(os.path.realpath(key))}
    dsts = {dst for _, dst in binds}
    out = []
    for folder in sorted(folders):
        for src, dst in binds:
            src = os.path.realpath(src)
            if not _is_inside(folder, src):
                continue
            where = dst if folder == src else dst.rstrip("/") + folder[len(src.rstrip("/")):]
            if where in dsts:
                raise JailSetupFailed(f"the grader could not start the jail: the course key {key} lies in {folder}, "
                                      "a folder the jail shows (the Python installation): move the key to a folder "
                                      "of its own and point GRADER_SEED_KEY_FILE at it")
            out.append(where)
    return out


@functools.lru_cache(maxsize=1)
def course_copy() -> str:
    """The child's ``/course``: the grader modules it needs, copied (readable by any user)."""
    d = tempfile.mkdtemp(prefix="course-", dir=private_dir())
    atexit.register(shutil.rmtree, d, True)
    os.chmod(d, 0o755)
    pkg = os.path.join(d, "grader")
    os.mkdir(pkg, 0o755)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write('"""The child\'s side of the course grader."""\n')
    for name in CHILD_MODULES:
        src = os.path.join(REPO_ROOT, "grader", name)
        if os.path.isdir(src):                  # a package: its modules, not its __pycache__
            shutil.copytree(src, os.path.join(pkg, name), ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, os.path.join(pkg, name))
    for root, dirs, files in os.walk(d):
        for x in dirs + files:
            os.chmod(os.path.join(root, x), 0o755 if x in dirs else 0o644)
    return d


def jail_config(scratch: str | None, argv: list[str], env: dict, uid: int, limits: Limits | None,
                extra_ro: list[tuple[str, str]] = (), devices=CHILD_DEVICES, keep_fds=(),
                scratch_files: list[tuple[str, str]] | None = None, status_fd: int | None = None) -> dict:
    """The jail of a tool (``scratch``: a host folder bound read-write at ``/sandbox``) or of a
    child (``scratch`` None: ``/sandbox`` is made in the jail's scratch file system, with
    ``scratch_files`` (host path, name) copied in)."""
    root = tempfile.mkdtemp(prefix="root-", dir=private_dir())
    cfg = allow_list(extra_ro)
    lim = limits or Limits()
    cfg.update({"root": root, "devices": list(devices), "argv": argv, "env": env, "uid": uid, "gid": uid,
                "cwd": SCRATCH, "keep_fds": list(keep_fds), "scratch_bytes": lim.scratch_bytes})
    if scratch is None:
        cfg["rw"], cfg["scratch"] = [], {"path": SCRATCH, "files": [list(f) for f in scratch_files or []]}
    else:
        cfg["rw"] = [[scratch, SCRATCH]]
    cfg["hide"] += key_covers(cfg["ro"] + cfg["rw"])
    if status_fd is not None:
        cfg["status_fd"] = status_fd
    cfg["nice"] = lim.nice
    if limits is not None:
        cfg["limits"] = {"cpu_s": limits.cpu_s, "file_bytes": limits.file_bytes, "open_files": limits.open_files,
                         "memory_bytes": limits.memory_bytes, "processes": limits.processes, "core": 0,
                         "nice_ceiling": 0}
    return cfg


def jail_command(cfg: dict) -> list[str]:
    return [sys.executable, "-I", "-S", JAIL, json.dumps(cfg)]


def _preexec() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """None when the jail works here, else why not and how to fix it (tried once per process).
    The probe is a child's jail that must hold: its scratch writable, the course's files (the
    grader, the solutions) and the course key out of sight."""
    import shlex
    lock, root = None, None
    repo, key = os.path.realpath(REPO_ROOT), None
    try:
        from .keyfile import seed_key_path
        key = seed_key_path()
        uid, lock = claim_uid() if os.geteuid() == 0 else (os.geteuid(), None)
        checks = [("test -w /sandbox && : > /sandbox/probe", "its scratch folder is not writable")]
        checks += [(f"! test -e {shlex.quote(p)}", f"{p} is visible in it")
                   for p in (os.path.join(repo, "grader"), os.path.join(repo, "solutions"), key)]
        script = " && ".join(f"{{ {c} || {{ echo {shlex.quote('the jail does not isolate: ' + why)}; exit 1; }}; }}"
                             for c, why in checks)
        cfg = jail_config(None, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, uid, Limits())
        root = cfg["root"]
        out = subprocess.run(jail_command(cfg), capture_output=True, text=True, timeout=60, preexec_fn=_preexec)
        rc, err = out.returncode, out.stderr + out.stdout
    except (OSError, SandboxFailure, subprocess.SubprocessError) as e:
        rc, err = -1, f"{type(e).__name__}: {e}"
    finally:
        if lock is not None:
            os.close(lock)
        if root:
            shutil.rmtree(root, ignore_errors=True)
    if rc == 0:
        return None
    why = (err.strip().splitlines() or [f"exit status {rc}"])[-1]
    if rc == 1 and why.startswith("the jail does not isolate"):
        return f"{why}: grading stops (a fault of the grader's allow-list; please report it)"
    need = ("mount and PID namespaces as root" if os.geteuid() == 0 else
            "unprivileged user namespaces (with mount, network and PID namespaces)")
    return (f"grading needs {need} to isolate the students' code, and this machine refused ({why}). "
            "Fix: grade as root in a container that may make namespaces (docker run --cap-add SYS_ADMIN "
            "--security-opt seccomp=unconfined --security-opt apparmor=unconfined ...), or allow unprivileged user "
            "namespaces (sysctl user.max_user_namespaces=10000, kernel.unprivileged_userns_clone=1, "
            "kernel.apparmor_restrict_unprivileged_userns=0); or grade without isolation with --unsafe-no-sandbox "
            "(every part's report then says so)")


_UNSAFE = [False]


def require_isolation(unsafe: bool) -> str:
    """The level every child of this run gets; IsolationUnavailable when the jail cannot be made
    and the instructor did not ask for ``--unsafe-no-sandbox`` (which then holds for the tools
    this process runs too)."""
    _UNSAFE[0] = bool(unsafe)
    if unsafe:
        return UNSAFE
    problem = isolation_problem()
    if problem:
        raise IsolationUnavailable(problem)
    return "jail: namespaces, allow-listed files, own user" if os.geteuid() == 0 else \
        "jail: user namespace, allow-listed files"


def run_tool(argv: list[str], inputs: dict[str, bytes], outputs: list[str], timeout: float = 300,
             unsafe: bool | None = None, max_bytes: int = 256 << 20, course: bool = False) -> tuple[int, str, dict[str, bytes]]:
    """Run a trusted tool (ptxas, cuobjdump) on untrusted input files in a jail of its own:
    it sees the system, the Python/CUDA folders and its scratch folder (``/sandbox``), where
    ``inputs`` are written (and, with ``course``, the child's grader modules at ``/course``);
    returns (exit status, stderr+stdout, the ``outputs`` it wrote)."""
    unsafe = _UNSAFE[0] if unsafe is None else unsafe
    scratch = tempfile.mkdtemp(prefix="tool-", dir=private_dir())
    uid, lock = (claim_uid() if os.geteuid() == 0 else (os.geteuid(), None)) if not unsafe else (None, None)
    root = None
    try:
        for name, data in inputs.items():
            with open(os.path.join(scratch, name), "wb") as f:
                f.write(data)
        if unsafe:
            cmd = [a.replace(SCRATCH, scratch).replace("'" + COURSE + "'", repr(course_copy())) for a in argv]
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, cwd=scratch, env={"PATH": "/usr/bin:/bin"})
        else:
            if os.geteuid() == 0:
                os.chown(scratch, uid, uid)
            os.chmod(scratch, 0o700)
            cfg = jail_config(scratch, argv, {"PATH": "/usr/bin:/bin", "HOME": SCRATCH, "TMPDIR": "/tmp"}, uid,
                              Limits(cpu_s=int(timeout) + 5, memory_bytes=16 << 30),
                              extra_ro=[(course_copy(), COURSE)] if course else [])
            root = cfg["root"]
            proc = subprocess.run(jail_command(cfg), capture_output=True, timeout=timeout, preexec_fn=_preexec)
        out = {}
        for name in outputs:
            data = read_scratch_file(scratch, name, max_bytes)
            if data is not None:
                out[name] = data
        text = (proc.stderr + proc.stdout).decode(errors="replace")
        return proc.returncode, text, out
    finally:
        if lock is not None:
            os.close(lock)
        shutil.rmtree(scratch, ignore_errors=True)
        if root:
            shutil.rmtree(root, ignore_errors=True)


def read_scratch_file(scratch: str, name: str, max_bytes: int) -> bytes | None:
    """A regular file the child or a tool wrote in its scratch folder: no link followed, no
    name with a folder in it, no more than ``max_bytes``."""
    if os.path.basename(name) != name or name in ("", ".", ".."):
        raise SandboxFailure(f"a file name with a folder in it: {name!r}")
    try:
        fd = os.open(os.path.join(scratch, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SandboxFailure(f"{name}: not a plain file ({e.strerror})") from None
    try:
        import stat as _stat
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise SandboxFailure(f"{name} is not a plain file")
        if st.st_size > max_bytes:
            raise SandboxFailure(f"{name} is larger than {max_bytes >> 20} MB")
        chunks, total = [], 0
        while total <= max_bytes:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > max_bytes:
            raise SandboxFailure(f"{name} is larger than {max_bytes >> 20} MB")
        return b"".join(chunks)
    finally:
        os.close(fd)


class ChildSession:
    """One jailed child serving one submission; restartable after a crash or a timeout."""

    def __init__(self, module_path: str, limits: Limits | None = None, unsafe: bool = False,
                 hide: list[str] = ()):
        self.module_path = module_path
        self.hide = [os.path.realpath(h) for h in hide]
        self.limits = limits or Limits()
        self.unsafe = unsafe
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.scratch: str | None = None
        self.root: str | None = None
        self.uid: int | None = None           # the child's own user id (as root); None: the grader's user
        self._uid_lock: int | None = None
        self._status: int | None = None        # the read end of the jail's status pipe
        self.level = "not started"
        self.cell_errors: list[str] = []
        self.syntax_errors: list[str] = []
        self._out_head = bytearray()
        self._out_tail = bytearray()
        self._out_total = 0
        self._reader: threading.Thread | None = None
        self._draining = False

    # ------------------------------------------------------------ start and stop
    def start(self, timeout: float) -> None:
        """Start the child and wait until it ran the notebook's cells (at most ``timeout`` s)."""
        self.close()
        self.level = require_isolation(self.unsafe)
        self.scratch = tempfile.mkdtemp(prefix="child-", dir=private_dir() if not self.unsafe else None)
        shutil.copy(self.module_path, os.path.join(self.scratch, "submission.py"))
        parent_sock, child_sock = socket.socketpair()
        fd = child_sock.fileno()
        pass_fds = [fd]
        if self.unsafe:
            cmd = [sys.executable, "-B", "-m", "grader.child", str(fd), os.path.join(self.scratch, "submission.py")]
            env = self._env(os.pathsep.join([REPO_ROOT] + trusted_path()[1:]), self.scratch)
            lim = self.limits

            def preexec() -> None:
                _preexec()
                os.setpriority(os.PRIO_PROCESS, 0, lim.nice)
                import resource
                for r, v in ((resource.RLIMIT_CPU, lim.cpu_s), (resource.RLIMIT_FSIZE, lim.file_bytes),
                             (resource.RLIMIT_NOFILE, lim.open_files), (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_DATA, lim.memory_bytes)):
                    resource.setrlimit(r, (v, v))
            kwargs = {"cwd": self.scratch, "env": env, "preexec_fn": preexec}
        else:
            if os.geteuid() == 0:
                self.uid, self._uid_lock = claim_uid()
            os.chmod(self.scratch, 0o700)
            path = os.pathsep.join([COURSE] + python_dirs())
            self._status, status_w = os.pipe()
            pass_fds.append(status_w)
            try:
                cfg = jail_config(None, [sys.executable, "-B", "-m", "grader.child", str(fd), SCRATCH + "/submission.py"],
                                  self._env(path, SCRATCH), self.uid if self.uid is not None else os.geteuid(),
                                  self.limits, extra_ro=[(course_copy(), COURSE)], keep_fds=[fd],
                                  scratch_files=[(os.path.join(self.scratch, "submission.py"), "submission.py")],
                                  status_fd=status_w)
            except BaseException:
                os.close(status_w)
                child_sock.close()
                parent_sock.close()
                self.close()
                raise
            cfg["hide"] += [h for h in self.hide if os.path.isdir(h) and h not in ("/", "/usr")]
            self.root = cfg["root"]
            cmd = jail_command(cfg)
            kwargs = {"preexec_fn": _preexec}
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, pass_fds=pass_fds, start_new_session=True, **kwargs)
        finally:
            for mine in pass_fds[1:]:              # the jail's end of the status pipe
                os.close(mine)
        register_child(self.proc.pid)
        child_sock.close()
        self.sock = parent_sock
        self._out_head, self._out_tail, self._out_total = bytearray(), bytearray(), 0
        self._reader = threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        try:
            hello = channel.recv(self.sock, timeout, max_bytes=1 << 20)
        except channel.ChannelTimeout:
            self.close()
            raise SandboxFailure(f"running the notebook's cells did not finish in {timeout:g} s (an endless loop "
                                 f"or far too much work at the top level of a cell); last output:\n{self.output()}")
        except (channel.ChannelClosed, channel.BadMessage) as e:
            how = self._how_it_ended()            # before close(), which forgets the process
            if self._reader is not None:
                self._reader.join(timeout=2)      # all it printed before it ended
            out, setup = self.output(), self._setup_failure()
            self.close()
            if setup:
                raise JailSetupFailed(f"the grader could not start the jail: {setup} (a problem of the grading "
                                      f"machine, not of the submission)") from None
            raise SandboxFailure(f"the process running your cells {how} before it was ready ({e}); "
                                 f"last output:\n{out}") from None
        self.cell_errors = [str(x) for x in hello.get("cell_errors", [])][:50] if isinstance(hello, dict) else []

    def _setup_failure(self) -> str | None:
        """What the jail wrote on its status pipe: why it could not start the child (only the
        jail holds the pipe's other end, and it is closed when the child's program starts)."""
        if self._status is None or self.proc is None or self.proc.poll() is None:
            return None
        os.set_blocking(self._status, False)
        try:
            data = os.read(self._status, 4096)
        except BlockingIOError:
            return None
        text = data.decode(errors="replace").strip()
        return text[len("jail: "):] if text.startswith("jail: ") else text or None

    def _env(self, pythonpath: str, home: str) -> dict:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp" if home == SCRATCH else home,
               "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": pythonpath}
        if os.environ.get("CUDA_PATH"):
            env["CUDA_PATH"] = os.path.realpath(os.environ["CUDA_PATH"])
        return env

    def _drain(self, stream) -> None:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            self._draining = True
            try:
                if not chunk:
                    return
                self._out_total += len(chunk)
                if len(self._out_head) < OUTPUT_KEEP:
                    self._out_head += chunk[:OUTPUT_KEEP - len(self._out_head)]
                self._out_tail = (self._out_tail + chunk)[-OUTPUT_KEEP:]
            finally:
                self._draining = False

    def _caught_up(self, wait_s: float = 1.0) -> None:
        """Let the reader take in what the child has already written: the child flushed it before
        it answered, but the thread that reads the pipe may not have run since (a loaded machine).
        Returns when the pipe holds nothing unread twice in a row, or after ``wait_s``."""
        import select
        stream = self.proc.stdout if self.proc is not None else None
        if stream is None or self._reader is None or not self._reader.is_alive():
            return
        deadline, quiet = time.monotonic() + wait_s, 0
        while quiet < 2 and time.monotonic() < deadline:
            try:
                readable = select.select([stream.fileno()], [], [], 0)[0]
            except (OSError, ValueError):
                return
            quiet = 0 if readable or self._draining else quiet + 1
            time.sleep(0.005)

    def output(self) -> str:
        """What the child printed, bounded: the first and last 16 KB."""
        self._caught_up()
        if self._out_total <= 2 * OUTPUT_KEEP:
            text = bytes(self._out_head + self._out_tail[len(self._out_head) - self._out_total:] if self._out_total > OUTPUT_KEEP else self._out_head)
        else:
            text = bytes(self._out_head) + f"\n[... {self._out_total - 2 * OUTPUT_KEEP} bytes left out ...]\n".encode() + bytes(self._out_tail)
        return text.decode("utf-8", errors="replace")

    def _how_it_ended(self) -> str:
        if self.proc is None:
            return "was not started"
        try:
            rc = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if rc < 0:
            return f"was killed by signal {signal.Signals(-rc).name}"
        return f"exited with code {rc}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Kill the child and everything it started; remove its scratch folder."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            kill_tree(self.proc, self.uid)   # the child's own user's processes too (as root only)
            self.proc = None
        if self._uid_lock is not None:       # every process of the user is gone: free it
            os.close(self._uid_lock)
            self._uid_lock = None
        self.uid = None
        if self._status is not None:
            os.close(self._status)
            self._status = None
        if self._reader is not None:
            self._reader.join(timeout=2)
            self._reader = None
        for d in (self.scratch, self.root):
            if d and os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)
        self.scratch = self.root = None

    # ------------------------------------------------------------ requests
    def request(self, msg: dict, timeout: float) -> dict:
        if not self.alive or self.sock is None:
            raise SandboxFailure("the process running your cells is not running (it ended in an earlier part)")
        try:
            channel.send(self.sock, msg)
            reply = channel.recv(self.sock, timeout)
        except channel.ChannelTimeout:
            self.close()
            raise SandboxFailure(f"timed out after {timeout:.0f} s: an endless loop or far too much work; "
                                 f"the process was killed") from None
        except (channel.ChannelClosed, BrokenPipeError, ConnectionResetError) as e:
            how = self._how_it_ended()
            out = self.output()
            self.close()
            raise SandboxFailure(f"the process running your code {how} ({e}); last output:\n{out[-3000:]}") from None
        except channel.BadMessage as e:
            self.close()
            raise SandboxFailure(f"your process sent something that is not an answer: {e}") from None
        if not isinstance(reply, dict):
            self.close()
            raise SandboxFailure("your process sent an answer of the wrong shape")
        return reply


UID_BASE, UID_COUNT = 60000, 5000


def claim_uid() -> tuple[int, int]:
    """A user id of its own for one child: (uid, fd of its lock). The lock file (in the grader's
    private folder, where no child can write) is held while the child lives, so two children (of this grader or another) never share a user, and
    a user that still owns processes is never handed out. The lowest free id is taken, so the
    lock files are as many as the most children ever alive at once (they are not removed:
    removing a lock file others may hold open would let two children share a user)."""
    import fcntl
    for i in range(UID_COUNT):
        uid = UID_BASE + i
        path = os.path.join(private_dir(), f"uid-{uid}.lock")
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _pids_of_uid(uid):
            os.close(fd)
            continue
        return uid, fd
    raise SandboxFailure("no free user id for the sandbox")


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def _pids_of_uid(uid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def kill_tree(proc: subprocess.Popen, uid: int | None, keep: tuple[int, ...] = ()) -> None:
    """Kill ``proc``, its process group, every process of ``uid`` (when the child has a user of its
    own), and every descendant, including orphans reparented to this subreaper."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(50):
        victims = set(_descendants(proc.pid))
        if uid is not None:
            victims |= set(_pids_of_uid(uid))
        victims |= {p for p in _children_of(os.getpid()) if p not in keep and p not in _known_children()}
        victims.discard(os.getpid())
        if proc.poll() is None:
            victims.add(proc.pid)
        if not victims:
            break
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap(victims - {proc.pid})
        time.sleep(0.02)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    _KNOWN.discard(proc.pid)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children_of(todo.pop())
        out += kids
        todo += kids
    return out


_KNOWN: set[int] = set()


def register_child(pid: int) -> None:
    """A process the grader started itself (a sandboxed child, the GPU harness): killed only when
    its own session or harness ends, never swept up as an orphan by another one's cleanup."""
    _KNOWN.add(pid)


def _known_children() -> set[int]:
    return {p for p in _KNOWN if os.path.exists(f"/proc/{p}")}


def _reap(pids) -> None:
    """Collect the exit status of killed orphans that became our children (no zombies)."""
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:
            pass

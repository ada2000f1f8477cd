"""The trust boundary: a submission's code runs only in a child process that holds nothing worth
stealing, and the grader decides every score from what it computes itself.

A child (``python -m grader.child``, see grader/child.py) starts with
- an empty environment (no secret seed, no paths of the grader's files),
- a scratch folder as its working directory and the only place it can write,
- resource limits: CPU time, memory, file size, open files, and (as its own user) processes,
- where the grader runs as root (CI, GPU hosts): its own mount namespace in which the course's
  solutions, reports and the grader's output folders are hidden under empty tmpfs mounts and
  the home folder is replaced, and an unprivileged user id of its own, so it can neither read
  the reference solutions nor write a report, signal or trace the grader;
- stdout and stderr captured with a bound (the first and last 16 KB are kept).
It talks to the grader only through a socket of length-prefixed JSON (grader/channel.py).

Every process the child starts is killed when the child's session ends: its process group,
every process of its user id, and every orphan reparented to the grader (which makes itself a
child subreaper), so nothing outlives a grading run.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
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
# Hidden from the child: reference notebooks and answers (grader/labs holds the reference answers
# of the CPU exercises), recorded reports, and nbgrader's folders of other students' work.
HIDDEN_IN_REPO = ("solutions", "grader/labs", "reports", "submitted", "autograded", "feedback", "release",
                  "grader-results", "exchange")

HANG_HINT = ("likely a barrier wait that never completes (an mbarrier phase that never flips, "
             "or an expect_tx byte count that does not match the bytes the copies deliver)")

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 4, 36, 1
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
OUTPUT_KEEP = 16 << 10


class NamespaceUnavailable(OSError):
    """This machine does not let the grader make a mount namespace (no CAP_SYS_ADMIN)."""


class SandboxFailure(Exception):
    """The child died, timed out or broke the protocol; the message says which, for the student."""


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


def _mount(src, dst, fstype, flags, data=None) -> None:
    if _libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags,
                   data and data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


def _blocked_ancestors(path: str) -> list[str]:
    """Ancestors of ``path`` that others cannot enter (e.g. /root, a private temp folder)."""
    out, p = [], os.path.dirname(os.path.abspath(path))
    while p not in ("/", ""):
        try:
            if not os.stat(p).st_mode & 0o001:
                out.append(p)
        except OSError:
            pass
        p = os.path.dirname(p)
    return out


def _needed_paths() -> list[str]:
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), REPO_ROOT)}
    paths |= {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
    return sorted(paths)


def isolation_plan(hide: list[str], extra: list[str] = ()) -> tuple[list[str], list[str]]:
    """(folders to cover with an empty tmpfs, shortest first; needed folders to bind back).
    Covered: the folders to hide, the home folder, and every folder on the way to a needed
    path that others cannot enter (the child's own user could not pass it)."""
    needed = sorted(set(_needed_paths()) | {os.path.realpath(p) for p in extra})
    cover = {os.path.realpath(p) for p in hide if os.path.isdir(p)}
    cover.add(os.path.realpath(os.path.expanduser("~")))
    for n in needed:
        cover.update(_blocked_ancestors(n + "/x"))
    never = {"/", "/tmp", "/var/tmp", os.path.realpath(tempfile.gettempdir())}
    cover = {c for c in cover if c not in never and c not in needed}
    return sorted(cover, key=len), needed


class ChildSession:
    """One sandboxed child serving one submission; restartable after a crash or a timeout."""

    def __init__(self, module_path: str, hide: list[str] | None = None, limits: Limits | None = None):
        self.module_path = module_path
        self.hide = list(hide or [])
        self.limits = limits or Limits()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.scratch: str | None = None
        self.stage: str | None = None
        self.uid: int | None = None
        self._uid_lock: int | None = None
        self.level = "not started"
        self.cell_errors: list[str] = []
        self._out_head = bytearray()
        self._out_tail = bytearray()
        self._out_total = 0
        self._reader: threading.Thread | None = None

    # ------------------------------------------------------------ start and stop
    def start(self, timeout: float) -> None:
        """Start the child and wait until it ran the notebook's cells (at most ``timeout`` s)."""
        self.close()
        self.scratch = tempfile.mkdtemp(prefix="grader-child-")
        shutil.copy(self.module_path, os.path.join(self.scratch, "submission.py"))
        is_root = os.geteuid() == 0
        self.uid, self._uid_lock = claim_uid() if is_root else (None, None)
        cover, needed = isolation_plan(self.hide + [os.path.join(REPO_ROOT, d) for d in HIDDEN_IN_REPO],
                                       [self.scratch]) if is_root else ([], [self.scratch])
        # The staging folder must stay visible while folders are covered: /tmp is never covered.
        stage = self.stage = tempfile.mkdtemp(prefix="grader-stage-", dir="/tmp") if is_root else ""
        if self.uid is not None:
            os.chown(self.scratch, self.uid, self.uid)
            os.chown(os.path.join(self.scratch, "submission.py"), self.uid, self.uid)
            os.chmod(self.scratch, 0o700)
        parent_sock, child_sock = socket.socketpair()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.scratch, "TMPDIR": self.scratch,
               "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
               # where the course's packages are found: paths only, nothing else of the grader's environment
               "PYTHONPATH": os.pathsep.join([REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        lim, uid = self.limits, self.uid
        private = any(_blocked_ancestors(n + "/x") for n in needed)
        status_r, status_w = os.pipe()

        def preexec() -> None:          # runs in the child between fork and exec
            os.setsid()
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            level = "rlimits"
            if uid is not None:
                drop = True
                try:
                    _isolate_mounts(cover, needed, stage)
                    level = "mount namespace + own user"
                except NamespaceUnavailable as e:
                    # Without a namespace the own user can only run Python if nothing on the way
                    # to it is private; else stay root, with the limits alone, and say so.
                    drop = not private
                    level = (f"own user (no mount namespace: {e.strerror})" if drop else
                             f"rlimits only (no mount namespace: {e.strerror}; Python lies under a private folder)")
                if drop:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                    resource.setrlimit(resource.RLIMIT_NPROC, (lim.processes, lim.processes))
            for r, v in ((resource.RLIMIT_CPU, lim.cpu_s), (resource.RLIMIT_FSIZE, lim.file_bytes),
                         (resource.RLIMIT_NOFILE, lim.open_files), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_DATA, lim.memory_bytes)):
                resource.setrlimit(r, (v, v))
            os.write(status_w, level.encode())
            os.close(status_w)

        cmd = [sys.executable, "-B", "-m", "grader.child", str(child_sock.fileno()),
               os.path.join(self.scratch, "submission.py")]
        self.proc = subprocess.Popen(cmd, cwd=self.scratch, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     pass_fds=(child_sock.fileno(), status_w), preexec_fn=preexec)
        register_child(self.proc.pid)
        child_sock.close()
        os.close(status_w)
        with os.fdopen(status_r, "rb") as f:
            self.level = f.read().decode(errors="replace") or "rlimits"
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
            self.close()
            raise SandboxFailure(f"the process running your cells {self._how_it_ended()} before it was ready ({e}); "
                                 f"last output:\n{self.output()}") from None
        self.cell_errors = [str(x) for x in hello.get("cell_errors", [])][:50] if isinstance(hello, dict) else []

    def _drain(self, stream) -> None:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                return
            self._out_total += len(chunk)
            if len(self._out_head) < OUTPUT_KEEP:
                self._out_head += chunk[:OUTPUT_KEEP - len(self._out_head)]
            self._out_tail = (self._out_tail + chunk)[-OUTPUT_KEEP:]

    def output(self) -> str:
        """What the child printed, bounded: the first and last 16 KB."""
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
            kill_tree(self.proc, self.uid)
            self.proc = None
        if self._uid_lock is not None:       # every process of the user is gone: free it
            os.close(self._uid_lock)
            self._uid_lock = None
        if self._reader is not None:
            self._reader.join(timeout=2)
            self._reader = None
        for d in (self.scratch, self.stage):
            if d and os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)
        self.scratch = self.stage = None

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

    def fetch(self, name: str, dest_dir: str, max_bytes: int = 256 << 20) -> str:
        """Copy a file the child wrote in its scratch folder into ``dest_dir`` (the grader's)."""
        src = os.path.join(self.scratch or "", os.path.basename(name))
        if not os.path.isfile(src) or os.path.islink(src):
            raise SandboxFailure(f"your process reported a file {name!r} that is not there")
        if os.path.getsize(src) > max_bytes:
            raise SandboxFailure(f"{name} is larger than {max_bytes >> 20} MB")
        # A fresh name every time: a process that loaded a library keeps it by path, and a
        # restarted child numbers its kernels from 1 again.
        dst = tempfile.mktemp(prefix=os.path.splitext(os.path.basename(name))[0] + "-", suffix=".so", dir=dest_dir)
        with open(src, "rb") as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
        return dst


def _isolate_mounts(cover: list[str], needed: list[str], stage: str) -> None:
    """In a new mount namespace: an empty tmpfs over each folder of ``cover`` (shortest first), with
    the ``needed`` folders inside it bound back. Runs between fork and exec: system calls only."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise NamespaceUnavailable(err, os.strerror(err))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [n for n in needed if any(n.startswith(c + "/") for c in cover)]
    staged = []
    for i, n in enumerate(keep):
        s = os.path.join(stage, str(i))
        os.mkdir(s)
        _mount(n, s, None, MS_BIND | MS_REC)
        staged.append((n, s))
    for c in cover:
        if not os.path.isdir(c):
            continue
        _mount("tmpfs", c, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for n, s in staged:
            if n.startswith(c + "/"):
                os.makedirs(n, exist_ok=True)
                _mount(s, n, None, MS_BIND | MS_REC)


UID_BASE, UID_COUNT = 60000, 5000


def claim_uid() -> tuple[int, int]:
    """A user id of its own for one child: (uid, fd of its lock). The lock file in /tmp is held
    while the child lives, so two children (of this grader or another) never share a user, and
    a user that still owns processes is never handed out. The lowest free id is taken, so the
    lock files are as many as the most children ever alive at once (they are not removed:
    removing a lock file others may hold open would let two children share a user)."""
    import fcntl
    for i in range(UID_COUNT):
        uid = UID_BASE + i
        path = f"/tmp/grader-uid-{uid}.lock"
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        if os.fstat(fd).st_uid != os.geteuid():     # planted by a child: replace it, so that
            os.close(fd)                            # planted files cannot use up the ids
            try:
                os.unlink(path)
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
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

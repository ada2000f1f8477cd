"""The jail: starts one untrusted program in namespaces of its own, seeing an allow-list of files.

Run as ``python -I grader/jail.py CONFIG_JSON`` by grader/sandbox.py (standard library only, so
that nothing outside this file is imported before the program is locked in). CONFIG_JSON holds
no secret; it says which host folders the program may read (``ro``), which it may write
(``rw``: a tool's scratch folder), which folders to cover (``hide``), its scratch (``scratch``:
a folder of its own, made here, with the files to copy in), the devices it gets, its user,
limits, command and environment.

1. New user (when not root), mount, network, IPC, UTS and PID namespaces (``unshare``). Without
   root the invoking user is mapped to itself, so the program keeps no capability once it runs.
2. A fork: the child is PID 1 of the new PID namespace (when it ends, every process in it ends
   with it; none can see or signal a process outside). The parent waits and passes the exit
   status on (a death by a signal as the same signal); it dies with the grader (parent-death
   signal) and PID 1 dies with it. PID 1 forks the program (PID 2) at the end of step 4, reaps
   orphans and ends with the program.
3. A new root file system on a tmpfs. One more tmpfs of ``scratch_bytes`` holds everything the
   program can write: ``/tmp``, ``/dev/shm`` and its scratch folder are folders of it, so the
   bytes it writes in all of them together are bounded, and none reach the host's disk (a
   tool's ``rw`` folder is the exception: a trusted tool writes the files asked of it there).
   Then the folders in path-depth order, so that an outer mount never covers an inner one: the
   allow-listed folders bound read-only at their own paths, and each ``hide`` folder that the
   program could otherwise see (inside an allowed folder, or holding one) covered by an empty
   tmpfs, through which the allowed folders inside it show (it is made read-only once they are
   bound). A folder both hidden and allowed is allowed: the sandbox never asks for that where it
   matters (the course key). Then a ``/dev`` with the listed nodes only (no GPU unless listed), a
   ``/proc`` of the new PID namespace, ``pivot_root``, the old root detached, the new root
   read-only.
4. Root: supplementary groups dropped, the given user and group taken. Then no-new-privileges,
   a seccomp filter that refuses new user namespaces (``unshare``/``clone`` with
   ``CLONE_NEWUSER``, ``setns``; ``clone3``, whose flags a filter cannot read, answers ENOSYS,
   and the C library falls back to ``clone``), resource limits (``RLIMIT_NPROC`` too: since
   Linux 5.14 it counts the processes of the user namespace, so it holds for an ordinary user's
   jail as for root's), and ``execve`` of the command with exactly the given environment. The
   program runs at the niceness ``nice`` (19: below every process of the grader's, so that under
   load the host side of a timed call, the GPU harness's, is not kept waiting for a busy jail)
   and ``RLIMIT_NICE`` 0: it can only lower its priority further (raising it needs
   ``CAP_SYS_NICE`` in the machine's first user namespace, which no jail has).

Networking: the new network namespace has only a loopback device, down. Everything that fails
here is reported on standard error and on the status pipe (``status_fd``, closed when the
program starts, so the program cannot write to it) with exit status 125, before any untrusted
byte runs.
"""
import ctypes
import json
import os
import resource
import platform
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
ST_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}  # statvfs -> mount
SETUP_FAILED = 125
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}          # the system call's number
SCRATCH_FS = "/.scratch"                              # where the scratch tmpfs is made, then detached
LIMITS = {"cpu_s": resource.RLIMIT_CPU, "file_bytes": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE,
          "memory_bytes": resource.RLIMIT_DATA, "processes": resource.RLIMIT_NPROC, "core": resource.RLIMIT_CORE,
          "nice_ceiling": resource.RLIMIT_NICE}

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def mount(src, dst, fstype, flags, data=None):
    _check(libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), ctypes.c_ulong(flags),
                      data and data.encode()), f"mount {src or fstype} on {dst}")


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _make_target(path, like_dir):
    if like_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()


def bind(src, dst, writable, device=False):
    """Bind ``src`` at ``dst`` (inside the new root); read-only unless ``writable``; device nodes
    only where ``device``. The remount keeps the flags the kernel locks for an unprivileged
    namespace (nosuid, nodev, noexec)."""
    _make_target(dst, os.path.isdir(src))
    mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if device else MS_NODEV)
    for bit, ms in ST_FLAGS.items():
        if os.statvfs(dst).f_flag & bit:
            flags |= ms
    if not writable:
        flags |= MS_RDONLY
    elif flags & MS_RDONLY:
        flags &= ~MS_RDONLY
    mount(None, dst, None, flags)


def _inside(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def make_scratch(cfg, root):
    """One tmpfs of ``scratch_bytes`` for all the program may write: returns the binds of its
    folders (``/tmp``, ``/dev/shm`` and, with ``scratch``, the program's own folder, owned by
    its user, with the listed files copied in)."""
    fs = root + SCRATCH_FS
    os.makedirs(fs)
    mount("tmpfs", fs, "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0755,size={int(cfg.get('scratch_bytes', 1 << 30))},nr_inodes={int(cfg.get('scratch_inodes', 65536))}")
    binds = []
    for name, dst in (("tmp", "/tmp"), ("shm", "/dev/shm")):
        os.mkdir(os.path.join(fs, name))
        os.chmod(os.path.join(fs, name), 0o1777)
        binds.append(("rw", os.path.join(fs, name), dst))
    scratch = cfg.get("scratch")
    if scratch:
        work = os.path.join(fs, "work")
        os.mkdir(work, 0o700)
        for src, name in scratch.get("files", []):
            if os.path.basename(name) != name:
                raise SetupError(f"a scratch file name with a folder in it: {name!r}")
            with open(src, "rb") as f, open(os.path.join(work, name), "wb") as g:
                g.write(f.read())
            os.chown(os.path.join(work, name), cfg["uid"], cfg["gid"])
        os.chown(work, cfg["uid"], cfg["gid"])
        binds.append(("rw", work, scratch["path"]))
    return binds


def mount_plan(cfg, scratch_binds):
    """Every bind and cover, ancestors first (a stable sort on the depth of the path in the
    jail; at equal depth a cover comes before the binds); a cover at the very path of a bind
    is dropped."""
    binds = [("ro", src, dst) for src, dst in cfg["ro"] if os.path.exists(src)]
    binds += [("rw", src, dst) for src, dst in cfg.get("rw", [])] + list(scratch_binds)
    dsts = {dst for _, _, dst in binds}
    hides = [("hide", None, h) for h in cfg.get("hide", []) if h not in dsts and h != "/"]

    def depth(entry):
        return (entry[2].rstrip("/").count("/"), entry[0] != "hide")
    return sorted(hides + binds, key=depth)


def build_root(cfg):
    root = cfg["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    scratch_binds = make_scratch(cfg, root)
    plan = mount_plan(cfg, scratch_binds)
    covered = []
    for kind, src, dst in plan:
        if kind == "hide":
            holds = any(k != "hide" and _inside(d, dst) for k, _, d in plan)
            if os.path.isdir(root + dst) or holds:     # the program could see it, or what it holds
                os.makedirs(root + dst, exist_ok=True)
                mount("tmpfs", root + dst, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k,nr_inodes=4096")
                covered.append(dst)
        else:
            bind(src, root + dst, kind == "rw")
    for dst in covered:                            # the binds inside are in place: no more writes
        mount(None, root + dst, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _check(libc.umount2((root + SCRATCH_FS).encode(), MNT_DETACH), "detach the scratch file system")
    os.rmdir(root + SCRATCH_FS)
    for node in cfg.get("devices", []):
        bind("/dev/" + node, root + "/dev/" + node, True, device=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for link, target in cfg.get("symlinks", []):
        if not os.path.lexists(root + link):
            os.makedirs(os.path.dirname(root + link), exist_ok=True)
            os.symlink(target, root + link)
    os.chdir(root)
    _check(libc.syscall(PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter(cfg):
    """Steps 1 and 2; returns in the child (PID 1 of the new namespace)."""
    user = os.geteuid() != 0
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID | (CLONE_NEWUSER if user else 0)
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(flags), "unshare (user, mount, network and PID namespaces)")
    if user:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    pid = os.fork()
    if pid:
        for fd in cfg.get("keep_fds", []) + ([cfg["status_fd"]] if "status_fd" in cfg else []):
            try:
                os.close(fd)
            except OSError:
                pass
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        if 128 < code < 128 + 65 and code != 128 + signal.SIGKILL:  # the program died of a signal: so do we
            signal.signal(code - 128, signal.SIG_DFL)
            os.kill(os.getpid(), code - 128)
        os._exit(code)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    mount(None, "/", None, MS_REC | MS_PRIVATE)


# The seccomp filter (classic BPF): the native architecture only; no new user namespace.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {"x86_64": {"unshare": 272, "clone": 56, "clone3": 435, "setns": 308},
            "aarch64": {"unshare": 97, "clone": 220, "clone3": 435, "setns": 268}}
X32_BIT = 0x40000000                                  # x86_64's x32 system calls: refused, all
BPF_LD_W_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program(machine):
    """The filter as (code, jump if true, jump if false, k) rows. seccomp_data: the system call
    number at 0, the architecture at 4, the low 32 bits of the first argument at 16 (the flags
    of unshare and clone)."""
    if machine not in AUDIT_ARCH:
        raise SetupError(f"no seccomp filter for this machine ({machine})")
    nr = SYSCALLS[machine]
    rows = [  # (label, code, label if true, label if false, k); None: the next row
        (None, BPF_LD_W_ABS, None, None, 4),
        (None, BPF_JEQ, None, "deny", AUDIT_ARCH[machine]),     # another ABI (i386, arm32): refused
        (None, BPF_LD_W_ABS, None, None, 0),
        *([(None, BPF_JGE, "deny", None, X32_BIT)] if machine == "x86_64" else []),
        (None, BPF_JEQ, "enosys", None, nr["clone3"]),
        (None, BPF_JEQ, "deny", None, nr["setns"]),
        (None, BPF_JEQ, "flags", None, nr["unshare"]),
        (None, BPF_JEQ, "flags", "allow", nr["clone"]),
        ("flags", BPF_LD_W_ABS, None, None, 16),
        (None, BPF_JSET, "deny", "allow", CLONE_NEWUSER),
        ("allow", BPF_RET, None, None, RET_ALLOW),
        ("deny", BPF_RET, None, None, RET_ERRNO | EPERM),
        ("enosys", BPF_RET, None, None, RET_ERRNO | ENOSYS),
    ]
    at = {row[0]: i for i, row in enumerate(rows) if row[0]}
    return [(code, 0 if t is None else at[t] - i - 1, 0 if f is None else at[f] - i - 1, k)
            for i, (_, code, t, f, k) in enumerate(rows)]


def install_seccomp():
    rows = seccomp_program(platform.machine())
    prog = (SockFilter * len(rows))(*[SockFilter(c, t, f, k) for c, t, f, k in rows])
    fprog = SockFprog(len(rows), prog)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp filter")


def lock_in(cfg):
    if cfg.get("nice"):
        os.setpriority(os.PRIO_PROCESS, 0, cfg["nice"])
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    install_seccomp()
    for name, value in cfg.get("limits", {}).items():
        resource.setrlimit(LIMITS[name], (value, value))
    os.chdir(cfg.get("cwd", "/"))


def init(pid):
    """PID 1 of the namespace: reap every orphan until the program ends; exit with its status
    (128 + the signal that killed it). The program is PID 2, so signals reach it as anywhere."""
    libc.prctl(4, 0, 0, 0, 0)                      # PR_SET_DUMPABLE 0: no tracing of this process
    os.closerange(3, 1 << 20)                      # the grader's socket and the status pipe among them
    os.closerange(0, 3)
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        except InterruptedError:
            continue
        if done == pid:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main(argv):
    cfg = json.loads(argv[0])
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    status = cfg.get("status_fd")
    try:
        enter(cfg)
        build_root(cfg)
        lock_in(cfg)
        pid = os.fork()
        if pid:
            init(pid)
        if status is not None:
            os.set_inheritable(status, False)      # closed by execve: the program never holds it
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except (SetupError, OSError) as e:
        text = f"jail: {e}\n"
        sys.stderr.write(text)
        sys.stderr.flush()
        if status is not None:
            try:
                os.write(status, text.encode(errors="replace")[:4000])
            except OSError:
                pass
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The jail: starts one untrusted program in namespaces of its own, seeing an allow-list of files.

Run as ``python -I grader/jail.py CONFIG_JSON`` by grader/sandbox.py (standard library only, so
that nothing outside this file is imported before the program is locked in). CONFIG_JSON holds
no secret; it says which host folders the program may read (``ro``), which it may write
(``rw``: its scratch folder), the devices it gets, its user, limits, command and environment.

1. New user (when not root), mount, network, IPC, UTS and PID namespaces (``unshare``). Without
   root the invoking user is mapped to itself, so the program keeps no capability once it runs.
2. A fork: the child is PID 1 of the new PID namespace (when it ends, every process in it ends
   with it; none can see or signal a process outside). The parent waits and passes the exit
   status on (a death by a signal as the same signal); it dies with the grader (parent-death
   signal) and PID 1 dies with it. PID 1 forks the program (PID 2) at the end of step 4, reaps
   orphans and ends with the program.
3. A new root file system on a tmpfs: the allow-listed folders bound read-only at their own
   paths, the scratch folder read-write at ``/work``, fresh ``/tmp`` and ``/dev/shm``, a ``/dev``
   with the listed nodes only (no GPU unless listed), a ``/proc`` of the new PID namespace; then
   ``pivot_root``, the old root detached, the new root read-only.
4. Root: supplementary groups dropped, the given user and group taken. Then no-new-privileges,
   resource limits, and ``execve`` of the command with exactly the given environment.

Networking: the new network namespace has only a loopback device, down. Everything that fails
here is reported on standard error with exit status 125, before any untrusted byte runs.
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
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
ST_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}  # statvfs -> mount
SETUP_FAILED = 125
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}          # the system call's number
LIMITS = {"cpu_s": resource.RLIMIT_CPU, "file_bytes": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE,
          "memory_bytes": resource.RLIMIT_DATA, "processes": resource.RLIMIT_NPROC, "core": resource.RLIMIT_CORE}

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


def build_root(cfg):
    root = cfg["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    for d in ("/tmp", "/dev/shm"):                # first: allowed folders may lie under /tmp
        os.makedirs(root + d, exist_ok=True)
        mount("tmpfs", root + d, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={cfg.get('tmp_size', '1g')}")
    for src, dst in cfg["ro"]:
        if os.path.exists(src):
            bind(src, root + dst, False)
    for src, dst in cfg["rw"]:
        bind(src, root + dst, True)
    for hidden in cfg.get("hide", []):            # course folders that lie inside an allowed one
        if os.path.isdir(root + hidden):
            mount("tmpfs", root + hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755,size=4k")
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
        for fd in cfg.get("keep_fds", []):
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


def lock_in(cfg):
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for name, value in cfg.get("limits", {}).items():
        resource.setrlimit(LIMITS[name], (value, value))
    os.chdir(cfg.get("cwd", "/"))


def init(pid):
    """PID 1 of the namespace: reap every orphan until the program ends; exit with its status
    (128 + the signal that killed it). The program is PID 2, so signals reach it as anywhere."""
    libc.prctl(4, 0, 0, 0, 0)                      # PR_SET_DUMPABLE 0: no tracing of this process
    for fd in range(3, 1024):
        try:
            os.close(fd)
        except OSError:
            pass
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
    try:
        enter(cfg)
        build_root(cfg)
        lock_in(cfg)
        pid = os.fork()
        if pid:
            init(pid)
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except (SetupError, OSError) as e:
        sys.stderr.write(f"jail: {e}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])

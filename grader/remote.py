"""The grader's view of a submission that runs elsewhere.

Lab grading functions take a ``module`` and call ``grading.student(module, name)(*args)``. In the
notebook's own check cells that module is the notebook's namespace. When grading, it is a
:class:`RemoteSubmission`: every call crosses to the sandboxed child (grader/child.py) as plain
JSON and comes back as plain JSON (so no object of the student's can reach the grader's
comparisons), and a kernel builder's result comes back as a :class:`KernelRef`, which
grader/build.py turns into something runnable or inspectable on the grader's side.

Two backends carry the requests: :class:`ChildBackend` talks to a ChildSession directly (the
grading process), :class:`BrokerBackend` asks the grading process to do it (the GPU harness,
which never talks to the child itself).
"""
from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from typing import Any

from . import channel, spans
from .sandbox import ChildSession, SandboxFailure
from . import sandbox as _sandbox

# The jail could not be set up (sandbox.JailSetupFailed, where the sandbox has it): kept as that
# across the harness's broker, so that grader/verdict.py says it as the machine's failure.
_SETUP_FAILED = getattr(_sandbox, "JailSetupFailed", None)


class StudentError(Exception):
    """The submission's code raised; the message names the notebook cell, ``error_type`` the type
    the child named."""

    def __init__(self, message: str, error_type: str = ""):
        super().__init__(message)
        self.error_type = error_type


class BuildFailed(Exception):
    """The kernel did not compile (lowering, NVRTC, ptxas); the compiler's message follows."""


def _raise_for(reply: dict, what: str) -> None:
    if "error" not in reply:
        return
    msg = str(reply.get("message", ""))
    if reply.get("todo"):
        raise NotImplementedError(msg.splitlines()[0] if msg else what)
    raise StudentError(f"{what} raised {reply.get('error')}: {msg}\n{str(reply.get('traceback', ''))[-1500:]}",
                       str(reply.get("error", "")))


class Builds:
    """The kernels of one submission, shared by the workers that grade it (threads of the grading
    process, each with its own child).

    A builder called again with the same arguments, by any worker, gives the same kernel id
    without running the student's code again; each (kernel, arch) is compiled and exported once.
    A worker whose child did not build a kernel (another worker's did, or an earlier child of its
    own that was stopped before timing) asks its child to build it only when it needs a library
    that nobody has exported. So the grader can build a part's kernels ahead of the part, in
    parallel (grader/run.py), and a timed part whose kernels are all built starts no child.
    Failures are kept too: a builder that raised, or a compile that failed, gives the same
    verdict again at once; a call that timed out or crashed its child fails at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: dict[tuple, threading.Lock] = {}
        self.ids: dict[str, int] = {}                   # call key -> kernel id
        self.calls: dict[int, dict] = {}                # kernel id -> the call that built it
        self.code: dict[tuple[int, str], dict] = {}     # (kernel id, arch) -> device code (plan, PTX, source)
        self.failed: dict[Any, dict] = {}               # call key or (kernel id, arch) -> error reply
        self.broken: dict[str, str] = {}                # call key -> why the child failed on it

    @staticmethod
    def key(msg: dict) -> str:
        return json.dumps([msg["name"], msg.get("args", []), msg.get("kwargs", {})], sort_keys=True)

    def busy(self, what: tuple) -> threading.Lock:
        """A lock per call key or (kernel, arch): two workers never build the same thing at once."""
        with self._lock:
            return self._busy.setdefault(what, threading.Lock())

    def add(self, key: str, msg: dict) -> int:
        with self._lock:
            kid = self.ids.setdefault(key, len(self.ids) + 1)
            self.calls[kid] = msg
            return kid


class ChildBackend:
    """Requests to a sandboxed child, with the time left of the current part."""

    def __init__(self, session: ChildSession, relocate=lambda s: s,
                 import_timeout: float = 180.0, builds: Builds | None = None):
        self.session = session
        self.relocate = relocate
        self.import_timeout = import_timeout
        self.deadline = float("inf")
        self.import_failure: str | None = None
        self.import_failure_class: type = SandboxFailure    # a subclass (the jail's setup failed) is kept
        self.cell_errors: list[str] = []
        self.generation = 0                 # a child's own kernel handles are valid only within it
        self.builds = builds if builds is not None else Builds()
        self.handles: dict[int, tuple[int, int]] = {}   # kernel id -> (generation, the child's handle)

    def ensure_started(self) -> None:
        if self.import_failure:
            raise self.import_failure_class(self.import_failure)
        if self.session.alive:
            return
        t0 = time.monotonic()
        self.generation += 1
        try:
            with spans.span("child_start"):
                self.session.start(self.import_timeout)
        except SandboxFailure as e:
            self.import_failure, self.import_failure_class = self.relocate(str(e)), type(e)
            raise self.import_failure_class(self.import_failure) from None
        self.cell_errors = [self.relocate(c) for c in self.session.cell_errors]
        self.deadline += time.monotonic() - t0      # running the cells has its own time limit

    def _request(self, msg: dict) -> dict:
        self.ensure_started()
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxFailure("the part's time limit ran out")
        with spans.span("child", min_s=0.05, op=msg.get("op"), name=msg.get("name")):
            reply = self.session.request(msg, left)
        if "error" in reply:
            reply["message"] = self.relocate(str(reply.get("message", "")))
            reply["traceback"] = self.relocate(str(reply.get("traceback", "")))
        return reply

    def call(self, name: str, args: list, kwargs: dict, keep_failure: bool = False) -> dict:
        """Call a function of the submission. A kernel it returns is known by an id shared with the
        other workers (see :class:`Builds`); ``keep_failure`` (building ahead of a part) keeps an
        error or a failed child as this call's answer for the part."""
        msg = {"op": "call", "name": name, "args": args, "kwargs": kwargs}
        key, b = Builds.key(msg), self.builds
        with b.busy(("call", key)):
            if key in b.ids:
                return {"kernel": b.ids[key]}
            if key in b.failed:
                return dict(b.failed[key])
            if key in b.broken:
                raise SandboxFailure(b.broken[key])
            try:
                reply = self._request(msg)
            except SandboxFailure as e:
                if keep_failure:
                    b.broken[key] = str(e)
                raise
            if "kernel" in reply:
                kid = b.add(key, msg)
                self.handles[kid] = (self.generation, int(reply["kernel"]))
                return {"kernel": kid}
            if keep_failure and "error" in reply:
                b.failed[key] = dict(reply)
            return reply

    def plot(self, name: str, args: list) -> dict:
        return self._request({"op": "plot", "name": name, "args": args})

    def export(self, kernel: int, arch: str) -> dict:
        """The kernel's device code for ``arch``: {"code": {"plan", "ptx", "cuda_source", "arch"}},
        from the texts the child sent (bounded, parsed as data), or its error reply."""
        what, b = (kernel, arch), self.builds
        with b.busy(("export",) + what):
            if what in b.code:
                return {"code": b.code[what]}
            if what in b.failed:
                return dict(b.failed[what])
            gen, handle = self.handles.get(kernel, (None, 0))
            if gen != self.generation or not self.session.alive:
                if kernel not in b.calls:
                    raise SandboxFailure(f"no kernel {kernel} was built")
                reply = self._request(b.calls[kernel])       # built elsewhere: build it in this child
                if "kernel" not in reply:
                    return reply
                handle = int(reply["kernel"])
                self.handles[kernel] = (self.generation, handle)
            reply = self._request({"op": "export", "kernel": handle, "arch": arch})
            if "device_code" in reply:
                b.code[what] = read_device_code(reply["device_code"], arch)
                return {"code": b.code[what]}
            if "error" in reply:
                b.failed[what] = dict(reply)
            return reply

    def end(self) -> None:
        """Stop the child and everything it started (before the grader times a kernel)."""
        self.session.close()


MAX_PTX = 64 << 20


def read_device_code(texts, arch: str) -> dict:
    """The plan and PTX the child sent (the texts of the files it wrote in its own scratch, which
    the grader does not read), parsed as bounded data; anything odd is a SandboxFailure."""
    if not isinstance(texts, dict) or not all(isinstance(texts.get(k), str) for k in ("json", "ptx")):
        raise SandboxFailure("your process described its kernel files in the wrong shape")
    if any(len(texts[k]) > MAX_PTX for k in ("json", "ptx")):
        raise SandboxFailure(f"your kernel's files are larger than {MAX_PTX >> 20} MB")
    try:
        for k in ("json", "ptx"):
            texts[k].encode("utf-8")                 # text, not bytes passed off as text
        meta = json.loads(texts["json"])
    except ValueError:      # its text (a position in the file) is the submission's to choose: not said
        raise SandboxFailure("your kernel's files are not what the grader asked for (the plan is not JSON, "
                             "or a file is not text)") from None
    if not isinstance(meta, dict) or meta.get("arch") != arch or not isinstance(meta.get("cuda_source"), str):
        raise SandboxFailure("your kernel's files are for another arch or incomplete")
    return {"plan": meta.get("plan"), "ptx": texts["ptx"], "cuda_source": meta["cuda_source"], "arch": arch}


class BrokerBackend:
    """The GPU harness's backend: each request goes to the grading process, which owns the child."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def _ask(self, msg: dict) -> dict:
        channel.send(self.sock, {"need": msg})
        reply = channel.recv(self.sock)
        if "sandbox_failure" in reply:      # the jail's setup failing stays that (grader/verdict.py)
            raise (_SETUP_FAILED if reply.get("setup_failed") and _SETUP_FAILED else SandboxFailure)(
                reply["sandbox_failure"])
        return reply

    def call(self, name, args, kwargs):
        return self._ask({"op": "call", "name": name, "args": args, "kwargs": kwargs})

    def plot(self, name, args):
        return self._ask({"op": "plot", "name": name, "args": args})

    def export(self, kernel, arch):
        return self._ask({"op": "export", "kernel": kernel, "arch": arch})

    def end(self) -> None:
        self._ask({"op": "end"})


def serve_broker_request(backend: ChildBackend, msg: dict) -> dict:
    """What the grading process answers to a harness's request."""
    try:
        op = msg.get("op")
        if op == "call":
            return backend.call(msg["name"], msg.get("args", []), msg.get("kwargs", {}))
        if op == "plot":
            return backend.plot(msg["name"], msg.get("args", []))
        if op == "export":
            return backend.export(int(msg["kernel"]), str(msg["arch"]))
        if op == "end":
            backend.end()
            return {"ok": True}
        return {"sandbox_failure": f"unknown request {op!r}"}
    except SandboxFailure as e:
        return {"sandbox_failure": str(e), "setup_failed": bool(_SETUP_FAILED and isinstance(e, _SETUP_FAILED))}


@dataclasses.dataclass
class KernelRef:
    """A kernel the submission built, still inside the child: build.lower / compile_only ask the
    child to lower it for an arch and take its PTX and launch plan (grader/devcode.py) as data."""
    backend: Any
    kernel: int
    builder: str
    args: tuple

    def device_code(self, arch: str) -> dict:
        reply = self.backend.export(self.kernel, arch)
        if "error" in reply:
            if reply.get("todo"):
                raise NotImplementedError(str(reply.get("message", "")).splitlines()[0])
            raise BuildFailed(f"{self.builder}{self.args} for {arch}: {reply.get('error')}: "
                              f"{str(reply.get('message', ''))[:3000]}")
        code = reply.get("code")
        if not isinstance(code, dict) or not isinstance(code.get("ptx"), str):
            raise SandboxFailure("the kernel's device code was not delivered")
        return code


class Table2D:
    """A function of (i, j) given as a table, so that it can be an argument of a remote call
    (functions cannot cross the boundary; their values can)."""

    def __init__(self, fn, rows: int, cols: int):
        self.table = [[int(fn(i, j)) for j in range(cols)] for i in range(rows)]

    def __call__(self, i: int, j: int) -> int:
        return self.table[i][j]


def _encode(x):
    if isinstance(x, Table2D):
        return {"__table2d__": x.table}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    return x


class RemoteLayout:
    """A layout object the submission returned, kept in the child; ``apply`` asks it there."""
    is_layout = True

    def __init__(self, backend, handle: int, type_name: str):
        self.backend, self.handle, self.type_name = backend, handle, type_name

    def apply(self, *coords, shape=None) -> dict:
        reply = self.backend.call("__apply__", [self.handle, list(coords), shape], {})
        _raise_for(reply, f"{self.type_name}.apply")
        value = reply.get("value")
        if not isinstance(value, dict):
            raise SandboxFailure("layout.apply: an answer of the wrong shape")
        return value


class RemoteFunction:
    def __init__(self, backend, name: str):
        self.backend = backend
        self.name = name

    def __call__(self, *args, **kwargs):
        reply = self.backend.call(self.name, _encode(list(args)), _encode(kwargs))
        _raise_for(reply, f"{self.name}()")
        if "kernel" in reply:
            return KernelRef(self.backend, int(reply["kernel"]), self.name, args)
        if "layout" in reply:
            return RemoteLayout(self.backend, int(reply["layout"]), str(reply.get("type", "layout")))
        if "value" not in reply:
            raise SandboxFailure(f"{self.name}(): an answer of the wrong shape")
        return reply["value"]

    def figure(self, *args) -> list[dict]:
        """Call a plotting function (its last argument, a path, is added) and describe what it
        drew: one dict per axes (scales, lines, points, images, texts)."""
        reply = self.backend.plot(self.name, list(args))
        _raise_for(reply, f"{self.name}()")
        fig = reply.get("figure")
        if not isinstance(fig, list):
            raise SandboxFailure(f"{self.name}(): a figure description of the wrong shape")
        return fig


class RemoteSubmission:
    """``grading.student(module, name)`` on this returns a RemoteFunction."""

    def __init__(self, backend):
        self._backend = backend

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return RemoteFunction(self._backend, name)

    def end_student_code(self) -> None:
        self._backend.end()

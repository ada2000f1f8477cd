"""The untrusted side: ``python -m grader.child FD MODULE_PATH``, started by grader/sandbox.py in
a scratch folder, with an empty environment, resource limits and (where the machine allows)
an unprivileged user.

It runs the notebook's module cells one by one, as "run all" in Jupyter would (a cell that
raises is reported and the next cells still run), then answers requests on the socket FD:

- ``call``: call a function of the submission with plain JSON arguments; the answer is plain
  JSON. A kernel builder's PrimFunc stays here and is answered with a handle.
- ``export``: lower a handled kernel for an arch (grader/devcode.py writes its PTX and launch
  plan into the scratch folder) and send both files' text in the answer (the grader reads no
  file of this process's); the grader validates them, assembles the PTX itself and never loads
  host code made here.
- ``plot``: call a plotting function with a fresh path and describe the figure it drew.

Nothing here is trusted by the grader: this process holds no seed, no expected value, no timer
and no result, and every answer it sends is validated by the caller.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import traceback

from . import channel

MAX_POINTS = 400           # per plotted line or scatter, in a figure description


def _plain(x, depth=0):
    """A JSON-able copy of ``x`` made of dict/list/str/int/float/bool/None, or TypeError."""
    if depth > 20:
        raise TypeError("nested too deeply")
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, (list, tuple)):
        return [_plain(v, depth + 1) for v in x]
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"dictionary key of type {type(k).__name__}")
            out[str(k)] = _plain(v, depth + 1)
        return out
    if isinstance(x, (set, frozenset)):
        return sorted(_plain(v, depth + 1) for v in x)
    t = type(x).__module__ + "." + type(x).__name__
    if t.startswith("numpy.") and hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
        return _plain(x.item(), depth + 1)
    if t.startswith(("numpy.", "torch.")) and hasattr(x, "tolist"):
        return _plain(x.tolist(), depth + 1)
    raise TypeError(f"an object of type {type(x).__name__}")


def _decode(x):
    """Arguments as the grader encodes them: a {"__table2d__": rows} is a function of (i, j)."""
    if isinstance(x, dict) and "__table2d__" in x:
        table = x["__table2d__"]
        return lambda i, j: table[i][j]
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, dict):
        return {k: _decode(v) for k, v in x.items()}
    return x


def _is_layout(value) -> bool:
    try:
        from tvm.tirx.layout import Layout
    except ImportError:
        return False
    return isinstance(value, Layout)


def _run_cells(path: str, namespace: dict) -> list[str]:
    """Execute the module file cell by cell (cells start after '# ---- cell' marker lines)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    marks = [i for i, ln in enumerate(lines) if ln.startswith("# ---- cell")] + [len(lines)]
    errors = []
    for a, b in zip(marks, marks[1:]):
        label = lines[a][len("# ---- "):]
        src = "\n" * (a + 1) + "\n".join(lines[a + 1:b])
        try:
            exec(compile(src, path, "exec"), namespace)
        except BaseException as e:  # noqa: BLE001 - any failure of a cell is reported, not fatal
            tb = traceback.format_exception(type(e), e, e.__traceback__, limit=-3)
            said = _explained(e)             # a lowering TIRx could not find: its lines, not its table
            errors.append(f"{label} raised {type(e).__name__}: {said or e}\n" + ("" if said else "".join(tb[-3:])))
    return errors


def _is_todo(e: BaseException) -> bool:
    return isinstance(e, NotImplementedError) or "is not implemented yet" in str(e)


def build_message(e: BaseException, keep: int = 40) -> str:
    """A TIRx/TVM build error as the student needs it: a lowering TIRx could not find, said in a
    few lines with what the course does instead (grader/hints.py); else TVM's own diagnostic (the
    kernel's lines, the caret, the error) without the C++ and Python stacks that follow or
    precede it."""
    said = _explained(e)
    if said is not None:
        return said
    text = str(e)
    lines = [ln for ln in text.splitlines()
             if not ln.lstrip().startswith(("File \"", "at ", "Traceback", "  File"))
             and not ln.strip().startswith(("0:", "1:", "2:", "3:", "4:", "5:", "6:", "7:", "8:", "9:"))]
    out = "\n".join(lines).strip() or f"{type(e).__name__}"
    lines = out.splitlines()
    if len(lines) > keep:
        out = "\n".join(lines[:keep // 2] + [f"[... {len(lines) - keep} lines ...]"] + lines[-keep // 2:])
    return out


def _explained(e: BaseException) -> str | None:
    """grader/hints.py's few lines for ``e`` (a TIRx dispatch failure), or None. The jail's course
    copy holds the modules grader/sandbox.py lists (CHILD_MODULES): without hints.py there, TVM's
    text is stripped as before."""
    try:
        from . import hints
    except ImportError:
        return None
    return hints.explain(e)


class Child:
    def __init__(self, sock: socket.socket, module_path: str):
        self.sock = sock
        self.module_path = module_path
        self.kernels: dict[int, object] = {}
        self.built: dict[str, int] = {}
        self.exported: dict[tuple, str] = {}
        import types
        mod = types.ModuleType("submission")
        mod.__file__ = module_path
        sys.modules["submission"] = mod
        self.ns = mod.__dict__
        self.cell_errors = _run_cells(module_path, self.ns)

    def _fn(self, name: str):
        fn = self.ns.get(name)
        if fn is None or not callable(fn):
            raise LookupError(f"the notebook defines no {name}(): keep the function names of the skeleton")
        return fn

    def op_call(self, req):
        if req["name"] == "__apply__":             # a layout returned earlier, applied to coordinates
            handle, coords, shape = req["args"]
            out = self.kernels[int(handle)].apply(*coords, **({"shape": list(shape)} if shape else {}))
            return {"value": {str(k): int(v) for k, v in out.items()}}
        args = [_decode(a) for a in req.get("args", [])]
        kwargs = {k: _decode(v) for k, v in req.get("kwargs", {}).items()}
        key = json.dumps([req["name"], req.get("args", []), req.get("kwargs", {})], sort_keys=True)
        if key in self.built:                      # the same builder with the same arguments: built already
            return {"kernel": self.built[key]}
        value = self._fn(req["name"])(*args, **kwargs)
        if type(value).__name__ == "PrimFunc":
            kid = len(self.kernels) + 1
            self.kernels[kid] = value
            self.built[key] = kid
            return {"kernel": kid}
        if _is_layout(value):
            kid = len(self.kernels) + 1
            self.kernels[kid] = value
            return {"layout": kid, "type": type(value).__name__}
        try:
            return {"value": _plain(value)}
        except TypeError as e:
            return {"error": "TypeError", "message": f"{req['name']}() returned {e}; return plain numbers, "
                    "strings, lists, tuples or dicts", "todo": False}

    def op_export(self, req):
        from . import devcode
        key = (int(req["kernel"]), str(req["arch"]))
        if key not in self.exported:
            stem = f"kernel{key[0]}_{''.join(c for c in key[1] if c.isalnum())}"
            try:
                files = devcode.export(self.kernels[key[0]], key[1], os.path.join(os.getcwd(), stem))
            except devcode.HostCodeRefused as e:
                return {"error": "HostCodeRefused", "message": str(e), "todo": False}
            except Exception as e:  # noqa: BLE001 - a TIRx or NVRTC error is the student's message
                return {"error": type(e).__name__, "message": build_message(e), "todo": _is_todo(e)}
            self.exported[key] = {k: str(v) for k, v in files.items()}
        code = {}
        for k in ("json", "ptx"):
            with open(self.exported[key][k], encoding="utf-8", errors="surrogateescape") as f:  # the grader judges
                code[k] = f.read()
        return {"device_code": code}

    def op_plot(self, req):
        path = os.path.join(os.getcwd(), "figure.png")
        if os.path.exists(path):
            os.remove(path)
        figure = draw(self._fn(req["name"]), req.get("args", []), path)
        return {"figure": figure, "png_bytes": os.path.getsize(path) if os.path.exists(path) else 0}

    def student_frames(self, e: BaseException) -> str:
        """The traceback of ``e`` through the notebook's cells only (the grader's frames say
        nothing to a student), at most the last four."""
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == self.module_path]
        return "".join(traceback.format_list(frames[-4:]))[-4000:]

    def serve(self) -> None:
        channel.send(self.sock, {"ready": True, "cell_errors": self.cell_errors})
        while True:
            try:
                req = channel.recv(self.sock)
            except channel.ChannelClosed:
                return
            try:
                reply = getattr(self, "op_" + req["op"])(req)
            except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
                msg = str(e)
                todo = isinstance(e, NotImplementedError) or "is not implemented yet" in msg
                reply = {"error": type(e).__name__, "message": msg[:4000], "traceback": self.student_frames(e),
                         "todo": todo}
            channel.send(self.sock, reply)


def draw(fn, args, path: str) -> list[dict]:
    """Call a plotting function with ``args`` and ``path`` and describe the figures it saved (or,
    if it saved none, the figures left open)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.figure
    import matplotlib.pyplot as plt
    plt.close("all")
    saved, original = [], matplotlib.figure.Figure.savefig

    def savefig(fig, *a, **k):           # describe each figure as it is saved
        saved.append(fig)
        return original(fig, *a, **k)

    matplotlib.figure.Figure.savefig = savefig
    try:
        fn(*args, path)
    finally:
        matplotlib.figure.Figure.savefig = original
    return describe_figures(saved or [plt.figure(n) for n in plt.get_fignums()])


def describe_figures(figures) -> list[dict]:
    """What the figures show: per axes its scales, limits, labels, lines, scatter points, images
    (small ones, as nested lists) and texts."""
    def pts(xs, ys):
        xs, ys = list(map(float, xs)), list(map(float, ys))
        step = max(1, math.ceil(len(xs) / MAX_POINTS))
        return [[x, y] for x, y in zip(xs[::step], ys[::step])]

    axes = []
    for fig in figures:
        for ax in fig.get_axes():
            d = {"xscale": ax.get_xscale(), "yscale": ax.get_yscale(), "xlim": list(map(float, ax.get_xlim())),
                 "ylim": list(map(float, ax.get_ylim())), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                 "title": ax.get_title(), "lines": [], "points": [], "images": [],
                 "texts": [t.get_text() for t in ax.texts][:2000]}
            for ln in ax.get_lines():
                d["lines"].append(pts(ln.get_xdata(), ln.get_ydata()))
            for coll in ax.collections:
                offs = coll.get_offsets()
                if len(offs):
                    d["points"].extend(pts([o[0] for o in offs], [o[1] for o in offs]))
            for im in ax.images:
                arr = im.get_array()
                if arr is not None and arr.ndim == 2 and arr.shape[0] * arr.shape[1] <= 4096:
                    d["images"].append([[float(v) for v in row] for row in arr.tolist()])
            axes.append(d)
    return axes


def main(argv: list[str]) -> int:
    fd, module_path = int(argv[0]), argv[1]
    sock = socket.socket(fileno=fd)
    try:
        Child(sock, module_path).serve()
    except channel.ChannelClosed:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

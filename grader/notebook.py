"""Helpers called from the lab notebooks' cells.

- ``check(lab, part, globals())`` (a part's check cell) runs the part's public cases on the live
  objects of the notebook, in the notebook's process, with the grader's own grading function. It
  prints one verdict line when the part is fully right (or skipped: a GPU part without a GPU) and
  otherwise stops the cell with that line alone, said once: no traceback of the grader, a kernel
  that does not parse shows TIRx's own error lines, an error in your code shows the lines of your
  cells, and a wrong kernel output says where (shape, how many elements, the first indices, the
  largest error) and draws a heat map of the wrong tiles of a matrix. Kernels are compiled,
  launched and timed the way the grader does (:func:`compile_kernel`, :func:`time_calls`): the
  same arch, the same launch plan and driver launch (build.local_kernel), the same timing code (grader/timing.py via grading.timed_ratio), and a
  speed part below full credit is measured again, best of ``verdict.PERF_TRIALS``. The verdict is
  grader/verdict.py's, the rule the grader applies. A function whose cell, as last run, has a
  syntax error is said as that: the cell and the line, not a missing name nor the definition an
  earlier run of the cell left behind (:class:`_Cells` reads what this kernel ran). Cells are named
  as the grader names them, "cell 8 (a_bytes)": the position in the saved notebook and the
  cell's grade id.
- ``grade(lab, part)`` is what the locked graded cells call. It is not a source of scores:
  ``nbgrader autograde`` never runs the notebook (grader/classroom/nbgrader_autograde.py grades the saved
  file with ``python -m grader check`` and fills the graded cells in). Run by a student, it says
  so and repeats what the check cell above found in this kernel; it runs nothing (well under a
  second) and returns nothing.
- ``grade_notebook(lab)`` (the optional last cell) grades the saved notebook as the instructor
  will: ``python -m grader check LAB --submission NOTEBOOK`` in a subprocess, its lines shown as
  they come.
"""
from __future__ import annotations

import ast
import functools
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback
import types

from . import hardware, hints, inputs, report, spec, submission, toolchain, verdict
from .context import Context

_RESULTS: dict[tuple[str, str], report.PartResult] = {}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRADER_DIR = os.path.join(ROOT, "grader")


class CheckFailed(AssertionError):
    """A check cell's part is not fully right. Jupyter shows its message alone, once (IPython's
    ``_render_traceback_``); elsewhere it is an AssertionError with that message."""

    def __init__(self, text: str, result: report.PartResult | None = None):
        super().__init__(text)
        self.result = result

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        return ["\x1b[1;31m" + lines[0] + "\x1b[0m"] + lines[1:]


@functools.lru_cache(maxsize=None)
def _spec(lab: str) -> spec.LabSpec:
    return spec.load(lab)


@functools.lru_cache(maxsize=1)
def _device() -> hardware.Device:
    return hardware.detect()


def last_result(lab: str, part_id: str) -> report.PartResult | None:
    """The verdict of the last check of ``part_id`` in this process (None before any)."""
    return _RESULTS.get((lab, part_id))


# ---------------------------------------------------------------- the check cell

def check(lab: str, part_id: str, namespace: dict) -> None:
    lab_spec = _spec(lab)
    part = lab_spec.part(part_id)
    device = _device()
    if part.needs_gpu and not device.present:
        res = report.PartResult(lab, part_id, part.title, 0.0, part.points, report.SKIPPED,
                                f"needs a GPU ({device.reason}); the autograder runs it on one", True)
        _RESULTS[(lab, part_id)] = res
        print(verdict_text(res))
        return None
    start = time.perf_counter()
    res, mismatch = _run_part(lab, part, namespace, device)
    if _is_speed(part) and res.verdict in (report.PARTIAL, report.FAILED) and "ratio" in res.measurements:
        res = verdict.perf_trials(res, lambda: _run_part(lab, part, namespace, device)[0])
    _RESULTS[(lab, part_id)] = res
    text = verdict_text(res, time.perf_counter() - start)
    if res.verdict in (report.PASSED, report.SKIPPED):
        print(text)
        return None
    if mismatch.found:
        mismatch.draw()
    raise CheckFailed(text, res) from None


def _run_part(lab: str, part: spec.Part, namespace: dict, device) -> tuple[report.PartResult, "_Mismatch"]:
    mismatch = _Mismatch()
    ctx = Context(_spec(lab), part, inputs.PUBLIC_SEED, device, public_only=True, on_mismatch=mismatch)
    from . import timing
    hang_s, timing.HANG_S = timing.HANG_S, float(part.params.get("hang_s", timing.HANG_S))   # as the harness does
    try:
        # kernels compiled and loaded as the grader loads them (_KERNELS)
        module = _module(namespace, part, _Cells.current(namespace, lab).broken())
        return verdict.grade_part(module, ctx, lower=_KERNELS, describe=describe_error), mismatch
    except timing.KernelHang as e:
        return ctx.error_result(report.ERROR, f"timed out: {e}: most likely a barrier wait that never completes. "
                                "The GPU is still running it: restart the notebook's kernel before the next GPU "
                                "cell."), mismatch
    finally:
        timing.HANG_S = hang_s


class CellSyntaxError(Exception):
    """A function the part grades is defined in a cell whose last run did not compile."""


class _NotebookModule:
    """The notebook's names as the submission's module: a name whose defining cell, as last run,
    has a syntax error raises CellSyntaxError instead of giving what an earlier run left behind."""

    def __init__(self, namespace: dict, broken: dict[str, str], wrap=lambda v: v):
        self._namespace, self._broken, self._wrap = namespace, broken, wrap

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._broken:
            raise CellSyntaxError(self._broken[name])
        try:
            return self._wrap(self._namespace[name])
        except KeyError:
            raise AttributeError(name) from None


def _module(namespace: dict, part: spec.Part, broken: dict[str, str] | None = None) -> _NotebookModule:
    """The notebook's names as the submission's module. For a part that builds kernels, each
    function of the notebook runs in a fresh thread when the grader calls it (build.in_fresh_thread:
    TIRx's parser is about twice as fast there as under the cell's deep stack)."""
    if part.kind not in ("build", "kernel"):
        return _NotebookModule(namespace, broken or {})
    from . import build

    def shallow(fn):
        if not isinstance(fn, types.FunctionType):
            return fn

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return build.in_fresh_thread(fn, *args, **kwargs)
        return call
    return _NotebookModule(namespace, broken or {}, shallow)


def _is_speed(part: spec.Part) -> bool:
    return bool(part.thresholds)


def verdict_text(res: report.PartResult, seconds: float | None = None) -> str:
    """One line for a check cell (the message's further details indented below it)."""
    mark = {report.PASSED: "PASS", report.PARTIAL: "PARTIAL", report.FAILED: "FAIL", report.ERROR: "ERROR",
            report.SKIPPED: "SKIP", report.INFRASTRUCTURE: "NOT GRADED"}[res.verdict]
    took = f", {seconds:.1f} s" if seconds is not None and seconds >= 0.5 else ""
    if res.verdict == report.SKIPPED:
        head = f"[{mark}] {res.lab}/{res.part}"
    else:
        head = (f"[{mark}] {res.lab}/{res.part}: {report.format_points(res.points)} / "
                f"{report.format_points(res.max_points)} on the public cases{took}")
    msg = res.message
    # A one-line message of several checks ("sm_90a: ... | sm_100a: ...") reads better one per line;
    # a message of several lines (TIRx's diagnostic, whose source lines hold " | ") stays as it is.
    body = msg.split(" | ") if "\n" not in msg else msg.splitlines()
    if len(body) == 1 and len(head) + len(body[0]) < 150:
        return f"{head}: {body[0]}"
    return head + "".join(f"\n    {ln}" for ln in body)


# ---------------------------------------------------------------- errors, in the student's terms

def _cell_names() -> dict[str, str]:
    """IPython's file name of each executed cell -> the cell's name, "cell 8 (a_bytes)" as the
    grader says it (see :class:`_Cells`)."""
    shell = _shell()
    if shell is None:
        return {}
    names = getattr(getattr(shell, "compile", None), "_filename_map", {}) or {}
    cells = _Cells.current(shell.user_ns)
    return {fname: cells.label(n) for fname, n in names.items()}


def _rename_cells(text: str, names: dict[str, str]) -> str:
    for fname, label in names.items():
        text = text.replace(fname, label)
    return text


def _is_students(filename: str) -> bool:
    """A frame of the student's notebook (not the grader's, TVM's, torch's or Python's)."""
    path = os.path.abspath(filename) if os.path.sep in filename else filename
    if path.startswith(GRADER_DIR + os.sep) or "site-packages" in path or "dist-packages" in path:
        return False
    return not path.startswith((os.path.dirname(os.__file__) + os.sep, "<frozen"))


def describe_error(e: BaseException) -> str:
    """An exception raised while a check ran, in the student's terms: TIRx's own diagnostic for a
    kernel that does not parse or lower (no compiler stack), else the lines of the student's cells
    that raised and the exception, without the grader's frames."""
    names = _cell_names()
    name = type(e).__name__
    text = _rename_cells(str(e).strip(), names)
    if isinstance(e, CellSyntaxError):
        return text
    said = hints.explain(e)            # a lowering TIRx could not find: a few lines, not TVM's table
    if said is not None:
        return _rename_cells(said, names)
    if name == "DiagnosticError":
        return "your kernel does not parse (TIRx):\n" + text
    module = type(e).__module__ or ""
    if module.startswith(("tvm", "tvm_ffi")) or name in ("TVMError", "InternalError"):
        keep = []
        for line in text.splitlines():
            if re.match(r"^\s*(Stack trace|Traceback|File \"|\d+: |\[bt\])", line):
                break
            keep.append(line)
        return f"{name} while compiling your kernel: " + "\n".join(keep[:20])
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _is_students(f.filename)]
    where = []
    for f in frames[-4:]:
        label = names.get(f.filename) or os.path.basename(f.filename)
        where.append(f"In {label}, line {f.lineno}, in {f.name}" + (f": {f.line.strip()}" if f.line else ""))
    return "\n".join([f"{name}: {text}" if text else name] + where)


# ---------------------------------------------------------------- the cells this kernel ran

def _shell():
    """The IPython shell this process runs in, or None (a script, a test)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


_DEFINES = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)|^\s*(\w+)\s*(?::[^=\n]*)?=(?!=)", re.M)


def _defined_names(source: str) -> set[str]:
    """The names a cell's source defines (def, class, assignment), read from its text: a cell
    with a syntax error cannot be parsed."""
    return {a or b for a, b in _DEFINES.findall(source)}


class _Cells:
    """What this kernel ran, cell by cell, from IPython's history (``In``, one entry per run, in
    order) and, for each run, the id of the notebook cell it came from (recorded by a
    ``post_run_cell`` hook that importing this module registers: Jupyter sends the cell's id with
    each run). A run is named as the grader names a cell, by its position in the saved notebook and
    its grade id ("cell 8 (a_bytes)"), found by the cell's id or, failing that, by its source; a run
    of a cell the saved notebook does not hold (not saved yet) is "the cell run as In[9]"."""

    def __init__(self, runs: list[tuple[int, str, str]], saved: list[dict], ids: dict[int, str]):
        self.runs = runs                # (execution count, source as IPython compiled it, as typed)
        self.saved = saved              # the saved notebook's cells: {"index", "id", "grade_id", "source"}
        self.ids = ids                  # execution count -> the id of the notebook cell it ran

    @classmethod
    def current(cls, namespace: dict, lab: str | None = None) -> "_Cells":
        shell = _shell()
        if shell is None or namespace is not getattr(shell, "user_ns", None):
            return cls([], [], {})
        cls.watch(shell)
        parsed = list(getattr(shell.history_manager, "input_hist_parsed", []) or [])
        raw = list(getattr(shell.history_manager, "input_hist_raw", []) or [])
        runs = [(n, src, raw[n] if n < len(raw) and isinstance(raw[n], str) else src)
                for n, src in enumerate(parsed) if n > 0 and isinstance(src, str)]
        return cls(runs, cls._saved(namespace, lab), shell._grader_cell_ids)

    @staticmethod
    def watch(shell) -> None:
        """Record the cell id of every run of ``shell`` from now on (once per shell)."""
        if shell is None or hasattr(shell, "_grader_cell_ids"):
            return
        ids: dict[int, str] = {}
        shell._grader_cell_ids = ids

        def ran(result) -> None:
            cell_id = getattr(getattr(result, "info", None), "cell_id", None)
            if cell_id and getattr(result, "execution_count", None) is not None:
                ids[result.execution_count] = cell_id
        shell.events.register("post_run_cell", ran)

    @staticmethod
    def _saved(namespace: dict, lab: str | None) -> list[dict]:
        """The cells of the saved notebook: the one Jupyter names (``__session__``) or the lab's in
        the working folder."""
        paths = [namespace.get("__session__")] + ([os.path.join(os.getcwd(), _spec(lab).notebook)] if lab else [])
        for path in paths:
            if isinstance(path, str) and path.endswith(".ipynb") and os.path.isfile(path):
                try:
                    with open(path) as f:
                        cells = json.load(f)["cells"]
                    return [{"index": i, "id": c.get("id"), "source": submission._text(c.get("source")) or "",
                             "grade_id": ((c.get("metadata") or {}).get("nbgrader") or {}).get("grade_id", "")}
                            for i, c in enumerate(cells) if isinstance(c, dict)]
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    continue
        return []

    def label(self, count: int) -> str:
        """The name of run ``count``, as the grader names the cell."""
        cell_id = self.ids.get(count)
        source = next((raw for n, _, raw in self.runs if n == count), None)
        for c in self.saved:
            if (cell_id and c["id"] == cell_id) or (not cell_id and source is not None
                                                      and c["source"].strip() == source.strip()):
                return submission.Cell(c["index"], c["grade_id"], c["source"]).label
        return f"the cell run as In[{count}]"

    def broken(self) -> dict[str, str]:
        """name -> why it cannot be used: the last run of a cell that defines it did not compile."""
        last: dict[str, tuple[int, str]] = {}
        for count, source, _ in self.runs:
            for name in _defined_names(source):
                last[name] = (count, source)
        out = {}
        for name, (count, source) in last.items():
            error = _syntax_error(source)
            if error is not None:
                line = (error.text or "").strip()
                out[name] = (f"{self.label(count)} has a syntax error (line {error.lineno}): {error.msg}"
                             + (f": {line}" if line else "") + f"; {name}() cannot be used until that cell runs "
                             "without one")
        return out


def _syntax_error(source: str) -> SyntaxError | None:
    """The SyntaxError IPython met compiling ``source`` (top-level await allowed, as in a cell)."""
    try:
        compile(source, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as e:
        return e
    except (ValueError, OverflowError, MemoryError):
        return None
    return None


# ---------------------------------------------------------------- where a kernel's output is wrong

class _Mismatch:
    """Told of wrong kernel outputs by the grading function (Context.on_mismatch); keeps the first
    one and draws, for a matrix, the share of wrong elements in each tile."""

    MAX_TILES = 64    # per axis

    def __init__(self) -> None:
        self.found = False
        self.what = ""
        self.shape: tuple[int, ...] = ()
        self.grid = None
        self.tile = (1, 1)

    def __call__(self, what: str, got, expected, tol) -> None:
        if self.found or got.dim() < 2:
            return
        from . import compare
        bad, _, _ = compare.mismatches(got, expected, tol)
        rows, cols = math.prod(got.shape[:-1]), got.shape[-1]
        bad = bad.reshape(rows, cols).float()
        th, tw = _tile_size(rows, self.MAX_TILES), _tile_size(cols, self.MAX_TILES)
        pad_r, pad_c = -rows % th, -cols % tw
        import torch
        padded = torch.nn.functional.pad(bad, (0, pad_c, 0, pad_r))
        counts = padded.reshape((rows + pad_r) // th, th, (cols + pad_c) // tw, tw).sum(dim=(1, 3))
        sizes = torch.nn.functional.pad(torch.ones(rows, cols), (0, pad_c, 0, pad_r))
        sizes = sizes.reshape((rows + pad_r) // th, th, (cols + pad_c) // tw, tw).sum(dim=(1, 3))
        self.grid = (counts / sizes).numpy()
        self.found, self.what, self.shape, self.tile = True, what, tuple(got.shape), (th, tw)

    def draw(self) -> None:
        """Show the heat map in the notebook (nothing outside IPython)."""
        try:
            from IPython.display import display
            get_ipython()  # type: ignore[name-defined]  # noqa: F821
        except (ImportError, NameError):
            return
        display(self.figure())

    def figure(self):
        import matplotlib
        from matplotlib.figure import Figure
        fig = Figure(figsize=(6.4, 4.2), dpi=100)
        ax = fig.subplots()
        img = ax.imshow(self.grid, cmap="Reds", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
        fig.colorbar(img, ax=ax, label="share of wrong elements")
        th, tw = self.tile
        lead = "x".join(str(s) for s in self.shape[:-1])
        ax.set_xlabel(f"column tile ({tw} columns each)")
        ax.set_ylabel(f"row tile ({th} rows of {lead} each)" if len(self.shape) > 2 else f"row tile ({th} rows each)")
        wrong = int((self.grid > 0).sum())
        ax.set_title(f"where {self.what.split(' (')[0]} is wrong: {wrong} of {self.grid.size} tiles\n"
                     f"{self.what}", fontsize=9)
        del matplotlib
        return fig


def _tile_size(n: int, max_tiles: int) -> int:
    """The smallest power of two that cuts ``n`` into at most ``max_tiles`` tiles."""
    t = 1
    while -(-n // t) > max_tiles:
        t *= 2
    return t


# ---------------------------------------------------------------- kernels, as the grader runs them

class _Kernels:
    """Kernels compiled in the notebook the way the grader runs them (build.local_kernel): the
    launch plan read from the host code TIRx generates, the PTX assembled by ptxas, the cubin
    loaded and launched through the CUDA driver by launch.Kernel, as the GPU harness does. So a
    check cell's timings are those of the same launch path the grader times. A kernel whose
    PrimFunc is unchanged is not compiled again."""

    def __init__(self) -> None:
        self.cache: dict[tuple, list] = {}

    def lower(self, prim_func, arch: str | None = None):
        """(callable, CUDA source) of ``prim_func`` for the GPU present (or ``arch``)."""
        from . import build
        arch = arch or build.device_arch()
        return build.by_structure(self.cache, prim_func, arch, lambda: build.local_kernel(prim_func, arch))

    __call__ = lower

    def prefetch(self, prim_funcs: list, arch: str | None = None) -> None:
        """Start the compiles of a part's kernels side by side (build.prefetch)."""
        from . import build
        build.prefetch(prim_funcs, arch)


_KERNELS = _Kernels()
# A notebook compiles dozens of kernels in its kernel process: NVRTC parses the CUDA headers once.
toolchain.reuse_headers()
# The notebook's setup cell imports this module: from then on each run's cell id is recorded.
_Cells.watch(_shell())
# A TIRx parse error that ends a script (a notebook run as one) prints its text, not TVM's note.
hints.install_excepthook()


def compile_kernel(prim_func):
    """A TIRx kernel compiled for this GPU and loaded as the grader loads it; call it with torch
    tensors and scalars, ``kernel(x, y, out, 0.5)``."""
    return _KERNELS.lower(prim_func)[0]


def time_calls(calls: dict, work: dict | None = None) -> dict:
    """Median seconds of each call, timed as the grader times (grader/timing.py): interleaved,
    CUDA events around each call, L2 overwritten before each, until the spread is small. ``work``
    (optional, name -> bytes) adds the bandwidth in TB/s. Returns {name: {"median_s", ...}}."""
    from . import timing
    device = _device()
    if not device.present:
        raise RuntimeError(f"timing needs a GPU: {device.reason}")
    stats = timing.measure_interleaved(dict(calls), timing.CudaEventClock(),
                                       timing.L2Flusher(device.spec.l2_mib << 20))
    out = {name: s.summary() for name, s in stats.items()}
    for name, nbytes in (work or {}).items():
        out[name]["TB/s"] = nbytes / out[name]["median_s"] / 1e12
    return out


# ---------------------------------------------------------------- the graded cell

def grade(lab: str, part_id: str) -> None:
    part = _spec(lab).part(part_id)
    where = "on a GPU, " if part.needs_gpu else ""
    unit = "point" if part.points == 1 else "points"
    print(f"{lab}/{part_id} ({report.format_points(part.points)} {unit}): the autograder grades this part from "
          f"your saved notebook ({where}public and hidden cases, in its own processes); this cell gives no points.")
    print("    " + _last_check(_RESULTS.get((lab, part_id))))
    return None


def _last_check(res: report.PartResult | None) -> str:
    if res is None:
        return "Its check cell above has not run in this kernel: run it for the public cases."
    if res.verdict == report.SKIPPED:
        return "Its check cell above skipped it here: " + res.message.split(";")[0] + "."
    score = f"{report.format_points(res.points)} / {report.format_points(res.max_points)}"
    return f"Its check cell above, in this kernel: {res.verdict}, {score} on the public cases."


# ---------------------------------------------------------------- the last cell: the saved notebook

GRADE_TIMEOUT_S = 3600


STUDENT_EDITION = os.path.exists(os.path.join(ROOT, ".student-edition"))   # written by grader/edition/release.py


def grade_notebook(lab: str, notebook: str | None = None, public: bool | None = None,
                   parts: list[str] | None = None, report_json: str | None = None) -> None:
    """Grade the saved notebook as the autograder will (``python -m grader check LAB --submission
    NOTEBOOK``; ``public``: the public cases only, the default in the student edition, which has
    no others; ``parts``: only these; ``report_json``: also write the full report there, as
    ``--json`` does), printing its lines as they come."""
    public = STUDENT_EDITION if public is None else public
    path = os.path.abspath(notebook or os.path.join(os.getcwd(), _spec(lab).notebook))
    if not os.path.isfile(path):
        print(f"No saved notebook at {path}: save the notebook first, or give its path (notebook=...).")
        return None
    age = time.time() - os.path.getmtime(path)
    when = f"{age:.0f} s ago" if age < 120 else f"{age / 60:.0f} min ago" if age < 7200 else f"{age / 3600:.1f} h ago"
    options = (["--public"] if public else []) + [a for p in parts or [] for a in ("--part", p)]
    if report_json:
        options += ["--json", os.path.abspath(report_json)]
    cmd = [sys.executable, "-m", "grader", "check", lab, "--submission", path] + options
    print(f"Grading the saved notebook (saved {when}; save first to grade your latest code):\n"
          f"  python -m grader check {lab} --submission {path}" + "".join(f" {a}" for a in options), flush=True)
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET_SEED"}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    start = time.monotonic()
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1) as proc:
        try:
            for line in proc.stdout:
                print(line, end="", flush=True)
                if time.monotonic() - start > GRADE_TIMEOUT_S:
                    proc.kill()
                    print(f"stopped: grading took more than {GRADE_TIMEOUT_S} s")
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
    print(f"(graded in {time.monotonic() - start:.0f} s)")
    return None

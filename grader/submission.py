"""A submission is a lab notebook. The grader reads it as untrusted data (any bytes, any JSON
shape), turns its code cells into a module file (kernels must live in files: TIRx reads their
source), and maps every line of that file back to a notebook cell, so that messages name the
cell a student sees, never the generated file.

Which cells make the module: every code cell that nbgrader marks as a solution cell (where the
student writes code) and every cell tagged ``module`` (imports and given helpers). Test cells,
plotting and experiments stay out.

Static rules are advice: they are reported beside the scores and never change one. The
defence against forged grades is the process boundary (grader/sandbox.py), not these rules.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tokenize

MODULE_TAG = "module"
MODULE_NAME = "submission"
MAX_NOTEBOOK_BYTES = 32 << 20

# Patterns worth a word of advice (searched in code, comments and strings excluded).
ADVICE = [
    # grader.timeline (the in-kernel tracer) is course code a graded kernel may use: not advice
    (r"\bgrader\b(?!\.timeline\b)", "refers to the grader: your cells are graded in a separate process that cannot reach it"),
    (r"torch\.cuda\.Event|elapsed_time|cudaEvent", "touches CUDA timers: the grader times your kernel itself"),
    (r"CUDAGraph|cuda\.graph\b|torch\.compile", "uses CUDA graphs or torch.compile: the grader runs your compiled kernel only"),
    (r"torch\.(matmul|mm|bmm|addmm|einsum)\b|scaled_dot_product_attention|\bscaled_mm\b",
     "calls torch for the work: the grader runs only the kernel your builder returns"),
    (r"\bdata_ptr\s*\(|/dev/shm", "caches by pointer or in shared memory: inputs are fresh for every case"),
    (r"\bos\.environ\b", "reads the environment: it is empty where your code is graded"),
]


class SubmissionError(Exception):
    """The notebook cannot be read at all (missing, not JSON, not a notebook)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    index: int          # position among all cells, 0-based
    grade_id: str       # nbgrader's id of the cell, or ""
    source: str

    @property
    def label(self) -> str:
        return f"cell {self.index + 1}" + (f" ({self.grade_id})" if self.grade_id else "")


@dataclasses.dataclass
class Module:
    """The module file made from a notebook, with its line map."""
    path: str
    cells: list[Cell]
    starts: list[int]                  # first line of each cell's code in the module file
    problems: list[str]                # cells that could not be used, said per cell
    left_out: dict = dataclasses.field(default_factory=dict)   # cell label -> (its source, why it was left out)

    def cause_of_missing(self, name: str) -> str | None:
        """Why the module has no ``name``: the left-out cell that defines it, and why."""
        pattern = re.compile(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*=", re.M)
        for label, (source, why) in self.left_out.items():
            if pattern.search(source):
                return f"{label}: {why}, so {name}() is not defined: fix that cell"
        return None

    def locate(self, line: int) -> str:
        """Module line -> "cell N (grade id), line M"."""
        for cell, start in reversed(list(zip(self.cells, self.starts))):
            if line >= start:
                return f"{cell.label}, line {line - start + 1}"
        return f"line {line} of the module cells"

    def relocate(self, text: str) -> str:
        """Rewrite references to the module file in ``text`` (tracebacks, compiler messages)."""
        name = re.escape(os.path.basename(self.path))
        text = re.sub(rf'File "[^"]*{name}", line (\d+)', lambda m: f"In {self.locate(int(m.group(1)))}", text)
        text = re.sub(rf"[^\s\"']*{name}:(\d+)", lambda m: self.locate(int(m.group(1))), text)
        return text.replace(self.path, "your notebook")


def _text(x) -> str | None:
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(s, str) for s in x):
        return "".join(x)
    return None


def read_cells(path: str) -> tuple[list[Cell], list[str]]:
    """The code cells of the module, and a message for each cell that had to be left out.
    Raises SubmissionError when the file is not a notebook at all."""
    if not os.path.isfile(path):
        raise SubmissionError(f"no such notebook: {path}")
    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise SubmissionError(f"{os.path.basename(path)} is larger than {MAX_NOTEBOOK_BYTES >> 20} MB: "
                              "clear the outputs and save again")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SubmissionError(f"{os.path.basename(path)} is not UTF-8 text (byte {e.start}): "
                              "is it really a saved .ipynb notebook?") from None
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise SubmissionError(f"{os.path.basename(path)} is not valid JSON (line {e.lineno}, column {e.colno}): "
                              "open it in Jupyter and save it again") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SubmissionError(f"{os.path.basename(path)} is JSON but not a notebook (no list of cells)")
    cells, problems = [], []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        nbg = meta.get("nbgrader") if isinstance(meta.get("nbgrader"), dict) else {}
        tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
        if not (MODULE_TAG in tags or (nbg.get("solution") is True and not nbg.get("grade"))):
            continue
        grade_id = nbg.get("grade_id") if isinstance(nbg.get("grade_id"), str) else ""
        src = _text(cell.get("source", ""))
        if src is None:
            problems.append(f"cell {i + 1}{f' ({grade_id})' if grade_id else ''}: its source is not text; left out")
            continue
        cells.append(Cell(i, grade_id, src))
    if not cells:
        raise SubmissionError(f"{os.path.basename(path)} has no solution cells: is it this lab's notebook?")
    return cells, problems


def _strip_magics(src: str) -> str:
    # IPython magics and shell escapes are not Python: keep the line count, drop the text.
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())


def write_module(notebook_path: str, out_dir: str) -> Module:
    """Write ``<out_dir>/submission.py``: the module cells one after another, each preceded by a
    marker line. A cell with a syntax error is replaced by a comment (its names stay undefined,
    so only the parts that need them fail) and reported in ``problems``."""
    cells, problems = read_cells(notebook_path)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{MODULE_NAME}.py")
    lines: list[str] = []
    starts = []
    left_out = {}
    for cell in cells:
        src = _strip_magics(cell.source)
        try:
            compile(src, cell.label, "exec")
        except SyntaxError as e:
            why = f"{type(e).__name__} at line {e.lineno}: {e.msg}"
            problems.append(f"{cell.label}: {why}; this cell was left out, so the parts that need its "
                            "definitions fail")
            left_out[cell.label] = (cell.source, why)
            src = ""
        except ValueError as e:          # null bytes and the like
            problems.append(f"{cell.label}: cannot be compiled ({e}); left out")
            left_out[cell.label] = (cell.source, f"cannot be compiled ({e})")
            src = ""
        lines.append(f"# ---- {cell.label}")
        starts.append(len(lines) + 1)
        lines.extend(src.splitlines())
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return Module(path, cells, starts, problems, left_out)


def _code_only(src: str) -> str:
    """The source with comments and string literals blanked (advice looks at code only)."""
    out, prev_word = [], False
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                continue
            word = tok.type in (tokenize.NAME, tokenize.NUMBER)
            out.append((" " if word and prev_word else "") + tok.string)
            prev_word = word
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return src
    return "".join(out)


def advice(module: Module) -> list[str]:
    """Advice for the student, one line each, naming the cell. Never changes a score."""
    notes = []
    for cell in module.cells:
        code = _code_only(cell.source)
        for pattern, why in ADVICE:
            m = re.search(pattern, code)
            if m:
                notes.append(f"{cell.label}: {m.group(0)!r} {why}")
    return notes


def find_notebook(path: str, notebook_name: str) -> str:
    """``path`` is a notebook or a folder holding ``notebook_name``."""
    if os.path.isdir(path):
        candidate = os.path.join(path, notebook_name)
        if not os.path.exists(candidate):
            raise SubmissionError(f"{path} holds no {notebook_name}")
        return candidate
    if not os.path.exists(path):
        raise SubmissionError(f"no such submission: {path}")
    return path

"""A submission is a lab notebook. The grader turns the notebook's code into a module
file (kernels must live in files: TIRx reads their source), checks it against a few
static rules, and imports it inside the worker process.

Which cells make the module: every code cell that nbgrader marks as a solution cell
(where the student writes code) and every cell tagged ``module`` (imports and given
helpers). Test cells, plotting and experiments stay out.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import types

MODULE_TAG = "module"

# Things a submission has no business doing. Each rule: (regex, why).
FORBIDDEN = [
    (r"\bimport\s+grader\b|\bfrom\s+grader\b|\b__import__\s*\(\s*['\"]grader", "imports the grader"),
    (r"torch\.cuda\.Event|elapsed_time|cudaEvent", "touches the timer"),
    (r"CUDAGraph|cuda\.graph\b|torch\.compile", "uses CUDA graphs or torch.compile"),
    (r"torch\.(matmul|mm|bmm|addmm|einsum)\b|F\.scaled_dot_product_attention|\bscaled_mm\b",
     "falls back to a torch kernel for the work it must do itself"),
    (r"\bdata_ptr\s*\(|/dev/shm", "caches results across calls"),
    (r"\bsys\.modules\b|\bbuiltins\b|monkeypatch|setattr\s*\(\s*torch", "patches other modules"),
    (r"\bos\.environ\b", "reads the grader's environment"),
]


class SubmissionError(Exception):
    """The submission cannot be graded at all (no notebook, unreadable, forbidden code)."""


def _is_module_cell(cell: dict) -> bool:
    if cell.get("cell_type") != "code":
        return False
    meta = cell.get("metadata", {})
    nb = meta.get("nbgrader", {})
    return MODULE_TAG in meta.get("tags", []) or (nb.get("solution", False) and not nb.get("grade", False))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def module_source(notebook_path: str) -> str:
    """The module text made from a notebook's module cells (IPython magics dropped)."""
    try:
        with open(notebook_path) as f:
            nb = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SubmissionError(f"cannot read notebook {notebook_path}: {e}") from e
    chunks = []
    for i, cell in enumerate(nb.get("cells", [])):
        if _is_module_cell(cell):
            lines = [ln for ln in _source(cell).splitlines() if not ln.lstrip().startswith(("%", "!"))]
            chunks.append(f"# ---- notebook cell {i}\n" + "\n".join(lines))
    if not chunks:
        raise SubmissionError(f"{notebook_path} has no solution cells: is it a lab notebook?")
    return "\n\n".join(chunks) + "\n"


def static_violations(source: str) -> list[str]:
    """Rules the source breaks, one message each (comments are not exempt: keep it simple)."""
    found = []
    for pattern, why in FORBIDDEN:
        m = re.search(pattern, source)
        if m:
            line = source.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {m.group(0)!r} {why}")
    return found


def write_module(notebook_path: str, out_dir: str, name: str = "submission") -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.py")
    with open(path, "w") as f:
        f.write(module_source(notebook_path))
    return path


def import_module(path: str, name: str = "submission") -> types.ModuleType:
    """Import a module file under a fresh name (the file stays on disk: TIRx reads it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


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

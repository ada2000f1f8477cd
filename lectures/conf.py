"""Sphinx configuration for the course lecture notes.

Build from the repository root with warnings as errors:

    python -m sphinx -W -b html lectures lectures/_build/html

Figures are never committed. Every lab folder may hold a ``figures.py`` that
writes PNGs into its own git-ignored ``generated/`` folder; the
``builder-inited`` hook below runs all of them before any page is read, so the
single command above produces the complete site.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

project = "Modern GPU Kernels: Hopper and Blackwell in TIRx"
author = "Course staff"
copyright = "2025, course staff"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**/generated", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["dollarmath"]

html_theme = "alabaster"
html_title = project
html_theme_options = {"page_width": "1100px", "sidebar_width": "240px"}


def _figure_scripts() -> list[pathlib.Path]:
    return sorted(p for p in HERE.glob("*/figures.py") if "_build" not in p.parts)


def _run_figure_scripts(app) -> None:
    for script in _figure_scripts():
        print(f"[lectures] generating figures: {script.relative_to(HERE)}")
        subprocess.run([sys.executable, str(script)], cwd=script.parent, check=True,
                       stdout=subprocess.DEVNULL)


def setup(app):
    app.connect("builder-inited", _run_figure_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

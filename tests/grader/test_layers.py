"""The grader's modules form layers: no import circle (lazy imports inside functions count), the
grading core never reaches into the programs built on it (classroom, edition, timeline), and a
lab's own module is reached only through the one dispatch. Checked from the source with ast."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = ("grader.classroom", "grader.edition", "grader.timeline")
FRONT_DOOR = {"grader.cli", "grader.__main__"}          # the command line starts every program
LAB_MODULE_USERS = {"grader.dispatch", "grader.edition.release"}   # the release records public tables


def module_sources(root: str = ROOT) -> dict[str, tuple[str, bool]]:
    """Module name -> (source, is a package's __init__) for every module under grader/."""
    out = {}
    for dirpath, dirnames, files in os.walk(os.path.join(root, "grader")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, ".")
                pkg = rel.endswith(".__init__")
                with open(os.path.join(dirpath, f)) as fh:
                    out[rel[: -len(".__init__")] if pkg else rel] = (fh.read(), pkg)
    return out


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the grader modules it imports, anywhere in its body. Importing ``a.b.c`` also
    imports the packages ``a.b`` and ``a`` (their __init__ runs), so those count too, except the
    importing module's own packages."""
    graph = {}
    for name, (src, is_pkg) in sources.items():
        package = name if is_pkg else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(src)):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                # a module's own packages are being imported already when it runs: not an edge
                while t in sources and t != name and not name.startswith(t + "."):
                    deps.add(t)
                    t = t.rpartition(".")[0]
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _program(name: str) -> str | None:
    return next((p for p in PROGRAMS if name == p or name.startswith(p + ".")), None)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        mine = _program(mod)
        for d in sorted(deps):
            theirs = _program(d)
            if theirs and theirs != mine and mod not in FRONT_DOOR:
                bad.append(f"{mod} imports {d}: {'the core' if mine is None else mine} reaches into {theirs}")
            lab_module = d.startswith("grader.labs.lab")
            if lab_module and mod not in LAB_MODULE_USERS and not mod.startswith("grader.labs."):
                bad.append(f"{mod} imports {d}: a lab's module is reached through grader.dispatch only")
    return bad


def test_the_grader_has_no_import_circle():
    found = circles(import_graph(module_sources()))
    assert not found, f"import circles: {found}"


def test_the_core_does_not_reach_into_the_programs_built_on_it():
    assert not layer_violations(import_graph(module_sources()))


def test_every_program_is_a_package():
    sources = module_sources()
    for program in PROGRAMS:
        assert program in sources and sources[program][1], program


def test_the_checks_see_a_planted_circle_and_a_planted_reach(tmp_path):
    files = {"grader/__init__.py": "", "grader/a.py": "def f():\n    from . import b\n",
             "grader/b.py": "from .a import f\n", "grader/run.py": "from .classroom import batch\n",
             "grader/classroom/__init__.py": "", "grader/classroom/batch.py": "from .. import a\n",
             "grader/harness.py": "from .labs import lab1_roofline\n", "grader/labs/__init__.py": "",
             "grader/labs/lab1_roofline.py": ""}
    for path, text in files.items():
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        (tmp_path / path).write_text(text)
    graph = import_graph(module_sources(str(tmp_path)))
    assert circles(graph) == [["grader.a", "grader.b"]]
    bad = layer_violations(graph)
    assert any(b.startswith("grader.run imports grader.classroom.batch") for b in bad)
    assert any(b.startswith("grader.harness imports grader.labs.lab1_roofline") for b in bad)
    assert not any(b.startswith("grader.classroom.batch") for b in bad)      # a program may use the core


def test_the_ptx_analysis_is_a_leaf_under_the_checks():
    """grader/ptxflow.py (the PTX analysis) imports no grader module, and grader/inspect.py (the
    mechanism checks) imports it: the checks read the analysis, never the reverse."""
    graph = import_graph(module_sources())
    assert "grader.ptxflow" in graph, "grader/ptxflow.py is missing"
    assert graph["grader.ptxflow"] == set(), f"grader.ptxflow imports {sorted(graph['grader.ptxflow'])}"
    assert "grader.ptxflow" in graph["grader.inspect"]

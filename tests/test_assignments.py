"""assignments/ is exactly what nbgrader generates from solutions/, and leaks nothing."""
import json
import os
import subprocess
import sys

import pytest

from grader import spec
from grader.edition import release

LABS = spec.lab_names()


def _cells(path):
    with open(path) as f:
        nb = json.load(f)
    return [("".join(c["source"]) if isinstance(c["source"], list) else c["source"], c.get("metadata", {}))
            for c in nb["cells"]]


# nbgrader's generate_assignment for every lab, in one process (what `nbgrader generate_assignment
# LAB --force` runs, through nbgrader's API: one start-up for the six labs).
GENERATE = """
import sys
from nbgrader.apps import NbGraderAPI
from traitlets.config.loader import PyFileConfigLoader
course, labs = sys.argv[1], sys.argv[2:]
config = PyFileConfigLoader("nbgrader_config.py", path=course).load_config()
config.CourseDirectory.root = course
api = NbGraderAPI(config=config)
for lab in labs:
    result = api.generate_assignment(lab, force=True)
    if not result["success"]:
        sys.exit(f"generate_assignment {lab} failed: {result.get('error')} {result.get('log')}")
"""


@pytest.fixture(scope="module")
def regenerated(root, tmp_path_factory):
    from conftest import copy_course
    course = tmp_path_factory.mktemp("course")
    copy_course(root, str(course))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([sys.executable, "-c", GENERATE, str(course), *LABS], cwd=str(course), env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return course


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_committed_student_version_is_up_to_date(root, regenerated, lab):
    nb = spec.load(lab).notebook
    committed = _cells(os.path.join(root, "assignments", lab, nb))
    fresh = _cells(os.path.join(regenerated, "assignments", lab, nb))
    assert committed == fresh, f"assignments/{lab} is stale: run `python -m grader generate {lab}` and commit"


def _solution_lines(path):
    """Every substantial line between BEGIN/END SOLUTION and BEGIN/END HIDDEN TESTS."""
    return [s for s in release.regions(path)[0] if len(s) > 12 and not s.startswith("#")]


def _given_text(path):
    """The solution notebook's given code (outside the solution and hidden-test regions): a
    solution line found in it (a store loop of a given macro written again in a builder) tells
    the student nothing."""
    return "\n".join(release.regions(path)[1])


@pytest.mark.parametrize("lab", LABS)
def test_no_solution_or_hidden_test_leaks(root, lab):
    nb = spec.load(lab).notebook
    student = os.path.join(root, "assignments", lab, nb)
    text = "\n".join(src for src, _ in _cells(student))
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    secret = _solution_lines(os.path.join(root, "solutions", lab, nb))
    assert secret, "the solution notebook has no solution lines?"
    given = _given_text(os.path.join(root, "solutions", lab, nb))      # public by construction
    leaked = [s for s in secret if s in text and s not in given]
    assert not leaked, f"solution text in assignments/{lab}: {leaked[:3]}"


@pytest.mark.parametrize("lab", LABS)
def test_no_python_files_beside_the_notebooks(root, lab):
    """nbgrader copies .py files verbatim: solutions must live in notebooks only."""
    for folder in ("solutions", "assignments"):
        for dirpath, _, files in os.walk(os.path.join(root, folder, lab)):
            assert not [f for f in files if f.endswith(".py")], f"{folder}/{lab} holds .py files"


@pytest.mark.parametrize("lab", LABS)
def test_committed_notebooks_have_no_outputs(root, lab):
    for folder in ("solutions", "assignments"):
        path = os.path.join(root, folder, lab, spec.load(lab).notebook)
        with open(path) as f:
            nb = json.load(f)
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, f"{path} has outputs"

"""Text helpers shared by the tests/test_transfer_lab*.py files: a lab's lecture and notebook cells,
the Python blocks of a markdown text, lines squashed and texts flattened for comparison, a section of
a lecture, the statement lines of a reference solution, and an old version of a file read from git
(the test skips where this checkout's history does not hold it)."""
import json
import os
import re
import subprocess

import pytest

from grader import spec
from grader.edition import release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGION = re.compile(r"### (BEGIN|END) SOLUTION")


def lecture(lab, root=ROOT):
    with open(os.path.join(root, "lectures", lab, "index.md")) as f:
        return f.read()


def cells(lab, folder, root=ROOT):
    """The cells of the lab's notebook in `folder` ("solutions" or "assignments")."""
    with open(os.path.join(root, folder, lab, spec.load(lab).notebook)) as f:
        return json.load(f)["cells"]


def source(cell):
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def markdown(cells):
    """The markdown cells' text, one cell after another."""
    return "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")


def markdown_by_head(cells):
    """Each markdown cell's text under its first line (its heading)."""
    return {source(c).split("\n")[0]: source(c) for c in cells if c["cell_type"] == "markdown"}


def graded_cells(lab, folder, grade_ids):
    """The sources of the notebook's cells whose nbgrader grade_id is one of `grade_ids`."""
    return [source(c) for c in cells(lab, folder) if c["metadata"].get("nbgrader", {}).get("grade_id") in grade_ids]


def code_blocks(markdown):
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


def squash(line):
    """The line without its comment and without any white space."""
    return re.sub(r"\s+", "", line.split("#")[0])


def flat(text):
    """The text with every run of white space one space."""
    return re.sub(r"\s+", " ", text)


def section(text, title):
    """The section of `text` from the heading `title` up to the next heading of the same level."""
    assert title in text, title
    start = text.index(title)
    level = title.split(" ")[0]
    nxt = re.search(rf"^{level} ", text[start + len(title):], re.M)
    return text[start:start + len(title) + (nxt.start() if nxt else len(text))]


def bullets(text):
    """The items of the bullet lists in `text`, each up to the next item or bold paragraph."""
    return re.findall(r"^- (.*?)(?=^- |^\*\*|\Z)", text, re.M | re.S)


def region_lines(texts):
    """The squashed statement lines inside the ### BEGIN/END SOLUTION regions of `texts`."""
    lines, inside = set(), False
    for text in texts:
        for line in text.splitlines():
            if REGION.search(line):
                inside = "BEGIN" in line
                continue
            if inside and squash(line):
                lines.add(squash(line))
    return lines


def solution_lines(lab, keep=lambda line: True, root=ROOT):
    """The squashed lines of the lab's reference notebook inside its solution (and hidden-test)
    regions, as grader.edition.release reads them, that `keep` (given the stripped line) accepts."""
    inside, _ = release.regions(os.path.join(root, "solutions", lab, spec.load(lab).notebook))
    return {squash(ln) for ln in inside if keep(ln)}


def old_text(commit, path, reason="the old text is not in this checkout's history"):
    """The file at `path` as it was at `commit`; the test skips where git cannot show it."""
    old = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if old.returncode:
        pytest.skip(reason)
    return old.stdout

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
STRIPPED = re.compile(r"### (BEGIN|END) (SOLUTION|HIDDEN TESTS)")   # the regions the student edition leaves out


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


def notebook_text(cells):
    """Every cell's source, markdown and code, flattened: what a given constant or helper says."""
    return flat("\n".join(source(c) for c in cells))


def check_given_code_says_none_of(lab, giveaways, old_commit):
    """None of ``giveaways`` is in either notebook of ``lab`` today, and each was in both at
    ``old_commit`` (so the check can fail: it does on the old notebooks)."""
    for folder in ("solutions", "assignments"):
        text = notebook_text(cells(lab, folder))
        assert not [g for g in giveaways if g in text], [g for g in giveaways if g in text]
        old = notebook_text(json.loads(old_text(old_commit, f"{folder}/{lab}/{spec.load(lab).notebook}"))["cells"])
        assert all(g in old for g in giveaways), [g for g in giveaways if g not in old]


def check_carried_and_called(lab, function, call, builders):
    """The lab's student notebook carries ``function`` over as a TODO (no answer in it), and each of
    the ``builders`` Hopper builders of the solution calls it (``= call``) in its own region, which
    the student edition strips."""
    carried = next(source(c) for c in cells(lab, "assignments") if f"def {function}(" in source(c))
    assert "todo(" in carried and "// 16" not in carried, carried
    assert call not in visible(cells(lab, "solutions"))
    assert notebook_text(cells(lab, "solutions")).count(f"= {call}") == builders


def visible(cells):
    """The student-visible text of notebook cells, flattened: markdown and code, less the solution
    and hidden-test regions (which the student edition strips)."""
    out = []
    for cell in cells:
        inside = False
        for line in source(cell).splitlines():
            if STRIPPED.search(line):
                inside = "BEGIN" in line
            elif not inside:
                out.append(line)
    return flat("\n".join(out))


def check_the_old_texts_gave(lab, commit, lecture_check, lecture_giveaways, notebook_check, notebook_giveaways):
    """The lecture and both notebooks as they were at ``commit`` fail their checks, and held every
    give-away the checks look for: each absence today is a change, and each check can fail."""
    lecture_then = old_text(commit, f"lectures/{lab}/index.md")
    with pytest.raises(AssertionError):
        lecture_check(lecture_then)
    assert not [g for g in lecture_giveaways if g not in flat(lecture_then)]
    for folder in ("solutions", "assignments"):
        cells_then = json.loads(old_text(commit, f"{folder}/{lab}/{spec.load(lab).notebook}"))["cells"]
        with pytest.raises(AssertionError):
            notebook_check(cells_then)
        text = visible(cells_then)
        assert not [g for g in notebook_giveaways if g not in text], folder

"""No lab hands out another lab's graded answer: the labs are released together (the student
edition holds all six), so a given cell of Lab 5 that repeats Lab 4's answer to a graded question
gives that answer away before Lab 4 is due."""
import io
import json
import keyword
import os
import re
import tokenize

import pytest

from grader import spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABS = spec.lab_names()
REGION = re.compile(r"### (BEGIN|END) (SOLUTION|HIDDEN TESTS)")


def _cells(path):
    with open(path) as f:
        nb = json.load(f)
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell):
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def graded_answer_lines(lab):
    """The substantial lines of the solution regions of the cells that answer a graded question
    of ``lab`` (cells whose nbgrader id is a part of the lab's spec), stripped."""
    parts = {p.id for p in spec.load(lab).parts}
    lines = []
    for cell in _cells(os.path.join(ROOT, "solutions", lab, spec.load(lab).notebook)):
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") not in parts:
            continue
        inside = False
        for line in _source(cell).splitlines():
            if REGION.search(line):
                inside = "BEGIN" in line
                continue
            s = line.strip()
            if inside and len(s) > 12 and not s.startswith("#") and re.search(r"[-+*/%]", s):
                lines.append(s)          # a formula: an answer, not a call every lab makes
    return lines


def public_text(lab):
    return "\n".join(line.strip() for cell in _cells(os.path.join(ROOT, "assignments", lab, spec.load(lab).notebook))
                     for line in _source(cell).splitlines())


def formula_shape(line):
    """A line's formula with its names blanked (``X``), spaces dropped and a leading ``name =`` or
    ``return`` removed: ``col = 8 * (reg // 4) + 2 * (lane % 4) + reg % 2`` and ``return 8 * (i // 4)
    + 2 * (tid % 4) + i % 2`` are the same formula, ``8*(X//4)+2*(X%4)+X%2``."""
    text = re.sub(r"^\s*(return\s+|[A-Za-z_][\w, ]*=(?!=)\s*)", "", line.strip())
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return ""
    return "".join("X" if t.type == tokenize.NAME and not keyword.iskeyword(t.string) else t.string
                   for t in tokens if t.type in (tokenize.NAME, tokenize.NUMBER, tokenize.OP))


def distinctive_shapes(lines):
    """{shape: line} of the answer lines whose formula is long enough, with numbers in it, to be
    that answer and not any arithmetic."""
    shapes = {formula_shape(s): s for s in lines}
    return {k: v for k, v in shapes.items() if len(k) >= 16 and re.search(r"\d", k)}


@pytest.mark.parametrize("lab", LABS)
def test_no_other_lab_hands_out_this_labs_graded_answers(lab):
    answers = graded_answer_lines(lab)
    leaks = [(other, s) for other in LABS if other != lab for s in answers if s in public_text(other)]
    assert not leaks, f"{lab}'s graded answers in other labs' notebooks: {leaks[:4]}"
    shapes = distinctive_shapes(answers)
    renamed = [(other, shapes[formula_shape(line)], line) for other in LABS if other != lab
               for line in public_text(other).splitlines() if formula_shape(line) in shapes]
    assert not renamed, f"{lab}'s graded answers, names changed, in other labs' notebooks: {renamed[:4]}"


def test_the_scan_finds_a_planted_answer(tmp_path, monkeypatch):
    """The scan can fail: Lab 4's fragment formula pasted into another lab's given code is found."""
    answers = graded_answer_lines("lab4_gemm")
    assert any("lane // 4" in s for s in answers), answers[:5]
    planted = answers[0]
    monkeypatch.setattr(__import__(__name__), "public_text",
                        lambda lab: planted if lab == "lab5_gemm_pipeline" else "")
    with pytest.raises(AssertionError, match="lab5_gemm_pipeline"):
        test_no_other_lab_hands_out_this_labs_graded_answers("lab4_gemm")


def test_the_scan_finds_an_answer_with_its_names_changed(monkeypatch):
    """Lab 4's column formula of the accumulator fragment, written with other names in a given
    helper of a later lab (as Lab 6's acc_col once was), is found."""
    given = "def acc_col(tid, i):\n    return 8 * (i // 4) + 2 * (tid % 4) + i % 2\n"
    monkeypatch.setattr(__import__(__name__), "public_text",
                        lambda lab: given if lab == "lab6_flash_attention" else "")
    with pytest.raises(AssertionError, match="names changed.*lab6_flash_attention"):
        test_no_other_lab_hands_out_this_labs_graded_answers("lab4_gemm")

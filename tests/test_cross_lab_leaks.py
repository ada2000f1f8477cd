"""No lab hands out another lab's graded answer: the labs are released together (the student
edition holds all six), so a given cell of Lab 5 that repeats Lab 4's answer to a graded question
gives that answer away before Lab 4 is due."""
import json
import os
import re

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


@pytest.mark.parametrize("lab", LABS)
def test_no_other_lab_hands_out_this_labs_graded_answers(lab):
    answers = graded_answer_lines(lab)
    leaks = [(other, s) for other in LABS if other != lab for s in answers if s in public_text(other)]
    assert not leaks, f"{lab}'s graded answers in other labs' notebooks: {leaks[:4]}"


def test_the_scan_finds_a_planted_answer(tmp_path, monkeypatch):
    """The scan can fail: Lab 4's fragment formula pasted into another lab's given code is found."""
    answers = graded_answer_lines("lab4_gemm")
    assert any("lane // 4" in s for s in answers), answers[:5]
    planted = answers[0]
    monkeypatch.setattr(__import__(__name__), "public_text",
                        lambda lab: planted if lab == "lab5_gemm_pipeline" else "")
    with pytest.raises(AssertionError, match="lab5_gemm_pipeline"):
        test_no_other_lab_hands_out_this_labs_graded_answers("lab4_gemm")

import json
import os

import pytest

from grader import hardware, submission
from grader.labs import lab1_roofline

LAB1 = ("solutions", "lab1_roofline", "lab1_roofline.ipynb")


def test_module_is_made_of_solution_and_module_cells_only(root, tmp_path):
    m = submission.write_module(os.path.join(root, *LAB1), str(tmp_path))
    src = open(m.path).read()
    assert "def op_flops" in src and "def build_scale_add" in src and "def todo" in src
    assert "check(" not in src and "grade(" not in src      # test cells stay out
    assert "examples = {" not in src                         # experiment cells stay out


def test_lines_map_back_to_notebook_cells(root, tmp_path):
    m = submission.write_module(os.path.join(root, *LAB1), str(tmp_path))
    lines = open(m.path).read().split("\n")
    n = next(i for i, ln in enumerate(lines, 1) if ln.startswith("def op_flops"))
    assert m.locate(n) == "cell 5 (a_flops), line 1"
    assert "submission.py" not in m.relocate(f'File "{m.path}", line {n}, in op_flops')


@pytest.mark.parametrize("code, word", [
    ("t = torch.cuda.Event(enable_timing=True)", "Event"),
    ("y = torch.matmul(a, b)", "matmul"),
    ("cache[x.data_ptr()] = y", "data_ptr"),
    ("from grader.timeline import Tracer\nfrom grader import report", "grader"),   # the tracer is fine
])
def test_advice_names_the_cell_and_never_reads_comments(tmp_path, code, word):
    nb = {"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade_id": "a"}},
                     "source": code + "\n# torch.matmul counts FLOPs, as does torch.cuda.Event\nz = 'elapsed_time'\n"}]}
    p = tmp_path / "n.ipynb"
    p.write_text(json.dumps(nb))
    notes = submission.advice(submission.write_module(str(p), str(tmp_path / "m")))
    assert len(notes) == 1 and word in notes[0] and notes[0].startswith("cell 1 (a)")
    nb["cells"][0]["source"] = "# torch.matmul counts FLOPs\nx = 'torch.cuda.Event'\n"
    p.write_text(json.dumps(nb))
    assert submission.advice(submission.write_module(str(p), str(tmp_path / "m2"))) == []


def test_a_syntax_error_leaves_out_one_cell(tmp_path):
    nb = {"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade_id": "good"}},
                     "source": "def f():\n    return 1\n"},
                    {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade_id": "bad"}},
                     "source": "def g(:\n"}]}
    p = tmp_path / "n.ipynb"
    p.write_text(json.dumps(nb))
    m = submission.write_module(str(p), str(tmp_path / "m"))
    assert "def f()" in open(m.path).read()
    assert len(m.problems) == 1 and m.problems[0].startswith("cell 2 (bad): SyntaxError at line 1")


@pytest.mark.parametrize("content, why", [
    (b"not json", "not valid JSON"),
    (b"[1, 2, 3]", "not a notebook"),
    (b'{"cells": 5}', "not a notebook"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
])
def test_unreadable_notebooks_say_why(tmp_path, content, why):
    bad = tmp_path / "x.ipynb"
    bad.write_bytes(content)
    with pytest.raises(submission.SubmissionError, match=why):
        submission.write_module(str(bad), str(tmp_path / "m"))
    with pytest.raises(submission.SubmissionError):
        submission.find_notebook(str(tmp_path / "nothing"), "lab1_roofline.ipynb")


def test_non_text_sources_are_left_out_with_a_message(tmp_path):
    nb = {"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"solution": True}}, "source": "x = 1\n"},
                    {"cell_type": "code", "metadata": {"nbgrader": {"solution": True}}, "source": {"a": 1}},
                    "not a cell"]}
    p = tmp_path / "n.ipynb"
    p.write_text(json.dumps(nb))
    m = submission.write_module(str(p), str(tmp_path / "m"))
    assert m.problems == ["cell 2: its source is not text; left out"]


def test_notebook_gpu_table_matches_the_grader(root):
    """The notebook's GPUS dictionary must agree with grader.hardware.SPECS."""
    cells, _ = submission.read_cells(os.path.join(root, *LAB1))
    ns = {}
    exec(compile(cells[0].source, "setup", "exec"), ns)  # the setup cell only
    for name, gpu in ns["GPUS"].items():
        assert gpu == lab1_roofline.gpu_dict(name)
        assert hardware.SPECS[name].fp16_tflops == gpu["peak_tflops"]

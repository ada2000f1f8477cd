import os

import pytest

from grader import hardware, submission
from grader.labs import lab1_roofline


def test_module_is_made_of_solution_and_module_cells_only(root):
    nb = os.path.join(root, "solutions", "lab1_roofline", "lab1_roofline.ipynb")
    src = submission.module_source(nb)
    assert "def op_flops" in src and "def build_scale_add" in src and "def todo" in src
    assert "check(" not in src and "grade(" not in src      # test cells stay out
    assert "examples = {" not in src                         # experiment cells stay out


@pytest.mark.parametrize("code", [
    "import grader",
    "from grader.notebook import check",
    "t = torch.cuda.Event(enable_timing=True)",
    "y = torch.matmul(a, b)",
    "cache[x.data_ptr()] = y",
    "import os; os.environ['GRADER_SECRET_SEED']",
    "g = torch.cuda.CUDAGraph()",
])
def test_static_rules_catch_cheats(code):
    assert submission.static_violations("x = 1\n" + code + "\n")


def test_static_rules_accept_the_reference(root):
    nb = os.path.join(root, "solutions", "lab1_roofline", "lab1_roofline.ipynb")
    assert submission.static_violations(submission.module_source(nb)) == []


def test_unreadable_submission(tmp_path):
    bad = tmp_path / "x.ipynb"
    bad.write_text("not json")
    with pytest.raises(submission.SubmissionError):
        submission.module_source(str(bad))
    with pytest.raises(submission.SubmissionError):
        submission.find_notebook(str(tmp_path), "lab1_roofline.ipynb")


def test_notebook_gpu_table_matches_the_grader(root):
    """The notebook's GPUS dictionary must agree with grader.hardware.SPECS."""
    nb = os.path.join(root, "solutions", "lab1_roofline", "lab1_roofline.ipynb")
    ns = {}
    src = submission.module_source(nb)
    setup = src.split("# ---- notebook cell")[1]
    exec(compile("".join(setup.split("\n", 1)[1:]), "setup", "exec"), ns)  # the setup cell only
    for name, gpu in ns["GPUS"].items():
        assert gpu == lab1_roofline.gpu_dict(name)
        assert hardware.SPECS[name].fp16_tflops == gpu["peak_tflops"]

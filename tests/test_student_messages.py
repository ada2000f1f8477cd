"""What a student reads when a kernel does not build (grader/hints.py, grader/child.py): a tile
operation TIRx cannot lower is said in a few lines with what the course teaches instead, not
TVM's table of every lowering it tried; a TIRx parse error that ends a script prints its own
line and reason, not only TVM's note about TVM_BACKTRACE."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, edit_notebook, import_notebook
from grader import child, devcode, hints

LAB2 = os.path.join(ROOT, "solutions", "lab2_tma", "lab2_tma.ipynb")
LECTURE2 = os.path.join(ROOT, "lectures", "lab2_tma", "index.md")
NO_BASE_MOVE_D = {"        pool.move_base_to(1024)\n        tile =": "        tile ="}
NO_BASE_MOVE_E = {"        pool.move_base_to(1024)\n        ring =": "        ring ="}


def _lowering_error(tmp_path, replace, build):
    """The exception TIRx raises lowering a kernel of Lab 2's solution edited by ``replace``."""
    name = f"hint_{len(os.listdir(tmp_path))}"
    nb = edit_notebook(LAB2, str(tmp_path / f"{name}.ipynb"), replace)
    mod = import_notebook(nb, tmp_path / name, name)
    with pytest.raises(Exception) as info:
        devcode.lowered(build(mod), "sm_90a")
    return info.value


@pytest.fixture(scope="module")
def tile_error(tmp_path_factory):
    return _lowering_error(tmp_path_factory.mktemp("tile"), NO_BASE_MOVE_D, lambda m: m.build_tma_tile(1024, 1024))


def _is_tvm_table(text):
    return bool(re.search(r"^\+-{10,}|^\| Variant|opcall:", text, re.M))


def test_tvm_reports_the_missing_base_move_as_a_table(tile_error):
    """The failure these messages replace: TVM's table, hundreds of columns wide, with its advice."""
    text = str(tile_error)
    assert _is_tvm_table(text) and "tma_explicit" in text
    assert max(len(ln) for ln in text.splitlines()) > 150


def test_a_swizzled_tile_off_its_atom_is_said_in_a_few_lines(tile_error):
    said = hints.explain(tile_error)
    lines = said.splitlines()
    assert len(lines) <= 5 and not _is_tvm_table(said) and "tma_explicit" not in said
    assert lines[0] == ("Tx.copy_async cannot be lowered: the shared-memory tile `tile` starts at byte 8 of "
                        "shared memory, not a multiple of 1024.")
    assert "the pattern repeats every 1024 bytes (one swizzle atom: 8 rows of 128 bytes)" in said
    assert "pool.move_base_to(1024)" in said and said.count("move_base_to") == 1
    assert "The copy: T.tile.copy_async(tile[0:64, 0:128]" in said


def test_the_lecture_section_the_message_names_exists():
    title = re.search(r'lectures/lab2_tma, "([^"]+)"', hints.LECTURE_SWIZZLE).group(1)
    with open(LECTURE2) as f:
        assert f"\n## {title}\n" in f.read()
    assert "move_base_to(1024)" in open(LECTURE2).read()


def test_the_graders_child_sends_the_few_lines(tile_error):
    """The jailed child's answer to a kernel that does not lower (grader/child.py)."""
    said = child.build_message(tile_error)
    assert said == hints.explain(tile_error)
    assert not _is_tvm_table(said)


def test_a_cell_that_fails_to_lower_is_noted_in_a_few_lines(tmp_path):
    """A notebook cell that lowers a kernel at the top level: the child's note of that cell."""
    nb = edit_notebook(LAB2, str(tmp_path / "cell.ipynb"), {
        **NO_BASE_MOVE_D, "    return tma_tile": "    return tma_tile\n\n\n"
        "from grader import devcode\ndevcode.lowered(build_tma_tile(1024, 1024), 'sm_90a')\n"})
    from grader import submission
    module = submission.write_module(nb, str(tmp_path / "m"))
    errors = child._run_cells(module.path, {"__name__": "submission"})
    assert len(errors) == 1 and "raised RuntimeError: Tx.copy_async cannot be lowered" in errors[0]
    assert "move_base_to(1024)" in errors[0] and not _is_tvm_table(errors[0])


def test_the_ring_of_the_stream_kernel_is_named(tmp_path):
    e = _lowering_error(tmp_path, NO_BASE_MOVE_E, lambda m: m.build_tma_stream(4096, 4096))
    said = hints.explain(e)
    assert said.startswith("Tx.copy_async cannot be lowered: the shared-memory tile `ring` starts at byte offset "
                           "it % 4 * 16384 + 64 of shared memory, not a multiple of 1024.")
    assert "pool.move_base_to(1024)" in said and len(said.splitlines()) <= 5


def test_a_tile_indexed_by_a_variable_on_an_extent_of_one_is_told_so(tile_error):
    """A base on its atom and a run-time index whose stride is not a multiple of it (a ring of one
    stage indexed by a counter: TIRx gives the extent-1 dimension the element's stride): moving the
    base would not help, and the message says what would."""
    said = hints.explain(str(tile_error).replace("shared slice offset=8B", "shared slice offset=cnt * 2 + 1024B"))
    assert "starts at byte offset cnt * 2 + 1024 of shared memory" in said and "move_base_to" not in said
    assert "the term `cnt * 2` is not: the index `cnt` moves the tile by 2 byte(s)" in said
    assert "extent 1" in said and len(said.splitlines()) <= 5
    moved = hints.explain(str(tile_error).replace("shared slice offset=8B", "shared slice offset=it % 4 * 16384 + 64B"))
    assert "pool.move_base_to(1024)" in moved and "extent 1" not in moved


def test_a_failure_the_course_does_not_know_is_still_a_few_lines(tile_error):
    text = str(tile_error).replace("shared slice offset=8B must preserve 128B alignment",
                                   "box dimension 0 exceeds the swizzle span")
    said = hints.explain(text)
    assert said.splitlines()[:2] == ["Tx.copy_async cannot be lowered: TIRx's only lowering of it declined:",
                                     "  tma_auto: box dimension 0 exceeds the swizzle span (disproven)"]
    assert said.splitlines()[2].startswith("The operation: T.tile.copy_async(tile[0:64, 0:128]")
    assert not _is_tvm_table(said) and "tma_explicit" not in said


def test_other_errors_are_left_to_their_own_text():
    assert hints.explain(RuntimeError("Check failed: lanes % 2 == 0")) is None
    assert hints.explain("error: Undefined variable: j\n --> cell 17, line 14:9") is None


def test_a_build_failure_that_is_the_same_on_every_arch_is_said_once():
    one = "does not build: TIRx lowering for {a} failed: RuntimeError: Tx.copy_async cannot be lowered: X.\nFix: Y."
    msg = f"sm_90a: {one.format(a='sm_90a')} | sm_100a: {one.format(a='sm_100a')}"
    assert hints.same_for_every_arch(msg) == "sm_90a and sm_100a: " + one.format(a="sm_90a and sm_100a")
    two = f"build_a: {msg} || build_b: sm_90a: compiled; 2 TMA loads | sm_100a: compiled; 2 TMA loads"
    assert hints.same_for_every_arch(two) == (f"build_a: sm_90a and sm_100a: {one.format(a='sm_90a and sm_100a')}"
                                              " || build_b: sm_90a: compiled; 2 TMA loads | sm_100a: compiled; "
                                              "2 TMA loads")
    different = f"sm_90a: {one.format(a='sm_90a')} | sm_100a: does not build: ptxas for sm_100a failed: Z"
    assert hints.same_for_every_arch(different) == different
    assert hints.same_for_every_arch("42 of 42 right") == "42 of 42 right"


PARSE_ERROR_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import tvm
from tvm.script import tirx as T
{install}

def build(n):
    @T.prim_func
    def kernel(x_ptr: T.handle):
        X = T.match_buffer(x_ptr, (n,), "float16")
        T.device_entry()
        Z = undefined_name + 1
    return kernel

build(8)
"""


def _run_script(tmp_path, install):
    path = tmp_path / "parse_error.py"
    path.write_text(PARSE_ERROR_SCRIPT.format(root=ROOT, install=install))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "TVM_BACKTRACE")}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)


def test_a_parse_error_ending_a_script_prints_its_line_and_reason(tmp_path):
    plain = _run_script(tmp_path, "")
    said = plain.stdout + plain.stderr               # TVM prints its note on stdout
    assert plain.returncode == 1 and "Undefined variable" not in said and "TVM_BACKTRACE" in said
    hinted = _run_script(tmp_path, "from grader import hints\nhints.install_excepthook()")
    err = hinted.stdout + hinted.stderr
    assert hinted.returncode == 1 and "TVM_BACKTRACE" not in err, err
    assert "DiagnosticError (your TIRx kernel does not parse): error: Undefined variable: undefined_name" in err
    assert "parse_error.py:14:9" in err and "Z = undefined_name + 1" in err and "^^^^" in err
    assert "line 17, in <module>" in err and "site-packages" not in err


# ---------------------------------------------------------------- where the student reads them

@pytest.mark.slow
def test_the_check_cell_and_the_grader_say_the_missing_base_move_once(tmp_path):
    """Lab 2's d_build without move_base_to(1024): the check cell (built in the notebook's
    process) and the grader (built in the jailed child) say it once for both archs."""
    from conftest import grade_in_process
    from grader import notebook
    nb = edit_notebook(LAB2, str(tmp_path / "lab2_tma.ipynb"), NO_BASE_MOVE_D)
    ns = vars(import_notebook(nb, tmp_path / "check", "hint_check_cell"))
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check("lab2_tma", "d_build", ns)
    report = grade_in_process("lab2_tma", nb, ["d_build"])["d_build"].message
    for text in (str(info.value), report):
        assert text.count("pool.move_base_to(1024)") == 1 and "sm_90a and sm_100a: does not build:" in text
        assert "`tile` starts at byte 8 of shared memory, not a multiple of 1024" in text
        assert not _is_tvm_table(text) and "tma_explicit" not in text and len(text.splitlines()) <= 6


def test_a_kernel_part_that_does_not_lower_says_it_in_a_few_lines(tile_error):
    """A GPU check cell builds the kernel itself: the exception reaches describe_error raw."""
    from grader import notebook
    assert notebook.describe_error(tile_error) == hints.explain(tile_error)


def test_a_notebook_run_as_a_script_prints_its_parse_errors(tmp_path):
    """grader.notebook (every lab's second cell imports it) installs the hook."""
    ran = _run_script(tmp_path, "import grader.notebook")
    err = ran.stdout + ran.stderr
    assert "TVM_BACKTRACE" not in err and "error: Undefined variable: undefined_name" in err, err

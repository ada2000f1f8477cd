import json
import os
import subprocess
import sys

import pytest


def _grader(root, *args):
    env = dict(os.environ, PYTHONPATH=root, GRADER_CPU_ONLY="1")
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_check_writes_report_and_gradescope(root, tmp_path):
    rep, gs = tmp_path / "r.json", tmp_path / "g.json"
    p = _grader(root, "check", "lab1_roofline", "--part", "a_flops", "--part", "b_correct",
                "--json", str(rep), "--gradescope", str(gs))
    assert p.returncode == 0, p.stderr
    assert "[PASS] lab1_roofline/a_flops" in p.stdout
    assert "[SKIP] lab1_roofline/b_correct" in p.stdout and "GRADER_CPU_ONLY" in p.stdout
    data = json.loads(rep.read_text())
    assert [r["verdict"] for r in data["results"]] == ["passed", "skipped"]
    assert json.loads(gs.read_text())["score"] == 2.0


def test_unknown_lab_is_a_clear_error(root):
    p = _grader(root, "check", "lab9_nothing")
    assert p.returncode == 2 and "no lab 'lab9_nothing'" in p.stderr


@pytest.mark.slow
def test_strict_exit_code_for_the_student_version(root):
    p = _grader(root, "check", "lab1_roofline", "--part", "a_flops", "--strict",
                "--submission", os.path.join(root, "assignments", "lab1_roofline"))
    assert p.returncode == 1 and "not implemented" in p.stdout


@pytest.mark.slow
def test_compile_writes_generated_code_for_both_archs(root, tmp_path):
    p = _grader(root, "compile", "lab1_roofline", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    for arch in ("sm_90a", "sm_100a"):
        assert (tmp_path / f"build_scale_add.{arch}.cubin").stat().st_size > 0
        assert ".target " + arch in (tmp_path / f"build_scale_add.{arch}.ptx").read_text()


def test_help_imports_neither_torch_nor_tvm(root):
    """`python -m grader --help` (and a command's --help) answers at once: the modules that import
    torch or TVM are imported by the commands that use them."""
    script = ("import sys\nfrom grader import cli\nfor argv in (['--help'], ['check', '--help'], ['batch', '--help']):\n"
              "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
              "print('HEAVY', sorted(m for m in ('torch', 'tvm') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=root)
    p = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stdout, p.stdout[-500:]
    assert "--seed SECRET" in p.stdout and "any string" in p.stdout

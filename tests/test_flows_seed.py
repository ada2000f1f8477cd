"""The secret seed as the README documents it: `check --seed` takes any string and means what
GRADER_SECRET_SEED means, and the tests never write the course key into the real home folder."""
import json
import os
import subprocess
import sys

import pytest

from grader import inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOME_KEY = os.path.join(os.path.expanduser("~"), ".config", "modern-gpu-kernels", "seed.key")


def _check_seed_label(tmp_path, args, env_seed=None):
    """The seed a `check` run names in its report (an unreadable notebook: nothing to grade)."""
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": [ not json')
    out = tmp_path / f"report{len(list(tmp_path.iterdir()))}.json"
    env = dict(os.environ, PYTHONPATH=ROOT, GRADER_CPU_ONLY="1", GRADER_SEED_KEY_FILE=str(tmp_path / "key"))
    env.pop("GRADER_SECRET_SEED", None)
    if env_seed is not None:
        env["GRADER_SECRET_SEED"] = env_seed
    p = subprocess.run([sys.executable, "-m", "grader", "check", "lab1_roofline", "--part", "a_flops",
                        "--submission", str(bad), "--json", str(out), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text())["seed"]


@pytest.mark.slow
def test_a_string_seed_is_the_same_seed_as_the_variable(tmp_path):
    by_option = _check_seed_label(tmp_path, ["--seed", "hunter2"])
    by_variable = _check_seed_label(tmp_path, [], env_seed="hunter2")
    assert by_option.startswith("secret (fingerprint ") and by_option == by_variable
    assert _check_seed_label(tmp_path, ["--seed", "42"]) == _check_seed_label(tmp_path, [], env_seed="42")


def test_seed_of_is_the_derivation_of_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADER_SEED_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setattr(inputs, "_secret_read", False)
    monkeypatch.setenv("GRADER_SECRET_SEED", "42")
    assert inputs.seed_of("42") == inputs.run_seed() != 42
    assert inputs.seed_of("") == inputs.seed_of(None) == inputs.PUBLIC_SEED


def test_the_tests_keep_the_course_key_out_of_the_home_folder():
    existed = os.path.exists(HOME_KEY)
    path = inputs.seed_key_path()
    assert os.path.abspath(path) != HOME_KEY and not path.startswith(os.path.expanduser("~") + os.sep)
    inputs.derive_secret("a secret")
    assert os.path.exists(path)
    assert os.path.exists(HOME_KEY) == existed

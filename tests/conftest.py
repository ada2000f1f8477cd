import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from grader import hardware, inputs, report, run, spec, submission, worker  # noqa: E402


def pytest_collection_modifyitems(config, items):
    device = hardware.detect()
    if device.present:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {device.reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def root():
    return ROOT


def load_notebook(path):
    with open(path) as f:
        return json.load(f)


def edit_notebook(src, dst, replace):
    """Copy notebook ``src`` to ``dst`` with text replacements {old: new} applied to code cells
    (each replacement must apply at least once)."""
    nb = load_notebook(src)
    used = {k: 0 for k in replace}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for old, new in replace.items():
            if old in text:
                used[old] += 1
                text = text.replace(old, new)
        cell["source"] = text
    missing = [k for k, v in used.items() if not v]
    assert not missing, f"replacements not applied: {missing}"
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as f:
        json.dump(nb, f)
    return dst


@pytest.fixture
def edit(tmp_path):
    def _edit(src, replace, name=None):
        dst = tmp_path / "sub" / (name or os.path.basename(src))
        return edit_notebook(src, str(dst), replace)
    return _edit


def copy_course(root, dst):
    """A minimal course directory (config, solutions) for running nbgrader in isolation."""
    shutil.copy(os.path.join(root, "nbgrader_config.py"), dst)
    shutil.copytree(os.path.join(root, "solutions"), os.path.join(dst, "solutions"),
                    ignore=shutil.ignore_patterns("*.png", "generated", "__pycache__", ".ipynb_checkpoints"))


@pytest.fixture(scope="session")
def device():
    return hardware.detect()


def grade_in_process(lab, notebook, parts, workdir, seed=inputs.PUBLIC_SEED):
    """Grade CPU parts of a notebook as the sandbox's worker does (module file, static rules,
    import, grading function, verdict file), in this process: TVM is imported once, not once per
    part. The subprocess path itself is tested in tests/grader/test_sandbox.py and test_cli.py."""
    lab_spec = spec.load(lab)
    os.makedirs(workdir, exist_ok=True)
    module_path = submission.write_module(notebook, str(workdir))
    with open(module_path) as f:
        assert not submission.static_violations(f.read())
    results = {}
    for part in parts:
        assert not lab_spec.part(part).needs_gpu, part
        job = {"lab": lab, "part": part, "module_path": module_path, "seed": seed,
               "result_path": os.path.join(str(workdir), f"{part}.json"), "public_only": False}
        job_path = os.path.join(str(workdir), f"{part}.job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        worker.main(job_path)
        with open(job["result_path"]) as f:
            results[part] = report.PartResult(**json.load(f))
    return results


def grade_notebook(lab, notebook, workdir, device):
    """Every part of a notebook: CPU parts in this process, GPU parts through the sandbox (a
    subprocess each, with its time limit; skipped with the reason when there is no GPU)."""
    lab_spec = spec.load(lab)
    results = grade_in_process(lab, notebook, [p.id for p in lab_spec.parts if not p.needs_gpu], workdir)
    gpu_parts = [p.id for p in lab_spec.parts if p.needs_gpu]
    if gpu_parts:
        for r in run.check_lab(lab, notebook, inputs.PUBLIC_SEED, device, parts=gpu_parts, progress=lambda m: None):
            results[r.part] = r
    return results

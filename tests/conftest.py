import atexit
import json
import os
import shutil
import sys
import tempfile

import pytest

# The course key of the secret seed (grader/inputs.py) goes to a folder of this session, never
# to the real home folder; the graders the tests start inherit it.
_KEY_DIR = tempfile.mkdtemp(prefix="grader-test-key-")
atexit.register(shutil.rmtree, _KEY_DIR, True)
os.environ["GRADER_SEED_KEY_FILE"] = os.path.join(_KEY_DIR, "seed.key")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from grader import hardware, inputs, run, sandbox, submission, toolchain  # noqa: E402

# The session grades in its own processes, as `python -m grader` does: orphans of its children
# come back to it, to be killed and reaped at once (not left to init, which reaps when it will).
sandbox.protect_grader()
# It compiles many kernels in its own processes too: NVRTC parses the CUDA headers once each.
toolchain.reuse_headers()


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


def import_notebook(notebook, workdir, name="submission"):
    """Import a notebook's module cells in this process. For tests of reference code and of lab
    internals only: the grader itself never imports a submission (see grader/sandbox.py)."""
    import importlib.util
    module = submission.write_module(notebook, str(workdir))
    mod_spec = importlib.util.spec_from_file_location(name, module.path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def grade_in_process(lab, notebook, parts, workdir=None, seed=inputs.PUBLIC_SEED):
    """Grade parts of a notebook exactly as `python -m grader check` does (one sandboxed child
    for the notebook, trusted grading here); {part: PartResult}."""
    results = run.check_lab(lab, notebook, seed, hardware.detect(), parts=list(parts), progress=lambda m: None)
    return {r.part: r for r in results}


def grade_notebook(lab, notebook, workdir, device):
    """Every part of a notebook (GPU parts skipped, with the reason, where there is no GPU)."""
    results = run.check_lab(lab, notebook, inputs.PUBLIC_SEED, device, progress=lambda m: None)
    return {r.part: r for r in results}


def grade_with_builders(lab, part_id, builders, **params):
    """Grade one part in this process with ``builders`` ({name: function}) as the submission's
    module, the spec's params overridden by ``params``: for kernels that are not in a notebook
    (tests/published_kernels/). Returns the PartResult, with the verdict a student meets
    (grader/verdict.py)."""
    import dataclasses
    import types

    from grader import spec, verdict
    from grader.context import Context
    lab_spec = spec.load(lab)
    part = lab_spec.part(part_id)
    if params:
        part = dataclasses.replace(part, params={**part.params, **params})
    ctx = Context(lab_spec, part, inputs.PUBLIC_SEED, hardware.detect())
    return verdict.grade_part(types.SimpleNamespace(**builders), ctx)



def every_part_tests(lab):
    """The two tests each lab's folder runs (tests/<lab>/test_labN_every_part.py), one case per graded
    part: the reference solution passes (without a GPU, a GPU part says it was skipped and why),
    and the student version scores zero, failing with "not implemented" rather than an obscure
    error. Each notebook is graded once per session (one lab per file, so that the labs' gradings
    spread over the test workers)."""
    from grader import report, spec
    parts = [p.id for p in spec.load(lab).parts]
    graded = {}

    def results(version, device, tmp_path_factory):
        if version not in graded:
            nb = os.path.join(ROOT, version, lab, spec.load(lab).notebook)
            graded[version] = grade_notebook(lab, nb, tmp_path_factory.mktemp(f"{version}-{lab}"), device)
        return graded[version]

    @pytest.mark.slow
    @pytest.mark.parametrize("part", parts)
    def test_solution_passes(part, device, tmp_path_factory):
        r = results("solutions", device, tmp_path_factory)[part]
        if r.needs_gpu and not device.present:
            assert r.verdict == report.SKIPPED and "needs a GPU" in r.message
        elif spec.load(lab).part(part).thresholds:
            # Speed is recorded by the benchmark runs (reports/), not asserted here; the part must run.
            assert r.verdict in (report.PASSED, report.PARTIAL, report.FAILED) and "ratio" in r.measurements, r.message
        else:
            assert r.verdict == report.PASSED, r.message

    @pytest.mark.slow
    @pytest.mark.parametrize("part", parts)
    def test_student_version_scores_zero(part, device, tmp_path_factory):
        r = results("assignments", device, tmp_path_factory)[part]
        assert r.points == 0
        if r.needs_gpu and not device.present:
            assert r.verdict == report.SKIPPED
        else:
            assert r.verdict == report.FAILED and "not implemented" in r.message, r.message

    return test_solution_passes, test_student_version_scores_zero

"""For every lab and every graded part: the reference solution passes (or, without a GPU, the
part says it was skipped and why), and the student version scores zero, failing with "not
implemented" rather than an obscure error."""
import os

import pytest

from conftest import ROOT, grade_notebook
from grader import report, spec

CASES = [(lab, p.id) for lab in spec.lab_names() for p in spec.load(lab).parts]
_cache = {}


def _results(version, lab, device, tmp_path_factory):
    """Grade solutions/<lab> or assignments/<lab> once per session."""
    if (version, lab) not in _cache:
        nb = os.path.join(ROOT, version, lab, spec.load(lab).notebook)
        _cache[version, lab] = grade_notebook(lab, nb, tmp_path_factory.mktemp(f"{version}-{lab}"), device)
    return _cache[version, lab]


@pytest.mark.slow
@pytest.mark.parametrize("lab, part", CASES)
def test_solution_passes(lab, part, device, tmp_path_factory):
    r = _results("solutions", lab, device, tmp_path_factory)[part]
    if r.needs_gpu and not device.present:
        assert r.verdict == report.SKIPPED and "needs a GPU" in r.message
    elif spec.load(lab).part(part).thresholds:
        # Speed is recorded by the benchmark run (reports/), not asserted here; the part must run.
        assert r.verdict in (report.PASSED, report.PARTIAL, report.FAILED) and "ratio" in r.measurements, r.message
    else:
        assert r.verdict == report.PASSED, r.message


@pytest.mark.slow
@pytest.mark.parametrize("lab, part", CASES)
def test_student_version_scores_zero(lab, part, device, tmp_path_factory):
    r = _results("assignments", lab, device, tmp_path_factory)[part]
    assert r.points == 0
    if r.needs_gpu and not device.present:
        assert r.verdict == report.SKIPPED
    else:
        assert r.verdict == report.FAILED and "not implemented" in r.message, r.message

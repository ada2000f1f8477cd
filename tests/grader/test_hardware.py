import pytest

from grader import hardware


def test_exact_rows():
    spec, note = hardware.spec_for_name("NVIDIA H200", (9, 0))
    assert spec.name == "H200" and "exact" in note
    spec, _ = hardware.spec_for_name("NVIDIA B200", (10, 0))
    assert spec.name == "B200" and spec.track == "sm_100a"
    spec, _ = hardware.spec_for_name("NVIDIA H100 80GB HBM3", (9, 0))
    assert spec.name == "H100"


def test_unknown_gpu_falls_back_to_its_track_and_says_so():
    spec, note = hardware.spec_for_name("NVIDIA B300 SXM6", (10, 3))
    assert spec.name == "B200" and "fallback" in note
    spec, note = hardware.spec_for_name("NVIDIA GH200 480GB", (9, 0))
    assert spec.name == "H200" and "fallback" in note


def test_non_course_gpu_has_no_row():
    spec, note = hardware.spec_for_name("NVIDIA A100-SXM4-80GB", (8, 0))
    assert spec is None and "not a course GPU" in note


def test_cpu_only_mode_is_forced_by_env(monkeypatch):
    monkeypatch.setenv("GRADER_CPU_ONLY", "1")
    d = hardware.detect()
    assert not d.present and "GRADER_CPU_ONLY" in d.reason


@pytest.mark.parametrize("name", list(hardware.SPECS))
def test_spec_table_is_consistent(name):
    s = hardware.SPECS[name]
    assert s.track in hardware.TRACKS
    assert 50 < s.ridge_point < 400
    assert s.peak_flops == s.fp16_tflops * 1e12

import importlib

import pytest

from grader import dispatch, hardware, inspect, spec

LABS = spec.lab_names()


def test_there_are_labs():
    assert "lab1_roofline" in LABS


@pytest.mark.parametrize("lab", LABS)
def test_spec_loads_and_every_part_has_a_grading_function(lab):
    s = spec.load(lab)
    graders = importlib.import_module(f"grader.labs.{lab}").GRADERS
    for p in s.parts:
        dispatch.grading_function(lab, p)        # KeyError when a part has neither its own nor a default runner
    assert set(graders) <= {p.id for p in s.parts}
    assert s.max_points > 0


@pytest.mark.parametrize("lab", LABS)
def test_mechanisms_named_in_specs_exist(lab):
    for p in spec.load(lab).parts:
        for m in p.mechanisms:
            assert m in inspect.MECHANISMS, f"{lab}.{p.id}: unknown mechanism {m}"


@pytest.mark.parametrize("lab", LABS)
def test_thresholds_match_the_lock(lab):
    """A threshold change must bump thresholds_version and rewrite the lock (python -m grader.spec)
    in the same commit, with the justifying measurement named in the table's `source`."""
    s = spec.load(lab)
    lock = spec.read_lock()[lab]
    assert lock["version"] == s.thresholds_version, "thresholds_version changed without updating the lock"
    assert lock["digest"] == spec.thresholds_digest(s), (
        f"{lab}'s thresholds changed: bump thresholds_version, name the measurement in `source`, "
        f"run `python -m grader.spec`")


@pytest.mark.parametrize("lab", LABS)
def test_b200_rows_say_they_are_uncalibrated(lab):
    for p in spec.load(lab).parts:
        for row, th in p.thresholds.items():
            assert th.source
            if row == "B200":
                assert th.status.startswith("uncalibrated"), f"{lab}.{p.id}: B200 was never measured here"


def test_gpu_without_row_uses_its_track_row():
    p = spec.load("lab1_roofline").part("b_speed")
    th, note = p.threshold_for(hardware.SPECS["H100"])
    assert th is p.thresholds["H200"] and "no row for H100" in note
    th, note = p.threshold_for(hardware.SPECS["H200"])
    assert note == "threshold row H200"


def test_invalid_threshold_is_rejected():
    with pytest.raises(ValueError):
        spec._parse_threshold({"metric": "m", "floor": 0.9, "full": 0.5, "status": "s", "source": "x"}, "t")

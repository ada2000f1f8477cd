"""The one dispatch (grader/dispatch.py) and the toolkit's recording mode (grading.recording)."""
import types

import pytest

from grader import dispatch, grading, hardware, inputs, runners, spec
from grader.context import Context

LAB = "lab5_gemm_pipeline"


def _ctx(part_id, public_only=True):
    lab_spec = spec.load(LAB)
    return Context(lab_spec, lab_spec.part(part_id), inputs.PUBLIC_SEED, hardware.Device(False, "", None, "", "test"),
                   public_only=public_only)


def test_own_function_then_declared_question_then_default_runner(monkeypatch):
    part = spec.load(LAB).part("a_ring")
    own = lambda module, ctx: None  # noqa: E731
    hooks = {"GRADERS": {"a_ring": own}, "QUESTIONS": dispatch.lab_questions(LAB)}
    monkeypatch.setattr(dispatch, "_hook", lambda lab, name: hooks.get(name, {}))
    assert dispatch.grading_function(LAB, part) is own
    hooks["GRADERS"] = {}
    fn = dispatch.grading_function(LAB, part)
    assert fn.func is grading.grade_question and fn.args == (dispatch.lab_questions(LAB)["a_ring"],)
    hooks["QUESTIONS"] = {}
    with pytest.raises(KeyError, match="no grading function"):
        dispatch.grading_function(LAB, part)                  # a function part has no default runner
    assert dispatch.grading_function(LAB, spec.load(LAB).part("s5_correct")) is runners.kernel_part


def test_a_declared_question_grades_right_and_wrong_answers():
    ctx = _ctx("a_ring")
    q = dispatch.lab_questions(LAB)["a_ring"]
    names = ctx.part.params["functions"]
    right = types.SimpleNamespace(**dict(zip(names, q.answers.values())))
    assert dispatch.grade(LAB, "a_ring", right, ctx).fraction == 1.0
    wrong = types.SimpleNamespace(**{n: (lambda *a: -1) for n in names})
    out = dispatch.grade(LAB, "a_ring", wrong, ctx)
    assert out.fraction == 0.0 and "got -1" in out.message


def test_recording_hands_the_tables_over_instead_of_grading():
    calls = []

    def student_fn(x):
        calls.append(x)
        return x

    class Recorder:
        def __init__(self):
            self.tables = []

        def grade_cases(self, fn, cases):
            self.tables.append(list(cases))
            return "recorded"

    table = [((1,), 1), ((2,), 3)]
    with grading.recording(Recorder()) as rec:
        assert grading.grade_cases(student_fn, table, lambda g, e: g == e, str) == "recorded"
    assert rec.tables == [table] and calls == []               # nothing of the submission ran
    out = grading.grade_cases(student_fn, table, lambda g, e: g == e, str)   # outside: graded again
    assert calls == [1, 2] and out.fraction == 0.5

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
    from grader import report, verdict
    ctx = _ctx("a_ring")
    q = dispatch.lab_questions(LAB)["a_ring"]
    names = ctx.part.params["functions"]
    right = types.SimpleNamespace(**dict(zip(names, q.answers.values())))
    assert verdict.grade_part(right, ctx).verdict == report.PASSED
    wrong = types.SimpleNamespace(**{n: (lambda *a: -1) for n in names})
    out = verdict.grade_part(wrong, ctx)
    assert out.verdict == report.FAILED and out.points == 0 and "got -1" in out.message


def test_recording_hands_the_declared_calls_over_instead_of_grading():
    calls = []

    def student_fn(x):
        calls.append(x)
        return x

    class Recorder:
        def __init__(self):
            self.added = []

        def add(self, name, args, expected, how):
            self.added.append((name, args, expected, how))

    q = grading.Question(lambda ctx: [("sq", (1,)), ("sq", (2,)), ("sq", (3,), True)], answers={"sq": lambda x: x * x},
                         params={"sq": ("x",)}, compare="close")
    ctx = types.SimpleNamespace(part=types.SimpleNamespace(params={"function": "square", "rel_tol": 1e-6}),
                                public_only=True)
    module = types.SimpleNamespace(square=student_fn)
    with grading.recording(Recorder()) as rec:
        grading.grade_question(q, module, ctx)
    from grader.edition import release
    with pytest.raises(grading.NotRecordable):                # what the edition cannot record
        grading.student(release._NoSubmission(), "square")(3)
    assert calls == []                                        # nothing of the submission ran
    assert rec.added == [("square", (1,), 1, {"kind": "close", "rel": 1e-6}),
                         ("square", (2,), 4, {"kind": "close", "rel": 1e-6})]   # the hidden call is not recorded
    out = grading.grade_question(q, module, ctx)              # outside: graded
    assert calls == [1, 2, 3] and out.fraction == pytest.approx(1 / 3)
    assert "first wrong: square(x=2): got 2, expected 4" in out.message
    hidden_wrong = grading.grade_question(q, types.SimpleNamespace(square=lambda x: x * x if x < 3 else 0), ctx)
    assert "hidden case #1" in hidden_wrong.message and "9" not in hidden_wrong.message   # its answer is not shown


def test_a_question_compares_each_kind_as_declared():
    q = grading.Question(lambda ctx: [("a", ([3, 1, 2],), False), ("b", (2.0,), False)], answers={"a": sorted, "b": lambda x: x},
                         params={"a": ("xs",), "b": ("x",)}, compare={"b": "int"})
    ctx = types.SimpleNamespace(part=types.SimpleNamespace(params={"functions": ["f", "g"]}), public_only=True)
    good = types.SimpleNamespace(f=lambda xs: [1, 2, 3], g=lambda x: 2)
    assert grading.grade_question(q, good, ctx).fraction == 1.0
    bad = types.SimpleNamespace(f=lambda xs: (1, 2, 3), g=lambda x: 2.5)      # a tuple is a list; 2.5 is not 2
    out = grading.grade_question(q, bad, ctx)
    assert out.fraction == 0.5 and "(f 1/1, g 0/1)" in out.message


def test_every_comparison_of_the_registry_can_fail():
    from grader import compare
    tol = {"rel": 1e-3, "abs": 1e-3}
    cases = {"same": ([1, [2, 3]], (1, (2, 3)), [1, [2, 4]]),
             "same_sorted": ({"a": [2, 1]}, {"a": [1, 2]}, {"a": [1, 3]}),
             "close": (1.0005, 1.0, 1.01),
             "time_bound": ((1.0, "memory"), (1.0, "memory"), (1.0, "compute")),
             "int": (3.0, 3, 3.5),
             "int_rows": ([[1, 2]], [[1, 2]], [[1, 3]]),
             "allclose": ({"x": [1.0]}, {"x": [1.0]}, {"x": [float("nan")]})}
    assert set(cases) == set(compare.ANSWERS)
    for kind, (good, expected, bad) in cases.items():
        same = compare.answer_check(kind, tol)
        assert same(good, expected), kind
        assert not same(bad, expected), kind
        assert not same(object(), expected), kind
    with pytest.raises(KeyError, match="no comparison named"):
        compare.answer_check("roughly")


def test_the_edition_compares_with_the_same_registry():
    from grader import compare
    from grader.edition import tables
    assert all(tables.COMPARE[k] is fn for k, fn in compare.ANSWERS.items())

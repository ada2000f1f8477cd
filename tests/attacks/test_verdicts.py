"""The verdict of a part (grader/verdict.py): one owner that the command line's grading, the GPU
harness and the notebook's check cells all call; hidden inputs leak nothing through an answer, an
exception, its type or what the submission printed, in their part or in another part's public
cases; a cell with a syntax error is named as such by the check cell; the grading machine's
failure is its own verdict and never exits 0."""
import ast
import json
import os
import types

import pytest

from grader import cli, dispatch, hardware, inputs, notebook, report, run, sandbox, spec, verdict
from grader.context import Context, Outcome

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = "lab1_roofline"
STUDENT = os.path.join(ROOT, "assignments", LAB, f"{LAB}.ipynb")
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
SECRET_SEED = 987654321                   # not inputs.PUBLIC_SEED: hidden cases nobody saw
NO_GPU = hardware.Device(False, "", None, "", reason="no GPU in this test")


def _notebook(tmp_path, answers: dict[str, str]) -> str:
    """The student notebook with the todo("<grade id>") line of each answer replaced by its body."""
    with open(STUDENT) as f:
        nb = json.load(f)
    for grade_id, body in answers.items():
        marker = f'todo("{grade_id}")'
        cell = next(c for c in nb["cells"] if marker in "".join(c["source"]))
        cell["source"] = "".join(cell["source"]).replace(marker, body.replace("\n", "\n    "))
    d = tmp_path / "student"
    d.mkdir(exist_ok=True)
    (d / f"{LAB}.ipynb").write_text(json.dumps(nb))
    return str(d / f"{LAB}.ipynb")


def _ctx(part_id: str, public_only: bool = False, seed: int = SECRET_SEED) -> Context:
    lab_spec = spec.load(LAB)
    return Context(lab_spec, lab_spec.part(part_id), seed, NO_GPU, public_only=public_only)


def _hidden_ops(part_id: str) -> list[dict]:
    ctx = _ctx(part_id)
    calls = dispatch.lab_questions(LAB)[part_id].cases(ctx)
    n_public = len(dispatch.lab_questions(LAB)[part_id].cases(_ctx(part_id, public_only=True)))
    return [args[0] for _, args in calls[n_public:]]


# ---------------------------------------------------------------- hidden cases leak nothing

RECORD_AND_RAISE = ("seen = globals().setdefault('_seen_{name}', [])\n"
                    "seen.append(op)\n"
                    "print('called with', op, flush=True)\n"
                    "if len(seen) == {total}:\n"
                    "    raise {error}(repr(seen))\n"
                    "return 0")


@pytest.mark.slow
def test_a_function_that_records_its_inputs_and_raises_leaks_no_hidden_input(tmp_path):
    hidden = {p: _hidden_ops(p) for p in ("a_flops", "a_bytes")}
    total = {p: len(dispatch.lab_questions(LAB)[p].cases(_ctx(p))) for p in hidden}
    nb = _notebook(tmp_path, {
        "a_flops": RECORD_AND_RAISE.format(name="flops", total=total["a_flops"], error="ValueError"),
        # its class's name is the leak: type(name, bases, {}) makes a class of any name
        "a_bytes": RECORD_AND_RAISE.format(name="bytes", total=total["a_bytes"],
                                           error="type(repr(seen), (Exception,), {})"),
    })
    notes: list[str] = []
    res = {r.part: r for r in run.check_lab(LAB, nb, SECRET_SEED, NO_GPU, parts=["a_flops", "a_bytes"],
                                            progress=lambda m: None, notes=notes)}
    text = json.dumps([r.to_dict() for r in res.values()]) + json.dumps(notes)
    for part, ops in hidden.items():
        assert len(ops) == 24
        for op in ops:                        # neither the recorded inputs nor any one of them
            assert repr(op) not in text and json.dumps(op) not in text, (part, op)
    assert res["a_flops"].verdict == report.ERROR and res["a_flops"].points == 0
    assert res["a_flops"].message.startswith("hidden case #24 raised ValueError"), res["a_flops"].message
    assert res["a_bytes"].message.startswith("hidden case #24 raised an exception of its own class"), \
        res["a_bytes"].message
    assert any("not shown when hidden cases are graded" in n for n in notes), notes


# One child answers every part: op_flops records the hidden inputs of a_flops (graded first), and
# the public cases of a_bytes and a_predict give them back as an answer, an exception, a print.
RECORD = ("globals().setdefault('_seen', []).append(op)\n"
          "return 0")
LEAK_BY_ANSWER = ("leaked = _seen[{public}:]\n"
                  "print('recorded', leaked, flush=True)\n"
                  "if not leaked:\n"
                  "    raise RuntimeError('a_flops was not graded first')\n"
                  "return leaked[0]")
LEAK_BY_EXCEPTION = ("leaked = _seen[{public}:]\n"
                     "print('recorded', leaked, flush=True)\n"
                     "if not leaked:\n"
                     "    raise RuntimeError('a_flops was not graded first')\n"
                     "raise ValueError(repr(leaked))")


@pytest.mark.slow
def test_hidden_inputs_recorded_in_one_part_are_not_shown_by_another_parts_public_cases(tmp_path):
    public = len(dispatch.lab_questions(LAB)["a_flops"].cases(_ctx("a_flops", public_only=True)))
    hidden = _hidden_ops("a_flops")
    nb = _notebook(tmp_path, {"a_flops": RECORD, "a_bytes": LEAK_BY_ANSWER.format(public=public),
                              "a_predict": LEAK_BY_EXCEPTION.format(public=public)})
    notes: list[str] = []
    results = run.check_lab(LAB, nb, SECRET_SEED, NO_GPU, parts=["a_flops", "a_bytes", "a_predict"],
                            progress=lambda m: None, notes=notes, workers=1)
    res = {r.part: r for r in results}
    # the leaks happened (a_flops was graded first): a_bytes answered its first public case with
    # what it recorded, a_predict raised on its first one
    assert res["a_bytes"].message.startswith("0/30 cases right [6 public, 24 hidden]; first wrong: op_bytes(op={'kind': 'elementwise'"), \
        res["a_bytes"].message
    assert res["a_predict"].verdict == report.ERROR and "ValueError" in res["a_predict"].message, \
        res["a_predict"].message
    # ... and nothing of them is shown: not in a message, the notes, the console table or the JSON report
    rep = report.Report(results, run.device_facts(NO_GPU), inputs.seed_label(SECRET_SEED), nb, notes=notes)
    text = json.dumps(rep.to_dict()) + report.format_table(results) + "\n".join(notes)
    assert len(hidden) == 24
    for op in hidden:
        assert repr(op) not in text and json.dumps(op) not in text, op
    assert "wrong answer, expected" in res["a_bytes"].message, res["a_bytes"].message
    assert res["a_predict"].message.startswith("predict(op={'kind': 'elementwise'"), res["a_predict"].message
    assert "raised ValueError" in res["a_predict"].message, res["a_predict"].message
    for part in ("a_bytes", "a_predict"):
        assert f"`python -m grader check {LAB} --public`" in res[part].message, res[part].message
    assert any("not shown when hidden cases are graded" in n for n in notes), notes


def test_public_only_grading_shows_the_answer_and_the_exception():
    """A check cell or `check --public` grades no hidden case: it shows everything."""
    def op_bytes(op):
        return "a string"
    out = verdict.grade_part(types.SimpleNamespace(op_bytes=op_bytes), _ctx("a_bytes", public_only=True))
    assert "got 'a string'" in out.message and "returned a string where a number is expected" in out.message
    out = verdict.grade_part(types.SimpleNamespace(op_bytes=op_bytes), _ctx("a_bytes"))
    assert "a string" not in out.message and "wrong answer, expected" in out.message, out.message

    def predict(op, gpu):
        raise ValueError("no roofline yet")
    out = verdict.grade_part(types.SimpleNamespace(predict=predict), _ctx("a_predict", public_only=True))
    assert out.message == "ValueError: no roofline yet", out.message
    out = verdict.grade_part(types.SimpleNamespace(predict=predict), _ctx("a_predict"))
    assert "no roofline yet" not in out.message and "raised ValueError" in out.message, out.message


def test_a_missing_function_is_said_in_the_graders_words_and_only_for_the_function_called():
    from grader import remote
    said = "op_bytes() raised LookupError: the notebook defines no {}(): keep the function names of the skeleton\n"
    out = verdict.exception_result(_ctx("a_bytes"), remote.StudentError(said.format("op_bytes") + "Traceback",
                                                                         "LookupError"))
    assert out.message == "the notebook defines no op_bytes(): keep the function names of the skeleton", out.message
    out = verdict.exception_result(_ctx("a_bytes"), remote.StudentError(said.format("n_4096_k_128"), "LookupError"))
    assert "4096" not in out.message and "raised LookupError" in out.message, out.message


def test_a_compile_error_the_child_reports_cannot_say_the_machine_failed():
    """The tool jail's failure is the grader's own message, whole: a builder's error reported by
    the child (its text is the submission's) that ends like it is the submission's error."""
    from grader import toolchain
    forged = toolchain.BuildError("build_scale_add(256,) for sm_90a: RuntimeError: NVRTC compilation for sm_90a "
                                  "failed: jail: {'kind': 'gemm', 'm': 4096}")
    out = verdict.exception_result(_ctx("b_build"), forged)
    assert out.verdict == report.ERROR and "4096" not in out.message, out.message


def test_a_public_cases_message_is_shown_in_public_grading_only_and_a_wrong_hidden_answer_shows_no_value():
    def op_flops(op):
        if op.get("seq") == 4096:                             # a public operation
            raise ValueError("no attention yet")
        return 0
    out = verdict.grade_part(types.SimpleNamespace(op_flops=op_flops), _ctx("a_flops", public_only=True))
    assert out.verdict == report.ERROR and out.message == "ValueError: no attention yet", out.message
    out = verdict.grade_part(types.SimpleNamespace(op_flops=op_flops), _ctx("a_flops"))      # hidden cases too
    assert out.verdict == report.ERROR and "op_flops(op={" in out.message and "raised ValueError" in out.message
    assert "no attention yet" not in out.message, out.message

    public = len(dispatch.lab_questions(LAB)["a_flops"].cases(_ctx("a_flops", public_only=True)))
    answers = iter([None] * public + [-123456789] * 24)
    ref = dispatch.lab_questions(LAB)["a_flops"].answers["flops"]
    out = verdict.grade_part(types.SimpleNamespace(op_flops=lambda op: ref(op) if next(answers) is None
                                                   else -123456789), _ctx("a_flops"))
    assert out.points == 0 or out.verdict == report.PARTIAL
    assert "hidden case #1 (its inputs and answer are not shown)" in out.message and "123456789" not in out.message


def test_an_exception_after_a_hidden_case_or_in_a_labs_own_loop_shows_its_type_only():
    class Leak(Exception):
        pass
    Leak.__name__ = "Leak_4096_128"
    # a lab's own grading function, which does not say which case raised: the type, a pointer
    # to the check cell, nothing the submission wrote
    out = verdict.exception_result(_ctx("a_flops"), ValueError("secret inputs [4096, 128]"))
    assert out.verdict == report.ERROR and "ValueError" in out.message and "4096" not in out.message
    assert "check cell" in out.message
    out = verdict.exception_result(_ctx("a_flops"), Leak("x"))
    assert "Leak_4096" not in out.message and "an exception of its own class" in out.message
    # a kernel's failure on the GPU is named by the grader's or torch's type, still without its text
    from grader import launch
    out = verdict.exception_result(_ctx("a_flops"), launch.LaunchError("sync: CUDA error 719 for n=4096"))
    assert "LaunchError" in out.message and "own class" not in out.message and "4096" not in out.message
    # public-only grading (a check cell, check --public) says everything
    out = verdict.exception_result(_ctx("a_flops", public_only=True), ValueError("bad kind 'gemm'"))
    assert out.message == "ValueError: bad kind 'gemm'"
    # the printed output of a child that crashed while it answered is cut off
    crash = sandbox.SandboxFailure("the process running your code exited with code 3 (closed); last output:\n"
                                   "{'kind': 'gemm', 'm': 4096}")
    out = verdict.exception_result(_ctx("a_flops"), crash)
    assert "exited with code 3" in out.message and "4096" not in out.message


# ---------------------------------------------------------------- syntax errors, named by the check cell

@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    sh.user_ns["__session__"] = SOLUTION          # the saved notebook Jupyter names
    notebook._Cells.watch(sh)                     # what importing grader.notebook in a kernel does
    yield sh
    InteractiveShell.clear_instance()


def _saved_cell(grade_id: str) -> tuple[str, str]:
    """(the cell's id, its name as the grader's report gives it) of an answer cell of the saved notebook."""
    from grader import submission
    cells = json.load(open(SOLUTION))["cells"]
    i, cell = next((i, c) for i, c in enumerate(cells)
                   if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return cell["id"], submission.Cell(i, grade_id, "").label


A_BYTES_ID, A_BYTES = _saved_cell("a_bytes")     # e.g. "cell 8 (a_bytes)"


def test_a_cell_with_a_syntax_error_is_named_by_the_check_cell(shell):
    shell.run_cell("from grader.notebook import check", store_history=True)
    shell.run_cell("def op_bytes(op):\n    return 0\n", store_history=True, cell_id=A_BYTES_ID)
    shell.run_cell("def op_bytes(op:\n    return 0\n", store_history=True, cell_id=A_BYTES_ID)   # edited, broken
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_bytes", shell.user_ns)      # not graded on the stale definition
    text = str(info.value)
    assert A_BYTES.startswith("cell ") and f"{A_BYTES} has a syntax error (line 1)" in text, text
    assert "got 0" not in text and "defines no" not in text


def test_a_function_never_defined_for_a_syntax_error_is_not_called_missing(shell):
    shell.run_cell("def op_bytes(op):\n    return op['n'] +\n", store_history=True, cell_id=A_BYTES_ID)
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_bytes", shell.user_ns)
    text = str(info.value)
    assert f"{A_BYTES} has a syntax error (line 2)" in text and "defines no op_bytes" not in text, text
    shell.run_cell("def op_bytes(op):\n    return 0\n", store_history=True, cell_id=A_BYTES_ID)    # fixed
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_bytes", shell.user_ns)
    assert "syntax error" not in str(info.value) and "got 0" in str(info.value)


def test_the_check_cell_names_cells_and_shows_answers_as_the_grader_does(shell):
    shell.run_cell("def predict(op, gpu):\n    return (1.0, 'memory')\n", store_history=True,
                   cell_id=_saved_cell("a_predict")[0])
    flops_id, flops_cell = _saved_cell("a_flops")
    shell.run_cell("def op_flops(op):\n    return None + 1\n", store_history=True, cell_id=flops_id)
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_predict", shell.user_ns)
    assert "got [1.0, 'memory']" in str(info.value), str(info.value)      # a list, as JSON brings it to the grader
    with pytest.raises(notebook.CheckFailed) as info:
        notebook.check(LAB, "a_flops", shell.user_ns)
    assert f"In {flops_cell}, line 2, in op_flops" in str(info.value), str(info.value)   # as the grader says it


# ---------------------------------------------------------------- the grading machine's failures

def test_a_jail_that_cannot_be_set_up_is_not_the_students_error_and_check_exits_non_zero(monkeypatch, capsys):
    real = sandbox.jail_config

    def broken(scratch, argv, *args, **kwargs):     # the child's jail (not the probe's, not a tool's) asks
        cfg = real(scratch, argv, *args, **kwargs)    # for a device node that is not there: jail.py cannot bind it
        if "grader.child" in argv:
            cfg["devices"] = list(cfg["devices"]) + ["no-such-device-of-this-test"]
        return cfg
    monkeypatch.setattr(sandbox, "jail_config", broken)
    monkeypatch.setattr(sandbox, "protect_grader", lambda: None)
    monkeypatch.setattr(inputs, "restart_without_secret", lambda argv: None)
    monkeypatch.setattr("signal.signal", lambda *a: None)
    monkeypatch.setenv("GRADER_CPU_ONLY", "1")
    rc = cli.main(["check", LAB, "--part", "a_flops", "--submission", SOLUTION, "--workers", "1"])
    out = capsys.readouterr().out
    assert rc != 0 and rc == cli.EXIT_NOT_GRADED, out
    assert "[INFR] lab1_roofline/a_flops" in out and "the grading machine failed, not your submission" in out, out
    assert "NOT GRADED: 1 part(s) (a_flops)" in out


def test_a_jail_setup_failure_and_a_tool_jail_failure_are_infrastructure_a_forged_exit_is_not():
    e = sandbox.JailSetupFailed("the grader could not start the jail: mount /x on /root/x: No such file")
    out = verdict.exception_result(_ctx("a_flops"), e)
    assert out.verdict == report.INFRASTRUCTURE and "mount /x" in out.message
    forged = sandbox.SandboxFailure("the process running your cells exited with code 125 before it was ready "
                                    "(closed); last output:\njail: mount /x on /root/x: No such file or directory\n")
    assert verdict.exception_result(_ctx("a_flops"), forged).verdict != report.INFRASTRUCTURE
    from grader import toolchain
    out = verdict.exception_result(_ctx("a_flops"), toolchain.BuildError(
        "NVRTC compilation for sm_90a failed: jail: unshare: Operation not permitted"))
    assert out.verdict == report.INFRASTRUCTURE


def test_a_gpu_harness_that_cannot_start_is_infrastructure(monkeypatch):
    from grader import channel
    h = run.Harness()

    def fails():
        raise channel.ChannelClosed("the harness ended before it was ready")
    monkeypatch.setattr(h, "start", fails)
    part = spec.load(LAB).part("b_correct")
    res = h._grade({"lab": LAB, "part": "b_correct"}, types.SimpleNamespace(deadline=0.0), part)
    assert res.verdict == report.INFRASTRUCTURE and "could not start" in res.message


# ---------------------------------------------------------------- one owner

def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out |= {f"{node.module or ''}.{a.name}".lstrip(".") for a in node.names} | {node.module or ""}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_the_harness_and_the_notebook_do_not_import_the_orchestrator():
    for name in ("harness.py", "notebook.py"):
        found = _imports(os.path.join(ROOT, "grader", name))
        assert not {"run", "grader.run"} & found, (name, found)


def test_the_cli_the_harness_and_the_check_cell_grade_through_the_owner(monkeypatch, tmp_path):
    seen = []

    def owner(module, ctx, lower=None, describe=None):
        seen.append(ctx.part.id)
        return ctx.to_result(Outcome(1.0, "graded by the owner"))
    monkeypatch.setattr(verdict, "grade_part", owner)
    res = run.check_lab(LAB, SOLUTION, inputs.PUBLIC_SEED, NO_GPU, parts=["a_flops"], progress=lambda m: None)
    assert res[0].message == "graded by the owner" and seen == ["a_flops"]
    from grader import harness
    res = harness.grade({"lab": LAB, "part": "a_bytes", "seed": 1, "public_only": True},
                        types.SimpleNamespace(end=lambda: None), NO_GPU)
    assert res.message == "graded by the owner" and seen[-1] == "a_bytes"
    notebook.check(LAB, "a_predict", {})
    assert notebook.last_result(LAB, "a_predict").message == "graded by the owner" and seen[-1] == "a_predict"


def test_ptxas_stopped_without_a_word_is_retried_then_the_machines_failure(monkeypatch):
    """A check-all run with four labs graded at once on an H100 saw ptxas end with no output on a
    student's sm_100a build (it built alone, the same minute): scored as "does not build" it cost
    the student half a build part. ptxas ending without a word is now run once more; after two
    silences a small known-good kernel decides: if ptxas cannot assemble it either, the machine
    failed (the infrastructure verdict, graded again, in a build part too); if it can, a third
    silence on the kernel is the kernel's, so that a PTX that stops ptxas every time cannot keep
    its part ungraded. ptxas's own error is the kernel's, at the first run."""
    from grader import build, grading, launch, toolchain
    calls = []

    def tool(replies):
        def run_tool(argv, inputs, outputs, **kw):
            calls.append(argv[0])
            return replies.pop(0) if len(replies) > 1 else replies[0]
        return run_tool
    monkeypatch.setattr(toolchain, "tool", lambda name: "/usr/bin/ptxas")
    monkeypatch.setattr(sandbox, "run_tool", tool([(-9, "", {}), (0, "ptxas info", {"k.cubin": b"CUBIN"})]))
    assert launch.assemble(".version 8.0", "sm_100a") == (b"CUBIN", "ptxas info") and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(sandbox, "run_tool", tool([(-9, "", {})]))
    with pytest.raises(launch.AssemblyFailed) as silent:
        launch.assemble(".version 8.0", "sm_100a")
    assert len(calls) == 3 and "exit status -9, -9" in str(silent.value)
    assert "known-good kernel did not assemble either" in str(silent.value)

    # The known-good kernel assembles: the kernel's third run decides, and a third silence is its own.
    def by_input(kernel):
        def run_tool(argv, inputs, outputs, **kw):
            ptx = inputs["k.ptx"].decode()
            calls.append("known_good" if "known_good" in ptx else "kernel")
            if "known_good" in ptx:
                assert ptx == launch.KNOWN_GOOD_PTX.format(arch="sm_100a")      # nothing of the submission's
                return 0, "ptxas info", {"k.cubin": b"GOOD"}
            return kernel.pop(0) if len(kernel) > 1 else kernel[0]
        return run_tool
    calls.clear()
    monkeypatch.setattr(sandbox, "run_tool", by_input([(-11, "", {}), (-11, "", {}), (0, "", {"k.cubin": b"K"})]))
    assert launch.assemble(".version 8.0", "sm_100a")[0] == b"K"
    assert calls == ["kernel", "kernel", "known_good", "kernel"]
    calls.clear()
    monkeypatch.setattr(sandbox, "run_tool", by_input([(-11, "", {})]))
    with pytest.raises(launch.AssemblyFailed) as kernels:      # a forged version in a comment changes nothing
        launch.assemble("/*\n.version 99.9\n*/\n.version 8.0", "sm_100a")
    assert calls == ["kernel", "kernel", "known_good", "kernel"]
    assert "three times (exit status -11, -11, -11" in str(kernels.value)
    assert not grading.machine_failed(toolchain.BuildError(str(kernels.value)))
    assert verdict.exception_result(_ctx("a_flops"), toolchain.BuildError(str(kernels.value))).verdict != report.INFRASTRUCTURE
    calls.clear()
    monkeypatch.setattr(sandbox, "run_tool", tool([(-9, "", {})]))
    with pytest.raises(launch.AssemblyFailed) as silent:
        launch.assemble(".version 8.0", "sm_100a")
    as_built = toolchain.BuildError(str(silent.value))        # as build.assembled passes it on
    assert grading.machine_failed(as_built)
    assert verdict.exception_result(_ctx("a_flops"), as_built).verdict == report.INFRASTRUCTURE
    calls.clear()
    monkeypatch.setattr(sandbox, "run_tool", tool([(255, "ptxas fatal   : Unresolved extern function 'f'", {})]))
    with pytest.raises(launch.AssemblyFailed) as own:
        launch.assemble(".version 8.0", "sm_100a")
    assert len(calls) == 1 and not grading.machine_failed(toolchain.BuildError(str(own.value)))

    # In a build part: the machine's failure is the part's verdict; the kernel's is scored per arch.
    module = types.SimpleNamespace(build_scale_add=lambda n: object())
    for error, machine in ((as_built, True), (toolchain.BuildError(str(own.value)), False)):
        def compile_only(*a, error=error, **k):
            raise error
        monkeypatch.setattr(build, "compile_only", compile_only)
        if machine:
            with pytest.raises(toolchain.BuildError):
                grading.build_part(module, _ctx("b_build"))
        else:
            out = grading.build_part(module, _ctx("b_build"))
            assert out.fraction == 0.0 and "does not build: ptxas for sm_100a failed: ptxas fatal" in out.message, out

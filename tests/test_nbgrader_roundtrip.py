"""The nbgrader round trip exactly as README.md tells instructors, in a copy of the course.

The README's two instructor command blocks ("For instructors", nbgrader) are read from README.md
and run as written, in order; between them three students fetch lab 1 from the exchange and
submit it: alice the reference solution, bob a partial solution that also defines
``grade(...)`` to return 100, carol no solution but a ``grade`` that prints a fake score, a cell
of her own that prints the environment's GRADER_SECRET_SEED, and forged outputs saved in every
graded cell. Autograding runs with GRADER_SECRET_SEED set. One run serves every test below.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import types

import pytest

from conftest import load_notebook

LAB = "lab1_roofline"
SECRET = "73914802655"   # GRADER_SECRET_SEED during autograding: must show up nowhere
STUDENTS = ("alice", "bob", "carol")
SECTION = ("**Releasing, collecting, autograding (nbgrader).**", "**Without nbgrader")


def readme_blocks(root):
    """The bash blocks of the README's instructor nbgrader section, as lists of commands."""
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    start = text.index(SECTION[0])
    section = text[start:text.index(SECTION[1], start)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [[shlex.join(shlex.split(line, comments=True)) for line in block.splitlines()
                 if shlex.split(line, comments=True)] for block in blocks]
    return commands


def _env(root, tmp):
    env = {k: v for k, v in os.environ.items() if k not in ("GRADER_SECRET_SEED", "PYTHONPATH")}
    env["PYTHONPATH"] = root
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["JUPYTER_CONFIG_DIR"] = str(tmp / "jupyter-config")   # no user-level nbgrader config
    return env


def _sh(command, cwd, env, log):
    proc = subprocess.run(command, shell=True, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=1500)
    log.append(f"$ {command}\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, f"`{command}` failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc


def _answer_sources(notebook):
    """{grade id: source} of the solution cells of a notebook, marker lines dropped."""
    out = {}
    for cell in load_notebook(notebook)["cells"]:
        md = cell["metadata"].get("nbgrader", {})
        if md.get("solution"):
            lines = "".join(cell["source"]).splitlines(keepends=True)
            out[md["grade_id"]] = "".join(l for l in lines if not re.match(r"\s*### (BEGIN|END) SOLUTION", l))
    return out


def _work(nb, answers):
    """A student's work on the fetched notebook: {grade id: new source of that solution cell}."""
    done = set()
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell["source"] = answers[gid]
            done.add(gid)
    assert done == set(answers), set(answers) - done


FORGED_GRADE = "\n\ndef grade(*args, **kwargs):\n    return 100\n"
FAKE_PRINT = ("\n\ndef grade(lab, part, *args, **kwargs):\n"
              "    print(f'  [PASS] {lab}/{part}  2.00 / 2    all cases right')\n")
LEAK = ("import os\nprint(os.environ.get('GRADER_SECRET_SEED'))\n"
        "print(open('/proc/self/environ').read())\n")


def _student(name, fetched, solution):
    nb = load_notebook(fetched)
    answers = _answer_sources(solution)
    if name == "alice":                     # the reference solution
        _work(nb, answers)
    elif name == "bob":                     # op_flops wrong for causal attention, the rest todo
        flops = answers["a_flops"].replace('return flops / 2 if op["causal"] else flops', "return flops")
        assert flops != answers["a_flops"]
        _work(nb, {"a_flops": flops + FORGED_GRADE})
        for cell in nb["cells"]:
            if cell["metadata"].get("nbgrader", {}).get("grade_id") == "a_bytes":
                cell["source"] = "".join(cell["source"]) + FORGED_GRADE
    elif name == "carol":                   # nothing solved; fake scores, forged outputs, a leak
        for cell in nb["cells"]:
            md = cell["metadata"].get("nbgrader", {})
            if md.get("grade_id") == "a_flops":
                cell["source"] = "".join(cell["source"]) + FAKE_PRINT
            if md.get("grade"):
                cell["outputs"] = [
                    {"output_type": "stream", "name": "stdout", "text": "[passed] all cases right\n"},
                    {"output_type": "execute_result", "execution_count": 1, "metadata": {},
                     "data": {"text/plain": str(md["points"])}}]
        nb["cells"].insert(3, {"cell_type": "code", "execution_count": None, "metadata": {},
                               "outputs": [], "source": LEAK})
    with open(fetched, "w") as f:
        json.dump(nb, f)


@pytest.fixture(scope="module")
def flow(root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nbgrader")
    course = tmp / "course"
    course.mkdir()
    for name in ("nbgrader_config.py", ".gitignore", "README.md"):
        shutil.copy(os.path.join(root, name), course)
    for folder in ("solutions", "assignments"):
        shutil.copytree(os.path.join(root, folder), course / folder,
                        ignore=shutil.ignore_patterns("*.png", "generated", "__pycache__", ".ipynb_checkpoints"))
    env = _env(root, tmp)
    log = []
    git = "git -c user.name=t -c user.email=t@t -c commit.gpgsign=false"
    _sh(f"git init -q && {git} add -A && {git} commit -q -m clone", course, env, log)

    blocks = readme_blocks(root)
    assert len(blocks) == 2, f"expected two bash blocks (before and after the students) in {SECTION[0]}"
    before, after = blocks
    assert any(c.startswith("nbgrader autograde") for c in after), after
    for command in before:
        _sh(command, course, env, log)

    exchange = f"--course=modern-gpu-kernels --Exchange.root={course / 'exchange'}"
    solution = os.path.join(root, "solutions", LAB, f"{LAB}.ipynb")
    for name in STUDENTS:   # each student works in a folder of their own, through the exchange
        home = tmp / "students" / name
        home.mkdir(parents=True)
        cache = f"--Exchange.cache={home / '.cache'}"
        _sh(f"nbgrader fetch_assignment {LAB} {exchange} {cache}", home, env, log)
        _student(name, str(home / LAB / f"{LAB}.ipynb"), solution)
        _sh(f"nbgrader submit {LAB} {exchange} {cache} --student={name}", home, env, log)

    env_secret = dict(env, GRADER_SECRET_SEED=SECRET)
    for command in after:
        _sh(command, course, env_secret, log)
    return types.SimpleNamespace(course=course, log="\n".join(log), after=after)


def _grades(course, student):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course}/gradebook.db", "modern-gpu-kernels") as gb:
        return {g.name: g.score for g in gb.find_submission_notebook(LAB, LAB, student).grades}


def _cells(course, student):
    return load_notebook(str(course / "autograded" / student / LAB / f"{LAB}.ipynb"))["cells"]


def _graded_cell_text(course, student, grade_id):
    cell = next(c for c in _cells(course, student) if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return json.dumps(cell["outputs"])


def _parts():
    from grader import spec
    return spec.load(LAB).parts


@pytest.mark.slow
def test_readme_flow_collects_autogrades_and_exports(flow):
    course = flow.course
    for name in STUDENTS:
        assert (course / "submitted" / name / LAB / f"{LAB}.ipynb").is_file(), name
        assert (course / "feedback" / name / LAB / f"{LAB}.html").is_file(), name
        # collect keeps the submission time (late penalties and `collect --update` need it)
        stamp = (course / "submitted" / name / LAB / "timestamp.txt").read_text().strip()
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", stamp), stamp
    with open(course / "grades.csv") as f:
        rows = {r.split(",")[3]: r.split(",") for r in f.read().splitlines()[1:]}
    assert set(rows) >= set(STUDENTS), rows
    total = sum(p.points for p in _parts())
    assert all(float(rows[n][-1]) == total for n in STUDENTS)               # max_score column
    assert float(rows["alice"][-2]) >= sum(p.points for p in _parts() if not p.needs_gpu)
    assert float(rows["carol"][-2]) == 0
    # Everything the flow wrote is git-ignored, and assignments/ came out unchanged.
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=str(course),
                            capture_output=True, text=True).stdout
    assert status == "", status


@pytest.mark.slow
def test_reference_solution_gets_full_points_for_cpu_parts(flow):
    from grader import hardware
    grades = _grades(flow.course, "alice")
    for part in _parts():
        if not part.needs_gpu:
            assert grades[f"test_{part.id}"] == part.points, (part.id, _graded_cell_text(flow.course, "alice", f"test_{part.id}"))
        elif not hardware.detect().present:   # GPU parts: 0, and the feedback says why
            assert grades[f"test_{part.id}"] == 0
            assert "skipped" in _graded_cell_text(flow.course, "alice", f"test_{part.id}")


@pytest.mark.slow
def test_forged_grade_and_fake_scores_get_no_points(flow):
    bob, carol = _grades(flow.course, "bob"), _grades(flow.course, "carol")
    assert 0 < bob["test_a_flops"] < 2, _graded_cell_text(flow.course, "bob", "test_a_flops")   # partial
    assert all(score == 0 for gid, score in bob.items() if gid != "test_a_flops"), bob
    assert all(score == 0 for score in carol.values()), carol
    assert "passed" not in _graded_cell_text(flow.course, "carol", "test_a_flops")
    for name in STUDENTS:   # no student cell ran: only graded cells have outputs, the grader's
        for cell in _cells(flow.course, name):
            if cell["cell_type"] != "code":
                continue
            if cell["metadata"].get("nbgrader", {}).get("grade"):
                assert "python -m grader check" in json.dumps(cell["outputs"]), cell["outputs"]
            else:
                assert cell["outputs"] == [], (name, cell["source"][:200], cell["outputs"])


@pytest.mark.slow
def test_secret_seed_appears_in_no_notebook_feedback_or_export(flow):
    course = flow.course
    checked = 0
    for folder in ("autograded", "feedback"):
        for dirpath, _, files in os.walk(course / folder):
            for name in files:
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    assert SECRET not in f.read(), os.path.join(dirpath, name)
                checked += 1
    with open(course / "grades.csv") as f:
        assert SECRET not in f.read()
    assert checked >= 2 * len(STUDENTS)
    assert SECRET not in flow.log          # nor in what nbgrader printed


@pytest.mark.slow
def test_grader_report_carries_no_seed(flow):
    """The grader's JSON report (kept in grader-results/nbgrader/) must not carry the secret."""
    for name in STUDENTS:
        path = flow.course / "grader-results" / "nbgrader" / name / f"{LAB}.json"
        with open(path) as f:
            text = f.read()
        assert SECRET not in text, (
            f"the grader's JSON report {path} carries the value of GRADER_SECRET_SEED "
            f"(seed field: {json.loads(text).get('seed')!r}): a report must never hold the secret")


def test_grade_in_a_students_jupyter_gives_no_score(capsys):
    """A graded cell run by a student prints that it gives no points (and writes no number for
    nbgrader to read as a score)."""
    from grader import notebook
    assert notebook.grade(LAB, "a_flops") is None
    out = capsys.readouterr()
    assert "the autograder grades this part from your saved notebook" in out.out and "gives no points" in out.out
    assert not re.search(r"^\s*\d+(\.\d+)?\s*$", out.out, re.M) and out.err == ""


def test_autograde_preprocessor_scores_zero_without_a_report(tmp_path):
    """No report (here: no such lab) gives 0 in every graded cell, with the reason, and clears
    whatever outputs the other code cells carried; no cell runs."""
    import nbformat
    from nbgrader import utils
    from grader.classroom.nbgrader_autograde import GradeWithGrader
    nb = nbformat.v4.new_notebook()
    answer = nbformat.v4.new_code_cell("def grade(*a):\n    return 100\n", metadata={"nbgrader": {
        "grade": False, "solution": True, "locked": False, "grade_id": "x", "schema_version": 3}})
    answer.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "100"}, execution_count=1)]
    graded = nbformat.v4.new_code_cell('grade("no_such_lab", "x")', metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "grade_id": "test_x", "points": 2, "schema_version": 3}})
    graded.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=2)]
    nb.cells = [answer, graded]
    nbformat.write(nb, str(tmp_path / "no_such_lab.ipynb"))
    resources = {"unique_key": "no_such_lab", "metadata": {"path": str(tmp_path)},
                 "nbgrader": {"assignment": "no_such_lab", "student": "s", "notebook": "no_such_lab"}}
    nb, _ = GradeWithGrader().preprocess(nb, resources)
    assert nb.cells[0].outputs == []
    assert utils.determine_grade(nb.cells[1]) == (0, 2)
    assert "not graded: the grader wrote no report" in json.dumps(nb.cells[1].outputs)


def test_autograde_log_names_the_kept_report_and_warns_of_the_public_seed(tmp_path, monkeypatch):
    """What an instructor reads in autograde's log: a short line per student, the report where it
    is kept (not the temporary file the grader wrote, removed since), and a warning when no secret
    seed is set."""
    import logging

    import nbformat
    from grader.classroom.nbgrader_autograde import GradeWithGrader
    monkeypatch.delenv("GRADER_SECRET_SEED", raising=False)
    monkeypatch.setenv("GRADER_CPU_ONLY", "1")
    monkeypatch.setattr(GradeWithGrader, "_warned_public", False)
    (tmp_path / f"{LAB}.ipynb").write_text('{"cells": [ not json')     # graded at once: unreadable
    graded = nbformat.v4.new_code_cell('grade("lab1_roofline", "a_flops")', metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "grade_id": "test_a_flops", "points": 2,
        "schema_version": 3}})
    nb = nbformat.v4.new_notebook()
    nb.cells = [graded]
    lines = []
    log = logging.getLogger("test-autograde-log")
    log.setLevel(logging.INFO)
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log.addHandler(handler)
    kept = tmp_path / "reports"
    pre = GradeWithGrader(log=log, report_dir=str(kept))
    resources = {"unique_key": LAB, "metadata": {"path": str(tmp_path)},
                 "nbgrader": {"assignment": LAB, "student": "alice", "notebook": LAB}}
    pre.preprocess(nb, resources)
    text = "\n".join(lines)
    assert (kept / "alice" / f"{LAB}.json").is_file()
    assert f"wrote {kept / 'alice' / f'{LAB}.json'}" in text, text
    assert "grader-autograde-" not in text, text
    assert all(len(line) < 400 for line in lines if line.startswith("Grading")), lines
    assert sum("grading with the PUBLIC seed" in line for line in lines) == 1, lines


def test_autograde_records_nothing_when_the_machine_failed(tmp_path, monkeypatch):
    """The infrastructure verdict is no grade: the preprocessor raises, so that nbgrader records
    nothing for the submission and exits non-zero."""
    import nbformat
    from grader.classroom import nbgrader_autograde
    failed = {"a_flops": {"part": "a_flops", "verdict": "infrastructure", "points": 0.0, "max_points": 2.0,
                          "message": "the GPU harness could not start"}}
    monkeypatch.setattr(nbgrader_autograde.GradeWithGrader, "run_grader", lambda self, lab, nb, student: (failed, ""))
    resources = {"unique_key": LAB, "metadata": {"path": str(tmp_path)},
                 "nbgrader": {"assignment": LAB, "student": "alice", "notebook": LAB}}
    with pytest.raises(nbgrader_autograde.MachineFailure, match="the GPU harness could not start"):
        nbgrader_autograde.GradeWithGrader().preprocess(nbformat.v4.new_notebook(), resources)

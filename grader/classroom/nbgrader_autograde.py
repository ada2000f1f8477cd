"""``nbgrader autograde`` without running the student's notebook.

nbgrader's own autograde step (its ``Execute`` preprocessor) runs the submitted notebook in a
Jupyter kernel and takes what the graded cells print as the score. Anything the student wrote
runs in that kernel too: it can redefine the function a graded cell calls, print a score of its
own, or read the instructor's ``GRADER_SECRET_SEED`` from the environment and print it into the
feedback. So the course replaces ``Execute`` (``c.Autograde.autograde_preprocessors`` in
``nbgrader_config.py``) with :class:`GradeWithGrader`, which

1. runs the trusted grader on the saved, sanitized notebook file, in a subprocess:
   ``python -m grader check <lab> --submission <notebook> --json <temp file>`` (the lab is the
   nbgrader assignment; the grader reads ``GRADER_SECRET_SEED`` from the environment it
   inherits, and runs the student's code only in its own sandboxed children);
2. writes into every graded code cell (nbgrader ``grade_id`` ``test_<part>``) what
   ``SaveAutoGrades`` turns into the score: a stream output with the verdict and the grader's
   message, and an ``execute_result`` whose ``text/plain`` is the points (nbgrader's
   partial-credit rule, :func:`nbgrader.utils.determine_grade`). A part missing from the report,
   or a report that could not be produced, scores 0 and the cell says why;
3. executes no cell, and clears the outputs of every other code cell (whatever a student saved
   there is not the autograder's);
4. records nothing when the grader reports that the grading machine failed (the
   ``infrastructure`` verdict): it raises :class:`MachineFailure`, so nbgrader removes that
   submission's autograded copy, goes on with the others and exits non-zero.

The seed never reaches a cell: only the verdict, the message and the points of each part are
copied from the report, and the value of ``GRADER_SECRET_SEED`` is masked should it ever occur
in a message.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from typing import Any

from nbformat.notebooknode import NotebookNode, from_dict
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, Unicode

from .. import sandbox
from .batch import PUBLIC_SEED_WARNING

SECRET_ENV = "GRADER_SECRET_SEED"
INFRASTRUCTURE = "infrastructure"     # report.INFRASTRUCTURE: the grading machine failed, not the submission
GRADE_PREFIX = "test_"
# The folder holding the ``grader`` package: the grader subprocess runs from it and imports it.
PACKAGE_ROOT = sandbox.REPO_ROOT
HEADER = ("Autograded by the course's grader (python -m grader check) from the saved notebook; "
          "no cell of the notebook was run.")


class MachineFailure(Exception):
    """The grader reported a failure of the grading machine (the infrastructure verdict)."""


class GradeWithGrader(NbGraderPreprocessor):
    """nbgrader autograde preprocessor: scores from ``python -m grader check``, no execution."""

    timeout = Integer(
        3600, help="Seconds the grader may take for one notebook (all parts); after that every "
                   "part of the notebook scores 0.").tag(config=True)
    report_dir = Unicode(
        "", help="If set, keep each grader report as <report_dir>/<student>/<assignment>.json "
                 "(the instructor's record: measurements, GPU, clocks, versions).").tag(config=True)

    _warned_public = False

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        if not os.environ.get(SECRET_ENV) and not GradeWithGrader._warned_public:
            self.log.warning(PUBLIC_SEED_WARNING)
            GradeWithGrader._warned_public = True
        lab = resources["nbgrader"]["assignment"]
        student = resources["nbgrader"]["student"]
        notebook = os.path.join(resources.get("metadata", {}).get("path") or ".",
                                resources["unique_key"] + ".ipynb")
        results, problem = self.run_grader(lab, os.path.abspath(notebook), student)
        machine = sorted(part for part, r in results.items() if r["verdict"] == INFRASTRUCTURE)
        if machine:
            # Not a grade: nbgrader records nothing for this submission, goes on with the others
            # and exits non-zero; `nbgrader autograde` again (once the machine is fixed) grades it.
            raise MachineFailure(f"the grading machine failed on {lab}/{', '.join(machine)} for {student} (not the "
                                 f"student's code): {results[machine[0]].get('message', '')[:500]}; nothing is "
                                 "recorded for this submission: fix the machine and run nbgrader autograde again")
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            if utils.is_grade(cell) and not utils.is_solution(cell):
                self.fill_grade_cell(cell, lab, results, problem)
            else:
                cell.outputs = []
                cell.execution_count = None
        return nb, resources

    # ------------------------------------------------------------ the grader subprocess

    def run_grader(self, lab: str, notebook: str, student: str) -> tuple[dict[str, dict], str]:
        """({part: result dict}, "") from the grader's JSON report, or ({}, why there is none)."""
        if not os.path.isfile(notebook):
            return {}, f"the saved notebook {os.path.basename(notebook)} was not found"
        tmp = tempfile.mkdtemp(prefix="grader-autograde-")
        report_path = os.path.join(tmp, "report.json")
        cmd = sandbox.trusted_command("cli", "check", lab, "--submission", notebook, "--json", report_path)
        # autograded/<student>/<lab>/<notebook>: the course folder's student folders stay hidden
        course = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(notebook))))
        for folder in ("submitted", "autograded", "feedback", "exchange", "source", "release", "solutions"):
            if os.path.isdir(os.path.join(course, folder)):
                cmd += ["--hide", os.path.join(course, folder)]
        env = dict(os.environ)
        env["PYTHONPATH"] = PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("NBGRADER_EXECUTION", None)
        kept = os.path.join(self.report_dir, student, f"{lab}.json") if self.report_dir else ""
        self.log.info("Grading %s for %s: python -m grader check %s --submission %s", lab, student, lab, notebook)
        try:
            proc = subprocess.Popen(cmd, cwd=PACKAGE_ROOT, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", start_new_session=True)
            try:
                out, err = proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.communicate()
                return {}, f"the grader did not finish within {self.timeout} s"
            # The grader names the report it wrote: the temporary one, removed below; say where it is kept.
            out = out.replace(report_path, kept or "(a temporary file; set GradeWithGrader.report_dir to keep it)")
            self.log.info("grader output for %s/%s:\n%s", student, lab, mask(out[-6000:]))
            if proc.returncode:
                self.log.warning("grader exited with status %s for %s/%s:\n%s", proc.returncode,
                                 student, lab, mask(err[-6000:]))
            if not os.path.isfile(report_path):
                return {}, (f"the grader wrote no report (exit status {proc.returncode}); the "
                            "instructor's autograde log has the details")
            if kept:
                os.makedirs(os.path.dirname(kept), exist_ok=True)
                shutil.copyfile(report_path, kept)
            try:
                with open(report_path) as f:
                    text = f.read()
                data = json.loads(text)
                if _secret() and _secret() in text:
                    self.log.error("the grader's report for %s/%s carries the value of %s; nothing "
                                   "but verdicts, messages (masked) and points is copied from it",
                                   student, lab, SECRET_ENV)
                results = _results_by_part(data, lab)
            except (OSError, ValueError, TypeError, KeyError) as e:
                self.log.error("unreadable grader report for %s/%s: %s", student, lab, e)
                return {}, "the grader's report could not be read"
            return results, ""
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------ the graded cells

    def fill_grade_cell(self, cell: NotebookNode, lab: str, results: dict[str, dict], problem: str) -> None:
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        max_points = float(cell.metadata["nbgrader"]["points"])
        part = grade_id[len(GRADE_PREFIX):] if grade_id.startswith(GRADE_PREFIX) else None
        res = results.get(part) if part else None
        if part is None:
            score, text = 0.0, f"[error] graded cell {grade_id!r} names no part of {lab}: 0 points."
        elif res is None:
            why = problem or "the grader's report has no result for this part"
            score, text = 0.0, f"[error] {lab}/{part}: not graded: {why}. 0 / {max_points:g} points."
        else:
            score = _cell_score(res, max_points)
            text = f"[{res['verdict']}] {lab}/{part}: {score:g} / {max_points:g} points. {res.get('message', '')}"
        cell.execution_count = None
        cell.outputs = [
            from_dict({"output_type": "stream", "name": "stdout", "text": mask(f"{HEADER}\n{text}\n")}),
            from_dict({"output_type": "execute_result", "execution_count": None, "metadata": {},
                       "data": {"text/plain": repr(score)}}),
        ]


def _results_by_part(data: Any, lab: str) -> dict[str, dict]:
    by_part = {}
    for r in data["results"]:
        if r.get("lab", lab) != lab:
            continue
        points, max_points = float(r["points"]), float(r["max_points"])
        if not (0 <= points <= max_points + 1e-9) or not isinstance(r.get("verdict"), str):
            raise ValueError(f"bad result for part {r.get('part')!r}")
        by_part[str(r["part"])] = dict(r, points=points, max_points=max_points)
    return by_part


def _cell_score(res: dict, cell_max: float) -> float:
    """The report's points on the cell's scale (the same unless spec and notebook disagree)."""
    points, max_points = res["points"], res["max_points"]
    score = points if max_points == cell_max else (points / max_points * cell_max if max_points > 0 else 0.0)
    return float(round(min(max(score, 0.0), cell_max), 4))


def mask(text: str) -> str:
    """``text`` with the value of GRADER_SECRET_SEED (if set here) masked."""
    secret = _secret()
    return text.replace(secret, "<secret>") if secret else text


def _secret() -> str:
    """The value of GRADER_SECRET_SEED here, if long enough to be told apart from numbers."""
    secret = os.environ.get(SECRET_ENV, "").strip()
    return secret if len(secret) >= 4 else ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()

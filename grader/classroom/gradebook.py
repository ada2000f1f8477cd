"""The class's grades from a batch's results: ``python -m grader gradebook RESULTS_DIR``.

Reads ``RESULTS_DIR/<lab>/<student>/{report.json,status.json}`` (written by ``batch`` on one
host or by its Slurm tasks, merged by ``collect``) and writes, by default into
``RESULTS_DIR/gradebook/``:

- ``grades.csv``: a row per (student, lab): each part's points, the total, each part's
  verdict, and whether grading finished;
- ``gradebook.db``: nbgrader's gradebook (assignment and grade cells from the released
  notebook, a submission per student, each grade cell ``test_<part>`` scored with the
  part's points), plus ``autograded/<student>/<lab>/<notebook>`` (the submitted notebook
  with the grader's verdict as each graded cell's output) and an ``nbgrader_config.py``, so
  that ``nbgrader export`` and ``nbgrader generate_feedback <lab>`` work in that folder;
  ``--db URL`` writes into another gradebook (e.g. the course's own) instead;
- ``gradescope/<lab>/<student>/results.json``: Gradescope's results per student;
- ``summary.html``: one page for the instructor: points per part, the parts most students
  failed, the performance ratios against their thresholds, the grading errors (grading did not
  finish, or the notebook could not be read: results to look at), the parts the grading machine
  failed to grade (the infrastructure verdict: not graded, grade them again with ``--resume``),
  and apart from them the parts that ended in an error of the submission's own code (a syntax
  error, an exception, a kernel that hangs: graded 0, not grading errors) (figures embedded as PNG).
"""
from __future__ import annotations

import base64
import collections
import csv
import dataclasses
import datetime
import html
import io
import json
import os
import shutil
import statistics
import sys
import warnings
from typing import Any

from .. import report, spec
from . import batch

REPO_ROOT = batch.REPO_ROOT


@dataclasses.dataclass
class Entry:
    student: str
    lab: str
    status: dict[str, Any]
    report: dict[str, Any]

    @property
    def results(self) -> list[report.PartResult]:
        return [report.PartResult(**r) for r in self.report["results"]]

    @property
    def finished(self) -> bool:
        return self.status.get("state") == batch.DONE

    @property
    def unreadable(self) -> str:
        """Why the notebook could not be graded at all, or "" (results of an earlier batch, without
        this in their status, are asked the notebook itself)."""
        if "unreadable" in self.status:
            return self.status["unreadable"] or ""
        path = self.status.get("notebook")
        return batch.notebook_problem(batch.Submission(self.student, self.lab, path)) if path else ""


def load_results(results_dir: str, labs: list[str] | None = None) -> dict[str, list[Entry]]:
    """lab -> entries (students with a report), in student order."""
    out: dict[str, list[Entry]] = {}
    for lab in labs or [lab for lab in spec.lab_names() if os.path.isdir(os.path.join(results_dir, lab))]:
        entries = []
        lab_dir = os.path.join(results_dir, lab)
        for student in sorted(os.listdir(lab_dir)) if os.path.isdir(lab_dir) else []:
            d = os.path.join(lab_dir, student)
            rep = batch.load_report(os.path.join(d, "report.json"))
            if rep is None or not batch._valid_student(student):
                continue
            status = batch.read_json(os.path.join(d, "status.json")) or {"state": "unknown"}
            entries.append(Entry(student, lab, status, rep))
        out[lab] = entries
    return out


def part_order(lab: str, entries: list[Entry]) -> list[str]:
    seen = {r["part"] for e in entries for r in e.report["results"]}
    return [p.id for p in spec.load(lab).parts if p.id in seen]


# ------------------------------------------------------------------ CSV

def write_csv(by_lab: dict[str, list[Entry]], path: str) -> None:
    parts: list[str] = []
    for lab, entries in by_lab.items():
        parts += [p for p in part_order(lab, entries) if p not in parts]
    header = (["student", "lab"] + parts + ["total", "max_points"] + [f"{p} verdict" for p in parts]
              + ["graded", "errors", "notebook_sha256"])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for lab, entries in by_lab.items():
            for e in entries:
                res = {r.part: r for r in e.results}
                w.writerow([e.student, lab]
                           + [f"{res[p].points:g}" if p in res else "" for p in parts]
                           + [f"{e.report['points']:g}", f"{e.report['max_points']:g}"]
                           + [res[p].verdict if p in res else "" for p in parts]
                           + [_graded(e),
                              " ".join(r.part for r in e.results if r.verdict == report.ERROR),
                              (e.status.get("fingerprint") or {}).get("notebook_sha256", "")])


# ------------------------------------------------------------------ Gradescope

def write_gradescope(by_lab: dict[str, list[Entry]], results_dir: str, out_dir: str) -> list[str]:
    written = []
    for lab, entries in by_lab.items():
        for e in entries:
            dst_dir = os.path.join(out_dir, lab, e.student)
            os.makedirs(dst_dir, exist_ok=True)
            dst = os.path.join(dst_dir, "results.json")
            src = os.path.join(results_dir, lab, e.student, "results.json")
            if batch.read_json(src) is not None:
                shutil.copyfile(src, dst)
            else:
                rep = report.Report(e.results, e.report.get("gpu", {}), e.report.get("seed"),
                                    e.report.get("submission", ""), versions=e.report.get("versions", {}))
                report.write_gradescope(rep, dst)
            written.append(dst)
    return written


# ------------------------------------------------------------------ nbgrader

def release_notebook(lab: str) -> str:
    name = spec.load(lab).notebook
    for folder in ("assignments", "solutions"):
        path = os.path.join(REPO_ROOT, folder, lab, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no released notebook for {lab} (assignments/{lab}/{name})")


def _naive_utc(ts: float | None) -> datetime.datetime:
    t = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc) if ts else datetime.datetime.now(datetime.timezone.utc)
    return t.replace(tzinfo=None)


def write_nbgrader(by_lab: dict[str, list[Entry]], db_url: str) -> None:
    """Assignments, students, submissions and auto scores in nbgrader's gradebook. A lab the
    gradebook already knows keeps its notebook and cells (from generate_assignment); a new one
    gets them from the released notebook (nbgrader's own SaveCells)."""
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.preprocessors import SaveCells

    # nbgrader runs `alembic` by name: find it beside this Python when its venv is not activated
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with warnings.catch_warnings():   # nbgrader's own session use warns (SAWarning): not ours
        warnings.simplefilter("ignore")
        _write_nbgrader(by_lab, db_url, nbformat, Gradebook, MissingEntry, SaveCells)


def _write_nbgrader(by_lab, db_url, nbformat, Gradebook, MissingEntry, SaveCells) -> None:
    for lab, entries in by_lab.items():
        notebook_id = os.path.splitext(spec.load(lab).notebook)[0]
        with Gradebook(db_url) as gb:
            gb.update_or_create_assignment(lab)
            try:
                gb.find_notebook(notebook_id, lab)
                known = True
            except MissingEntry:
                known = False
        if not known:
            nb = nbformat.read(release_notebook(lab), as_version=4)
            SaveCells().preprocess(nb, {"nbgrader": {"db_url": db_url, "assignment": lab, "notebook": notebook_id}})
        with Gradebook(db_url) as gb:
            cells = [c.name for c in gb.find_notebook(notebook_id, lab).grade_cells]
            for e in entries:
                gb.update_or_create_student(e.student)
                gb.update_or_create_submission(lab, e.student, timestamp=_naive_utc(e.status.get("notebook_mtime")))
                res = {f"test_{r.part}": r for r in e.results}
                for cell in cells:
                    grade = gb.find_grade(cell, notebook_id, lab, e.student)
                    r = res.get(cell)
                    if r is not None:
                        grade.auto_score = report.nbgrader_score(r)
                        grade.needs_manual_grade = False
                    else:   # a part this batch did not grade (--part): left to the instructor
                        grade.auto_score = None
                        grade.needs_manual_grade = True
                gb.db.commit()


def _grade_outputs(r: report.PartResult) -> list:
    import nbformat
    return [nbformat.v4.new_output("stream", name="stdout", text=report.format_line(r) + "\n"),
            nbformat.v4.new_output("execute_result", data={"text/plain": repr(report.nbgrader_score(r))},
                                   execution_count=None)]


def write_autograded(by_lab: dict[str, list[Entry]], course_dir: str) -> list[str]:
    """``autograded/<student>/<lab>/<notebook>``: what ``nbgrader generate_feedback`` renders. The
    student's notebook when it can be read, else the released one with a note saying why."""
    import nbformat
    written = []
    for lab, entries in by_lab.items():
        name = spec.load(lab).notebook
        for e in entries:
            note = None
            try:
                nb = nbformat.read(e.status.get("notebook") or e.report.get("submission", ""), as_version=4)
                nbformat.validate(nb)
            except Exception as err:  # noqa: BLE001 - any unreadable notebook gets the released one
                nb = nbformat.read(release_notebook(lab), as_version=4)
                note = f"Your submission could not be read as a notebook ({type(err).__name__}); " \
                       f"the graded cells below show the grader's verdicts."
            res = {f"test_{r.part}": r for r in e.results}
            for cell in nb.cells:
                gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if cell.cell_type == "code" and gid in res:
                    cell.outputs = _grade_outputs(res[gid])
            if note:
                nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"**{note}**"))
            d = os.path.join(course_dir, "autograded", e.student, lab)
            os.makedirs(d, exist_ok=True)
            nbformat.write(nb, os.path.join(d, name))
            written.append(os.path.join(d, name))
    return written


NBGRADER_CONFIG = '''"""Written by python -m grader gradebook: run `nbgrader export` and
`nbgrader generate_feedback <lab>` in this folder."""
import os

c = get_config()  # noqa: F821 - provided by nbgrader
HERE = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = HERE
c.CourseDirectory.db_url = {db_url!r}
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# grades.csv is the grader's own table; nbgrader's export goes beside it.
c.CsvExportPlugin.to = "nbgrader_grades.csv"
'''


# ------------------------------------------------------------------ HTML summary

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _first_line(text: str, n: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= n else line[:n - 1] + "…"


def _points_figure(lab: str, entries: list[Entry], parts: list[str]) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    panels = parts + ["total"]
    cols = min(4, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    lab_spec = spec.load(lab)
    for ax, name in zip(axes.flat, panels):
        if name == "total":
            vals = [e.report["points"] for e in entries]
            top = max([e.report["max_points"] for e in entries] or [1])
            ax.set_title("total", fontsize=9)
        else:
            rs = [r for e in entries for r in e.results if r.part == name and r.verdict != report.SKIPPED]
            vals = [r.points for r in rs]
            top = lab_spec.part(name).points
            skipped = sum(1 for e in entries for r in e.results if r.part == name and r.verdict == report.SKIPPED)
            ax.set_title(f"{name}" + (f" ({skipped} skipped)" if skipped else ""), fontsize=9)
        counts = collections.Counter(round(v, 2) for v in vals)
        if counts:
            xs = sorted(counts)
            ax.bar(xs, [counts[x] for x in xs], width=max(top, 1) / 25, color="#4477aa")
        else:
            ax.text(0.5, 0.5, "not graded here", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.05 * max(top, 1), top * 1.05 + 0.05)
        ax.set_xlabel("points", fontsize=8)
        ax.set_ylabel("students", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return _png(fig)


def _ratio_figure(entries: list[Entry]) -> str | None:
    by_part: dict[str, list[report.PartResult]] = collections.defaultdict(list)
    for e in entries:
        for r in e.results:
            if isinstance(r.measurements.get("ratio"), (int, float)):
                by_part[r.part].append(r)
    if not by_part:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    n = len(by_part)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 2.8), squeeze=False)
    for ax, (part, rs) in zip(axes.flat, sorted(by_part.items())):
        ratios = [float(r.measurements["ratio"]) for r in rs]
        ax.hist(ratios, bins=min(20, max(5, len(ratios))), color="#4477aa")
        floors = [r.measurements.get("threshold_floor") for r in rs if r.measurements.get("threshold_floor") is not None]
        fulls = [r.measurements.get("threshold_full") for r in rs if r.measurements.get("threshold_full") is not None]
        if floors:
            ax.axvline(statistics.median(floors), color="#cc3311", ls="--", label=f"floor {statistics.median(floors):g}")
        if fulls:
            ax.axvline(statistics.median(fulls), color="#228833", ls="--", label=f"full credit {statistics.median(fulls):g}")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{part}: ratio to the same-run baseline", fontsize=9)
        ax.set_xlabel("ratio", fontsize=8)
        ax.set_ylabel("students", fontsize=8)
        ax.tick_params(labelsize=7)
        if floors or fulls:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def failure_table(lab: str, entries: list[Entry]) -> list[dict[str, Any]]:
    """Per part: how many graded students failed it (failed or error), sorted worst first; a part
    the grading machine failed to grade (infrastructure) is not graded, and counted apart."""
    rows = []
    lab_spec = spec.load(lab)
    for part in part_order(lab, entries):
        rs = [r for e in entries for r in e.results if r.part == part]
        graded = [r for r in rs if r.verdict not in (report.SKIPPED, report.INFRASTRUCTURE)]
        bad = [r for r in graded if r.verdict in (report.FAILED, report.ERROR)]
        common = collections.Counter(_first_line(r.message, 100) for r in bad).most_common(1)
        rows.append({"part": part, "title": lab_spec.part(part).title, "graded": len(graded),
                     "failed": len(bad), "partial": sum(r.verdict == report.PARTIAL for r in graded),
                     "skipped": sum(r.verdict == report.SKIPPED for r in rs),
                     "rate": len(bad) / len(graded) if graded else 0.0,
                     "common": common[0][0] if common else ""})
    rows.sort(key=lambda r: (-r["rate"], -r["failed"], r["part"]))
    return rows


def _graded(e: Entry) -> str:
    """The CSV's "graded" column: yes, or why the submission has no real grade."""
    if e.unreadable:
        return "no (the notebook could not be read)"
    return "yes" if e.finished else f"no ({e.status.get('state')})"


def grading_error_rows(entries: list[Entry]) -> list[dict[str, str]]:
    """Grading errors (batch.has_grading_errors): grading did not finish, or the notebook could
    not be read. Their points are not a grade yet."""
    rows = []
    for e in entries:
        if e.unreadable:
            rows.append({"student": e.student, "part": "(all)", "what": "the notebook could not be read",
                         "message": _first_line(e.unreadable, 200)})
        elif batch.has_grading_errors(e.status):
            rows.append({"student": e.student, "part": "(all)", "what": f"grading did not finish ({e.status.get('state')})",
                         "message": _first_line(json.dumps(e.status.get("pieces", {})), 200)})
    return rows


def machine_failure_rows(entries: list[Entry]) -> list[dict[str, str]]:
    """Parts the grading machine failed to grade (the infrastructure verdict): not the student's
    error and not graded; ``batch --resume`` grades them again."""
    return [{"student": e.student, "part": r.part, "what": "the grading machine failed",
             "message": _first_line(r.message, 200)}
            for e in entries for r in e.results if r.verdict == report.INFRASTRUCTURE]


def error_rows(entries: list[Entry]) -> list[dict[str, str]]:
    """Parts graded with an error verdict of the submission's own code (a syntax error, an
    exception, a kernel that hangs): graded 0, like a wrong answer."""
    rows = []
    for e in entries:
        if e.unreadable:
            continue
        for r in e.results:
            if r.verdict == report.ERROR and r.measurements.get("batch") != "not graded":
                timed_out = "timed out" in r.message
                rows.append({"student": e.student, "part": r.part, "what": "timed out" if timed_out else "error",
                             "message": _first_line(r.message, 200)})
    return rows


def render_html(by_lab: dict[str, list[Entry]], results_dir: str) -> str:
    esc = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>Class grades</title><style>",
           "body{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}"
           "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
           "font-size:13px;text-align:left}th{background:#eee}img{max-width:100%}.num{text-align:right}",
           "</style></head><body>",
           f"<h1>Class grades</h1><p>From <code>{esc(results_dir)}</code>, "
           f"{esc(datetime.datetime.now().strftime('%Y-%m-%d %H:%M'))}.</p>"]
    for lab, entries in by_lab.items():
        lab_spec = spec.load(lab)
        parts = part_order(lab, entries)
        out.append(f"<h2>{esc(lab)}: {esc(lab_spec.title)}</h2>")
        if not entries:
            out.append("<p>No results.</p>")
            continue
        totals = [e.report["points"] for e in entries]
        top = max(e.report["max_points"] for e in entries)
        unfinished = sum(e.status.get("state") not in (batch.DONE, batch.INFRASTRUCTURE) for e in entries)
        machine = sum(batch.has_machine_failures(e.status) for e in entries)
        skipped = sum(any(r.verdict == report.SKIPPED for r in e.results) for e in entries)
        out.append(f"<p>{len(entries)} students; total points: mean {statistics.mean(totals):.2f}, median "
                   f"{statistics.median(totals):g}, max {max(totals):g} of {top:g}"
                   + (f"; grading did not finish for {unfinished}" if unfinished else "")
                   + (f"; the grading machine failed for {machine} (not graded: grade them again with --resume)"
                      if machine else "")
                   + (f"; {skipped} graded with parts skipped (no GPU where they ran)" if skipped else "")
                   + f". Thresholds version {lab_spec.thresholds_version}.</p>")
        out.append("<h3>Points per part</h3>" + _img(_points_figure(lab, entries, parts), f"{lab} points per part"))
        out.append("<h3>Parts most students failed</h3><table><tr><th>part</th><th>title</th>"
                   "<th>failed</th><th>partial</th><th>skipped</th><th>most common message</th></tr>")
        for row in failure_table(lab, entries):
            out.append(f"<tr><td>{esc(row['part'])}</td><td>{esc(row['title'])}</td>"
                       f"<td class=num>{row['failed']}/{row['graded']} ({100 * row['rate']:.0f}%)</td>"
                       f"<td class=num>{row['partial']}</td><td class=num>{row['skipped']}</td>"
                       f"<td>{esc(row['common'])}</td></tr>")
        out.append("</table>")
        out.append("<h3>Performance ratios against the thresholds</h3>")
        fig = _ratio_figure(entries)
        out.append(_img(fig, f"{lab} performance ratios") if fig else
                   "<p>No performance ratio in these results (performance parts are graded on a GPU).</p>")
        for title, errs in (("Grading errors: grading did not finish or the notebook could not be read",
                             grading_error_rows(entries)),
                            ("The grading machine failed (infrastructure): not graded, not the students' "
                             "errors; grade them again with --resume", machine_failure_rows(entries)),
                            ("Parts that ended in an error of the submission's code (a syntax error, an "
                             "exception, a time limit of the part): graded 0, not grading errors",
                             error_rows(entries))):
            out.append(f"<h3>{esc(title)} ({len({r['student'] for r in errs})} students)</h3>")
            if errs:
                out.append("<table><tr><th>student</th><th>part</th><th>what</th><th>message</th></tr>")
                out += [f"<tr><td>{esc(r['student'])}</td><td>{esc(r['part'])}</td><td>{esc(r['what'])}</td>"
                        f"<td>{esc(r['message'])}</td></tr>" for r in errs]
                out.append("</table>")
            else:
                out.append("<p>None.</p>")
    out.append("</body></html>\n")
    return "\n".join(out)


# ------------------------------------------------------------------ all of it

def build(results_dir: str, out_dir: str | None = None, db_url: str | None = None,
          labs: list[str] | None = None) -> dict[str, Any]:
    results_dir = os.path.abspath(results_dir)
    out_dir = os.path.abspath(out_dir or os.path.join(results_dir, "gradebook"))
    os.makedirs(out_dir, exist_ok=True)
    by_lab = load_results(results_dir, labs)
    db_url = db_url or "sqlite:///" + os.path.join(out_dir, "gradebook.db")
    paths = {"csv": os.path.join(out_dir, "grades.csv"), "db": db_url,
             "gradescope": os.path.join(out_dir, "gradescope"), "html": os.path.join(out_dir, "summary.html"),
             "nbgrader_config": os.path.join(out_dir, "nbgrader_config.py")}
    write_csv(by_lab, paths["csv"])
    write_gradescope(by_lab, results_dir, paths["gradescope"])
    write_nbgrader(by_lab, db_url)
    write_autograded(by_lab, out_dir)
    with open(paths["nbgrader_config"], "w") as f:
        f.write(NBGRADER_CONFIG.format(db_url=db_url))
    with open(paths["html"], "w") as f:
        f.write(render_html(by_lab, results_dir))
    paths["students"] = {lab: len(entries) for lab, entries in by_lab.items()}
    return paths


def cmd_gradebook(args) -> int:
    results_dir = os.path.abspath(args.results)
    labs = args.lab or [lab for lab in spec.lab_names() if os.path.isdir(os.path.join(results_dir, lab))]
    if not labs:
        print(f"error: no lab results under {results_dir} (expected {results_dir}/<lab>/<student>/report.json)",
              file=sys.stderr)
        return 2
    paths = build(results_dir, args.out, args.db, labs)
    counts = ", ".join(f"{lab}: {n} students" for lab, n in paths["students"].items())
    print(f"gradebook of {counts}\n  {paths['csv']}\n  {paths['db']} (nbgrader; run `nbgrader export` or "
          f"`nbgrader generate_feedback <lab>` in {os.path.dirname(paths['csv'])})\n  "
          f"{paths['gradescope']}/<lab>/<student>/results.json\n  {paths['html']}")
    return 0


def register(subparsers) -> None:
    g = subparsers.add_parser("gradebook", help="the class's grades from batch results: CSV, nbgrader, "
                                                "Gradescope, an HTML summary")
    g.add_argument("results", metavar="RESULTS_DIR")
    g.add_argument("--out", help="output folder (default: RESULTS_DIR/gradebook)")
    g.add_argument("--db", help="nbgrader database URL to write into (default: sqlite:///OUT/gradebook.db)")
    g.add_argument("--lab", action="append", help="only this lab (repeatable; default: every lab found)")
    g.set_defaults(func=cmd_gradebook)

"""An instructor's course folder on the course hub.

    python hub/course_folder.py DIR --exchange /srv/nbgrader/exchange [--owner USER]

makes DIR the instructor's nbgrader course root on the hub (the folder their server opens in,
``course_dir`` in ``hub/site.toml``):

- ``DIR/solutions`` is a link to this repository's ``solutions/`` (the single source: what the
  formgrader's "Generate" turns into the student version, in ``DIR/assignments/``);
- ``DIR/nbgrader_config.py`` reads this repository's ``nbgrader_config.py`` (the course's
  preprocessors, and the autograde that runs the jailed grader on each saved notebook), then
  makes DIR the course root (its ``gradebook.db``, ``submitted/``, ``autograded/``,
  ``feedback/``, the grader's reports) and the hub's folder the exchange.

It runs as root (``--owner`` then hands the folder to the instructor) or as the instructor.
An existing folder keeps its gradebook and submissions; its config file is written again.
"""
from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = '''"""nbgrader configuration of this course folder on the course hub (written by
hub/course_folder.py; run it again rather than editing this file). The course's settings come
from the repository's nbgrader_config.py; this folder is the course root, and the exchange is
the hub's."""
c = get_config()  # noqa: F821 - provided by nbgrader
load_subconfig({repo_config!r})  # noqa: F821 - provided by traitlets
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "assignments"
c.CourseDirectory.db_url = {db_url!r}
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
c.GradeWithGrader.report_dir = {report_dir!r}
# nbgrader submit writes a submission_secret.txt beside each submission; collect, autograde and
# generate_feedback must carry it along, or release_feedback cannot file the feedback under it
# (and fetch_feedback gives each student only the feedback of their own submissions).
c.CourseDirectory.include = list(c.CourseDirectory.include) + ["submission_secret.txt"]
'''


def make(folder: str, exchange: str, course_id: str, owner: str | None = None) -> None:
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    link = os.path.join(folder, "solutions")
    if os.path.islink(link):
        os.remove(link)
    if os.path.exists(link):
        raise SystemExit(f"error: {link} exists and is not a link to the course's solutions/: move it away first")
    os.symlink(os.path.join(REPO, "solutions"), link)
    with open(os.path.join(folder, "nbgrader_config.py"), "w") as f:
        f.write(CONFIG.format(repo_config=os.path.join(REPO, "nbgrader_config.py"), root=folder,
                              db_url="sqlite:///" + os.path.join(folder, "gradebook.db"), course_id=course_id,
                              exchange=os.path.abspath(exchange),
                              report_dir=os.path.join(folder, "grader-results", "nbgrader")))
    if owner:
        pw = pwd.getpwnam(owner)
        for base, dirs, files in os.walk(folder):
            for name in [base] + [os.path.join(base, n) for n in dirs + files]:
                os.lchown(name, pw.pw_uid, pw.pw_gid)
        shutil.chown(folder, pw.pw_uid, pw.pw_gid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", metavar="DIR")
    ap.add_argument("--exchange", required=True, help="the hub's nbgrader exchange (site.toml: course.exchange)")
    ap.add_argument("--course-id", default="modern-gpu-kernels")
    ap.add_argument("--owner", help="the instructor's user name (when run as root)")
    args = ap.parse_args(argv)
    make(args.folder, args.exchange, args.course_id, args.owner)
    print(f"course folder {os.path.abspath(args.folder)}: solutions/ -> {os.path.join(REPO, 'solutions')}, "
          f"exchange {os.path.abspath(args.exchange)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

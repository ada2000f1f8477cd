"""nbgrader configuration of the course.

solutions/<lab>/ is the single source (nbgrader's source directory); assignments/<lab>/
is the student version that `python -m grader generate` (nbgrader generate_assignment)
writes and that is committed. Submissions go to submitted/<student>/<lab>/.
"""
import os

c = get_config()  # noqa: F821 - provided by nbgrader

HERE = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = HERE
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "assignments"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "gradebook.db")
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "generated", "*.png"]
# Copied by generate_assignment, release, submit and collect: the notebooks, and the
# timestamp.txt that `nbgrader submit` writes beside each submission (collect copies it into
# submitted/<student>/<lab>/; late penalties and `collect --update` read it).
c.CourseDirectory.include = ["*.ipynb", "timestamp.txt"]

# nbgrader's exchange (release_assignment, fetch_assignment, submit, collect) needs a course id
# and a folder; this one lives in the repository and is git-ignored. On a shared server, point
# c.Exchange.root at the folder every student can reach instead.
c.CourseDirectory.course_id = "modern-gpu-kernels"
c.Exchange.root = os.path.join(HERE, "exchange")

# Solution regions become a todo("<grade id>") call instead of `raise NotImplementedError()`:
# a call parses inside a TIRx @T.prim_func body, a raise statement does not.
c.GenerateAssignment.preprocessors = [
    "nbgrader.preprocessors.IncludeHeaderFooter",
    "nbgrader.preprocessors.InstantiateTests",
    "nbgrader.preprocessors.LockCells",
    "grader.stubs.ClearSolutionsWithTodo",
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.CheckCellMetadata",
    "nbgrader.preprocessors.ComputeChecksums",
    "nbgrader.preprocessors.SaveCells",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbgrader.preprocessors.ClearMarkScheme",
    "nbgrader.preprocessors.ComputeChecksums",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# Autograding never runs the student's notebook: nbgrader's Execute step is replaced by
# grader.classroom.nbgrader_autograde.GradeWithGrader, which runs `python -m grader check <lab>
# --submission <saved notebook> --json <file>` (own processes, time limits, hidden cases,
# GRADER_SECRET_SEED from the environment) and writes each part's verdict and points into its
# graded cell, where SaveAutoGrades reads them. The rest of nbgrader's autograde steps stay.
c.Autograde.autograde_preprocessors = [
    "grader.classroom.nbgrader_autograde.GradeWithGrader",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# Kernels build and run during grading: give a notebook time (all parts together).
c.GradeWithGrader.timeout = 3600
# The grader's full report of each submission (measurements, GPU, clocks), git-ignored.
c.GradeWithGrader.report_dir = os.path.join(HERE, "grader-results", "nbgrader")

# `nbgrader validate` (students) still executes notebooks: give it time too.
c.ExecutePreprocessor.timeout = 1800
c.Execute.timeout = 1800

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
c.CourseDirectory.include = ["*.ipynb"]

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

# Kernels build and run during autograding: give a notebook time.
c.ExecutePreprocessor.timeout = 1800
c.Execute.timeout = 1800

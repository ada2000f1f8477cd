"""The stub nbgrader leaves where a solution was.

nbgrader's default stub, ``raise NotImplementedError()``, is a statement that TIRx's
parser rejects inside a ``@T.prim_func`` body with an obscure error. This preprocessor
writes ``todo("<grade id>")`` instead: a call, which parses both in plain Python and in
a kernel body, and which stops with "part <grade id> is not implemented yet" (each lab
notebook defines ``todo`` in its first, locked cell).
"""
from __future__ import annotations

from nbgrader.preprocessors import ClearSolutions

TODO_CALL = 'todo("{part}")'


class ClearSolutionsWithTodo(ClearSolutions):
    def _replace_solution_region(self, cell, language):
        part = cell.metadata.get("nbgrader", {}).get("grade_id", "unnamed")
        saved = dict(self.code_stub)
        self.code_stub = {**saved, language: "# YOUR CODE HERE\n" + TODO_CALL.format(part=part)}
        try:
            return super()._replace_solution_region(cell, language)
        finally:
            self.code_stub = saved

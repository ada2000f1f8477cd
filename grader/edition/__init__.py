"""The student edition of the course: ``python -m grader release DIR``.

The edition is a repository for a class's students: ``assignments/``, ``lectures/``, a README for
students, ``pyproject.toml``/``environment.yml``, and a grader that runs the public checks (the
notebooks' ``check(lab, part, globals())``, ``python -m grader check --public``, ``python -m
grader compile``). It holds no solutions: no ``solutions/``, no reference notebooks, no
``reports/``, and none of ``grader/labs/<lab>.py`` (their ``ref_*`` answers and hidden-case
generators). In their place:

- ``grader/public/<lab>.json``, the public cases of every CPU part as (arguments, expected
  answer, comparison). They are recorded at release time from the labs' declared questions
  (``QUESTIONS``, and the ``Question`` a grading function of ``GRADERS`` grades its calls with):
  the lab's grading function runs in public mode under ``grading.recording``, which hands each
  public call, its answer and its comparison over instead of grading, so they are exactly the
  grader's public cases, compared by the same functions (``compare.ANSWERS``). Parts whose
  grading does more than calls (Lab 3's layouts and address patterns, Lab 6's softmax steps)
  are recorded by their lab's own ``PUBLIC_TABLES`` hook; Lab 3's leaves out the tile layout
  that answers ``transpose_smem_offset``. The reference solution is graded against every table
  before anything is written;
- ``grader/labs/<lab>.py``, three lines: ``GRADERS = table_graders("<lab>")``
  (grader/edition/tables.py). A recorded part is graded from its table, with the comparison its
  lab uses; a part graded by code the edition ships (a default runner of grader/runners.py, which
  grader/dispatch.py falls back to, or a function of another shipped module) is graded by that
  code (Labs 4 and 5's ``sass_hazard`` among them: grader/labs/build_checks.py); any other part
  answers "checked by the course grader (not in the student edition)".

Lecture figures that are drawn from the references (a ``figures.py`` importing ``grader.labs``)
are shipped drawn, without their script. A few shared files are copied with small edits
(``PATCHES``): ``check``/``compile`` default to the notebooks in ``assignments/``. (A check cell
reports a part the edition cannot check as skipped, as it reports any skipped part.) Before it
finishes, the release scans the edition for solution lines and reference code and removes it if
it finds any.

Two modules: ``tables.py`` (the table format and grading from tables) is shipped in the edition;
``release.py`` (recording the tables, writing the edition) stays with the instructors.
"""


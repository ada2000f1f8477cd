"""The labs' own grading code: one module per lab, ``grader/labs/<lab>.py``, for the parts that
the default runners (grader/runners.py: kernel parts that name a problem of grader/problems.py,
build parts) do not grade. Numbers (shapes, tolerances, thresholds, case counts) come from the
lab's spec (grader/specs/<lab>.toml), never from these modules. A lab made of declared parts
only needs no module here.

The hooks a lab module offers, by name:

- ``LAB``: the lab's folder name.
- ``GRADERS``: part id -> ``grade(submission, ctx) -> Outcome``, the lab's own grading functions
  (read by grader/dispatch.py, the one dispatch). ``submission`` gives the student's functions
  as attributes (``grading.student(submission, name)``); ``ctx`` (grader/context.py) gives the
  part's spec, the seed, the device and whether only the public cases run.
- ``QUESTIONS``: part id -> ``grading.Question(cases, answers=..., params=..., compare=...)``, a
  CPU question declared as data: its calls (``(kind, args)``, public ones first, or ``(kind,
  args, hidden)``), the trusted answer of each kind of call, the argument names for messages and
  the comparison, a name of ``compare.ANSWERS`` (one registry: the grader and the student
  edition's tables compare with the same functions; ``close`` and ``time_bound`` read the part's
  ``rel_tol``). Graded by ``grading.grade_question`` (one engine for every table of calls,
  ``grading.grade_calls``) and recorded for the student edition from the same declaration, with
  no code of the lab's own. Every CPU question of Labs 1-6 is declared this way.
- A grading function of ``GRADERS`` that checks more than calls (a figure, a layout's design)
  grades its calls with ``grading.grade_question`` on a ``Question`` of its own and its figures
  with ``grading.figure``; the edition records both (Lab 1's c_roofline, Lab 3's c_atom).
- ``PUBLIC_TABLES``: part id -> ``record(ctx, tables) -> entry``, for a CPU part whose grading
  does more than tables of calls: the lab records the part's public cases itself, with the table
  toolkit ``tables`` (grader/edition/tables.py) it is handed, from its own case generators and
  references (Lab 3's layouts and address patterns, Lab 6's softmax steps).
- ``ref_*``: the reference answers. Lecture figure scripts may draw from them; they are never
  shipped to students (the edition replaces this module by ``GRADERS = table_graders(lab)``).

This package imports nothing of the grader on its own: the dispatch imports a lab's module when
a part of that lab is graded."""

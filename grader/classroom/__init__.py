"""Grading a whole class, built on the grading core: ``batch`` (every submission of a lab on this
host's GPUs and cores, resumable), ``slurm`` (the same as a Slurm job array, and ``collect``),
``gradebook`` (one table and plots for the class, nbgrader's database and CSV), and
``nbgrader_autograde`` (nbgrader's autograde step, grading each saved notebook with
``python -m grader check``). Their subcommands are in ``commands``."""

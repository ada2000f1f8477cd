"""The course autograder: a small library, one job per module.

hardware (GPU table, detection) · spec (each lab's declared parts and thresholds) ·
inputs (seeded inputs) · compare (tolerances, mismatch reports) · timing (events, L2
flush, statistics, floor, clocks) · build (TIRx compilation, compile-only) · inspect
(mechanism checks in SASS) · submission (notebook to module, line map, advice) ·
sandbox (the trust boundary: jailed children, trusted commands) · jail (the namespaces and
allow-listed file system a child runs in) · child (its side) · channel (messages between
processes) · remote (the grader's view of the child) · devcode (a kernel as PTX and a launch
plan, made in the child) · launch (the plan validated, the PTX assembled, the cubin launched
through the CUDA driver) · harness (the trusted GPU process) · run (a lab's parts) · problems and runners
(kernel problems declared once) · report (schema, table, exporters) · notebook (helpers
for notebook cells) · nbgrader_autograde · release (the student edition) · batch, slurm,
gradebook (a whole class) · cli.
"""

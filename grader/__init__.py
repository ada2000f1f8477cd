"""The course autograder: a small library, one job per module.

hardware (GPU table, detection) · spec (each lab's declared parts and thresholds) ·
context (what a grading function is given) · inputs (seeded inputs) · compare (tolerances,
mismatch reports) · timing (events, L2 flush, statistics, floor, clocks) · toolchain (the CUDA
tools) · build (TIRx compilation, compile-only) · inspect (mechanism checks in SASS and PTX) ·
ptxflow (the PTX analysis they read: functions, control flow, values traced to parameters) ·
submission (notebook to module, line map, advice) · sandbox (the trust boundary: jailed
children, trusted commands) · jail (the namespaces and allow-listed file system a child runs
in) · child (its side) · channel (messages between processes) · remote (the grader's view of
the child) · devcode (a kernel as PTX and a launch plan, made in the child) · launch (the plan
validated, the PTX assembled, the cubin launched through the CUDA driver) · grading (the
toolkit of grading functions) · problems and runners (kernel problems declared once, graded by
default runners) · labs (the labs' own grading functions) · dispatch (which function grades a
part) · run (a lab's parts) · harness (the trusted GPU process) · report (schema, table,
exporters) · notebook (helpers for notebook cells) · hints (compiler errors in the course's
words) · cli.

Programs built on it, each a package: classroom (batch, Slurm, gradebook, nbgrader autograde),
edition (the student edition), timeline (pipeline timelines of kernels).
"""

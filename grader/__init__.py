"""The course autograder: a small library, one job per module.

hardware (GPU table, detection) · spec (each lab's declared parts and thresholds) ·
inputs (seeded inputs) · compare (tolerances, mismatch reports) · timing (events, L2
flush, statistics, floor, clocks) · build (TIRx compilation, compile-only) · inspect
(mechanism checks) · submission (notebook to module, static rules) · sandbox
(a subprocess per part) · run (a lab's parts) · report (schema, table, exporters) ·
notebook (helpers for notebook cells) · cli.
"""

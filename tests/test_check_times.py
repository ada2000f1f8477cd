"""benchmarks/check_times.py: the seconds of each phase of a check, the innermost phase of nested
calls counted alone, and a real check of a lab's part as one table row."""
import os
import sys
import time

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import check_times as ct  # noqa: E402


def test_nested_phases_count_in_the_inner_one_only():
    phases = ct.Phases()
    inner = phases.wrap("inner", lambda: time.sleep(0.05))
    outer = phases.wrap("outer", lambda: (time.sleep(0.05), inner()))
    outer()
    assert 0.04 < phases.seconds["inner"] < 0.09
    assert 0.04 < phases.seconds["outer"] < 0.09                 # not 0.1: the inner call is left out


def test_a_cpu_part_is_one_row_with_its_verdict(capsys):
    assert ct.main(["--lab", "lab1_roofline", "--part", "a_flops"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a_flops |")]
    assert len(rows) == 1 and rows[0].endswith("| ok |"), rows

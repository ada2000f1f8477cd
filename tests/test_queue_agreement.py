"""benchmarks/queue_agreement.py on the CPU: its Slurm stand-ins run a queued check's job, and the
report the queued check prints is read back part by part (points, verdict, speed ratio)."""
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import queue_agreement as qa  # noqa: E402


def test_a_report_line_is_read_with_its_ratio():
    line = ("  [PASS] lab2_tma/e_speed         3.00 / 3    build_tma_stream on NVIDIA H200 (16384x8192: 3.91 vs "
            "copy 4.16 TB/s); ratio to copy: 0.939x (full credit at 0.85x, none at or below 0.5x)")
    m = qa.REPORT_LINE.match(line)
    assert m.group(2, 3, 4, 5) == ("lab2_tma", "e_speed", "3.00", "3")
    assert qa.RATIO.search(m.group(6)).group(1) == "0.939"
    assert qa.REPORT_LINE.match("  [SKIP] lab2_tma/d_correct         -   / 3    skipped: needs a GPU") is None


@pytest.mark.slow
def test_the_queued_check_runs_through_the_stand_ins_and_is_read_back(tmp_path):
    parts, text, seconds = qa.queued("lab1_roofline", str(tmp_path), use_shim=True)
    assert "queue-check: job 1 on" in text or "submitted job 1" in text, text[-3000:]
    assert parts["a_flops"] == {"points": 2.0, "ratio": None, "verdict": "pass"}, text[-3000:]
    assert parts["b_build"]["points"] == 2.0, text[-3000:]
    assert "b_correct" not in parts                 # skipped without a GPU: no points to compare

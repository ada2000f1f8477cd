"""`python -m grader generate` writes assignments/ and nothing else: the committed notebooks come
out unchanged and nbgrader's gradebook gets no lab (a lab registered there before it is handed
out would give every student a 0 in `nbgrader export`)."""
import os
import subprocess
import sys

import pytest

from test_lectures import checkout_copy, git_status


@pytest.mark.slow
def test_generate_writes_only_assignments(root, tmp_path):
    course = checkout_copy(root, str(tmp_path / "course"))
    env = dict(os.environ, PYTHONPATH=course)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([sys.executable, "-m", "grader", "generate", "lab1_roofline"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not os.path.exists(os.path.join(course, "gradebook.db")), "generate registered labs in the gradebook"
    assert git_status(course) == "", git_status(course)

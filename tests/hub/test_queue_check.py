"""python -m grader queue-check: the public check of a saved notebook as a Slurm job on the course's
GPU partition. The job script and the course's limits without a cluster; then real jobs on the
one-node Slurm of .ci/slurm-up (CPU there: the report's GPU parts say skipped), skipped with the
reason where no cluster answers (failed where COURSE_HUB_REQUIRED=1, as in .ci/run)."""
import os
import re
import subprocess
import sys
import time

import pytest

from grader.classroom import queue
from hubclient import ROOT
from slurmhere import cluster_or_reason

pytestmark = pytest.mark.hub

LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
TABLE_ROW = re.compile(r"^\s+\[(PASS|PARTIAL|FAIL|ERROR|SKIP)\] lab1_roofline/\S+.*$", re.M)


def _grader(*args, timeout=900):
    env = {k: v for k, v in os.environ.items() if k not in ("GRADER_SECRET_SEED", "GRADER_QUEUE_CONFIG")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------------ no cluster

def test_job_script_asks_for_one_gpu_on_the_course_partition(tmp_path):
    cfg_path = tmp_path / "queue.toml"
    cfg_path.write_text('partition = "gpu-class"\naccount = "course42"\nmax_in_flight = 2\n'
                        'setup = ["module load cuda"]\nsbatch_args = ["--constraint=h200"]\n')
    cfg = queue.load_config(str(cfg_path))
    text = queue.render_script(LAB, "/spool/j/nb.ipynb", "/spool/j", cfg, 17, ["a_flops"])
    for line in ("#SBATCH --job-name=grader-queue-check", "#SBATCH --gres=gpu:1", "#SBATCH --time=17",
                 "#SBATCH --partition=gpu-class", "#SBATCH --account=course42", "#SBATCH --constraint=h200",
                 "#SBATCH --output=/spool/j/job.out", "module load cuda", "unset GRADER_SECRET_SEED",
                 "-m grader check lab1_roofline --submission /spool/j/nb.ipynb --public --part a_flops"):
        assert line in text, line
    assert "--unsafe-no-sandbox" not in text          # the jail, always
    cfg_path.write_text('max_in_flite = 2\n')
    with pytest.raises(queue.QueueError, match="unknown key"):
        queue.load_config(str(cfg_path))


def test_limits_in_flight_and_per_hour():
    cfg = queue.QueueConfig(max_in_flight=1, max_per_hour=3)
    now = 10_000.0
    assert queue.refusal([], [now - 100, now - 50], cfg, now) is None
    why = queue.refusal([("41", "PENDING")], [], cfg, now)
    assert "1 check(s) queued or running (job 41 (pending))" in why and "1 at a time" in why
    why = queue.refusal([], [now - 3000, now - 100, now - 50], cfg, now)
    assert "3 checks in the last hour" in why and "3 an hour" in why
    assert queue.refusal([], [now - 3000, now - 100, now - 50], queue.QueueConfig(max_per_hour=0), now) is None


def test_submissions_older_than_an_hour_do_not_count(tmp_path):
    now = time.time()
    for stamp in (now - 7200, now - 1800):
        queue.record_submission(str(tmp_path), stamp)
    assert queue.recent_submissions(str(tmp_path), now) == [now - 1800]


# ------------------------------------------------------------------ the one-node cluster

@pytest.fixture(scope="module")
def cluster():
    reason = cluster_or_reason()
    if reason:
        if os.environ.get("COURSE_HUB_REQUIRED") == "1":
            pytest.fail(f"the queued check's test cannot run: {reason}")
        pytest.skip(reason)
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout
    return next(p.rstrip("*") for p in partition.split() if p.endswith("*"))


def _wait_gone(job_id, timeout=900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            return
        time.sleep(2)
    q = subprocess.run(["squeue"], capture_output=True, text=True).stdout
    pytest.fail(f"job {job_id} still queued or running after {timeout} s:\n{q}")


def test_queued_public_check_on_the_cluster(cluster, tmp_path):
    cfg = tmp_path / "queue.toml"
    cfg.write_text(f'partition = "{cluster}"\nmax_in_flight = 1\nmax_per_hour = 2\npoll_s = 1\n'
                   f'spool = "{tmp_path / "spool"}"\n')
    # Queued without waiting; a second check while it is in flight is refused.
    first = _grader("queue-check", LAB, "--submission", SOLUTION, "--queue-config", str(cfg), "--no-wait")
    assert first.returncode == 0, first.stdout + first.stderr
    job_id = re.search(r"submitted job (\d+)", first.stdout).group(1)
    assert f"partition {cluster}, --gres=gpu:1" in first.stdout, first.stdout
    second = _grader("queue-check", LAB, "--submission", SOLUTION, "--queue-config", str(cfg))
    assert second.returncode == 4, second.stdout + second.stderr
    assert f"job {job_id} (" in second.stderr and "allows 1 at a time" in second.stderr, second.stderr
    _wait_gone(job_id)
    job_dir = next(p for p in (tmp_path / "spool").iterdir() if p.is_dir())
    with open(job_dir / "job.out") as f:
        out = f.read()
    assert f"{queue.EXIT_MARK}0" in out, out[-3000:]
    assert "Student code runs in: jail" in out, out[:2000]
    assert re.search(r"\[SKIP\] lab1_roofline/b_correct .*skipped: needs a GPU", out), out[-3000:]
    assert "[PASS] lab1_roofline/a_flops" in out and "[PASS] lab1_roofline/b_build" in out, out[-3000:]

    # Waiting for it: the same report rows as `check --public` here, then the hourly limit.
    waited = _grader("queue-check", LAB, "--submission", SOLUTION, "--queue-config", str(cfg), "--part", "a_flops",
                     "--part", "b_correct")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert re.search(r"job \d+: running on ", waited.stdout), waited.stdout
    local = _grader("check", LAB, "--submission", SOLUTION, "--public", "--part", "a_flops", "--part", "b_correct")
    assert local.returncode == 0, local.stdout + local.stderr
    queued_rows = [m.group(0).strip() for m in TABLE_ROW.finditer(waited.stdout)]
    local_rows = [m.group(0).strip() for m in TABLE_ROW.finditer(local.stdout)]
    assert queued_rows == local_rows and TABLE_ROW.findall(waited.stdout) == ["PASS", "SKIP"], \
        waited.stdout + "\n---- here:\n" + local.stdout
    third = _grader("queue-check", LAB, "--submission", SOLUTION, "--queue-config", str(cfg))
    assert third.returncode == 4 and "2 checks in the last hour" in third.stderr, third.stdout + third.stderr

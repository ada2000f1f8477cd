"""python -m grader batch --slurm and collect: the job array script, and a real run on a Slurm
cluster when one answers here (CI starts a one-node cluster with .ci/slurm-up; elsewhere the
cluster test is skipped with the reason)."""
import csv
import json
import os
import subprocess
import sys
import types

import pytest

from grader.classroom import batch, slurm
from slurmhere import cluster_or_reason, node_takes_jobs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = "lab1_roofline"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
STUDENT = os.path.join(ROOT, "assignments", LAB, f"{LAB}.ipynb")


def _args(**kw):
    base = dict(slurm_config=None, account=None, partition=None, qos=None, gres=None, cpus_per_task=None,
                mem=None, slurm_time=None, slurm_chunk=None, slurm_max_parallel=None, slurm_poll=None)
    return types.SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------ the script (no cluster)

def test_time_limit_from_the_part_timeouts():
    parts = batch.selected_parts(LAB, None)
    per = batch.STARTUP_S + sum(p.timeout_s for p in parts)
    assert slurm.time_limit_minutes(LAB, None, 1) == -(-per * slurm.TIME_MARGIN // 60)
    assert slurm.time_limit_minutes(LAB, None, 3) == -(-3 * per * slurm.TIME_MARGIN // 60)
    assert slurm.time_limit_minutes(LAB, ["a_flops"], 1) == slurm.MIN_TIME_MINUTES   # 240 s: the minimum


def test_config_file_and_options(tmp_path, monkeypatch):
    cfg_path = tmp_path / "slurm.toml"
    cfg_path.write_text('account = "course42"\npartition = "gpu"\nchunk = 2\nmax_parallel = 3\n'
                        'setup = ["module load cuda"]\nsbatch_args = ["--constraint=h200"]\n')
    monkeypatch.setenv(slurm.CONFIG_ENV, str(cfg_path))
    cfg = slurm.resolve_config(_args(partition="debug"))          # the option wins over the file
    assert (cfg.account, cfg.partition, cfg.chunk, cfg.gres) == ("course42", "debug", 2, "gpu:1")
    text = slurm.render_script(LAB, "/r/run", "/r/run/manifest.json", 5, cfg, 17)
    for line in ("#SBATCH --array=0-4%3", "#SBATCH --gres=gpu:1", "#SBATCH --time=17",
                 "#SBATCH --account=course42", "#SBATCH --partition=debug", "#SBATCH --constraint=h200",
                 "#SBATCH --output=/r/run/task-%a.out", "module load cuda",
                 "-m grader.classroom.slurm task /r/run/manifest.json"):
        assert line in text, line
    assert "--cpus-per-task" not in text                          # Slurm's default unless asked
    cfg_path.write_text('acount = "typo"\n')
    with pytest.raises(slurm.SlurmError, match="unknown key"):
        slurm.resolve_config(_args())


def test_sbatch_and_squeue_output_parsing():
    assert slurm.parse_sbatch("1234\n") == "1234"
    assert slurm.parse_sbatch("1234;cluster\n") == "1234"
    with pytest.raises(slurm.SlurmError):
        slurm.parse_sbatch("sbatch: error: Batch job submission failed")
    assert slurm._expand("[2-5%4]") == [2, 3, 4, 5]
    assert slurm._expand("1,4-6") == [1, 4, 5, 6]
    assert slurm._expand("3") == [3]


def test_which_node_states_take_the_tests_jobs():
    # A node the backfill scheduler holds for another test's pending job says 'planned': it runs
    # jobs, and the cluster's tests must run rather than fail for want of a cluster.
    for state in ("idle", "mixed", "allocated+", "completing", "planned", "idle*", "mixed-"):
        assert node_takes_jobs(state), state
    for state in ("down", "drained", "draining", "fail", "unknown", "future", "down*", "reserved"):
        assert not node_takes_jobs(state), state


# ------------------------------------------------------------------ a real cluster

def _grader(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT, GRADER_CPU_ONLY="1")
    env.pop("GRADER_SECRET_SEED", None)
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _copy(src, dst, old=None, new=None):
    with open(src) as f:
        text = f.read()
    if old is not None:
        assert json.dumps(old)[1:-1] in text
        text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as f:
        f.write(text)


@pytest.mark.slow
def test_job_array_on_a_real_cluster(tmp_path):
    reason = cluster_or_reason()
    if reason:
        pytest.skip(reason)
    subs, out = tmp_path / "submitted", tmp_path / "results"
    _copy(SOLUTION, str(subs / "ann" / LAB / f"{LAB}.ipynb"))
    _copy(STUDENT, str(subs / "bo" / LAB / f"{LAB}.ipynb"))
    _copy(SOLUTION, str(subs / "cat" / LAB / f"{LAB}.ipynb"),
          'return flops / 2 if op["causal"] else flops', "return flops")          # partly right
    os.makedirs(subs / "dan" / LAB)
    (subs / "dan" / LAB / f"{LAB}.ipynb").write_text("{ not a notebook")        # broken
    expect = {"ann": "passed", "bo": "failed", "cat": "partial", "dan": "error"}

    # Submit without waiting, cancel one task at once (a task that dies), wait for the rest.
    p = _grader("batch", LAB, str(tmp_path), "--out", str(out), "--part", "a_flops", "--slurm", "--no-wait")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "submitted job" in p.stdout and "4 task(s)" in p.stdout
    manifest = slurm.manifests(str(out), LAB)[-1]
    m = json.load(open(manifest))
    job = m["submissions"][0]["job_id"]
    script = open(m["script"]).read()
    assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --array=0-3" in script
    victim = [t[0]["student"] for t in m["tasks"]].index("dan")
    subprocess.run(["scancel", f"{job}_{victim}"], check=True, timeout=30)

    c = _grader("collect", str(out), "--wait", "--poll", "1")
    assert c.returncode == 1, c.stdout + c.stderr
    assert f"dead task {victim}: job {job}_{victim}" in c.stdout and "dan" in c.stdout, c.stdout

    # The dead task, resubmitted alone.
    r = _grader("collect", str(out), "--resubmit", "--wait", "--poll", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resubmitted task(s) {victim} as job" in r.stdout and "4/4 graded; 0 dead task(s)" in r.stdout
    m = json.load(open(manifest))
    assert m["submissions"][1]["tasks"] == [victim]

    # The same result files as on one host; Slurm's GPU pinned the task.
    for student, verdict in expect.items():
        d = out / LAB / student
        rep = json.loads((d / "report.json").read_text())
        assert [r["verdict"] for r in rep["results"]] == [verdict], student
        st = json.loads((d / "status.json").read_text())
        assert st["state"] == "done" and st["pieces"]["all"]["slurm"]["SLURM_ARRAY_JOB_ID"]
        assert (d / "results.json").exists() and (d / "all.log").exists()
    assert json.loads((out / LAB / "dan" / "status.json").read_text())["pieces"]["all"]["slurm"][
        "SLURM_ARRAY_JOB_ID"] != job

    # The class's gradebook.
    g = _grader("gradebook", str(out))
    assert g.returncode == 0, g.stdout + g.stderr
    with open(out / "gradebook" / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert {s: rows[s]["a_flops verdict"] for s in rows} == expect
    assert rows["ann"]["total"] == "2" and rows["bo"]["total"] == "0"

    # Nothing left to do: a --resume submits nothing.
    again = _grader("batch", LAB, str(tmp_path), "--out", str(out), "--part", "a_flops", "--slurm", "--resume")
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr

"""Whether a Slurm cluster here can take the tests' jobs (tests/grader/test_slurm.py, tests/hub)."""
from __future__ import annotations

import shutil
import subprocess

# Node states (sinfo %T) in which a node runs jobs now or will run a queued one: PLANNED is an
# idle node the backfill scheduler holds for a pending job, as when another test's job waits.
TAKES_JOBS = {"idle", "mixed", "allocated", "completing", "planned"}
# Flags sinfo appends to a state: not responding, powered off, powering up, and so on.
_FLAGS = "*~#!%$@^-"


def node_takes_jobs(state: str) -> bool:
    """True for a state of sinfo's %T such as 'idle', 'mixed*', 'allocated+' or 'planned'."""
    return any(part.rstrip(_FLAGS) in TAKES_JOBS for part in state.lower().split("+"))


def cluster_or_reason() -> str | None:
    """None when a Slurm cluster with gpu generic resources takes jobs here; else why not."""
    if not shutil.which("sbatch"):
        return "sbatch is not on PATH: no Slurm here (CI starts a one-node cluster with .ci/slurm-up, as root)"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T %G"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo did not answer: {e}"
    if p.returncode != 0:
        return f"the Slurm controller does not answer: sinfo: {p.stderr.strip()}"
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.strip()]
    if not any(node_takes_jobs(f[0]) for f in lines):
        return f"no Slurm node takes jobs: sinfo says {p.stdout.strip()!r}"
    if not any("gpu" in (f[1] if len(f) > 1 else "") for f in lines):
        return f"no Slurm node declares gpu generic resources: sinfo says {p.stdout.strip()!r}"
    return None

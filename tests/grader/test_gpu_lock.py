"""The GPU lock: correctness parts of several grader processes may share a GPU, a timed part has
it alone, and each GPU has its own lock (a batch grades on every GPU of a host at once)."""
import fcntl
import os
from types import SimpleNamespace


from grader import sandbox, run


def _probe_lock(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "GPU_LOCK", str(tmp_path / "gpu-{}.lock"))
    seen = {}

    def probe(self, job, backend, part):
        for gpu in ("GPU-1", "GPU-2"):
            fd = os.open(run.GPU_LOCK.format(gpu), os.O_CREAT | os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)   # can another correctness part join?
                seen[(part.id, gpu)] = "joinable"
            except BlockingIOError:
                seen[(part.id, gpu)] = "exclusive"
            finally:
                os.close(fd)
        return part.id

    monkeypatch.setattr(run.Harness, "_grade", probe)
    return seen


def test_correctness_parts_share_the_gpu_and_timed_parts_do_not(monkeypatch, tmp_path):
    seen = _probe_lock(monkeypatch, tmp_path)
    h = run.Harness()
    assert h.grade({}, None, SimpleNamespace(id="correct", thresholds=None), "GPU-1") == "correct"
    assert h.grade({}, None, SimpleNamespace(id="speed", thresholds=[{"min_ratio": 0.5}]), "GPU-1") == "speed"
    assert seen[("correct", "GPU-1")] == "joinable"
    assert seen[("speed", "GPU-1")] == "exclusive"
    assert seen[("speed", "GPU-2")] == "joinable"          # another GPU is not held up


def test_the_gpu_lock_lives_in_the_graders_private_folder(monkeypatch, tmp_path):
    """A lock planted where the v2 grader kept it (/tmp) stops nothing: the lock is in the
    private folder, which a child cannot reach."""
    seen = _probe_lock(monkeypatch, tmp_path)
    planted = "/tmp/" + "grader-gpu-GPU-1.lock"
    os.makedirs(planted, exist_ok=True)
    try:
        run.Harness().grade({}, None, SimpleNamespace(id="speed", thresholds=[1]), "GPU-1")
    finally:
        os.rmdir(planted)
    assert seen[("speed", "GPU-1")] == "exclusive"
    assert os.path.exists(os.path.join(sandbox.private_dir(), run.GPU_LOCK.format("GPU-1")))

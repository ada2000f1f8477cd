"""Kernels built once per submission and shared by its workers (remote.Builds)."""
import json
import os

import pytest

from grader import remote
from grader.sandbox import SandboxFailure


class FakeSession:
    """A child: builders return kernel handles numbered from 1 in each child, exports a file."""

    def __init__(self, fail=None, hang=None):
        self.alive, self.sent, self.fail, self.hang, self.cell_errors = False, [], fail or set(), hang or set(), []
        self.kernels = {}

    def start(self, timeout):
        self.alive, self.kernels = True, {}

    def close(self):
        self.alive = False

    def request(self, msg, left):
        self.sent.append(msg)
        if msg["op"] == "call":
            if msg["name"] in self.hang:
                self.alive = False
                raise SandboxFailure("timed out after 5 s")
            if msg["name"] in self.fail:
                return {"error": "ValueError", "message": "bad shape", "todo": False}
            self.kernels[len(self.kernels) + 1] = msg["name"]
            return {"kernel": len(self.kernels)}
        name = f"k{msg['kernel']}"
        return {"device_code": {"json": json.dumps({"plan": {"version": 1}, "arch": msg["arch"], "cuda_source": name}),
                                "ptx": "// ptx of " + name}}


def backends(n, **kw):
    builds = remote.Builds()
    return [remote.ChildBackend(FakeSession(**kw), builds=builds) for _ in range(n)]


def ops(b):
    return [m["op"] for m in b.session.sent]


def test_a_kernel_built_by_one_worker_is_not_built_again_by_another():
    a, b = backends(2)
    ka = a.call("build", [64, 64], {})["kernel"]
    code = a.export(ka, "sm_90a")["code"]
    kb = b.call("build", [64, 64], {})["kernel"]
    assert kb == ka and b.export(kb, "sm_90a")["code"] == code
    assert ops(a) == ["call", "export"] and ops(b) == []          # b's child was never started
    assert b.call("build", [128, 64], {})["kernel"] != ka            # other arguments: another kernel


def test_device_code_for_another_arch_is_built_in_the_asking_workers_own_child():
    a, b = backends(2)
    k = a.call("build", [64, 64], {})["kernel"]
    a.export(k, "sm_90a")
    assert b.export(k, "sm_100a")["code"]["arch"] == "sm_100a"
    assert ops(b) == ["call", "export"] and b.session.sent[0]["args"] == [64, 64]


def test_a_restarted_child_builds_the_kernel_again_before_exporting_it():
    (a,) = backends(1)
    k = a.call("build", [64, 64], {})["kernel"]
    a.end()                                         # stopped before timing
    a.export(k, "sm_90a")
    assert ops(a) == ["call", "call", "export"]


def test_failures_built_ahead_are_the_parts_verdict_without_running_again():
    a, b = backends(2, fail={"bad"}, hang={"slow"})
    assert "error" in a.call("bad", [1], {}, keep_failure=True)
    assert b.call("bad", [1], {})["message"] == "bad shape" and ops(b) == []
    with pytest.raises(SandboxFailure):
        a.call("slow", [1], {}, keep_failure=True)
    with pytest.raises(SandboxFailure, match="timed out"):
        b.call("slow", [1], {})
    assert ops(b) == []
    assert "error" in a.call("bad", [2], {}) and "error" in a.call("bad", [2], {})    # not kept: asked twice
    assert [m["args"] for m in a.session.sent if m["name"] == "bad"] == [[1], [2], [2]]


@pytest.mark.slow
def test_a_kernel_lowered_here_is_lowered_once_per_arch(root, tmp_path, monkeypatch):
    """Build parts of several steps often ask for the same kernel at the same shape: a PrimFunc
    structurally equal to one lowered before is not lowered again; another shape or arch is."""
    from conftest import import_notebook

    from grader import build, devcode
    lab1 = import_notebook(os.path.join(root, "solutions", "lab1_roofline", "lab1_roofline.ipynb"), tmp_path,
                           "lab1_for_lowering")
    lowered, real = [], devcode.lowered
    monkeypatch.setattr(devcode, "lowered", lambda f, arch: lowered.append(arch) or real(f, arch))
    monkeypatch.setattr(build, "_LOWERED", {})
    first = build.compile_only(lab1.build_scale_add(1 << 16), "sm_90a")
    again = build.compile_only(lab1.build_scale_add(1 << 16), "sm_90a")     # a new, equal PrimFunc
    assert lowered == ["sm_90a"] and again.ptx == first.ptx
    build.compile_only(lab1.build_scale_add(1 << 17), "sm_90a")
    build.compile_only(lab1.build_scale_add(1 << 16), "sm_100a")
    assert lowered == ["sm_90a", "sm_90a", "sm_100a"]


def test_in_fresh_thread_returns_or_raises_what_the_call_did_on_a_short_stack():
    import inspect
    import threading

    from grader import build

    def deep(n, fn):
        return fn() if n == 0 else deep(n - 1, fn)
    here = threading.get_ident()
    seen = deep(50, lambda: build.in_fresh_thread(lambda: (threading.get_ident(), len(inspect.stack(0)))))
    assert seen[0] != here and seen[1] < 10                  # the caller's 50 frames are not there
    with pytest.raises(KeyError) as e:
        build.in_fresh_thread(lambda: {}["missing"])
    assert e.value.args == ("missing",)


def test_the_harness_gets_the_cubin_the_grading_process_assembled_once(monkeypatch):
    """A kernel built ahead is assembled by the grading process before any part takes the GPU's
    lock; the harness is given that cubin and runs no ptxas of its own for it."""
    import base64
    from grader import build, launch
    runs = []

    def fake_assemble(ptx, arch):
        runs.append(ptx)
        if "broken" in ptx:
            raise launch.AssemblyFailed("ptxas: syntax error")
        return b"CUBIN:" + ptx.encode(), "log"

    monkeypatch.setattr(launch, "assemble", fake_assemble)
    monkeypatch.setattr(build, "_ASSEMBLED", {})
    reply = {"code": {"ptx": ".version 8.0 // kernel k", "plan": {}, "cuda_source": "", "arch": "sm_90a"}}
    ahead = build.with_cubin(reply, "sm_90a")                 # built ahead: assembled here, once
    served = build.with_cubin(reply, "sm_90a")                # the harness's request: from the cache
    assert runs == [".version 8.0 // kernel k"]
    assert base64.b64decode(served["code"]["cubin_b64"]) == b"CUBIN:.version 8.0 // kernel k" == \
        base64.b64decode(ahead["code"]["cubin_b64"])
    assert "cubin_b64" not in reply["code"]                    # the shared table's copy is left as it was
    broken = {"code": {"ptx": "broken", "plan": {}}}
    assert build.with_cubin(broken, "sm_90a") is broken       # the harness assembles it and reports the error
    assert build.with_cubin({"error": "BuildFailed"}, "sm_90a") == {"error": "BuildFailed"}

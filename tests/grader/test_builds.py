"""Kernels built once per submission and shared by its workers (remote.Builds)."""
import json

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
        self.arch = msg["arch"]
        return {"files": {"json": f"k{msg['kernel']}.json", "ptx": f"k{msg['kernel']}.ptx"}}

    def read(self, name, max_bytes=0):
        if name.endswith(".json"):
            return json.dumps({"plan": {"version": 1}, "arch": self.arch, "cuda_source": name}).encode()
        return b"// ptx of " + name.encode()


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

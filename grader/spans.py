"""Where a grading run's time goes. With ``GRADER_TRACE`` set to a file's path, the grading
processes (``check``, each lab's process under ``check all``, a batch) append one JSON line per
span to it: what was done (``what``), for which lab and part, its start and end (seconds since
the epoch), the process and the thread. Without it nothing is written and a span costs nothing.

The spans are the phases a part waits on: a part as a whole, a child's start and each request to
it of 50 ms or more (a builder's lowering, an export; a lab's many quick calls are left out), the grader's own ptxas, the GPU's grading lock (waited for
and held, shared or exclusive), the machine's one profiler (waited for) and each run of ncu.
``python benchmarks/grading_timeline.py TRACE --out DIR`` (TRACE may be gzipped) draws them and sums them per lab.

Only trusted grading processes write spans; the jailed children and the GPU harness do not."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time

ENV = "GRADER_TRACE"
_where = threading.local()      # the lab and part the current thread is grading


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextlib.contextmanager
def grading(lab: str, part: str, what: str = "part"):
    """A span ``what`` for the block; spans this thread opens inside it are the work of ``lab``'s
    ``part``."""
    old = getattr(_where, "fields", None)
    _where.fields = {"lab": lab, "part": part}
    try:
        with span(what):
            yield
    finally:
        _where.fields = old


@contextlib.contextmanager
def span(what: str, min_s: float = 0.0, **fields):
    """Write a span for the block, if tracing is on and it took at least ``min_s`` seconds."""
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    start = time.time()
    try:
        yield
    finally:
        if time.time() - start < min_s:
            return
        record = {"what": what, "start": round(start, 4), "end": round(time.time(), 4), "pid": os.getpid(),
                  "thread": threading.get_ident(), **(getattr(_where, "fields", None) or {}), **fields}
        try:        # one write per line, O_APPEND: lines of processes writing at once do not interleave
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass


def read(path: str) -> list[dict]:
    """The spans of a trace file (or of its gzip, ``TRACE.gz``, as the course's records keep them),
    in order of start (a torn last line is skipped)."""
    import gzip
    out = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return sorted(out, key=lambda s: s["start"])

"""One result schema for every graded part, the console table, and the exporters.

A :class:`PartResult` is what every part of every lab produces, whether it was
graded on the CPU, on a GPU, or skipped. A :class:`Report` bundles the results of
one run with the facts needed to trust them later (GPU, clocks, versions, seed).
Exporters turn a report into Gradescope's ``results.json`` or nbgrader scores.
"""
from __future__ import annotations

import dataclasses
import json
import platform
import time
from typing import Any, Iterable

SCHEMA_VERSION = 2

# Verdicts a part can end with.
PASSED = "passed"        # full points
PARTIAL = "partial"      # some points (performance between floor and full credit)
FAILED = "failed"        # wrong result, missing mechanism, too slow, ...
ERROR = "error"          # the submission crashed, timed out or did not build
SKIPPED = "skipped"      # could not be graded here (no GPU); never counts as zero silently
INFRASTRUCTURE = "infrastructure"   # the grading machine failed (the jail, the GPU harness), not the
                                    # submission: not graded; `check` exits non-zero (grader/cli.py)
VERDICTS = (PASSED, PARTIAL, FAILED, ERROR, SKIPPED, INFRASTRUCTURE)


@dataclasses.dataclass
class PartResult:
    lab: str
    part: str
    title: str
    points: float
    max_points: float
    verdict: str
    message: str = ""
    needs_gpu: bool = False
    measurements: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")
        if not 0 <= self.points <= self.max_points + 1e-9:
            raise ValueError(f"points {self.points} outside [0, {self.max_points}]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def environment_facts() -> dict[str, Any]:
    """Versions recorded with every report."""
    facts: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for mod in ("torch", "tvm", "numpy"):
        try:
            facts[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing module is a fact worth recording
            facts[mod] = None
    try:
        import torch
        facts["cuda_runtime"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        facts["cuda_runtime"] = None
    return facts


@dataclasses.dataclass
class Report:
    results: list[PartResult]
    gpu: dict[str, Any]
    seed: str             # "public" or "secret (fingerprint ...)": never the secret itself
    submission: str
    versions: dict[str, Any] = dataclasses.field(default_factory=environment_facts)
    created: str = dataclasses.field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    schema: int = SCHEMA_VERSION
    notes: list = dataclasses.field(default_factory=list)   # advice and per-cell problems, never scored

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "created": self.created, "submission": self.submission,
            "seed": self.seed, "gpu": self.gpu, "versions": self.versions, "notes": self.notes,
            "points": self.points, "max_points": self.max_points,
            "results": [r.to_dict() for r in self.results],
        }

    def write_json(self, path: str) -> None:
        write_atomically(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")


def load_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    validate(data)
    return data


def validate(data: dict[str, Any]) -> None:
    """Raise ValueError when ``data`` is not a report of this schema."""
    for key in ("schema", "gpu", "seed", "versions", "results", "points", "max_points"):
        if key not in data:
            raise ValueError(f"report lacks {key!r}")
    if data["schema"] not in (1, SCHEMA_VERSION):
        raise ValueError(f"report schema {data['schema']} is not {SCHEMA_VERSION}")
    for r in data["results"]:
        PartResult(**r)  # re-validates verdicts and points


# ---------------------------------------------------------------- console output

_MARK = {PASSED: "PASS", PARTIAL: "PART", FAILED: "FAIL", ERROR: "ERR ", SKIPPED: "SKIP", INFRASTRUCTURE: "INFR"}


DISPLAY_DECIMALS = 2   # points are shown rounded to this; reports keep the exact values


def display_points(x: float) -> float:
    """Points as shown to people (console, Gradescope): rounded to two decimals."""
    return round(float(x), DISPLAY_DECIMALS) + 0.0   # + 0.0: no "-0"


def format_points(x: float) -> str:
    """``7.333333`` -> ``"7.33"``, ``3.5`` -> ``"3.5"``, ``2.0`` -> ``"2"``."""
    return f"{display_points(x):.{DISPLAY_DECIMALS}f}".rstrip("0").rstrip(".")


def format_line(r: PartResult) -> str:
    pts = "   -  " if r.verdict == SKIPPED else f"{display_points(r.points):5.2f}"
    return f"  [{_MARK[r.verdict]}] {r.lab}/{r.part:<14} {pts} / {format_points(r.max_points):<4} {r.message}"


def format_table(results: Iterable[PartResult]) -> str:
    """One line per part and a total; totals are sums of the exact points, rounded for display."""
    results = list(results)
    lines = [format_line(r) for r in results]
    got = sum(r.points for r in results)
    total = sum(r.max_points for r in results)
    skipped = [r for r in results if r.verdict == SKIPPED]
    gradable = total - sum(r.max_points for r in skipped)
    fp = format_points
    lines.append(f"  total {fp(got)} / {fp(total)} points"
                 + (f" ({len(skipped)} part(s) skipped, worth {fp(total - gradable)}: graded "
                    f"{fp(got)} of the {fp(gradable)} gradable here)" if skipped else ""))
    broken = not_graded(results)
    if broken:
        lines.append(f"  NOT GRADED: {len(broken)} part(s) ({', '.join(r.part for r in broken)}): the grading "
                     "machine failed, not the submission; grade them again")
    return "\n".join(lines)


def not_graded(results: Iterable[PartResult]) -> list[PartResult]:
    """The parts the grading machine failed to grade (the infrastructure verdict)."""
    return [r for r in results if r.verdict == INFRASTRUCTURE]


# ---------------------------------------------------------------- exporters

def to_gradescope(report: Report) -> dict[str, Any]:
    """Gradescope's results.json: one test per part; skipped parts score 0 and say why. Scores
    are rounded to two decimals (the total from the exact points); the JSON report keeps them exact."""
    tests = []
    for r in report.results:
        tests.append({
            "name": f"{r.lab} / {r.part}: {r.title}",
            "score": display_points(r.points),
            "max_score": display_points(r.max_points),
            "status": "passed" if r.verdict == PASSED else "failed",
            "output": f"[{r.verdict}] {r.message}",
            "visibility": "visible",
        })
    return {
        "score": display_points(report.points),
        "output": gradescope_summary(report),
        "tests": tests,
        "visibility": "visible",
    }


def gradescope_summary(report: Report) -> str:
    """The line above the tests: where it was graded (the GPU and its threshold row, or that there
    was none, with what that means for the GPU parts) and which inputs."""
    name, row = report.gpu.get("name"), report.gpu.get("row")
    if name and row:
        where = f"graded on {name} (performance thresholds of the {row} row)"
    elif name:
        where = f"graded on {name}"
    else:
        skipped = [r for r in report.results if r.verdict == SKIPPED]
        where = "graded without a GPU" + (f": {len(skipped)} GPU part(s) skipped, 0 points" if skipped else "")
    return f"{where}; inputs {report.seed}"


def write_gradescope(report: Report, path: str) -> None:
    write_atomically(path, json.dumps(to_gradescope(report), indent=2) + "\n")


def write_atomically(path: str, text: str) -> None:
    """Write a new file and rename it over ``path``: whoever held the old file (or made it first,
    in a shared folder) cannot touch the new one."""
    import os
    import tempfile
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def nbgrader_score(result: PartResult) -> float:
    """The number a grade cell leaves as its output: nbgrader reads it as partial credit."""
    return float(round(result.points, 4))


def print_progress(msg: str) -> None:
    print(msg, flush=True)

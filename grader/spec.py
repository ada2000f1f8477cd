"""Each lab declares, in one TOML file under ``grader/specs/``, its parts, points, shapes,
tolerances, performance thresholds per GPU row and mechanism checks. This module loads
and validates those files; nothing else in the grader hard-codes a lab's numbers.

Thresholds are versioned: ``grader/specs/thresholds.lock`` records a digest of every
lab's threshold tables with its version, and a test fails when a table changes without
its version and the lock being updated in the same commit (with the measurements that
justify the change named in the table's ``source``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
from typing import Any, Callable

from . import hardware

SPEC_DIR = os.path.join(os.path.dirname(__file__), "specs")
LOCK_FILE = os.path.join(SPEC_DIR, "thresholds.lock")
KINDS = ("function", "build", "kernel", "artifact")


@dataclasses.dataclass(frozen=True)
class Threshold:
    metric: str
    floor: float      # ratio at or below which no performance credit is given
    full: float       # ratio at or above which full credit is given
    status: str       # "calibrated" or "uncalibrated: ..."
    source: str       # the measurement that justifies the numbers


@dataclasses.dataclass(frozen=True)
class Part:
    id: str
    title: str
    kind: str
    points: float
    needs_gpu: bool
    timeout_s: float
    params: dict[str, Any]
    mechanisms: tuple[str, ...]
    thresholds: dict[str, Threshold]   # GPU row name -> threshold (performance parts only)

    def threshold_for(self, device_spec: hardware.GPUSpec) -> tuple[Threshold, str]:
        """The row for this GPU, or its track's row; the second value says which was used."""
        if device_spec.name in self.thresholds:
            return self.thresholds[device_spec.name], f"threshold row {device_spec.name}"
        row = hardware.TRACK_DEFAULT[device_spec.track]
        return self.thresholds[row], f"threshold row {row} (no row for {device_spec.name}; track {device_spec.track})"


@dataclasses.dataclass(frozen=True)
class LabSpec:
    lab: str
    title: str
    notebook: str
    thresholds_version: int
    parts: tuple[Part, ...]
    raw: dict[str, Any]

    def part(self, part_id: str) -> Part:
        for p in self.parts:
            if p.id == part_id:
                return p
        raise KeyError(f"{self.lab} has no part {part_id!r}; parts: {', '.join(p.id for p in self.parts)}")

    @property
    def max_points(self) -> float:
        return sum(p.points for p in self.parts)


def lab_names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(SPEC_DIR) if f.endswith(".toml"))


def _parse_threshold(d: dict[str, Any], where: str) -> Threshold:
    missing = {"metric", "floor", "full", "status", "source"} - d.keys()
    if missing:
        raise ValueError(f"{where}: threshold lacks {sorted(missing)}")
    if not 0 <= d["floor"] < d["full"]:
        raise ValueError(f"{where}: need 0 <= floor < full, got floor={d['floor']} full={d['full']}")
    return Threshold(d["metric"], float(d["floor"]), float(d["full"]), d["status"], d["source"])


def load(lab: str) -> LabSpec:
    path = os.path.join(SPEC_DIR, f"{lab}.toml")
    if not os.path.exists(path):
        raise KeyError(f"no lab {lab!r}; labs: {', '.join(lab_names())}")
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    parts = []
    for p in raw["parts"]:
        where = f"{lab}.{p.get('id', '?')}"
        if p.get("kind") not in KINDS:
            raise ValueError(f"{where}: kind must be one of {KINDS}")
        ths = {row: _parse_threshold(t, f"{where}.thresholds.{row}") for row, t in p.get("thresholds", {}).items()}
        if ths:
            for track, row in hardware.TRACK_DEFAULT.items():
                if row not in ths:
                    raise ValueError(f"{where}: performance part needs a {row} row (default of {track})")
        parts.append(Part(
            id=p["id"], title=p["title"], kind=p["kind"], points=float(p["points"]),
            needs_gpu=bool(p.get("needs_gpu", False)), timeout_s=float(p.get("timeout_s", 120)),
            params=p.get("params", {}), mechanisms=tuple(p.get("mechanisms", ())), thresholds=ths,
        ))
    ids = [p.id for p in parts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{lab}: duplicate part ids")
    return LabSpec(lab=raw["lab"], title=raw["title"], notebook=raw["notebook"],
                   thresholds_version=int(raw["thresholds_version"]), parts=tuple(parts), raw=raw)


def thresholds_digest(spec: LabSpec) -> str:
    table = {p.id: {row: dataclasses.asdict(t) for row, t in sorted(p.thresholds.items())}
             for p in spec.parts if p.thresholds}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:16]


def read_lock() -> dict[str, dict[str, Any]]:
    with open(LOCK_FILE) as f:
        return json.load(f)


def write_lock() -> None:
    """Record the current digests (run after a justified threshold change: python -m grader.spec)."""
    lock = {lab: {"version": load(lab).thresholds_version, "digest": thresholds_digest(load(lab))}
            for lab in lab_names()}
    with open(LOCK_FILE, "w") as f:
        json.dump(lock, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    write_lock()
    print(f"wrote {LOCK_FILE}")


# ---------------------------------------------------------------- what a kernel part names

TRACK_ALIASES = {"hopper": "sm_90a", "blackwell": "sm_100a"}


def by_track(table: dict | None) -> dict:
    """A table keyed by track, with ``hopper``/``blackwell`` accepted for sm_90a/sm_100a."""
    return {TRACK_ALIASES.get(k, k): v for k, v in (table or {}).items()}


def builder_kwargs(params: dict, sm_count: Callable[[], int]) -> dict:
    """Keyword arguments every builder of the part gets besides the shape: ``num_sms = "device"``
    in the params passes the SM count read from the GPU (persistent kernels: one CTA per SM)."""
    return {"num_sms": int(sm_count())} if params.get("num_sms") == "device" else {}

"""Inputs generated per (lab, part, shape, seed).

Every test input comes from a generator seeded by a hash of the lab, the part, the
shape and a seed. The public seed is fixed so that a student sees the same inputs as
the grader's public run; an instructor sets ``GRADER_SECRET_SEED`` so that hidden runs
use inputs (and hidden cases) nobody saw before. The grader reads the secret once and
removes it from the environment before any submission code runs.

The secret may be any string. What the generators see is never that string: it is a 256-bit
keyed hash of it (HMAC-SHA256) under a course key that lives on the grading machine
(:func:`seed_key`), so a short secret (a small number, a word) cannot be found by trying
candidates against a hidden case a student saw: without the key every candidate is as good as
any other.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import random
from typing import Sequence

from .keyfile import seed_key_path  # noqa: F401 - where the key lies (also the jail's concern)

import torch

PUBLIC_SEED = 20260101
_SECRET_ENV = "GRADER_SECRET_SEED"
_SEED_FD_ENV = "GRADER_SEED_FD"
_DERIVED = "derived:"          # a seed handed on already derived (one grading process to another)
_secret: int | None = None
_secret_read = False


def secret_seed() -> int | None:
    """The instructor's secret seed, read once, then removed from the environment. The command
    line passes it on through a pipe (GRADER_SEED_FD) after restarting itself without it, so
    that it is not even in the process's initial environment block (/proc/PID/environ)."""
    global _secret, _secret_read
    if not _secret_read:
        raw = os.environ.pop(_SECRET_ENV, None)
        fd = os.environ.pop(_SEED_FD_ENV, None)
        if fd is not None:
            with os.fdopen(int(fd), "rb") as f:
                raw = f.read().decode() or None
        if raw is not None and raw.startswith(_DERIVED):
            _secret = int(raw[len(_DERIVED):])
        else:
            _secret = parse_secret(raw)
        _secret_read = True
    return _secret


def parse_secret(raw: str | None) -> int | None:
    """The run seed of a secret as the instructor gives it (``GRADER_SECRET_SEED`` or ``check
    --seed``, any string): None when unset or empty (the public seed), else :func:`derive_secret`."""
    return None if raw in (None, "") else derive_secret(raw)


def seed_of(raw: str | None) -> int:
    """The seed a run uses for the secret ``raw``: derived from it, or the public seed."""
    s = parse_secret(raw)
    return PUBLIC_SEED if s is None else s


def seed_key() -> bytes:
    """The course key of the secret seed: 32 random bytes in a file only its owner may read,
    made on first use (``GRADER_SEED_KEY_FILE`` or ``~/.config/modern-gpu-kernels/seed.key``).
    Grading the same class on several machines (Slurm) needs the same key file on each: a shared
    home folder, or the variable pointing at a copy."""
    path = seed_key_path()
    try:
        with open(path, "rb") as f:
            key = f.read()
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        key = os.urandom(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:             # another grader made it meanwhile
            with open(path, "rb") as f:
                return f.read()
        with os.fdopen(fd, "wb") as f:
            f.write(key)
    if len(key) < 16:
        raise ValueError(f"{path} holds fewer than 16 bytes: delete it to make a new course key")
    return key


def derive_secret(raw: str) -> int:
    """The run seed of a secret string: HMAC-SHA256 under the course key, as a 256-bit integer."""
    return int.from_bytes(hmac.new(seed_key(), raw.encode("utf-8"), hashlib.sha256).digest(), "big")


def handover(seed: int) -> bytes:
    """What one grading process writes into the seed pipe of another (the seed, derived)."""
    return (_DERIVED + str(seed)).encode()


def run_seed() -> int:
    """The seed of this grading run: the secret one when set, else the public one."""
    s = secret_seed()
    return PUBLIC_SEED if s is None else s


def derive_seed(*key: object, seed: int) -> int:
    """A 63-bit seed from a key such as (lab, part, shape) and a run seed."""
    text = "|".join(repr(k) for k in key) + f"|{seed}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def generator(lab: str, part: str, shape: Sequence[int], seed: int, device: str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(lab, part, tuple(shape), seed=seed))
    return g


def rng(lab: str, part: str, seed: int) -> random.Random:
    """A Python RNG for generating hidden cases of CPU parts."""
    return random.Random(derive_seed(lab, part, "cases", seed=seed))


def randn(lab: str, part: str, shape: Sequence[int], seed: int, dtype: torch.dtype = torch.float16,
          device: str = "cpu", index: int = 0) -> torch.Tensor:
    """Standard-normal tensor, deterministic in (lab, part, shape, seed, index).

    Drawn in float32 on ``device`` with a generator of that device, then cast: the same numbers
    on every run on the same kind of device and torch version (a GPU's generator and the CPU's
    give different ones). On the GPU because the speed shapes are large: drawing Lab 6's inputs
    at seq 8192 (200 M numbers) on the CPU took about a second each time. Never zeros: zeros
    hide unwritten outputs.
    """
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(lab, part, tuple(shape), index, seed=seed))
    t = torch.randn(tuple(shape), generator=g, dtype=torch.float32, device=device)
    return t.to(dtype)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer filled with NaN, so that every element left unwritten shows up."""
    return torch.full_like(t, float("nan"))


def seed_label(seed: int) -> str:
    """How reports name a seed: "public", or "secret" with a short fingerprint (never the value)."""
    if seed == PUBLIC_SEED:
        return "public"
    return "secret (fingerprint " + hashlib.sha256(f"grader-seed|{seed}".encode()).hexdigest()[:8] + ")"


def restart_without_secret(argv: list[str]) -> None:
    """If the secret seed is in the environment, restart this command without it, handing the
    seed over through a pipe. Returns only when there is nothing to hide."""
    raw = os.environ.get(_SECRET_ENV)
    if raw in (None, ""):
        return
    r, w = os.pipe()
    os.write(w, handover(derive_secret(raw)))
    os.close(w)
    os.set_inheritable(r, True)
    env = {k: v for k, v in os.environ.items() if k != _SECRET_ENV}
    env[_SEED_FD_ENV] = str(r)
    from . import sandbox
    cmd = sandbox.trusted_command("cli", *argv)
    os.execve(cmd[0], cmd, env)

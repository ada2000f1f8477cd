"""Correctness: tolerances derived from dtype and reduction length, and a
comparison that reports NaN/Inf mismatches and the worst and first bad elements."""
from __future__ import annotations

import dataclasses
import math

import torch

# Unit roundoff of each storage dtype (half the distance between 1 and the next number).
_EPS = {
    torch.float16: 2.0 ** -11,
    torch.bfloat16: 2.0 ** -8,
    torch.float32: 2.0 ** -24,
    torch.float64: 2.0 ** -53,
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol={self.rtol:.2e}, atol={self.atol:.2e}"


def tolerance(dtype: torch.dtype, reduction_length: int = 1, acc_dtype: torch.dtype = torch.float32,
              magnitude: float = 1.0) -> Tolerance:
    """Tolerance for a result stored in ``dtype`` after a sum of ``reduction_length`` terms
    accumulated in ``acc_dtype``, compared with a reference computed in float64 from the
    same (already rounded) inputs.

    - Rounding the result to ``dtype`` costs at most half a unit in the last place:
      ``rtol = 4 · eps(dtype)`` leaves a factor of 8 of room.
    - A length-K sum in ``acc_dtype`` of terms of size ~``magnitude`` drifts by at most
      about ``K · eps(acc) · magnitude`` (the classic bound for recursive summation);
      it goes into ``atol`` because a sum of random signs can land near zero.
    """
    if dtype not in _EPS or acc_dtype not in _EPS:
        raise ValueError(f"no tolerance rule for {dtype} accumulated in {acc_dtype}")
    k = max(1, int(reduction_length))
    rtol = 4 * _EPS[dtype]
    atol = magnitude * (4 * _EPS[dtype] + 2 * k * _EPS[acc_dtype])
    return Tolerance(rtol=rtol, atol=atol)


@dataclasses.dataclass
class Comparison:
    ok: bool
    message: str
    max_abs_err: float
    mismatches: int
    total: int


def _fmt_index(flat: int, shape: tuple[int, ...]) -> str:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def mismatches(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bad, nonfinite_bad, err) over the flattened tensors, in float64 on the CPU: ``bad`` marks the
    elements outside the tolerance (NaN/Inf mismatches included), ``nonfinite_bad`` the NaN/Inf
    mismatches, ``err`` the absolute error where both values are finite (0 elsewhere)."""
    return _flags(out.detach().to("cpu", torch.float64).reshape(-1),
                  ref.detach().to("cpu", torch.float64).reshape(-1), tol)


def _flags(o: torch.Tensor, r: torch.Tensor, tol: Tolerance) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mismatches() of two float64 vectors on one device, where they are."""
    finite_o, finite_r = torch.isfinite(o), torch.isfinite(r)
    nonfinite_bad = (finite_o != finite_r) | (~finite_o & ~finite_r & ~((o == r) | (o.isnan() & r.isnan())))
    err = (o - r).abs()
    err = torch.where(finite_o & finite_r, err, torch.zeros_like(err))
    bad = nonfinite_bad | (err > tol.atol + tol.rtol * r.abs())
    return bad, nonfinite_bad, err


FIRST_SHOWN = 3      # how many of the first wrong elements a message lists
CHUNK = 1 << 25      # elements compared at once (float64 work: about 1 GB of device memory)


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str = "output") -> Comparison:
    """Compare ``out`` with ``ref`` elementwise: |out - ref| <= atol + rtol·|ref|.

    NaN or Inf where the reference has a finite value (or the reverse) always counts as a
    mismatch. The message names the number of mismatches, the first few and the worst one, and
    the largest absolute error.

    The arithmetic runs where ``out`` is, in float64, CHUNK elements at a time: on a GPU the
    reference (kept in host memory, out of the kernel's reach) is copied up for it, after the
    kernel has finished, into memory allocated then. The same IEEE operations as on the host
    (one per element and step), so the verdict is the host's, in a fraction of the time for
    outputs of hundreds of millions of elements.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"{name} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}",
                          math.inf, ref.numel(), ref.numel())
    where = out.device
    o_all, r_all = out.detach().reshape(-1), ref.detach().reshape(-1)
    total = r_all.numel()
    n_bad = n_nonfinite = 0
    max_err, finite_bad_max = 0.0, -math.inf
    wrong: list[int] = []                      # the first FIRST_SHOWN wrong positions
    worst, worst_key = -1, -math.inf           # the first position of the largest error (NaN/Inf first)
    for lo in range(0, total, CHUNK):
        hi = min(total, lo + CHUNK)
        o = o_all[lo:hi].to(where, torch.float64)
        r = r_all[lo:hi].to(where, torch.float64)
        bad, nonfinite_bad, err = _flags(o, r, tol)
        max_err = max(max_err, float(err.max()))
        k = int(bad.sum())
        if not k:
            continue
        n_bad += k
        n_nonfinite += int(nonfinite_bad.sum())
        if len(wrong) < FIRST_SHOWN:
            wrong += [lo + int(i) for i in bad.nonzero().reshape(-1)[:FIRST_SHOWN - len(wrong)]]
        key = torch.where(bad, torch.where(nonfinite_bad, torch.full_like(err, math.inf), err),
                          torch.full_like(err, -1.0))
        at = int(key.argmax())
        if float(key[at]) > worst_key:
            worst, worst_key = lo + at, float(key[at])
        finite_bad = bad & ~nonfinite_bad
        if bool(finite_bad.any()):
            finite_bad_max = max(finite_bad_max, float(err[finite_bad].max()))
    if n_bad == 0:
        return Comparison(True, f"{name}: all {total} elements within {tol} (max abs error {max_err:.3g})",
                          max_err, 0, total)
    shape = tuple(ref.shape)

    def value(t: torch.Tensor, i: int) -> float:
        return float(t[i].to(torch.float64))
    first = wrong[0]
    parts = [f"{name}: {n_bad} of {total} elements differ beyond {tol}"]
    if n_nonfinite:
        parts.append(f"{n_nonfinite} are NaN/Inf mismatches")
    parts.append(f"first at {_fmt_index(first, shape)}: got {value(o_all, first):.6g}, "
                 f"expected {value(r_all, first):.6g}")
    if n_bad > 1:
        more = [_fmt_index(i, shape) for i in wrong[1:FIRST_SHOWN]]
        parts.append("then at " + ", ".join(more) + (", ..." if n_bad > FIRST_SHOWN else ""))
    parts.append(f"worst at {_fmt_index(worst, shape)}: got {value(o_all, worst):.6g}, "
                 f"expected {value(r_all, worst):.6g}")
    if finite_bad_max > -math.inf:
        parts.append(f"max abs error {finite_bad_max:.3g}")
    return Comparison(False, "; ".join(parts), max_err if not n_nonfinite else math.inf, n_bad, total)


def close_scalar(got: float, expected: float, rel: float = 1e-6, abs_: float = 0.0) -> bool:
    """Relative comparison of two numbers (answers of CPU parts)."""
    try:
        got = float(got)
    except (TypeError, ValueError):
        return False
    if math.isnan(got) or math.isinf(got):
        return False
    return abs(got - expected) <= abs_ + rel * abs(expected)


def close_arrays(got, exp, rel: float, abs_: float) -> tuple[bool, str]:
    """(ok, why) for a dictionary of arrays (answers of CPU parts in floating point): the same
    keys and shapes, infinities in the same places with the same signs, no NaN, the finite
    values within ``abs_ + rel·|expected|``."""
    import numpy as np
    if not isinstance(got, dict):
        return False, f"returned {type(got).__name__}, not a dictionary"
    if set(got) != set(exp):
        return False, f"keys {sorted(map(str, got))}, expected {sorted(exp)}"
    for key in exp:
        e = np.asarray(exp[key], dtype=np.float64)
        try:
            g = np.asarray(got[key], dtype=np.float64)
        except (TypeError, ValueError):
            return False, f"{key!r} is not an array of numbers"
        if g.shape != e.shape:
            return False, f"{key!r} has shape {g.shape}, expected {e.shape}"
        if np.isnan(g).any():
            at = tuple(int(i) for i in np.argwhere(np.isnan(g))[0])
            return False, f"{key!r} holds NaN (at {at})"
        bad = (np.isinf(g) | np.isinf(e)) & (g != e)
        fin = np.isfinite(e) & np.isfinite(g)
        gf, ef = np.where(fin, g, 0.0), np.where(fin, e, 0.0)
        bad |= fin & (np.abs(gf - ef) > abs_ + rel * np.abs(ef))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            return False, f"{key!r}{list(at)}: got {g[at]!r}, expected {e[at]!r}"
    return True, ""


def normalize(x):
    """A value as the grader compares answers: lists and tuples (nested) become tuples, integral
    floats and integer-like numbers become int, dicts are normalised value by value."""
    if isinstance(x, dict):
        return {k: normalize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return tuple(normalize(v) for v in x)
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if hasattr(x, "__index__"):
        try:
            return int(x.__index__())
        except TypeError:
            return x
    return x


# ---------------------------------------------------------------- answers of CPU questions
#
# One registry of how a CPU question's answers are compared, by name: a lab declares the name
# with its question (grading.Question), the grader compares with it, and the student edition's
# recorded tables carry the name and compare with the same function (grader/edition/tables.py).
# Each takes (got, expected, tol), tol a dict with "rel" and "abs" where the part has them.

def same_answer(got, exp, tol=None) -> bool:
    """Equal after normalize (lists and tuples alike, 2.0 == 2); any iterable stands for a list;
    an odd answer is a wrong answer."""
    if isinstance(exp, (list, tuple)) and not isinstance(got, (list, tuple, dict, str)) and hasattr(got, "__iter__"):
        try:
            got = list(got)
        except Exception:  # noqa: BLE001
            return False
    try:
        return normalize(got) == normalize(exp)
    except Exception:  # noqa: BLE001
        return False


def _sorted_values(x):
    if isinstance(x, dict):
        return {k: sorted(normalize(v)) if isinstance(v, (list, tuple, set)) else v for k, v in x.items()}
    return x


def same_sorted(got, exp, tol=None) -> bool:
    """Equal as same_answer, the lists that are values of a dictionary compared as sets (the
    order of their entries does not matter)."""
    try:
        return same_answer(_sorted_values(got), _sorted_values(exp))
    except Exception:  # noqa: BLE001
        return False


def close(got, exp, tol) -> bool:
    """A number within the part's relative tolerance ``tol["rel"]``."""
    return close_scalar(got, exp, rel=tol["rel"])


def time_bound(got, exp, tol) -> bool:
    """A pair (seconds, bound): the seconds within ``tol["rel"]``, the bound's name exact."""
    try:
        t, bound = got
    except (TypeError, ValueError):
        return False
    return close_scalar(t, exp[0], rel=tol["rel"]) and bound == exp[1]


def same_int(got, exp, tol=None) -> bool:
    """An integer (an integral float passes; 2.5 does not)."""
    try:
        return int(got) == exp and float(got) == float(exp)
    except (TypeError, ValueError):
        return False


def int_rows(got, exp, tol=None) -> bool:
    """A list of rows of integers."""
    try:
        return [[int(x) for x in row] for row in got] == exp
    except (TypeError, ValueError):
        return False


def allclose(got, exp, tol) -> tuple[bool, str]:
    """A dictionary of arrays, close_arrays with ``tol["rel"]`` and ``tol["abs"]``."""
    return close_arrays(got, exp, tol["rel"], tol["abs"])


ANSWERS = {"same": same_answer, "same_sorted": same_sorted, "close": close, "time_bound": time_bound,
           "int": same_int, "int_rows": int_rows, "allclose": allclose}


TOLERANT = ("close", "time_bound", "allclose")     # the comparisons that read tol


def how(kind: str, tol: dict) -> dict:
    """A comparison as a recorded table names it: {"kind": name} and the tolerances it reads."""
    return {"kind": kind, **(tol if kind in TOLERANT else {})}


def part_tolerance(params: dict) -> dict:
    """The tolerances a part's spec gives its answers: ``rel_tol`` and ``abs_tol``."""
    return {k: float(params[p]) for k, p in (("rel", "rel_tol"), ("abs", "abs_tol")) if p in params}


def answer_check(kind: str, tol: dict | None = None):
    """``same(got, expected) -> bool`` for the comparison named ``kind`` (ANSWERS)."""
    if kind not in ANSWERS:
        raise KeyError(f"no comparison named {kind!r}; known: {', '.join(ANSWERS)}")
    fn, tol = ANSWERS[kind], tol or {}

    def same(got, exp) -> bool:
        verdict = fn(got, exp, tol)
        return bool(verdict[0] if isinstance(verdict, tuple) else verdict)
    return same

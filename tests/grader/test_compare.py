import math

import pytest
import torch

from grader import compare


def test_tolerance_grows_with_reduction_length_and_dtype():
    t1 = compare.tolerance(torch.float16, 64)
    t2 = compare.tolerance(torch.float16, 8192)
    assert t2.atol > t1.atol and t2.rtol == t1.rtol
    assert compare.tolerance(torch.bfloat16).rtol > compare.tolerance(torch.float16).rtol
    assert compare.tolerance(torch.float32).rtol < 1e-6


def test_tolerance_rejects_unknown_dtype():
    with pytest.raises(ValueError):
        compare.tolerance(torch.int8)


def test_fp16_gemm_error_is_within_tolerance_and_a_real_bug_is_not():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 1024, generator=g).half()
    b = torch.randn(64, 1024, generator=g).half()
    ref = a.double() @ b.double().T
    out = (a.float() @ b.float().T).half()
    tol = compare.tolerance(torch.float16, 1024, magnitude=math.sqrt(1024))
    assert compare.compare(out, ref, tol).ok
    wrong = out.clone()
    wrong[3, 5] += 1.0
    res = compare.compare(wrong, ref, tol)
    assert not res.ok and res.mismatches == 1 and "[3, 5]" in res.message


def test_nan_and_inf_mismatches_are_reported():
    ref = torch.ones(4, 4)
    out = ref.clone()
    out[1, 2] = float("nan")
    out[2, 3] = float("inf")
    res = compare.compare(out, ref, compare.tolerance(torch.float32))
    assert not res.ok and res.mismatches == 2
    assert "NaN/Inf" in res.message and "first at [1, 2]" in res.message


def test_matching_nans_are_not_mismatches():
    ref = torch.tensor([1.0, float("nan")])
    assert compare.compare(ref.clone(), ref, compare.tolerance(torch.float32)).ok


def test_worst_and_first_are_distinguished():
    ref = torch.zeros(10)
    out = ref.clone()
    out[2], out[7] = 0.1, 5.0
    msg = compare.compare(out, ref, compare.tolerance(torch.float32)).message
    assert "first at [2]" in msg and "worst at [7]" in msg


def test_shape_mismatch():
    res = compare.compare(torch.zeros(3), torch.zeros(4), compare.tolerance(torch.float32))
    assert not res.ok and "shape" in res.message


def test_close_scalar():
    assert compare.close_scalar(1.0 + 1e-9, 1.0, rel=1e-6)
    assert not compare.close_scalar(1.1, 1.0, rel=1e-6)
    assert not compare.close_scalar(float("nan"), 1.0)
    assert not compare.close_scalar("x", 1.0)

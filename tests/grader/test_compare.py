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


def test_a_comparison_in_chunks_says_what_one_pass_says(monkeypatch):
    """compare() works CHUNK elements at a time (on the output's device): the count, the first
    wrong elements, the worst one (NaN/Inf first, then the first of equal errors) and the errors
    are those of one pass over the whole tensor."""
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(40, 25, generator=g, dtype=torch.float64)
    out = ref.to(torch.float16)
    out[3, 4] += 1.0
    out[17, 0] += 4.0
    out[17, 1] -= 4.0                        # the same error as [17, 0]: the first is the worst
    out[30, 20] = float("inf")
    out[39, 24] = float("nan")
    tol = compare.tolerance(torch.float16)
    one = compare.compare(out, ref, tol, name="D")
    for chunk in (7, 64, 333):
        monkeypatch.setattr(compare, "CHUNK", chunk)
        again = compare.compare(out, ref, tol, name="D")
        assert again == one, (chunk, again.message, one.message)
    assert not one.ok and one.mismatches == 5 and "2 are NaN/Inf mismatches" in one.message
    assert "first at [3, 4]" in one.message and "worst at [30, 20]" in one.message
    out[30, 20], out[39, 24] = ref[30, 20], ref[39, 24]
    monkeypatch.setattr(compare, "CHUNK", 7)
    assert "worst at [17, 0]" in compare.compare(out, ref, tol, name="D").message


@pytest.mark.gpu
def test_on_the_gpu_a_comparison_says_what_the_host_says():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(3000, 1000, generator=g, dtype=torch.float64)
    out = ref.to(torch.float16)
    out[5, 7], out[2999, 999], out[1500, 0] = 3.0, float("nan"), float("-inf")
    tol = compare.tolerance(torch.float16, 64)
    host = compare.compare(out, ref, tol, name="O")
    gpu = compare.compare(out.cuda(), ref, tol, name="O")
    assert gpu == host and not host.ok
    assert compare.compare(ref.to(torch.float16).cuda(), ref, tol) == compare.compare(ref.to(torch.float16), ref, tol)

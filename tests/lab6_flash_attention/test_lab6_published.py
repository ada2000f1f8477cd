"""Lab 6's Blackwell build parts judged by the FlashAttention-4 kernel of mlc-ai/tirx-kernels at
the commit the book pins (tests/published_kernels/tirx_fa4.py). The book gives no complete
attention kernel of its own: its Flash Attention chapter quotes this file, at this commit, and
tells the reader to run it, so it is the book's FA4 as well. It passes every Blackwell build part
(steps 2 to 5) at the spec's causal GQA shape; without its setmaxnreg it fails the steps that
require it, with the message that says so."""
import functools

import pytest
from conftest import grade_with_builders
from published_kernels import tirx_fa4

from grader import report, spec

LAB = "lab6_flash_attention"
BUILD_PARTS = [p.id for p in spec.load(LAB).parts if p.kind == "build" and p.id.endswith("_sm100")]


def grade(part_id, builder):
    name = spec.load(LAB).part(part_id).params["builder"]
    return grade_with_builders(LAB, part_id, {name: builder})


@pytest.mark.slow
def test_fa4_passes_every_blackwell_build_part():
    assert BUILD_PARTS == ["s2_build_sm100", "s3_build_sm100", "s4_build_sm100", "s5_build_sm100"]
    for part_id in BUILD_PARTS:
        r = grade(part_id, tirx_fa4.fa4)
        assert r.verdict == report.PASSED, (part_id, r.message)
    assert "P from tensor memory" in spec.load(LAB).part("s2_build_sm100").title


@pytest.mark.slow
def test_fa4_without_setmaxnreg_fails_the_steps_that_teach_it():
    broken = functools.partial(tirx_fa4.fa4, variant="no_setmaxnreg")
    assert grade("s2_build_sm100", broken).verdict == report.PASSED      # step 2 does not ask for it
    r = grade("s3_build_sm100", broken)
    assert r.verdict == report.FAILED and r.points == 0, r.message
    assert "registers raised for a warpgroup (setmaxnreg.inc: USETMAXREG.TRY_ALLOC): MISSING" in r.message
    assert "registers given back by a warpgroup (setmaxnreg.dec: USETMAXREG.DEALLOC): MISSING" in r.message
    assert r.message.count("MISSING") == 2, r.message

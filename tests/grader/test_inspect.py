"""The SASS patterns of the pipeline mechanisms (Lab 5), on lines as cuobjdump prints them."""
import pytest

from grader import inspect

SASS = {
    "setmaxnreg_inc": ("        /*0120*/                   USETMAXREG.TRY_ALLOC.CTAPOOL 0xe8 ;", "USETMAXREG.DEALLOC.CTAPOOL 0x28 ;"),
    "setmaxnreg_dec": ("        /*0090*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;", "USETMAXREG.TRY_ALLOC.CTAPOOL 0xe8 ;"),
    "cluster_barrier": ("        /*0300*/                   UCGABAR_ARV ;", "BAR.SYNC.DEFER_BLOCKING 0x0 ;"),
    "tma_multicast": ("        /*0a10*/                   UTMALDG.2D.MULTICAST [UR8], [UR4], UR10 ;", "UTMALDG.2D [UR8], [UR4] ;"),
    "tcgen05_mma_2cta": ("        /*1b20*/                   UTCHMMA.2CTA gdesc[UR12], gdesc[UR14], tmem[UR7], tmem[UR20], idesc[UR21], UPT ;",
                         "UTCHMMA gdesc[UR12], gdesc[UR14], tmem[UR7], tmem[UR20], idesc[UR21], UPT ;"),
}


@pytest.mark.parametrize("name", sorted(SASS))
def test_pattern_finds_the_instruction_and_not_its_neighbour(name):
    yes, no = SASS[name]
    assert inspect.check(name, {"sass": yes}).ok
    assert not inspect.check(name, {"sass": no}).ok
    assert not inspect.check(name, {"ptx": yes}).ok          # only the SASS counts

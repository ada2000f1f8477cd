"""The SASS patterns of the pipeline (Lab 5) and attention (Lab 6) mechanisms, on lines as cuobjdump
prints them."""
import pytest

from grader import inspect

SASS = {
    "setmaxnreg_inc": ("        /*0120*/                   USETMAXREG.TRY_ALLOC.CTAPOOL 0xe8 ;", "USETMAXREG.DEALLOC.CTAPOOL 0x28 ;"),
    "setmaxnreg_dec": ("        /*0090*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;", "USETMAXREG.TRY_ALLOC.CTAPOOL 0xe8 ;"),
    "cluster_barrier": ("        /*0300*/                   UCGABAR_ARV ;", "BAR.SYNC.DEFER_BLOCKING 0x0 ;"),
    "tma_multicast": ("        /*0a10*/                   UTMALDG.2D.MULTICAST [UR8], [UR4], UR10 ;", "UTMALDG.2D [UR8], [UR4] ;"),
    "tcgen05_mma_2cta": ("        /*1b20*/                   UTCHMMA.2CTA gdesc[UR12], gdesc[UR14], tmem[UR7], tmem[UR20], idesc[UR21], UPT ;",
                         "UTCHMMA gdesc[UR12], gdesc[UR14], tmem[UR7], tmem[UR20], idesc[UR21], UPT ;"),
    # Lab 6: attention
    "wgmma_ss": ("        /*0f70*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24 ;",
                 "HGMMA.64x128x16.F32 R88, R152, gdesc[UR12].tnspB, R88 ;"),
    "wgmma_rs": ("        /*1010*/                   HGMMA.64x128x16.F32 R88, R152, gdesc[UR12].tnspB, R88, gsb0 ;",
                 "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0 ;"),
    "named_barrier_arrive": ("        /*10d0*/              @!P1 BAR.ARV R11, 0x100 ;", "BAR.SYNC.DEFER_BLOCKING R11, 0x100 ;"),
    "exp2_mufu": ("        /*0c40*/                   MUFU.EX2 R40, R40 ;", "MUFU.RCP R40, R40 ;"),
    "tcgen05_mma_tmem_a": ("        /*2a10*/                   UTCHMMA tmem[UR10], gdesc[UR12], tmem[UR7], tmem[UR20], idesc[UR21], UPT ;",
                           "UTCHMMA gdesc[UR12], gdesc[UR14], tmem[UR7], tmem[UR20], idesc[UR21], UPT ;"),
    "tmem_load": ("        /*0d00*/                   LDTM.x32 R4, tmem[UR6] ;", "STTM.x16 tmem[UR6], R4 ;"),
    "tmem_store": ("        /*0e00*/                   STTM.x16 tmem[UR6+0x40], R4 ;", "LDTM.x16 R4, tmem[UR6] ;"),
}


@pytest.mark.parametrize("name", sorted(SASS))
def test_pattern_finds_the_instruction_and_not_its_neighbour(name):
    yes, no = SASS[name]
    assert inspect.check(name, {"sass": yes}).ok
    assert not inspect.check(name, {"sass": no}).ok
    assert not inspect.check(name, {"ptx": yes}).ok          # only the SASS counts

"""The SASS patterns of the pipeline (Lab 5) and attention (Lab 6) mechanisms, on lines as cuobjdump
prints them."""
import json

import pytest

from grader import inspect, ptxflow

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


# ---------------------------------------------------------------- expect_tx: the PTX instruction, or SASS with its operands

# cuobjdump's lines for one PTX instruction each (ptxas 13, sm_100a; the same on sm_90a)
ARRIVE_TX = "        /*0b20*/              @!P0 SYNCS.ARRIVE.TRANS64 RZ, [UR4+0x8], R6 ;"
REMOTE_ARRIVE_TX = "        /*04f0*/                   SYNCS.ARRIVE.TRANS64.RED RZ, [R9+URZ], R14 ;"
EXPECT_TX_ONLY = "        /*0300*/                   SYNCS.ARRIVE.TRANS64.RED.A0TR RZ, [UR4], R0 ;"
PLAIN_ARRIVE = "        /*06b0*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R4+URZ], RZ ;"
REMOTE_PLAIN_ARRIVE = "        /*2290*/                   SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR6], RZ ;"
PTX_LOCAL = "\tmbarrier.arrive.expect_tx.shared.b64 _, [%r590], %r591;\n"
PTX_REMOTE = "@p mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64  _, [remAddr32], %r3;\n"
PTX_PLAIN_REMOTE = "@p mbarrier.arrive.shared::cluster.b64  _, [remAddr32];\n"


@pytest.mark.parametrize("ptx", [PTX_LOCAL, PTX_REMOTE, "\tmbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%r1], %r2;\n"],
                         ids=["local", "remote", "expect_tx_alone"])
def test_expect_tx_counts_the_ptx_instruction(ptx):
    r = inspect.check("mbarrier_expect_tx", {"ptx": ptx, "sass": REMOTE_ARRIVE_TX})
    assert r.ok and r.count == 1, r.message


def test_a_remote_arrive_without_bytes_is_not_expect_tx_even_beside_ptxas_own_red_arrive():
    """The book's 2-CTA kernels arm the leader's barrier through a remote view: SASS .RED with a
    register, the same form ptxas emits for a 2-CTA TMEM allocation. Without the PTX instruction
    neither counts."""
    r = inspect.check("mbarrier_expect_tx", {"ptx": PTX_PLAIN_REMOTE, "sass": REMOTE_ARRIVE_TX + "\n" + REMOTE_PLAIN_ARRIVE})
    assert not r.ok and "MISSING" in r.message and "ptxas's own" in r.message, r.message
    assert "without a byte count" in r.message


def test_expect_tx_in_a_ptx_comment_does_not_count():
    r = inspect.check("mbarrier_expect_tx", {"ptx": "// " + PTX_LOCAL + "/* " + PTX_REMOTE + " */\n", "sass": ARRIVE_TX})
    assert not r.ok, r.message


def test_expect_tx_compiled_away_fails():
    r = inspect.check("mbarrier_expect_tx", {"ptx": PTX_LOCAL, "sass": PLAIN_ARRIVE})
    assert not r.ok and "compiled away" in r.message, r.message


@pytest.mark.parametrize("sass, ok", [(ARRIVE_TX, True), (EXPECT_TX_ONLY, True), (REMOTE_ARRIVE_TX, False),
                                      (PLAIN_ARRIVE, False), (REMOTE_PLAIN_ARRIVE, False)],
                         ids=["arrive_tx", "expect_tx_alone", "red_ambiguous", "plain", "remote_plain"])
def test_expect_tx_from_sass_alone_takes_only_unambiguous_forms(sass, ok):
    r = inspect.check("mbarrier_expect_tx", {"sass": sass})
    assert r.ok == ok, r.message
    if sass is REMOTE_ARRIVE_TX:
        assert "cannot be told apart without the PTX" in r.message


# ---------------------------------------------------------------- the ring's barriers, the descriptors' swizzle

def ring_ptx(loads: str, extra: str = "") -> str:
    """A kernel with three mbarriers at pool+8, pool+16 (a ring's two "full" barriers) and
    pool+24 (the MMA's), and TMA loads of two tensors completing on ``loads`` (a register per
    tensor, or one for both)."""
    a, b = (loads.split(",") + [loads])[:2]
    return f"""
.visible .entry k(.param .align 64 .b8 k_param_0[128], .param .align 64 .b8 k_param_1[128])
{{
\tmov.b64 %rd1, k_param_0;
\tmov.b64 %rd2, k_param_1;
\tmov.b32 %r1, pool;
\tadd.s32 %r2, %r1, 8;
\tmbarrier.init.shared.b64 [%r2], 1;
\tadd.s32 %r3, %r1, 16;
\tmbarrier.init.shared.b64 [%r3], 1;
\tadd.s32 %r4, %r1, 24;
\tmbarrier.init.shared.b64 [%r4], 1;
\tmov.u32 %r9, %ctaid.x;
\tand.b32 %r7, %r9, 1;
\tshl.b32 %r8, %r7, 3;
\tadd.s32 %r11, %r2, %r8;
{extra}
\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r20], [%rd1, {{%r5, %r6}}], [{a}];
\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r21], [%rd2, {{%r5, %r6}}], [{b}];
\tmbarrier.arrive.expect_tx.shared.b64 _, [{a}], 32768;
}}
"""


@pytest.mark.parametrize("loads, stages", [
    ("%r2", 1),              # single-buffered: every load on one barrier
    ("%r3", 1),
    ("pool+16", 1),
    ("%r2,%r3", 2),          # A on one barrier, B on another: two (the static count's known limit)
    ("%r11", 3),             # bar[stage] indexed at run time: the initialised barriers it can reach
])
def test_ring_stages_are_the_barriers_tma_loads_complete_on(loads, stages):
    r = ptxflow.ring_stages(ring_ptx(loads))
    assert (r.stages, r.barriers) == (stages, 3), r
    assert inspect.check("mbarrier_ring", {"ptx": ring_ptx(loads)}).ok == (stages >= 2)


def test_a_barrier_indexed_at_run_time_counts_every_barrier_it_can_reach_and_says_so():
    """bar[stage] with a run-time stage: the count is an upper bound (every initialised barrier the
    index can reach), and the message says so, where loads on constant addresses are counted exactly."""
    ptx = ring_ptx("%r11")
    r = ptxflow.ring_stages(ptx)
    assert (r.stages, r.names, r.indexed) == (3, ["pool+8", "pool+16", "pool+24"], ["pool+8k"]), r
    msg = inspect.check("mbarrier_ring", {"ptx": ptx}).message
    assert "up to 3 stage(s)" in msg and "indexed at run time (pool+8k)" in msg, msg
    exact = inspect.check("mbarrier_ring", {"ptx": ring_ptx("%r2,%r3")}).message
    assert "run time" not in exact and "found (2 stage(s)" in exact, exact


def test_a_two_stage_ring_with_one_mma_barrier_passes_and_one_buffer_fails():
    """The book's step 5: a full barrier per stage, one barrier for the MMA, no empty barrier."""
    two = ring_ptx("%r2").replace(
        "\tmbarrier.arrive.expect_tx.shared.b64 _, [%r2], 32768;",
        "\tmbarrier.arrive.expect_tx.shared.b64 _, [%r2], 32768;\n"
        "\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r22], [%rd1, {%r5, %r6}], [%r3];")
    r = inspect.check("mbarrier_ring", {"ptx": two})
    assert r.ok and r.count == 2 and "TMA loads complete on 2 mbarrier(s) (pool+8, pool+16)" in r.message, r.message
    r = inspect.check("mbarrier_ring", {"ptx": ring_ptx("%r2")})
    assert not r.ok and "MISSING (1 stage(s)" in r.message and "at least 2 stages needed" in r.message, r.message
    # warp-specialized: two stages, but 3 barriers where full/empty per stage and the accumulator's need 6
    r = inspect.check("mbarrier_ring_ws", {"ptx": two})
    assert not r.ok and "3 mbarriers initialised" in r.message and "at least 6 mbarriers needed" in r.message


def test_ring_reads_instructions_not_comments():
    fake = "\t// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r22], [%rd1, {%r5, %r6}], [%r3];\n"
    assert ptxflow.ring_stages(ring_ptx("%r2", extra=fake)).stages == 1
    inits = "".join(f"\tmbarrier.init.shared.b64 [%r{i}], %r9;\n" for i in range(8))
    assert not inspect.check("mbarrier_ring", {"ptx": inits}).ok       # barriers alone are no ring


# ---------------------------------------------------------------- the launched code only

MODULE = """
.extern .func (.param .b32 func_retval0) vprintf (.param .b64 a, .param .b64 b);
.func (.param .b32 func_retval0) helper(.param .b32 helper_param_0)
{
\tmbarrier.init.shared.b64 [%r1], 1;
\tret;
}
.func unused()
{
\tmbarrier.init.shared.b64 [%r2], 1;
\tret;
}
.visible .entry launched(.param .u64 launched_param_0)
{
\t{ // callseq 0, 0
\tcall.uni (retval0), helper, ( param0 );
\t}
$L__BB0_1:
\t@%p1 bra $L__BB0_1;
\tret; // mbarrier.init.shared.b64 [%r9], 1;
}
.visible .entry decoy(.param .u64 decoy_param_0)
{
\tcall.uni unused, ();
\tmbarrier.init.shared.b64 [%r3], 1;
}
"""

SASS_MODULE = """
\tcode for sm_90a
\t\tFunction : decoy
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0010*/                   EXIT ;
\t\t..........
\t\tFunction : launched
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0010*/                   EXIT ;
\t\t..........
"""


def test_only_the_launched_entries_and_what_they_call_are_read():
    import types
    art = types.SimpleNamespace(plan={"launches": [{"name": "launched"}]}, ptx=MODULE, sass=SASS_MODULE,
                                cuda_source="")
    assert inspect.launched_functions(art.plan, MODULE, SASS_MODULE) == ["launched", "helper"]
    texts = inspect.launched_texts(art)
    assert texts["ptx"].splitlines() == [".entry launched;", "call.uni (retval0), helper, ( param0 );",
                                         "@%p1 bra $L__BB0_1;", "ret;",
                                         ".func helper;", "mbarrier.init.shared.b64 [%r1], 1;", "ret;"]
    assert "Function : launched" in texts["sass"] and "LDG.E.128" not in texts["sass"]
    assert not inspect.check("vector_load_128", texts).ok
    assert inspect.check("vector_load_128", {"sass": SASS_MODULE}).ok        # the decoy, were it read
    # without a plan: every entry
    assert sorted(inspect.launched_functions(None, MODULE)) == ["decoy", "helper", "launched", "unused"]


def test_ptx_instructions_drop_comments_strings_labels_and_directives():
    text = '.reg .b32 %r<4>;\nL1: add.s32 %r1, %r2, 3; // xor.b32 %r1\n{ .reg .pred p; mov.b32 %r3, 1; }\n.pragma "xor.b32";\n'
    assert ptxflow.ptx_instructions(text) == ["add.s32 %r1, %r2, 3;", "mov.b32 %r3, 1;"]


DESCRIPTOR_SOURCE = """
__forceinline__ __device__ void tvm_builtin_ptx_tcgen05_encode_matrix_descriptor(uint64_t* desc, void* addr, int ldo, int sdo, int swizzle) {{
}}
extern "C" __global__ void kernel() {{
  tvm_builtin_ptx_tcgen05_encode_matrix_descriptor((&(descA_ptr[0])), (&(((half*)pool_buf_ptr)[512])), 0, 64, {a});
  tvm_builtin_ptx_tcgen05_encode_matrix_descriptor((&(descB_ptr[0])), (&(((half*)pool_buf_ptr)[(1 + 2)])), 0, 64, {b});
  // tvm_builtin_ptx_tcgen05_encode_matrix_descriptor(p, q, 0, 64, 3);
}}
"""


@pytest.mark.parametrize("a, b, ok", [(3, 3, True), (3, 2, True), (0, 3, False), (0, 0, False), ("n", 3, False)])
def test_every_descriptor_must_be_swizzled(a, b, ok):
    r = inspect.check("mma_smem_swizzled", {"cuda": DESCRIPTOR_SOURCE.format(a=a, b=b)})
    assert r.ok == ok, r.message
    assert inspect.descriptor_swizzles(DESCRIPTOR_SOURCE.format(a=a, b=b)) == [a if a != "n" else None, b]
    if a == 0:
        assert "SWIZZLE_NONE" in r.message and "SWIZZLE_128B_ATOM" in r.message
    assert not inspect.check("mma_smem_swizzled", {"cuda": "int main() {}"}).ok


WGMMA_PTX = """
.visible .entry k(.param .u64 p)
{
    wgmma.fence.sync.aligned;
    wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 1;
    ret;
}
"""
WGMMA_SASS = """
\t\tFunction : k
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   HGMMA.64x128x16.F32 R88, gdesc[UR4].tnspB, RZ, !UPT ;
        /*0010*/                   EXIT ;
\t\t..........
"""


def test_a_listing_is_held_against_the_ptx_it_was_assembled_from():
    plan = {"launches": [{"name": "k"}]}
    assert inspect.sass_gap(plan, WGMMA_PTX, WGMMA_SASS) is None
    assert inspect.sass_gap(plan, WGMMA_PTX, "") == "the listing is empty"
    header_only = WGMMA_SASS.split("\t.headerflags")[0].replace("Function : k", "")
    assert "no section for the launched entry k" in inspect.sass_gap(plan, WGMMA_PTX, header_only + "\ncode for sm_90a\n")
    cut = WGMMA_SASS.split("        /*0000*/")[0]           # the section's head, its instructions lost
    assert inspect.sass_gap(plan, WGMMA_PTX, cut) == "the launched PTX has wgmma.mma_async, the launched SASS no HGMMA"
    # a kernel without tensor-core MMAs needs none in its listing
    assert inspect.sass_gap(plan, WGMMA_PTX.replace("wgmma.mma_async", "mov.u32"), cut) is None


def test_a_listing_with_a_gap_is_made_again_and_a_gap_every_attempt_shows_is_the_kernels():
    from grader import build
    art = build.Artifacts("sm_90a", "", WGMMA_PTX, cubin=b"first", plan={"launches": [{"name": "k"}]})
    cut = WGMMA_SASS.split("        /*0000*/")[0]
    listings, assembled = [cut, WGMMA_SASS], []

    def reassemble():
        assembled.append(1)
        return b"second", "log"
    assert build.checked_sass(art, lambda cubin: listings.pop(0), reassemble) == WGMMA_SASS
    assert assembled == [1] and art.cubin == b"second"
    # the same gap every time: graded as it is, after SASS_ATTEMPTS listings
    calls = []
    assert build.checked_sass(art, lambda cubin: calls.append(cubin) or cut, lambda: (b"again", "")) == cut
    assert len(calls) == build.SASS_ATTEMPTS


# ---------------------------------------------------------------- wgmma descriptor fields

def _encodes(*fields):
    calls = "".join(f"  ptx_wgmma_encode_matrix_descriptor((&(desc[0])), (&(smem[{i * 64}])), {a}, {b}, {c});\n"
                    for i, (a, b, c) in enumerate(fields))
    return ("__device__ __forceinline__ void ptx_wgmma_encode_matrix_descriptor(uint64_t* d, void* p, int lbo, "
            "int sbo, int swizzle) {}\n__global__ void k() {\n" + calls + "  // ptx_wgmma_encode_matrix_descriptor"
            "(d, p, 9, 9, 9);\n}\n")


TILES = [("A (K-major)", (None, 64, 3)), ("B (N-major)", (512, 64, 3))]


def test_descriptor_fields_are_read_from_the_calls_not_the_helper_or_comments():
    assert inspect.wgmma_descriptor_fields(_encodes((1, 64, 3), (512, 64, 3))) == [(1, 64, 3), (512, 64, 3)]
    assert inspect.wgmma_descriptor_fields(_encodes((1, 64, 3), ("lbo", 64, 3))) == [(1, 64, 3), None]


@pytest.mark.parametrize("fields, ok, said", [
    (((1, 64, 3), (512, 64, 3)), True, "ok (each of A (K-major), B (N-major)"),
    (((7, 64, 3), (512, 64, 3)), True, "ok"),                           # a K-major swizzled LBO is not read
    (((1, 64, 3), (256, 64, 3)), False, "no descriptor has the fields of B (N-major)"),  # half B's LBO (fits A's)
    (((1, 64, 2), (512, 64, 3)), False, "(1, 64, 2) describes none of this step's operand tiles"),
    (((1, 64, 3), (1, 64, 3)), False, "no descriptor has the fields of B (N-major)"),   # B read as K-major
    (((1, 1024, 3), (512, 1024, 3)), False, "no descriptor has the fields of A (K-major), B (N-major)"),  # bytes
])
def test_descriptor_fields_against_the_steps_tiles(fields, ok, said):
    """The course grader's tiles and the student edition's sealed ones give the same verdicts."""
    from grader.edition import tables
    sealed = [(e["name"], tables.SealedTile(e["name"], e["wild"], tables.decode(e["seal"])))
              for e in json.loads(json.dumps(tables.seal_tiles("s1_build_sm90", TILES)))]
    assert "512" not in json.dumps(tables.seal_tiles("s1_build_sm90", TILES))
    for tiles in (TILES, sealed):
        r = inspect.check("wgmma_desc_fields", {"cuda": _encodes(*fields), "desc_fields": tiles})
        assert r.ok == ok and said in r.message, r.message
        if (512, 64, 3) not in fields:
            assert "(512, 64, 3)" not in r.message, r.message                    # the expected fields: never said


def test_descriptor_fields_without_the_tiles_are_left_to_the_course_grader():
    """The student edition holds no lab module, so no tiles: the check says who checks it."""
    r = inspect.check("wgmma_desc_fields", {"cuda": _encodes((1, 64, 3))})
    assert r.ok and "checked by the course grader" in r.message
    r = inspect.check("wgmma_desc_fields", {"cuda": _encodes((1, 64, 3), ("lbo", 64, 3)), "desc_fields": TILES})
    assert r.ok and "not checked" in r.message

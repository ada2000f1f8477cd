"""Lab 6, steps 2 to 5: the lecture teaches the TIRx of the attention kernels on neighbouring
problems (a packed load of a head-major Q, the conditional reference of a row shared by two
lanes, a relay of three warpgroups on named barriers, a bias written into tensor memory), says
per graded step what the student works out, and the notebook states the contract of the graded
builders without spelling out their schedule."""
import re

import pytest
import transfer_text
from test_thin_spots import PRELUDE, _compile, lecture_kernels

from grader.edition import release

LAB = "lab6_flash_attention"
STEPS = {2: ("hopper_attn_step2", "blackwell_attn_step2"), 3: ("hopper_attn_step3", "blackwell_attn_step3"),
         4: ("hopper_attn_step4", "blackwell_attn_step4"), 5: ("hopper_attn_step5", "blackwell_attn_step5")}


def _solution_lines():
    """The statement lines of the graded reference kernels, without comments and spaces, less the
    calls with constant arguments only (`T.ptx.tcgen05.wait.st()`), which name the API."""
    return transfer_text.solution_lines(
        LAB, lambda ln: len(transfer_text.squash(ln)) > 30 and not release.trivial(ln))


def test_no_lecture_code_block_is_a_graded_kernel_with_new_names():
    """The old fragments (the packed Q load of the graded [B, S, H, D] layout, the softmax
    thread's threshold-8 update, P into TMEM before the PV MMA, the two-consumer ping-pong) are
    gone, no block defines a graded builder, and no code line of the lecture is one of the
    reference solution's."""
    blocks = transfer_text.code_blocks(transfer_text.lecture(LAB))
    text = "\n".join(blocks)
    for builders in STEPS.values():
        for name in builders:
            assert f"def {name}(" not in text, name
    assert "def _fa4(" not in text
    squashed = {transfer_text.squash(ln) for b in blocks for ln in b.splitlines()}
    assert not _solution_lines() & squashed, sorted(_solution_lines() & squashed)
    for giveaway in ("Qsmem.view(POS, GROUP, HEAD_DIM)", "tile * POS:(tile + 1) * POS, hkv * GROUP",
                     "if gap < -8.0:", "scale[0] = T.ptx.exp2(gap)", "p_ready.arrive(0)",
                     "Tx.wg.copy_async(p_tmem", "T.ptx.bar.arrive(TURN + 1 - wg, 256)",
                     "(wg == 0) | (step < 3)", "T.ptx.bar.arrive(TURN + 0, 256)"):
        assert giveaway not in text, giveaway


def test_the_lecture_shows_the_variants_and_keeps_the_calls():
    lecture = transfer_text.lecture(LAB)
    blocks = transfer_text.code_blocks(lecture)
    load = next(b for b in blocks if b.startswith("# Head-major Q"))
    assert "Qtile.view(GRP, SPAN, HEAD_DIM)" in load and "Qh[b, hkv * GRP:(hkv + 1) * GRP, tile * SPAN" in load
    assert "T.ptx.mbarrier.arrive.expect_tx(" in load
    kernels = {name: src for lab, name, arch, src in lecture_kernels() if lab == LAB}
    assert set(kernels) == {"turns", "lse_pairs", "chained_tile"}
    chained = kernels["chained_tile"]         # TMEM's fp16 view and an A from TMEM, on another problem
    assert "T.max(h[e], T.float32(0))" in chained and "transB=True" in chained and "H16_COL" in chained
    assert 'T.cuda.warp_reduce(hi[0], "max", 2)' in kernels["lse_pairs"] and "JUMP = 4.0" in kernels["lse_pairs"]
    assert "T.warpgroup_id([3])" in kernels["turns"] and "RELAY + (g + 1) % 3" in kernels["turns"]
    bias = next(b for b in blocks if "bias_in.arrive(0)" in b)
    for call in ("Tx.wg.copy_async(acc_tmem", "T.ptx.tcgen05.wait.st()", "T.ptx.tcgen05.fence.before_thread_sync()",
                 "T.ptx.tcgen05.fence.after_thread_sync()", "Tx.gemm_async("):
        assert call in bias, call


# What the subsection asks: questions that name a decision of the graded steps 2 to 5.
QUESTIONS = ("Who owns a row?", "how many rows does a thread hold", "In which units are the scores?",
             "which scale is applied before `exp2`", "What does the rescale touch besides the sum",
             "what are the LSE and O of a row that saw no key?", "which phase does each barrier wait use",
             "How many arrivals empty a stage on each track", "Which register split do the roles take",
             "Who opens the first turn", "how many stages of the ring does a turn keep busy",
             "Which threshold does FA4's conditional reference use", "How many heads does a tile pack",
             "what is the grid when a group is not a power of two?", "In which order is the work done")
# The answers the subsection used to give.
ANSWERS = ("two rows per thread", "thread $r$ holds all of row $r$", "needs no shuffle at all",
           "\\log_2 e / \\sqrt{128}", "only after the previous PV MMA has finished",
           "two consumers on Hopper; the MMA warp's `tcgen05.commit` on Blackwell", "The threshold 8 of FA4",
           "(not `lse_pairs`'s 4)", "online_softmax(conditional=True)", "at most 64 so that",
           "after the products are issued, before they are waited for", "the heaviest causal tiles first",
           "the masked blocks of a tile first", "storing O = 0 and LSE = $-\\infty$",
           "shared memory and a pair of barriers")


def check_the_lecture_says_what_each_step_leaves_to_the_student(lecture):
    asks = lecture[lecture.index("## What the lab asks"):lecture.index("## Self-check")]
    assert "### What you work out yourself" in asks
    section = asks[asks.index("### What you work out yourself"):]
    for step, builders in STEPS.items():
        assert f"**Step {step}**" in section, step
        for b in builders:
            assert b in section, b
    flat = transfer_text.flat(section)
    for name in ("lse_pairs", "acc_row", "ring_sumsq", "PINGPONG_STAGES", "turns", "K_SPLIT", "exp2_fma",
                 "head-major", "packed_row", "T.floordiv", "gqa_pack"):
        assert name in flat, name
    for question in QUESTIONS:
        assert question in flat, question
    bullets = transfer_text.bullets(section)
    assert len(bullets) >= 15 and all("?" in b for b in bullets), [b for b in bullets if "?" not in b]
    for answer in ANSWERS:
        assert answer not in flat, answer


def test_the_lecture_says_what_each_step_leaves_to_the_student():
    check_the_lecture_says_what_each_step_leaves_to_the_student(transfer_text.lecture(LAB))


def test_the_subsection_check_fails_on_the_lecture_that_answered():
    """The subsection as it was (the row ownership, the scale, the arrival counts, the threshold and
    the order of the work of the graded kernels spelled out) fails the check; each listed answer
    was in it."""
    old = transfer_text.old_text("d1b9b34", f"lectures/{LAB}/index.md")
    with pytest.raises(AssertionError):
        check_the_lecture_says_what_each_step_leaves_to_the_student(old)
    flat = transfer_text.flat(old)
    for answer in ANSWERS:
        assert answer in flat, answer


def test_the_notebook_states_the_contract_without_the_schedule():
    for folder in ("solutions", "assignments"):
        cells = transfer_text.cells(LAB, folder)
        md = transfer_text.markdown_by_head(cells)
        for head in ("## Step 2: one query tile", "## Step 3: a producer and a ring",
                     "## Step 4: ping-pong and conditional rescaling", "## Step 5: causal blocks and GQA packing"):
            text = md[head]
            assert "**What to build.**" in text and "**What the grader checks.**" in text, head
            assert "What you work out yourself" in transfer_text.flat(text), head
        flat4 = transfer_text.flat(md["## Step 4: ping-pong and conditional rescaling"])
        assert "issues `O += P·V` of its previous block together with" not in flat4
        assert "The PV MMA is split" not in flat4
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"
                         and re.search(r"def (hopper|blackwell)_attn_step[2-5]\(", "".join(c["source"])))
        docs = transfer_text.flat("\n".join(re.findall(r'"""(.*?)"""', code, re.S)))
        for schedule in ("K_{j+1} is requested as soon as", "thread 0 waits for K_j", "K0, K1, V0, K2",
                         "Consumer 0 goes first", "consumer 1 skips the hand-over", "interleaves PV_0",
                         "p_o_ready / p2_ready", "processes them last-to-first", "kv_empty[ST]",
                         "wait k_full, S = Q_c K_j^T", "A turn issues the QK^T product",
                         "row r = position p0 + r // pack"):
            assert schedule not in docs, schedule
        assert docs.count('What you work out yourself", step') == 8


@pytest.mark.slow
def test_the_lecture_variants_compile_to_what_the_lecture_says():
    kernels = {name: (arch, src) for lab, name, arch, src in lecture_kernels() if lab == LAB}
    arch, src = kernels["lse_pairs"]
    assert arch == "sm_90a"
    art = _compile(src, "lse_pairs", arch)
    assert "MUFU.EX2" in art.sass and "MUFU.LG2" in art.sass and "SHFL.BFLY" in art.sass
    assert "BAR.SYNC" not in art.sass and "wgmma" not in art.ptx

    arch, src = kernels["turns"]
    art = _compile(src, "turns", arch)
    assert "__launch_bounds__(384)" in art.cuda_source
    assert "BAR.ARV" in art.sass and "VOTE.ANY" in art.sass
    assert re.search(r"BAR\.SYNC\S* R\d+, 0x100", art.sass)          # the id is in a register, 256 threads

    # the head-major packed load, placed in a kernel of its own: one TMA load of the whole box
    load = next(b for b in transfer_text.code_blocks(transfer_text.lecture(LAB)) if b.startswith("# Head-major Q"))
    body = "\n".join("        " + ln for ln in load.split("...\n", 1)[1].splitlines())
    harness = f'''
HEAD_DIM, GRP, B, H, SEQ = 128, 8, 2, 16, 300
SPAN = 128 // GRP
TILE_LAYOUT = mma_shared_layout("float16", SwizzleMode.SWIZZLE_128B_ATOM, (128, HEAD_DIM))

@T.prim_func
def packed_load(Qh: T.Buffer((B, H, SEQ, HEAD_DIM), "float16"), out: T.Buffer((128,), "float16")):
    T.device_entry()
    tile, hkv, b = T.cta_id([(SEQ + SPAN - 1) // SPAN, H // GRP, B])
    T.warpgroup_id([1])
    w, ln = T.warp_id_in_wg([4]), T.lane_id([32])
    pool = T.SMEMPool()
    q_landed = pool.alloc((1,), "uint64", align=8)
    pool.move_base_to(1024)
    Qtile = pool.alloc((128, HEAD_DIM), "float16", layout=TILE_LAYOUT)
    pool.commit()
    if w * 32 + ln == 0:
        T.ptx.mbarrier.init(q_landed.ptr_to([0]), 1)
    T.ptx.fence.mbarrier_init()
    T.cuda.cta_sync()
    if w * 32 + ln == 0:
{body}
    T.ptx.mbarrier.try_wait(q_landed.ptr_to([0]), 0)
    out[w * 32 + ln] = Qtile[w * 32 + ln, 0]
'''
    assert PRELUDE
    art = _compile(harness, "packed_load", "sm_90a")
    assert len(re.findall(r"UTMALDG", art.sass)) == 1
    assert "mbarrier.arrive.expect_tx" in art.ptx


# ---- The give-aways a student trial found after the subsection was turned into questions -------
# The given code and the part texts still handed over the decisions of the graded steps: what a
# ping-pong turn holds and so PINGPONG_STAGES, which option of online_softmax is the conditional
# reference, why gqa_pack stops at 64, whose rows store_o_tma reuses and why its fence, END_BAR's
# thread count and the columns of exp2_fma; the lecture stated the relay's left-out hand-over, the
# right rounding of a block count and FA4's 256 arrivals; part c gave packed_row's formula and
# q_box's start and size, part d every arrival count of barrier_counts. The contracts stay; the
# decisions are questions of "What you work out yourself", and parts c and d give rules to count by.
OLD_TRIAL = "33662e1"     # the texts that still stated them

NB_GIVEAWAYS = (
    # the given constants and docstrings
    "a turn holds two stages (K_j and V_{j-1})", "so 3 stages keep one", "3 x 64 KB = 224 KB",
    "conditional = True: the reference moves only when the max grows",
    "so the result is the same", "so a consumer's 64 rows are whole positions",
    "its own 64 rows of the Q tile", "no other warpgroup reads them",
    "so the TMA (async proxy) sees the generic-proxy stores",
    "named barrier of all 512 threads before the TMEM dealloc", "the last 2 of every 16 columns (12.5%)",
    # step 4's text
    "`conditional=True`",
    # part c
    "$t \\cdot (\\texttt{rows}/g) + \\lfloor r / g \\rfloor$", "$h_{kv} \\cdot g + (r \\bmod g)$",
    "starting at (batch, $t \\cdot \\texttt{rows}/g$, $h_{kv} g$, 0)", "(1, rows/g, g, D)",
    # part d
    "every thread of a softmax warpgroup and every thread of the correction warpgroup",
    "every thread of the TMA-store warp", "(1 each: a `tcgen05.commit`)",
    "one arrival per consumer warpgroup", "(1, the block_m × D Q tile)",
)
# what the given code and the part texts still state: the contract
NB_CONTRACT = {
    "hopper_attn_helpers": ("PINGPONG_STAGES = 3", "the lecture asks why 3", "RESCALE_THRESHOLD = 8.0",
                            "def online_softmax(S, O, P, m, l, scale_log2, conditional):",
                            "picks one of part a's two reference rules",
                            "rows 64c .. 64c + 63 of Osmem", "O[b, m0_wg : m0_wg + 64, head, :]",
                            "TMA clips rows past seq_q", "Which buffer may serve as Osmem",
                            "at most 64 (the lecture asks why 64)", "return math.gcd(group, 64)"),
    "blackwell_attn_helpers": ("END_BAR = 15", "the lecture asks what it guards", "EMU_COLS_PER_16 = 2",
                               "for this many of every 16 columns", "and in which blocks: the lecture asks"),
}
BARRIERS = ("q_full", "k_full", "v_full", "k_empty", "v_empty", "kv_full", "kv_empty", "s_ready", "o_ready",
            "p_o_rescale", "p_ready_2", "softmax_corr_empty", "corr_epi_full", "corr_epi_empty")


def check_the_notebook_states_rules_not_decisions(cells):
    text = transfer_text.visible(cells)
    for gone in NB_GIVEAWAYS:
        assert gone not in text, gone
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): transfer_text.visible([c]) for c in cells}
    for grade_id, kept in NB_CONTRACT.items():
        for k in kept:
            assert k in by_id[grade_id], (grade_id, k)
    md = transfer_text.markdown_by_head(cells)
    part_c = transfer_text.flat(md["## Part c: GQA packing and the cost of attention"])
    for rule in ("the $g$ heads of one position are adjacent rows, in increasing head order",
                 "each tile continues where the one before it ended", "both for you to work out",
                 "`q_box(batch, tile, kv_head, group, rows, head_dim, seq_q)`", "**transaction count**"):
        assert rule in part_c, rule
    part_d = transfer_text.flat(md["## Part d: the budgets of FA3 and FA4"])
    barriers = part_d[part_d.index("**Barriers.**"):]
    for name in BARRIERS:
        assert f"`{name}`" in barriers, name
    for rule in ("who can vouch for the work the barrier guards", "one `tcgen05.commit` of the issuing thread",
                 "one elected thread may arrive for the whole warpgroup", "every thread that took part arrives",
                 "each computes its rows against every K and V block"):
        assert rule in barriers, rule
    for count in ("128", "256", "512", "32", "(1,", "1 each", "one arrival per"):
        assert count not in barriers, count


@pytest.mark.parametrize("folder", ["solutions", "assignments"])
def test_the_notebook_states_rules_not_decisions(folder):
    check_the_notebook_states_rules_not_decisions(transfer_text.cells(LAB, folder))


LECTURE_GIVEAWAYS = (
    "opens the relay once before its loop and hands over after its first 2 turns only",
    "a fourth would be left waiting", "the floor is the one that is right", "$128 + 128 = 256$",
    "every thread of both warpgroups", "$t \\cdot (128/g) + \\lfloor r/g \\rfloor$", "$(1, 128/g, g, D)$",
)
# the new questions of "What you work out yourself", by step
TRIAL_QUESTIONS = {
    3: ("which buffer of the CTA do you pass as its `Osmem`",
        "why may consumer $c$ overwrite its rows of it at that point and not before",
        "What does the fence in `store_o_tma` order, between which proxies"),
    4: ("Count, for $n$ key blocks, the `bar.sync`s and the `bar.arrive`s on each consumer's barrier",
        "Which K and V tiles does a turn hold while its products run",
        "why is `PINGPONG_STAGES` 3: what would 2 stages cost the producer, and would 4 fit in shared memory",
        "which value of the given `online_softmax`'s `conditional` applies it",
        "which `EMU_COLS_PER_16` of every 16 columns go through `exp2_fma`, and in which blocks?",
        "which threads must meet on `END_BAR` before the dealloc, and how many are they?"),
    5: ("why is Hopper's pack at most 64 where Blackwell's may be 128",
        "which of `T.floordiv` and `T.truncdiv` gives the right count when one is",
        "does a clamp at 0 always hide the difference?"),
}


def check_the_lecture_asks_what_the_texts_gave(lecture):
    whole = transfer_text.flat(lecture)
    for gone in LECTURE_GIVEAWAYS:
        assert gone not in whole, gone
    section = lecture[lecture.index("### What you work out yourself"):lecture.index("## Self-check")]
    for step, questions in TRIAL_QUESTIONS.items():
        part = section[section.index(f"**Step {step}**"):]
        part = transfer_text.flat(part[:part.index(f"**Step {step + 1}**")] if step < 5 else part)
        for question in questions:
            assert question in part, (step, question)
    # the mechanisms stay, on the lecture's own problems
    assert "the arrival before the loop and the condition on the hand-over are what balance them" in whole
    assert "`T.floordiv(-5, 128)` is $-1$ and `T.truncdiv(-5, 128)` is 0." in whole
    assert "part c has you work out its start and size" in whole and "part d has you count them" in whole


def test_the_lecture_asks_what_the_texts_gave():
    check_the_lecture_asks_what_the_texts_gave(transfer_text.lecture(LAB))


def test_the_trial_checks_fail_on_the_texts_that_gave_the_decisions():
    transfer_text.check_the_old_texts_gave(LAB, OLD_TRIAL, check_the_lecture_asks_what_the_texts_gave, LECTURE_GIVEAWAYS,
                                           check_the_notebook_states_rules_not_decisions, NB_GIVEAWAYS)


# ---- Given code whose comments or docstrings still answered a question of the lecture ------------
GIVEN_OLD = "a748dc4"     # the commit whose given code still said it
GIVEN_GIVEAWAYS = ("a 32 KB K block and a 32 KB V block", "and stages O at the end",
                   "P[:, 0:96] as soon as it is stored, P[:, 96:128] after", "is split into group // pack sub-groups")


def test_the_given_code_answers_nothing():
    transfer_text.check_given_code_says_none_of(LAB, GIVEN_GIVEAWAYS, GIVEN_OLD)


# ---- The V descriptor: Lab 4's graded MN-major fields, no longer given here -----------------------
V_FIELDS_OLD = "031c3ee"     # the last commit whose given code held V's descriptor fields
V_FIELDS_GIVEAWAYS = ("VMAJOR_LBO, VMAJOR_SBO = 1024, 64", "16 KB apart (LBO)", "LBO = the 16 KB between")


def test_the_v_descriptor_is_the_students_lab_4_answer():
    """Lab 4 grades wgmma_desc_fields_mn on hidden cases; Lab 6's given code gave its value for
    the V tile and what LBO spans, and the student edition ships every lab at once. Now each Hopper
    builder asks the student's carried-over function, inside its own solution region, and the
    lecture asks the question."""
    transfer_text.check_given_code_says_none_of(LAB, V_FIELDS_GIVEAWAYS, V_FIELDS_OLD)
    transfer_text.check_carried_and_called(LAB, "wgmma_desc_fields_mn", "wgmma_desc_fields_mn(128, BLK_N)", 4)
    assert "v_lbo, v_sbo" in transfer_text.visible(transfer_text.cells(LAB, "solutions"))
    assert "what are the LBO and SBO of its descriptor" in transfer_text.flat(transfer_text.lecture(LAB))


QK_FIELDS_OLD = "f965d65"    # the last commit whose given code held Q's and K's descriptor fields
QK_FIELDS_GIVEAWAYS = ("KMAJOR_LBO, KMAJOR_SBO = 1, 64", "DESC_SWIZZLE = 3")


def test_the_q_and_k_descriptors_are_the_students_lab_4_answer():
    """The same for Q and K (K-major): Lab 4's graded wgmma_desc_fields, carried over and called in
    each Hopper builder's own region, in place of the given constants."""
    transfer_text.check_given_code_says_none_of(LAB, QK_FIELDS_GIVEAWAYS, QK_FIELDS_OLD)
    transfer_text.check_carried_and_called(LAB, "wgmma_desc_fields", "wgmma_desc_fields(128)", 4)   # steps 2-5
    assert "QK_LBO" not in transfer_text.visible(transfer_text.cells(LAB, "solutions"))


V_FLAG_OLD = "58df381"       # the last commit whose given issue_pv set B's transpose flag and called V MN-major
V_FLAG_GIVEAWAYS = ("transA=False, transB=True, scaleA=1.0, scaleB=1.0, scaleD=True", "from shared memory, an MN-major")


def test_v_majorness_and_its_wgmma_flag_are_the_students():
    """The lecture asks whether V is K-major or MN-major for O += P V and which wgmma flag says so;
    the given issue_pv answered both. Now it takes the flag, and each Hopper builder's own region
    passes it."""
    transfer_text.check_given_code_says_none_of(LAB, V_FLAG_GIVEAWAYS, V_FLAG_OLD)
    visible = transfer_text.visible(transfer_text.cells(LAB, "solutions"))
    assert "transB=v_trans" in visible and "V_TRANS" not in visible
    solutions = transfer_text.notebook_text(transfer_text.cells(LAB, "solutions"))
    assert solutions.count(", V_LBO, V_SBO, SWIZZLE, V_TRANS)") == 4    # one per Hopper builder, steps 2-5
    assert "which flag of the `wgmma` says so" in transfer_text.flat(transfer_text.lecture(LAB))

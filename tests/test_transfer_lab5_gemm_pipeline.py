"""Lab 5, steps 5 and 7: the lecture teaches the ring of stages and warp specialization on a
problem other than the graded GEMM, says what the graded steps leave to the student, and the
notebook states the contract of the graded builders without spelling out their code."""
import json
import re

import pytest
import transfer_text
from test_thin_spots import _compile, lecture_kernels

LAB = "lab5_gemm_pipeline"
GRADED = ("hopper_step5", "blackwell_step5", "hopper_step7", "blackwell_step7")


def _graded_lines():
    """The statement lines of the graded reference kernels of steps 5 and 7 that are specific to
    the GEMM's ring (waits, releases, loads, wgmma groups), stripped of comments and spaces."""
    ring = (r"try_wait|mbarrier\.arrive|copy_async\(A|copy_async\(Asmem|wait_group\(1\)|"
            r"\.wait\(|\.arrive\(|wgmma_k_tile\(")
    return transfer_text.solution_lines(LAB, lambda ln: re.search(ring, transfer_text.squash(ln)))


def test_no_lecture_code_block_spells_out_the_graded_ring():
    """The old annotated step-7 listing (producer loop on the A and B tiles, consumer wgmma group,
    release of the previous stage) is gone; no lecture block defines a graded builder."""
    blocks = transfer_text.code_blocks(transfer_text.lecture(LAB))
    text = "\n".join(blocks)
    for name in GRADED:
        assert f"def {name}(" not in text, name
    squashed = {transfer_text.squash(ln) for b in blocks for ln in b.splitlines()}
    assert not {ln for ln in _graded_lines() if len(ln) > 30} & squashed, \
        sorted({ln for ln in _graded_lines() if len(ln) > 30} & squashed)
    for giveaway in ("issue_wgmmas(", "(slot + STAGES - 1) % STAGES", "Bs[slot, :, :], B[n0:n0 + 128",
                     "freed.arrive(cons.stage)", "Tx.gemm_async(acc[:, 0:128], As[cons.stage"):
        assert giveaway not in text, giveaway


# What the subsection asks: questions that name a decision of the graded steps 5 and 7.
QUESTIONS = ("which thread issues the loads, how many K tiles does it load before the first MMA",
             "how many bytes must its `expect_tx` announce", "which K tile's stage is known to be free after each wait",
             "how many arrivals is `empty[s]` initialised for", "Which parity does each wait use",
             "How does the last K tile end", "which commit must the loader wait for",
             "in which order does the GEMM's producer walk output tiles", "how deep is the ring?",
             "which stages are still unreleased after the last wait", "which barrier synchronises its threads",
             "how many accumulator registers is that per thread", "with which arrival counts")
# The answers the subsection used to give, and the sentences elsewhere that handed them to the graded steps.
ANSWERS = ("up to `STAGES - 1` loads are in flight", "two TMA loads count on one", "128 arrivals per fill",
           "each K tile's `wait_group(1)`", "ends with `wait_group(0)` in straight-line code",
           "32 KB per `expect_tx`", "releases lag one K tile behind", "one thread arrives for the warpgroup",
           "128 accumulator registers per thread", "the four barrier arrays", "a TMA warp, an MMA warp",
           "There is no `setmaxnreg` and no named barrier in this step", "the pair of TMEM accumulators")
ELSEWHERE = ("announcing the 32 KB the stage will receive", "and one of B, 32 KB, so four stages",
             "`empty[s]` is initialised for two arrivals, one per consumer")


def check_the_lecture_says_what_steps_5_and_7_leave_to_the_student(lecture):
    asks = lecture[lecture.index("## What the lab asks"):lecture.index("## Self-check")]
    assert "### What you work out yourself" in asks
    section = asks[asks.index("### What you work out yourself"):]
    for step, builders in (("**Step 5**", ("hopper_step5", "blackwell_step5")),
                           ("**Step 7**", ("hopper_step7", "blackwell_step7"))):
        assert step in section, step
        for b in builders:
            assert b in section, b
    flat = transfer_text.flat(section)
    for name in ("ring_sumsq", "two_roles", "asynchronous", "grouped_tile_coords", "PRODUCER_REGS"):
        assert name in flat, name
    for question in QUESTIONS:
        assert question in flat, question
    bullets = transfer_text.bullets(section)
    assert len(bullets) >= 10 and all("?" in b for b in bullets), [b for b in bullets if "?" not in b]
    for answer in ANSWERS:
        assert answer not in flat, answer
    whole = transfer_text.flat(lecture)
    for answer in ELSEWHERE:
        assert answer not in whole, answer


def test_the_lecture_says_what_steps_5_and_7_leave_to_the_student():
    check_the_lecture_says_what_steps_5_and_7_leave_to_the_student(transfer_text.lecture(LAB))


def test_the_subsection_check_fails_on_the_lecture_that_answered():
    """The subsection as it was (the loads in flight, the wait counts, the bytes per stage and the
    arrivals of the graded steps spelled out) fails the check; each listed answer was in it."""
    old = transfer_text.old_text("d1b9b34", f"lectures/{LAB}/index.md")
    with pytest.raises(AssertionError):
        check_the_lecture_says_what_steps_5_and_7_leave_to_the_student(old)
    flat = transfer_text.flat(old)
    for answer in ANSWERS + ELSEWHERE:
        assert answer in flat, answer


def test_the_notebook_states_the_contract_without_the_schedule():
    for folder in ("solutions", "assignments"):
        cells = transfer_text.cells(LAB, folder)
        md = transfer_text.markdown_by_head(cells)
        step5, step7 = md["## Step 5: a ring of stages"], md["## Step 7: warp specialization"]
        for text in (step5, step7):
            assert "**What to build.**" in text and "**What the grader checks.**" in text
            assert "ring_sumsq" in text and "What you work out yourself" in text
        flat5 = transfer_text.flat(step5)
        for schedule in ("hands the stage of the group before it back", "loads the K tile three ahead",
                         "peel the last K tile"):
            assert schedule not in flat5, schedule
        code = {c["source"][0] if c["source"] else "": "".join(c["source"]) for c in cells if c["cell_type"] == "code"}
        docs = "\n".join(v for k, v in code.items() if re.match(r"def (hopper|blackwell)_step[57]\(", k))
        flat = transfer_text.flat(docs)
        for schedule in ("waits only for the MMA of tile k-1", "Thread 0 keeps the TMA loads",
                         "acc_empty[2] MBarrier"):
            assert schedule not in flat, schedule


@pytest.mark.slow
def test_the_lecture_ring_compiles_to_a_warp_specialized_ring_on_sm_90a():
    found = {name: (arch, src) for lab, name, arch, src in lecture_kernels() if lab == LAB}
    arch, src = found["ring_sumsq"]
    assert arch == "sm_90a"
    art = _compile(src, "ring_sumsq", arch)
    assert "__launch_bounds__(256, 1)" in art.cuda_source
    assert "USETMAXREG.DEALLOC" in art.sass and "USETMAXREG.TRY_ALLOC" in art.sass
    assert "UTMALDG.2D" in art.sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in art.sass
    assert "mbarrier.try_wait.parity" in art.ptx and "mbarrier.arrive.expect_tx" in art.ptx
    assert "wgmma" not in art.ptx                      # a different consumer: no tensor-core MMA
    # the conventions the lecture states: producer phase 1, consumer phase 0, one fill of 16 KB
    assert "ring[1] = 1" in src and "ring[1] = 0" in src and "TILE_BYTES = ROWS * COLS * 2" in src
    assert "init(empty.ptr_to([st]), 128)" in src


# ---------------------------------------------------------------- steps 6, 8 and 9: questions, not the design
# The lecture's sections on steps 6, 8 and 9 used to describe the reference's own design (the group
# of 8 and the cluster index of the scheduler, 64 rows per consumer with m64n256k16, 48 KB stages,
# half of B multicast with mask 0b11, four empty arrivals); the notebook said the same. The
# mechanisms and the TIRx calls stay; the decisions are now questions of "What you work out yourself".
OLD = "c5ed0b3"      # the texts before steps 6, 8 and 9 were turned into questions
OLD_MISSING = "the old texts are not in this checkout's history"


def _section(lecture, head):
    """The section `head` flattened, up to the next level-2 heading (one must follow)."""
    start = lecture.index(head)
    return transfer_text.flat(lecture[start:lecture.index("\n## ", start + 1)])


STEP689_GIVEAWAYS = {
    "## Step 6: persistent CTAs": ("groups of 8", "about 8 rows by 17 columns", "l2_group_size=8",
                                   "`bx // cluster_size`", "Two schedulers over the same sequence"),
    "## Step 8: two consumers share the B tile": ("Consumer $c$ computes rows $64c$", "m64n256k16",
                                                  "16 KB of A and 32 KB of B", "$256 / 2 = 128$ accumulator",
                                                  "each stage brings 32 KB", "Four 48 KB stages"),
    "## Step 9: clusters and TMA multicast": ("**half of the B tile** (128 rows)", "Tx.copy_async(..., cta_mask=0b11)",
                                              "48 KB, although its own producer issued only 32 KB",
                                              "four arrivals", "Bs[stage, rank * 128:rank * 128 + 128, :]",
                                              "32 KB per stage", "each thread of both CTAs arriving on the leader's"),
}
STEP689_QUESTIONS = (
    "how many rows and columns of tiles does one wave of 132 CTAs cover",
    "how do the loads of the next tile get ahead of this tile's MMAs, and with which `init` argument",
    "Which rows of the $128 \\times 256$ tile does each consumer compute, with which `wgmma` shape",
    "how many stages fit next to the epilogue buffers?",
    "How does each consumer write its part of D",
    "To which CTAs must each commit go (which `cta_mask`)",
    "Which rows of the B tile does CTA `rank` load, into which rows of its stage, and with which `cta_mask`",
    "How many bytes must each CTA's `full[s]` expect, and how many do its own loads bring?",
    "is `empty[s]` initialised for, and on which CTAs' barriers does each consumer arrive?",
    "what does its second CTA load, and what does it store?",
    "how many arrivals does `empty[s]` need when both consumers read the stage?")


def check_the_lecture_asks_steps_6_8_9(lecture):
    for head, gone in STEP689_GIVEAWAYS.items():
        section = _section(lecture, head)
        for g in gone:
            assert g not in section, (head, g)
    # the mechanisms and the TIRx calls stay
    step6, step9 = _section(lecture, "## Step 6: persistent CTAs"), _section(lecture, "## Step 9: clusters and TMA")
    for kept in ("ClusterPersistentScheduler2D(", "l2_group_size=G", "num_clusters=", ".next_tile()", "tiles.init("):
        assert kept in step6, kept
    for kept in ("cta_mask=0b1111", "T.cuda.cluster_sync()", "remote=1 - rank", "whichever CTA's load delivered it",
                 "a multicast load writes into stage $s$ of every CTA in its mask"):
        assert kept in step9, kept
    asks = lecture[lecture.index("### What you work out yourself"):lecture.index("## Self-check")]
    for step, builders in (("**Step 6**", ("hopper_step6", "blackwell_step6")),
                           ("**Step 8**", ("hopper_step8", "blackwell_step8")),
                           ("**Step 9**", ("hopper_step9", "blackwell_step9"))):
        assert step in asks, step
        for b in builders:
            assert b in asks, b
    flat = transfer_text.flat(asks)
    for question in STEP689_QUESTIONS:
        assert question in flat, question
    selfcheck = transfer_text.flat(lecture[lecture.index("## Self-check"):])
    assert "announces only the 32 KB it loads itself" not in selfcheck
    assert "announces only the bytes of the loads it issues itself" in selfcheck


NOTEBOOK_GIVEAWAYS = {
    "## Step 6: persistent CTAs": ("(`GROUP_M = 8`)",),
    "## Step 8: more math per byte": ("each compute 64 rows with one m64n256k16", "`empty[s]` now counts two arrivals",
                                      "is part b's plan exactly", "each CTA loads half of its A tile",
                                      "cta_mask=0b11)` on a"),
    "## Step 9: clusters": ("each loads its own A tile and one half of B", "48 KB, though its own loads bring only 32 KB",
                            "each empty barrier counts the consumers of both CTAs", "`cta_mask=0b11` on `Tx.copy_async`"),
    "## The kernels: steps 5 to 9": ("loads `STAGES − 1` K tiles ahead",),
    "## The wgmma accumulator hazard, again (Hopper)": ("one wgmma group in flight while they issue the next (`wait_group(1)`)",),
}


def check_the_notebook_leaves_steps_6_8_9_to_the_student(cells):
    md = {head: transfer_text.flat(text) for head, text in transfer_text.markdown_by_head(cells).items()}
    for head, gone in NOTEBOOK_GIVEAWAYS.items():
        for g in gone:
            assert g not in md[head], (head, g)
    for head in ("## Step 6: persistent CTAs", "## Step 8: more math per byte", "## Step 9: clusters"):
        assert "What you work out yourself" in md[head], head
    assert "`bar.arrive(stage, cta_group=2, cta_mask=...)` on a `TCGen05Bar`" in md["## Step 8: more math per byte"]
    assert "part d's `multicast_plan` and `stage_counts`" in md["## Step 9: clusters"]
    assert "`cta_mask` on `Tx.copy_async` multicasts a load" in md["## Step 9: clusters"]


def test_the_lecture_asks_what_steps_6_8_and_9_leave_to_the_student():
    check_the_lecture_asks_steps_6_8_9(transfer_text.lecture(LAB))


def test_the_notebook_leaves_steps_6_8_and_9_to_the_student():
    for folder in ("solutions", "assignments"):
        check_the_notebook_leaves_steps_6_8_9_to_the_student(transfer_text.cells(LAB, folder))


def test_the_step_6_8_9_checks_fail_on_the_texts_that_gave_the_design():
    lecture = transfer_text.old_text(OLD, f"lectures/{LAB}/index.md", OLD_MISSING)
    with pytest.raises(AssertionError):
        check_the_lecture_asks_steps_6_8_9(lecture)
    flat = transfer_text.flat(lecture)
    for gone in STEP689_GIVEAWAYS.values():
        for g in gone:
            assert g in flat, g          # each was in the old lecture, so its absence is a change
    for folder in ("solutions", "assignments"):
        cells = json.loads(transfer_text.old_text(OLD, f"{folder}/{LAB}/{LAB}.ipynb", OLD_MISSING))["cells"]
        with pytest.raises(AssertionError):
            check_the_notebook_leaves_steps_6_8_9_to_the_student(cells)
        text = transfer_text.flat(transfer_text.markdown(cells))
        for gone in NOTEBOOK_GIVEAWAYS.values():
            for g in gone:
                assert g in text, g


# ---------------------------------------------------------------- the builders' docstrings and the given constants
# A student trial found that steps 8 and 9 of both tracks could be finished by transcribing what the
# notebook handed over: the consumers' rows and wgmma shape and the register arithmetic (168 =
# 65536 / 384, 40 + 2 x 232 = 3 x 168) in the docstrings, the barrier plans of Hopper step 9 and
# Blackwell step 8 (counts, expect_tx bytes, masks, which CTA's copy is live), the warp of each
# Blackwell role, the stage and shared-memory budgets in the given constants' comments, and part d's
# formula for the empty arrivals. The contracts stay; the decisions are questions of "What you work
# out yourself".
OLD_DOCS = "33662e1"      # the texts whose docstrings and comments still gave the plans

DOC_GIVEAWAYS = (
    # hopper_step8 and the step 8 text
    "c computes rows 64c .. 64c + 63", "one m64n256k16 wgmma per k16 step", "empty[s] now waits for both consumers",
    "start at 168 (65536 / 384)", "start at 168 registers each (65536 / 384)",
    # hopper_step9 and the step 9 texts
    "(cta_mask 0b11)", "one half (128 rows) of the B tile", "expects its own A bytes and both B halves",
    "empty[s] counts NUM_CONSUMERS x CLUSTER_M arrivals", "arrives on its own CTA's empty[s] and on the peer's",
    "Cluster barriers after the barrier init", "a cluster barrier after the barrier init and another before exit",
    "counts the consumers of both CTAs",
    # blackwell_step7
    "warp 3 = TMA producer, warp 0 = MMA issuer", "256 x 232 registers fit",
    # blackwell_step8 and the given mask helper
    "Barriers (every CTA has every array", "arrive.expect_tx(2 x 32 KB)", "every CTA: count pairs",
    "leader: count 2 x 128", "each loads one 64-row half", "cta_mask = 0b0101 << r", "cta_mask 0b0101 << r",
    "CTA r holds rows r*128.. of A",
    # blackwell_step9
    "40 + 2 x 232 = 3 x 168", "ptxas starts every thread at 168", "warp 3 TMA producer, warps 0 and 1",
    "(consumer c: rows c*256.. of the cluster tile)", "(c*256..)", "hence one Dsmem buffer per epilogue",
    # the given constants
    "4 x 48 KB ring + 2 x 16 KB epilogue buffers = 224 KB", "4 x 32 KB + 32 KB for the D tile",
    "step 9 ring: 4 x 48 KB", "two consumer warpgroups of m64n256", "its 64 x 256 result",
    # part d
    "so that is `cm + cn − 1` CTAs", "`(cm + cn − 1) × consumers` arrivals",
)
DOC_NUMBERS = ("224 KB", "48 KB", "0b0101", "0b11", "cm + cn", "3 x 168", "65536 / 384", "NUM_CONSUMERS x CLUSTER_M")
# what the builders still state: the contract
DOC_CONTRACT = {
    "hopper_step8": ("A 128 x 256 CTA tile", "PRODUCER_REGS", "CONSUMER_REGS", "``kernel(A, B, D)``"),
    "hopper_step9": ("clusters of CLUSTER_M = 2 CTAs along M", "every B byte leaves L2 once per cluster",
                     "TMA multicast", "``kernel(A, B, D)``"),
    "blackwell_step7": ("setmaxnreg", "PRODUCER_REGS", "EPILOGUE_REGS", "warning C7508"),
    "blackwell_step8": ("Cluster of 2 x pairs CTAs", "A cluster tile is 256 x 512 of D", "tcgen05.mma.cta_group::2",
                        "a_multicast_mask", "pairs=1 is the book's cluster of one pair", "A 4-CTA cluster needs 4 free SMs"),
    "blackwell_step9": ("two A blocks and one B tile", "A cluster tile is 512 x 512", "PRODUCER_REGS", "EPILOGUE_REGS"),
    "hopper_helpers": ("WS_STAGES = 4", "the lecture asks why"),
    "blackwell_helpers": ("STAGES_9 = 4", "the lecture asks why"),
}


def check_the_notebook_hands_over_no_plan(cells):
    text = transfer_text.visible(cells)
    for gone in DOC_GIVEAWAYS + DOC_NUMBERS:
        assert gone not in text, gone
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): transfer_text.visible([c]) for c in cells}
    for grade_id, kept in DOC_CONTRACT.items():
        for k in kept:
            assert k in by_id[grade_id], (grade_id, k)
    part_d = transfer_text.flat(transfer_text.markdown_by_head(cells)["## Part d: clusters and multicast"])
    assert "is yours to count" in part_d and "`consumers` being the number of consumer warpgroups" in part_d


# the new questions of "What you work out yourself", one per decision the texts no longer give
DOC_QUESTIONS = (
    "**Part d** (`stage_counts`",
    "Into which CTAs' stage $s$ do the A and B loads of CTA X write, X included, and so how many arrivals "
    "must X's `empty[s]` be initialised for",
    "which warpgroup holds the TMA warp and the MMA warp, which warps of it take the two roles",
    "How many bytes of shared memory do `WS_STAGES` stages and the two consumers' epilogue buffers take "
    "together, and why would one stage more not fit?",
    "With three warpgroups of 128 threads, how many registers does every thread start with, how large is "
    "the CTA's pool",
    "which CTA's copy is waited on, who arrives on it",
    "How many bytes does the leader's `expect_tx` announce",
    "which rows of the $512 \\times 512$ cluster tile does each consumer compute, and which warps of the "
    "producer warpgroup issue the loads and each consumer's MMAs?",
    "do one warpgroup at `PRODUCER_REGS` and two at `EPILOGUE_REGS` fit in that pool?",
    "how much shared memory do `STAGES_9` stages take, and how many `Dsmem` buffers",
)
LECTURE_GIVEAWAYS = ("$65536 / 384 = 170.7$", "a pool of $384 \\cdot 168 = 64{,}512$", "$2 \\cdot 128 \\cdot 232$",
                     "room for its 128 accumulator registers",
                     "A cluster-wide barrier (`T.cuda.cluster_sync()`) follows the barrier initialisation",
                     "both halves of B have arrived", "all four consumers of both CTAs")


def check_the_lecture_asks_for_the_plans(lecture):
    whole = transfer_text.flat(lecture)
    for gone in LECTURE_GIVEAWAYS:
        assert gone not in whole, gone
    for gone in ("224 KB", "48 KB", "0b0101", "cm + cn", "3 x 168", "3 \\cdot 168", "NUM_CONSUMERS x CLUSTER_M"):
        assert gone not in whole, gone
    asks = transfer_text.flat(lecture[lecture.index("### What you work out yourself"):lecture.index("## Self-check")])
    for question in DOC_QUESTIONS:
        assert question in asks, question
    # the rules stay, stated without the graded numbers
    step9 = _section(lecture, "## Step 9: clusters and TMA")
    assert "only while that barrier exists" in step9 and "T.cuda.cluster_sync()" in step9
    assert "rounded down to a multiple of 8" in whole


def test_the_notebook_hands_over_no_plan_for_steps_7_to_9():
    for folder in ("solutions", "assignments"):
        check_the_notebook_hands_over_no_plan(transfer_text.cells(LAB, folder))


def test_the_lecture_asks_for_the_plans_it_no_longer_gives():
    check_the_lecture_asks_for_the_plans(transfer_text.lecture(LAB))


def test_the_plan_checks_fail_on_the_texts_that_gave_the_plans():
    transfer_text.check_the_old_texts_gave(LAB, OLD_DOCS, check_the_lecture_asks_for_the_plans, LECTURE_GIVEAWAYS,
                                           check_the_notebook_hands_over_no_plan, DOC_GIVEAWAYS)


# ---- Step 6: the builders' docstrings stated the schedule the step's questions ask for -------------
STEP6_OLD = "c83e4b0"     # the commit whose step 6 docstrings still stated it
STEP6_GIVEAWAYS = ("keeps loading ``stages - 1`` K tiles ahead", "reused only after that store has read it",
                   "its loads run STAGES-1 items ahead of its MMAs", "The ring position (stage, phase) carries over",
                   "a per-tile reset is only correct when")


def check_step6_states_the_contract_only(cells):
    text = transfer_text.flat(transfer_text.visible(cells))
    for gone in STEP6_GIVEAWAYS:
        assert gone not in text, gone
    # the contract stays: persistent, grouped order, no drain between tiles, the store overlapping the next tile
    for kept in ("CTA b computes tiles b, b + num_sms", "The ring does not drain between tiles",
                 "overlaps the next tile's main loop", "while all 128 threads run this tile's epilogue, for any K_TILES",
                 "the lecture's step 6 questions"):
        assert kept in text, kept


def test_step6_states_the_contract_only():
    for folder in ("solutions", "assignments"):
        check_step6_states_the_contract_only(transfer_text.cells(LAB, folder))


def test_the_step6_check_fails_on_the_docstrings_that_gave_the_schedule():
    for folder in ("solutions", "assignments"):
        cells = json.loads(transfer_text.old_text(STEP6_OLD, f"{folder}/{LAB}/{LAB}.ipynb"))["cells"]
        text = transfer_text.flat(transfer_text.visible(cells))
        assert all(g in text for g in STEP6_GIVEAWAYS)
        with pytest.raises(AssertionError):
            check_step6_states_the_contract_only(cells)


# ---- Given code whose comments or docstrings still answered a question of the lecture ------------
GIVEN_OLD = "a748dc4"     # the commit whose given code still said it
GIVEN_GIVEAWAYS = ("of consumer warpgroup c: CONSUMER_BAR + c",)


def test_the_given_code_answers_nothing():
    transfer_text.check_given_code_says_none_of(LAB, GIVEN_GIVEAWAYS, GIVEN_OLD)


# ---- The A and B descriptors: Lab 4's graded K-major fields, no longer given here ----------------
DESC_FIELDS_OLD = "f965d65"     # the last commit whose given code held the descriptors' fields
DESC_FIELDS_GIVEAWAYS = ("DESC_LBO, DESC_SBO, DESC_SWIZZLE = 1, 64, 3",)


def test_the_descriptor_fields_are_the_students_lab_4_answer():
    """Lab 4 grades wgmma_desc_fields on hidden cases; Lab 5's given code gave its value for the
    128-byte K-major tiles, and the student edition ships every lab at once. Now each Hopper builder
    asks the student's carried-over function, inside its own solution region."""
    transfer_text.check_given_code_says_none_of(LAB, DESC_FIELDS_GIVEAWAYS, DESC_FIELDS_OLD)
    transfer_text.check_carried_and_called(LAB, "wgmma_desc_fields", "wgmma_desc_fields(128)", 5)   # steps 5-9
    assert "lbo, sbo, swizzle)" in transfer_text.visible(transfer_text.cells(LAB, "solutions"))


# ---- Part a's parities and part c's kernel-side order: no longer handed out (a fifth-round trial) ----
RING_GIVEAWAYS = ("`(producer_start + g // S) mod 2`", "`(consumer_start + g // S) mod 2`", "| 2 | 0 | 0 | 1 |")
ORDER_GIVEAWAYS = ("first_row = T.truncdiv(t, span) * group", "rows = T.min(tiles_m - first_row, group)")


def _visible_texts(root=transfer_text.ROOT):
    return [transfer_text.visible(transfer_text.cells(LAB, folder, root)) for folder in ("solutions", "assignments")]


def test_part_a_and_part_c_answers_are_not_in_the_students_text():
    """Part a's notebook stated the parity of every wait (and a trace of five loads), and the locked
    helper cell held part c's grouped order for kernel code: the student now derives the first from
    the lecture's per-visit rule, and writes the second in part c's cell."""
    for text in _visible_texts():
        assert not [g for g in RING_GIVEAWAYS + ORDER_GIVEAWAYS if g in text]
    assert "def grouped_tile_coords(" in transfer_text.source(
        next(c for c in transfer_text.cells(LAB, "assignments") if "def grouped_tile(" in transfer_text.source(c)))
    for folder, commit, giveaways in (("solutions", "60bcbc3", RING_GIVEAWAYS), ("assignments", "3de924a", ORDER_GIVEAWAYS)):
        old = json.loads(transfer_text.old_text(commit, f"{folder}/{LAB}/{LAB}.ipynb"))["cells"]
        text = transfer_text.visible(old)
        assert all(g in text for g in giveaways), [g for g in giveaways if g not in text]

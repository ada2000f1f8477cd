"""Lab 4, steps 1 to 4: the lecture teaches the one-tile MMA on other tiles (a 128 x 64 tile with
K = 32 and the 64-byte swizzle: a ReLU epilogue on Blackwell, an unplaced register dump on Hopper),
says what each graded step leaves to the student, and the notebook states the contract of the
graded kernels without spelling out their code."""
import json
import os
import re

import pytest
import transfer_text
from test_thin_spots import _compile, lecture_kernels

ROOT = transfer_text.ROOT
LAB = "lab4_gemm"
GRADED = tuple(f"{track}_step{s}" for s in range(1, 5) for track in ("hopper", "blackwell"))
STEP_HEADS = ("## Step 1: one tile", "## Step 2: the K loop", "## Step 3: a grid of CTAs", "## Step 4: TMA")


def _graded_mma_lines(root=ROOT):
    """The statement lines of the graded reference kernels that issue, wait for or read back the
    MMA, or load and store the tiles, stripped of comments and spaces."""
    keys = (r"gemm_async|mma_async|encode_matrix_descriptor|try_wait|copy_async|Tx\.cta\.copy|"
            r"vstore|Tx\.copy\(|expect_tx|tcgen05\.commit")
    return transfer_text.solution_lines(
        LAB, lambda ln: re.search(keys, ln) and len(transfer_text.squash(ln)) > 20, root)


def check_no_lecture_block_gives_the_graded_kernels(root=ROOT):
    blocks = transfer_text.code_blocks(transfer_text.lecture(LAB, root))
    text = "\n".join(blocks)
    for name in GRADED:
        assert f"def {name}(" not in text, name
    assert "def one_tile(" not in text
    squashed = {transfer_text.squash(ln) for b in blocks for ln in b.splitlines()}
    same = _graded_mma_lines(root) & squashed
    assert not same, sorted(same)
    for giveaway in ("SWIZZLE_128B_ATOM, (128, 64)", "(128, 128) : (1@TLane, 1@TCol)", "n_cols=128",
                     "Tx.gemm_async(acc[:, :], As[:, :], Bs[:, :]", "M=WGMMA_M, N=BLK_N",
                     "wgmma_acc_coord(tid"):
        assert giveaway not in text, giveaway


# What the subsection asks for each step: questions that name a decision of the graded kernel.
QUESTIONS = ("which swizzle do its shared-memory tiles and descriptors use?", "What do your `wgmma_desc_fields` return",
             "which `wgmma` shape covers one m64 half", "how many k16 steps does one K slice take per half",
             "how many TMEM columns does the accumulator need", "how many `tcgen05.mma` does one K slice become?",
             "where does each register pair land", "Which slices of $A$ and of the lab's $B$ does iteration `k` copy",
             "in which iterations must the `accum` flag", "which parity does iteration `k` wait on",
             "which `wait_group` argument, placed where", "What is the grid's extent",
             "Which thread issues the loads and arms the barrier", "what byte count must one phase announce",
             "which parity does each wait use?", "relative to the tile or to $D$")
# The answers the subsection used to give, and the sentences elsewhere that handed them to the graded steps.
ANSWERS = ("the 128-byte swizzle, not the listings'", "wgmma_desc_fields(128)", "four, not two", "m64n128k16",
           "`ACC` = 64", "64 registers per half", "128 fp32 columns", "a row of 128 fp16", "in the first iteration only",
           "zeroed once, before the loop", "`wait_group(0)` in every iteration", "parity that flips every iteration",
           "no proxy fence or CTA barrier between a TMA load", "each keep their own phase",
           "both tiles of a K iteration", "(no CTA offset)")
ELSEWHERE = ("four times per half", "eight instructions per K tile", "which issues eight wgmmas",
             "1024 bytes, stored as 64", "(128 + 128) \\cdot 64 \\cdot 2", "64 per thread in the reference step 4",
             "The lab's kernels therefore wait with `wait_group(0)`", "in Lab 5's step 9 warpgroup 1 reads TMEM")


def check_the_lecture_says_what_each_step_leaves_to_the_student(root=ROOT):
    lecture = transfer_text.lecture(LAB, root)
    asks = lecture[lecture.index("## Lab outline"):lecture.index("## Self-check")]
    assert "### What you work out yourself" in asks
    section = transfer_text.flat(asks[asks.index("### What you work out yourself"):])
    for step in range(1, 5):
        assert f"**Step {step}**" in section, step
        for track in ("hopper", "blackwell"):
            assert f"{track}_step{step}" in section, (track, step)
    for name in ("relu_tile", "frag_dump"):
        assert name in section, name
    for question in QUESTIONS:
        assert question in section, question
    # every item is a question: each bullet of the subsection ends with a question mark
    bullets = transfer_text.bullets(asks[asks.index("### What you work out yourself"):])
    assert len(bullets) >= 10 and all("?" in b for b in bullets), [b for b in bullets if "?" not in b]
    for answer in ANSWERS:
        assert answer not in section, answer
    flat = transfer_text.flat(lecture)
    for answer in ELSEWHERE:
        assert answer not in flat, answer


def _graded_kernels(root=ROOT, folder="solutions"):
    return {m.group(1): transfer_text.source(c) for c in transfer_text.cells(LAB, folder, root)
            if c["cell_type"] == "code" and (m := re.match(r"def ((?:hopper|blackwell)_step[1-4])\(",
                                                            transfer_text.source(c)))}


def check_the_notebook_states_the_contract_without_the_code(root=ROOT):
    for folder in ("solutions", "assignments"):
        cells = transfer_text.cells(LAB, folder, root)
        md = transfer_text.markdown_by_head(cells)
        steps = [md[h] for h in STEP_HEADS]
        for text in steps:
            assert "**What to build.**" in text and "**What the grader checks.**" in text
        flat1 = transfer_text.flat(steps[0])
        assert "relu_tile" in flat1 and "frag_dump" in flat1 and "What you work out yourself" in flat1
        flat = transfer_text.flat("\n".join(steps))
        for code in ("M=WGMMA_M, N=BLK_N", "acc[h * ACC + j]", "tmem[:, :BLK_N]", "accum=(k != 0)",
                     "accum=False", "flip it with", "A[rows, cols]", "mbar=tma_bar.ptr_to([0])",
                     "for each of the two m64 halves and each of the four k16 steps", "(BLK_M + BLK_N)",
                     "pair.vload([0], dtype=\"float16x2\")", "m_st = bx · 128"):
            assert code not in flat, code
        kernels = _graded_kernels(root, folder)
        assert len(kernels) == 8
        comments = "\n".join(ln for k in kernels.values() for ln in k.splitlines() if ln.strip().startswith("#"))
        for code in ("2 halves x 4 k16 steps", "m64n128k16", "fence, sync -> one TMA store",
                     "one elected thread issues the MMA and commits it to mma_bar",
                     "accumulate its product, wait, sync", "wait with the right parity"):
            assert code not in comments, code


def test_no_lecture_code_block_gives_the_graded_kernels():
    check_no_lecture_block_gives_the_graded_kernels()


def test_the_lecture_says_what_each_graded_step_leaves_to_the_student():
    check_the_lecture_says_what_each_step_leaves_to_the_student()


def test_the_notebook_states_the_contract_without_the_code():
    check_the_notebook_states_the_contract_without_the_code()


def _listing(name):
    found = {n: (arch, src) for lab, n, arch, src in lecture_kernels() if lab == LAB}
    return found[name]


@pytest.mark.slow
def test_the_lecture_relu_tile_is_a_128x64_tcgen05_mma_with_64_tmem_columns_on_sm_100a():
    arch, src = _listing("relu_tile")
    assert arch == "sm_100a"
    art = _compile(src, "relu_tile", arch)
    assert len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", art.ptx)) == 2     # K = 32: two k16 steps
    assert len(re.findall(r"\bUTCHMMA\b", art.sass)) == 2 and "UTCATOMSWS" in art.sass
    idesc = int(re.search(r"mov\.b32\s+%r\d+, (\d+);\s*\n(?:.*\n){0,8}?\s*tcgen05\.mma", art.ptx).group(1))
    assert ((idesc >> 17) & 0x3F) * 8 == 64 and ((idesc >> 24) & 0x1F) * 16 == 128   # N = 64, M = 128
    assert re.search(r"tcgen05_alloc_cta_group_1\(\(&\(\(\(uint\*\)\w+\)\[0\]\)\), 64\)", art.cuda_source)
    assert re.search(r"tcgen05_dealloc_cta_group_1\([^;]*, 64\);", art.cuda_source)
    # the operand descriptors: SBO 32 (512-byte atoms of the 64-byte swizzle), TIRx's code 2
    descs = re.findall(r"tcgen05_encode_matrix_descriptor\(\(&\(\w+\[0\]\)\), [^;]*, (\d+), (\d+), (\d+)\);",
                       art.cuda_source)
    assert descs and set(descs) == {("0", "32", "2")}, descs
    assert "tcgen05.ld.sync.aligned.32x32b.x64.b32" in art.ptx
    assert len(re.findall(r"max(\.ftz)?\.f32", art.ptx)) == 64                        # the ReLU
    # Y stays fp32: no conversion to fp16, and the 64 values of a row leave as 16 four-word stores
    assert not re.search(r"cvt\.rn\.f16", art.ptx)
    assert len(re.findall(r"st\.global\.v4\.(?:u32|b32|f32)", art.ptx)) == 16


@pytest.mark.slow
def test_the_lecture_frag_dump_is_two_m64n64k16_wgmmas_on_one_m64_block_on_sm_90a():
    arch, src = _listing("frag_dump")
    assert arch == "sm_90a"
    art = _compile(src, "frag_dump", arch)
    # one m64 block of rows, K = 32: two k16 steps, no loop over halves
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.f16\.f16", art.ptx)) == 2
    assert len(re.findall(r"\bHGMMA\.64x64x16\.F32\b", art.sass)) == 2
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" in art.sass
    descs = re.findall(r"ptx_wgmma_encode_matrix_descriptor\(\(&\(\w+\[0\]\)\), .*?, (\d+), (\d+), (\d+)\);",
                       art.cuda_source)
    assert len(descs) == 4 and set(descs) == {("1", "32", "2")}, descs            # part a's answer, here the reference's
    assert "wgmma_desc_fields(64)" in src and ", 1, 32, 2)" not in src             # the listing asks the student's
    assert len(re.findall(r"st\.global\.f32", art.ptx)) == 32                          # 32 registers, unplaced


def test_the_subsection_check_fails_on_the_lecture_that_answered(tmp_path):
    """The subsection as it was (the swizzle, the k16 count, the TMEM columns, the waits and the
    byte count of the graded kernels spelled out) fails the check of the questions."""
    path = f"lectures/{LAB}/index.md"
    old = transfer_text.old_text("d1b9b34", path)
    os.makedirs(tmp_path / os.path.dirname(path))
    (tmp_path / path).write_text(old)
    with pytest.raises(AssertionError):
        check_the_lecture_says_what_each_step_leaves_to_the_student(str(tmp_path))
    # each answer string was in the old text, so its absence now is a change
    flat = transfer_text.flat(old)
    for answer in ANSWERS + ELSEWHERE:
        assert answer in flat, answer


def test_the_checks_fail_on_the_old_texts(tmp_path):
    """The lecture and notebooks as they were (a Blackwell listing of the graded step 1 with new
    names, the Hopper MMA spelled out in the notebook) fail every check above."""
    for path in (f"lectures/{LAB}/index.md", f"solutions/{LAB}/{LAB}.ipynb", f"assignments/{LAB}/{LAB}.ipynb"):
        old = transfer_text.old_text("d12940a", path, "the old texts are not in this checkout's history")
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        (tmp_path / path).write_text(old)
    for check in (check_no_lecture_block_gives_the_graded_kernels,
                  check_the_lecture_says_what_each_step_leaves_to_the_student,
                  check_the_notebook_states_the_contract_without_the_code):
        with pytest.raises(AssertionError):
            check(str(tmp_path))


# ---------------------------------------------------------------- the notebook's contracts state rules
# Step 2 used to place the Hopper wait (`wait_group(0)` in every iteration), step 4 to name the
# thread that loads (`tid == 0`) and to answer which fences remain; the overview named the wgmma
# shape and step 1 the Blackwell thread roles. Each is now a rule, and the decision is the student's.
OLD = "c5ed0b3"      # the notebooks before the contracts were turned into rules


def _markdown(folder, root=ROOT):
    """Each markdown cell of the notebook in `folder`, flattened, under its heading."""
    return {head: transfer_text.flat(text)
            for head, text in transfer_text.markdown_by_head(transfer_text.cells(LAB, folder, root)).items()}


def check_step2_states_the_wait_rule_not_its_placement(root=ROOT):
    for folder in ("solutions", "assignments"):
        md = _markdown(folder, root)
        step2 = md["## Step 2: the K loop"]
        assert "`wait_group(0)` in every iteration" not in step2
        assert "wait for each slice's group" not in step2
        assert ("nothing reads an accumulator register before `wgmma.wait_group` has reported complete "
                "every group that writes it") in step2
        assert "no copy overwrites a tile before the same holds for every group that reads the tile" in step2
        assert "Where the waits go, and with which argument, is yours to decide." in step2
        assert 'The section "The wgmma accumulator hazard" below' in step2 and "SASS" in step2
        assert "## The wgmma accumulator hazard (Hopper)" in md


def check_step4_leaves_the_loading_thread_to_the_student(root=ROOT):
    for folder in ("solutions", "assignments"):
        step4 = _markdown(folder, root)["## Step 4: TMA"]
        for gone in ("`tid == 0`", "warp_id * 32", "no proxy fence or CTA sync is needed"):
            assert gone not in step4, gone
        # the TIRx calls stay, and expect_tx is a rule: its own arrival plus every byte of the phase
        for kept in ('`Tx.copy_async(dst, src, dispatch="tma_auto", cta_group=1, mbar=...)`',
                     "`T.ptx.mbarrier.arrive.expect_tx(bar, bytes)`", "a single thread starts the loads",
                     "`expect_tx` is the phase's only arrival",
                     "must announce every byte that the loads naming the barrier deliver in that phase",
                     "Which thread issues and arms, and how the other threads learn that the tiles have "
                     "landed, are yours to decide", "which of step 3's fences and CTA barriers"):
            assert kept in step4, kept


def check_no_other_markdown_gives_a_graded_choice(root=ROOT):
    for folder in ("solutions", "assignments"):
        md = _markdown(folder, root)
        text = "\n".join(md.values())
        for gone in ("m64n128k16", "one elected thread issues and commits; every thread waits",
                     "one phase per slice", "tid == 0"):
            assert gone not in text, gone
        assert "`wgmma.mma_async` (shapes m64nNk16)" in text
        assert "`tcgen05.mma` and `tcgen05.commit` are issued by a single thread" in md["## Step 1: one tile"]


RULE_CHECKS = (check_step2_states_the_wait_rule_not_its_placement,
               check_step4_leaves_the_loading_thread_to_the_student,
               check_no_other_markdown_gives_a_graded_choice)


@pytest.mark.parametrize("check", RULE_CHECKS, ids=lambda c: c.__name__)
def test_the_notebook_contracts_state_rules(check):
    check()


@pytest.mark.parametrize("check", RULE_CHECKS, ids=lambda c: c.__name__)
def test_the_rule_checks_fail_on_the_notebooks_that_placed_the_wait(check, tmp_path):
    for folder in ("solutions", "assignments"):
        path = f"{folder}/{LAB}/{LAB}.ipynb"
        old = transfer_text.old_text(OLD, path, "the old notebooks are not in this checkout's history")
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        (tmp_path / path).write_text(old)
    with pytest.raises(AssertionError):
        check(str(tmp_path))


# ---------------------------------------------------------------- part a, the phase question, the listings
# Part a's text gave the descriptor's three values away (the LBO: "write 1"; the swizzle codes 0 to 3;
# a hint with the SBO's 8-row group and its 16-byte units), and the lecture derived them for its
# 64-byte listing. The lecture gave the K loop's parities in closed form ("parity i mod 2"), with a
# figure labelled the same way, so that only `completed_before` was left to add. And it said of its
# step-1 listings that every mechanism of step 1 was in them and only the constants differed: the
# Hopper listing was the graded load and MMA with other numbers. Now the descriptor is left to the
# PTX ISA's definitions, the phase is taught on the lecture's own example, the Hopper listing
# covers one m64 block of rows, the Blackwell listing stops at fp32, and each decision is a question.
GIVEN = "33662e1"    # the lecture and notebooks that gave these answers


def _student_text(folder, root=ROOT):
    """The notebook in `folder` as the student sees it, flattened: every cell, without the lines of
    its solution regions."""
    lines, inside = [], False
    for cell in transfer_text.cells(LAB, folder, root):
        for line in transfer_text.source(cell).splitlines():
            if transfer_text.REGION.search(line):
                inside = "BEGIN" in line
                continue
            if not inside:
                lines.append(line)
    return transfer_text.flat("\n".join(lines))


def _asks(root=ROOT):
    """The lecture's subsection "What you work out yourself", flattened."""
    lecture = transfer_text.lecture(LAB, root)
    asks = lecture[lecture.index("### What you work out yourself"):lecture.index("## Self-check")]
    return transfer_text.flat(asks)


# the notebook's answers to part a, and the lecture's derivations of the listing's descriptor
DESC_GIVEN = ("write 1", "0 none, 1 for 32 bytes", "3 for 128 bytes", "tensor-map code",
              "offsets are in 16-byte units", "an 8-row group is 8 rows of", "divided by 16")
DESC_DERIVED = ("8 rows times the row's bytes", "so it is ignored", "LBO unused (1)", "SBO = 8 rows",
                "in 16-byte units (32)", "tensor-map code", "stride byte offset of 32")
DESC_QUESTIONS = ("which value does `wgmma_desc_fields` return for it?",
                  "what does the descriptor's encoding of an offset make of that distance?",
                  "Which number does `encode_matrix_descriptor` take for each swizzle width, and how does it "
                  "differ from the value the ISA's descriptor holds in its swizzle field?")
# the K loop's parities in closed form, and the early waits of a loop that never flips
PHASE_GIVEN = ("must see the $(i+1)$-th completion", "parity $i \\bmod 2$", "generated/kloop.png",
               "odd iterations simply race", "every odd iteration")
PHASE_QUESTIONS = ("which completion must iteration $i$ see, and so which parity, as a closed form in $i$ "
                   "and `completed_before`, does it wait on?",
                   "with a parity that never flips, which iterations pass their wait before their own MMA "
                   "has completed, and how does the answer depend on `completed_before`?")
LISTINGS_GIVEN = ("Every mechanism of the lab's step 1 is in it", "every constant is different",
                  "show every mechanism of step 1")


def check_part_a_asks_for_the_descriptor_fields(root=ROOT):
    for folder in ("solutions", "assignments"):
        text = _student_text(folder, root)
        for gone in DESC_GIVEN:
            assert gone not in text, (folder, gone)
        # what a student cannot find out stays: where the ISA defines the fields, and TIRx's convention
        for kept in ('"Matrix Descriptor Format"', "`CUtensorMapSwizzle`", "`SwizzleMode`",
                     "encode_matrix_descriptor(desc_ptr, smem_ptr, lbo, sbo, swizzle)",
                     "three ints as `encode_matrix_descriptor` takes them"):
            assert kept in text, (folder, kept)
    lecture = transfer_text.flat(transfer_text.lecture(LAB, root))
    for gone in DESC_DERIVED:
        assert gone not in lecture, gone
    assert '"Matrix Descriptor Format"' in lecture
    asks = _asks(root)
    assert "**Part a** (`wgmma_desc_fields`, `wgmma_desc_offset`)" in asks
    for question in DESC_QUESTIONS:
        assert question in asks, question


def check_the_phase_question_asks_for_the_closed_form(root=ROOT):
    lecture = transfer_text.flat(transfer_text.lecture(LAB, root))
    for gone in PHASE_GIVEN:
        assert gone not in lecture, gone
    # the mechanism stays, on the lecture's own example
    for kept in ("every completion moves it to the next phase, so the parity of its current phase flips",
                 "at once if the parity of the current phase differs from $p$",
                 "Take a barrier that has completed three phases: it is in phase 3, of parity 1."):
        assert kept in lecture, kept
    asks = _asks(root)
    for question in PHASE_QUESTIONS:
        assert question in asks, question
    for folder in ("solutions", "assignments"):
        text = _student_text(folder, root)
        for gone in ("(completed_before + i) % 2", "i mod 2"):
            assert gone not in text, (folder, gone)


def check_the_step1_listings_are_not_the_graded_step1(root=ROOT):
    lecture = transfer_text.lecture(LAB, root)
    flat = transfer_text.flat(lecture)
    for gone in LISTINGS_GIVEN:
        assert gone not in flat, gone
    blocks = {m.group(1): b for b in transfer_text.code_blocks(lecture)
              for m in [re.search(r"@T\.prim_func\ndef (relu_tile|frag_dump)\(", b)] if m}
    # the Hopper listing covers one m64 block of rows: the loop over the halves is the student's
    frag = blocks["frag_dump"]
    assert 'X: T.Buffer((64, DEPTH), "float16")' in frag
    assert "for half in" not in frag and "64 * half" not in frag
    # the Blackwell listing writes fp32: the conversion of the lab's epilogue is the student's
    relu = blocks["relu_tile"]
    assert 'Y: T.Buffer((128, NARROW), "float32")' in relu and "Tx.cast(" not in relu
    assert "how they fit the lab's tile is yours to work out" in flat
    assert ("The listing has one m64 block of rows: how does your kernel cover two, and which start address "
            "and which registers does each half's `wgmma` name?") in _asks(root)
    for folder in ("solutions", "assignments"):
        step1 = transfer_text.flat(transfer_text.markdown_by_head(
            transfer_text.cells(LAB, folder, root))["## Step 1: one tile"])
        assert "lists what differs here" not in step1
        assert "asks the questions this step leaves to you" in step1


GIVEAWAY_CHECKS = (check_part_a_asks_for_the_descriptor_fields,
                   check_the_phase_question_asks_for_the_closed_form,
                   check_the_step1_listings_are_not_the_graded_step1)


@pytest.mark.parametrize("check", GIVEAWAY_CHECKS, ids=lambda c: c.__name__)
def test_part_a_the_phase_question_and_the_listings_ask(check):
    check()


@pytest.mark.parametrize("check", GIVEAWAY_CHECKS, ids=lambda c: c.__name__)
def test_the_giveaway_checks_fail_on_the_texts_that_answered(check, tmp_path):
    for path in (f"lectures/{LAB}/index.md", f"solutions/{LAB}/{LAB}.ipynb", f"assignments/{LAB}/{LAB}.ipynb"):
        old = transfer_text.old_text(GIVEN, path, "the old texts are not in this checkout's history")
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        (tmp_path / path).write_text(old)
    with pytest.raises(AssertionError):
        check(str(tmp_path))


def test_each_given_answer_was_in_the_old_texts(tmp_path):
    """Each string the checks above forbid was in the text at GIVEN, so its absence is a change."""
    path = f"solutions/{LAB}/{LAB}.ipynb"
    os.makedirs(tmp_path / os.path.dirname(path))
    (tmp_path / path).write_text(transfer_text.old_text(GIVEN, path, "the old notebook is not in this checkout's history"))
    notebook = _student_text("solutions", str(tmp_path))
    for given in DESC_GIVEN:
        assert given in notebook, given
    lecture = transfer_text.flat(transfer_text.old_text(GIVEN, f"lectures/{LAB}/index.md"))
    for given in DESC_DERIVED + PHASE_GIVEN + LISTINGS_GIVEN:
        assert given in lecture, given


# ---------------------------------------------------------------- the graded problem is not the lecture's

def check_the_graded_b_is_n_major_and_the_lecture_b_is_k_major(root=ROOT):
    """The lecture's listings multiply by a K-major B (X W^T, W stored N x K, transB False); the
    graded kernels read B stored K x N: an MN-major operand, a (K, N) tile, transB in the MMA.
    Transcribing a listing's operand handling gives the wrong product."""
    lecture = transfer_text.lecture(LAB, root)
    listings = "\n".join(transfer_text.code_blocks(lecture))
    assert "transB=False" in listings and "transB=True" not in listings
    assert "W: T.Buffer((COLS, DEPTH)" in listings
    kernels = _graded_kernels(root)
    assert len(kernels) == 8
    for name, src in kernels.items():
        assert "B: T.Buffer((K, N), f16)" in src and "Bsmem = pool.alloc((BLK_K, BLK_N)" in src, name
        assert "transB=True" in src and "transB=False" not in src, name
        if name.startswith("hopper"):
            assert "wgmma_desc_fields_mn(128, BLK_K)" in src and "Bsmem.ptr_to([WGMMA_K * kk, 0])" in src, name
    skeletons = _graded_kernels(root, "assignments")
    for name, src in skeletons.items():         # the skeleton declares B as stored; the flags are the student's
        assert "B: T.Buffer((K, N), f16)" in src and "transB" not in src, name
    from grader import spec
    kernel_parts = [p for p in spec.load(LAB).parts if p.kind == "kernel"]
    assert kernel_parts and {p.params["problem"] for p in kernel_parts} == {"gemm_nn"}


def check_the_mn_major_fields_are_asked_not_given(root=ROOT):
    """The MN-major descriptor's LBO and SBO are part a's question: no student-visible text of the
    notebook or the lecture gives them, or the rule they follow."""
    seen = transfer_text.visible(transfer_text.cells(LAB, "solutions", root)) + transfer_text.flat(
        transfer_text.lecture(LAB, root))
    for giveaway in ("k_rows * swizzle_bytes", "LBO 512", "LBO = 512", "lbo=512", "(512, 64, 3)", "8192 bytes apart",
                     "the leading byte offset runs from one atom-wide column block", "transB=True"):
        assert giveaway not in seen, giveaway
    assert "`wgmma_desc_fields_mn(swizzle_bytes, k_rows)`" in seen
    assert "Along which dimension does each one step for such an operand?" in seen


def test_the_graded_b_is_n_major_and_the_lecture_b_is_k_major():
    check_the_graded_b_is_n_major_and_the_lecture_b_is_k_major()


def test_the_mn_major_fields_are_asked_not_given():
    check_the_mn_major_fields_are_asked_not_given()


def test_the_variant_checks_fail_on_the_k_major_lab(tmp_path):
    """At 84c9765 the lab's kernels were the lecture's problem (K-major B): the variant check
    fails there, and so does the question check (nothing asked for the MN-major fields)."""
    import json
    for rel in ("lectures/lab4_gemm/index.md", "solutions/lab4_gemm/lab4_gemm.ipynb",
                "assignments/lab4_gemm/lab4_gemm.ipynb"):
        os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
        (tmp_path / rel).write_text(transfer_text.old_text("84c9765", rel))
    json.loads((tmp_path / "solutions/lab4_gemm/lab4_gemm.ipynb").read_text())
    with pytest.raises(AssertionError):
        check_the_graded_b_is_n_major_and_the_lecture_b_is_k_major(str(tmp_path))
    with pytest.raises(AssertionError):
        check_the_mn_major_fields_are_asked_not_given(str(tmp_path))


def test_the_mn_major_b_rule_reads_every_hgmma():
    from grader import inspect
    nn = "/*0540*/ HGMMA.64x128x16.F32 R88, gdesc[UR4].tnspB, RZ, !UPT ;\n/*0720*/ HGMMA.64x128x16.F32 R88, gdesc[UR8].tnspB, R88 ;"
    mixed = nn + "\n/*0800*/ HGMMA.64x128x16.F32 R88, gdesc[UR12], R88 ;"
    assert inspect.check("wgmma_b_mn_major", {"sass": nn}).ok
    bad = inspect.check("wgmma_b_mn_major", {"sass": mixed})
    assert not bad.ok and "1 of 3 HGMMA read B as K-major" in bad.message
    assert not inspect.check("wgmma_b_mn_major", {"sass": "/*0010*/ FFMA R1, R2, R3, R4 ;"}).ok
    # with hardware counters the executed listing replaces "sass"; the rule reads the launched code
    assert not inspect.check("wgmma_b_mn_major", {"sass": nn, "sass_launched": mixed}).ok


@pytest.mark.slow
def test_a_hopper_kernel_that_reads_b_as_k_major_fails_its_build_part_on_a_cpu(tmp_path):
    """The trial's finding: a Hopper step 1 with transB left False compiled and passed its build
    part on a CPU; only a GPU run showed it wrong. The lecture's K-major kernel (84c9765's step 1)
    now fails the build part, with the reason; the reference passes."""
    from conftest import grade_with_builders, import_notebook
    from grader import report
    old = tmp_path / "old" / "lab4_gemm.ipynb"
    old.parent.mkdir()
    old.write_text(transfer_text.old_text("84c9765", "solutions/lab4_gemm/lab4_gemm.ipynb"))
    k_major = import_notebook(str(old), tmp_path / "k", name="k_major")
    r = grade_with_builders(LAB, "s1_build_sm90", {"hopper_step1": k_major.hopper_step1})
    assert r.verdict == report.FAILED and "8 of 8 HGMMA read B as K-major" in r.message, r.message
    ref = import_notebook(os.path.join(ROOT, "solutions", LAB, "lab4_gemm.ipynb"), tmp_path / "r", name="ref")
    r = grade_with_builders(LAB, "s1_build_sm90", {"hopper_step1": ref.hopper_step1})
    assert r.verdict == report.PASSED and "all 8 HGMMA with .tnspB" in r.message, r.message


# ---- The accumulator fragment: taught on mma.sync's 16 x 8 piece, wgmma's arrangement is part a ----
FRAGMENT_OLD = "58df381"      # the last commit whose lecture and notebook stated the m64nN mapping
FRAGMENT_GIVEAWAYS = {
    "lecture": ("Warp $w$ holds rows $16w$ to $16w + 15$", "column block by column block, upper block first",
                "The pattern repeats every 8 columns with register numbers increased by 4"),
    "notebook": ("warp `w` owns the 16 rows `16w … 16w + 15`", "column block by column block: for"),
}


def test_the_fragment_is_taught_on_mma_sync_and_wgmma_s_arrangement_is_part_a():
    """Part a's wgmma_acc_coord was the lecture's and the notebook's three sentences in code. Now
    both teach the 16 x 8 accumulator of mma.sync m16n8k16 and leave the arrangement of those
    pieces over four warps and N/8 column blocks to the student (the PTX ISA draws it)."""
    lecture_path = f"lectures/{LAB}/index.md"
    notebook_path = f"solutions/{LAB}/lab4_gemm.ipynb"
    texts = {"lecture": transfer_text.flat(transfer_text.lecture(LAB)),
             "notebook": transfer_text.visible(transfer_text.cells(LAB, "solutions"))}
    old = {"lecture": transfer_text.flat(transfer_text.old_text(FRAGMENT_OLD, lecture_path)),
           "notebook": transfer_text.notebook_text(json.loads(transfer_text.old_text(FRAGMENT_OLD, notebook_path))["cells"])}
    for where, giveaways in FRAGMENT_GIVEAWAYS.items():
        assert not [g for g in giveaways if g in texts[where]], (where, [g for g in giveaways if g in texts[where]])
        assert all(g in old[where] for g in giveaways), (where, [g for g in giveaways if g not in old[where]])
        assert "m16n8k16" in texts[where], where
    student = transfer_text.visible(transfer_text.cells(LAB, "assignments"))
    assert "16 * warp" not in student and "def wgmma_acc_coord(" in student


# ---------------------------------------------------------------- step 3: the edge tiles are the student's

EDGE_QUESTIONS = ("What is the grid's extent in terms of $M$ and $N$ when neither is a multiple of 128",
                  "So must those parts of the tiles be zeros, or may they be anything read from inside the matrix?",
                  "Which 16-byte chunks of the A tile and of the B tile does each of the 128 threads copy",
                  "Which stores of the epilogue need a bound, and at which granularity")


def check_step3_asks_for_the_edge_tiles(root=ROOT):
    """The graded step 3 takes ragged M and N; the lecture teaches edge tiles on a column sum, where
    the answer differs, and asks the GEMM's questions; the skeleton leaves the grid's extent open."""
    import tomllib
    with open(os.path.join(root, "grader", "specs", f"{LAB}.toml"), "rb") as f:
        parts = {p["id"]: p for p in tomllib.load(f)["parts"]}
    params = parts["s3_correct"]["params"]
    shapes = params["public_shapes"]
    assert any(m % 128 for m, _, _ in shapes) and any(n % 128 for _, n, _ in shapes), shapes
    assert any(m < 128 and n < 128 for m, n, _ in shapes), shapes               # smaller than one tile
    assert params["granule"][0] % 128 and params["granule"][1] % 128, params["granule"]
    lecture = transfer_text.lecture(LAB, root)
    step3 = lecture[lecture.index("## Step 3: a grid of CTAs"):lecture.index("## Step 4: TMA")]
    assert "### Edge tiles, on another kernel" in step3 and "only zeros are right" in transfer_text.flat(step3)
    section = transfer_text.flat(lecture[lecture.index("### What you work out yourself"):])
    for question in EDGE_QUESTIONS:
        assert question in section, question
    skeleton = _graded_kernels(root, "assignments")
    for name in ("hopper_step3", "blackwell_step3"):
        code = skeleton[name]
        given = code[:code.index("# YOUR CODE HERE")]
        assert "M % BLK_M" not in given and "N % BLK_N" not in given, name      # ragged shapes are taken
        assert "T.cta_id([GRID_M, GRID_N])" in code and "GRID_M =" not in code and "// BLK_M" not in code, name
        assert "Tx.cta.copy" not in code and "T.min(" not in code, name


def test_step3_asks_for_the_edge_tiles():
    check_step3_asks_for_the_edge_tiles()


def test_the_edge_tile_check_fails_on_each_part_of_the_whole_tile_step3(tmp_path):
    """Step 3 as it was (whole tiles only, the grid given): the old spec, the old lecture or the
    old skeleton, each put back alone beside the new others, fails the check."""
    paths = (f"lectures/{LAB}/index.md", f"assignments/{LAB}/{LAB}.ipynb", f"grader/specs/{LAB}.toml")
    for old_path in paths:
        root = tmp_path / os.path.basename(old_path)
        for path in paths:
            os.makedirs(root / os.path.dirname(path), exist_ok=True)
            if path == old_path:
                (root / path).write_text(transfer_text.old_text("20d6773", path))
            else:
                with open(os.path.join(ROOT, path)) as f:
                    (root / path).write_text(f.read())
        with pytest.raises(AssertionError):
            check_step3_asks_for_the_edge_tiles(str(root))

"""Lab 3, part d: the lecture teaches staging through shared memory and a swizzle keyed on the
threads that read together on another problem (fp32 row sums over 256-byte rows, read a chunk
column at a time) instead of the graded fp16 transpose, says what the transpose leaves to the
student, and the notebook states the transpose's contract without its index maps."""
import re

import pytest
import transfer_text

LAB = "lab3_layout_swizzle"
GRADED = ("d_plain", "d_swizzled")
# Statement lines every staged kernel of the course writes the same way.
GENERIC = {"T.cuda.cta_sync()"}


def _graded_lines():
    """The statement lines of the reference transposes (inside their solution regions), comments
    and spaces dropped."""
    return transfer_text.region_lines(transfer_text.graded_cells(LAB, "solutions", GRADED)) - GENERIC


def test_no_lecture_code_block_is_the_graded_transpose():
    blocks = transfer_text.code_blocks(transfer_text.lecture(LAB))
    text = "\n".join(blocks)
    for name in ("def build_transpose_plain(", "def build_transpose_swizzled(", "def transpose_plain(",
                 "def transpose_swizzled(", "def transpose(", "def build_transpose_scalar("):
        assert name not in text, name
    for giveaway in ('"float16x8"', '"float16")', "B[bn * TILE", "// TILE, n // TILE"):
        assert giveaway not in text, giveaway
    graded = _graded_lines()
    assert len(graded) >= 8, sorted(graded)            # the reading of the regions works
    shown = {transfer_text.squash(ln) for b in blocks for ln in b.splitlines()}
    assert not graded & shown, sorted(graded & shown)
    assert "## A transpose through shared memory in TIRx" not in transfer_text.lecture(LAB)


# What the subsection asks per phase: questions that name a decision of the transposes, without its answer.
QUESTIONS = ("How many fp16 elements does one 16-byte chunk hold", "how many chunks make a row of the tile",
             "Which chunk does a thread take in each round", "Where in `a` does the CTA's tile start?",
             "What is the vector type of a 16-byte fp16 access", "Can it be read with one vector load",
             "how many reads of which width fill `vec`", "Which thread produces which output chunk in which round?",
             "`addresses_gather(offset, col0, k)`", "Tile element `(i, j)` comes from which element of `a`",
             "How do the CTA's two indices enter", "How is one output chunk written",
             "what goes wrong in `b` if the load and the gather disagree",
             "Why would the row sums' XOR key not serve the transpose's gather")
# The answers the subsection used to give.
ANSWERS = ("a 16-byte chunk holds eight elements", "a 64-column tile row is eight chunks",
           "first row *and* its first column come from the CTA's indices", "eight 2-byte reads",
           "two CTA indices swap roles", "one 16-byte store to `B`", "are eight apart and share it",
           "must use the same layout, or `b` is wrong", "eight consecutive threads must write one 128-byte row")
# The sentences elsewhere that spoke to the graded transpose directly.
ELSEWHERE = ("The transpose of part d runs into exactly this", "Part d's transpose has the shape of many")


def check_the_subsection_asks(text):
    asks = transfer_text.section(text, "## What the lab asks you to do")
    sub = transfer_text.section(asks, "### What you work out yourself")
    for builder in ("build_transpose_plain", "build_transpose_swizzled"):
        assert builder in asks, builder
    for step in ("**Load phase.**", "**Gather phase.**", "**Store.**", "**The swizzled kernel.**"):
        assert step in sub, step
    bullets = transfer_text.bullets(sub)
    assert len(bullets) >= 8, len(bullets)
    assert all("?" in b for b in bullets), [b[:60] for b in bullets if "?" not in b]
    flat = transfer_text.flat(sub)
    for question in QUESTIONS:
        assert question in flat, question
    for answer in ANSWERS:
        assert answer not in flat, answer
    whole = transfer_text.flat(text)
    for answer in ELSEWHERE:
        assert answer not in whole, answer


def test_the_lecture_says_what_the_student_works_out_for_each_step():
    check_the_subsection_asks(transfer_text.lecture(LAB))


def test_the_subsection_check_fails_on_the_lecture_that_answered():
    """The subsection as it was (chunk size, grid origin, gather reads, index swap and the reason
    for the layout spelled out) fails the check, and each listed answer was in it."""
    old = transfer_text.old_text("d1b9b34", f"lectures/{LAB}/index.md")
    with pytest.raises(AssertionError):
        check_the_subsection_asks(old)
    flat = transfer_text.flat(old)
    for answer in ANSWERS + ELSEWHERE:
        assert answer in flat, answer


def test_the_notebook_states_the_contract_without_the_index_maps():
    markdown = transfer_text.markdown(transfer_text.cells(LAB, "assignments"))
    (part_d,) = [s for s in markdown.split("\n## ") if s.startswith("Part d")]
    flat = transfer_text.flat(part_d)
    for contract in ("kernel(a, b)", "multiples of 64", "128 threads", "16 bytes", "addresses_gather",
                     "Staging through shared memory in TIRx: row sums", "What you work out yourself", "0.85"):
        assert contract in flat, contract
    given = "\n".join(transfer_text.graded_cells(LAB, "assignments", GRADED))
    for text in (part_d, given):
        for giveaway in ("128·s + tid", "idx // 8", "idx % 8", "(8·p + k, j)", "8p + k", "64·bn + j",
                         'dtype="float16x8"', "s * THREADS + tid", "bn * TILE + j"):
            assert giveaway not in text, giveaway
    assert not {transfer_text.squash(ln) for ln in given.splitlines()} & _graded_lines()


def test_the_lecture_kernel_is_another_operation():
    from test_thin_spots import lecture_kernels
    mine = {(name, arch) for lab, name, arch, _ in lecture_kernels() if lab == LAB}
    assert mine == {("row_sums", "sm_90a")}, mine


def test_the_lecture_counts_are_the_wavefront_models():
    """The table of the row-sums section: phase 1 stores and phase 2 loads per warp instruction for
    row-major, the hardware's 128-byte swizzle and the listing's row-keyed XOR, counted with the
    grader's model; and the listing's layout is a chunk-preserving bijection."""
    from grader.labs.lab3_layout_swizzle import ref_swizzled, ref_wavefronts
    from test_thin_spots import lecture_kernels
    (src,) = [s for lab, name, _, s in lecture_kernels() if lab == LAB and name == "row_sums"]
    ns = {}
    exec(src[src.index("ROWS, COLS"):src.index("@T.prim_func")], ns)
    rows, cols, nt, per = ns["ROWS"], ns["COLS"], ns["NT"], ns["PER"]
    assert (rows, cols, nt, per) == (128, 64, 128, 4)
    listing = ns["smem_at"]
    assert sorted(listing(r, c) for r in range(rows) for c in range(cols)) == list(range(rows * cols))
    assert all(listing(r, c) == listing(r, c - c % per) + c % per and listing(r, c - c % per) % per == 0
               for r in range(rows) for c in range(cols))
    layouts = {"row-major": lambda r, c: r * cols + c,
               "hardware": lambda r, c: ref_swizzled(r, c, (rows, cols), 4, 128),
               "listing": listing}
    got = {}
    for name, off in layouts.items():
        wide = cols // per
        store = max(ref_wavefronts([4 * off((s * nt + w + t) // wide, (s * nt + w + t) % wide * per)
                                    for t in range(32)], 16) for s in range(rows * wide // nt) for w in range(0, nt, 32))
        load = max(ref_wavefronts([4 * off(w + t, per * q) for t in range(32)], 16)
                   for w in range(0, nt, 32) for q in range(wide))
        got[name] = (store, load)
    assert got == {"row-major": (4, 32), "hardware": (4, 8), "listing": (4, 4)}, got
    table = transfer_text.flat(transfer_text.lecture(LAB))
    assert "| row-major, `r * COLS + c` | 4 | 32 |" in table
    assert "| the hardware's 128-byte swizzle, applied to the row-major byte address | 4 | 8 |" in table
    assert "| the listing's: chunk `c // 4` XOR `r mod 8` | 4 | 4 |" in table


@pytest.mark.slow
def test_the_lecture_kernel_compiles_to_what_the_lecture_says():
    from test_thin_spots import _compile, lecture_kernels
    (arch, src), = [(a, s) for lab, name, a, s in lecture_kernels() if lab == LAB and name == "row_sums"]
    art = _compile(src, "row_sums", arch)
    sass = art.sass
    assert len(re.findall(r"\bLDG\.E\.128\.CONSTANT\b", sass)) == 16
    assert len(re.findall(r"\bSTS\.128\b", sass)) == 16 and len(re.findall(r"\bLDS\.128\b", sass)) == 16
    assert len(re.findall(r"\bBAR\.SYNC\b", sass)) == 1 and len(re.findall(r"\bSTG\.E\b", sass)) == 1
    assert "LDL" not in sass and "STL" not in sass
    assert len(re.findall(r"ld\.shared\.v4\.f32", art.ptx)) == 16 and "xor" in art.ptx
    body = art.cuda_source.split("__global__")[-1]
    stores = re.findall(r"\*\(float4\*\)\(slab_ptr \+ (.*?)\) = ", body)
    assert len(stores) == 16, stores
    key = "((((int)threadIdx.x) & 15) ^ (((int)threadIdx.x) >> 4))"
    assert all(key in s for s in stores), stores          # one XOR expression, constant offsets
    assert art.plan["launches"][0]["grid"] == [512, 1, 1] and art.plan["launches"][0]["block"] == [128, 1, 1]
    assert "`(threadIdx.x & 15) ^ (threadIdx.x >> 4)`" in transfer_text.lecture(LAB)

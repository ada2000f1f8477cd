"""Lab 3, part d: the lecture teaches staging through shared memory and a swizzle keyed on the
threads that read together on another problem (fp32 row sums over 256-byte rows, read a chunk
column at a time) instead of the graded fp16 transpose, says what the transpose leaves to the
student, and the notebook states the transpose's contract without its index maps."""
import os
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


# ---------------------------------------------------------------- parts a and b: formulas now asked
# Parts a and b could be finished by copying: the notebook printed a1's swizzle as a formula, the
# linear offset of step 2 of a2, the three access patterns of b2 as formulas in t, and a hint that
# placed the gather's rows on consecutive rows of an atom; the lecture showed a3's lane,
# warpgroup and tensor-memory layouts, the strides of the graded 8 x 8 tiling and atom_len = 3.
# The texts now teach each rule in words, on another case or on one worked element, and the
# lecture asks for the formulas.
import json

from grader.labs import lab3_layout_swizzle as lab3

OLD = "33662e1"
# The formulas and designs the texts used to print (flattened), in the notebook and in the lecture.
NOTEBOOK_GIVEAWAYS = ("chunk' = (b // 16) XOR", "(b // 128) mod (swizzle_bytes / 16)",
                      "(c // W) · rows · W + r · W + c % W", "strides `(W, rows · W, 1)`",
                      "row-major offset of a taller, narrower tile", "With `atom_len = 3`",
                      "swizzle_len = log2(swizzle_bytes / 16)", "(row0 + t // 8, 8 · (t % 8))",
                      "(row0 + t, 8 · chunk)", "(8 · (t % 8) + k, col0 + t // 8)",
                      "a layout of the row index alone", "eight consecutive rows of one atom",
                      "same row *of their atom*", "without the row interleave")
LECTURE_GIVEAWAYS = ("S[(4, 2, 2, 4) : (16, 4, 8, 1)]", "with `atom_len = 3`",
                     "`ComposeLayout(per_element, swizzle_len, 3, tile_layout)`", "one bit for the 32-byte swizzle",
                     "(3, 3, 3, TileLayout(S[(128, 2, 64):(64, 8192, 1)]))", "column-block stride 8192",
                     "3 for fp16, 2 for fp32", "layout to the row index alone",
                     "on eight *consecutive* rows of an atom", "they touch consecutive rows of an atom")
# Answers that must appear nowhere a student reads (flattened, and squashed for code).
AB_ANSWERS = ("mod (swizzle_bytes / 16)", "% (swizzle_bytes // 16)", "rows · W +", "rows * W", "8k + p",
           "(r % 8) * 8 + r // 8", "(r // 8)", "chunk' =")
# What the notebook keeps: the contracts, and the rules taught on one worked case each.
NOTEBOOK_KEEPS = ("`b = (r · cols + c) · elem_bytes`", "`q XOR (r mod 8)`", "offset 645", '`{"m": 1246}`',
                  "all of block 0 comes first, its rows in order", "`ComposeLayout(per_element, swizzle_len, atom_len, tile_layout)`",
                  "lane `4 · r + c // 2` in its register slot `c % 2`", "in slot `2 + c % 2`",
                  "threads 0–7 column `col0`",
                  "rows `k, 8 + k, …, 56 + k`", "`+ - * // % ^`", "What you work out yourself")
LABELS = ("**Part a1, `offset_swizzled`.**", "**Part a2, `offset_mma`.**",
          "**Part a3, `TileLayout` and `ComposeLayout`.**", "**Part b2, the access patterns.**",
          "**Part b2, `transpose_smem_offset`.**")
QUESTIONS_AB = ("which bits of the chunk index does the XOR flip, and which bits of the line index are its key?",
                "what is the swizzled byte address?", "back to an element offset?",
                "how many elements come before the block that holds column `c`",
                "Which of the printed extents and strides belongs to which of those terms?",
                "how many elements does a step of each of the four pieces of `layout_tiled` skip",
                "Which `per_element`, `swizzle_len` and `atom_len` make `ComposeLayout` equal",
                "Which `atom_len` makes the key the 128-byte line index?",
                "which axis and stride does each piece get?", "which index must split here, and why is one piece not enough",
                "describe `layout_warpgroup_rows(cols)`?", "which piece moves along `TLane`, by how much?",
                "which tile element does thread `t` access",
                "Why is one gather step 8-way conflicted under the same swizzle?",
                "What must hold for one gather step to cost one wavefront",
                "Which layout of the 64 × 64 tile makes that hold")


# The two a3 layouts that were transposed twins of the lecture's examples and are now variants of
# them: the answers asked now, and those asked before (which the old lecture showed).
FRAGMENT_STRIDES, OLD_FRAGMENT_STRIDES = "(2,4@laneid,1@laneid,1)", "(4@laneid,1@laneid,1)"
TMEM_STRIDES, OLD_TMEM_STRIDES = "(1@TLane,64@TLane,1@TCol)", "(1@TLane,1@TCol)"


def _axis_strides():
    """The stride lists with a named axis in the reference's a3 layouts, squashed ("(1@TLane,1@TCol)")."""
    lines = transfer_text.solution_lines(LAB, lambda ln: "@" in ln and "S[" in ln)
    return {m for ln in lines for m in re.findall(r":(\([^()]*\))\]", ln)}


def _shape_stride(text):
    """Every S[(extents) : (strides)] of `text` with numbers only, as two tuples."""
    out = []
    for ext, strides in re.findall(r"S\[\(([\d,\s]+)\)\s*:\s*\(([\d,\s]+)\)\]", text):
        out.append((tuple(int(x) for x in ext.split(",") if x.strip()),
                    tuple(int(x) for x in strides.split(",") if x.strip())))
    return out


def _apply(extents, strides, r, c, cols):
    """A numeric shape-and-stride layout at (r, c): the flat index split by the extents, last fastest."""
    flat, total = r * cols + c, 0
    for ext, stride in zip(reversed(extents), reversed(strides)):
        total += flat % ext * stride
        flat //= ext
    return total


def check_the_notebook_teaches_parts_a_b_without_the_formulas(cells):
    text = transfer_text.flat(transfer_text.visible(cells))
    for giveaway in NOTEBOOK_GIVEAWAYS + AB_ANSWERS:
        assert giveaway not in text, giveaway
    for keep in NOTEBOOK_KEEPS:
        assert keep in text, keep


def check_the_lecture_asks_parts_a_b(text):
    sub = transfer_text.section(transfer_text.section(text, "## What the lab asks you to do"),
                                "### What you work out yourself")
    for a, b in zip(LABELS, LABELS[1:] + ("**Load phase.**",)):
        assert a in sub and b in sub, (a, b)
        block = sub[sub.index(a):sub.index(b)]
        asked = transfer_text.bullets(block)
        assert asked and all("?" in q for q in asked), a
    flat_sub = transfer_text.flat(sub)
    for question in QUESTIONS_AB:
        assert question in flat_sub, question
    whole = transfer_text.flat(text)
    for giveaway in LECTURE_GIVEAWAYS + AB_ANSWERS:
        assert giveaway not in whole, giveaway
    graded = _axis_strides()
    assert len(graded) == 3, graded                       # the fragment, warpgroup and TMEM layouts
    shown = {transfer_text.squash(m) for m in re.findall(r"S\[\([^()]*\)\s*:\s*(\([^()]*\))\]", text)}
    assert not graded & shown, sorted(graded & shown)
    for extents, strides in _shape_stride(text):           # no numeric layout is the graded 8 x 8 tiling
        if len(extents) == 4 and extents[0] * extents[1] == 8 and extents[2] * extents[3] == 8:
            assert any(_apply(extents, strides, r, c, 8) != lab3.ref_tiled(r, c, (8, 8), (extents[1], extents[3]))
                       for r in range(8) for c in range(8)), (extents, strides)


@pytest.mark.parametrize("folder", ["solutions", "assignments"])
def test_the_notebook_teaches_parts_a_b_without_the_formulas(folder):
    check_the_notebook_teaches_parts_a_b_without_the_formulas(transfer_text.cells(LAB, folder))


def test_the_notebook_check_fails_on_the_notebook_that_printed_the_formulas():
    old = json.loads(transfer_text.old_text(OLD, f"solutions/{LAB}/{LAB}.ipynb"))["cells"]
    with pytest.raises(AssertionError):
        check_the_notebook_teaches_parts_a_b_without_the_formulas(old)
    flat = transfer_text.flat(transfer_text.visible(old))
    for giveaway in NOTEBOOK_GIVEAWAYS:
        assert giveaway in flat, giveaway


def test_the_lecture_asks_parts_a_b():
    check_the_lecture_asks_parts_a_b(transfer_text.lecture(LAB))


def test_the_lecture_check_fails_on_the_lecture_that_listed_the_layouts():
    old = transfer_text.old_text(OLD, f"lectures/{LAB}/index.md")
    with pytest.raises(AssertionError):
        check_the_lecture_asks_parts_a_b(old)
    flat = transfer_text.flat(old)
    for giveaway in LECTURE_GIVEAWAYS:
        assert giveaway in flat, giveaway
    shown = {transfer_text.squash(m) for m in re.findall(r"S\[\([^()]*\)\s*:\s*(\([^()]*\))\]", old)}
    # It showed the warpgroup answer, and the answers of the 8 x 8 fragment and the 128-row TMEM
    # layout the lab asked for then (those it asks for now were never shown).
    now = {FRAGMENT_STRIDES, TMEM_STRIDES}
    assert _axis_strides() - now <= shown and {OLD_FRAGMENT_STRIDES, OLD_TMEM_STRIDES} <= shown
    assert now <= _axis_strides() and not now & shown


def test_the_worked_cases_are_right():
    """The notebook's worked elements are what the references (checked against the library in
    tests/lab3_layout_swizzle) give, and the lecture's examples of a tiling and of named axes are
    what it says they are, and not the graded layouts."""
    from tvm.tirx.layout import S, TCol, TileLayout, TLane, laneid, tid_in_wg
    assert lab3.ref_swizzled(10, 21, (64, 64), 2, 128) == 645
    assert (10 * 64 + 21) * 2 == 1322 and 1322 // 16 == 82 and (82 ^ 2) * 16 + 1322 % 16 == 1290
    assert lab3.ref_mma(3, 70, (16, 128), 2, 128) == 1246 and 16 * 64 + 3 * 64 + 6 == 1222
    text = transfer_text.flat(transfer_text.lecture(LAB))
    assert "S[(4, 2, 2, 4) : (8, 4, 32, 1)]" in text and "column-major among themselves" in text
    for r in range(8):
        for c in range(8):     # 2 x 4 sub-tiles, column-major among themselves, row-major inside
            assert _apply((4, 2, 2, 4), (8, 4, 32, 1), r, c, 8) == 8 * (r // 2 + 4 * (c // 4)) + 4 * (r % 2) + c % 4
    fragment = TileLayout(S[(4, 2, 8) : (1 @ laneid, 1, 4 @ laneid)])
    assert "TileLayout(S[(4, 2, 8) : (1 @ laneid, 1, 4 @ laneid)])" in text
    assert '`layout.apply(5, 3, shape=[8, 8])` returns `{"laneid": 14, "m": 1}`' in text
    got = {(r, c): lab3.evaluate(fragment, r, c, (8, 8)) for r in range(8) for c in range(8)}
    assert all(got[r, c] == lab3._nonzero({"laneid": 4 * c + r // 2, "m": r % 2}) for r, c in got)
    assert any(got[r, c] != lab3._nonzero(lab3.ref_fragment(r, c)) for r, c in got)
    assert "`S[(64, 128) : (1, 1 @ tid_in_wg)]`" in text and "`S[(64, 128) : (1 @ TCol, 1 @ TLane)]`" in text
    by_cols = TileLayout(S[(64, 128) : (1, 1 @ tid_in_wg)])
    transposed = TileLayout(S[(64, 128) : (1 @ TCol, 1 @ TLane)])
    for r, c in ((0, 0), (5, 3), (63, 127), (17, 90)):
        assert lab3.evaluate(by_cols, r, c, (64, 128)) == lab3._nonzero({"tid_in_wg": c, "m": r})
        assert lab3.evaluate(transposed, r, c, (64, 128)) == lab3._nonzero({"TLane": c, "TCol": r})


def check_no_code_cell_prints_a_graded_layout(root=transfer_text.ROOT):
    """The notebook's own cells print no layout that a graded part asks for: the swizzle numbers
    of `layout_swizzled` (a ComposeLayout printed whole) and the tiled 8 x 8 layout of
    `layout_tiled` (a student trial read both off the printed output)."""
    for folder in ("solutions", "assignments"):
        code = [transfer_text.source(c) for c in transfer_text.cells(LAB, folder, root) if c["cell_type"] == "code"]
        prints = [ln.strip() for cell in code for ln in cell.splitlines() if ln.strip().startswith("print(")]
        for ln in prints:
            assert not ("mma_shared_layout(" in ln and not ln.endswith(".tile_layout)")), ln
            assert ln != "print(tiled)", ln


def test_no_code_cell_prints_a_graded_layout():
    check_no_code_cell_prints_a_graded_layout()


def test_the_print_check_fails_on_the_notebook_that_printed_them(tmp_path):
    path = f"assignments/{LAB}/{LAB}.ipynb"
    os.makedirs(tmp_path / "assignments" / LAB)
    (tmp_path / path).write_text(transfer_text.old_text("7872a59", path))
    os.makedirs(tmp_path / "solutions" / LAB)
    with open(os.path.join(transfer_text.ROOT, "solutions", LAB, f"{LAB}.ipynb")) as f:
        (tmp_path / "solutions" / LAB / f"{LAB}.ipynb").write_text(f.read())
    with pytest.raises(AssertionError):
        check_no_code_cell_prints_a_graded_layout(str(tmp_path))

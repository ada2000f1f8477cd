"""Lab 2 teaches its mechanisms on problems other than the graded ones.

The lecture's complete kernels (a fused add and ReLU of two bf16 tiles, and a persistent fp32 to
bf16 stream through a ring) must compile for sm_90a to the TMA, mbarrier and bulk-group
instructions the graded kernels need, without being the graded problem (one fp16 64 x 128 tile,
`alpha * x + beta`). The notebook states the contract of parts d and e and points to the lecture,
without spelling out the graded calls; the lecture lists what the student works out."""
import json
import linecache
import re

import pytest
import transfer_text

from grader import build, spec
from grader.labs.build_checks import maps_of_plan

LAB = "lab2_tma"
PRELUDE = """
import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.tile_primitive.tma_utils import mma_shared_layout, SwizzleMode
from tvm.tirx.layout import TileLayout, S, TLane, TCol, tid_in_wg
from tvm.backend.cuda.lang.pipeline import TMABar, TCGen05Bar, MBarrier, PipelineState
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D
"""
COMPILES = re.compile(r"```python\n(# Compiles as it is for (sm_\w+)[^\n]*\n.*?)```", re.S)
# The calls of the graded reference kernels that the old notebook text spelled out.
GRADED_CALLS = ["move_base_to", "mbarrier.init", "fence.mbarrier_init", "arrive.expect_tx(", "try_wait",
                "fence.proxy_async", "commit_group", "wait_group", "bar.sync", "Tx.copy(", "ptr_to",
                "cta_sync", "mbarrier.arrive("]


def _section(text, title):
    """The body of the section `title` (the heading left out) up to the next heading of its level."""
    start = text.index(title)
    level = re.match(r"#+", title).group(0)
    rest = text[start + len(title):]
    end = re.search(rf"^{level} ", rest, re.M)
    return rest[:end.start()] if end else rest


def _kernels(text=None):
    return {re.search(r"@T\.prim_func\ndef (\w+)\(", block).group(1): (arch, block)
            for block, arch in COMPILES.findall(transfer_text.lecture(LAB) if text is None else text)}


def _compile(name):
    arch, source = _kernels()[name]
    text, filename = PRELUDE + source, f"<lecture kernel {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns = {}
    exec(compile(text, filename, "exec"), ns)
    return build.compile_only(ns[name], arch, want_sass=True)


def test_no_lecture_kernel_is_the_graded_problem():
    blocks = transfer_text.code_blocks(transfer_text.lecture(LAB))
    kernels = [b for b in blocks if "T.prim_func" in b or "copy_async" in b]
    assert len(kernels) >= 2
    for block in kernels:
        assert "build_tma_tile" not in block and "build_tma_stream" not in block
        assert not re.search(r"def (tma_tile|tma_stream)\(", block)
        # the graded tile: fp16, 64 x 128
        assert not ('"float16"' in block and re.search(r"\b64,\s*128\b", block)), block[:300]
        assert "alpha" not in block


# What the subsection asks per graded step: questions that name a decision, without its answer.
QUESTIONS = ("how many bytes must the single `expect_tx` announce", "Does a tile at the edge of the tensor change",
             "Which box, 2D or 3D, do you therefore expect", "how many does each thread own?",
             "which row and which column does it start at", "where do the conversions go",
             "how many times is each result rounded?", "what must it wait for before the CTA may exit?",
             "Which conditions on `tid` select each role", "which consumer issues the stores",
             "how many arrivals does each `full` and each `empty` barrier expect",
             "Which chunk mapping do the consumers then use", "must be written in terms of it",
             "which buffer does iteration `it` write", "what argument must the storing thread pass to `wait_group`",
             "how many CTAs does the grid launch", "How much shared memory do the stages")
# The answers the subsection used to give for parts d and e.
ANSWERS = ("single 64 × 128 fp16", "two 128 × 64 bf16 tiles", "16 chunks per row, not 8", "i * 128 + tid",
           "first thread of warp 4", "warps 0 to 3", "Two output buffers, not three", "4 by default",
           "min(tiles, NUM_CTAS)", "plus two output tiles", "chunk mapping is part d's",
           "nothing may assume three stages", "evaluated in fp32 and rounded once")
# The sentences elsewhere that handed part a's 3D tensor map of the graded fp16 tile over.
ELSEWHERE = ("(64, M, N / 64)", "(2N, 128)", "(64, rows, 2)", "of a 64 x 128 fp16 tile")


def check_the_subsection_asks(text):
    asks = _section(text, "## What the lab asks")
    assert "### What you work out yourself" in asks
    own = _section(asks, "### What you work out yourself")
    assert "build_tma_tile" in own and "build_tma_stream" in own
    assert "Part d" in own and "Part e" in own
    bullets = transfer_text.bullets(own)
    assert len(bullets) >= 10, len(bullets)
    assert all("?" in b for b in bullets), [b[:60] for b in bullets if "?" not in b]
    flat = transfer_text.flat(own)
    for question in QUESTIONS:
        assert question in flat, question
    for answer in ANSWERS:
        assert answer not in flat, answer
    whole = transfer_text.flat(text)
    for answer in ELSEWHERE:
        assert answer not in whole, answer


def test_the_lecture_lists_what_each_graded_step_leaves_to_the_student():
    text = transfer_text.lecture(LAB)
    check_the_subsection_asks(text)
    # the sections the notebook points to, and the one grader/hints.py names
    for title in ("## The round trip in TIRx", "## A ring of stages", "## Storing with TMA",
                  "## Thread barriers", "## Swizzling, the 128-byte inner box and 3D boxes"):
        assert title in text, title
    # the 3D view is taught as the general rule, on the ring example's fp32 tile (see below)
    check_the_3d_view_is_asked(text)


def test_the_subsection_check_fails_on_the_lecture_that_answered():
    """The subsection as it was (byte count, chunk mapping, roles, buffer count and grid of the
    graded kernels spelled out) fails the check, and each listed answer was in it."""
    old = transfer_text.old_text("d1b9b34", f"lectures/{LAB}/index.md")
    with pytest.raises(AssertionError):
        check_the_subsection_asks(old)
    flat = transfer_text.flat(old)
    for answer in ANSWERS + ELSEWHERE:
        assert answer in flat, answer


@pytest.mark.parametrize("folder", ["solutions", "assignments"])
def test_the_notebook_states_the_contract_without_the_graded_calls(folder):
    cells = transfer_text.cells(LAB, folder)
    for part, grade_id in (("## Part d", "d_kernel"), ("## Part e", "e_kernel")):
        md = next("".join(c["source"]) for c in cells
                  if c["cell_type"] == "markdown" and "".join(c["source"]).startswith(part))
        assert "Contract" in md or "contract" in md
        assert "lecture" in md
        for call in GRADED_CALLS:
            assert call not in md, (part, call)
        code = next("".join(c["source"]) for c in cells
                    if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)
        comments = "\n".join(ln for ln in code.splitlines() if ln.strip().startswith("#"))
        for call in GRADED_CALLS:
            assert call not in comments, (grade_id, call)


def test_the_round_trip_example_compiles_to_tma_load_store_and_expect_tx():
    assert _kernels()["add_relu_tile"][0] == "sm_90a"
    art = _compile("add_relu_tile")
    ptx = art.ptx
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\S*complete_tx", ptx)) == 2
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ptx)
    assert "mbarrier.arrive.expect_tx" in ptx and "fence.proxy.async" in ptx
    assert ptx.count("ld.shared.v4") == 8 and ptx.count("st.shared.v4") == 4
    assert "arrive_expect_tx_shared((&(((uint64_t*)pool_buf_ptr)[0])), 32768)" in art.cuda_source
    assert art.sass.count("UTMALDG.2D") == 2 and "UTMASTG.2D" in art.sass
    maps = maps_of_plan(art.plan)
    assert sorted(m["tensor"] for m in maps) == ["OUT", "X", "Y"]
    assert all(m["rank"] == 2 and m["box_dims"] == (64, 128) and m["swizzle"] == 3 for m in maps)


def test_the_ring_example_compiles_to_a_persistent_producer_consumer_stream():
    assert _kernels()["downcast_stream"][0] == "sm_90a"
    art = _compile("downcast_stream")
    src, ptx = art.cuda_source, art.ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.shared::cluster\.global\S*complete_tx", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ptx)
    assert "cp.async.bulk.wait_group.read 2" in ptx and "cp.async.bulk.wait_group 0" in ptx
    assert src.count("tvm_builtin_ptx_bar_sync(1, 128)") == 2
    # the loops over a CTA's tiles run on the GPU, and each role keeps a stage index and a phase
    # bit (the producer's from 1, the consumers' from 0) that flips on every wrap: no closed form
    assert src.count("for (int it") == 2
    assert "ring_ptr[1] = 1;" in src and "ring_ptr_1[1] = 0;" in src
    assert "ring_ptr[1] = (ring_ptr[1] ^ 1);" in src and "ring_ptr_1[1] = (ring_ptr_1[1] ^ 1);" in src
    assert "[(ring_ptr[0] + 3)])), ring_ptr[1]);" in src and "[ring_ptr_1[0]])), ring_ptr_1[1]);" in src
    assert "% 6" not in src and "/ 3)" not in src
    assert "LDL" not in art.sass and "STL" not in art.sass
    assert "mbarrier_init((&(((uint64_t*)pool_buf_ptr)[3])), 128)" in src
    assert "UTMALDG.3D" in art.sass and "UTMASTG.2D" in art.sass
    maps = {m["tensor"]: m for m in maps_of_plan(art.plan)}
    assert maps["X"]["rank"] == 3 and maps["X"]["box_dims"] == (32, 64, 2)
    assert maps["OUT"]["rank"] == 2 and maps["OUT"]["box_dims"] == (64, 64)
    assert all(m["swizzle"] == 3 for m in maps.values())


# ---- The give-aways a student trial found after the subsection was turned into questions -------
OLD = "c5ed0b3"   # the commit whose lecture and notebook still stated them


# Part c's closed form, in the prose or in the ring example's waits.
PARITY_FORMS = ("(k // S) % 2", "(it // RING) % 2", "(it // 3) % 2", "((it // RING) % 2) ^ 1", "XOR 1",
                "((it % 6) / 3)", "(it & 7) >> 2")


def check_the_ring_parities_are_asked(text):
    flat = transfer_text.flat(text)
    for answer in PARITY_FORMS:
        assert answer not in flat, answer
    ring = transfer_text.flat(_section(text, "## A ring of stages"))
    # the mechanism: phases flip on completion, where the barriers start, why the producer's first
    # wait passes at once; then the closed form as a question
    for point in ("every completion moves it to the next phase", "Both barriers start in phase 0",
                  "must pass at once", "wraps from `S - 1` back to 0",
                  "Part c asks for the closed form", "as expressions of `k` and `S`?"):
        assert point in ring, point
    _, block = _kernels(text)["downcast_stream"]
    assert "it // RING" not in block and "it % RING" not in block
    assert block.count("ring[1] = ring[1] ^ 1") == 2 and "ring[1] = 1" in block and "ring[1] = 0" in block


def test_the_ring_parities_are_asked_not_answered():
    check_the_ring_parities_are_asked(transfer_text.lecture(LAB))


def test_the_parity_check_fails_on_the_lecture_that_answered():
    old = transfer_text.old_text(OLD, f"lectures/{LAB}/index.md")
    assert "(k // S) % 2" in transfer_text.flat(old) and "(it // RING) % 2" in old
    with pytest.raises(AssertionError):
        check_the_ring_parities_are_asked(old)


def check_the_3d_view_is_asked(text):
    flat = transfer_text.flat(text)
    assert "`(col % W, row, col // W)`" in flat
    for answer in ("(32, M, N / 32)", "(4N, 128)", "4N", "N / 32"):
        assert answer not in flat, answer
    for point in ("twice the swizzle span", "no single 2D box can hold the tile",
                  "how many bytes apart in memory are two elements that differ by one in `row` only"):
        assert point in flat, point


def test_the_3d_view_check_fails_on_the_lecture_that_filled_it_in():
    old = transfer_text.old_text(OLD, f"lectures/{LAB}/index.md")
    assert "`(32, M, N / 32)` with byte strides `(4N, 128)`" in transfer_text.flat(old)
    with pytest.raises(AssertionError):
        check_the_3d_view_is_asked(old)


def check_the_wait_group_argument_is_asked(lecture, markdown):
    flat, md = transfer_text.flat(lecture), transfer_text.flat(markdown)
    for answer in ("wait_group(OUTS - 1)", "OUTS - 1", "it - OUTS"):
        assert answer not in flat, answer
    assert "wait_group(1)" not in md and "wait_group(1)" not in flat
    assert "Which argument to `wait_group` makes sure the buffer about to be overwritten has been read" in md
    assert "what argument must the storing thread pass to `wait_group`" in flat


@pytest.mark.parametrize("folder", ["solutions", "assignments"])
def test_the_wait_group_argument_is_asked(folder):
    check_the_wait_group_argument_is_asked(transfer_text.lecture(LAB),
                                           transfer_text.markdown(transfer_text.cells(LAB, folder)))


def test_the_wait_group_check_fails_on_the_text_that_gave_it():
    lecture = transfer_text.old_text(OLD, f"lectures/{LAB}/index.md")
    notebook = transfer_text.old_text(OLD, f"solutions/{LAB}/{spec.load(LAB).notebook}")
    markdown = transfer_text.markdown(json.loads(notebook)["cells"])
    assert "wait_group(OUTS - 1)" in lecture and "wait_group(1)" in markdown
    with pytest.raises(AssertionError):
        check_the_wait_group_argument_is_asked(lecture, markdown)
    with pytest.raises(AssertionError):
        check_the_wait_group_argument_is_asked(transfer_text.lecture(LAB), markdown)


def check_the_shared_memory_is_asked(markdown, lecture):
    md, flat = transfer_text.flat(markdown), transfer_text.flat(lecture)
    for answer in ("97 KiB", "so two CTAs fit", "where only one CTA fits", "(it & 7) >> 2"):
        assert answer not in md, answer
    (contract,) = [b for b in md.split("- **") if b.startswith("Shared memory**")]
    assert "nothing checks its size" in contract and "?" in contract
    assert "how many CTAs of that size fit on an SM" in contract
    assert "How many CTAs fit on an SM with `stages = 8`" in md
    # the lecture's Little's-law paragraph leaves the sum to the student
    assert "while fitting in the 228 KiB" not in flat and "is a sum to do" in flat


@pytest.mark.parametrize("folder", ["solutions", "assignments"])
def test_the_shared_memory_is_asked(folder):
    check_the_shared_memory_is_asked(transfer_text.markdown(transfer_text.cells(LAB, folder)),
                                     transfer_text.lecture(LAB))


def test_the_shared_memory_check_fails_on_the_contract_that_stated_it():
    notebook = transfer_text.old_text(OLD, f"solutions/{LAB}/{spec.load(LAB).notebook}")
    markdown = transfer_text.markdown(json.loads(notebook)["cells"])
    assert "about 97 KiB, so two CTAs fit on an SM" in transfer_text.flat(markdown)
    with pytest.raises(AssertionError):
        check_the_shared_memory_is_asked(markdown, transfer_text.lecture(LAB))
    with pytest.raises(AssertionError):
        check_the_shared_memory_is_asked(transfer_text.markdown(transfer_text.cells(LAB, "solutions")),
                                         transfer_text.old_text(OLD, f"lectures/{LAB}/index.md"))


def check_no_code_cell_prints_tvms_tensor_map(root=transfer_text.ROOT):
    """The cell after part d says whether TVM's tensor maps agree with the student's
    `tensor_map_3d`, field by field, and prints none of TVM's fields (a student trial read part a's
    answer for that shape off the printed map)."""
    for folder in ("solutions", "assignments"):
        code = [transfer_text.source(c) for c in transfer_text.cells(LAB, folder, root) if c["cell_type"] == "code"]
        viewer = [cell for cell in code if "tensor_maps(build_tma_tile" in cell]
        assert len(viewer) == 1, (folder, len(viewer))
        prints = [ln.strip() for ln in viewer[0].splitlines() if ln.strip().startswith("print(")]
        assert "'agrees' if" in viewer[0], folder
        assert "print(m)" not in prints and not any("tensor_map_3d(" in ln or "mine" in ln for ln in prints), prints


def test_no_code_cell_prints_tvms_tensor_map():
    check_no_code_cell_prints_tvms_tensor_map()


def test_the_tensor_map_check_fails_on_the_notebook_that_printed_it(tmp_path):
    import os
    for folder in ("solutions", "assignments"):
        path = f"{folder}/{LAB}/{LAB}.ipynb"
        os.makedirs(tmp_path / folder / LAB)
        (tmp_path / path).write_text(transfer_text.old_text("c5dee89", path))
    with pytest.raises(AssertionError):
        check_no_code_cell_prints_tvms_tensor_map(str(tmp_path))

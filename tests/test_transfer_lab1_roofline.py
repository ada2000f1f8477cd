"""Lab 1, part b: the lecture teaches the first kernel and 16-byte vectorization on operations other
than the graded scale-add (a leaky ReLU over fp16, a clamp over fp32), says what the graded kernel
leaves to the student, and the notebook states the contract of ``build_scale_add`` without
spelling out its code, its lane count or its grid."""
import re

import pytest
import transfer_text

LAB = "lab1_roofline"
# Lines of the graded kernel that every 1-D streaming kernel of the course writes the same way.
GENERIC = {"forvinT.unroll(VECS):", "tid=T.thread_id([THREADS])", "cta=T.cta_id([n//TILE])",
           "TILE=THREADS*VECS*LANES", "THREADS=256", "VECS=4"}


def _kernel_cell(folder):
    (cell,) = transfer_text.graded_cells(LAB, folder, ("b_kernel",))
    return cell


def _graded_lines():
    """The statement lines of the reference build_scale_add (inside its solution regions), comments
    and spaces dropped."""
    return transfer_text.region_lines([_kernel_cell("solutions")])


def test_no_lecture_code_block_is_the_graded_kernel():
    blocks = transfer_text.code_blocks(transfer_text.lecture(LAB))
    text = "\n".join(blocks)
    for name in ("def build_scale_add(", "def scale_add(", "def build_scale_add_scalar("):
        assert name not in text, name
    for giveaway in ('"float16x8"', "alpha * T.Cast", "Y.vload(", "Y[i]"):
        assert giveaway not in text, giveaway
    graded = _graded_lines() - GENERIC
    assert len(graded) >= 8, sorted(graded)        # the reading of the regions works
    shown = {transfer_text.squash(ln) for b in blocks for ln in b.splitlines()}
    assert not graded & shown, sorted(graded & shown)


def test_the_lecture_says_what_the_student_works_out_for_each_step():
    text = transfer_text.lecture(LAB)
    asks = transfer_text.section(text, "## What the lab asks you to do")
    sub = transfer_text.section(asks, "### What you work out yourself")
    assert "build_scale_add" in sub
    for step in ("**Sizes and grid.**", "**Loads.**", "**Compute.**", "**Stores.**"):
        assert step in sub, step
    flat = transfer_text.flat(sub)
    for question in ("How many fp16 elements make one 16-byte vector", "two inputs", "In which type does the "
                     "arithmetic happen", "128-bit stores as well as loads"):
        assert question in flat, question
    # questions, not answers: the graded kernel's numbers and its recipe are not handed over
    for answer in ("float16x8", "eight", "8 lanes", "round to fp16 once", "Widen each lane", "8192"):
        assert answer not in flat, answer


def test_the_notebook_states_the_contract_without_the_code():
    markdown = transfer_text.markdown(transfer_text.cells(LAB, "assignments"))
    (part_b,) = [s for s in markdown.split("\n## ") if s.startswith("Part b")]
    for contract in ("kernel(x, y, out, alpha)", "multiple of 65536", "128-bit", "0.90×", "What you work out yourself"):
        assert contract in part_b, contract
    given = _kernel_cell("assignments")
    for text in (markdown, given):
        for giveaway in ('dtype="float16x8"', "alpha * T.Cast", "v * THREADS + tid", "(v * THREADS", "LANES = 8",
                         "T.cta_id(", "T.alloc_local(", ".vload(", ".vstore("):
            assert giveaway not in text, giveaway
    graded = _graded_lines() - GENERIC
    assert not {transfer_text.squash(ln) for ln in given.splitlines()} & graded


def test_the_lecture_kernels_are_other_operations():
    from test_thin_spots import lecture_kernels
    mine = {(name, arch) for lab, name, arch, _ in lecture_kernels() if lab == LAB}
    assert mine == {("leaky_relu", "sm_90a"), ("clamp", "sm_90a")}, mine


@pytest.mark.slow
def test_the_lecture_kernels_compile_to_what_the_lecture_says():
    from test_thin_spots import _compile, lecture_kernels
    kernels = {name: (arch, src) for lab, name, arch, src in lecture_kernels() if lab == LAB}

    arch, src = kernels["leaky_relu"]
    art = _compile(src, "leaky_relu", arch)
    assert len(re.findall(r"ld\.global\.nc\.u16", art.ptx)) == 1      # X[i] twice in the CUDA, one load
    assert art.cuda_source.count("X_ptr[") >= 2
    assert "st.global.u16" in art.ptx and "cvt.rn.f16.f32" in art.ptx
    assert "LDG.E.U16.CONSTANT" in art.sass and "STG.E.U16" in art.sass and ".128" not in art.sass

    arch, src = kernels["clamp"]
    for target in (arch, "sm_100a"):
        art = _compile(src, "clamp", target)
        assert len(re.findall(r"\bLDG\.E\.128\b", art.sass)) == 4, target
        assert len(re.findall(r"\bSTG\.E\.128\b", art.sass)) == 4, target
        assert "LDL" not in art.sass and "STL" not in art.sass, target
        assert art.plan["launches"][0]["grid"] == [256, 1, 1] and art.plan["launches"][0]["block"] == [256, 1, 1]
    art = _compile(src, "clamp", arch)
    assert len(re.findall(r"ld\.global\.nc\.v4\.f32", art.ptx)) == 4 and len(re.findall(r"st\.global\.v4\.f32", art.ptx)) == 4
    assert len(re.findall(r"\bFMNMX\b", art.sass)) == 32
    offsets = re.findall(r"LDG\.E\.128\S*\s+R\d+, desc\[\w+\]\[R\d+\.64(?:\+(0x[0-9a-f]+))?\]", art.sass)
    assert sorted(int(o or "0", 16) for o in offsets) == [0, 4096, 8192, 12288], offsets


# The old sentence that gave the graded type's lane count next to the rule ("eight of a 2-byte type").
LANE_ANSWERS = ("eight of a 2-byte type", "2-byte type", "eight lanes", "8 lanes", "x8")
OLD = "c5ed0b3"   # the commit whose lecture still stated the lane count of a 2-byte type


def _bullet(text, title):
    flat = transfer_text.flat(text)
    start = flat.index(title)
    end = flat.find("- **", start + len(title))
    return flat[start:end if end > 0 else len(flat)]


def check_the_lane_rule_is_stated_on_fp32_only(text):
    """The rule (16 bytes hold 16 / element size values) worked on the lecture's fp32, and the
    lane count of a 2-byte type left to the student."""
    bullet = _bullet(text, "**Vector values.**")
    assert "16 divided by the element size" in bullet and "16 / 4 = 4" in bullet, bullet
    for answer in LANE_ANSWERS:
        assert answer not in bullet, answer
    assert "2-byte type" not in transfer_text.flat(text)


def test_the_lane_rule_is_stated_on_fp32_only():
    check_the_lane_rule_is_stated_on_fp32_only(transfer_text.lecture(LAB))


def test_the_lane_rule_check_fails_on_the_lecture_that_gave_the_count():
    old = transfer_text.old_text(OLD, f"lectures/{LAB}/index.md")
    assert "eight of a 2-byte type" in transfer_text.flat(old)
    with pytest.raises(AssertionError):
        check_the_lane_rule_is_stated_on_fp32_only(old)

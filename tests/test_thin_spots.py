"""Labs 4 to 6: every part a student can run gives a verdict in the student edition (the SASS
accumulator-hazard parts included), the course shows every TIRx call the graded kernels need, and
the lectures and notebooks say what is true of phases, TMEM lanes, paired stores and grids."""
import itertools
import json
import os
import re
import subprocess
import sys
import types

import pytest
from conftest import edit_notebook, import_notebook
from test_release import _check_in_edition, _paste_reference

from grader import build, inputs, spec
from grader.context import Context
from grader.edition import release, tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABS = ("lab4_gemm", "lab5_gemm_pipeline", "lab6_flash_attention")
WAIT_IN_LOOP = {"T.ptx.wgmma.wait_group(0)": "T.ptx.wgmma.wait_group(1)"}   # an accumulator hazard


def _lecture(lab):
    with open(os.path.join(ROOT, "lectures", lab, "index.md")) as f:
        return f.read()


def _markdown(folder, lab):
    with open(os.path.join(ROOT, folder, lab, spec.load(lab).notebook)) as f:
        nb = json.load(f)
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def _flat(text):
    return re.sub(r"\s+", " ", text)


# ---------------------------------------------------------------- 1. the SASS parts in the student edition

def test_the_release_grades_sass_hazard_with_shipped_code():
    """Recording the tables: Labs 4 and 5's sass_hazard are graded by the course grader's own check,
    grader/labs/build_checks.py, which the edition ships, not left to the course grader."""
    for lab in ("lab4_gemm", "lab5_gemm_pipeline"):
        table = release.record_lab(lab, progress=lambda *a: None)
        assert table["shipped"].get("sass_hazard") == "grader.labs.build_checks:accumulator_hazard", table["shipped"]
        assert "sass_hazard" not in table["course_grader_only"]


def test_the_readme_names_only_the_parts_the_edition_cannot_check():
    assert release._course_only({"lab4_gemm": {"course_grader_only": []}}) == ""
    said = release._course_only({"lab4_gemm": {"course_grader_only": ["x_part"]}})
    assert "`lab4_gemm/x_part`" in said and tables.COURSE_GRADER_ONLY in said


def _ctx(lab, part):
    from grader import hardware
    lab_spec = spec.load(lab)
    device = hardware.Device(False, "", None, "", "test")
    return Context(lab_spec, lab_spec.part(part), inputs.PUBLIC_SEED, device, public_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("lab,variant", [("lab4_gemm", None), ("lab4_gemm", "hazard"),
                                         ("lab5_gemm_pipeline", None), ("lab5_gemm_pipeline", "hazard")])
def test_the_sass_check_passes_the_reference_and_fails_an_early_accumulator_read(lab, variant, tmp_path):
    """The reference, and a reference whose K loop waits with wait_group(1) (an early read)."""
    import importlib
    nb = os.path.join(ROOT, "solutions", lab, spec.load(lab).notebook)
    if variant:
        nb = edit_notebook(nb, str(tmp_path / "nb" / os.path.basename(nb)), WAIT_IN_LOOP)
    module = import_notebook(nb, tmp_path, f"thin_spots_{lab}_{variant}")
    out = importlib.import_module(f"grader.labs.{lab}").GRADERS["sass_hazard"](module, _ctx(lab, "sass_hazard"))
    assert (out.fraction == 0) == bool(variant), out.message
    if variant:
        assert out.message.startswith("accumulator hazard:"), out.message


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    dest = tmp_path_factory.mktemp("thin-spots-edition") / "course"
    proc = subprocess.run([sys.executable, "-m", "grader", "release", str(dest)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return str(dest)


@pytest.mark.slow
def test_sass_hazard_is_checked_in_the_student_edition(edition, tmp_path):
    assert os.path.isfile(os.path.join(edition, "grader", "labs", "build_checks.py"))
    for lab in ("lab4_gemm", "lab5_gemm_pipeline"):
        with open(os.path.join(edition, "grader", "public", f"{lab}.json")) as f:
            table = json.load(f)
        assert "sass_hazard" in table["shipped"] and "sass_hazard" not in table["course_grader_only"], lab
        pasted = _paste_reference(ROOT, edition, lab, str(tmp_path / lab))
        good = _check_in_edition(edition, pasted, lab, ["sass_hazard"])["sass_hazard"]
        assert good[0] == "passed", good
        assert "no accumulator read before the wgmma wait" in good[1], good
    lab = "lab4_gemm"
    hazard = edit_notebook(_paste_reference(ROOT, edition, lab, str(tmp_path / "hazard-src")),
                           str(tmp_path / "hazard" / spec.load(lab).notebook), WAIT_IN_LOOP)
    bad = _check_in_edition(edition, hazard, lab, ["sass_hazard"])["sass_hazard"]
    assert bad[0].startswith("raised") and "accumulator hazard" in bad[1], bad
    with open(os.path.join(edition, "README.md")) as f:
        readme = f.read()
    assert tables.COURSE_GRADER_ONLY not in readme     # no part of any lab is left unchecked


# ---------------------------------------------------------------- 2. every TIRx call is shown

def _calls(code):
    """The TIRx calls (``T.x.y(``, ``Tx.z(``), the methods of TIRx's pipeline and scheduler
    objects, and the keyword arguments that kernel code uses."""
    names = set(re.findall(r"\b((?:T|Tx)\.[A-Za-z_][\w.]*)\s*\(", code))
    names |= {"." + m for m in re.findall(
        r"\.(remote_view|advance|next_tile|valid|arrive|wait|init|ptr_to|vstore|vload|view)\(", code)}
    names |= set(re.findall(r"\b(TMABar|TCGen05Bar|MBarrier|PipelineState|ClusterPersistentScheduler2D)\(", code))
    names |= {k + "=" for k in re.findall(r"[(,]\s*(cta_group|cta_mask|remote|mbar|dispatch|accum|num_clusters|"
                                          r"num_m_tiles|num_n_tiles|l2_group_size|phase|n_cols|allocated_addr)=", code)}
    return names


def _course_text():
    """What a student is shown: every lecture, and every cell of every student notebook."""
    texts = []
    for lab in spec.lab_names():
        texts.append(_lecture(lab))
        with open(os.path.join(ROOT, "assignments", lab, spec.load(lab).notebook)) as f:
            texts += ["".join(c["source"]) for c in json.load(f)["cells"]]
    return "\n".join(texts)


@pytest.mark.parametrize("lab", LABS)
def test_every_tirx_call_of_the_graded_kernels_is_shown_in_the_course(lab):
    inside, _ = release.regions(os.path.join(ROOT, "solutions", lab, spec.load(lab).notebook))
    needed = _calls("\n".join(inside))
    assert len(needed) > 20, sorted(needed)
    shown = _course_text()
    assert not sorted(n for n in needed if n not in shown), sorted(n for n in needed if n not in shown)


def test_the_lab5_lecture_shows_the_attribute_clusters_remote_arrives_and_the_pair_mma():
    text = _lecture("lab5_gemm_pipeline")
    for spelling in ['T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})', "T.cta_id_in_cluster([2])",
                     "T.cuda.cluster_sync()", "remote=1 - rank", ".remote_view(0)", "cta_mask=0b11",
                     'dispatch="tcgen05", cta_group=2)', "n_cols=256, cta_group=2)",
                     "ClusterPersistentScheduler2D(", ".advance()", ".next_tile()"]:
        assert spelling in text, spelling
    notebook = _markdown("assignments", "lab5_gemm_pipeline")
    assert 'T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})' in notebook


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


def lecture_kernels():
    """(lab, name, arch, source) of every code block of the lectures that says it compiles as it is."""
    found = []
    for lab in spec.lab_names():
        for block, arch in COMPILES.findall(_lecture(lab)):
            name = re.search(r"@T\.prim_func\ndef (\w+)\(", block).group(1)
            found.append((lab, name, arch, block))
    return found


# A listing that takes the student's answer to a part (Lab 4's frag_dump: the descriptor fields
# of part a) compiles here with the reference answer.
ANSWERS = {"wgmma_desc_fields(": "from grader.labs.lab4_gemm import ref_desc_fields as wgmma_desc_fields\n"}


def _compile(source, name, arch):
    import linecache
    answers = "".join(imp for call, imp in ANSWERS.items() if call in source)
    text, filename = PRELUDE + answers + source, f"<lecture kernel {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)   # TIRx reads the source
    ns = {}
    exec(compile(text, filename, "exec"), ns)
    return build.compile_only(ns[name], arch, want_sass=True)


def test_the_lectures_complete_kernels_are_the_ones_listed():
    assert {(lab, name, arch) for lab, name, arch, _ in lecture_kernels()} == {
        ("lab5_gemm_pipeline", "two_roles", "sm_90a"), ("lab5_gemm_pipeline", "handshake", "sm_90a"),
        ("lab5_gemm_pipeline", "pair_tile", "sm_100a"), ("lab5_gemm_pipeline", "ring_sumsq", "sm_90a"),
        ("lab6_flash_attention", "turns", "sm_90a"), ("lab6_flash_attention", "lse_pairs", "sm_90a"),
        ("lab6_flash_attention", "chained_tile", "sm_100a"),
        ("lab1_roofline", "leaky_relu", "sm_90a"), ("lab1_roofline", "clamp", "sm_90a"),
        ("lab2_tma", "add_relu_tile", "sm_90a"), ("lab2_tma", "downcast_stream", "sm_90a"),
        ("lab3_layout_swizzle", "row_sums", "sm_90a"),
        ("lab4_gemm", "relu_tile", "sm_100a"), ("lab4_gemm", "frag_dump", "sm_90a")}


@pytest.mark.slow
def test_the_lectures_complete_kernels_compile_to_what_the_lectures_say():
    kernels = {name: (arch, src) for _, name, arch, src in lecture_kernels()}
    arch, src = kernels["two_roles"]
    art = _compile(src, "two_roles", arch)
    assert "__launch_bounds__(256, 1)" in art.cuda_source
    assert "USETMAXREG.DEALLOC" in art.sass and "USETMAXREG.TRY_ALLOC" in art.sass
    attr = 'T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})'
    bare = _compile("\n".join(ln for ln in src.splitlines() if attr not in ln), "two_roles", arch)
    assert "__launch_bounds__(256, 1)" not in bare.cuda_source and "USETMAXREG" not in bare.sass

    arch, src = kernels["handshake"]
    art = _compile(src, "handshake", arch)
    assert art.plan["launches"][0]["cluster"] == [2, 1, 1]
    assert "mapa.shared::cluster" in art.ptx and "mbarrier.arrive.shared::cluster" in art.ptx
    assert "barrier.cluster.arrive" in art.ptx and "barrier.cluster.wait" in art.ptx

    arch, src = kernels["pair_tile"]
    art = _compile(src, "pair_tile", arch)
    assert art.plan["launches"][0]["cluster"] == [2, 1, 1]
    assert re.search(r"UTC\w*MMA\S*\.2CTA", art.sass) and re.search(r"UTMALDG\S*\.2CTA", art.sass)
    assert "tcgen05.alloc.cta_group::2" in art.ptx and "tcgen05.mma.cta_group::2" in art.ptx
    assert re.search(r"tcgen05\.commit\.cta_group::2\S*multicast::cluster", art.ptx)

    arch, src = kernels["turns"]
    art = _compile(src, "turns", arch)
    assert "BAR.ARV" in art.sass and "BAR.SYNC" in art.sass and "VOTE.ANY" in art.sass

    # Lab 6: an fp16 view of TMEM columns, tcgen05.st of fp16 pairs, A read from TMEM, B K x N.
    arch, src = kernels["chained_tile"]
    art = _compile(src, "chained_tile", arch)
    mmas = [ln for ln in art.ptx.splitlines() if "tcgen05.mma" in ln]
    from_tmem = [ln for ln in mmas if re.search(r"tcgen05\.mma\S*\s+\[%r\d+\],\s*\[%r\d+\]", ln)]
    assert len(mmas) == 2 + 8 and len(from_tmem) == 8, mmas       # K = 32 from SMEM, K = 128 with A in TMEM
    assert len(re.findall(r"UTCHMMA tmem\[", art.sass)) == 8
    assert art.ptx.count("tcgen05.st.sync.aligned.32x32b.x16.b32") == 4
    assert "0 bytes spill stores" in art.ptxas_log


# ---------------------------------------------------------------- 2. a consumer that starts at phase 1

def _ring_outcomes(stages, loads, producer_start, consumer_start):
    """Every interleaving of one producer, the TMA loads it issues (each lands at any later
    moment) and one consumer, with mbarrier.try_wait.parity as the PTX ISA defines it: a wait for
    parity p returns while the barrier's completed-phase count c has c % 2 != p. Returns the set
    of outcomes: "ok" (all loads consumed, none early), "early" (all consumed, some consumer wait
    returned before its load landed) and "hang" (neither side can move)."""
    start = (0, 0, frozenset(), (0,) * stages, (0,) * stages, False)
    seen, todo, outcomes = {start}, [start], set()
    while todo:
        p, c, flying, full, empty, early = todo.pop()
        moves = []
        if p < loads:
            s, trips = p % stages, p // stages
            if empty[s] % 2 != (producer_start + trips) % 2:
                moves.append((p + 1, c, flying | {p}, full, empty, early))
        for g in flying:
            s = g % stages
            moves.append((p, c, flying - {g}, full[:s] + (full[s] + 1,) + full[s + 1:], empty, early))
        if c < loads:
            s, trips = c % stages, c // stages
            if full[s] % 2 != (consumer_start + trips) % 2:
                moves.append((p, c + 1, flying, full, empty[:s] + (empty[s] + 1,) + empty[s + 1:],
                              early or full[s] < trips + 1))
        if not moves:
            outcomes.add(("early" if early else "ok") if c == loads else "hang")
        for m in moves:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return outcomes


def test_consumers_that_start_at_phase_1_read_early_or_hang_depending_on_timing():
    assert _ring_outcomes(2, 6, 1, 0) == {"ok"}                 # the right convention, whatever the timing
    assert _ring_outcomes(2, 6, 1, 1) == {"early", "hang"}      # never right; which failure, timing decides
    assert _ring_outcomes(2, 6, 0, 0) == {"hang"}
    lecture = _flat(_lecture("lab5_gemm_pipeline"))
    bullet = lecture[lecture.index("**The consumers start at 1.**"):]
    bullet = bullet[:bullet.index("The same two outcomes")]
    assert "Nothing hangs" not in bullet
    for said in ("a hang", "wrong data", "depends on timing", "simulation"):
        assert said in bullet, said
    notebook = _flat(_markdown("assignments", "lab5_gemm_pipeline"))
    assert "try_wait.parity" in notebook and "depends on timing" in notebook
    assert "compute garbage" in notebook and "next wait hangs" in notebook and "the lecture says the same" in notebook


# ---------------------------------------------------------------- 3. loose ends of Lab 4

def test_no_lab4_kernel_calls_wgmma_desc_offset_and_the_texts_say_so():
    with open(os.path.join(ROOT, "solutions", "lab4_gemm", "lab4_gemm.ipynb")) as f:
        code = "\n".join("".join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "code")
    assert "wgmma_desc_fields(128)" in code and "wgmma_acc_coord(tid" in code     # the kernels call these
    assert re.findall(r"\bwgmma_desc_offset\(", code) == ["wgmma_desc_offset("]   # its definition alone
    notebook = _flat(_markdown("assignments", "lab4_gemm"))
    assert "yourself and use them in the kernels" not in notebook
    assert "no kernel calls it" in notebook
    lecture = _flat(_lecture("lab4_gemm"))
    assert "The kernels use your functions." not in lecture and "used by no kernel" in lecture


def test_s3_grid_has_no_partial_tile_and_says_so():
    from grader.labs import lab4_gemm
    part = spec.load("lab4_gemm").part("s3_grid")
    for seed, public_only in [(inputs.PUBLIC_SEED, True), (inputs.PUBLIC_SEED, False), (7, False), (12345, False)]:
        ctx = Context(spec.load("lab4_gemm"), part, seed, None, public_only=public_only)
        for kind, args in lab4_gemm.grid_cases(ctx):
            if kind == "info":
                M, N, K, bm, bn, bk = args
                assert M % bm == 0 and N % bn == 0 and K % bk == 0, args
            else:
                _, _, M, N, bm, bn = args
                assert M % bm == 0 and N % bn == 0, args
    assert "There is no partial tile" in _flat(_markdown("assignments", "lab4_gemm"))


@pytest.mark.slow
def test_the_paired_stores_into_the_swizzled_tile_are_one_sts_each(tmp_path):
    module = import_notebook(os.path.join(ROOT, "solutions", "lab4_gemm", "lab4_gemm.ipynb"), tmp_path,
                             "thin_spots_lab4_stores")
    art = build.compile_only(module.hopper_step4(256, 384, 256), "sm_90a", want_sass=True)
    # the CUDA source writes the two halves of a pair separately ...
    assert re.search(r"\(\(half\*\)\w+\)\[(\w+)\.x\] = (\w+)\.x;\s*\(\(half\*\)\w+\)\[\1\.y\] = \2\.y;",
                      art.cuda_source)
    # ... and the compiler merges them: one 4-byte shared store per pair, 64 per thread
    assert len(re.findall(r"st\.shared\.v2\.u16", art.ptx)) == 64
    sts = re.findall(r"\bSTS(\.\w+)*\b", art.sass)
    assert len(sts) == 64 and not any(sts), sts            # plain STS: 32 bits
    lecture = _flat(_lecture("lab4_gemm"))
    assert "one `st.shared.v2.u16` and the SASS one 32-bit `STS` per pair" in lecture
    assert "merges them into one 4-byte store" in _flat(_markdown("assignments", "lab4_gemm"))


@pytest.mark.slow
def test_every_warp_reads_tmem_with_the_same_address_and_the_lecture_says_why(tmp_path):
    module = import_notebook(os.path.join(ROOT, "solutions", "lab4_gemm", "lab4_gemm.ipynb"), tmp_path,
                             "thin_spots_lab4_tmem")
    art = build.compile_only(module.blackwell_step1(128, 128, 64), "sm_100a", want_sass=True)
    loads = re.findall(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x\d+\.b32 \{[^}]*\}, \[(%r\d+)\];", art.ptx)
    assert len(loads) == 1                                   # one instruction, executed by all four warps
    # its address is the allocation's base as tcgen05.alloc wrote it to shared memory: no warp offset
    assert re.search(r"ld\.shared\.b32\s+" + re.escape(loads[0]) + r", \[\w+\];", art.ptx), loads
    call = re.search(r"tvm_builtin_ptx_tcgen05_ld_32x32b_x\d+\((.*?)\);", art.cuda_source.split("__global__")[-1], re.S)
    assert call and call.group(1).rstrip().endswith(", 0, 0"), "row and column offsets 0 for every warp"
    lecture = _flat(_lecture("lab4_gemm"))
    assert "lanes $32w$ to $32w + 31$ and no others" in lecture
    assert "the chunk comes from the warp's rank, not from the address" in lecture

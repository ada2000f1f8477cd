"""The epilogue reader (grader/fragment.py): integer expressions without eval, the statements
TIRx emits, and the check of where each accumulator register is stored."""
import json

import pytest

from grader import fragment, inspect
from grader.labs import lab4_gemm as L


@pytest.mark.parametrize("text, value", [
    ("((((int)threadIdx.x) & 31) >> 2) * 128", (37 & 31) >> 2 << 7),
    ("(-7 / 2) + (-7 % 2)", -3 + -1),                   # C truncates towards zero
    ("min(3, ((int)blockIdx.y)) + max(1, 2)", 0 + 2),
    ("(threadIdx.x < 32) ? 1 : 2", 2),
    ("__shfl_sync((uint)4294967295, (((int)threadIdx.x) >> 5), 0, 32)", 1),
    ("0x10 + 4u", 20),
])
def test_integer_expressions(text, value):
    env = {"threadIdx.x": 37, "threadIdx.y": 0, "threadIdx.z": 0, "blockIdx.x": 0, "blockIdx.y": 0, "blockIdx.z": 0}
    assert fragment.expression(text)(env) == value


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "acc_ptr[3] + 1", "1.5f + 2", "foo(1)",
                                  "x = 3"])
def test_anything_else_is_refused_not_run(text):
    with pytest.raises(fragment.Unknown):
        fragment.expression(text)({"x": 1})


def _kernel(body: str) -> str:
    return ("__device__ int helper() {\n  return 0;\n}\n"
            'extern "C" __global__ void k(half* __restrict__ D_ptr);\n'
            'extern "C" __global__ void k(half* __restrict__ D_ptr) {\n'
            "  float acc_ptr[4];\n  half pair_ptr[2];\n" + body + "}\n")


# a 2-thread, 4-register fragment of a 2 x 4 output: thread t holds row t, register k column k
RIGHT = ("  int t = ((int)threadIdx.x);\n"
         "  for (int j = 0; j < 2; ++j) {\n"
         "    pair_ptr[0] = ((half)acc_ptr[(j * 2)]);\n"
         "    pair_ptr[1] = ((half)acc_ptr[((j * 2) + 1)]);\n"
         "    if (t < 2) {\n"
         "      *(half2*)(D_ptr + ((t * 4) + (j * 2))) = *(half2*)(pair_ptr + 0);\n"
         "    }\n"
         "  }\n")
PLACES = fragment.Places([[0, 1, 2, 3], [4, 5, 6, 7]], cols=4)


def test_the_places_of_a_small_epilogue_are_followed_through_loops_and_branches():
    got = fragment.epilogue_places(_kernel(RIGHT), 2)
    assert got[1] == [(4, ("acc_ptr", 0)), (5, ("acc_ptr", 1)), (6, ("acc_ptr", 2)), (7, ("acc_ptr", 3))]
    assert fragment.check_places(_kernel(RIGHT), PLACES)[0] is True


@pytest.mark.parametrize("edit, said", [
    (("(t * 4) + (j * 2)", "(j * 4) + (t * 2)"), "2 of 2 threads store registers where"),          # transposed
    (("acc_ptr[(j * 2)]", "acc_ptr[1]"), "stored twice: 1; never stored: 0, 2"),
    (("if (t < 2) {", "if (t < 1) {"), "never stored: 0, 1, 2, 3"),
])
def test_a_misplaced_register_fails_and_the_message_never_gives_the_answer(edit, said):
    ok, msg = fragment.check_places(_kernel(RIGHT.replace(*edit)), PLACES)
    assert ok is False and said in msg, msg


@pytest.mark.parametrize("edit", [("if (t < 2) {", "if (helper() < 2) {"),
                                  ("*(half2*)(D_ptr + ((t * 4) + (j * 2))) = *(half2*)(pair_ptr + 0);",
                                   "D_ptr[t] = make_half(pair_ptr[0]);")])
def test_an_epilogue_outside_the_subset_is_not_checked(edit):
    ok, msg = fragment.check_places(_kernel(RIGHT.replace(*edit)), PLACES)
    assert ok is None and msg.startswith("not checked"), msg


def test_lab4_places_are_the_wgmma_fragment_and_the_sealed_ones_agree():
    """The course grader's places and the edition's hashed ones give the same verdicts on the same
    thread lists; the table does not hold the offsets."""
    from grader.edition import tables
    first, other = L.ACC_PLACES["s3_build_sm90"]        # at 200 x 328: CTA (1, 2) is an edge tile
    assert first.cols == 328 and first.threads == 128 and first.regs == 128 and other.block == (1, 2, 0)
    assert first.size == other.size == 200 * 328
    r, c = L.ref_acc_coord(5, 3)
    assert first.offsets[5][64 + 3] == (64 + r) * 328 + c
    assert other.offsets[5][3] == (128 + r) * 328 + 256 + c
    assert 128 + 64 + r >= 200 and other.offsets[5][64 + 3] is None        # past D's last row: not stored
    assert sum(o is None for t in other.offsets for o in t) == 128 * 128 - 72 * 72
    entries = json.loads(json.dumps(tables.seal_places("s3_build_sm90", [first, other])))
    for places, entry in zip((first, other), entries):
        sealed = tables.SealedPlaces(entry["cols"], entry["regs"], [tables.decode(s) for s in entry["seals"]],
                                     entry["block"], size=entry["size"])
        assert json.dumps(places.offsets[0][:3])[1:-1] not in json.dumps(entry) and sealed.block == places.block
        assert sealed.size == places.size
        for t in (0, 77):
            for got in (places.offsets[t], places.offsets[t][::-1], places.offsets[(t + 1) % 128], first.offsets[t]):
                assert sealed.fits(t, got) == places.fits(t, got)


def test_the_mechanism_says_not_checked_without_places_and_fails_a_wrong_epilogue():
    r = inspect.check("wgmma_epilogue_places", {"cuda": _kernel(RIGHT)})
    assert r.ok and "checked by the course grader" in r.message
    bad = RIGHT.replace("(t * 4) + (j * 2)", "(j * 4) + (t * 2)")
    r = inspect.check("wgmma_epilogue_places", {"cuda": _kernel(bad), "acc_places": PLACES})
    assert not r.ok and "WRONG" in r.message and "wgmma_acc_coord" in r.message, r.message


@pytest.mark.parametrize("body, why", [
    ("  for (int i = 0; i < 1000000000; ++i) {\n    pair_ptr[0] = ((half)acc_ptr[0]);\n"
     "    D_ptr[i] = ((half)acc_ptr[1]);\n  }\n", "more than"),
    ("  int t = " + "(" * 1500 + "1" + ")" * 1500 + ";\n  D_ptr[t] = ((half)acc_ptr[1]);\n", "t is not a value"),
    ("  D_ptr[" + "(" * 1500 + "1" + ")" * 1500 + "] = ((half)acc_ptr[1]);\n", "nested too deeply"),
    ("  *(half2*)(D_ptr + " + "1 + " * 3000 + "0) = *(half2*)(pair_ptr + 0);\n", "a store this check cannot read"),
])
def test_an_epilogue_built_to_stall_the_reader_is_not_checked_quickly(body, why):
    import time
    t = time.time()
    ok, msg = fragment.check_places(_kernel(body), PLACES)
    assert ok is None and why in msg and time.time() - t < 10, msg


def test_an_else_belongs_to_its_own_if_not_to_an_inner_one_that_has_none():
    """An if without an else, last in the body of an if with one (a producer branch holding an
    elected thread's branch, then the consumers' else, as in Lab 5): the else is the outer if's."""
    nested = ("  int t = ((int)threadIdx.x);\n  if (t < 0) {\n    if (t == 5) {\n    }\n  } else {\n"
              + RIGHT.replace("  int t = ((int)threadIdx.x);\n", "") + "  }\n")
    ok, msg = fragment.check_places(_kernel(nested), PLACES)
    assert ok is True, msg
    ok, msg = fragment.check_places(_kernel(nested.replace("  } else {", "  } else if (t > 0) {")), PLACES)
    assert ok is None and "a branch this check does not follow" in msg, msg


# A shared tile TMA-stored into D, as TIRx writes it (Lab 4 step 4, Lab 5): index pairs as int2, the
# pair read as one half2 and stored as two halves, a barrier, then TMA stores of the tile. Eight
# threads, thread t holds row t of an 8 x 16 D in its 16 registers (register k: column k). The tile
# starts 512 elements into the pool; with a 32-byte swizzle (mode 1) the 16-byte halves of each
# 32-byte row are swapped in rows 4 to 7 (bit 4 of the byte address XOR bit 7).
def _tma_kernel(index: str, stores: str, sync: str = "  tvm_builtin_cuda_cta_sync();\n", first: int = 0,
                regs: str = "j * 2") -> str:
    return ('extern "C" __global__ void k(const __grid_constant__ CUtensorMap D_tensormap);\n'
            'extern "C" __global__ void k(const __grid_constant__ CUtensorMap D_tensormap) {\n'
            "  float acc_ptr[16];\n  half pair_ptr[2];\n"
            f"  int t = (((int)threadIdx.x) - {first});\n"
            "  for (int j = 0; j < 8; ++j) {\n"
            f"    pair_ptr[0] = ((half)acc_ptr[({regs})]);\n"
            f"    pair_ptr[1] = ((half)acc_ptr[(({regs}) + 1)]);\n"
            "    int2 __1;\n"
            "      int2 v__2 = make_int2(((t * 16) + (j * 2))+(1*0), ((t * 16) + (j * 2))+(1*1));\n"
            f"      __1.x = ({index.replace('X', 'v__2.x')} + 512);\n"
            f"      __1.y = ({index.replace('X', 'v__2.y')} + 512);\n"
            "    half2 v__4 = *(half2*)(pair_ptr + 0);\n"
            "    ((half*)pool_buf_ptr)[__1.x] = v__4.x;\n"
            "    ((half*)pool_buf_ptr)[__1.y] = v__4.y;\n"
            "  }\n" + sync + stores + "}\n")


def _tma_store(start: int, c0: str, c1: str = "0", arr: str = "pool_buf_ptr") -> str:
    return ("  if (((int)threadIdx.x) == 0) {\n"
            f"    ptx_cp_async_bulk_tensor_shared_to_global_2d((&(((half*){arr})[{start}])), "
            f"((unsigned long long)(&(D_tensormap))), (uint64_t)0, {c0}, {c1});\n  }}\n")


def _plan(box, swizzle):
    return {"signature": [{"name": "D", "kind": "tensor", "shape": [8, 16], "dtype": "float16"}],
            "tensormaps": [{"dtype": "float16", "rank": 2, "tensor": 0, "offset": 0, "sizes": [16, 8], "strides": [32],
                            "box": box, "element_strides": [1, 1], "interleave": 0, "swizzle": swizzle,
                            "l2_promotion": 0, "oob_fill": 0}],
            "launches": [{"name": "k", "args": [{"tensormap": 0}]}]}


SWIZZLED = "(X ^ (((X >> 6) & 1) << 3))"          # element offset e: bit 3 XOR bit 6 (bytes: 4 and 7)
ROWS = fragment.Places([[16 * t + k for k in range(16)] for t in range(8)], cols=16, via="tma_store")
ONE_BOX = _plan([16, 8], 1)                        # the whole 8 x 16 tile, 32-byte swizzle
TWO_BOXES = _plan([8, 8], 0)                       # two 8 x 8 column blocks, no swizzle


def test_a_tile_is_followed_through_its_tma_stores_boxes_and_swizzle():
    ok, msg = fragment.check_places(_tma_kernel(SWIZZLED, _tma_store(512, "0")), ROWS, plan=ONE_BOX)
    assert ok is True, msg
    # the swizzle left out: rows 4 to 7 land with their halves swapped
    ok, msg = fragment.check_places(_tma_kernel("X", _tma_store(512, "0")), ROWS, plan=ONE_BOX)
    assert ok is False and "4 of 8 threads" in msg and "thread 4 stores acc_ptr[0] -> D[4][8]" in msg, msg
    # a tile of two column blocks, each TMA-stored to its place; then with the coordinates swapped
    blocks = "((((X % 16) / 8) * 64) + ((X / 16) * 8) + (X % 8))"
    two = _tma_store(512, "0") + _tma_store(576, "8")
    assert fragment.check_places(_tma_kernel(blocks, two), ROWS, plan=TWO_BOXES)[0] is True
    ok, msg = fragment.check_places(_tma_kernel(blocks, _tma_store(512, "8") + _tma_store(576, "0")), ROWS,
                                    plan=TWO_BOXES)
    assert ok is False and "thread 0 stores acc_ptr[0] -> D[0][8]" in msg, msg
    # the same layout without the plan, or with a plan that does not launch this kernel: not checked
    assert fragment.check_places(_tma_kernel(blocks, two), ROWS)[0] is None
    other = {**TWO_BOXES, "launches": [{"name": "other", "args": [{"tensormap": 0}]}]}
    ok, msg = fragment.check_places(_tma_kernel(blocks, two), ROWS, plan=other)
    assert ok is None and "does not launch k" in msg, msg


def test_a_tma_store_reads_only_what_was_written_before_the_barrier_that_precedes_it():
    # no barrier between the writes and the store: the store reads the tile before they land
    ok, msg = fragment.check_places(_tma_kernel(SWIZZLED, _tma_store(512, "0"), sync=""), ROWS, plan=ONE_BOX)
    assert ok is False and "written while a TMA store may still be reading the tile" in msg, msg
    # a tile reused chunk after chunk: registers 0..7 (columns 0..7), a barrier, their store; then,
    # once thread 0 has waited for that store to read the tile and a barrier has passed, registers
    # 8..15 written over the same elements, a barrier, their store
    src = ('extern "C" __global__ void k(const __grid_constant__ CUtensorMap D_tensormap) {\n'
           "  float acc_ptr[16];\n  half pair_ptr[2];\n  int t = ((int)threadIdx.x);\n"
           "  for (int c = 0; c < 2; ++c) {\n"
           "    if (t == 0) {\n      ptx_cp_async_bulk_wait_group_read_0();\n    }\n"
           "    tvm_builtin_cuda_warpgroup_sync(1);\n"
           "    for (int j = 0; j < 4; ++j) {\n"
           "      pair_ptr[0] = ((half)acc_ptr[((c * 8) + (j * 2))]);\n"
           "      pair_ptr[1] = ((half)acc_ptr[(((c * 8) + (j * 2)) + 1)]);\n"
           "      *(half2*)(pool_buf_ptr + (((t * 8) + (j * 2)) + 512)) = *(half2*)(pair_ptr + 0);\n"
           "    }\n"
           "    tvm_builtin_cuda_warpgroup_sync(1);\n"
           "    if (t == 0) {\n"
           "      ptx_cp_async_bulk_tensor_shared_to_global_2d((&(((half*)pool_buf_ptr)[512])), "
           "((unsigned long long)(&(D_tensormap))), (uint64_t)0, (c * 8), 0);\n"
           "      ptx_cp_async_bulk_tensor_commit_group();\n    }\n"
           "  }\n}\n")
    ok, msg = fragment.check_places(src, ROWS, plan=TWO_BOXES)
    assert ok is True, msg
    # without the wait, the second chunk's writes race with the first store's read of the tile
    ok, msg = fragment.check_places(src.replace("ptx_cp_async_bulk_wait_group_read_0();", "int w = 0;"), ROWS,
                                    plan=TWO_BOXES)
    assert ok is False and "may still be reading the tile (no barrier after the store's issue, or no wait for its " \
        "bulk group before that barrier): 8, 9, 10" in msg, msg
    # a wait that leaves the last group in flight (wait_group_read 1) does not cover it either
    ok, msg = fragment.check_places(src.replace("wait_group_read_0", "wait_group_read_1"), ROWS, plan=TWO_BOXES)
    assert ok is False, msg


def test_threads_that_write_one_element_in_the_same_epoch_race_and_fail():
    # thread t writes row t % 4: threads t and t + 4 write the same elements before the same barrier
    ok, msg = fragment.check_places(_tma_kernel(SWIZZLED.replace("X", "(X % 64)"), _tma_store(512, "0")), ROWS,
                                    plan=ONE_BOX)
    assert ok is False and "thread 4 stores acc_ptr[0] -> D[0][0]" in msg, msg


def test_tma_stores_made_to_stall_the_reader_are_not_followed():
    """A descriptor's box of 256^5 elements, or a tile element written thousands of times, would
    keep the grader's process busy for hours: both are refused at once."""
    import time
    huge = {**ONE_BOX, "tensormaps": [{**ONE_BOX["tensormaps"][0], "rank": 5, "box": [256] * 5,
                                       "sizes": [16, 8, 1, 1, 1], "strides": [32, 256, 256, 256],
                                       "element_strides": [1] * 5}]}
    src = _tma_kernel(SWIZZLED, _tma_store(512, "0").replace("_2d(", "_5d(").replace(", 0, 0);", ", 0, 0, 0, 0, 0);"))
    t = time.time()
    ok, msg = fragment.check_places(src, ROWS, plan=huge)
    assert ok is None and "more than 4194304 elements" in msg and time.time() - t < 5, msg
    many = _tma_kernel(SWIZZLED, _tma_store(512, "0")).replace("for (int j = 0; j < 8; ++j)",
                                                                "for (int j = 0; j < 8000; ++j)")
    many = many.replace("((t * 16) + (j * 2))+(1*", "((t * 16) + ((j % 8) * 2))+(1*")   # 1,000 writes an element
    ok, msg = fragment.check_places(many, ROWS, plan=ONE_BOX)
    assert ok is None and "written more than 256 times" in msg, msg


@pytest.mark.parametrize("bad", [
    {"tensormaps": [{**ONE_BOX["tensormaps"][0], "tensor": 7}]},               # no such tensor
    {"tensormaps": [{**ONE_BOX["tensormaps"][0], "box": "16x8"}]},
    {"tensormaps": [{k: v for k, v in ONE_BOX["tensormaps"][0].items() if k != "sizes"}]},
    {"launches": [{"name": "k", "args": [{"tensormap": 3}]}]},                  # a descriptor that is not there
    {"signature": None},
])
def test_a_malformed_launch_plan_is_not_checked_and_raises_nothing(bad):
    ok, msg = fragment.check_places(_tma_kernel(SWIZZLED, _tma_store(512, "0")), ROWS, plan={**ONE_BOX, **bad})
    assert ok is None and "not checked" in msg, msg


def test_a_consumer_warpgroups_threads_are_followed_from_its_first_thread():
    """Warp-specialized kernels (RelativePlaces): the warpgroup holding the accumulator starts at
    thread 128; its one wgmma names registers 0..15, and thread t's register k belongs k columns
    and t rows from thread 0's register 0."""
    wgmma = ("  ptx_wgmma_mma_async_ss_64x32x16_float16_float32(" + ", ".join(f"acc_ptr[{k}]" for k in range(16))
             + ", desc_a_ptr[0], desc_b_ptr[0], (bool)1);\n")
    later = fragment.RelativePlaces({16: ROWS.offsets}, 16, (None, None, 8, 16), via="tma_store", first=128,
                                    threads=8, group=8)
    src = _tma_kernel(SWIZZLED, _tma_store(512, "0").replace("((int)threadIdx.x) == 0", "((int)threadIdx.x) == 128"),
                      first=128).replace("  half pair_ptr[2];\n", "  half pair_ptr[2];\n" + wgmma)
    ok, msg = fragment.check_places(src, later, plan=ONE_BOX)
    assert ok is True, msg
    from_0 = fragment.RelativePlaces({16: ROWS.offsets}, 16, (None, None, 8, 16), via="tma_store", threads=8, group=8)
    assert fragment.check_places(src, from_0, plan=ONE_BOX)[0] is not True      # threads 0..7 store nothing there


def test_tma_stores_the_reader_cannot_follow_are_not_checked():
    two = _tma_kernel(SWIZZLED, _tma_store(512, "0") + _tma_store(512, "0", arr="other_ptr"))
    ok, msg = fragment.check_places(two, ROWS, plan=ONE_BOX)
    assert ok is None and "more than one shared-memory array" in msg, msg
    ok, msg = fragment.check_places(_tma_kernel(SWIZZLED, _tma_store(512, "0").replace("shared_to_global", "nothing")),
                                    ROWS, plan=ONE_BOX)
    assert ok is None and "no TMA store" in msg, msg
    for plan, why in ((_plan([16, 8], 5), "swizzle mode 5"), (_plan([12, 8], 0), "box of 12"),
                      ({**ONE_BOX, "tensormaps": [{**ONE_BOX["tensormaps"][0], "offset": 64}]}, "not a plain fp16")):
        ok, msg = fragment.check_places(_tma_kernel(SWIZZLED, _tma_store(512, "0")), ROWS, plan=plan)
        assert ok is None and why in msg, (why, msg)
    # a store into the tile in a form the reader does not follow is "not checked", never "stored nowhere"
    for form in ("*(half2*)(((half*)pool_buf_ptr) + __1.x) = v__4;", "((half*)pool_buf_ptr)[__1.x] += v__4.x;"):
        src = _tma_kernel(SWIZZLED, _tma_store(512, "0")).replace("((half*)pool_buf_ptr)[__1.x] = v__4.x;", form)
        ok, msg = fragment.check_places(src, ROWS, plan=ONE_BOX)
        assert ok is None and "a store this check cannot read" in msg, (form, msg)
    # a TMA store whose arguments are not in TIRx's form
    src = _tma_kernel(SWIZZLED, _tma_store(512, "0").replace("(uint64_t)0, 0, 0", "0, 0"))
    ok, msg = fragment.check_places(src, ROWS, plan=ONE_BOX)
    assert ok is None and "a TMA store this check cannot read" in msg, msg


@pytest.mark.parametrize("text", ["1 << (((int)threadIdx.x) << 40)", "1 << -1", "8 >> 64"])
def test_shifts_c_leaves_undefined_are_refused(text):
    env = {"threadIdx.x": 37}
    with pytest.raises(fragment.Unknown, match="a shift by"):
        fragment.expression(text)(env)


def test_numbers_stay_64_bit_integers():
    env = {"threadIdx.x": 37}
    assert fragment.expression("9223372036854775807 + 1")(env) == -(1 << 63)       # wraps as C's int64_t
    assert fragment.expression("(1 << 62) * 4")(env) == 0


def test_an_epilogue_that_squares_a_number_in_a_loop_is_read_quickly():
    """Python integers grow without bound: squaring one 200 times would take the grader's memory."""
    import time
    body = ("  int x = 3;\n  for (int i = 0; i < 200; ++i) {\n    x = (x * x);\n"
            "    pair_ptr[0] = ((half)acc_ptr[0]);\n    D_ptr[(x & 7)] = ((half)acc_ptr[1]);\n  }\n")
    t = time.time()
    ok, msg = fragment.check_places(_kernel(body), PLACES)
    assert ok is not True and time.time() - t < 10, msg


def test_a_tma_store_whose_start_has_thousands_of_digits_is_not_read():
    """A 5,000-digit number once raised a ValueError (Python's limit on reading integers) past the
    reader's refusals; numbers of more than 24 digits are refused."""
    src = _tma_kernel(SWIZZLED, _tma_store(512, "0").replace("[512]", "[" + "9" * 5000 + "]"))
    assert fragment.check_places(src, ROWS, plan=ONE_BOX)[0] is None
    with pytest.raises(fragment.Unknown, match="a number of 30 digits"):
        fragment.expression("1" * 30)


def test_an_epilogue_of_long_expressions_is_stopped_by_the_clock(monkeypatch):
    """Steps bound the statements followed, not their cost: a loop of long expressions is stopped by
    the time limit as well."""
    import time
    monkeypatch.setattr(fragment, "MAX_SECONDS", 1.0)
    body = ("  for (int i = 0; i < 1000000000; ++i) {\n    int u = " + " + ".join(["(i * 3)"] * 300) + ";\n"
            "    pair_ptr[0] = ((half)acc_ptr[0]);\n    D_ptr[u] = ((half)acc_ptr[1]);\n  }\n")
    t = time.time()
    ok, msg = fragment.check_places(_kernel(body), PLACES)
    assert ok is None and "s to follow" in msg and time.time() - t < 6, msg


def _with_wgmmas(body: str, runs) -> str:
    calls = "".join(f"  ptx_wgmma_mma_async_ss_64x4x16(desc_a_ptr[0], desc_b_ptr[0], "
                    + ", ".join(f"acc_ptr[{r}]" for r in run) + ");\n" for run in runs)
    return _kernel(calls + body)


def test_the_mmas_decide_which_registers_are_which_half():
    """A kernel may give its first run of accumulator registers to the second half of the tile,
    in its MMAs and its epilogue alike: that is not a misplacement. A run the reader cannot
    follow leaves the check undecided."""
    swapped = RIGHT.replace("acc_ptr[(j * 2)]", "acc_ptr[(2 - (j * 2))]").replace(
        "acc_ptr[((j * 2) + 1)]", "acc_ptr[(3 - (j * 2))]")
    assert fragment.check_places(_with_wgmmas(swapped, [[0, 1], [2, 3]]), PLACES)[0] is True
    assert fragment.check_places(_with_wgmmas(RIGHT, [[0, 1], [2, 3]]), PLACES)[0] is True
    ok, msg = fragment.check_places(_with_wgmmas(RIGHT, [[1, 0], [2, 3]]), PLACES)
    assert ok is None and "not one aligned run" in msg, msg
    ok, msg = fragment.check_places(RIGHT and _kernel(
        "  ptx_wgmma_mma_async_ss_64x4x16(desc_a_ptr[0], acc_ptr[j], acc_ptr[(j + 1)]);\n" + RIGHT), PLACES)
    assert ok is None and "computed indices" in msg, msg
    # within a run the order is the instruction's: swapping two registers of one run is wrong
    inner = RIGHT.replace("acc_ptr[(j * 2)]", "acc_ptr[((j * 2) + 1)]X").replace(
        "acc_ptr[((j * 2) + 1)]);", "acc_ptr[(j * 2)]);").replace("]X", "]")
    assert fragment.check_places(_with_wgmmas(inner, [[0, 1], [2, 3]]), PLACES)[0] is False


def test_right_stores_that_never_run_do_not_hide_wrong_ones():
    """Decoy stores of the right places under a branch no thread takes count for nothing; under a
    branch on a value the reader cannot know, the check is undecided, never "ok"."""
    wrong = RIGHT.replace("(t * 4) + (j * 2)", "(j * 4) + (t * 2)")
    decoy = RIGHT.replace("if (t < 2) {", "if (t > 100) {")
    ok, msg = fragment.check_places(_kernel(decoy + wrong), PLACES)
    assert ok is False, msg
    hidden = RIGHT.replace("if (t < 2) {", "if (flag[0] == 7) {")
    assert fragment.check_places(_kernel(hidden + wrong), PLACES)[0] is None

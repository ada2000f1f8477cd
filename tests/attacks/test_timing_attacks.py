"""Attacks on the timing of speed parts: kernels that do the work on some calls only and leave
an earlier result in place, a rate above what the GPU can do, and a kernel that keeps state
between launches in module-scope global memory. Each attack test asserts that the attacked part
gets nothing, with a verdict that names what was found; the controls show that an honest kernel
in the same place scores.

On the CPU the kernel is a torch function standing in for the launched kernel (runners.Env is
the seam) and the CUDA event clock and L2 flusher are replaced by fakes, so that the runner, the
rotation of argument sets, the poisoning and the checks of grader/timing.py and grading.timed_ratio
run as they do on the GPU. The tests marked ``gpu`` run the same attacks on a GPU with the real
clock, and a real kernel compiled from CUDA source, launched by the grader's own launcher."""
import dataclasses
import random
import time
import types

import pytest
import torch

from grader import build, hardware, inputs, launch, problems, runners, spec, timing
from grader.context import Context

FAKE_H200 = hardware.Device(True, "NVIDIA H200 (fake)", hardware.SPECS["H200"], "test")
N = 1 << 16                              # elements of the scale_add shape timed here
KERNEL_BYTES = 3 * N * 2                 # read x and y, write out (fp16)
HONEST_S = 1e-4                          # what the fake clock says one call of either function took


@pytest.fixture
def fake_gpu(monkeypatch):
    """The CUDA event clock and the L2 flusher replaced by fakes: a call that launched the kernel
    (it appends to ``launches``) takes ``kernel_s``, any other call (the baseline) HONEST_S."""
    state = types.SimpleNamespace(launches=[], kernel_s=HONEST_S, flushes=0)

    class Clock:
        def __init__(self, *args, **kwargs):
            pass

        def time_call(self, fn):
            before = len(state.launches)
            fn()
            return state.kernel_s if len(state.launches) > before else HONEST_S

    class Flusher:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self):
            state.flushes += 1

    monkeypatch.setattr(timing, "CudaEventClock", Clock)
    monkeypatch.setattr(timing, "L2Flusher", Flusher)
    return state


def speed_context(n=N, device=FAKE_H200):
    lab = spec.load("lab1_roofline")
    part = lab.part("b_speed")
    part = dataclasses.replace(part, params={**part.params, "shapes": [[n]]})
    return Context(lab, part, inputs.PUBLIC_SEED, device)


def grade_speed(builder, device="cpu"):
    """Lab 1's speed part (problem scale_add) on ``builder``, through the default runner and the
    grader's own timed_ratio; on the CPU (the fake clock) or on the GPU."""
    lower = lambda built: (built, "// a stand-in kernel")            # noqa: E731
    if device == "cpu":
        env = runners.Env(device="cpu", lower=lower, sync=lambda: None, require_gpu=lambda ctx: None)
        return runners.speed(types.SimpleNamespace(build_scale_add=builder), speed_context(), env)
    return runners.speed(types.SimpleNamespace(build_scale_add=builder), speed_context(device=hardware.detect()),
                         runners.Env(lower=lower))


def scale_add(x, y, out, alpha):
    out.copy_((alpha * x.float() + y.float()).half())


def honest(state):
    def builder(n):
        def kernel(x, y, out, alpha):
            state.launches.append((x.data_ptr(), out.data_ptr()))
            scale_add(x, y, out, alpha)
        return kernel
    return builder


def works_on_first_launches(state, k=2):
    """The kernel seen on an H200: a launch counter in module-scope memory; it does the work on
    its first ``k`` launches (the check before timing and the first warm-up call), then returns
    at once (on the GPU: spins until a chosen time), leaving the result of launch k in place."""
    def builder(n):
        count = [0]                                  # the kernel's module-scope state

        def kernel(x, y, out, alpha):
            state.launches.append((x.data_ptr(), out.data_ptr()))
            count[0] += 1
            if count[0] <= k:
                scale_add(x, y, out, alpha)
        return kernel
    return builder


def works_on_new_pointers(state, k=2):
    """Remembers the output pointers it was given and does the work only on the first ``k`` calls
    that write a given pointer."""
    def builder(n):
        seen = {}

        def kernel(x, y, out, alpha):
            state.launches.append((x.data_ptr(), out.data_ptr()))
            seen[out.data_ptr()] = seen.get(out.data_ptr(), 0) + 1
            if seen[out.data_ptr()] <= k:
                scale_add(x, y, out, alpha)
        return kernel
    return builder


# ---------------------------------------------------------------- control

def test_an_honest_kernel_scores_with_every_timed_call_checked(fake_gpu):
    out = grade_speed(honest(fake_gpu))
    assert out.fraction == 1.0, out.message
    m = out.measurements["shapes"][0]
    timed = m["kernel"]["n"]
    assert m["kernel"]["argument_sets"] == runners.ARGUMENT_SETS >= 2
    assert m["kernel"]["checked_calls"] == timed >= 10             # every timed call of the kernel was checked
    assert m["copy"]["argument_sets"] == runners.ARGUMENT_SETS      # the baseline rotates too
    # the kernel was called on two argument sets in turn: different inputs, different outputs
    inputs_seen = [x for x, _ in fake_gpu.launches]
    assert len(set(inputs_seen)) == 2 and inputs_seen[-1] != inputs_seen[-2]
    assert fake_gpu.flushes == 2 * timed                            # an L2 flush before every timed call


# ---------------------------------------------------------------- work on some calls only

def test_a_kernel_that_works_on_its_first_two_launches_scores_nothing(fake_gpu):
    """Fails before the change: the outputs were poisoned once, before the warm-up, whose first
    call wrote them, so the check after timing saw a right answer and the part scored 3/3."""
    out = grade_speed(works_on_first_launches(fake_gpu))
    assert out.fraction == 0.0 and out.verdict == "failed", out.message
    assert "timed call #1 (argument set" in out.message, out.message
    assert "still hold the NaN written into the output before the call" in out.message, out.message


def test_a_kernel_that_works_only_on_new_output_pointers_scores_nothing(fake_gpu):
    """Fails before the change, as above: one argument set, so the pointers of the timed calls
    were those of the check before timing and of the first warm-up call."""
    out = grade_speed(works_on_new_pointers(fake_gpu))
    assert out.fraction == 0.0 and out.verdict == "failed", out.message
    assert "timed call #" in out.message and "did not write them" in out.message, out.message


def test_a_kernel_that_skips_every_other_timed_call_is_caught_on_the_first_it_skips(fake_gpu):
    """Laziness on a pattern the kernel chooses, working on the calls it guesses are checked (the
    last one: it worked on even calls, and the 16th call was the last). Fails before the change.
    Every timed call is checked now: caught on the first call it skips."""
    def builder(n):
        calls = [0]

        def kernel(x, y, out, alpha):
            fake_gpu.launches.append((x.data_ptr(), out.data_ptr()))
            calls[0] += 1
            if calls[0] <= 6 or calls[0] % 2 == 0:    # the check, the warm-up, then every other call
                scale_add(x, y, out, alpha)
        return kernel
    out = grade_speed(builder)
    assert out.fraction == 0.0 and "timed call #1 (argument set 2 of 2)" in out.message, out.message


def test_a_kernel_that_borrows_its_input_between_calls_scores_nothing(fake_gpu):
    """It zeroes an input after some calls and puts it back at the next (scratch space that keeps
    state); the check after timing saw the input restored. Fails before the change."""
    def builder(n):
        calls, kept = [0], {}

        def kernel(x, y, out, alpha):
            fake_gpu.launches.append((x.data_ptr(), out.data_ptr()))
            calls[0] += 1
            if y.data_ptr() in kept:
                y.copy_(kept.pop(y.data_ptr()))
            scale_add(x, y, out, alpha)
            if calls[0] > 6 and calls[0] % 2:
                kept[y.data_ptr()] = y.clone()
                y.zero_()
        return kernel
    out = grade_speed(builder)
    assert out.fraction == 0.0 and "timed call #1" in out.message and "wrote into its input y" in out.message, \
        out.message


def test_the_baseline_is_timed_the_same_way(fake_gpu, monkeypatch):
    """The copy is rotated over the argument sets and its output poisoned before each call."""
    seen = []
    real = problems.SCALE_ADD.baseline

    def baseline(ins, scalars, shape):
        timed = real(ins, scalars, shape)
        dst = timed.outputs[0]

        def fn():
            seen.append((ins["x"].data_ptr(), bool(torch.isnan(dst).all())))
            timed.fn()
        return problems.Timed(fn, timed.work, timed.outputs)
    monkeypatch.setattr(problems, "SCALE_ADD", dataclasses.replace(problems.SCALE_ADD, baseline=baseline))
    monkeypatch.setitem(problems.PROBLEMS, "scale_add", problems.SCALE_ADD)
    out = grade_speed(honest(fake_gpu))
    assert out.fraction == 1.0, out.message
    assert len({x for x, _ in seen}) == 2 and all(poisoned for _, poisoned in seen), seen[:4]


def _grade_part(lab, part, params, builders):
    s = spec.load(lab)
    p = s.part(part)
    ctx = Context(s, dataclasses.replace(p, params={**p.params, **params}), inputs.PUBLIC_SEED, FAKE_H200)
    env = runners.Env(device="cpu", lower=lambda built: (built, ""), sync=lambda: None, require_gpu=lambda c: None)
    return runners.speed(types.SimpleNamespace(**builders), ctx, env)


@pytest.mark.parametrize("lazy", [False, True])
def test_sampled_rows_of_a_gemm_are_checked_after_every_timed_call(fake_gpu, lazy):
    """check_rows: the reference holds sampled rows only; the positions a check draws map back to
    the output's own (an honest kernel passes only if they do)."""
    calls = [0]

    def build(M, N, K):
        def kernel(A, B, D):
            fake_gpu.launches.append(D.data_ptr())
            calls[0] += 1
            if not lazy or calls[0] <= 2:
                D.copy_((A.float() @ B.float()).half())   # Lab 4: D = A @ B, B [K, N]
        return kernel
    out = _grade_part("lab4_gemm", "s4_speed", {"shapes": [[256, 128, 64]], "check_rows": 16}, {"hopper_step4": build})
    if lazy:
        assert out.fraction == 0.0 and "timed call #1" in out.message and "D: 2048 of 2048" in out.message, out.message
    else:
        assert out.fraction == 1.0, out.message


def test_sampled_rows_of_attention_outputs_are_checked_after_every_timed_call(fake_gpu, monkeypatch):
    """O [B, Sq, Hq, D] and LSE [B, Hq, Sq]: the row axis is not the first. (SDPA's cuDNN baseline
    has no CPU backend: a copy of Q stands in for it.)"""
    def baseline(ins, scalars, shape):
        copy = problems._copy_baseline("Q")(ins, scalars, shape)
        return problems.Timed(copy.fn, problems.attention_work(shape), copy.outputs)
    att = dataclasses.replace(problems.ATTENTION, extras=lambda ins, scalars, shape: {}, baseline=baseline)
    monkeypatch.setitem(problems.PROBLEMS, "attention", att)
    def build(B, Sq, Sk, Hq, Hkv, D, causal):
        def kernel(Q, K, V, O, LSE):
            fake_gpu.launches.append(O.data_ptr())
            ref = problems.attention_reference({"Q": Q, "K": K, "V": V}, causal=causal)
            O.copy_(ref["O"].half())
            LSE.copy_(ref["LSE"].float())
        return kernel
    shape = {"batch": 2, "seq_q": 64, "seq_k": 96, "heads_q": 4, "heads_kv": 2, "head_dim": 64, "causal": True}
    out = _grade_part("lab6_flash_attention", "s2_speed", {"shapes": [shape], "check_rows": 16},
                      {"hopper_attn_step2": build})
    assert out.measurements["shapes"][0]["kernel"]["checked_calls"] >= 10 and "ratio" in out.measurements, out.message


def test_a_lazy_extra_kernel_loses_its_recorded_rate_not_the_part(fake_gpu):
    """The student's other kernels (extra_builders) are timed in the same rotation and checked
    the same way; they are not graded, so a wrong one is recorded as such and its rate dropped."""
    def builder(lazy):
        def build(m, n):
            calls = [0]

            def kernel(a, b):
                fake_gpu.launches.append(b.data_ptr())
                calls[0] += 1
                if not lazy or calls[0] <= 2:
                    b.copy_(a.t())
            return kernel
        return build
    out = _grade_part("lab3_layout_swizzle", "d_speed", {"shapes": [[64, 128]]},
                      {"build_transpose_swizzled": builder(False), "build_transpose_plain": builder(True)})
    assert out.fraction == 1.0, out.message
    skipped = out.measurements["shapes"][0]["extras_skipped"]["build_transpose_plain"]
    assert skipped.startswith("rate not recorded: wrong result in timed call #1"), skipped
    assert "build_transpose_plain" not in out.message and "torch" in out.message, out.message


# ---------------------------------------------------------------- a rate the GPU cannot reach

def test_a_rate_above_the_hbm_peak_is_rejected(fake_gpu):
    """5.24 TB/s on an H200 (4.8 TB/s; 4.92 with its memory clock): what the Lab 1 kernel above
    reported on the GPU. Fails before the change: the floor allowed 1.25 x 4.8 = 6 TB/s."""
    fake_gpu.kernel_s = KERNEL_BYTES / 5.24e12
    out = grade_speed(honest(fake_gpu))
    assert out.fraction == 0.0 and out.verdict == "failed", out.message
    assert "faster than physically possible" in out.message and "(5.24 TB/s)" in out.message, out.message
    assert "HBM) peak of H200, 4.92 TB/s" in out.message, out.message


def test_a_rate_just_under_the_peak_is_graded(fake_gpu):
    fake_gpu.kernel_s = KERNEL_BYTES / 4.8e12
    out = grade_speed(honest(fake_gpu))
    assert out.fraction == 1.0 and "4.80 vs copy" in out.message, out.message


# ---------------------------------------------------------------- state kept between launches

# The PTX NVRTC makes of a kernel with a launch counter in a `__device__` variable (trimmed), as
# the kernel seen on an H200 kept its count: `.global` at module scope, read and written by the code.
STATEFUL_PTX = """
.version 9.5
.target sm_90a
.address_size 64

	// .globl	scale_add
.global .align 1 .u8 _ZN4cuda3std3__417integral_constantIbLb0EE5valueE;
.global .align 4 .u32 launches;

.visible .entry scale_add(
	.param .u64 .ptr .align 1 scale_add_param_0,
	.param .u64 .ptr .align 1 scale_add_param_1,
	.param .u64 .ptr .align 1 scale_add_param_2,
	.param .f32 scale_add_param_3
)
{
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<6>;

	ld.global.u32 	%r6, [launches];
	add.s32 	%r7, %r6, 1;
	st.global.u32 	[launches], %r7;
	ret;

}
"""

PLAN = {"version": 1,
        "signature": [{"name": "x", "kind": "tensor", "dtype": "float16", "shape": [N]},
                      {"name": "y", "kind": "tensor", "dtype": "float16", "shape": [N]},
                      {"name": "out", "kind": "tensor", "dtype": "float16", "shape": [N]},
                      {"name": "alpha", "kind": "scalar", "dtype": "float32"}],
        "tensormaps": [],
        "launches": [{"name": "scale_add", "grid": [N // 256, 1, 1], "block": [256, 1, 1], "cluster": [1, 1, 1],
                      "shared_bytes": 0,
                      "args": [{"tensor": 0}, {"tensor": 1}, {"tensor": 2}, {"scalar": 3, "dtype": "float32"}]}]}


def _stateless(ptx):
    return (ptx.replace("\tld.global.u32 \t%r6, [launches];\n", "").replace("\tst.global.u32 \t[launches], %r7;\n", "")
            .replace("add.s32 \t%r7, %r6, 1;", "add.s32 \t%r7, %r6, %r6;"))


@pytest.mark.parametrize("how, ptx", [
    ("read and written", STATEFUL_PTX),
    ("its address taken", _stateless(STATEFUL_PTX).replace("\tret;", "\tmov.u64 \t%rd5, launches;\n\tret;")),
    ("visible", STATEFUL_PTX.replace(".global .align 4 .u32 launches;", ".visible .global .align 4 .u32 launches;")),
    ("an array", STATEFUL_PTX.replace(".u32 launches;", ".b8 launches[64];")),
    ("reached through another variable's initializer",
     _stateless(STATEFUL_PTX).replace(".global .align 4 .u32 launches;",
                                      ".global .align 4 .u32 launches;\n.global .align 8 .u64 where = generic(launches);")
     .replace("\tret;", "\tld.global.u64 \t%rd5, [where];\n\tret;")),
])
def test_a_kernel_that_keeps_state_in_module_scope_global_memory_is_refused(how, ptx):
    """Fails before the change: the plan matched the PTX's entry, and the kernel was loaded."""
    with pytest.raises(launch.PlanRejected) as e:
        launch.check_against_ptx(PLAN, ptx)
    assert "launches" in str(e.value) and "keeps its value from one launch to the next" in str(e.value)
    with pytest.raises(launch.PlanRejected):          # before the cubin is loaded or anything launched
        launch.Kernel(PLAN, b"", ptx)


def test_a_submitted_kernel_with_module_state_is_refused_with_the_reason():
    class Ref:                                        # what the jailed child sends for a kernel
        builder, args = "build_scale_add", (N,)

        def device_code(self, arch):
            return {"plan": PLAN, "ptx": STATEFUL_PTX, "cuda_source": "// source"}
    with pytest.raises(build.BuildError, match=r"the grader cannot launch this kernel: the kernel's code uses "
                                               r"module-scope global memory \(launches"):
        build._submitted_code(Ref(), "sm_90a")


def test_unused_global_declarations_and_const_and_shared_memory_are_accepted():
    """The CUDA headers declare `.global` constants in every kernel TVM generates (no instruction
    names them); `.const` cannot be written by device code and `.shared` ends with its CTA."""
    ptx = _stateless(STATEFUL_PTX).replace(
        ".global .align 4 .u32 launches;",
        ".global .align 4 .u32 launches = 3;\n.const .align 4 .u32 table[4] = {1, 2, 3, 4};\n"
        ".shared .align 16 .b8 tile[1024];\n// st.global.u32 [launches], %r7;").replace(
        "\tret;", "\tld.const.u32 \t%r6, [table];\n\tst.shared.u32 \t[tile], %r6;\n\tret;")
    assert launch.module_state(ptx) == []
    launch.check_against_ptx(PLAN, ptx)


@pytest.mark.slow
def test_the_reference_kernels_declare_globals_that_no_instruction_uses(root, tmp_path):
    """Every kernel TVM generates carries the CUDA headers' `.global` constants: the rule must not
    refuse them. Compiles the Lab 1 and Lab 3 reference kernels for both tracks."""
    import os

    from conftest import import_notebook
    lab1 = import_notebook(os.path.join(root, "solutions", "lab1_roofline", "lab1_roofline.ipynb"), tmp_path / "l1",
                           "lab1_for_module_state")
    lab3 = import_notebook(os.path.join(root, "solutions", "lab3_layout_swizzle", "lab3_layout_swizzle.ipynb"),
                           tmp_path / "l3", "lab3_for_module_state")
    for kernel in (lab1.build_scale_add(1 << 16), lab3.build_transpose_swizzled(1024, 1024)):
        for arch in ("sm_90a", "sm_100a"):
            ptx = build.compile_only(kernel, arch).ptx
            assert ".global .align" in ptx
            assert launch.module_state(ptx) == []


# ---------------------------------------------------------------- what the checks cost

def test_the_checks_of_a_timed_call_cost_little_and_the_count_is_reported(fake_gpu):
    """The bookkeeping around a timed call (rotation, poison, sampled check) on the CPU, timed with
    the fake clock: printed with -s; asserted only loosely (a shared machine)."""
    ctx = speed_context(n=1 << 22)
    env = runners.Env(device="cpu", lower=lambda built: (built, ""), sync=lambda: None, require_gpu=lambda c: None)
    start = time.perf_counter()
    out = runners.speed(types.SimpleNamespace(build_scale_add=honest(fake_gpu)), ctx, env)
    total = time.perf_counter() - start
    m = out.measurements["shapes"][0]
    assert out.fraction == 1.0 and m["kernel"]["checked_calls"] == m["kernel"]["n"]
    sets = [runners.argument_set(problems.SCALE_ADD, ctx, problems.SCALE_ADD.shape([1 << 22]), c, c, {"alpha": 0.75},
                                 random.Random(c), env) for c in range(2)]
    for a in sets:
        scale_add(*problems.SCALE_ADD.args(a.tensors(), {"alpha": 0.75}))
    reps = 50
    start = time.perf_counter()
    for k in range(reps):
        assert runners.spot_check(problems.SCALE_ADD, sets[k % 2], f"call {k}", random.Random(k)) is None
    per_check = (time.perf_counter() - start) / reps
    print(f"\nscale_add n=2^22 on the CPU: part {total:.2f} s, {m['kernel']['n']} timed calls, all checked; "
          f"one sampled check {per_check * 1e3:.2f} ms")
    assert per_check < 0.05


# ---------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("attack", [works_on_first_launches, works_on_new_pointers])
def test_on_a_gpu_a_kernel_that_works_on_its_first_two_launches_scores_nothing(attack):
    """The real CUDA event clock, L2 flusher and device tensors; a torch stand-in for the kernel
    (one that works on its first launches, one that remembers the output pointers it has written)."""
    state = types.SimpleNamespace(launches=[])
    out = grade_speed(attack(state), device="cuda")
    assert out.fraction == 0.0 and "timed call #" in out.message and "did not write them" in out.message, out.message
    out = grade_speed(honest(state), device="cuda")
    m = out.measurements["shapes"][0]
    assert m["kernel"]["checked_calls"] == m["kernel"]["n"] and "ratio" in m, out.message


# A real kernel for the GPU, in CUDA source compiled by NVRTC and launched by the grader's own
# launcher (launch.Kernel) from a hand-written launch plan. SKIP_WRITTEN = 1 makes the stateless
# form of the attack: an element whose output already holds a number (not the poison) is taken to
# be done and skipped, so a kernel checked once after timing runs only its first call in full.
# Poisoned before every call, it must do all the work every time: it is timed as the honest one.
SCALE_ADD_CU = r"""
#include <cuda_fp16.h>
extern "C" __global__ void scale_add(const __half* x, const __half* y, __half* out, float alpha) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (SKIP_WRITTEN && !__hisnan(out[i])) return;
    out[i] = __float2half(alpha * __half2float(x[i]) + __half2float(y[i]));
}
"""


def _real_kernel(n, skip_written):
    from grader import toolchain
    arch = build.device_arch()
    ptx = toolchain.nvrtc_ptx(f"#define SKIP_WRITTEN {int(skip_written)}\n" + SCALE_ADD_CU, arch, reuse=False)
    plan = {**PLAN, "signature": [dict(p, shape=[n]) if p["kind"] == "tensor" else p for p in PLAN["signature"]],
            "launches": [dict(PLAN["launches"][0], grid=[n // 256, 1, 1])]}
    cubin, _ = launch.assemble(ptx, arch, unsafe=True)
    return launch.Kernel(plan, cubin, ptx)


@pytest.mark.gpu
def test_on_a_gpu_a_kernel_that_skips_what_is_already_written_is_timed_doing_all_the_work():
    n = 1 << 26
    ctx = speed_context(n=n, device=hardware.detect())
    env = runners.Env(lower=lambda built: (built, ""))
    ratios = {}
    for skip in (False, True):
        out = runners.speed(types.SimpleNamespace(build_scale_add=lambda n, s=skip: _real_kernel(n, s)), ctx, env)
        assert "ratio" in out.measurements, out.message
        ratios[skip] = out.measurements["ratio"]
    assert ratios[True] < 1.15 * ratios[False], ratios


def test_a_compiled_kernel_with_a_launch_counter_is_refused_before_it_runs():
    """The kernel seen on an H200, in CUDA source compiled by NVRTC: a `__device__` launch counter;
    after its first two launches (every thread counts) it returns at once."""
    from grader import toolchain
    src = SCALE_ADD_CU.replace("extern \"C\"", "__device__ unsigned int launches;\nextern \"C\"").replace(
        "if (SKIP_WRITTEN && !__hisnan(out[i]))", "if (atomicAdd(&launches, 1u) >= 2u * gridDim.x * blockDim.x)")
    assert "atomicAdd(&launches" in src
    ptx = toolchain.nvrtc_ptx(src, "sm_90a", reuse=False)
    assert launch.module_state(ptx) == ["launches"]
    with pytest.raises(launch.PlanRejected, match="launches"):
        launch.Kernel(PLAN, b"", ptx)

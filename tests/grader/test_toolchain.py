"""The course's NVRTC call (grader/toolchain.py) compiles the program TVM's NVRTC path compiles,
with the headers first so that a process parses them once: its PTX must be TVM's, byte for byte,
for kernels that use TMA descriptors, wgmma and tcgen05."""
import os

import pytest

from grader import devcode, toolchain


def _tvm_ptx(src, arch):
    from tvm.support import nvcc
    toolchain.configure_toolchain()
    with toolchain.target(arch):
        ptx = bytes(nvcc.compile_cuda(src, "ptx", arch=arch, compiler="nvrtc", options=toolchain.nvrtc_options()))
    return ptx.decode(errors="replace").rstrip("\x00")


def _source(func, arch):
    _, device_mods = devcode.lower(func, arch)
    return devcode.device_module(device_mods, arch).inspect_source()


@pytest.mark.slow
def test_ptx_is_tvms_with_and_without_reused_headers(root, tmp_path):
    from conftest import import_notebook
    lab4 = import_notebook(os.path.join(root, "solutions", "lab4_gemm", "lab4_gemm.ipynb"), tmp_path,
                           "lab4_for_nvrtc")
    kernels = {"sm_90a": lab4.hopper_step4(256, 256, 256), "sm_100a": lab4.blackwell_step4(256, 256, 256)}
    for arch, func in kernels.items():
        src = _source(func, arch)
        assert "CUtensorMap" in src                 # the TMA descriptor type TVM's path defines
        want = _tvm_ptx(src, arch)
        assert ".entry" in want
        assert toolchain.nvrtc_ptx(src, arch, reuse=False) == want, arch
        assert toolchain.nvrtc_ptx(src, arch, reuse=True) == want, arch
        assert toolchain.nvrtc_ptx(src, arch, reuse=True) == want, arch     # from the kept headers


def test_the_cuda_folder_and_ptxas_flags_are_tvms():
    from tvm.support import nvcc
    toolchain.configure_toolchain()
    assert toolchain.cuda_root() == nvcc.find_cuda_path()
    assert toolchain.ptxas_flags() == nvcc._ptxas_option_flags()


def test_a_compile_error_is_a_build_error_with_nvrtcs_log():
    with pytest.raises(toolchain.BuildError) as e:
        toolchain.nvrtc_ptx('extern "C" __global__ void k(float* a) { a[0] = undefined_name; }', "sm_90a")
    assert "NVRTC compilation for sm_90a failed" in str(e.value)
    assert 'identifier "undefined_name" is undefined' in str(e.value)


def test_headers_that_cannot_be_kept_cost_nothing_but_the_time(monkeypatch):
    """A process whose precompiled headers cannot be written (no room in its folder) still gets
    its PTX, and stops trying to keep them."""
    kernel = '#include <cuda/std/cstdint>\nextern "C" __global__ void k(int* a) { a[0] = 1; }'
    monkeypatch.setattr(toolchain, "_PCH", {"on": True, "dir": "/dev/null/headers"})   # not a folder
    ptx = toolchain.nvrtc_ptx(kernel, "sm_90a")
    assert ".entry k" in ptx and toolchain._PCH["on"] is False
    assert toolchain.nvrtc_ptx(kernel, "sm_90a", reuse=False) == ptx


def test_the_environment_can_turn_kept_headers_off(monkeypatch):
    monkeypatch.setattr(toolchain, "_PCH", {"on": False, "dir": None})
    toolchain.reuse_headers()
    assert toolchain._PCH["on"] is True
    monkeypatch.setenv("GRADER_NVRTC_HEADERS", "0")
    toolchain.reuse_headers()
    assert toolchain._PCH["on"] is False


def test_the_grading_processes_keep_no_headers():
    """Kept headers are files a process reads back into its compiles: only a notebook's kernel and
    this test session keep them. The grader's own processes (CLI, harness, grading run, the child)
    import everything they use without turning them on."""
    import subprocess
    import sys

    from conftest import ROOT
    code = ("import grader.cli, grader.run, grader.harness, grader.child, grader.build, grader.devcode; "
            "from grader import toolchain; print(toolchain._PCH['on'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
    code = "import grader.notebook; from grader import toolchain; print(toolchain._PCH['on'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]             # the control: a notebook's kernel


@pytest.mark.slow
def test_kernels_prefetched_compile_in_worker_processes_to_the_same_ptx(root, tmp_path, monkeypatch):
    """A check cell hands its kernels to build.prefetch: their NVRTC compiles run in worker
    processes, and the PTX a kernel is then built from is the one NVRTC makes here."""
    from conftest import import_notebook

    from grader import build
    lab1 = import_notebook(os.path.join(root, "solutions", "lab1_roofline", "lab1_roofline.ipynb"), tmp_path,
                           "lab1_for_workers")
    kernels = [lab1.build_scale_add(n) for n in (1 << 16, 1 << 17, 3 << 16)]
    want = [devcode.lowered(k, "sm_90a")[2] for k in kernels]
    monkeypatch.setenv("GRADER_NVRTC_WORKERS", "2")
    monkeypatch.setattr(build, "_LOWERED", {})
    real = toolchain.nvrtc_ptx
    here = []
    monkeypatch.setattr(toolchain, "nvrtc_ptx", lambda *a, **k: here.append(a) or real(*a, **k))
    build.prefetch(kernels, "sm_90a")
    assert toolchain._POOL["pool"] is not None and len(build._LOWERED) == 3
    got = [build.compile_only(k, "sm_90a").ptx for k in kernels]
    assert got == want and here == []                  # none compiled in this process

    # a worker that dies takes the pool down, not the kernel: it is compiled here instead
    src = devcode.lowered(kernels[0], "sm_90a", later=True)[0]
    for proc in list(toolchain._POOL["pool"]._processes.values()):
        proc.kill()
    later = toolchain.nvrtc_later(src, "sm_90a")
    assert later.result() == want[0] and len(here) == 1
    assert toolchain.nvrtc_later(src, "sm_90a").result() == want[0]      # a fresh pool


def test_without_workers_a_later_compile_is_made_when_asked(monkeypatch):
    monkeypatch.setenv("GRADER_NVRTC_WORKERS", "0")
    calls = []
    monkeypatch.setattr(toolchain, "nvrtc_ptx", lambda src, arch: calls.append(arch) or f"// {src}")
    later = toolchain.nvrtc_later("int x;", "sm_90a")
    assert calls == [] and later.result() == "// int x;" and calls == ["sm_90a"]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_known_good_kernel_assembles_with_the_course_ptxas(arch):
    """The kernel that tells a machine's silent ptxas from a kernel's (grader/launch.py) must
    assemble wherever the course runs, or every silent stop would be called the machine's."""
    from grader import launch
    if toolchain.tool("ptxas") is None:
        pytest.skip("no ptxas installed")
    cubin, log = launch.assemble(launch.KNOWN_GOOD_PTX.format(arch=arch), arch)
    assert cubin and "known_good" in log

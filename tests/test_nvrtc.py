"""CUDA kernels compiled by NVRTC with shared precompiled headers (``lowering.nvrtc``, ``TILEFUSE_NVRTC=1``): which of
nvcc's options it takes, every template's kernel compiling through it for sm_90a, and nvcc kept for the rest. The
cubins' numerics are the GPU tests' (bench/run_pending_h200.sh part 49 runs them with it on)."""

import shutil
import sys
from pathlib import Path

import pytest

from tilefuse.lowering import nvrtc

needs_nvrtc = pytest.mark.skipif(nvrtc.library() is None or shutil.which("nvcc") is None,
                                 reason="no NVRTC 12.8+ (pip install nvidia-cuda-nvrtc) or no CUDA toolkit headers")
SM90 = {"kind": "cuda", "arch": "sm_90a"}
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def test_nvccs_options_in_nvrtcs_terms_or_none_where_it_has_no_form():
    assert nvrtc.nvrtc_options(["-gencode", "arch=compute_90a,code=sm_90a"],
                               ["-std=c++20", "-I/x", "--use_fast_math", "-O3", "-lineinfo"]) == [
        "--gpu-architecture=sm_90a", "-std=c++20", "-I/x", "--use_fast_math", "-lineinfo"]
    assert nvrtc.nvrtc_options("-arch=sm_80", ["--ptxas-options=--register-usage-level=5"]) == [
        "--gpu-architecture=sm_80", "--ptxas-options=--register-usage-level=5"]
    assert nvrtc.nvrtc_options(["-arch=sm_90a"], "-w") == ["--gpu-architecture=sm_90a", "-w"]
    assert nvrtc.nvrtc_options(["-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]"], []) is None  # a fatbin
    assert nvrtc.nvrtc_options(["-gencode", "arch=compute_90a,code=compute_90a"], []) is None  # PTX, not a cubin
    assert nvrtc.nvrtc_options("-arch=sm_90a", ["-Xcompiler", "-fPIC"]) is None  # a host compiler's option
    assert nvrtc.nvrtc_options(None, []) is None


@needs_nvrtc
def test_every_templates_kernel_compiles_for_sm_90a_through_nvrtc():
    """The kernels nvcc compiles in test_templates_cuda_compile, a ws GEMM with the logpoly GELU and the ws attention
    (``bench/nvrtc_cubins.py``), each an ELF cubin from NVRTC with the options TileLang's compile callback gives nvcc
    for sm_90a."""
    import nvrtc_cubins

    requests = nvrtc_cubins.nvcc_requests()
    assert len(requests) == len(nvrtc_cubins.kernels())
    for name, source, fmt, arch, options in requests:
        opts = nvrtc.nvrtc_options(arch, options)
        assert fmt == "cubin" and opts is not None, (name, arch, options)
        assert nvrtc.compile_cubin(source, opts)[:4] == b"\x7fELF", name


@needs_nvrtc
def test_install_sends_cubins_to_nvrtc_and_the_rest_to_nvcc(monkeypatch):
    import tilelang.contrib.nvcc as tl_nvcc

    calls = []
    monkeypatch.setattr(tl_nvcc, "compile_cuda", lambda code, target_format="ptx", arch=None, options=None,
                        path_target=None, verbose=False: calls.append((target_format, options)) or bytearray(b"nvcc"))
    from tilefuse.lowering.compile import failure_reason

    assert nvrtc.install(failure_reason) and nvrtc.install(failure_reason)  # (a second call keeps the one wrapper)
    source = 'extern "C" __global__ void k(float *x) { x[threadIdx.x] = 2.0f * x[threadIdx.x]; }\n'
    sm90 = ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert tl_nvcc.compile_cuda(source, "cubin", sm90, ["-std=c++20"])[:4] == b"\x7fELF" and calls == []
    assert tl_nvcc.compile_cuda(source, "cubin", sm90, ["-Xcompiler", "-O2"]) == b"nvcc"  # no NVRTC form
    assert tl_nvcc.compile_cuda(source, "ptx", sm90, []) == b"nvcc"
    assert tl_nvcc.compile_cuda("this is not CUDA", "cubin", sm90, []) == b"nvcc"  # NVRTC refuses it: nvcc says why
    assert [c[0] for c in calls] == ["cubin", "ptx", "cubin"]


@pytest.mark.parametrize("cpus, waits", [(2, True), (16, False)])
def test_a_header_sets_later_sources_wait_for_its_pch_only_where_every_cpu_is_compiling(monkeypatch, cpus, waits):
    """Two compile threads, one header set, the first's compile (which makes the PCH) held until released: on 2 CPUs
    the second waits for it and then uses the PCH; on 16 it compiles meanwhile without one."""
    import threading

    calls, release, second_called = [], threading.Event(), threading.Event()

    def fake_compile(lib, source, opts):
        calls.append("-pch" in opts)
        if len(calls) == 1:
            assert release.wait(30)
        else:
            second_called.set()
        return b"\x7fELF"
    monkeypatch.setattr(nvrtc, "library", lambda: object())
    monkeypatch.setattr(nvrtc, "_compile", fake_compile)
    monkeypatch.setattr(nvrtc, "_made", {})
    monkeypatch.setattr(nvrtc, "WAIT", "")
    monkeypatch.setattr(nvrtc.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    source = f"#include <cuda.h>\n// {cpus}\n"
    threads = [threading.Thread(target=nvrtc.compile_cubin, args=(source, []), name=f"{nvrtc.COMPILE_THREADS}_{k}")
               for k in range(2)]
    threads[0].start()
    while not calls:  # (the first is inside its compile)
        threading.Event().wait(0.01)
    threads[1].start()
    called_meanwhile = second_called.wait(0.5 if waits else 30)
    release.set()
    for t in threads:
        t.join(30)
    assert called_meanwhile != waits and calls == [True, waits]

"""Options: every setting comes from ``TILEFUSE_<NAME>`` when an Options is constructed."""

import pytest

from tilefuse.config import Options, parse_target

C = {"kind": "c"}


def test_options_read_the_environment_when_constructed(monkeypatch):
    monkeypatch.delenv("TILEFUSE_TUNE", raising=False)
    monkeypatch.delenv("TILEFUSE_EAGER_TAIL", raising=False)
    monkeypatch.delenv("TILEFUSE_MEASURE", raising=False)  # tests/conftest.py sets it to 0 for the session
    before = Options(target=C)
    assert before.tune == "none" and before.eager_tail and before.channels_last and before.measure
    monkeypatch.setenv("TILEFUSE_TUNE", "fast")  # set after tilefuse.config was imported: it counts
    monkeypatch.setenv("TILEFUSE_EAGER_TAIL", "0")
    monkeypatch.setenv("TILEFUSE_CHANNELS_LAST", "0")
    monkeypatch.setenv("TILEFUSE_MEASURE", "0")
    monkeypatch.setenv("TILEFUSE_TUNE_SECONDS", "12.5")
    after = Options(target=C)
    assert (after.tune, after.eager_tail, after.channels_last, after.measure, after.tune_seconds) == \
        ("fast", False, False, False, 12.5)
    assert Options(target=C, tune="max").tune == "max"  # an explicit argument wins over the environment
    assert before.tune == "none"  # options already made keep what they read


@pytest.mark.parametrize("spec", ["cuda:sm_12", "cuda:sm_80a", "cuda:90", "cuda:sm_9O", {"kind": "cuda", "arch": "sm_1"}])
def test_unknown_cuda_archs_are_refused(spec):
    with pytest.raises(ValueError, match="unknown CUDA arch"):
        parse_target(spec)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120"])
def test_real_cuda_archs_pass(arch):
    assert parse_target(f"cuda:{arch}") == {"kind": "cuda", "arch": arch}
    assert parse_target({"kind": "cuda", "arch": arch})["arch"] == arch


def test_a_compile_failure_says_the_compiler_s_error_not_the_source_s_first_line():
    from tilefuse.lowering.compile import failure_reason

    tilelang_style = RuntimeError("#if defined(_MSC_VER) && !defined(__clang__)\n#include <cuda.h>\n__global__ void k() {}"
                                  "\n\n\nCompilation error:\nnvcc warning : something\nnvcc fatal   : Unsupported gpu "
                                  "architecture 'sm_70'\n\nCommand: /usr/local/bin/nvcc --cubin -arch=sm_70 x.cu\n")
    assert failure_reason(tilelang_style) == "nvcc fatal   : Unsupported gpu architecture 'sm_70'"
    assert failure_reason(ValueError("template refuses block_M=7\ndetails")) == "template refuses block_M=7"
    assert failure_reason(RuntimeError("")) == "RuntimeError"

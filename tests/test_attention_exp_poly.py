"""``flash_attention(ws=True, exp_poly=k)``: a share of the softmax's exponents computed on the FMA units
(``common.poly_exp2``) instead of MUFU. The form against ``exp2`` in float64 on the ``c`` target (every value
of a range, the clamp's edge, -inf, NaN), the share it takes in the sm_90a kernel (PTX's ``ex2.approx`` count), and
the options it refuses. Its GPU numerics are ``test_attention_ws``'s variants ``exp_poly`` and ``exp_poly_half``."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import tilelang.language as T
import torch

from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.templates import attention, common

SM90 = {"kind": "cuda", "arch": "sm_90a"}


def test_poly_exp2_matches_exp2_on_c(rng):
    n = 4096
    edges = [0.0, -0.0, -1e-30, -0.5, -1.5, -2.5, -124.5, -125.0, -125.25, -126.0, -1e4, -float("inf"), float("nan")]

    @T.prim_func
    def k(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=1):
            for i in T.serial(n):
                Y[i] = common.poly_exp2(X[i])

    kernel = compile_kernel(k, {"kind": "c"}, out_idx=[1])
    for _ in range(2):  # fresh values each round
        x = torch.cat([-torch.rand(n - len(edges), generator=rng, dtype=torch.float64) * 130,
                       torch.tensor(edges, dtype=torch.float64)]).float()
        y = kernel(x).double()
        want = torch.exp2(x.double())
        kept = x >= -125
        # within the fit's 7.5e-5 of 2^x wherever 2^x is a normal float32, 0 below (flushed, as MUFU's .ftz), NaN kept
        assert ((y[kept] - want[kept]).abs() <= 7.6e-5 * want[kept]).all()
        assert (y[x < -125] == 0).all() and y[x.isnan()].isnan().all() and not y[~x.isnan()].isnan().any()
        assert y[-len(edges)] == pytest.approx(1.0, rel=7.6e-5)


def _source(exp_poly=0, D=64, **kw):
    cfg = [c for c in attention.get_configs(SM90, D, ws=True) if c.get("ws")][0]
    return kernel_source(attention.flash_attention(32, 12, 512, 512, D, dtype="float16", target=SM90,
                                                   exp_poly=exp_poly, **{**cfg, **kw}), SM90)


def test_exp_poly_selects_whole_register_blocks_and_only_when_asked():
    plain, poly = _source(), _source(4)
    assert "0x1.8p+23f" not in plain and "0x1.8p+23f" in poly  # (the rounding shift: the form is there)
    # the choice folds once unrolled: it reads the unrolled index alone, never the thread's
    tests = re.findall(r"if \(\(\(\(i_\d+ & 15\) >> 2\) == 3\)\)", poly)
    assert len(tests) == 2  # the first key tile's softmax and the loop's
    assert _source(2).count("& 7) >> 2) == 1))") == 2


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("exp_poly,share", [(0, 0), (4, 4), (2, 2)])
def test_exp_poly_takes_its_share_of_the_exponents_off_mufu(exp_poly, share, tmp_path):
    """Each thread computes 64 exponents a key tile (128 x 128 over 256 threads) at two sites, and two for the
    rescale: 130 ``ex2.approx`` in PTX, and with ``exp_poly=k`` 64 / k fewer at each site."""
    import tilelang.contrib.nvcc as tl_nvcc

    src = tmp_path / "k.cu"
    src.write_text(_source(exp_poly))
    cmd = [tl_nvcc.get_nvcc_compiler(), "-std=c++17", "-O3", "-arch=sm_90a", "-ptx", "--use_fast_math",
           f"-I{tl_nvcc.TILELANG_TEMPLATE_PATH}", f"-I{tl_nvcc.CUTLASS_INCLUDE_DIR}", "-DENABLE_BF16", str(src), "-o",
           str(tmp_path / "k.ptx")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert ptx.count("ex2.approx") == 130 - (2 * 64 // share if share else 0)


def test_exp_poly_refuses_what_it_cannot_split():
    for bad in (1, 3, 32):  # one block in one; 3 does not divide 16 blocks; more than 16
        with pytest.raises(ValueError, match="exp_poly"):
            _source(bad)
    with pytest.raises(ValueError, match="options of ws=True"):
        attention.flash_attention(2, 4, 256, 256, 64, dtype="float16", target=SM90, exp_poly=4)

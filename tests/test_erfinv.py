"""erfinv end to end: the op every layer needs to run it fused (the registry entry's traits, one emitter in
lowering/emitters.py), through torch.compile on ``c`` against eager, alone and in a GEMM epilogue, its edge values
included, and its CUDA source through nvcc."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse.ir import TensorType
from tilefuse.lowering.compile import kernel_source
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.lower import make_prim_func
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import plan

EDGES = [1.0, -1.0, 1.5, -2.0, math.nan, 0.0, -0.0, 0.999999, -0.999999, 1e-30, math.inf]


def _compiled(fn, runners):
    torch._dynamo.reset()
    return torch.compile(fn, backend=make_backend(Options(target=parse_target("c"), measure=False,
                                                          observer=runners.append)))


def _check(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float | None = None):
    """Every element: NaN where eager has NaN, the same infinities and zero signs, the rest within ``rtol``."""
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    fin = torch.isfinite(want)
    assert torch.equal(got[~fin & ~torch.isnan(want)], want[~fin & ~torch.isnan(want)])
    zero = want == 0
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero]))
    torch.testing.assert_close(got[fin], want[fin], rtol=rtol, atol=rtol * 1e-3 if atol is None else atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_erfinv_runs_as_a_kernel_and_matches_eager(dtype, rng):
    runners = []
    f = _compiled(lambda x: torch.erfinv(x * 0.5), runners)
    x = torch.cat([torch.rand(4093, generator=rng) * 4 - 2, torch.tensor(EDGES) * 2]).to(dtype)
    with torch.no_grad():
        got, want = f(x), torch.erfinv(x * 0.5)
    _check(got.float(), want.float(), 2e-5 if dtype == torch.float32 else 1e-2)
    (runner,) = runners
    assert [r.backend for r in runner.plan.regions if r.launches] == ["tilelang"]


def test_erfinv_fuses_into_a_gemm_epilogue(rng):
    runners = []
    w = torch.randn(48, 32, generator=rng)
    f = _compiled(lambda x: torch.erfinv(torch.tanh(x @ w.t()) * 0.9), runners)
    x = torch.randn(64, 32, generator=rng)
    with torch.no_grad():
        got, want = f(x), torch.erfinv(torch.tanh(x @ w.t()) * 0.9)  # (away from +-1, where a last-bit tanh explodes)
    _check(got, want, 2e-5, atol=1e-5)  # (the GEMM's own summation order, as every fp32 GEMM test allows)
    gemm = [r for r in runners[0].plan.regions if r.kind == "gemm"]
    assert len(gemm) == 1 and "erfinv" in gemm[0].ops and gemm[0].backend == "tilelang"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_erfinv_cuda_source_compiles():
    from tilefuse.lowering.compile import compile_kernel

    target = {"kind": "cuda", "arch": "sm_90a"}
    b = GraphBuilder("erfinv_cuda")
    x = b.input("x", TensorType((128, 256), "float16"))
    g = b.build([b.add1("erfinv", [x])])
    p = plan(g, target)
    (region,) = [r for r in p.regions if r.backend == "tilelang"]
    func = make_prim_func(build(region, p.graph, target), target)
    assert "copysignf" in kernel_source(func, target) or "copysign" in kernel_source(func, target)
    compile_kernel(func, target, [-1])  # nvcc: no GPU needed

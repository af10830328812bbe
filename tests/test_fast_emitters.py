"""``lowering.emitters.FAST_EMITTERS``' arithmetic, evaluated in float32 with torch standing in for TileLang (its
``__fdividef`` and ``ex2.approx`` as exact float32 operations: their own error, ~1e-7 relative, is far below what is
checked here): every form against float64, its edge values as torch's CUDA kernels give them. Where each form is used,
and its CUDA numerics, are in ``tests/test_gemm_ws.py``."""

from __future__ import annotations

import math
import types

import pytest
import torch

from tilefuse.lowering import emitters


@pytest.fixture
def shim(monkeypatch):
    """A stand-in for ``tilelang.language`` over float32 tensors."""
    monkeypatch.setattr(emitters, "_c", lambda x, v: torch.tensor(v, dtype=x.dtype))

    def pure(dtype, name, *args):
        assert name == "__fdividef"
        return torch.div(*args)

    t = types.SimpleNamespace(call_pure_extern=pure)
    setattr(t, "__exp", torch.exp)
    return t


def test_the_fast_forms_edge_values_are_torchs(shim):
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0])
    sig = emitters._fast_sigmoid(shim, x)
    assert torch.isnan(sig[0]) and sig[1] == 1 and sig[2] == 0 and sig[3] == 0.5
    tanh = emitters._fast_gelu_tanh(shim, x)
    assert torch.isnan(tanh[0]) and tanh[1] == math.inf and torch.isnan(tanh[2])  # (as torch's CUDA gelu)
    assert tanh[3] == 0 and not torch.signbit(tanh[3]) and tanh[4] == 0 and torch.signbit(tanh[4])


def test_the_fast_sigmoid_and_tanh_gelu_are_within_their_stated_error(shim):
    x = torch.linspace(-60, 60, 120001, dtype=torch.float32)
    xd = x.double()
    sig = emitters._fast_sigmoid(shim, x).double()
    assert ((sig - torch.sigmoid(xd)).abs() / torch.sigmoid(xd)).max() < 1e-6
    tanh = emitters._fast_gelu_tanh(shim, x[x.abs() < 8]).double()
    xd = xd[x.abs() < 8]  # (0.5 x (1 + tanh z) as x sigmoid(2 z): float64's tanh form cancels to 0 below x = -7)
    want = xd * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3))
    big = want.abs() > 1e-30
    assert ((tanh - want).abs()[big] / want.abs()[big]).max() < 1e-5


def _logpoly_gelu_in_torch(x):
    """``emitters.logpoly_gelu``, the very code the TIR form is built from, in float32 torch arithmetic."""
    def c(v):
        return torch.tensor(v, dtype=torch.float32)
    return emitters.logpoly_gelu(x, c=c, absolute=torch.abs, exp=torch.exp, select=torch.where,
                                 bind=lambda v, body: body(v))


def test_the_logpoly_gelu_is_exact_gelu_to_within_an_fp16_outputs_rounding():
    """The GELU of an epilogue rounded straight to fp16 (``ROUNDED_EMITTERS``): relative error under 1e-5 wherever
    GELU is an fp16 value, fp16 outputs rounded as exact GELU's but for a fraction of a percent (eager's fp32 formula:
    a few percent), and NaN, the infinities and signed zeros as torch gives them."""
    def exact_gelu(x):  # x Phi(x) in float64, Phi by log_ndtr (no 1 + erf cancelling)
        return x.double() * torch.exp(torch.special.log_ndtr(x.double()))
    g = torch.Generator().manual_seed(0)
    for x in (torch.linspace(-8, 8, 400_001), torch.randn(1_000_000, generator=g) * 2):
        ours = _logpoly_gelu_in_torch(x)
        exact = exact_gelu(x)
        seen = exact.abs() > 6e-8  # an fp16 output's values (subnormals included)
        assert ((ours.double() - exact).abs() / exact.abs())[seen].max() < 1e-5
        flips = (ours.half() != exact.half()).double().mean()
        assert flips < 3e-3 and flips < (torch.nn.functional.gelu(x).half() != exact.half()).double().mean()
    edge = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -1e-30, 100.0, -100.0, 3e38,
                         -3e38, 5.7, -5.7])
    got, want = _logpoly_gelu_in_torch(edge), exact_gelu(edge)  # (NaN at -inf: -inf * 0, as the erff formula gives)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()].half(), want[~want.isnan()].half())
    assert torch.equal(torch.signbit(got[3:5]), torch.signbit(want[3:5]))  # +0 and -0
    far = -torch.logspace(0.76, 38, 200_000)  # past 5.7 (no clamp): the polynomial's tail rounds to -0 as GELU's does
    assert torch.equal(_logpoly_gelu_in_torch(far).half(), exact_gelu(far).half())
    assert got[-1].half() == -2.0 ** -24  # GELU(-5.7) = -3.4e-8 rounds to fp16's least subnormal (eager's fp32: -0)


def test_the_bf16_logpoly_gelu_is_exact_gelu_to_within_a_bf16_outputs_rounding():
    """``LOGPHI_BF16`` (fitted out to bf16's reach of GELU's tail, t = 13.5): relative error under 1e-4 wherever GELU
    is a bf16 normal value, bf16 outputs rounded as exact GELU's but for well under 1% (eager's fp32 formula, its
    1 + erf cancelling, many more), and past 13.5 the same bf16 value as exact GELU's."""
    def gelu(x):
        return emitters.logpoly_gelu(x, c=lambda v: torch.tensor(v, dtype=torch.float32), absolute=torch.abs,
                                     exp=torch.exp, select=torch.where, bind=lambda v, body: body(v),
                                     coefficients=emitters.LOGPHI_BF16)

    def exact_gelu(x):
        return x.double() * torch.exp(torch.special.log_ndtr(x.double()))
    g = torch.Generator().manual_seed(0)
    for x in (torch.linspace(-14, 14, 560_001), torch.randn(1_000_000, generator=g) * 3):
        ours, exact = gelu(x), exact_gelu(x)
        seen = exact.abs() > 1.2e-38  # (bf16's normal values)
        assert ((ours.double() - exact).abs() / exact.abs())[seen].max() < 1e-4
        flips = (ours.bfloat16() != exact.bfloat16()).double().mean()
        assert flips < 1e-2 and flips < (torch.nn.functional.gelu(x).bfloat16() != exact.bfloat16()).double().mean()
    far = -torch.logspace(1.1303, 38, 200_000)  # (t from 13.5 on)
    assert torch.equal(gelu(far).bfloat16(), exact_gelu(far).bfloat16())
    edge = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38])
    got, want = gelu(edge), exact_gelu(edge)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()].bfloat16(),
                                                                   want[~want.isnan()].bfloat16())
    assert torch.equal(torch.signbit(got[3:5]), torch.signbit(want[3:5]))

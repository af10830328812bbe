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

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
    monkeypatch.setattr(emitters, "_let", lambda T, value, body: body(value))
    def pure(dtype, name, *args):
        assert name == "__fdividef"
        return torch.div(*args)

    t = types.SimpleNamespace(abs=torch.abs, call_pure_extern=pure, Select=torch.where)
    setattr(t, "__exp", torch.exp)
    return t


def _values() -> torch.Tensor:
    dense = torch.linspace(-14, 14, 280001, dtype=torch.float32)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 20.0, -20.0, 80.0, -80.0, 1e30, -1e30])
    return torch.cat([dense, edges])


def test_the_fast_exact_gelu_is_within_2e_5_relative_of_float64_everywhere(shim):
    x = _values()
    got = emitters._fast_gelu_erf(shim, x).double()
    xd = x.double()
    want = 0.5 * xd * torch.special.erfc(-xd / math.sqrt(2.0))
    big = want.abs() > 1e-30
    assert ((got[big] - want[big]).abs() / want[big].abs()).max() < 2e-5
    assert (got[~big].abs() <= 1e-30).all()
    # torch's own float32 form cancels below x = -3 (1 + erf(x / sqrt 2)): the fast one is closer to float64 there
    tail = (x < -4) & big
    torch_err = ((torch.nn.functional.gelu(x).double() - want).abs() / want.abs())[tail]
    assert ((got - want).abs() / want.abs())[tail].max() < torch_err.max() / 100


def test_the_fast_forms_edge_values_are_torchs(shim):
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0])
    gelu = emitters._fast_gelu_erf(shim, x)
    assert torch.isnan(gelu[0]) and gelu[1] == math.inf and torch.isnan(gelu[2])  # (as torch's CUDA gelu)
    assert gelu[3] == 0 and not torch.signbit(gelu[3]) and gelu[4] == 0 and torch.signbit(gelu[4])
    sig = emitters._fast_sigmoid(shim, x)
    assert torch.isnan(sig[0]) and sig[1] == 1 and sig[2] == 0 and sig[3] == 0.5
    tanh = emitters._fast_gelu_tanh(shim, x)
    assert torch.isnan(tanh[0]) and tanh[1] == math.inf and torch.isnan(tanh[2])


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

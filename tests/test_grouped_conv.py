"""Grouped and depthwise convolutions (MobileNet, MobileViT, ConvNeXt, EfficientNet) as elementwise kernels that sum
each output's taps (``lowering/conv_builder.py``, ``_grouped_conv``), their epilogues fused, every element against
torch: strides, dilations, padding on one side only, NaN and infinities, NCHW and channels last."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tilefuse
from tilefuse.capture import capture_graphs
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.conv_builder import MAX_TAPS
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.templates import conv, elementwise
from tilefuse.pipeline import plan

FP32 = {"rtol": 1e-4, "atol": 1e-5}


class Grouped(nn.Module):
    """Depthwise 3x3 + SiLU, depthwise 7x7 (no bias) + a residual, a grouped strided 3x3 + batch norm + ReLU, a
    dilated depthwise one padded on the left only, and a depthwise one with a channel multiplier of 2."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.dw7 = nn.Conv2d(8, 8, 7, padding=3, groups=8, bias=False)
        self.g = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=4)
        self.bn = nn.BatchNorm2d(16)
        self.dil = nn.Conv2d(16, 16, (3, 2), dilation=(2, 1), padding=(2, 0), groups=16)
        self.mult = nn.Conv2d(16, 32, 3, stride=(1, 2), groups=16)

    def forward(self, x):
        y = F.silu(self.dw(x))
        y = self.dw7(y) + x
        y = torch.relu(self.bn(self.g(y)))
        return self.mult(self.dil(y))


@pytest.fixture
def model(with_norm_statistics):
    return with_norm_statistics(Grouped())


def edgy(rng, *shape):
    x = torch.randn(*shape, generator=rng)
    x[0, 0, 0, 0], x[1, 3, 5, 5], x[1, 6, -1, -1] = float("nan"), float("inf"), -float("inf")
    return x


@pytest.mark.parametrize("channels_last", ["1", "0"])
def test_grouped_convolutions_are_kernels_and_match_torch(model, rng, monkeypatch, channels_last):
    monkeypatch.setenv("TILEFUSE_CHANNELS_LAST", channels_last)
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append, measure=False)
    with torch.no_grad():
        for x in (torch.randn(2, 8, 13, 11, generator=rng), edgy(rng, 2, 8, 13, 11)):
            torch.testing.assert_close(compiled(x), model(x), equal_nan=True, **FP32)
    regions = [r for r in runners[0].plan.regions if "conv" in r.ops]
    assert len(regions) == 5 and all(r.backend == "tilelang" for r in regions), runners[0].plan.to_text()
    torch._dynamo.reset()


class Wide(nn.Module):
    """Grouped convolutions with more taps than the elementwise kernel unrolls: ResNeXt's 3x3 over 8 channels a group
    (72 taps) with batch norm and ReLU, a strided one with 2 output channels a group (72 taps) and a residual, and a
    1-D one as wav2vec2's positional convolution (16 channels a group, 16 taps: 256) with GELU."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 16, 3, padding=1, groups=2, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.b = nn.Conv2d(16, 4, 3, stride=2, padding=1, groups=2)
        self.pos = nn.Conv1d(32, 32, 16, padding=8, groups=2)

    def forward(self, x, seq):
        y = torch.relu(self.bn(self.a(x)))
        y = self.b(y) + y[:, :4, ::2, ::2]
        return y, F.gelu(self.pos(seq))


@pytest.mark.parametrize("channels_last", ["1", "0"])
def test_grouped_convolutions_with_many_taps_are_a_gemm_a_group(rng, with_norm_statistics, monkeypatch,
                                                                channels_last):
    monkeypatch.setenv("TILEFUSE_CHANNELS_LAST", channels_last)
    m = with_norm_statistics(Wide())
    assert 8 * 9 > MAX_TAPS and 16 * 16 > MAX_TAPS
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(m, target="c", observer=runners.append, measure=False)
    seq = torch.randn(2, 32, 40, generator=rng)
    seq[1, 3, 7] = float("nan")
    with torch.no_grad():
        for x in (torch.randn(2, 16, 10, 9, generator=rng), edgy(rng, 2, 16, 10, 9)):
            for got, want in zip(compiled(x, seq), m(x, seq)):
                torch.testing.assert_close(got, want, equal_nan=True, **FP32)
    p = runners[0].plan
    regions = [r for r in p.regions if "conv" in r.ops]
    assert len(regions) == 3 and all(r.backend == "tilelang" for r in regions), p.to_text()
    specs = [build(r, p.graph, {"kind": "c"}) for r in regions]
    assert [(s.template, dict(s.params)["groups"]) for s in specs] == [("conv2d", 2)] * 3
    torch._dynamo.reset()


def _spec(model, x, target):
    (graph,) = capture_graphs(model, (x,))
    p = plan(graph, target)
    return [build(r, p.graph, target) for r in p.regions if "conv" in r.ops]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_depthwise_convolution_compiles_for_sm90(rng):
    target = {"kind": "cuda", "arch": "sm_90a"}
    m = nn.Sequential(nn.Conv2d(8, 8, 7, padding=3, groups=8), nn.GELU()).eval().half()
    (spec,) = _spec(m, torch.randn(2, 8, 14, 14, dtype=torch.float16, generator=None), target)
    assert spec.template == "elementwise"
    f = elementwise.elementwise(**spec.factory_kwargs(), target=target)
    assert compile_kernel(f, target, out_idx=[-1]) is not None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_resnext_grouped_convolution_compiles_for_sm90():
    target = {"kind": "cuda", "arch": "sm_90a"}
    for c, groups in ((256, 32), (1024, 32)):  # ResNeXt-50 32x4d's layer2 (8 channels a group) and layer4 (32)
        m = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=groups), nn.ReLU()).eval().half()
        (spec,) = _spec(m, torch.randn(2, c, 14, 14, dtype=torch.float16), target)
        assert spec.template == "conv2d" and dict(spec.params)["groups"] == groups
        for config in conv.get_configs(target)[:2]:  # (tiles narrowed to the group's channels)
            f = conv.conv2d(**spec.factory_kwargs(), **config, target=target)
            assert compile_kernel(f, target, out_idx=[-1]) is not None


@pytest.mark.gpu
def test_grouped_convolutions_match_torch_on_the_gpu(model, rng):
    torch._dynamo.reset()
    m = model.cuda().half()
    runners = []
    compiled = tilefuse.compile(m, observer=runners.append, measure=False)
    x = torch.randn(4, 8, 28, 28, generator=rng).cuda().half()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-2, atol=1e-2)
    assert all(r.backend == "tilelang" for r in runners[0].plan.regions if "conv" in r.ops)
    torch._dynamo.reset()


@pytest.mark.gpu
def test_grouped_convolutions_with_many_taps_match_torch_on_the_gpu(rng):
    torch._dynamo.reset()
    m = Wide().eval().cuda().half()
    runners = []
    compiled = tilefuse.compile(m, observer=runners.append, measure=False)
    x = torch.randn(4, 16, 28, 28, generator=rng).cuda().half()
    seq = torch.randn(2, 32, 200, generator=rng).cuda().half()
    with torch.no_grad():
        for got, want in zip(compiled(x, seq), m(x, seq)):
            torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-2)
    assert all(r.backend == "tilelang" for r in runners[0].plan.regions if "conv" in r.ops)
    torch._dynamo.reset()

"""1-D convolutions (Whisper's and wav2vec2's front ends, conformer blocks) as the 2-D templates' kernels: a
``(N, C, L)`` input is read as ``(N, C, 1, L)`` (``lowering/conv_builder.py``, ``conv_geometry``), so each runs as the
convolution template, a batched GEMM (1x1) or the grouped kernel, its epilogue fused. Every element against torch:
strides, dilation, padding, groups, batch norm, a residual, NaN and infinities."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tilefuse
from tilefuse.capture import capture_graphs
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.conv_builder import conv_geometry
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.templates import conv
from tilefuse.pipeline import plan

FP32 = {"rtol": 1e-4, "atol": 1e-5}


class Audio(nn.Module):
    """Whisper's two front convolutions (3 taps, the second strided, each with GELU), a depthwise one with batch norm,
    ReLU and a residual, a 1x1 one, a dilated grouped one with SiLU, and one without bias reading its input at
    ``padding=0`` (wav2vec2's feature extractor)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(8, 16, 3, padding=1)
        self.b = nn.Conv1d(16, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv1d(16, 16, 5, padding=2, groups=16)
        self.bn = nn.BatchNorm1d(16)
        self.pw = nn.Conv1d(16, 24, 1)
        self.g = nn.Conv1d(24, 24, 3, padding=2, dilation=2, groups=4)
        self.fe = nn.Conv1d(24, 12, 4, stride=3, bias=False)

    def forward(self, x):
        y = F.gelu(self.a(x))
        y = F.gelu(self.b(y))
        y = torch.relu(self.bn(self.dw(y))) + y
        y = F.silu(self.g(self.pw(y)))
        return self.fe(y)


@pytest.fixture
def model(with_norm_statistics):
    return with_norm_statistics(Audio())


def edgy(rng, *shape):
    x = torch.randn(*shape, generator=rng)
    x[0, 0, 0], x[1, 3, 7], x[1, 6, -1] = float("nan"), float("inf"), -float("inf")
    return x


def test_one_d_convolutions_are_kernels_and_match_torch(model, rng):
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append, measure=False)
    with torch.no_grad():
        for x in (torch.randn(2, 8, 29, generator=rng), edgy(rng, 2, 8, 29)):
            torch.testing.assert_close(compiled(x), model(x), equal_nan=True, **FP32)
    p = runners[0].plan
    regions = [r for r in p.regions if "conv" in r.ops]
    assert len(regions) == 6 and all(r.backend == "tilelang" for r in regions), p.to_text()
    assert any("batch_norm" in r.ops and "add" in r.ops for r in regions), p.to_text()  # the epilogue fused
    torch._dynamo.reset()


def test_the_geometry_of_a_one_d_convolution():
    g = conv_geometry((2, 8, 29), (16, 4, 3), (2, 16, 14), {"stride": (2,), "padding": (1,), "dilation": (1,),
                                                              "groups": 2})
    assert (g.x_shape, g.w_shape, g.out_shape) == ((2, 8, 1, 29), (16, 4, 1, 3), (2, 16, 1, 14))
    assert (g.stride, g.padding, g.dilation, g.groups) == ((1, 2), (0, 1), (1, 1), 2)
    assert g.one_d and (g.x_view, g.w_view) == (g.x_shape, g.w_shape)
    two = conv_geometry((2, 8, 9, 9), (16, 8, 3, 3), (2, 16, 9, 9), {"padding": (1, 1)})
    assert not two.one_d and two.x_view is None and two.stride == (1, 1)


def test_unbatched_convolutions_are_kernels_and_a_three_d_one_runs_through_torch_with_the_reason(rng):
    """torch unsqueezes an unbatched input before the convolution: the kernel reads it through that view."""
    cases = ((nn.Conv1d(2, 4, 3, padding=1), torch.randn(2, 9, generator=rng), "tilelang"),
             (nn.Conv2d(2, 4, 3, stride=2), torch.randn(2, 7, 9, generator=rng), "tilelang"),
             (nn.Conv3d(2, 4, 3), torch.randn(1, 2, 5, 5, 5, generator=rng), "torch"))
    for m, x, backend in cases:
        (graph,) = capture_graphs(m.eval(), (x,))
        p = plan(graph, {"kind": "c"})
        (region,) = [r for r in p.regions if "conv" in r.ops]
        assert region.backend == backend, p.to_text()
        assert backend == "tilelang" or "only 1-D and 2-D convolutions" in p.to_text()
        torch._dynamo.reset()
        compiled = tilefuse.compile(m, target="c", measure=False)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), m(x), **FP32)
        torch._dynamo.reset()


def test_a_one_d_convolution_through_onnx_matches_torch(tmp_path, rng):
    onnx = pytest.importorskip("onnx")
    m = nn.Sequential(nn.Conv1d(4, 8, 3, stride=2, padding=1), nn.GELU(), nn.Conv1d(8, 8, 3, padding=1, groups=8),
                      nn.ReLU()).eval()
    x = torch.randn(2, 4, 17, generator=rng)
    path = tmp_path / "conv1d.onnx"
    torch.onnx.export(m, (x,), str(path), dynamo=False, input_names=["x"])
    assert onnx.load(str(path)).graph.node
    model = tilefuse.compile_onnx(str(path), target="c", measure=False)
    p = model.plan
    assert all(r.backend == "tilelang" for r in p.regions if "conv" in r.ops), p.to_text()
    torch.testing.assert_close(model(x)[0], m(x).detach(), **FP32)


def _spec(model, x, target):
    (graph,) = capture_graphs(model, (x,))
    p = plan(graph, target)
    return [build(r, p.graph, target) for r in p.regions if "conv" in r.ops]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_one_d_convolution_compiles_for_sm90():
    target = {"kind": "cuda", "arch": "sm_90a"}
    m = nn.Sequential(nn.Conv1d(64, 128, 3, stride=2, padding=1), nn.GELU()).eval().half()
    (spec,) = _spec(m, torch.randn(2, 64, 100, dtype=torch.float16), target)
    assert spec.template == "conv2d" and dict(spec.params)["x_shape"] == (2, 64, 1, 100)
    f = conv.conv2d(**spec.factory_kwargs(), target=target)
    assert compile_kernel(f, target, out_idx=[-1]) is not None


@pytest.mark.gpu
def test_one_d_convolutions_match_torch_on_the_gpu(model, rng):
    torch._dynamo.reset()
    m = model.cuda().half()
    runners = []
    compiled = tilefuse.compile(m, observer=runners.append, measure=False)
    with torch.no_grad():
        for x in (torch.randn(2, 8, 29, generator=rng), edgy(rng, 2, 8, 29)):
            x = x.cuda().half()
            torch.testing.assert_close(compiled(x), m(x), equal_nan=True, rtol=1e-2, atol=1e-2)
    regions = [r for r in runners[0].plan.regions if "conv" in r.ops]
    assert all(r.backend == "tilelang" for r in regions), runners[0].plan.to_text()
    torch._dynamo.reset()

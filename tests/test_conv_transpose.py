"""Transposed convolutions (U-Net decoders, GAN generators, vocoders' upsampling, SAM's mask decoder) as the
convolution template's implicit GEMM (``templates/conv.py``, ``transposed``): an output element gathers the input
elements whose stride-spread copies land on its taps. 1-D and 2-D, strides, padding, output padding, dilation, groups,
the epilogue fused, NaN and infinities; every element against torch."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import tilefuse
from tilefuse.capture import capture_graphs
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.templates import conv
from tilefuse.pipeline import plan

FP32 = {"rtol": 1e-4, "atol": 1e-5}


class Up(nn.Module):
    """A U-Net's 2x upsampling (4x4, stride 2, padding 1) with ReLU, a strided one with output padding, dilation and
    groups plus a residual-free batch norm, and a vocoder's 1-D upsampling (16 taps, stride 8) with a leaky ReLU."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 6, 4, stride=2, padding=1)
        self.odd = nn.ConvTranspose2d(6, 4, 3, stride=(2, 3), padding=(1, 0), output_padding=(1, 2), dilation=(1, 2),
                                      groups=2, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.voc = nn.ConvTranspose1d(8, 4, 16, stride=8, padding=4)

    def forward(self, x, mel):
        y = self.bn(self.odd(torch.relu(self.up(x))))
        return y, F.leaky_relu(self.voc(mel), 0.1)


@pytest.fixture
def model(with_norm_statistics):
    return with_norm_statistics(Up())


def test_transposed_convolutions_are_kernels_and_match_torch(model, rng):
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append, measure=False)
    x, mel = torch.randn(2, 8, 5, 6, generator=rng), torch.randn(2, 8, 9, generator=rng)
    edgy = x.clone()
    edgy[0, 0, 0, 0], edgy[1, 3, 2, 2], edgy[1, 7, -1, -1] = float("nan"), float("inf"), -float("inf")
    with torch.no_grad():
        for xx in (x, edgy):
            for got, want in zip(compiled(xx, mel), model(xx, mel)):
                torch.testing.assert_close(got, want, equal_nan=True, **FP32)
    p = runners[0].plan
    regions = [r for r in p.regions if "conv_transpose" in r.ops]
    assert len(regions) == 3 and all(r.backend == "tilelang" for r in regions), p.to_text()
    assert any("batch_norm" in r.ops for r in regions) and any("leaky_relu" in r.ops for r in regions), p.to_text()
    torch._dynamo.reset()


def test_an_onnx_conv_transpose_with_asymmetric_pads_matches_onnxruntime(rng):
    ort = pytest.importorskip("onnxruntime")
    w = torch.randn(3, 2, 3, 3, generator=rng).numpy()
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[0, 1, 1, 0],
                            output_padding=[1, 0])
    graph = helper.make_graph([node], "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
                              initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    x = torch.randn(1, 3, 4, 5, generator=rng)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    compiled = tilefuse.compile_onnx(m, target="c", measure=False)
    np.testing.assert_allclose(compiled(x)[0].numpy(), want[0], rtol=1e-5, atol=1e-5)
    assert any("conv_transpose" in r.ops and r.backend == "tilelang" for r in compiled.plan.regions)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_transposed_convolution_compiles_for_sm90():
    target = {"kind": "cuda", "arch": "sm_90a"}
    m = nn.Sequential(nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.SiLU()).eval().half()
    (graph,) = capture_graphs(m, (torch.randn(2, 64, 16, 16, dtype=torch.float16),))
    p = plan(graph, target)
    (spec,) = [build(r, p.graph, target) for r in p.regions if "conv_transpose" in r.ops]
    assert spec.template == "conv2d" and dict(spec.params)["transposed"]
    f = conv.conv2d(**spec.factory_kwargs(), **conv.get_configs(target)[0], target=target)
    assert compile_kernel(f, target, out_idx=[-1]) is not None


@pytest.mark.gpu
def test_transposed_convolutions_match_torch_on_the_gpu(model, rng):
    torch._dynamo.reset()
    m = model.cuda().half()
    runners = []
    compiled = tilefuse.compile(m, observer=runners.append, measure=False)
    x, mel = torch.randn(4, 8, 20, 24, generator=rng).cuda().half(), torch.randn(2, 8, 50, generator=rng).cuda().half()
    with torch.no_grad():
        for got, want in zip(compiled(x, mel), m(x, mel)):
            torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-2)
    assert all(r.backend == "tilelang" for r in runners[0].plan.regions if "conv_transpose" in r.ops)
    torch._dynamo.reset()

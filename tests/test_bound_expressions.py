"""Large elementwise expressions compute their shared and large parts once, into locals (``expr.Env.bind``), so that
TileLang's passes see small expressions: a bilinear resize's fused gathers once unfolded to a tree TVM never finished
simplifying (MobileViT hung its compile). Bound or not, every element is what the torch reference computes."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from test_templates_c import OP_CASES
from torch import nn

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse.lowering import expr as E
from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.templates import elementwise

C = {"kind": "c"}
FP32 = {"rtol": 1e-5, "atol": 1e-5}


def edgy(rng, shape):
    """N(0, 1) with NaN, +-inf, +-0.0 and large values at fixed places."""
    x = torch.randn(shape, generator=rng)
    flat = x.view(-1)
    flat[:7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30, -1e30])
    return x


def deep(levels: int):
    """An expression that reads its previous level twice at every level: 2**levels nodes unfolded as a tree."""
    e = Acc()
    for i in range(levels):
        e = call("maximum", e * 0.9 + Arg(1), call("minimum", e, Arg(1) + float(i)))
    return e


@pytest.fixture
def bind_all(monkeypatch):
    monkeypatch.setattr(elementwise, "BIND_LARGER_THAN", 0)


def test_every_op_bound_to_locals_computes_what_torch_does(rng, monkeypatch):
    names = sorted(OP_CASES)
    exprs = [OP_CASES[n] for n in names]
    shape = (3, 67)

    def kernel(bind_above: int):
        monkeypatch.setattr(elementwise, "BIND_LARGER_THAN", bind_above)
        f = elementwise.elementwise([shape, shape], ["float32", "float32"], exprs, ["float32"] * len(exprs), target=C)
        assert ("v[1];" in kernel_source(f, C)) == (bind_above == 0)  # (locals: the bound path)
        return compile_kernel(f, C, out_idx=list(range(2, 2 + len(exprs))))

    bound, plain = kernel(0), kernel(10**9)
    x, y = torch.randn(shape, generator=rng), torch.randn(shape, generator=rng)
    refs = elementwise.reference([x, y], exprs, ["float32"] * len(exprs))
    for name, out, ref in zip(names, bound(x, y), refs):
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=2e-6, msg=lambda m, name=name: f"op {name}: {m}")
    # NaN, infinities, signed zeros: bound or not, the same bits (torch's CPU gelu(inf) is NaN; ours is inf)
    x, y = edgy(rng, shape), edgy(rng, shape).flip(1)
    for name, a, b in zip(names, bound(x, y), plain(x, y)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m, name=name: f"op {name}: {m}")


def test_a_deep_shared_expression_emits_small(rng):
    e = deep(10)
    assert E.tree_size([e]) > 10_000 > elementwise.BIND_LARGER_THAN
    f = elementwise.elementwise([(3, 67), (3, 67)], ["float32", "float32"], [e], ["float32"], target=C)
    assert len(f.script()) < 20_000  # each level once, not 2**10 times
    x, y = edgy(rng, (3, 67)), torch.randn(3, 67, generator=rng)
    (ref,) = elementwise.reference([x, y], [e], ["float32"])
    torch.testing.assert_close(compile_kernel(f, C, out_idx=[-1])(x, y), ref, equal_nan=True, **FP32)


def test_small_expressions_are_emitted_as_before():
    e = call("gelu", Acc() + Arg(1))
    f = elementwise.elementwise([(3, 67), (3, 67)], ["float32", "float32"], [e], ["float32"], target=C)
    assert "v[1];" not in kernel_source(f, C)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_bound_expressions_compile_for_sm90(bind_all):
    target = {"kind": "cuda", "arch": "sm_90a"}
    exprs = [deep(8), OP_CASES["where"], OP_CASES["remainder"], OP_CASES["cast"]]
    f = elementwise.elementwise([(8, 1000), (8, 1000)], ["float16", "float32"], exprs, ["float16", "float32",
                                "float32", "float32"], target=target)
    assert "v[1];" in kernel_source(f, target)
    assert compile_kernel(f, target, out_idx=[-4, -3, -2, -1]) is not None


@pytest.mark.gpu
def test_bound_expressions_on_the_gpu(rng, bind_all):
    target = {"kind": "cuda", "arch": "sm_90a"}
    names = sorted(OP_CASES)
    exprs = [OP_CASES[n] for n in names] + [deep(9)]
    shape = (7, 333)
    f = elementwise.elementwise([shape, shape], ["float32", "float32"], exprs, ["float32"] * len(exprs),
                                target=target)
    kernel = compile_kernel(f, target, out_idx=list(range(2, 2 + len(exprs))))
    x, y = edgy(rng, shape).cuda(), torch.randn(shape, generator=rng).cuda()
    # torch on the GPU is the reference: its CPU gelu is NaN at +inf where its CUDA gelu (and ours) is inf
    refs = elementwise.reference([x, y], exprs, ["float32"] * len(exprs))
    for name, out, ref in zip(names + ["deep"], kernel(x, y), refs):
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=2e-6, equal_nan=True,
                                   msg=lambda m, name=name: f"op {name}: {m}")


class Upsampling(nn.Module):
    """A convolution, a resize and a residual: a segmentation head's shape."""

    def __init__(self, mode: str, align: bool | None, size=None, scale=None):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)
        self.mode, self.align, self.size, self.scale = mode, align, size, scale

    def forward(self, x, skip):
        up = F.interpolate(self.conv(x), size=self.size, scale_factor=self.scale, mode=self.mode,
                           align_corners=self.align)
        return up + skip


@pytest.mark.parametrize("mode,align,size,scale", [
    ("bilinear", False, (16, 12), None), ("bilinear", True, (16, 12), None), ("bilinear", False, None, 2.0),
    ("bicubic", False, (13, 9), None), ("nearest", None, (16, 12), None), ("bilinear", False, (5, 3), None)])
def test_resizes_compile_and_match_eager(rng, mode, align, size, scale):
    torch._dynamo.reset()
    model = Upsampling(mode, align, size, scale).eval()
    x = torch.randn(2, 4, 7, 6, generator=rng)
    out_shape = model.conv(x).shape[:2] + (size or (14, 12))
    skip = torch.randn(out_shape, generator=rng)
    backend = make_backend(Options(target=parse_target("c")))
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x, skip)
        torch.testing.assert_close(got, model(x, skip), **FP32)
    assert backend.failures == []
    torch._dynamo.reset()


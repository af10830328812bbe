"""planner.layout.channels_last: the rewritten graph computes the same values, NHWC between the convolutions.

Fresh random inputs each run (never zeros); every output element is compared (fp32: rtol 1e-5).
"""

from __future__ import annotations

import pytest
import torch

from tilefuse import models
from tilefuse.api import compile_graph
from tilefuse.capture import capture_graphs
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import run_graph
from tilefuse.planner import canonicalize
from tilefuse.planner.layout import channels_last

C = {"kind": "c"}


def randn(rng, *shape):
    x = torch.randn(*shape, generator=rng)
    return torch.where(x == 0, torch.full_like(x, 0.5), x)


def _inputs(rng, graph):
    """Fresh values for every input; positive, so batch norms' running variances are valid."""
    return [randn(rng, *v.type.shape).abs() + 0.1 for v in graph.inputs]


def _same_values(g, g2, args):
    want, got = run_graph(g, *args), run_graph(g2, *args)
    assert len(want) == len(got)
    for w, o in zip(want, got):
        assert w.shape == o.shape
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


def _net(rng, keepdim: bool):
    """conv -> +bias(C,1,1) -> relu -> (output) -> max_pool -> conv 1x1 + residual -> mean."""
    b = GraphBuilder("net")
    x = b.input("x", TensorType((2, 3, 12, 10), "float32"))
    w1, bias = b.constant("w1", randn(rng, 8, 3, 3, 3)), b.constant("bias", randn(rng, 8, 1, 1))
    w2 = b.constant("w2", randn(rng, 8, 8, 1, 1))
    c1 = b.add1("conv", [x, w1, ""], stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    r = b.add1("relu", [b.add1("add", [bias, c1])])  # the channel vector first
    p = b.add1("max_pool", [r], kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    c2 = b.add1("conv", [p, w2, ""], stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    s = b.add1("add", [c2, p])
    m = b.add1("mean", [s], dims=(-1, -2), keepdim=keepdim)
    return b.build([r, m])


@pytest.mark.parametrize("keepdim", [True, False])
def test_rewrite_keeps_values_names_and_layout(rng, keepdim):
    g = _net(rng, keepdim)
    g2 = channels_last(g)
    assert g2.outputs == g.outputs
    assert [g2.values()[o].type for o in g2.outputs] == [g.values()[o].type for o in g.outputs]
    nodes = {n.op: n for n in g2.nodes}
    assert all(n.attr.get("channels_last") for n in g2.nodes if n.op in ("conv", "max_pool", "adaptive_avg_pool"))
    assert "mean" not in nodes  # a spatial mean is a channels-last global average pool
    # In: the image's transpose. Out: the returned relu's (a real transpose) and, for the mean, a reshape.
    assert sum(n.op == "permute" for n in g2.nodes) == 2
    assert [n.attr["shape"] for n in g2.nodes if n.op == "reshape" and n.inputs[0] == "bias"] == [(1, 1, 1, 8)]
    _same_values(g, g2, _inputs(rng, g))


def test_a_layout_change_is_a_permute_where_c_h_and_w_are_equal(rng):
    """NHWC and NCHW are one shape where C = H = W: leaving channels last is still a permute (a reshape there gave a
    diffusers VAE's 32 channels at 32x32 wrong values)."""
    b = GraphBuilder("square")
    x = b.input("x", TensorType((2, 3, 8, 8), "float32"))
    w1, w2 = b.constant("w1", randn(rng, 8, 3, 3, 3)), b.constant("w2", randn(rng, 8, 8, 3, 3))
    c1 = b.add1("conv", [x, w1, ""], stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    n = b.add1("group_norm", [c1, "", ""], groups=2, eps=1e-5)  # not channels last: c1 leaves NHWC
    c2 = b.add1("conv", [b.add1("silu", [n]), w2, ""], stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    g = b.build([c2])
    g2 = channels_last(g)
    assert sum(n.op == "permute" for n in g2.nodes) == 4, [n.op for n in g2.nodes]  # in and out, twice
    _same_values(g, g2, _inputs(rng, g))


def test_concat_depthwise_and_biased_convolutions_stay_channels_last(rng):
    """A UNet-like skip (channel concat), a depthwise convolution (groups = channels: an elementwise kernel) and
    convolutions with a bias: one transpose in, one out."""
    b = GraphBuilder("unet")
    x = b.input("x", TensorType((2, 4, 9, 8), "float32"))
    w1, b1 = b.constant("w1", randn(rng, 6, 4, 3, 3)), b.constant("b1", randn(rng, 6))
    wd = b.constant("wd", randn(rng, 6, 1, 3, 3))
    w2, b2 = b.constant("w2", randn(rng, 5, 12, 1, 1)), b.constant("b2", randn(rng, 5))
    conv = {"stride": (1, 1), "dilation": (1, 1)}
    c1 = b.add1("relu", [b.add1("conv", [x, w1, b1], padding=(1, 1), groups=1, **conv)])
    d = b.add1("conv", [c1, wd, ""], padding=(1, 1), groups=6, **conv)
    cat = b.add1("concat", [c1, d], dim=1)
    y = b.add1("sigmoid", [b.add1("conv", [cat, w2, b2], padding=(0, 0), groups=1, **conv)])
    g = b.build([y])
    g2 = channels_last(g)
    assert [n.attr["dim"] for n in g2.nodes if n.op == "concat"] == [3]
    assert sum(n.op == "permute" for n in g2.nodes) == 2
    args = _inputs(rng, g)
    _same_values(g, g2, args)
    compiled = compile_graph(g, target=C, quiet=True)
    for w, o in zip(run_graph(g, *args), compiled(*args)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride,hw", [((2, 2), (9, 8)), ((2, 1), (8, 7)), ((3, 3), (10, 11))])
def test_a_strided_pointwise_convolution_is_a_slice_then_a_gemm(rng, stride, hw):
    """A 1x1 convolution with a stride (ResNet's downsampling shortcut, its batch norm after) reads every stride-th
    pixel: channels last it becomes that strided slice of its input and a unit-stride 1x1 convolution, which a CUDA
    plan runs as one GEMM where the strided one took the implicit-GEMM conv2d. Odd sizes and unequal strides keep
    their values; a padded one keeps its stride (the padding is read)."""
    from tilefuse.config import Options
    from tilefuse.pipeline import plan_step

    b = GraphBuilder("shortcut")
    x = b.input("x", TensorType((2, 4, *hw), "float32"))
    w1, w2, w3 = (b.constant(f"w{i}", randn(rng, 6, c, k, k)) for i, (c, k) in enumerate(((4, 3), (6, 1), (6, 1))))
    bn = [b.constant(f"bn{i}", randn(rng, 6).abs() + 0.1) for i in range(4)]
    conv = {"dilation": (1, 1), "groups": 1}
    c1 = b.add1("relu", [b.add1("conv", [x, w1, ""], stride=(1, 1), padding=(1, 1), **conv)])
    down = b.add1("batch_norm", [b.add1("conv", [c1, w2, ""], stride=stride, padding=(0, 0), **conv), *bn])
    padded = b.add1("conv", [c1, w3, ""], stride=stride, padding=(1, 1), **conv)
    g = b.build([down, padded])
    g2 = channels_last(g)
    assert [n.attr["stride"] for n in g2.nodes if n.op == "conv"] == [(1, 1), (1, 1), stride]
    assert [(n.attr["dim"], n.attr["step"]) for n in g2.nodes if n.op == "slice"] == \
        [(d + 1, s) for d, s in enumerate(stride) if s != 1]
    args = _inputs(rng, g)
    _same_values(g, g2, args)
    planned = plan_step(g, Options(target={"kind": "cuda", "arch": "sm_90a"}))
    templates = {r.ops: planned.specs[r.name].template for r in planned.plan.regions if r.name in planned.specs}
    assert templates[("conv", "batch_norm")] == "gemm", templates
    compiled = compile_graph(g, target=C, quiet=True)
    for w, o in zip(run_graph(g, *args), compiled(*args)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


def _convnext(rng, out_permuted: bool):
    """ConvNeXt's block as Hugging Face and timm write it: a depthwise 7x7 convolution, its own permute to NHWC, a
    layer norm and a linear there, the permute back and the residual add; then a downsampling convolution."""
    b = GraphBuilder("convnext")
    x = b.input("x", TensorType((2, 8, 6, 6), "float32"))
    conv = {"dilation": (1, 1)}
    stem = b.add1("conv", [x, b.constant("w0", randn(rng, 8, 8, 1, 1)), ""], stride=(1, 1), padding=(0, 0), groups=1,
                  **conv)
    dw = b.add1("conv", [stem, b.constant("dw", randn(rng, 8, 1, 7, 7)), b.constant("db", randn(rng, 8))],
                stride=(1, 1), padding=(3, 3), groups=8, **conv)
    h = b.add1("permute", [dw], perm=(0, 2, 3, 1))
    h = b.add1("layer_norm", [h, b.constant("g", randn(rng, 8)), b.constant("be", randn(rng, 8))],
               axis=-1, eps=1e-6)
    h = b.add1("linear", [h, b.constant("lw", randn(rng, 8, 8)), b.constant("lb", randn(rng, 8))])
    if out_permuted:  # (the graph's output read channels last too: it keeps its own layout and name)
        h = b.add1("permute", [h], perm=(0, 3, 1, 2))
        return b.build([h])
    s = b.add1("add", [stem, b.add1("permute", [h], perm=(0, 3, 1, 2))])
    down = b.add1("conv", [s, b.constant("w2", randn(rng, 8, 8, 2, 2)), ""], stride=(2, 2), padding=(0, 0), groups=1,
                  **conv)
    return b.build([down])


@pytest.mark.parametrize("out_permuted", [False, True])
def test_a_models_own_permutes_to_and_from_channels_last_cost_nothing(rng, out_permuted):
    """The layout pass's NCHW view of a convolution's NHWC output, permuted to NHWC again by the model, is read as it
    is; so is the model's permute back where a channels-last op reads it (session 53: HF ConvNeXt-T's 17 permute
    copies). Left: the image's permute in and the returned value's out."""
    g = _convnext(rng, out_permuted)
    g2 = channels_last(g)
    assert sum(n.op == "permute" for n in g2.nodes) == 2, [n for n in g2.nodes if n.op == "permute"]
    assert g2.outputs == g.outputs
    args = [randn(rng, *v.type.shape) for v in g.inputs]
    _same_values(g, g2, args)
    compiled = compile_graph(g, target=C, quiet=True)  # the whole pipeline on the c target, every element
    assert sum(1 for r in compiled.plan.regions if r.launches and set(r.ops) <= {"permute"}) == 2  # (in, out)
    for w, o in zip(run_graph(g, *args), compiled(*args)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pads, mode", [((0, 1, 0, 1), "constant"), ((2, 1), "constant"), ((1, 1, 1, 1), "reflect")])
def test_a_pad_of_h_and_w_stays_channels_last(rng, pads, mode):
    """EfficientNet pads H and W before a strided depthwise convolution: a constant pad runs channels last (its pads
    move behind C's); another mode leaves channels last and comes back (torch pads three dims in constant mode only)."""
    b = GraphBuilder("padded")
    x = b.input("x", TensorType((2, 4, 7, 6), "float32"))
    conv = {"dilation": (1, 1), "stride": (1, 1), "padding": (1, 1), "groups": 1}
    c1 = b.add1("conv", [x, b.constant("w1", randn(rng, 8, 4, 3, 3)), ""], **conv)
    p = b.add1("pad", [c1], pads=pads, mode=mode, value=0.0)
    dw = b.add1("conv", [p, b.constant("dw", randn(rng, 8, 1, 3, 3)), ""], **{**conv, "stride": (2, 2), "groups": 8})
    g = b.build([dw])
    g2 = channels_last(g)
    assert sum(n.op == "permute" for n in g2.nodes) == (2 if mode == "constant" else 4)
    _same_values(g, g2, [randn(rng, *v.type.shape) for v in g.inputs])
    compiled = compile_graph(g, target=C, quiet=True, measure=False)
    args = [randn(rng, *v.type.shape) for v in g.inputs]
    for w, o in zip(run_graph(g, *args), compiled(*args)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


def test_a_permute_of_a_permute_is_one(rng):
    """``simplify``: permutes in a row compose (a pair that undoes itself leaves none); the first stays while another
    op reads it."""
    from tilefuse.planner import simplify

    b = GraphBuilder("perms")
    x = b.input("x", TensorType((2, 3, 4, 5), "float32"))
    p1 = b.add1("permute", [x], perm=(0, 2, 3, 1))
    p2 = b.add1("permute", [p1], perm=(2, 0, 3, 1))  # (4, 2, 3, 5)
    back = b.add1("permute", [b.add1("permute", [x], perm=(1, 0, 3, 2))], perm=(1, 0, 3, 2))
    g = b.build([b.add1("relu", [p2]), b.add1("add", [back, x]), b.add1("neg", [p1])])
    g2 = simplify(g)
    perms = sorted(n.attr["perm"] for n in g2.nodes if n.op == "permute")
    assert perms == [(0, 2, 3, 1), (3, 0, 1, 2)], perms  # p1 (read by neg) and p2 composed; the pair gone
    assert next(n for n in g2.nodes if n.op == "add").inputs == (x, x)
    _same_values(g, g2, [randn(rng, *v.type.shape) for v in g.inputs])


def test_one_convolution_is_left_alone(rng):
    b = GraphBuilder("patchify")
    x = b.input("x", TensorType((2, 3, 8, 8), "float32"))
    w = b.constant("w", randn(rng, 16, 3, 4, 4))
    y = b.add1("conv", [x, w, ""], stride=(4, 4), padding=(0, 0), dilation=(1, 1), groups=1)
    g = b.build([b.add1("reshape", [y], shape=(2, 16, 4))])
    assert channels_last(g) is g


def test_resnet_runs_channels_last_between_image_and_head(rng):
    model, inputs = models.build("resnet", "tiny")
    g = canonicalize(capture_graphs(model, inputs, lower=False)[0])
    g2 = channels_last(g)
    counts = g2.op_counts()
    assert counts["permute"] == 1  # the image; the head's (N, C, 1, 1) is a reshape
    assert all(n.attr.get("channels_last") for n in g2.nodes if n.op in ("conv", "batch_norm", "max_pool"))
    _same_values(g, g2, _inputs(rng, g))


def test_channels_last_network_compiles_and_matches_on_c(rng):
    g = _net(rng, keepdim=False)
    compiled = compile_graph(g, target=C, quiet=True)
    p = compiled.plan
    assert all(r.backend == "tilelang" for r in p.regions if r.launches), p.summary()
    args = _inputs(rng, g)
    for w, o in zip(run_graph(g, *args), compiled(*args)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


def test_symbolic_shapes_wait_for_specialization(rng):
    b = GraphBuilder("dyn")
    x = b.input("x", TensorType(("batch", 3, 8, 8), "float32"))
    w = b.constant("w", randn(rng, 4, 3, 3, 3))
    conv = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}
    y = b.add1("conv", [b.add1("conv", [x, w, ""], **conv), b.constant("w2", randn(rng, 4, 4, 3, 3)), ""], **conv)
    g = b.build([y])
    assert channels_last(g) is g


def test_channels_last_by_default_on_every_target(rng):
    """Options.channels_last unset: on for c and for CUDA (measured on the H200: ResNet-50 4.02 -> 2.70 ms tuned);
    ``layout=False`` (``TILEFUSE_CHANNELS_LAST=0``) keeps channels first."""
    from tilefuse.config import Options
    from tilefuse.pipeline import plan

    g = _net(rng, keepdim=False)

    def nhwc(p):
        return any(n.attr.get("channels_last") for n in p.graph.nodes)

    cuda = {"kind": "cuda", "arch": "sm_90a"}
    assert nhwc(plan(g, C)) and nhwc(plan(g, cuda)) and not nhwc(plan(g, cuda, layout=False))
    assert Options(target=cuda).channels_last
    assert not nhwc(plan(g, C, layout=False))


def test_a_channels_last_convolution_through_torch_rearranges_its_weight_once(rng, monkeypatch):
    """A region run through torch (``NodesFn``: the split's head, the measured choice's torch way) hands cuDNN the
    weight of a channels-last convolution channels last, rearranged on the first call and reused while it is the
    same tensor at the same address and version; an in-place change and a replaced ``.data`` are seen, an inference
    tensor passes as it is. (On the GPU
    only: here ``wants`` is widened to the CPU to check the bookkeeping, every output element against the plain
    reference.)"""
    from tilefuse.ops import nn as nn_ops
    from tilefuse.ops.reference import NodesFn

    monkeypatch.setattr(nn_ops.WeightChannelsLast, "wants", staticmethod(
        lambda w: w.dim() == 4 and w.shape[2] * w.shape[3] > 1 and not w.is_inference()))
    g = channels_last(_net(rng, keepdim=True))
    (conv,) = [n for n in g.nodes if n.op == "conv" and g.constants[n.inputs[1]].shape[2:] == (3, 3)]
    fn = NodesFn(g, [conv.name], conv.inputs[:2], [conv.outputs[0].name])
    step = fn.steps[0][1].ref
    assert isinstance(step, nn_ops.WeightChannelsLast)
    seen = []
    plain = step.ref
    step.ref = lambda x, weight, *a, **k: seen.append(weight) or plain(x, weight, *a, **k)
    x = randn(rng, *g.values()[conv.inputs[0]].type.shape)
    w = g.constants[conv.inputs[1]].clone()
    for _ in range(2):
        torch.testing.assert_close(fn([x, w])[0], nn_ops.conv(x, w, **conv.attr), rtol=1e-5, atol=1e-5)
    assert seen[0] is seen[1] and seen[0] is not w and seen[0].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(seen[0], w)
    with torch.no_grad():
        w.mul_(-2.0)  # in place: a new version
    torch.testing.assert_close(fn([x, w])[0], nn_ops.conv(x, w, **conv.attr), rtol=1e-5, atol=1e-5)
    assert seen[2] is not seen[1] and torch.equal(seen[2], w)
    w.data = randn(rng, *w.shape)  # (a parameter's storage replaced: the same tensor, another address)
    torch.testing.assert_close(fn([x, w])[0], nn_ops.conv(x, w, **conv.attr), rtol=1e-5, atol=1e-5)
    assert torch.equal(seen[-1], w)
    with torch.inference_mode():
        frozen = w.clone()
    torch.testing.assert_close(fn([x, frozen])[0], nn_ops.conv(x, frozen, **conv.attr), rtol=1e-5, atol=1e-5)
    assert seen[-1] is frozen

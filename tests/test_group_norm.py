"""Group and instance norms (diffusion U-Nets, wav2vec2's feature extractor, BiT) as row-reduction kernels with
their producers and consumers fused (``lowering/norm_builder.py``): a group a row of ``(N, G, C/G * prod(S))``, the
per-channel affine map and every other operand read where the element lies in ``(N, C, *S)``. Every element against
torch: NaN, infinities, a constant group, no affine map, 1-D and 0-D spatial shapes, through dynamo and ONNX."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tilefuse
from tilefuse.capture import capture_graphs
from tilefuse.ir import TensorType
from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.lower import make_prim_func
from tilefuse.lowering.templates import reduction
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import run_graph
from tilefuse.pipeline import plan
from tilefuse.planner.pattern import RewriteLog, rewrite
from tilefuse.planner.patterns import PATTERNS

FP32 = {"rtol": 1e-4, "atol": 1e-4}


class Block(nn.Module):
    """A U-Net's GroupNorm + SiLU after a scale and shift, a group norm without affine map plus a residual, and an
    instance norm (dynamo traces it as ``var_mean`` over dims 0, 2 and 3 of a (1, N*C, H, W) view)."""

    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 16)
        self.plain = nn.GroupNorm(8, 16, affine=False)
        self.inorm = nn.InstanceNorm2d(16, affine=True)

    def forward(self, x, r):
        y = F.silu(self.gn(x * 2 + 1))
        y = self.plain(y) + r
        return torch.relu(self.inorm(y))


def _randomized(m: nn.Module, rng) -> nn.Module:
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=rng))
    return m.eval()


def _inputs(rng, n=2, c=16, *spatial):
    return torch.randn(n, c, *spatial, generator=rng)


def test_group_and_instance_norms_are_kernels_and_match_torch(rng):
    m = _randomized(Block(), rng)
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(m, target="c", observer=runners.append, measure=False)
    edgy = _inputs(rng, 2, 16, 5, 7)
    edgy[0, 0, 1, 1] = float("nan")  # group 0 of sample 0: NaN through the whole group, and on
    edgy[1, 5, 2, 3] = float("inf")  # group 1 of sample 1
    edgy[1, 12:16] = 3.0  # a constant group: variance 0, the output is the shift alone
    with torch.no_grad():
        for x in (_inputs(rng, 2, 16, 5, 7), edgy):
            r = _inputs(rng, 2, 16, 5, 7)
            torch.testing.assert_close(compiled(x, r), m(x, r), equal_nan=True, **FP32)
    p = runners[0].plan
    assert all(r.backend == "tilelang" for r in p.regions), p.to_text()
    assert any("group_norm" in r.ops and "silu" in r.ops and "mul" in r.ops for r in p.regions), p.to_text()
    torch._dynamo.reset()


@pytest.mark.parametrize("spatial", [(), (23,), (3, 4, 5)])
def test_group_norms_of_other_ranks(rng, spatial):
    m = _randomized(nn.Sequential(nn.GroupNorm(3, 12), nn.GELU()), rng)
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(m, target="c", observer=runners.append, measure=False)
    x = _inputs(rng, 3, 12, *spatial)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), **FP32)
    (region,) = [r for r in runners[0].plan.regions if "group_norm" in r.ops]
    assert region.backend == "tilelang", runners[0].plan.to_text()
    torch._dynamo.reset()


class HalfThenFloat(nn.Module):
    """A half-precision group norm whose result is read twice after a view (the block's output, and its cast to
    float for the next norm's statistics), and one whose flattened float cast is the only value written."""

    def __init__(self):
        super().__init__()
        self.gn, self.out = nn.GroupNorm(4, 16), nn.GroupNorm(8, 16)

    def forward(self, x):
        y = self.gn(x)
        z = y.reshape(1, -1, *x.shape[2:]).float()  # an instance norm's statistics, as dynamo traces them
        s = (z - z.mean((0, 2, 3), keepdim=True)).reshape(x.shape)
        return y + s.half(), self.out(x).reshape(1, -1, *x.shape[2:]).float()


def test_half_precision_group_norms_write_one_value_after_the_norm(rng):
    """On the H200 (2026-12-05) the fp16 block's second group norm fused its add, a view and the cast after it,
    then ran through torch: the row reduction writes one value after the norm, and the region had two. The planner
    now leaves the second to its reader; a cast of another shape of the same size fuses where it is the only one."""
    m = _randomized(HalfThenFloat(), rng).half()
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(m, target="c", observer=runners.append, measure=False)
    x = _inputs(rng, 2, 16, 6, 5).half()
    x[1, 3, 2, 2] = float("nan")
    with torch.no_grad():
        for got, want in zip(compiled(x), m(x)):
            torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-2, atol=2e-2)
    p = runners[0].plan
    assert all(r.backend == "tilelang" for r in p.regions), p.to_text()
    assert any("group_norm" in r.ops and "cast" in r.ops for r in p.regions), p.to_text()
    assert "values computed after its group_norm" in p.to_text(), p.to_text()
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamo", [False, True])
def test_group_and_instance_norms_through_onnx(tmp_path, rng, dynamo):
    """torch's exporters write a group norm as InstanceNormalization (scale ones, bias zeros, one per group) between
    reshapes, then the per-channel Mul and Add: ``norm.group_via_instance`` makes it one group norm again, its SiLU
    fused. A real instance norm (its own scale and bias) stays one."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    m = _randomized(nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.SiLU(), nn.InstanceNorm2d(8, affine=True),
                                  nn.GroupNorm(4, 8, affine=False), nn.GELU()), rng)
    x = torch.randn(2, 3, 9, 9, generator=rng)
    path = tmp_path / "gn.onnx"
    torch.onnx.export(m, (x,), str(path), dynamo=dynamo, input_names=["x"])
    assert "InstanceNormalization" in {n.op_type for n in onnx.load(str(path)).graph.node}
    model = tilefuse.compile_onnx(str(path), target="c", measure=False)
    p = model.plan
    text = p.to_text()
    assert text.count("norm.group_via_instance") - text.count("pattern norm.group_via_instance") == 2, text
    ops = [r.ops for r in p.regions]
    assert sum("group_norm" in o for o in ops) == 2 and sum("instance_norm" in o for o in ops) == 1, text
    assert any("group_norm" in o and "silu" in o for o in ops), text
    assert all(r.backend == "tilelang" for r in p.regions), text
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], m(x), **FP32)


def _spelled_graph(rng, scale: torch.Tensor, affine: bool):
    """reshape -> instance_norm(scale, zeros) -> reshape (-> * gamma + beta) over (2, 8, 5, 5) in 2 groups."""
    b = GraphBuilder("spelled")
    x = b.input("x", TensorType((2, 8, 5, 5), "float32"))
    flat = b.add1("reshape", [x], shape=(2, 2, 100))
    s, z = b.constant("s", scale), b.constant("z", torch.zeros(2))
    out = b.add1("reshape", [b.add1("instance_norm", [flat, s, z], eps=1e-5)], shape=(2, 8, 5, 5))
    if affine:
        gamma, beta = torch.randn(8, 1, 1, generator=rng), torch.randn(1, 8, 1, 1, generator=rng)
        out = b.add1("add", [b.constant("beta", beta), b.add1("mul", [b.constant("gamma", gamma), out])])
    return b.build([out])


@pytest.mark.parametrize("affine", [True, False])
def test_the_spelled_group_norm_rewrite_keeps_values_and_refuses_a_real_scale(rng, affine):
    """The rewrite needs the instance norm's scale all ones and bias all zeros; another scale is a per-group affine
    map, which the pattern refuses with the reason (the graph then computes as it is)."""
    name = "norm.group_via_instance" + ("" if affine else "_plain")
    xv = torch.randn(2, 8, 5, 5, generator=rng)
    for scale, applies in ((torch.ones(2), True), (torch.tensor([1.0, 2.0]), False)):
        g = _spelled_graph(rng, scale, affine)
        log = RewriteLog()
        g2 = rewrite(g, PATTERNS, log)
        assert [p for p, _ in log.applied] == ([name] if applies else []), (log.applied, log.refused)
        assert applies or any(p == name and "scale is not all 1" in why for p, _, why in log.refused), log.refused
        assert applies == any(n.op == "group_norm" for n in g2.nodes)
        torch.testing.assert_close(run_graph(g2, xv)[0], run_graph(g, xv)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_group_norm_compiles_for_sm90(rng):
    target = {"kind": "cuda", "arch": "sm_90a"}
    m = nn.Sequential(nn.GroupNorm(32, 320), nn.SiLU()).eval().half()
    (graph,) = capture_graphs(m, (torch.randn(2, 320, 16, 16, dtype=torch.float16),))
    p = plan(graph, target)
    (spec,) = [build(r, p.graph, target) for r in p.regions if "group_norm" in r.ops]
    assert spec.template == "row_reduction" and dict(spec.params)["shape"] == (2, 32, 10 * 256)
    f = reduction.row_reduction(**spec.factory_kwargs(), target=target)
    assert compile_kernel(f, target, out_idx=[-1]) is not None


def test_a_group_norm_is_source_for_hip_and_metal_and_refused_on_ascend_with_the_reason():
    m = nn.Sequential(nn.GroupNorm(4, 16), nn.SiLU()).eval().half()
    (graph,) = capture_graphs(m, (torch.randn(2, 16, 8, 8, dtype=torch.float16),))
    for target in ({"kind": "hip"}, {"kind": "metal"}, {"kind": "ascend"}):
        p = plan(graph, target)
        (spec,) = [build(r, p.graph, target, source=True) for r in p.regions if "group_norm" in r.ops]
        if target["kind"] == "ascend":
            assert "reads no operand at a computed index" in spec
        else:
            assert "extra0[" in kernel_source(make_prim_func(spec, target), target)


@pytest.mark.gpu
def test_group_norms_match_torch_on_the_gpu(rng):
    m = _randomized(Block(), rng).cuda().half()
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(m, observer=runners.append, measure=False)
    with torch.no_grad():
        x, r = _inputs(rng, 2, 16, 24, 24).cuda().half(), _inputs(rng, 2, 16, 24, 24).cuda().half()
        x[0, 0, 1, 1] = float("nan")
        torch.testing.assert_close(compiled(x, r), m(x, r), equal_nan=True, rtol=1e-2, atol=2e-2)
    assert all(r.backend == "tilelang" for r in runners[0].plan.regions), runners[0].plan.to_text()
    torch._dynamo.reset()

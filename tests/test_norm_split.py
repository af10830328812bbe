"""Group and instance norms of few, long groups, split into chunks on GPUs (``planner/norm_split.py``): the chunk
rule, the rewritten graph against the original (fp32, fp16, NaN, infinities, a constant group, large values), the
rewritten graph's kernels on ``c`` against torch, and the plan for sm_90a (every region a kernel, the source
compiling). The pass runs on GPU targets only; the tests call it with small thresholds so that CPU-sized shapes
split."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tilefuse
from tilefuse.api import compile_graph
from tilefuse.capture import capture_graphs
from tilefuse.ir import TensorType
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.lower import make_prim_func
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import run_graph
from tilefuse.pipeline import plan
from tilefuse.planner.norm_split import chunk_length, split_long_norms
from tilefuse.planner.pattern import RewriteLog

SMALL = {"max_rows": 64, "min_row": 256, "min_chunk": 8, "want_rows": 32}  # CPU-sized shapes split
CUDA = {"kind": "cuda", "arch": "sm_90a"}


class Block(nn.Module):
    """A U-Net's GroupNorm + SiLU, an instance norm and a group norm without affine map plus a residual."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.gn, self.inorm = nn.GroupNorm(4, c), nn.InstanceNorm2d(c, affine=True)
        self.plain = nn.GroupNorm(2, c, affine=False)

    def forward(self, x, r):
        y = F.silu(self.gn(x))
        return self.plain(self.inorm(y)) + r


def _graph(m: nn.Module, *args):
    (g,) = capture_graphs(m, args)
    params = [p.detach() for p in m.parameters()]
    return g, params


def _args(g, params: list, *inputs: torch.Tensor) -> list:
    """The graph's arguments: dynamo lifts the parameters among the inputs in the order they are used (here no
    parameter has an input's shape)."""
    params, inputs = list(params), list(inputs)
    return [inputs.pop(0) if tuple(v.type.shape) == tuple(inputs[0].shape) else params.pop(0) for v in g.inputs]


def _randomized(m: nn.Module, rng) -> nn.Module:
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=rng))
    return m.eval()


class Single(nn.Module):
    """One group norm + SiLU + a residual: its output is the split norm's, read by no other norm."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.gn = nn.GroupNorm(4, c)

    def forward(self, x, r):
        return F.silu(self.gn(x)) + r


def _edgy(x: torch.Tensor, constant: bool) -> torch.Tensor:
    """NaN, an infinity and large values in some groups, and with ``constant`` a constant group. (Not before another
    norm: a constant group's output is constant per channel, whose variance the next norm takes as rounding noise
    times 1/sqrt(eps), any two implementations differing there by 1e-4 in fp32.)"""
    x = x.clone()
    x[0, 0, 1, 1] = float("nan")  # group 0 of sample 0
    x[1, 5, 2, 3] = float("inf")  # group 1 of sample 1
    x[0, 8:12] *= 1e4  # large values with a large mean
    x[0, 8:12] += 3e4
    if constant:
        x[1, 12:16] = 3.0  # variance 0: the output is the shift alone
    return x


def _exact(m: nn.Module, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``m`` in float64: the fp32 reference. torch's fp32 CPU group norm is not: on a constant group it returns
    values 5e-5 off (its variance a rounding error, not 0), where the split's merge gives 0 and is within 2e-7."""
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double(), r.double())


# (module, norms split, a constant group, fp32 tolerance against float64: three norms in series scale each other's
# rounding by their 1/std and weights, torch's own fp32 kernels up to 1.4e-5 off over 30 seeds of the chained block)
MODELS = {"chained": (Block, 2, False, 3e-5), "single": (Single, 1, True, 1e-5)}


def test_chunks_are_whole_rows_of_the_input():
    assert chunk_length(32, 16 * 128 * 128, (128, 128)) == 128 * 128  # a VAE's 512 channels: 512 rows of 16384
    assert chunk_length(32, 4 * 512 * 512, (512, 512)) == 512  # 128 channels at 512x512: 65536 rows of 512
    assert chunk_length(64, 10 * 64 * 64, (64, 64)) == 64 * 64  # Stable Diffusion's first blocks, batch 2
    assert chunk_length(32, 100, (10, 10), min_chunk=256) == 100  # nothing long enough: no split
    # no chunk makes 512 rows (16384: 256 rows; 128 is too short): the most rows there are (the H100's GPU test,
    # 2026-12-05, where the norm stayed 32 rows of 131,072)
    assert chunk_length(32, 8 * 128 * 128, (128, 128)) == 128 * 128
    assert chunk_length(32, 8 * 128 * 128, (128, 128), min_chunk=131072) == 8 * 128 * 128


def test_the_split_is_gpu_only_and_logged(rng):
    m = _randomized(nn.Sequential(nn.GroupNorm(32, 512), nn.SiLU()), rng)
    g, _ = _graph(m, torch.randn(1, 512, 32, 32))
    assert split_long_norms(g, {"kind": "c"}) is g
    assert split_long_norms(g, None) is g
    log = RewriteLog()
    g2 = split_long_norms(g, CUDA, log)
    assert [p for p, _ in log.applied] == ["norm.split_rows"]
    assert not any(n.op == "group_norm" for n in g2.nodes)
    small = _graph(m, torch.randn(1, 512, 4, 4))[0]  # groups of 64 elements: one kernel as before
    vae = _graph(nn.Sequential(nn.GroupNorm(32, 256), nn.SiLU()), torch.randn(1, 256, 128, 128))[0]
    assert split_long_norms(vae, CUDA) is not vae  # (the GPU test's shape: 256 rows of 16,384)
    assert split_long_norms(small, CUDA) is small


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_split_graph_computes_the_norms(rng, dtype, model):
    make, splits, constant, fp32 = MODELS[model]
    m = _randomized(make(), rng).to(dtype)
    x, r = torch.randn(2, 16, 8, 8, generator=rng), torch.randn(2, 16, 8, 8, generator=rng)
    g, params = _graph(m, x.to(dtype), r.to(dtype))
    log = RewriteLog()
    g2 = split_long_norms(g, CUDA, log, **SMALL)
    assert len(log.applied) == splits, log.applied  # (dynamo traces the instance norm as var_mean)
    tol = {"rtol": fp32, "atol": fp32} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 2e-2}
    for xv in (x, _edgy(x, constant)):
        args = _args(g, params, xv.to(dtype), r.to(dtype))
        want, got = run_graph(g, *args)[0], run_graph(g2, *args)[0]
        assert got.dtype == want.dtype == dtype
        if dtype == torch.float32:  # against float64 (see _exact), fp16 against torch's fp16 kernels
            want = _exact(m, xv, r)
        torch.testing.assert_close(got.to(want.dtype), want, equal_nan=True, **tol)
    got = run_graph(g2, *_args(g, params, _edgy(x, constant).to(dtype), r.to(dtype)))[0]
    assert torch.isnan(got[1, 4:8]).all() and torch.isnan(got[0, :4]).all()  # the infinity's and the NaN's groups


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_split_graph_runs_as_kernels_on_c(rng, model):
    make, _, constant, fp32 = MODELS[model]
    m = _randomized(make(), rng)
    x, r = torch.randn(2, 16, 8, 8, generator=rng), torch.randn(2, 16, 8, 8, generator=rng)
    g, params = _graph(m, x, r)
    g2 = split_long_norms(g, CUDA, **SMALL)
    compiled = compile_graph(g2, target="c", measure=False)
    assert all(reg.backend == "tilelang" for reg in compiled.plan.regions), compiled.plan.to_text()
    with torch.no_grad():
        for xv in (x, _edgy(x, constant)):
            got = compiled(*_args(g, params, xv, r))[0]
            torch.testing.assert_close(got.double(), _exact(m, xv, r), equal_nan=True, rtol=fp32, atol=fp32)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_vae_group_norm_plans_split_and_compiles_for_sm90(rng):
    m = nn.Sequential(nn.GroupNorm(32, 512), nn.SiLU()).eval().half()
    (graph,) = capture_graphs(m, (torch.randn(1, 512, 64, 64, dtype=torch.float16),))
    p = plan(graph, CUDA)
    assert any(r.startswith("norm.split_rows") for r in p.rewrites), p.to_text()
    assert all(r.backend == "tilelang" for r in p.regions), p.to_text()
    reductions = [r for r in p.regions if r.kind == "reduction"]
    assert len(reductions) == 5 and any("silu" in r.ops for r in p.regions if r.kind == "elementwise"), p.to_text()
    for r in p.regions:
        if r.kind == "elementwise" or "var" in r.ops:
            compile_kernel(make_prim_func(build(r, p.graph, CUDA), CUDA), CUDA)


@pytest.mark.gpu
def test_split_group_norms_match_torch_on_the_gpu(rng):
    """At a VAE decoder's shapes (fp16): the norm and SiLU against torch, NaN and infinities in some groups."""
    m = _randomized(nn.Sequential(nn.GroupNorm(32, 256), nn.SiLU()), rng).cuda().half()
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(m, observer=runners.append, measure=False)
    x = torch.randn(1, 256, 128, 128, generator=rng).cuda().half()
    x[0, 0, 5, 5], x[0, 17, 1, 2] = float("nan"), float("inf")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), equal_nan=True, rtol=1e-2, atol=2e-2)
    p = runners[0].plan
    assert any(r.startswith("norm.split_rows") for r in p.rewrites), p.to_text()
    assert all(r.backend == "tilelang" for r in p.regions), p.to_text()
    torch._dynamo.reset()


def test_a_diffusers_vae_with_its_norms_split_matches_eager_on_c(rng, monkeypatch):
    """The VAE of ``tests/test_diffusers_heldout.py`` through torch.compile on ``c`` with every group norm split as
    on a GPU (the thresholds small, the pass told the target is CUDA): every output element against eager."""
    pytest.importorskip("diffusers")
    from test_diffusers_heldout import build

    import tilefuse.planner as planner

    logs = []

    def split(graph, target, log=None):
        logs.append(log)
        return split_long_norms(graph, CUDA, log, **SMALL)

    monkeypatch.setattr(planner, "split_long_norms", split)
    torch._dynamo.reset()
    model, inputs = build("vae")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=rng) * 0.2)
    model, args = model.eval(), inputs(rng)
    runners = []
    with torch.no_grad():
        got = tilefuse.compile(model, target="c", observer=runners.append, measure=False)(*args).sample
        ref = model(*args).sample
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5 * max(1.0, ref.abs().max().item()))
    p = runners[0].plan
    assert sum(r.startswith("norm.split_rows") for r in p.rewrites) >= 20, p.rewrites
    assert not any("group_norm" in r.ops for r in p.regions) and all(r.backend == "tilelang" for r in p.regions)
    torch._dynamo.reset()


def test_an_onnx_instance_norm_splits_too(rng):
    """ONNX's InstanceNormalization (a style-transfer network's 1 x 8 x 32 x 32: 8 rows of 1024) splits the same
    way, its scale and bias per channel; against the unsplit graph, NaN in one channel and a constant one."""
    b = GraphBuilder("inorm")
    x = b.input("x", TensorType((1, 8, 32, 32), "float32"))
    s, z = b.constant("s", torch.randn(8, generator=rng)), b.constant("z", torch.randn(8, generator=rng))
    g = b.build([b.add1("relu", [b.add1("instance_norm", [x, s, z], eps=1e-5)])])
    log = RewriteLog()
    g2 = split_long_norms(g, CUDA, log, **SMALL)
    assert [p for p, _ in log.applied] == ["norm.split_rows"] and not any(n.op == "instance_norm" for n in g2.nodes)
    xv = torch.randn(1, 8, 32, 32, generator=rng)
    xv[0, 2, 3, 4], xv[0, 5] = float("nan"), -2.0
    with torch.no_grad():
        want = F.relu(F.instance_norm(xv.double(), weight=g.constants["s"].double(),
                                      bias=g.constants["z"].double(), eps=1e-5))
    got = run_graph(g2, xv)[0]
    torch.testing.assert_close(got.double(), want, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert torch.isnan(got[0, 2]).all() and not torch.isnan(got[0, 3]).any()

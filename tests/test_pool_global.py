"""The pool template's whole-plane schedule (``lowering/templates/pool.py`` ``global_C``): a global average pool
channels last, its plane's pixels split over a program's threads. Numerics on ``c`` (fp32, every element, NaN and inf
included, ragged channel blocks, producer, consumer and the producer's stored result), its pick behind
``Options.experimental`` "global_pool", the CUDA source, and on the GPU each dtype and an EfficientNet
squeeze-and-excitation block against eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tilefuse
from tilefuse.capture import capture_graphs
from tilefuse.config import Options
from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.dispatch import region_specs
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.lower import config_space, default_config
from tilefuse.lowering.templates import pool
from tilefuse.pipeline import plan

C = "c"
CUDA = {"kind": "cuda", "arch": "sm_90a"}
TRYING = Options(target=CUDA, experimental="global_pool").target  # what TILEFUSE_EXPERIMENTAL=global_pool plans for
# (input NHWC, kind, geometry, global_C): an adaptive pool to 1x1; an average over a kernel the plane's size; channels
# no block divides (a ragged last block); a plane smaller than a step's rows; one channel
CASES = [((2, 9, 11, 32), "adaptive_avg", {"output_size": (1, 1)}, 16),
         ((3, 7, 7, 24), "avg", {"kernel": (7, 7), "stride": (7, 7)}, 8),
         ((2, 5, 6, 40), "adaptive_avg", {"output_size": (1, 1)}, 64),
         ((1, 2, 3, 16), "adaptive_avg", {"output_size": (1, 1)}, 8),
         ((2, 4, 4, 1), "adaptive_avg", {"output_size": (1, 1)}, 8)]


def _inputs(shape, dtype, rng, device="cpu"):
    x = torch.randn(shape, generator=rng).to(dtype)
    x[0, 0, 0, 0], x[-1, -1, -1, -1] = float("nan"), float("inf")  # their channels' averages: NaN and inf
    b, s = (torch.randn(shape[-1], generator=rng).to(dtype) for _ in range(2))
    return [t.to(device) for t in (x, b, s)]


def _pool(shape, kind, geometry, global_C, dtype, target, threads):
    producer, consumer = call("silu", Acc() + Arg(0)), Acc() * Arg(1)
    return pool.pool2d(shape, kind, **geometry, x_dtype=dtype, producer=producer, consumer=consumer,
                       extra_shapes=[(shape[-1],), (shape[-1],)], extra_dtypes=[dtype, dtype], write_pre=True,
                       channels_last=True, global_C=global_C, threads=threads, target=target), producer, consumer


@pytest.mark.parametrize("shape,kind,geometry,global_C", CASES)
def test_matches_torch_on_c(rng, shape, kind, geometry, global_C):
    f, producer, consumer = _pool(shape, kind, geometry, global_C, "float32", C, 1)
    x, b, s = _inputs(shape, torch.float32, rng)
    out, pre = compile_kernel(f, C, out_idx=[-2, -1])(x, b, s)
    want = pool.reference(x, kind, **geometry, extras=[b, s], producer=producer, consumer=consumer,
                          channels_last=True)
    assert out.shape == want.shape == (shape[0], 1, 1, shape[-1])
    assert torch.isnan(want).any() and (torch.isfinite(want).any() or shape[-1] == 1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(pre, torch.nn.functional.silu(x + b), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_only_a_whole_plane_average_channels_last_takes_it():
    assert pool.whole_plane((2, 9, 9, 8), "adaptive_avg", output_size=(1, 1), channels_last=True)
    assert pool.whole_plane((2, 9, 9, 8), "avg", kernel=(9, 9), channels_last=True)
    assert not pool.whole_plane((2, 9, 9, 8), "avg", kernel=(9, 9), padding=(1, 1), channels_last=True)
    assert not pool.whole_plane((2, 9, 9, 8), "max", kernel=(9, 9), channels_last=True)  # (NaN: the window walk's)
    assert not pool.whole_plane((2, 9, 9, 8), "adaptive_avg", output_size=(1, 2), channels_last=True)
    assert not pool.whole_plane((2, 8, 9, 9), "adaptive_avg", output_size=(1, 1))  # channels first
    # any other pool given global_C keeps the per-output schedule (same source as without it)
    geometry = {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}
    assert kernel_source(pool.pool2d((2, 9, 9, 16), "avg", **geometry, channels_last=True, global_C=16,
                                     target=CUDA), CUDA) == kernel_source(
        pool.pool2d((2, 9, 9, 16), "avg", **geometry, channels_last=True, target=CUDA), CUDA)


def test_the_pick_is_behind_the_experimental_name():
    kw = {"x_shape": (64, 112, 112, 32), "kind": "adaptive_avg", "output_size": (1, 1), "channels_last": True}
    assert pool.default_config(kw, CUDA, False) == pool.get_configs(CUDA)[0]
    assert pool.default_config(kw, C, True) == pool.get_configs(C)[0]
    # EfficientNet-B0's first squeeze: 64 images x 32 channels; 8 channels a program fill 132 SMs twice
    assert pool.default_config(kw, CUDA, True)["global_C"] == 8
    wide = {**kw, "x_shape": (64, 7, 7, 1152)}
    assert pool.default_config(wide, CUDA, True)["global_C"] == 64


def test_the_cuda_source_loads_channels_as_vectors():
    f, _, _ = _pool((64, 56, 56, 144), "adaptive_avg", {"output_size": (1, 1)}, 16, "float16", CUDA, 128)
    src = kernel_source(f, CUDA)
    assert any(f"*({v}*)(X_nd +" in src for v in ("uint2", "uint4")), src  # a thread's contiguous channels at once
    assert "AllReduce" in src  # the rows' partial sums reduced across the threads


class _SqueezeExcite(nn.Module):
    """EfficientNet's depthwise stage and squeeze-and-excitation: batch norm + SiLU, global average pool, two 1x1
    convolutions, sigmoid gate."""

    def __init__(self, dim=32, squeezed=8):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.bn = nn.BatchNorm2d(dim)
        self.reduce, self.expand = nn.Conv2d(dim, squeezed, 1), nn.Conv2d(squeezed, dim, 1)

    def forward(self, x):
        x = nn.functional.silu(self.bn(self.dw(x)))
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


def test_cuda_plans_pick_the_global_schedule():
    graph = max(capture_graphs(_SqueezeExcite().eval(), (torch.randn(2, 32, 28, 28),)), key=lambda g: len(g.nodes))
    for target, expect in ((TRYING, True), (CUDA, False)):
        specs = [s for s in region_specs(plan(graph, target), target).values() if s.template == "pool2d"]
        assert specs, "the mean over H and W is a pool region"
        for spec in specs:
            assert config_space(spec, target)[0] == default_config(spec, target)
            assert ("global_C" in default_config(spec, target)) is expect


# ---- on the GPU ---------------------------------------------------------------------------------------------------

TOL = {torch.float16: 1e-2, torch.float32: 1e-5}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape,kind,geometry,global_C", [*CASES, ((4, 56, 56, 144), "adaptive_avg",
                                                                   {"output_size": (1, 1)}, 16)])
def test_matches_torch_on_the_gpu(rng, dtype, shape, kind, geometry, global_C):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tilefuse.config import default_target

    target = default_target()
    f, producer, consumer = _pool(shape, kind, geometry, global_C, str(dtype).removeprefix("torch."), target, 128)
    x, b, s = _inputs(shape, dtype, rng, "cuda")
    out, pre = compile_kernel(f, target, out_idx=[-2, -1])(x, b, s)
    want = pool.reference(x.cpu().float(), kind, **geometry, extras=[b.cpu().float(), s.cpu().float()],
                          producer=producer, consumer=consumer, channels_last=True)
    torch.testing.assert_close(out.cpu().float(), want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True)
    torch.testing.assert_close(pre.cpu().float(), torch.nn.functional.silu(x.cpu().float() + b.cpu().float()),
                               rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True)


@pytest.mark.gpu
def test_squeeze_excite_matches_eager_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    m = _SqueezeExcite().cuda().half().eval()
    with torch.no_grad():
        m.bn.running_mean.normal_(), m.bn.running_var.uniform_(0.5, 2), m.bn.weight.normal_()
    runners = []
    compiled = tilefuse.compile(m, measure=False, experimental="global_pool", observer=runners.append)
    x = torch.randn(4, 32, 56, 56, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).float(), m.float()(x.float()), rtol=2e-2, atol=2e-2)
    kinds = {reg.name: reg.backend for r in runners for reg in r.plan.regions}
    assert kinds and all(b == "tilelang" for b in kinds.values()), kinds
    configs = [k.config for r in runners for k in r.kernels.values() if getattr(k, "spec", None) is not None
               and k.spec.template == "pool2d"]
    assert configs and all("global_C" in c for c in configs), configs

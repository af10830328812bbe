"""The depthwise convolution template (``lowering/templates/depthwise.py``) and its place in the conv builder:
numerics on ``c`` (fp32, every element, NaN and padding included), the CUDA plan of a ConvNeXt block, and on the GPU
each dtype and the whole block against eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tilefuse
from tilefuse.capture import capture_graphs
from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.dispatch import region_specs
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.lower import config_space, default_config
from tilefuse.lowering.templates import depthwise
from tilefuse.pipeline import plan

C = "c"
CUDA = {"kind": "cuda", "arch": "sm_90a"}
# (input NHWC, weight, stride, padding, dilation, config): ConvNeXt's 7x7; a channel multiplier of 2 with stride 2 and a
# ragged pixel tile; a ragged channel tile with dilation; a 1x1 window; an asymmetric stride and padding
CASES = [((2, 9, 11, 12), (12, 1, 7, 7), (1, 1), (3, 3), (1, 1), {}),
         ((1, 10, 9, 8), (16, 1, 3, 3), (2, 2), (1, 1), (1, 1), {"tile_h": 2, "tile_w": 4, "block_C": 16}),
         ((2, 8, 8, 24), (24, 1, 5, 5), (1, 1), (2, 2), (2, 1), {"block_C": 16}),
         ((1, 4, 5, 8), (8, 1, 1, 1), (1, 1), (0, 0), (1, 1), {}),
         ((2, 7, 6, 16), (16, 1, 3, 3), (1, 2), (2, 0), (1, 1), {"tile_h": 4, "tile_w": 2}),
         ((1, 20, 21, 32), (32, 1, 3, 3), (1, 1), (1, 1), (1, 1), {"tile_h": 16, "tile_w": 16})]


def _case(xs, ws, dtype, rng, device="cpu"):
    x = torch.randn(xs, generator=rng).to(dtype)
    x[0, 1, 2, 3], x[-1, -1, -1, -1] = float("nan"), float("inf")  # in every output whose window holds them
    w = (torch.randn(ws, generator=rng) * 0.3).to(dtype)
    b, s = torch.randn(ws[0], generator=rng).to(dtype), torch.rand(ws[0], generator=rng).to(dtype)
    return [t.to(device) for t in (x, w, b, s)]


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,config", CASES)
def test_matches_torch_on_c(rng, xs, ws, stride, padding, dilation, config):
    epilogue = call("silu", Acc() * Arg(1) + Arg(0))
    f = depthwise.depthwise_conv2d(xs, ws, stride=stride, padding=padding, dilation=dilation, in_dtype="float32",
                                   epilogue=epilogue, extra_shapes=[(ws[0],), (ws[0],)],
                                   extra_dtypes=["float32", "float32"], target=C,
                                   **{**depthwise.get_configs(C)[0], **config})
    x, w, b, s = _case(xs, ws, torch.float32, rng)
    got = compile_kernel(f, C, out_idx=[-1])(x, w, b, s)
    want = depthwise.reference(x, w, stride=stride, padding=padding, dilation=dilation, epilogue=epilogue,
                               extras=[b, s])
    assert got.shape == want.shape == depthwise.output_shape(xs, ws, stride, padding, dilation)
    assert torch.isnan(want).any() and torch.isfinite(want).any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_weight_that_is_not_depthwise_is_refused():
    with pytest.raises(ValueError, match="depthwise_conv2d"):
        depthwise.depthwise_conv2d((1, 8, 8, 12), (12, 3, 3, 3), target=C)
    with pytest.raises(ValueError, match="no output"):
        depthwise.depthwise_conv2d((1, 2, 2, 4), (4, 1, 5, 5), target=C)


def test_the_pick_loads_channels_as_vectors():
    # the H200's picks: 16 x 8 pixels by 32 channels over 256 threads, by 16 over 128 where 32 does not divide them;
    # 8 x 8 by 16 over 256 where strided
    for channels, stride, pick in [(96, 1, (16, 8, 32, 256)), (1152, 1, (16, 8, 32, 256)), (144, 1, (16, 8, 16, 128)),
                                   (240, 1, (16, 8, 16, 128)), (96, 2, (8, 8, 16, 256)), (144, 2, (8, 8, 16, 256))]:
        c = depthwise.default_config(channels, (stride, stride), CUDA)
        assert c == dict(zip(("tile_h", "tile_w", "block_C", "threads"), pick))
        src = kernel_source(depthwise.depthwise_conv2d((64, 56, 56, channels), (channels, 1, 7, 7), padding=(3, 3),
                                                       stride=(stride, stride), in_dtype="float16", target=CUDA, **c),
                            CUDA)
        assert any(f"*({v}*)(X +" in src for v in ("uint1", "uint2", "uint4")), src  # the patch's loads
        assert "x_s) + " in src  # the taps read the patch from shared memory
    # 40 channels: no tile of 16 or 32 divides them, the last is ragged (clamped channels, never stored)
    assert depthwise.default_config(40, (1, 1), CUDA)["block_C"] == 16
    assert depthwise.default_config(40, (2, 1), CUDA)["block_C"] == 16
    assert depthwise.default_config(40, (1, 1), C) in depthwise.get_configs(C)


def test_a_tile_larger_than_the_output_fits_the_threads():
    # a 3x3 output in 8 x 8 tiles of 16 channels: the tile shrinks to 4 x 4, then grows taller to fill 128 threads
    f = depthwise.depthwise_conv2d((1, 3, 3, 16), (16, 1, 3, 3), padding=(1, 1), in_dtype="float16", target=CUDA,
                                   **depthwise.default_config(16, (1, 1), CUDA))
    assert "acc[" in kernel_source(f, CUDA)


class _Block(nn.Module):
    """ConvNeXt's stem (a 4x4 stride-4 convolution) and block: depthwise 7x7, channels-last layer norm, MLP, layer
    scale, residual. (Two convolutions: the layout pass makes the network channels last.)"""

    def __init__(self, dim=32):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        x = self.stem(x)
        y = self.norm(self.conv_dw(x).permute(0, 2, 3, 1))
        y = self.fc2(nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return x + y * self.gamma.reshape(1, -1, 1, 1)


class _MBConv(nn.Module):
    """EfficientNet's expansion (a 1x1 convolution) and depthwise stage: a 5x5 stride-2 depthwise convolution, batch
    norm, SiLU."""

    def __init__(self, dim=24):
        super().__init__()
        self.expand = nn.Conv2d(8, dim, 1)
        self.conv = nn.Conv2d(dim, dim, 5, stride=2, padding=2, groups=dim, bias=False)
        self.bn = nn.BatchNorm2d(dim)

    def forward(self, x):
        return nn.functional.silu(self.bn(self.conv(self.expand(x))))


@pytest.mark.parametrize("module,shape", [(_Block, (2, 3, 56, 56)), (_MBConv, (2, 8, 15, 15))])
def test_cuda_plans_build_the_depthwise_template_from_the_pick(module, shape):
    m = module().eval()
    graph = max(capture_graphs(m, (torch.randn(shape),)), key=lambda g: len(g.nodes))
    specs = [s for s in region_specs(plan(graph, CUDA), CUDA).values() if s.template == "depthwise_conv2d"]
    assert len(specs) == 1
    kw = specs[0].factory_kwargs()
    assert kw["x_shape"][-1] == kw["w_shape"][0] and kw["w_shape"][1] == 1  # channels last
    assert config_space(specs[0], CUDA)[0] == default_config(specs[0], CUDA) == depthwise.default_config(
        kw["w_shape"][0], kw["stride"], CUDA)
    if module is _MBConv:  # the batch norm and SiLU are its epilogue
        assert kw["epilogue"] is not None and kw["stride"] == (2, 2)


def test_c_plans_keep_the_elementwise_form():
    graph = max(capture_graphs(_Block().eval(), (torch.randn(2, 3, 56, 56),)), key=lambda g: len(g.nodes))
    assert all(s.template != "depthwise_conv2d" for s in region_specs(plan(graph, {"kind": "c"}), {"kind": "c"})
               .values())


# ---- on the GPU ---------------------------------------------------------------------------------------------------

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("xs,ws,stride,padding,dilation,config", CASES)
def test_matches_torch_on_the_gpu(rng, dtype, xs, ws, stride, padding, dilation, config):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tilefuse.config import default_target

    target = default_target()
    name = str(dtype).removeprefix("torch.")
    epilogue = call("silu", Acc() * Arg(1) + Arg(0))
    config = {**depthwise.default_config(ws[0], stride, target), **config}
    f = depthwise.depthwise_conv2d(xs, ws, stride=stride, padding=padding, dilation=dilation, in_dtype=name,
                                   epilogue=epilogue, extra_shapes=[(ws[0],), (ws[0],)], extra_dtypes=[name, name],
                                   target=target, **config)
    x, w, b, s = _case(xs, ws, dtype, rng, "cuda")
    got = compile_kernel(f, target, out_idx=[-1])(x, w, b, s)
    want = depthwise.reference(x.cpu(), w.cpu(), stride=stride, padding=padding, dilation=dilation,
                               epilogue=epilogue, extras=[b.cpu(), s.cpu()])
    torch.testing.assert_close(got.cpu(), want, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("module,shape", [(_Block, (4, 3, 112, 112)), (_MBConv, (4, 8, 31, 31))])
def test_blocks_match_eager_on_the_gpu(module, shape):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    m = module().cuda().half().eval()
    if module is _MBConv:
        with torch.no_grad():
            m.bn.running_mean.normal_(), m.bn.running_var.uniform_(0.5, 2), m.bn.weight.normal_()
    runners = []
    compiled = tilefuse.compile(m, measure=False, observer=runners.append)
    x = torch.randn(shape, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).float(), m.float()(x.float()), rtol=2e-2, atol=2e-2)
    kinds = {reg.name: reg.backend for r in runners for reg in r.plan.regions}
    assert kinds and all(b == "tilelang" for b in kinds.values()), kinds
    templates = {getattr(k, "spec", None) and k.spec.template for r in runners for k in r.kernels.values()}
    assert "depthwise_conv2d" in templates, templates

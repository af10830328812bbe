"""Diffusion models from ``diffusers`` (tiny configs, random weights, no network) through torch.compile on the CPU,
every output element against eager: a conditional U-Net (group norms with SiLU, cross attention, a timestep
embedding, nearest upsampling) and a VAE. The VAE's 32 channels at 32x32 make NHWC and NCHW one shape, which once
let the channels-last rewrite leave NHWC by a reshape (wrong values; ``tests/test_layout.py`` holds the rule)."""

from __future__ import annotations

import logging

import pytest
import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target

d = pytest.importorskip("diffusers")


def build(name: str):
    """(model in eval mode, its positional inputs)."""
    if name == "unet":
        m = d.UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                   block_out_channels=(32, 64), cross_attention_dim=32, attention_head_dim=8,
                                   down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), norm_num_groups=8)
        return m, lambda g: (torch.randn(2, 4, 16, 16, generator=g), torch.tensor([10, 500]),
                             torch.randn(2, 7, 32, generator=g))
    if name == "vae":
        m = d.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=8, layers_per_block=1,
                            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(32, 64))
        return m, lambda g: (torch.randn(2, 3, 32, 32, generator=g),)
    raise ValueError(name)


@pytest.mark.parametrize("name", ["unet", "vae"])
def test_diffusion_model_matches_eager_cpu(name, rng, caplog):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, inputs = build(name)
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=rng) * 0.2)
    args = inputs(rng)
    runners = []
    backend = make_backend(Options(target=parse_target("c"), measure=False, observer=runners.append))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tilefuse"):
        got, ref = torch.compile(model, backend=backend)(*args).sample, model(*args).sample
    assert ref.abs().max() > 0
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5 * max(1.0, ref.abs().max().item()))
    assert backend.failures == [] and runners
    regions = [r for run in runners for r in run.plan.regions]
    norms = [r for r in regions if "group_norm" in r.ops]
    assert norms and all(r.backend == "tilelang" for r in norms)  # group norms as kernels, SiLU fused
    assert any("silu" in r.ops for r in norms)
    torch._dynamo.reset()

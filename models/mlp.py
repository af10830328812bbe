"""A transformer MLP block on its own: x + fc2(gelu(fc1(layer_norm(x))))."""

from __future__ import annotations

import torch
from torch import nn

from .common import FeedForward, ModelSpec


class MLPBlock(nn.Module):
    """Pre-LN MLP block with a residual; input (tokens, dim) or (batch, seq, dim)."""

    def __init__(self, dim: int, hidden: int, approximate: str = "none", eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = FeedForward(dim, hidden, approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def make_inputs(config: dict, shape: dict, dtype: torch.dtype, generator: torch.Generator) -> tuple[torch.Tensor]:
    """A (tokens, dim) activation drawn from N(0, 1)."""
    return (torch.randn(shape["tokens"], config["dim"], generator=generator).to(dtype),)


SPEC = ModelSpec(
    name="mlp",
    builder=MLPBlock,
    sizes={
        "tiny": {"dim": 64, "hidden": 256},
        "small": {"dim": 256, "hidden": 1024},
        "bench": {"dim": 4096, "hidden": 16384},
    },
    shapes={
        "tiny": {"tokens": 37},
        "small": {"tokens": 509},
        "bench": {"tokens": 8192},
    },
    make_inputs=make_inputs,
    input_names=("x",),
    output_names=("y",),
)

"""ViT-style encoder: Conv2d patch embedding, cls token, position embedding, pre-LN blocks, head on cls."""

from __future__ import annotations

import torch
from torch import nn

from .common import ModelSpec, PreLNBlock, make_images


class ViT(nn.Module):
    """Vision transformer returning class logits (batch, classes) for images (batch, 3, image, image)."""

    def __init__(
        self,
        image: int,
        patch: int,
        dim: int,
        n_heads: int,
        n_layers: int,
        hidden: int,
        classes: int,
        *,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if image % patch:
            raise ValueError(f"image size {image} is not a multiple of patch size {patch}")
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(
            PreLNBlock(dim, n_heads, hidden, causal=False, approximate="none", eps=eps) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


SPEC = ModelSpec(
    name="vit",
    builder=ViT,
    sizes={
        "tiny": {"image": 32, "patch": 8, "dim": 64, "n_heads": 4, "n_layers": 2, "hidden": 256, "classes": 10},
        "small": {"image": 64, "patch": 8, "dim": 128, "n_heads": 4, "n_layers": 4, "hidden": 512, "classes": 100},
        "bench": {
            "image": 224,
            "patch": 16,
            "dim": 768,
            "n_heads": 12,
            "n_layers": 12,
            "hidden": 3072,
            "classes": 1000,
        },
    },
    shapes={
        "tiny": {"batch": 2, "image": 32},
        "small": {"batch": 4, "image": 64},
        "bench": {"batch": 64, "image": 224},
    },
    make_inputs=make_images,
    input_names=("images",),
    output_names=("logits",),
)

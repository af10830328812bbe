"""ResNet-style CNN with bottleneck blocks (torchvision's ResNet-50 layout), BatchNorm in eval mode."""

from __future__ import annotations

import torch
from torch import nn

from .common import ModelSpec, make_images


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """Conv2d (no bias, 'same' padding for odd kernels) followed by BatchNorm2d."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(c_out))


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride) -> 1x1 expand, plus an identity or projection shortcut."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.reduce = conv_bn(c_in, width, 1)
        self.conv = conv_bn(width, width, 3, stride)
        self.expand = conv_bn(width, c_out, 1)
        self.shortcut = conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.reduce(x))
        y = self.relu(self.conv(y))
        return self.relu(self.expand(y) + self.shortcut(x))


class ResNet(nn.Module):
    """Stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool), four bottleneck stages, global average pool, fc."""

    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, c_in = [], width
        for stage, n_blocks in enumerate(layers):
            stage_width = width * 2**stage
            for i in range(n_blocks):
                blocks.append(Bottleneck(c_in, stage_width, stride=2 if stage > 0 and i == 0 else 1))
                c_in = stage_width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(images))
        return self.fc(torch.flatten(self.pool(x), 1))


SPEC = ModelSpec(
    name="resnet",
    builder=ResNet,
    sizes={
        "tiny": {"layers": (1, 1, 1, 1), "width": 8, "classes": 10},
        "small": {"layers": (2, 2, 2, 2), "width": 16, "classes": 100},
        "bench": {"layers": (3, 4, 6, 3), "width": 64, "classes": 1000},
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

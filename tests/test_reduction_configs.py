"""The row reduction's untuned pick by the rows' shape (``reduction.default_config``), on CUDA: short rows share a
program, so that each thread loads one 16-byte vector and a row reduces within a warp."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tilefuse.capture import capture_graphs
from tilefuse.config import parse_target
from tilefuse.lowering import tune
from tilefuse.lowering.compile import kernel_source
from tilefuse.lowering.dispatch import region_specs
from tilefuse.lowering.lower import config_space, default_config
from tilefuse.lowering.templates import reduction
from tilefuse.pipeline import plan

CUDA = {"kind": "cuda", "arch": "sm_90a"}  # 132 SMs
FIRST = reduction.get_configs(CUDA)[0]


@pytest.mark.parametrize("rows,cols,want", [
    (200704, 96, (8, 128)),  # ConvNeXt-T stage 1 at b64: 8 rows of 128 columns, 1024 elements a program
    (50176, 192, (4, 256)),
    (12544, 384, (2, 512)),
    (602112, 49, (16, 64)),  # Swin's window softmax
    (777, 49, (2, 64)),  # fewer rows than fill the SMs twice at 16 a program: fewer a program
    (64, 256, (1, 256)),
    (1000, 16, (2, 16)),
])
def test_short_rows_share_a_program(rows, cols, want):
    assert reduction.default_config(rows, cols, CUDA) == {"block_rows": want[0], "block_N": want[1], "threads": 128}


@pytest.mark.parametrize("rows,cols", [(3136, 768), (16384, 4096), (100, 3), (100000, 8)])
def test_long_and_tiny_rows_keep_the_first_seed(rows, cols):
    assert reduction.default_config(rows, cols, CUDA) == FIRST


@pytest.mark.parametrize("target", ["c", "hip", "metal"])
def test_other_targets_keep_the_first_seed(target):
    t = parse_target(target)
    assert reduction.default_config(200704, 96, t) == reduction.get_configs(t)[0]


def test_the_pick_reduces_each_row_within_a_warp():
    # fp16 rows of 96 and 192 (16-byte aligned): 8 columns a thread, so 16 and 32 threads a row, one warp's shuffles
    for rows, cols, per_row in [(200704, 96, 16), (50176, 192, 32)]:
        c = reduction.default_config(rows, cols, CUDA)
        src = kernel_source(reduction.row_reduction((rows, cols), "layer_norm", x_dtype="float16", has_weight=True,
                                                    has_bias=True, target=CUDA, **c), CUDA)
        assert f"AllReduce<tl::SumOp, {per_row}, 1" in src and "uint4" in src, src
    src = kernel_source(reduction.row_reduction((200704, 96), "layer_norm", x_dtype="float16", target=CUDA, **FIRST),
                        CUDA)
    assert "AllReduce<tl::SumOp, 128, 1" in src  # one row a program: 128 threads, through shared memory


class _Block(nn.Module):
    """ConvNeXt's block: depthwise 7x7, channels-last layer norm, MLP, layer scale, residual."""

    def __init__(self, dim=96):
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):
        y = self.norm(self.conv_dw(x).permute(0, 2, 3, 1))
        y = self.fc2(nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return x + y * self.gamma.reshape(1, -1, 1, 1)


def test_a_convnext_blocks_norm_builds_and_tunes_from_the_pick():
    graph = max(capture_graphs(_Block().eval(), (torch.randn(2, 96, 56, 56),)), key=lambda g: len(g.nodes))
    specs = [s for s in region_specs(plan(graph, CUDA), CUDA).values() if s.template == "row_reduction"]
    assert specs
    for spec in specs:
        pick = default_config(spec, CUDA)
        assert pick == {"block_rows": 8, "block_N": 128, "threads": 128}  # 2 x 56 x 56 rows of 96
        space = config_space(spec, CUDA)
        assert space[0] == pick and len(space) == len({tuple(sorted(c.items())) for c in space})
        assert tune.candidates(spec, CUDA)[0] == pick

"""GPT-2-style decoder: token + position embeddings, pre-LN blocks, causal SDPA, tanh GELU, LM head."""

from __future__ import annotations

import torch
from torch import nn

from .common import ModelSpec, PreLNBlock, make_token_ids


class GPT2(nn.Module):
    """GPT-2 language model returning logits (batch, seq, vocab) for int64 ids (batch, seq)."""

    def __init__(
        self,
        vocab: int,
        max_positions: int,
        dim: int,
        n_heads: int,
        n_layers: int,
        *,
        hidden: int | None = None,
        tied: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_positions, dim)
        self.blocks = nn.ModuleList(
            PreLNBlock(dim, n_heads, hidden or 4 * dim, causal=True, approximate="tanh", eps=eps)
            for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(dim, eps=eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight
        self.register_buffer("position_ids", torch.arange(max_positions)[None], persistent=False)
        with torch.no_grad():
            # GPT-2's N(0, 0.02) embeddings keep the logits of a tied head O(1).
            self.wte.weight.normal_(0.0, 0.02)
            self.wpe.weight.normal_(0.0, 0.01)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(self.position_ids[:, : input_ids.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


SPEC = ModelSpec(
    name="gpt2",
    builder=GPT2,
    sizes={
        "tiny": {"vocab": 128, "max_positions": 32, "dim": 64, "n_heads": 4, "n_layers": 2},
        "small": {"vocab": 1000, "max_positions": 128, "dim": 128, "n_heads": 4, "n_layers": 4, "tied": False},
        "bench": {"vocab": 50257, "max_positions": 1024, "dim": 768, "n_heads": 12, "n_layers": 12},
    },
    shapes={
        "tiny": {"batch": 2, "seq": 17},
        "small": {"batch": 2, "seq": 100},
        "bench": {"batch": 8, "seq": 1024},
    },
    make_inputs=make_token_ids,
    input_names=("input_ids",),
    output_names=("logits",),
)

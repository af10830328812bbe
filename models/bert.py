"""BERT-style encoder: word + position + token-type embeddings, post-LN blocks, padding-masked attention."""

from __future__ import annotations

import torch
from torch import nn

from .common import FeedForward, ModelSpec, SelfAttention


class BertLayer(nn.Module):
    """Post-LN block: ln1(x + attn(x, mask)); ln2(h + mlp(h)), exact GELU."""

    def __init__(self, dim: int, n_heads: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attn = SelfAttention(dim, n_heads, fused_qkv=False)
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.mlp = FeedForward(dim, hidden, approximate="none")
        self.ln2 = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    """BERT encoder returning the last hidden state (batch, seq, dim).

    Inputs: int64 `input_ids` (batch, seq) and int64 `attention_mask` (batch, seq), 1 for tokens
    and 0 for padding. Token types are all 0, read from a buffer as HF does when none are given.
    """

    def __init__(
        self,
        vocab: int,
        max_positions: int,
        dim: int,
        n_heads: int,
        n_layers: int,
        hidden: int,
        *,
        type_vocab: int = 2,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.token_type_embeddings = nn.Embedding(type_vocab, dim)
        self.emb_ln = nn.LayerNorm(dim, eps=eps)
        self.layers = nn.ModuleList(BertLayer(dim, n_heads, hidden, eps) for _ in range(n_layers))
        self.register_buffer("position_ids", torch.arange(max_positions)[None], persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, max_positions, dtype=torch.long), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(self.position_ids[:, :seq])
            + self.token_type_embeddings(self.token_type_ids[:, :seq])
        )
        x = self.emb_ln(x)
        # Additive mask, (B, 1, 1, S): 0 where attended, the dtype's most negative value on padding.
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return x


def make_inputs(config: dict, shape: dict, dtype: torch.dtype, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random ids and a padding mask: row 0 is full length, the others keep a random prefix (>= 1 token)."""
    batch, seq = shape["batch"], shape["seq"]
    ids = torch.randint(0, config["vocab"], (batch, seq), generator=generator)
    lengths = torch.randint(1, seq + 1, (batch,), generator=generator)
    lengths[0] = seq
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
    return ids, mask


SPEC = ModelSpec(
    name="bert",
    builder=Bert,
    sizes={
        "tiny": {"vocab": 128, "max_positions": 32, "dim": 64, "n_heads": 4, "n_layers": 2, "hidden": 256},
        "small": {"vocab": 1000, "max_positions": 128, "dim": 128, "n_heads": 4, "n_layers": 4, "hidden": 512},
        "bench": {"vocab": 30522, "max_positions": 512, "dim": 768, "n_heads": 12, "n_layers": 12, "hidden": 3072},
    },
    shapes={
        "tiny": {"batch": 2, "seq": 17},
        "small": {"batch": 4, "seq": 100},
        "bench": {"batch": 32, "seq": 512},
    },
    make_inputs=make_inputs,
    input_names=("input_ids", "attention_mask"),
    output_names=("last_hidden_state",),
)

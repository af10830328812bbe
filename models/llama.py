"""LLaMA-style decoder: RMSNorm, SwiGLU, rotary embeddings, grouped-query causal attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import (
    ModelSpec,
    RMSNorm,
    SwiGLU,
    apply_rotary,
    make_token_ids,
    merge_heads,
    repeat_kv,
    rotary_tables,
    split_heads,
)


class GQAttention(nn.Module):
    """Causal attention with rotary q/k and n_kv_heads < n_heads (KV repeated before SDPA, as HF)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        if dim % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"dim {dim}, n_heads {n_heads}, n_kv_heads {n_kv_heads} do not divide")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        head_dim = dim // n_heads
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.q_proj(x), self.n_heads)
        k = split_heads(self.k_proj(x), self.n_kv_heads)
        v = split_heads(self.v_proj(x), self.n_kv_heads)
        q, k = apply_rotary(q, k, cos, sin)
        n_rep = self.n_heads // self.n_kv_heads
        y = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)
        return self.o_proj(merge_heads(y))


class LlamaBlock(nn.Module):
    """x + attn(rms1(x)); x + mlp(rms2(x))."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.input_norm = RMSNorm(dim, eps)
        self.attn = GQAttention(dim, n_heads, n_kv_heads)
        self.post_attention_norm = RMSNorm(dim, eps)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    """LLaMA language model returning logits (batch, seq, vocab) for int64 ids (batch, seq)."""

    def __init__(
        self,
        vocab: int,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        n_layers: int,
        hidden: int,
        *,
        max_positions: int = 2048,
        rope_theta: float = 10000.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, n_heads, n_kv_heads, hidden, eps) for _ in range(n_layers))
        self.norm = RMSNorm(dim, eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary_tables(dim // n_heads, max_positions, rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        cos, sin = self.cos[:seq], self.sin[:seq]
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


SPEC = ModelSpec(
    name="llama",
    builder=Llama,
    sizes={
        "tiny": {
            "vocab": 128,
            "dim": 64,
            "n_heads": 4,
            "n_kv_heads": 2,
            "n_layers": 2,
            "hidden": 176,
            "max_positions": 32,
        },
        "small": {
            "vocab": 1000,
            "dim": 256,
            "n_heads": 8,
            "n_kv_heads": 2,
            "n_layers": 4,
            "hidden": 688,
            "max_positions": 128,
        },
        "bench": {
            "vocab": 32000,
            "dim": 2048,
            "n_heads": 32,
            "n_kv_heads": 8,
            "n_layers": 16,
            "hidden": 8192,
            "max_positions": 2048,
        },
    },
    shapes={
        "tiny": {"batch": 2, "seq": 17},
        "small": {"batch": 2, "seq": 100},
        "bench": {"batch": 4, "seq": 2048},
    },
    make_inputs=make_token_ids,
    input_names=("input_ids",),
    output_names=("logits",),
)

"""Building blocks shared by the zoo models: norms, MLPs, attention, rotary embeddings, seeded init.

Note: every block is written with ordinary torch ops in the way the reference implementations
(HF transformers, torchvision, timm) write them, because the frontends and the planner's patterns
have to recognise exactly those graphs (RMSNorm as pow/mean/rsqrt/mul, rotary as slice/neg/cat,
GQA as expand/reshape before SDPA).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry: how to build the model and what its inputs and outputs are.

    `sizes` maps a size name ("tiny", "small", "bench") to the keyword arguments of `builder`;
    `shapes` maps the same names to the example-input shape (`batch`, `seq`, `image`, `tokens`).
    `make_inputs(config, shape, dtype, generator)` returns fresh random CPU tensors.
    Dim 0 of every input and output is the batch (the token count for "mlp").
    """

    name: str
    builder: type[nn.Module]
    sizes: dict[str, dict]
    shapes: dict[str, dict]
    make_inputs: Callable[[dict, dict, torch.dtype, torch.Generator], tuple[torch.Tensor, ...]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# seeded construction and inputs


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's CPU RNG seeded, restoring the caller's RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def randomize_norms(module: nn.Module) -> None:
    """Give norm layers non-trivial affine parameters (and BatchNorm non-trivial running stats).

    Freshly constructed norms are identities (weight 1, bias 0, mean 0, var 1); a fused kernel that
    forgets the affine part or the running stats would still pass. Uses the current RNG.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.LayerNorm, RMSNorm, nn.BatchNorm2d)) and m.weight is not None:
                m.weight.uniform_(0.75, 1.25)
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)) and m.bias is not None:
                m.bias.normal_(0.0, 0.1)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def make_token_ids(config: dict, shape: dict, dtype: torch.dtype, generator: torch.Generator) -> tuple[torch.Tensor]:
    """Random int64 token ids (batch, seq) below the vocabulary size (the language models' input)."""
    return (torch.randint(0, config["vocab"], (shape["batch"], shape["seq"]), generator=generator),)


def make_images(config: dict, shape: dict, dtype: torch.dtype, generator: torch.Generator) -> tuple[torch.Tensor]:
    """A (batch, 3, image, image) batch drawn from N(0, 1), like normalised pixels."""
    size = shape["image"]
    return (torch.randn(shape["batch"], 3, size, size, generator=generator).to(dtype),)


# ---------------------------------------------------------------------------------------------
# norms and MLPs


class RMSNorm(nn.Module):
    """Root-mean-square norm written as HF LLaMA writes it (computed in fp32, cast back)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class FeedForward(nn.Module):
    """Linear -> GELU -> Linear (GPT-2, BERT, ViT). `approximate` is "none" (exact) or "tanh"."""

    def __init__(self, dim: int, hidden: int, approximate: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class SwiGLU(nn.Module):
    """LLaMA MLP: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ---------------------------------------------------------------------------------------------
# attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, _ = x.shape
    return x.view(b, s, n_heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> (B, S, H*D)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection (GPT-2, ViT) or three (BERT).

    `forward(x, mask)` takes an optional additive float mask broadcastable to (B, H, S, S).
    """

    def __init__(self, dim: int, n_heads: int, *, causal: bool = False, fused_qkv: bool = True) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"attention dim {dim} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.causal = causal
        if fused_qkv:
            self.qkv = nn.Linear(dim, 3 * dim)
        else:
            self.query = nn.Linear(dim, dim)
            self.key = nn.Linear(dim, dim)
            self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(merge_heads(y))


class PreLNBlock(nn.Module):
    """x + attn(ln1(x)); x + mlp(ln2(x)) — the GPT-2 / ViT transformer block."""

    def __init__(self, dim: int, n_heads: int, hidden: int, *, causal: bool, approximate: str, eps: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, n_heads, causal=causal)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = FeedForward(dim, hidden, approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


# ---------------------------------------------------------------------------------------------
# rotary embeddings (HF LLaMA style)


def rotary_tables(head_dim: int, max_positions: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Precomputed (cos, sin), each (max_positions, head_dim), halves duplicated as HF does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the last dim: (x1, x2) -> (-x2, x1)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k: (B, H, S, D); cos, sin: (S, D) broadcast over batch and heads."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv*n_rep, S, D) with expand + reshape, as HF's repeat_kv."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)

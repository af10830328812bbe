"""Attention variants of one region kind (issue 14): a sliding window in the tile loop, a causal kernel beside a
per-key padding mask, cross-attention (Sq != Skv) with an additive bias (T5's relative positions, no 1/sqrt(d)),
against torch's SDPA: every element on ``c`` (fp32), a compile for sm_90a, GPU numerics in fp16/bf16 (``gpu``)."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.templates import attention

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}

# name: (B, Hq, Hkv, Sq, Skv, D, kwargs); odd lengths so every tail path runs
CASES = {
    "window_5": (2, 2, 2, 37, 37, 16, {"is_causal": True, "window": 5}),
    "window_gqa_tile": (1, 4, 2, 45, 45, 16, {"is_causal": True, "window": 16}),
    "window_1": (1, 1, 1, 19, 19, 16, {"is_causal": True, "window": 1}),
    "window_wider_than_seq": (1, 2, 2, 21, 21, 16, {"is_causal": True, "window": 64}),
    "window_key_padding": (2, 2, 2, 33, 33, 16, {"is_causal": True, "window": 7, "mask_shape": (2, 1, 1, 33)}),
    "causal_key_padding": (2, 2, 1, 37, 37, 16, {"is_causal": True, "mask_shape": (2, 1, 1, 37)}),
    "cross_bias_unscaled": (2, 2, 2, 19, 41, 16, {"scale": 1.0, "mask_shape": (1, 2, 19, 41)}),
    "cross_plain": (1, 3, 3, 7, 50, 32, {}),
}


def _mask(rng, shape, dtype, device):
    """A per-key padding mask (0 or finfo.min; every 4th key kept, so that every query sees a key through any window
    of 4 or more: a query whose visible keys are all masked is a known, open difference from torch's SDPA, see
    ``planner/attention_mask.py``) or a random bias."""
    if shape[-2] == 1:
        keep = torch.rand(shape, generator=rng) > 0.3
        keep[..., ::4] = True
        return torch.where(keep, 0.0, torch.finfo(dtype).min).to(dtype).to(device)
    return torch.randn(shape, generator=rng).to(dtype).to(device)


def run(rng, target, name, dtype=torch.float32, device="cpu", tol=None, head_dim=None, **config):
    B, Hq, Hkv, Sq, Skv, D, kw = CASES[name]
    D = head_dim or D
    dt = str(dtype).split(".")[1]
    f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, dtype=dt, mask_dtype=dt, target=target, **kw, **config)
    kernel = compile_kernel(f, target, [-1])
    ms = kw.get("mask_shape")
    for _ in range(2):  # fresh inputs each call
        q, k, v = (torch.randn(s, generator=rng).to(dtype).to(device)
                   for s in ((B, Hq, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, D)))
        m = _mask(rng, ms, dtype, device) if ms else None
        got = kernel(q, k, v, *([m] if m is not None else []))
        want = _sdpa(q, k, v, m, kw)
        torch.testing.assert_close(got, want, **(tol or {"rtol": 1e-5, "atol": 1e-5}))


def _sdpa(q, k, v, m, kw):
    """torch's SDPA with the window and the causal triangle as an explicit boolean mask, in fp32."""
    Sq, Skv = q.shape[-2], k.shape[-2]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    bias = torch.zeros(Sq, Skv, device=q.device) if m is None else m.float()
    if kw.get("is_causal"):
        i, j = torch.arange(Sq, device=q.device).view(-1, 1), torch.arange(Skv, device=q.device).view(1, -1)
        visible = (j <= i) & ((j > i - kw["window"]) if kw.get("window") else True)
        bias = bias.masked_fill(~visible, float("-inf"))
    out = F.scaled_dot_product_attention(q.float(), k, v, attn_mask=bias, scale=kw.get("scale"))
    return out.to(q.dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_variants_c_match_sdpa(name, rng):
    run(rng, C, name, block_M=16, block_N=16)


def test_window_default_config_c(rng):
    run(rng, C, "window_gqa_tile", **attention.get_configs(C)[0])


def test_reference_takes_the_window(rng):
    q, k, v = (torch.randn(1, 2, 23, 16, generator=rng) for _ in range(3))
    kw = {"is_causal": True, "window": 4}
    torch.testing.assert_close(attention.reference(q, k, v, **kw), _sdpa(q, k, v, None, kw))


def test_window_refusals():
    with pytest.raises(ValueError, match="sliding window"):
        attention.flash_attention(1, 1, 8, 8, 16, window=4, dtype="float32", target=C)
    with pytest.raises(ValueError, match="sliding window"):
        attention.flash_attention(1, 1, 8, 8, 16, is_causal=True, window=0, dtype="float32", target=C)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", ["window_key_padding", "cross_bias_unscaled", "causal_key_padding"])
def test_variants_compile_for_sm90a(name):
    B, Hq, Hkv, Sq, Skv, _, kw = CASES[name]  # head dim 64, as the GPU runs it
    for dtype in ("float16", "bfloat16"):
        f = attention.flash_attention(B, Hq, Sq, Skv, 64, Hkv=Hkv, dtype=dtype, mask_dtype=dtype, target=SM90, **kw,
                                      **attention.get_configs(SM90, 64)[0])
        src = compile_kernel(f, SM90, [-1]).get_kernel_source()
        assert "flash_attention_kernel" in src


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_variants_gpu_match_sdpa(name, dtype, rng):
    tol = {"rtol": 2e-2, "atol": 2e-2}
    for cfg in attention.get_configs(SM90, 64)[:2]:
        run(rng, SM90, name, dtype=dtype, device="cuda", tol=tol, head_dim=64, **cfg)


def test_sdpa_op_reference_takes_causal_mask_and_window(rng):
    from tilefuse import ops

    q, k, v = (torch.randn(2, 2, 23, 16, generator=rng) for _ in range(3))
    pad = torch.where(torch.rand(2, 1, 1, 23, generator=rng) > 0.3, 0.0, -1e9)
    pad[..., 0] = 0.0
    for kw in ({"is_causal": True, "window": 4}, {"is_causal": True}):
        (got,) = ops.get("sdpa").run([q, k, v, pad], kw)
        torch.testing.assert_close(got, _sdpa(q, k, v, pad, kw))
    with pytest.raises(ValueError, match="sliding window needs is_causal"):
        ops.get("sdpa").run([q, k, v], {"window": 4})

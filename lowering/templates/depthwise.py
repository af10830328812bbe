"""Depthwise 2-D convolution over channels-last activations (``groups`` = input channels), with a fused epilogue.

Note: ``X`` is ``(N, H, W, C)``, the weight torch's ``(O, 1, KH, KW)`` with ``O = C * mult`` (output channel ``o``
reads input channel ``o // mult``), ``Out`` is ``(N, OH, OW, O)``. One program owns ``block_pixels`` consecutive
output pixels (flattened ``(N, OH, OW)``) by ``block_C`` output channels: it stages its channels' taps in shared memory
once, then walks the window (``KH x KW`` taps) as a serial loop, each tap one load of the tile's inputs (contiguous
along the channels, so vector loads) and one fp32 multiply-add a element. A tap in the padding reads a clamped
address and adds nothing. Neighbouring pixels read overlapping windows: the reuse comes from L1.

The elementwise form (``lowering/conv_builder._grouped_conv``: each output element one expression of its taps, weights
read from global memory a tap) ran ConvNeXt-T's 7x7 convolutions (b64, 56x56x96 fp16) at 1.79 ms on an H100, cuDNN at
0.19 (bench/results/2026-12-07-h100-session55).

The epilogue maps each result (``Acc``, fp32) with extras broadcast against ``Out``'s shape (``Arg(i)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.language as T
import torch
import torch.nn.functional as F

from tilefuse.lowering.expr import Acc, Env, Expr, emit, evaluate
from tilefuse.lowering.templates.common import (
    arg_loader,
    check_dtype,
    dialect,
    normalize_shapes,
    param,
    target_kind,
    view,
)


def output_shape(x_shape: Sequence[int], w_shape: Sequence[int], stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1)) -> tuple[int, int, int, int]:
    """``(N, OH, OW, O)`` for a channels-last input of ``x_shape`` and a ``(O, 1, KH, KW)`` weight."""
    N, H, W, _ = (int(v) for v in x_shape)
    O, _, KH, KW = (int(v) for v in w_shape)
    OH = (H + 2 * padding[0] - dilation[0] * (KH - 1) - 1) // stride[0] + 1
    OW = (W + 2 * padding[1] - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    return N, OH, OW, O


def depthwise_conv2d(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    in_dtype: str = "float16",
    w_dtype: str | None = None,
    out_dtype: str | None = None,
    epilogue: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    block_pixels: int = 16,
    block_C: int = 64,
    threads: int = 128,
    target: dict | str = "cuda",
):
    """A ``T.prim_func``: ``Out = epilogue(depthwise_conv(X, weight))``. Parameters: ``X`` ``(N, H, W, C)``,
    ``weight`` ``(O, 1, KH, KW)``, ``extra_0..``, ``Out`` ``(N, OH, OW, O)``."""
    x_shape, w_shape = tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape)
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    if len(x_shape) != 4 or len(w_shape) != 4 or w_shape[1] != 1 or w_shape[0] % x_shape[3]:
        raise ValueError(f"depthwise_conv2d: a channels-last input {x_shape} by a (C * mult, 1, KH, KW) weight, "
                         f"not {w_shape}")
    w_dtype, out_dtype = w_dtype or in_dtype, out_dtype or in_dtype
    extra_shapes = normalize_shapes(extra_shapes)
    for dt in (in_dtype, w_dtype, out_dtype, *extra_dtypes):
        check_dtype(dt, target, "depthwise_conv2d")
    d = dialect(target)
    N, H, W, C = x_shape
    O, _, KH, KW = w_shape
    mult, taps = O // C, KH * KW
    out_shape = output_shape(x_shape, w_shape, stride, padding, dilation)
    _, OH, OW, _ = out_shape
    if OH < 1 or OW < 1:
        raise ValueError(f"depthwise_conv2d: no output for {x_shape} by {w_shape}")
    pixels = N * OH * OW
    bc = max(1, min(block_C, 1 << max(0, (O - 1).bit_length())))  # no wider than the channels
    pp = max(1, min(block_pixels, pixels))
    ragged = O % bc != 0  # a last channel tile past O: its channels are clamped and never stored
    epilogue = epilogue if epilogue is not None else Acc()
    f32 = "float32"

    def channel(c0, c):
        return T.min(c0 + c, O - 1) if ragged else c0 + c

    def place(p0, p):
        """(n, oh, ow) of output pixel p0 + p (clamped: tail pixels are never stored)."""
        pix = T.min(p0 + p, pixels - 1)
        return pix // (OH * OW), (pix // OW) % OH, pix % OW

    def tap_at(p0, p, kh, kw):
        """(inside?, n, h, w): the input pixel tap (kh, kw) of output pixel p0 + p reads, clamped into the input."""
        n, oh, ow = place(p0, p)
        h = oh * stride[0] - padding[0] + kh * dilation[0]
        w = ow * stride[1] - padding[1] + kw * dilation[1]
        inside = T.And(T.And(h >= 0, h < H), T.And(w >= 0, w < W))
        return inside, n, T.max(T.min(h, H - 1), 0), T.max(T.min(w, W - 1), 0)

    @T.prim_func
    def depthwise_conv2d_kernel():
        X = param("X", x_shape, in_dtype)
        Wt = param("weight", w_shape, w_dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out_nd = param("Out", out_shape, out_dtype)
        with d.kernel(T.ceildiv(O, bc), T.ceildiv(pixels, pp), threads=threads) as (bx, by):
            d.wait_inputs(False)
            io = {"W": view(Wt, (O, taps)), "Out": view(Out_nd, (pixels, O))}  # see common.view
            c0, p0 = bx * bc, by * pp
            w_s = d.shared((taps, bc), w_dtype)
            acc = d.fragment((pp, bc), f32)
            tile = d.fragment((pp, bc), in_dtype)
            for t, c in d.tile_loop(taps, bc):
                w_s[t, c] = io["W"][channel(c0, c), t]
            for p, c in d.tile_loop(pp, bc):
                acc[p, c] = T.float32(0)
            for kh in T.serial(KH):
                for kw in T.serial(KW):
                    for p, c in d.tile_loop(pp, bc):  # the tap's loads alone: vector loads along the channels
                        _, n, h, w = tap_at(p0, p, kh, kw)
                        ci = channel(c0, c) // mult if mult > 1 else channel(c0, c)
                        tile[p, c] = X[n, h, w, ci]
                    for p, c in d.tile_loop(pp, bc):
                        inside = tap_at(p0, p, kh, kw)[0]
                        acc[p, c] = acc[p, c] + T.if_then_else(
                            inside, T.Cast(f32, tile[p, c]) * T.Cast(f32, w_s[kh * KW + kw, c]), T.float32(0))
            for p, c in d.tile_loop(pp, bc):
                if T.And(p0 + p < pixels, c0 + c < O):
                    n, oh, ow = place(p0, p)
                    io["Out"][p0 + p, c0 + c] = T.Cast(out_dtype, emit(epilogue, Env(
                        acc=acc[p, c], arg=arg_loader(extras, extra_shapes, [n, oh, ow, c0 + c]))))

    return depthwise_conv2d_kernel


def reference(x: torch.Tensor, w: torch.Tensor, *, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
              epilogue: Expr | None = None, extras: Sequence[torch.Tensor] = (),
              out_dtype: str | None = None) -> torch.Tensor:
    """Torch reference of ``depthwise_conv2d`` (channels-last in and out), computed in fp32."""
    y = F.conv2d(x.float().movedim(-1, 1), w.float(), None, tuple(stride), tuple(padding), tuple(dilation),
                 groups=x.shape[-1]).movedim(1, -1)
    if epilogue is not None:
        y = evaluate(epilogue, y, list(extras), y.shape).float()
    return y.to(getattr(torch, out_dtype) if out_dtype else x.dtype)


def default_config(channels: int, pixels: int, target: dict | str) -> dict:
    """The untuned pick: on GPUs a channel tile that divides the channels where one of 64 or 32 does (no ragged tail)
    and 1024 outputs a program (8 a thread); a few pixels, fewer a program."""
    if dialect(target).cpu:
        return get_configs(target)[0]
    bc = next((b for b in (64, 32) if channels % b == 0), min(64, 1 << max(0, (channels - 1).bit_length())))
    return {"block_pixels": max(1, min(1024 // bc, pixels)), "block_C": bc, "threads": 128}


def get_configs(target: dict | str) -> list[dict]:
    """Seed configs; keys are ``depthwise_conv2d``'s tunables (the pick by shape first: ``lower.config_space``)."""
    if dialect(target).cpu:
        return [{"block_pixels": 16, "block_C": 32, "threads": 1}, {"block_pixels": 64, "block_C": 16, "threads": 1}]
    seeds = [(16, 64, 128), (32, 32, 128), (32, 64, 256), (8, 128, 128), (64, 32, 256), (16, 128, 256)]
    if target_kind(target) == "metal":  # a small threadgroup
        seeds = [s for s in seeds if s[2] == 128]
    return [{"block_pixels": p, "block_C": c, "threads": t} for p, c, t in seeds]

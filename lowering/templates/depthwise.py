"""Depthwise 2-D convolution over channels-last activations (``groups`` = input channels), with a fused epilogue.

Note: ``X`` is ``(N, H, W, C)``, the weight torch's ``(O, 1, KH, KW)`` with ``O = C * mult`` (output channel ``o``
reads input channel ``o // mult``), ``Out`` is ``(N, OH, OW, O)``. One program owns a ``tile_h x tile_w`` tile of one
image's output pixels by ``block_C`` output channels. It stages its channels' taps and the input patch the tile reads
in shared memory once (vector loads along the channels; zeros where the patch lies in the padding, which then counts
as torch's does: ``0 * w``), then walks the window (``KH x KW`` taps) as a serial loop, each tap one fp32
multiply-add a element from shared memory, at addresses with no clamps or bounds tests.

The elementwise form (``lowering/conv_builder._grouped_conv``: each output element one expression of its taps, weights
read from global memory a tap) ran ConvNeXt-T's 7x7 convolutions (b64, 56x56x96 fp16) at 1.79 ms on an H100, cuDNN at
0.19; a first form of this template that read each tap from global memory (clamped addresses, the reuse left to L1)
ran 0.25 at best, its index arithmetic the limit (bench/results/2026-12-07-h100-session55).

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
    fit_pow2,
    normalize_shapes,
    param,
    target_kind,
    view,
)
from tilefuse.lowering.templates.conv import output_hw


def output_shape(x_shape: Sequence[int], w_shape: Sequence[int], stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1)) -> tuple[int, int, int, int]:
    """``(N, OH, OW, O)`` for a channels-last input of ``x_shape`` and a ``(O, 1, KH, KW)`` weight."""
    N, H, W, _ = (int(v) for v in x_shape)
    O, _, KH, KW = (int(v) for v in w_shape)
    return (N, *output_hw(H, W, KH, KW, stride, padding, dilation), O)


def _fit(tile_h: int, tile_w: int, bc: int, threads: int, cpu: bool) -> tuple[int, int]:
    """The output tile, taller where needed so that its fragment splits evenly over the threads (GPUs)."""
    th, tw = tile_h, tile_w
    while not cpu and (th * tw * bc) % threads:
        th *= 2
    return th, tw


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
    tile_h: int = 8,
    tile_w: int = 8,
    block_C: int = 32,
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
    bc = fit_pow2(block_C, O)  # no wider than the channels
    th, tw = _fit(fit_pow2(tile_h, OH), fit_pow2(tile_w, OW), bc, threads, d.cpu)
    tiles_h, tiles_w = -(-OH // th), -(-OW // tw)
    # the input patch an output tile reads (zeros where it lies in the padding)
    PH, PW = (th - 1) * stride[0] + (KH - 1) * dilation[0] + 1, (tw - 1) * stride[1] + (KW - 1) * dilation[1] + 1
    ragged = O % bc != 0  # a last channel tile past O: its channels are clamped and never stored
    epilogue = epilogue if epilogue is not None else Acc()
    f32 = "float32"

    def channel(c0, c):
        return T.min(c0 + c, O - 1) if ragged else c0 + c

    @T.prim_func
    def depthwise_conv2d_kernel():
        X = param("X", x_shape, in_dtype)
        Wt = param("weight", w_shape, w_dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out = param("Out", out_shape, out_dtype)
        with d.kernel(N * tiles_h * tiles_w, T.ceildiv(O, bc), threads=threads) as (bx, by):
            d.wait_inputs(False)
            io = {"W": view(Wt, (O, taps))}  # in a container: see common.view
            n, tile, c0 = bx // (tiles_h * tiles_w), bx % (tiles_h * tiles_w), by * bc
            oh0, ow0 = (tile // tiles_w) * th, (tile % tiles_w) * tw
            h0, w0 = oh0 * stride[0] - padding[0], ow0 * stride[1] - padding[1]
            w_s = d.shared((taps, bc), w_dtype)
            x_s = d.shared((PH, PW, bc), in_dtype)
            acc = d.fragment((th * tw, bc), f32)
            for t, c in d.tile_loop(taps, bc):
                w_s[t, c] = io["W"][channel(c0, c), t]
            for i in T.serial(PH):  # the patch, once, a row at a time: vector loads along the channels
                for j, c in d.tile_loop(PW, bc):
                    h, w = h0 + i, w0 + j
                    inside = T.And(T.And(h >= 0, h < H), T.And(w >= 0, w < W))
                    ci = channel(c0, c) // mult if mult > 1 else channel(c0, c)
                    x_s[i, j, c] = T.if_then_else(inside, X[n, T.max(T.min(h, H - 1), 0),
                                                            T.max(T.min(w, W - 1), 0), ci], T.Cast(in_dtype, 0))
            for p, c in d.tile_loop(th * tw, bc):
                acc[p, c] = T.float32(0)
            for kh in T.serial(KH):
                for kw in T.serial(KW):
                    for p, c in d.tile_loop(th * tw, bc):
                        x = x_s[(p // tw) * stride[0] + kh * dilation[0], (p % tw) * stride[1] + kw * dilation[1], c]
                        acc[p, c] = acc[p, c] + T.Cast(f32, x) * T.Cast(f32, w_s[kh * KW + kw, c])
            for p, c in d.tile_loop(th * tw, bc):
                oh, ow = oh0 + p // tw, ow0 + p % tw
                if T.And(T.And(oh < OH, ow < OW), c0 + c < O):
                    Out[n, oh, ow, c0 + c] = T.Cast(out_dtype, emit(epilogue, Env(
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


def default_config(channels: int, stride: Sequence[int], target: dict | str) -> dict:
    """The untuned pick (on GPUs). Strided: 8 x 8 output pixels by 16 channels, 256 threads. Otherwise 16 x 8 pixels by
    32 channels and 256 threads where 32 divides the channels, else by 16 and 128 threads.

    Fitted on the H200 to ``bench/sweep_depthwise.py``'s 27 configs at ConvNeXt-T's 7x7 and EfficientNet-B0's 3x3 and
    5x5 shapes (b64 fp16, bench/results/2026-12-07-h200-session56): within 1.06x of each shape's best (geometric mean,
    1.19x at worst) and faster than cuDNN at all 11. The previous pick (8 x 8 by 32, 128 threads) was 1.39x off the
    best, 2.5x on EfficientNet's stride-2 and 32-channel ones."""
    if dialect(target).cpu:
        return get_configs(target)[0]
    if tuple(stride) != (1, 1):
        return {"tile_h": 8, "tile_w": 8, "block_C": 16, "threads": 256}
    wide = channels % 32 == 0
    return {"tile_h": 16, "tile_w": 8, "block_C": 32 if wide else 16, "threads": 256 if wide else 128}


def get_configs(target: dict | str) -> list[dict]:
    """Seed configs; keys are ``depthwise_conv2d``'s tunables (the pick by shape first: ``lower.config_space``).
    On GPUs, the picks of ``default_config`` and the runners-up of the H200's sweep."""
    if dialect(target).cpu:
        return [{"tile_h": 4, "tile_w": 4, "block_C": 32, "threads": 1},
                {"tile_h": 8, "tile_w": 8, "block_C": 16, "threads": 1}]
    seeds = [(16, 8, 32, 256), (16, 8, 16, 128), (8, 8, 16, 256), (8, 8, 32, 128), (16, 8, 64, 256),
             (8, 8, 64, 128), (16, 16, 16, 256)]
    if target_kind(target) == "metal":  # a small threadgroup
        seeds = [s for s in seeds if s[3] == 128]
    return [{"tile_h": h, "tile_w": w, "block_C": c, "threads": t} for h, w, c, t in seeds]

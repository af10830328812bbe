"""2-D pooling over the last two dims (or the two before channels, ``channels_last``): max, average and adaptive
average, with a fused producer and consumer.

Note: one program owns ``block`` output elements (flattened ``(*lead, OH, OW)``, lead = batch and
channels, so NCHW and unbatched CHW alike; ``(*lead, OH, OW, C)`` channels last, neighbouring threads on
neighbouring channels) and keeps one fp32 accumulator per element in a
fragment; it walks the window (``KH x KW`` taps, the largest window for adaptive pooling) as an
outer serial loop and all its elements in an inner parallel loop, so on GPUs the threads read
neighbouring outputs' taps together. A tap outside the input (padding, or past an adaptive
window's end) does not count: max pooling skips it (so padding behaves as -inf, as torch's does)
and average pooling adds nothing, dividing by torch's divisor (the window clipped to the padded
input with ``count_include_pad``, else to the input). Max pooling propagates NaN as torch does.
The producer maps each loaded input element (``Acc``; extras broadcast against the input shape),
the consumer maps each pooled value (``Acc``; extras broadcast against the output shape). With
``write_pre`` the producer's result is stored too (another region reads it): each program also
writes its share of the input elements, so the kernel reads X once more instead of launching again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tilelang.language as T
import torch
import torch.nn.functional as F

from tilefuse.lowering.expr import Acc, Env, Expr, emit, evaluate
from tilefuse.lowering.templates import gemm_configs
from tilefuse.lowering.templates.common import (
    arg_loader,
    check_dtype,
    dialect,
    fit_pow2,
    normalize_shapes,
    numel,
    param,
    target_kind,
    unravel,
    view,
)

KINDS = ("max", "avg", "adaptive_avg")


def _out_len(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooled length (``pooling_output_shape``)."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:  # the last window must start inside the input or left padding
        out -= 1
    return out


def output_shape(x_shape: Sequence[int], kind: str, kernel=(1, 1), stride=None, padding=(0, 0), dilation=(1, 1),
                 ceil_mode: bool = False, output_size=None, channels_last: bool = False) -> tuple[int, ...]:
    """The shape ``pool2d`` produces for an input of ``x_shape``."""
    shape = tuple(int(v) for v in x_shape)
    (*lead, h, w), tail = (shape[:-1], shape[-1:]) if channels_last else (shape, ())
    if kind == "adaptive_avg":
        return (*lead, *(int(v) for v in output_size), *tail)
    stride = tuple(stride or kernel)
    return (*lead, *(_out_len(n, k, s, p, d, ceil_mode)
                     for n, k, s, p, d in zip((h, w), kernel, stride, padding, dilation)), *tail)


def _adaptive_span(n: int, out: int) -> int:
    """The largest adaptive window over ``n`` inputs for ``out`` outputs."""
    return max(-(-(i + 1) * n // out) - i * n // out for i in range(out))


def pool2d(
    x_shape: Sequence[int],
    kind: str,
    *,
    kernel: Sequence[int] = (1, 1),
    stride: Sequence[int] | None = None,
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    output_size: Sequence[int] | None = None,
    x_dtype: str = "float32",
    out_dtype: str | None = None,
    producer: Expr | None = None,
    consumer: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    write_pre: bool = False,
    pre_dtype: str | None = None,
    channels_last: bool = False,
    block: int = 256,
    threads: int = 128,
    pixel_tiles: bool = False,
    global_C: int = 0,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` pooling ``X`` of ``x_shape`` (``(*lead, H, W)``, or ``(*lead, H, W, C)`` with
    ``channels_last``) over H and W.

    ``kind``: ``max`` (``kernel``, ``stride`` (default: the kernel), ``padding``, ``dilation``,
    ``ceil_mode``), ``avg`` (the same but dilation, plus ``count_include_pad``) or ``adaptive_avg``
    (``output_size``). Parameters: ``X``, ``extra_0..``, ``Out`` (``output_shape``), then ``Pre``
    (the producer's result, X's shape) if ``write_pre``. ``Arg(i)`` is ``extra_i``: in ``producer``
    broadcast against X's shape, in ``consumer`` against Out's.

    ``global_C``: where the pool is an average over the whole plane of a channels-last input (``whole_plane``), a
    program owns that many channels of one image and its threads split the plane's pixels (``_global_schedule``);
    else (0, or any other pool) each output walks its window alone.
    """
    if kind not in KINDS:
        raise NotImplementedError(f"pool2d: kind {kind!r} is not one of {KINDS}")
    x_shape = tuple(int(v) for v in x_shape)
    if len(x_shape) < 3:
        raise ValueError(f"pool2d: input {x_shape} needs (channels, H, W) at least")
    if channels_last and len(x_shape) < 4:
        raise ValueError(f"pool2d: channels-last input {x_shape} needs (N, H, W, C)")
    kernel, padding, dilation = tuple(kernel), tuple(padding), tuple(dilation)
    stride = tuple(stride or kernel)
    if kind == "avg" and dilation != (1, 1):
        raise ValueError("pool2d: average pooling has no dilation")
    out_dtype, pre_dtype = out_dtype or x_dtype, pre_dtype or x_dtype
    extra_shapes = normalize_shapes(extra_shapes)
    for dt in (x_dtype, out_dtype, pre_dtype, *extra_dtypes):
        check_dtype(dt, target, "pool2d")
    d = dialect(target)
    # A pixel position is (plane, c): planes = the leading dims' elements, c the channel (always 0 channels first).
    Cc = x_shape[-1] if channels_last else 1
    lead, (H, W) = (x_shape[:-3], x_shape[-3:-1]) if channels_last else (x_shape[:-2], x_shape[-2:])
    out_shape = output_shape(x_shape, kind, kernel, stride, padding, dilation, ceil_mode, output_size, channels_last)
    OH, OW = out_shape[-3:-1] if channels_last else out_shape[-2:]
    planes, total = numel(lead), numel(out_shape)
    KH, KW = (_adaptive_span(H, OH), _adaptive_span(W, OW)) if kind == "adaptive_avg" else kernel
    # A GPU fragment splits evenly over the threads: a short output still gets whole thread rows.
    block = max(1, min(block, total if d.cpu else -(-total // threads) * threads))
    grid = -(-total // block)
    pre_share = -(-numel(x_shape) // grid)  # input elements each program stores with write_pre
    pre_tiles = -(-pre_share // block)
    producer = producer if producer is not None else Acc()
    consumer = consumer if consumer is not None else Acc()
    f32 = "float32"

    def split(idx):
        """(output pixel, channel) of flat output element idx."""
        return (idx // Cc, idx % Cc) if channels_last else (idx, 0)

    def place(pc):
        """(plane, oh, ow, c) of output (pixel, channel) pc (clamped: tail pixels are never stored)."""
        pix, c = pc
        pix = T.min(pix, total // Cc - 1)
        return pix // (OH * OW), (pix // OW) % OH, pix % OW, c

    def at(Xv, plane, h, w, c):
        return Xv[plane, h, w, c] if channels_last else Xv[plane, h, w]

    def coords(plane, h, w, c):
        """Where an extra operand broadcast against X's or Out's shape is read."""
        return [*unravel(plane, lead), h, w, c] if channels_last else [*unravel(plane, lead), h, w]

    def span(o, n, n_out, k, s, p):
        """The window of output o along one dim: [first, end) in input coordinates."""
        if kind == "adaptive_avg":
            return (o * n) // n_out, ((o + 1) * n + n_out - 1) // n_out
        return o * s - p, o * s - p + k

    def where(pc, kh, kw):
        """(inside?, plane, h, w, c): the input element window tap (kh, kw) of output (pixel, channel) pc reads,
        clamped into the input (``inside`` says whether it counts)."""
        plane, oh, ow, c = place(pc)
        (h0, h1), (w0, w1) = span(oh, H, OH, KH, stride[0], padding[0]), span(ow, W, OW, KW, stride[1], padding[1])
        h, w = (h0 + kh, w0 + kw) if kind == "adaptive_avg" else (h0 + kh * dilation[0], w0 + kw * dilation[1])
        if kind == "adaptive_avg":  # a tap past a short window's end does not count
            inside = T.And(h < h1, w < w1)
        else:
            inside = T.And(T.And(h >= 0, h < H), T.And(w >= 0, w < W))
        return inside, plane, T.max(T.min(h, H - 1), 0), T.max(T.min(w, W - 1), 0), c

    def tap(Xv, extras, pc, kh, kw, loaded=None):
        """(inside?, producer value) of window tap (kh, kw) of output (pixel, channel) pc; ``loaded``: the input
        element there, already read."""
        inside, plane, hc, wc, c = where(pc, kh, kw)
        v = emit(producer, Env(acc=at(Xv, plane, hc, wc, c) if loaded is None else loaded,
                               arg=arg_loader(extras, extra_shapes, coords(plane, hc, wc, c))))
        return inside, T.Cast(f32, v)

    def pre_value(Xv, extras, e):
        """The producer at flat input element e (clamped; tails are never stored)."""
        e = T.min(e, numel(x_shape) - 1)
        pix, c = (e // Cc, e % Cc) if channels_last else (e, 0)
        plane, h, w = pix // (H * W), (pix // W) % H, pix % W
        v = emit(producer, Env(acc=at(Xv, plane, h, w, c),
                               arg=arg_loader(extras, extra_shapes, coords(plane, h, w, c))))
        return T.Cast(pre_dtype, v)

    def merged(acc, Xv, extras, pc, kh, kw, loaded=None):
        inside, v = tap(Xv, extras, pc, kh, kw, loaded)
        if kind == "max":
            return T.if_then_else(T.And(inside, T.Or(v > acc, T.isnan(v))), v, acc)
        return acc + T.if_then_else(inside, v, T.float32(0))

    def finished(acc, extras, pc):
        plane, oh, ow, c = place(pc)
        if kind != "max":
            (h0, h1), (w0, w1) = span(oh, H, OH, KH, stride[0], padding[0]), span(ow, W, OW, KW, stride[1], padding[1])
            if kind == "avg" and count_include_pad:
                h1, w1 = T.min(h1, H + padding[0]), T.min(w1, W + padding[1])
            else:
                h0, h1, w0, w1 = T.max(h0, 0), T.min(h1, H), T.max(w0, 0), T.min(w1, W)
            acc = acc / T.Cast(f32, (h1 - h0) * (w1 - w0))
        return T.Cast(out_dtype, emit(consumer, Env(acc=acc, arg=arg_loader(extras, extra_shapes,
                                                                            coords(plane, oh, ow, c)))))

    if global_C and whole_plane(x_shape, kind, kernel, padding, dilation, output_size, channels_last):
        return _global_schedule(x_shape, out_shape, extra_shapes, extra_dtypes, x_dtype, out_dtype, pre_dtype,
                                write_pre, global_C, threads, d, producer, finished, coords)
    fill = -math.inf if kind == "max" else 0.0
    # With ``pixel_tiles`` a channels-last program takes block / C whole output pixels (C dividing block), so a tap's
    # loads are contiguous along the channel loop index, where a flat index's ``% C`` hides that from the vectorizer.
    pixels = block // Cc if pixel_tiles and channels_last and not d.cpu and block % Cc == 0 else 0

    @T.prim_func
    def pool2d_kernel():
        X_nd = param("X", x_shape, x_dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out_nd = param("Out", out_shape, out_dtype)
        Pre_nd = param("Pre", x_shape, pre_dtype) if write_pre else None
        with d.kernel(grid, threads=threads) as bx:
            x_view = (planes, H, W, Cc) if channels_last else (planes, H, W)
            io = {"X": view(X_nd, x_view), "Out": view(Out_nd, (total,))}  # see common.view
            if write_pre:
                io["Pre"] = view(Pre_nd, (numel(x_shape),))
                for t in T.serial(pre_tiles):
                    for i in d.tile_loop(block):
                        if T.And(t * block + i < pre_share, bx * pre_share + t * block + i < numel(x_shape)):
                            io["Pre"][bx * pre_share + t * block + i] = pre_value(io["X"], extras,
                                                                                  bx * pre_share + t * block + i)
            if pixels:  # a tile of whole pixels: each channel is a loop index of its own (contiguous loads)
                acc, tile = d.fragment((pixels, Cc), f32), d.fragment((pixels, Cc), x_dtype)
                for p, c in d.tile_loop(pixels, Cc):
                    acc[p, c] = T.float32(fill)
                for kh in T.serial(KH):
                    for kw in T.serial(KW):
                        for p, c in d.tile_loop(pixels, Cc):  # the tap's loads alone: vector loads
                            _, plane, hc, wc, _ = where((bx * pixels + p, c), kh, kw)
                            tile[p, c] = io["X"][plane, hc, wc, c]
                        for p, c in d.tile_loop(pixels, Cc):
                            acc[p, c] = merged(acc[p, c], io["X"], extras, (bx * pixels + p, c), kh, kw, tile[p, c])
                for p, c in d.tile_loop(pixels, Cc):
                    if bx * pixels + p < total // Cc:
                        io["Out"][(bx * pixels + p) * Cc + c] = finished(acc[p, c], extras, (bx * pixels + p, c))
            else:
                acc = d.fragment((block,), f32)
                for i in d.tile_loop(block):
                    acc[i] = T.float32(fill)
                for kh in T.serial(KH):
                    for kw in T.serial(KW):
                        for i in d.tile_loop(block):
                            acc[i] = merged(acc[i], io["X"], extras, split(bx * block + i), kh, kw)
                for i in d.tile_loop(block):
                    if bx * block + i < total:
                        io["Out"][bx * block + i] = finished(acc[i], extras, split(bx * block + i))

    return pool2d_kernel


def whole_plane(x_shape: Sequence[int], kind: str, kernel=(1, 1), padding=(0, 0), dilation=(1, 1), output_size=None,
                channels_last: bool = False) -> bool:
    """Whether each output averages the whole (H, W) plane of a channels-last input: a global average pool
    (EfficientNet's squeeze-and-excitation, a CNN's head)."""
    if not channels_last or len(x_shape) < 4 or kind == "max":
        return False
    if kind == "adaptive_avg":
        return tuple(output_size) == (1, 1)
    return tuple(kernel) == tuple(x_shape[-3:-1]) and tuple(padding) == (0, 0) and tuple(dilation) == (1, 1)


def _global_schedule(x_shape, out_shape, extra_shapes, extra_dtypes, x_dtype, out_dtype, pre_dtype, write_pre,
                     global_C, threads, d, producer, finished, coords):
    """``pool2d``'s prim func for a whole-plane average, channels last: program ``(image, channel block)`` sums its
    ``bc`` channels over the ``H * W`` pixels, ``rows`` pixels a step (8 elements a thread), each thread into its own
    partial sums (loads contiguous along the channels); the partial sums are then transposed through shared memory
    and reduced over the rows (``Dialect.reduce``). The per-output schedule walked 12544 pixels serially in each of 4
    programs at EfficientNet-B0's first squeeze (b64, 112x112x32 fp16): 0.815 ms on the H200 against torch's 0.031."""
    Cc, W, lead = x_shape[-1], x_shape[-2], x_shape[:-3]
    planes, HW = numel(lead), x_shape[-3] * x_shape[-2]
    bc = fit_pow2(global_C, Cc)
    rows = 1 if d.cpu else max(1, threads * 8 // bc)
    steps, cblocks = -(-HW // rows), -(-Cc // bc)
    f32 = "float32"

    @T.prim_func
    def pool2d_kernel():
        X_nd = param("X", x_shape, x_dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out_nd = param("Out", out_shape, out_dtype)
        Pre_nd = param("Pre", x_shape, pre_dtype) if write_pre else None
        with d.kernel(planes * cblocks, threads=threads) as bx:
            io = {"X": view(X_nd, (planes, HW, Cc)), "Out": view(Out_nd, (planes * Cc,))}  # see common.view
            if write_pre:
                io["Pre"] = view(Pre_nd, (planes, HW, Cc))
            plane, c0 = bx // cblocks, (bx % cblocks) * bc
            part = d.fragment((rows, bc), f32)
            for r, c in d.tile_loop(rows, bc):
                part[r, c] = T.float32(0)
            for st in T.serial(steps):
                for r, c in d.tile_loop(rows, bc):
                    px, ch = T.min(st * rows + r, HW - 1), T.min(c0 + c, Cc - 1)
                    v = emit(producer, Env(acc=io["X"][plane, px, ch],
                                           arg=arg_loader(extras, extra_shapes, coords(plane, px // W, px % W, ch))))
                    if write_pre:
                        if T.And(st * rows + r < HW, c0 + c < Cc):
                            io["Pre"][plane, px, ch] = T.Cast(pre_dtype, v)
                    part[r, c] = part[r, c] + T.if_then_else(st * rows + r < HW, T.Cast(f32, v), T.float32(0))
            staged = d.shared((rows, bc), f32)
            for r, c in d.tile_loop(rows, bc):
                staged[r, c] = part[r, c]
            by_channel, total = d.reducible((bc, rows), f32), d.reducible((bc,), f32)
            for c, r in d.tile_loop(bc, rows):
                by_channel[c, r] = staged[r, c]
            d.reduce("sum", by_channel, total)
            for c in d.tile_loop(bc):
                if c0 + c < Cc:
                    io["Out"][plane * Cc + c0 + c] = finished(total[c], extras, (plane, c0 + c))

    return pool2d_kernel


def reference(x: torch.Tensor, kind: str, *, kernel=(1, 1), stride=None, padding=(0, 0), dilation=(1, 1),
              ceil_mode: bool = False, count_include_pad: bool = True, output_size=None,
              extras: Sequence[torch.Tensor] = (), producer: Expr | None = None, consumer: Expr | None = None,
              out_dtype: str | None = None, channels_last: bool = False) -> torch.Tensor:
    """Torch reference of ``pool2d``, computed in fp32 (the ``Pre`` output is ``evaluate(producer, x)``)."""
    pre = evaluate(producer, x, list(extras)).float() if producer is not None else x.float()
    if channels_last:
        pre = pre.movedim(-1, -3)
    stride = tuple(stride or kernel)
    if kind == "max":
        y = F.max_pool2d(pre, tuple(kernel), stride, tuple(padding), tuple(dilation), ceil_mode)
    elif kind == "avg":
        y = F.avg_pool2d(pre, tuple(kernel), stride, tuple(padding), ceil_mode, count_include_pad)
    else:
        y = F.adaptive_avg_pool2d(pre, tuple(output_size))
    if channels_last:
        y = y.movedim(-3, -1)
    if consumer is not None:
        y = evaluate(consumer, y, list(extras)).float()
    return y.to(getattr(torch, out_dtype) if out_dtype else x.dtype)


def default_config(kw: dict, target: dict | str, global_pool: bool) -> dict:
    """The untuned pick: the first seed; with ``global_pool`` (``Options.experimental`` "global_pool", not yet run on
    a GPU), a whole-plane average on a GPU takes ``global_C`` channels a program: the widest of 64, 32, 16 and 8 whose
    programs fill each of the target's SMs twice (8 where none does)."""
    first = get_configs(target)[0]
    if dialect(target).cpu or not global_pool or not whole_plane(
            kw["x_shape"], kw["kind"], kw.get("kernel", (1, 1)), kw.get("padding", (0, 0)), kw.get("dilation", (1, 1)),
            kw.get("output_size"), kw.get("channels_last", False)):
        return first
    planes, channels = numel(kw["x_shape"][:-3]), kw["x_shape"][-1]
    sms = gemm_configs.sm_count(target)
    bc = next((b for b in (64, 32, 16) if planes * -(-channels // b) >= 2 * sms), 8)
    return {"block": first["block"], "threads": 128, "global_C": bc}


def get_configs(target: dict | str) -> list[dict]:
    """Seed configs; keys are ``pool2d``'s tunables. On CUDA the lead takes whole pixels (``pixel_tiles``, where the
    channels divide the block): ResNet-50's stem pool (b64, 112x112x64 fp16, NHWC) ran 0.055 ms so on the H100 against
    0.100 for the old lead (256, 128) and 0.053 for Inductor's (``bench/bench_pool.py``, session 52)."""
    if dialect(target).cpu:
        return [{"block": 256, "threads": 1}, {"block": 1024, "threads": 1}]
    seeds = [{"block": b, "threads": t} for b, t in ((256, 128), (512, 256), (128, 128))]
    if target_kind(target) != "cuda":  # (measured on NVIDIA only)
        return seeds
    return [{"block": 512, "threads": 128, "pixel_tiles": True}, {"block": 1024, "threads": 256, "pixel_tiles": True},
            *seeds]

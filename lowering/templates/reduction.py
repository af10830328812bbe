"""Row reductions over the last axis, with a fused producer, an optional pre-norm output and a consumer.

Note: rows = product of the leading dims; each program owns ``block_rows`` rows and walks them in
column tiles of ``block_N``. One pass gathers the statistics (online max/sum for softmax, Chan's
parallel mean/M2 merge for layer_norm and var, which stays accurate when the mean is large, a sum
of squares for rms_norm); normalizing kinds then make a second pass that recomputes the producer
(with a single tile the loaded tile is reused, so the row is read once). The producer maps each
loaded element (``Acc``) with the region's extra inputs broadcast against the input shape, e.g.
``x + residual``; its result can be stored as a second output (the residual stream's pre-norm sum).
The consumer maps each result (``Acc``) with extras broadcast against the output shape. Everything
computes in fp32.

Note: NaN follows torch: a row holding one reduces to NaN. ``T.reduce_max``/``reduce_min`` drop NaN on every
target (C's ``a > b ? a : b``, CUDA's ``fmaxf``), so amax/amin also keep a per-element "NaN seen" tile, cheap
register work per tile and one more reduction per row, and a flagged row gives NaN. Softmax and log_softmax
need no flag: a NaN element makes ``exp(x - max)`` and so the row's sum NaN, whatever max was taken.

Note: a layer_norm row whose moments overflow float32 (M2, the sum of squared deviations, past 3.4e38, or a mean that
overflowed) is NaN on every target, so that the overflow shows: ``(x - mean) * rsqrt(inf)`` made it 0, a silent wrong
answer (float64 gives e.g. -0.41; torch's CPU kernel gives NaN or 0 by how its vector lanes merge the moments). The
row's 1 / std is computed once, a select between it and NaN; float64's answer would need the row scaled by its
maximum first, another pass over it. So NaN from a variance of 3.4e38 / cols up (M2 = variance * cols), or with
several tiles from about 3.4e38 / cols^2 (the merge's ``delta^2 * n_a * n_b``). The first tile's M2 is its own: its
merge with the empty row (``(mean - 0)^2 * 0``) made a finite row whose mean is past 1.8e19 NaN (var too).

Note: on Metal (source only) the tiles and row statistics live in threadgroup memory (``Dialect.reducible``) and
``Dialect.reduce`` folds each row serially in one thread: TileLang 0.1.15 has no reduction for Metal.

Note: any/all reduce each element's truth (``x != 0``: NaN is true, -0.0 false) the same way: a per-element
"seen" flag (any: a true element; all: a false one), one reduction per row; an empty row is False for any, True
for all. Bool tensors cross the kernel boundary as int8 (``elementwise.storage_dtype``), X, Out and Pre alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tilelang.language as T
import torch

from tilefuse.config import device_facts
from tilefuse.lowering.expr import Acc, Env, Expr, emit, evaluate
from tilefuse.lowering.templates.common import (
    PDL_MAX_ELEMENTS,
    arg_loader,
    check_dtype,
    dialect,
    fit_pow2,
    int32_index,
    normalize_shapes,
    numel,
    param,
    unravel,
    view,
)
from tilefuse.lowering.templates.elementwise import storage_dtype

NORMALIZING = ("softmax", "log_softmax", "layer_norm", "rms_norm")
REDUCING = ("sum", "mean", "amax", "amin", "var", "any", "all")
KINDS = NORMALIZING + REDUCING
_ALIASES = {"max": "amax", "min": "amin"}


def output_shape(shape: Sequence[int], kind: str, keepdim: bool = False) -> tuple[int, ...]:
    """The output shape of ``row_reduction``: torch's, but ``(1,)`` where torch's is ``()`` (TileLang
    cannot allocate 0-d outputs)."""
    shape = tuple(int(d) for d in shape)
    if _ALIASES.get(kind, kind) in NORMALIZING:
        return shape
    return (*shape[:-1], 1) if keepdim else (shape[:-1] or (1,))


def row_reduction(
    shape: Sequence[int],
    kind: str,
    *,
    x_dtype: str = "float32",
    out_dtype: str | None = None,
    eps: float = 1e-5,
    correction: int = 1,
    keepdim: bool = False,
    has_weight: bool = False,
    has_bias: bool = False,
    weight_dtype: str | None = None,
    producer: Expr | None = None,
    consumer: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    write_pre: bool = False,
    pre_dtype: str | None = None,
    block_rows: int = 1,
    block_N: int = 1024,
    threads: int = 128,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` reducing ``X`` of ``shape`` over its last axis.

    ``kind``: softmax, log_softmax, layer_norm (weight, bias optional, ``eps``), rms_norm (weight
    optional, ``eps``), sum, mean, amax, amin, var (``correction``). Parameters: ``X``, weight and
    bias if present (shape (cols,)), ``extra_0..``, ``Out`` (``output_shape``), then ``Pre`` (the
    producer's result, X's shape) if ``write_pre``. ``Arg(i)`` is ``extra_i`` (``Load(i, index)`` extra ``i`` at
    ``index``, over ``Coord(d)``, the element's coordinates in ``shape``): in ``producer``
    broadcast against X's shape, in ``consumer`` against Out's shape.
    """
    kind = _ALIASES.get(kind, kind)
    if kind not in KINDS:
        raise NotImplementedError(f"row_reduction: kind {kind!r} is not one of {KINDS}")
    if has_bias and kind != "layer_norm" or has_weight and kind not in ("layer_norm", "rms_norm"):
        raise ValueError(f"row_reduction: {kind} takes no weight/bias")
    shape = tuple(int(s) for s in shape)
    cols, lead = shape[-1], shape[:-1]
    rows = numel(lead)
    out_dtype, pre_dtype, weight_dtype = out_dtype or x_dtype, pre_dtype or x_dtype, weight_dtype or x_dtype
    extra_shapes = normalize_shapes(extra_shapes)
    for dt in (x_dtype, out_dtype, pre_dtype, weight_dtype, *extra_dtypes):
        check_dtype(dt, target, "row_reduction")
    d = dialect(target)
    out_shape = output_shape(shape, kind, keepdim)
    block_N = fit_pow2(block_N, cols)  # no wider than the row
    n_tiles = -(-cols // block_N)
    normalizing, two_pass = kind in NORMALIZING, kind in NORMALIZING and n_tiles > 1
    welford, online_max = kind in ("layer_norm", "var"), kind in ("softmax", "log_softmax", "amax")
    softmax_like = kind in ("softmax", "log_softmax")
    extremum = kind in ("amax", "amin")
    truth = kind in ("any", "all")
    uses_s0 = online_max or welford or kind == "amin"
    fill = {"amax": -math.inf, "softmax": -math.inf, "log_softmax": -math.inf, "amin": math.inf, "all": 1.0}.get(
        kind, 0.0)
    producer = producer if producer is not None else Acc()
    consumer = consumer if consumer is not None else Acc()
    f32 = "float32"

    def in_row(row):
        return row < rows

    def loaded(X, extras, row, col):
        """Producer of X[row, col]; the reduction's identity outside the matrix."""
        coords = [*unravel(row, lead), col]
        x = X[row, col] if x_dtype != "bool" else X[row, col] != T.int8(0)  # bool is stored as int8
        val = emit(producer, Env(acc=x, arg=arg_loader(extras, extra_shapes, coords),
                                 **indexed(extras, T.min(row, rows - 1), T.min(col, cols - 1))))
        return T.if_then_else(T.And(in_row(row), col < cols), T.Cast(f32, val), T.float32(fill))

    def finished(v, extras, row, col):
        """Consumer of a result; operands at clamped coordinates (tail rows are never stored)."""
        r = T.min(row, rows - 1)
        if normalizing:
            coords = [*unravel(r, lead), col]
        else:
            coords = [*unravel(r, lead), 0] if keepdim else (unravel(r, lead) or [0])
        val = emit(consumer, Env(acc=v, arg=arg_loader(extras, extra_shapes, coords),
                                 **indexed(extras, r, T.min(col, cols - 1))))
        return T.Cast(storage_dtype(out_dtype), val)

    def indexed(extras, row, col) -> dict:
        """``Env``'s ``coord`` (the element's coordinates in ``shape``, clamped into it) and ``load`` (extra ``i`` at
        an index the expression computes: a group norm's per-channel weight, ``lowering/norm_builder.py``)."""
        at = [*unravel(row, lead), col]
        return {"coord": lambda dim: at[dim],
                "load": lambda i, index: extras[i][int32_index(index)]}

    def normalized(x, st, W, Bias, r, col):
        """One normalized element from the row statistics ``st`` (fp32)."""
        if kind == "softmax":
            return T.exp(x - st[0][r]) / st[1][r]
        if kind == "log_softmax":
            return x - st[0][r] - T.log(st[1][r])
        if kind == "layer_norm":  # st[1]: the row's 1 / std, or NaN (see rstd_or_nan)
            y = (x - st[0][r]) * st[1][r]
        else:
            y = x * T.rsqrt(st[1][r] / T.float32(cols) + T.float32(eps))
        if has_weight:
            y = y * T.Cast(f32, W[T.min(col, cols - 1)])
        if has_bias:
            y = y + T.Cast(f32, Bias[T.min(col, cols - 1)])
        return y

    def reduced(st, r):
        if extremum:  # a NaN anywhere in the row makes the result NaN, as in torch
            return T.Select(st[1][r] > T.float32(0), T.float32(math.nan), st[0][r])
        if truth:  # st[1]: a true element (any) or a false one (all) was seen
            return st[1][r] > T.float32(0) if kind == "any" else st[1][r] == T.float32(0)
        scale = {"sum": 1, "mean": cols, "var": max(cols - correction, 0)}[kind]
        if scale == 0:  # x / 0 as torch has it (var with correction >= cols: NaN, or inf); TVM refuses a literal / 0
            return st[1][r] * T.float32(math.inf)
        return st[1][r] if scale == 1 else st[1][r] / T.float32(scale)

    @T.macro
    def gather_stats(x_f, tmp_f, s0, s1, t0, t1, c0):
        """Merge one column tile (producer applied, identity-filled) into the row statistics."""
        if softmax_like:
            T.copy(s0, t0)  # the max before this tile, to rescale the running sum of exp
        if online_max:
            d.reduce("max", x_f, s0, clear=False)
        if kind == "amin":
            d.reduce("min", x_f, s0, clear=False)
        if extremum:  # remember NaNs per element; one reduction of the flags at the end of the row
            for r, c in d.tile_loop(block_rows, block_N):
                tmp_f[r, c] = T.max(tmp_f[r, c], T.Cast(f32, T.isnan(x_f[r, c])))
        if truth:  # the same for a true element (any) or a false one (all); NaN != 0 is true
            for r, c in d.tile_loop(block_rows, block_N):
                seen = x_f[r, c] != T.float32(0) if kind == "any" else x_f[r, c] == T.float32(0)
                tmp_f[r, c] = T.max(tmp_f[r, c], T.Cast(f32, seen))
        if softmax_like:
            for r, c in d.tile_loop(block_rows, block_N):
                tmp_f[r, c] = T.exp(x_f[r, c] - s0[r])
            d.reduce("sum", tmp_f, t1)
            for r in d.tile_loop(block_rows):
                s1[r] = s1[r] * T.exp(t0[r] - s0[r]) + t1[r]
        if kind in ("sum", "mean"):
            d.reduce("sum", x_f, s1, clear=False)
        if kind == "rms_norm":
            for r, c in d.tile_loop(block_rows, block_N):
                tmp_f[r, c] = x_f[r, c] * x_f[r, c]
            d.reduce("sum", tmp_f, s1, clear=False)
        if welford:
            # Chan et al.: merge this tile's (count n_b, mean t0, M2 t1) into the running (n_a, s0, s1).
            n_b = T.Cast(f32, T.min(block_N, cols - c0))
            n_a = T.Cast(f32, c0)
            if d.cpu:
                # The tile's mean about its first element (exact for a constant row, as torch's moments are: the
                # plain sum / n of seven 3.082s is not 3.082, and layer_norm of such a row gave 7.5e-5, not 0).
                # CPU only: on GPUs an element of another thread's fragment is not at hand.
                for r, c in d.tile_loop(block_rows, block_N):
                    tmp_f[r, c] = T.if_then_else(c0 + c < cols, x_f[r, c] - x_f[r, 0], T.float32(0))
                d.reduce("sum", tmp_f, t0)
                for r in d.tile_loop(block_rows):
                    t0[r] = x_f[r, 0] + t0[r] / n_b
            else:
                d.reduce("sum", x_f, t0)
                for r in d.tile_loop(block_rows):
                    t0[r] = t0[r] / n_b
            for r, c in d.tile_loop(block_rows, block_N):
                tmp_f[r, c] = T.if_then_else(c0 + c < cols, (x_f[r, c] - t0[r]) * (x_f[r, c] - t0[r]), T.float32(0))
            d.reduce("sum", tmp_f, t1)
            for r in d.tile_loop(block_rows):
                # The first tile's M2 is its own: (t0 - 0)^2 * 0 is NaN for a mean past 1.8e19, a finite row.
                s1[r] = T.if_then_else(c0 > 0, s1[r] + t1[r] + (t0[r] - s0[r]) * (t0[r] - s0[r]) * n_a * n_b
                                       / (n_a + n_b), t1[r])
                s0[r] = s0[r] + (t0[r] - s0[r]) * (n_b / (n_a + n_b))  # the first tile: exactly its mean

    @T.macro
    def rstd_or_nan(s1):
        """layer_norm: M2 -> 1 / sqrt(M2 / cols + eps), once per row; NaN for a row whose M2 (or mean) overflowed."""
        for r in d.tile_loop(block_rows):
            s1[r] = T.if_then_else(s1[r] < T.float32(math.inf), T.rsqrt(s1[r] / T.float32(cols) + T.float32(eps)),
                                   T.float32(math.nan))

    @T.prim_func
    def row_reduction_kernel():
        X_nd = param("X", shape, storage_dtype(x_dtype))
        W = param("weight", (cols,), weight_dtype) if has_weight else None
        Bias = param("bias", (cols,), weight_dtype) if has_bias else None
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out_nd = param("Out", out_shape, storage_dtype(out_dtype))
        Pre_nd = param("Pre", shape, storage_dtype(pre_dtype)) if write_pre else None
        with d.kernel(T.ceildiv(rows, block_rows), threads=threads) as bx:
            d.wait_inputs(rows * cols <= PDL_MAX_ELEMENTS)
            # 2-D views of the N-D tensors, in a dict (see common.view).
            io = {"X": view(X_nd, (rows, cols)), "Out": view(Out_nd, (rows, cols) if normalizing else (rows,))}
            if write_pre:
                io["Pre"] = view(Pre_nd, (rows, cols))
            # Only the buffers this kind uses: an unused fragment has no inferable layout on GPUs.
            x_f = d.reducible((block_rows, block_N), f32)
            tmp_f = (d.reducible((block_rows, block_N), f32)
                     if softmax_like or welford or extremum or truth or kind == "rms_norm" else None)
            s0 = d.reducible((block_rows,), f32) if uses_s0 else None  # running max / min / mean
            s1 = d.reducible((block_rows,), f32)  # sum / sum of exp / M2 / sum of squares / NaN seen
            t0 = d.reducible((block_rows,), f32) if softmax_like or welford else None
            t1 = d.reducible((block_rows,), f32) if softmax_like or welford else None
            if uses_s0:
                T.fill(s0, T.float32(fill) if online_max or kind == "amin" else T.float32(0))
            T.fill(s1, T.float32(0))
            if extremum or truth:
                T.fill(tmp_f, T.float32(0))
            row0 = bx * block_rows
            for t in T.serial(n_tiles):
                for r, c in d.tile_loop(block_rows, block_N):
                    x_f[r, c] = loaded(io["X"], extras, row0 + r, t * block_N + c)
                if write_pre:
                    for r, c in d.tile_loop(block_rows, block_N):
                        if T.And(in_row(row0 + r), t * block_N + c < cols):
                            io["Pre"][row0 + r, t * block_N + c] = T.Cast(storage_dtype(pre_dtype), x_f[r, c])
                gather_stats(x_f, tmp_f, s0, s1, t0, t1, t * block_N)
            if extremum or truth:
                d.reduce("max", tmp_f, s1)
            if kind == "layer_norm":
                rstd_or_nan(s1)
            if normalizing:
                for t in T.serial(n_tiles):
                    if two_pass:  # several tiles: recompute the producer (one tile: x_f still holds it)
                        for r, c in d.tile_loop(block_rows, block_N):
                            x_f[r, c] = loaded(io["X"], extras, row0 + r, t * block_N + c)
                    for r, c in d.tile_loop(block_rows, block_N):
                        if T.And(in_row(row0 + r), t * block_N + c < cols):
                            io["Out"][row0 + r, t * block_N + c] = finished(
                                normalized(x_f[r, c], (s0, s1), W, Bias, r, t * block_N + c), extras, row0 + r,
                                t * block_N + c)
            else:
                for r in d.tile_loop(block_rows):
                    if in_row(row0 + r):
                        io["Out"][row0 + r] = finished(reduced((s0, s1), r), extras, row0 + r, 0)

    return row_reduction_kernel


def reference(x: torch.Tensor, kind: str, *, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              extras: Sequence[torch.Tensor] = (), producer: Expr | None = None, consumer: Expr | None = None,
              eps: float = 1e-5, correction: int = 1, keepdim: bool = False, out_dtype: str | None = None,
              pre_dtype: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of ``row_reduction``: ``(out, pre)``, computed in fp32 (float64 for var)."""
    kind = _ALIASES.get(kind, kind)
    out_dtype = getattr(torch, out_dtype) if out_dtype else x.dtype
    pre_dtype = getattr(torch, pre_dtype) if pre_dtype else x.dtype
    pre = evaluate(producer, x, list(extras), x.shape).float() if producer is not None else x.float()
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    if kind == "softmax":
        y = torch.softmax(pre, -1)
    elif kind == "log_softmax":
        y = torch.log_softmax(pre, -1)
    elif kind == "layer_norm":
        y = torch.nn.functional.layer_norm(pre, pre.shape[-1:], w, b, eps)
    elif kind == "rms_norm":
        y = pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + eps)
        y = y * w if w is not None else y
    elif kind == "var":
        y = torch.var(pre.double(), -1, correction=correction, keepdim=keepdim).float()
    else:
        fn = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin, "any": torch.any,
              "all": torch.all}[kind]
        y = fn(pre, -1, keepdim=keepdim)
    if y.dim() == 0:
        y = y.reshape(1)
    if consumer is not None:
        y = evaluate(consumer, y, list(extras), y.shape).float()
    return y.to(out_dtype), pre.to(pre_dtype)


def default_config(rows: int, cols: int, target: dict | str) -> dict:
    """The untuned config for ``rows`` rows of ``cols``: on CUDA a short row (16-512 columns) shares its program with
    others, so that each of 128 threads loads 8 elements (one 16-byte vector at fp16) and, up to 256 columns, a row's
    threads reduce within a warp; with fewer rows than keep every SM busy twice over, fewer rows a program. One row a
    program (the first seed) left most of each program idle and reduced through shared memory: ConvNeXt-T's layer
    norms took 0.96 ms against Inductor's 0.07 on an H100 (bench/results/2026-12-07-h100-session54); with this pick
    its stage-1 norm ran 0.129 -> 0.029 ms (Inductor 0.028), the model's norms 0.30 ms (session55). Elsewhere, and for
    longer or shorter rows, the first seed."""
    first = get_configs(target)[0]
    width = 1 << max(0, (int(cols) - 1).bit_length())
    if not isinstance(target, dict) or target.get("kind") != "cuda" or not 16 <= width <= 512:
        return first
    block_rows = 1024 // width
    while block_rows > 1 and -(-int(rows) // block_rows) < 2 * device_facts(target).sms:
        block_rows //= 2
    return {"block_rows": block_rows, "block_N": width, "threads": 128}


def get_configs(target: dict | str) -> list[dict]:
    """Seed configs; keys are ``row_reduction``'s tunables."""
    if dialect(target).cpu:
        return [{"block_rows": 1, "block_N": 1024, "threads": 1}, {"block_rows": 4, "block_N": 256, "threads": 1}]
    seeds = [(1, 1024, 128), (1, 2048, 256), (1, 4096, 256), (1, 8192, 512), (4, 256, 128), (8, 128, 128)]
    if dialect(target).metal:  # two fp32 tiles in threadgroup memory (Dialect.reducible), within Apple's 32 KB
        seeds = [s for s in seeds if s[0] * s[1] <= 2048]
    return [{"block_rows": r, "block_N": n, "threads": t} for r, n, t in seeds]

"""Row reductions on Ascend (softmax, log_softmax, layer_norm, rms_norm, sum, mean, var): one row per block.

Note: the parameters are the ``row_reduction`` template's (``lowering.templates.reduction``): ``X`` of ``shape``
reduced over its last axis, weight and bias, the extras, ``Out``, then ``Pre`` (the producer's result) when
``write_pre``. Each block of the launch owns one row; a SIMT vector function walks it with ``threads`` threads,
each pass a ``T.Parallel`` loop over the columns merged by a reducer epoch (``T.alloc_reducer``, ``T.reducer_init``,
``T.reducer_update``, ``T.finalize_reducer`` into a fragment). The producer is recomputed in every pass (global reads, no staging in
the unified buffer): softmax takes the row max, then the sum of ``exp(x - max)``, then writes; layer_norm and var take
the mean, then the sum of squared deviations (two passes: accurate when the mean is large); rms_norm the sum of
squares. amax/amin and any/all are refused: torch's NaN rules need the per-element flag the CUDA template keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tilelang.ascend.language as T

from tilefuse.lowering.expr import Acc, Coord, Env, Expr, Load, emit, walk
from tilefuse.lowering.templates.ascend.common import read, refusal, store
from tilefuse.lowering.templates.common import arg_loader, normalize_shapes, numel, param, unravel, view
from tilefuse.lowering.templates.elementwise import storage_dtype
from tilefuse.lowering.templates.reduction import NORMALIZING, output_shape

KINDS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "sum", "mean", "var")


def why_not(kind: str, dtypes: Sequence[str | None], exprs: Sequence[Expr | None] = ()) -> str | None:
    """Why the Ascend row reduction cannot take this instance, or None."""
    if kind not in KINDS:
        return f"no Ascend row-reduction template for {kind} (it takes {', '.join(KINDS)})"
    if any(isinstance(n, (Load, Coord)) for e in exprs if e is not None for n in walk(e)):
        return "the Ascend row reduction reads no operand at a computed index (a group norm's per-channel weight)"
    return refusal(dtypes, "row-reduction")


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
    threads: int = 128,
    target: dict | str = "ascend",
):
    """A ``T.prim_func`` (Ascend dialect) reducing ``X`` of ``shape`` over its last axis; the arguments are
    ``lowering.templates.reduction.row_reduction``'s (``threads``: SIMT threads per row)."""
    shape = tuple(int(s) for s in shape)
    cols, lead = shape[-1], shape[:-1]
    rows = numel(lead)
    out_dtype, pre_dtype, weight_dtype = out_dtype or x_dtype, pre_dtype or x_dtype, weight_dtype or x_dtype
    why = why_not(kind, (x_dtype, out_dtype, pre_dtype, weight_dtype, *extra_dtypes))
    if why:
        raise NotImplementedError(why)
    extra_shapes = normalize_shapes(extra_shapes)
    out_shape = output_shape(shape, kind, keepdim)
    normalizing = kind in NORMALIZING
    producer = producer if producer is not None else Acc()
    consumer = consumer if consumer is not None else Acc()
    f32 = "float32"
    softmax_like, two_pass = kind in ("softmax", "log_softmax"), kind in ("layer_norm", "var")

    def loaded(X, extras, row, col):
        coords = [*unravel(row, lead), col]
        return T.Cast(f32, emit(producer, Env(acc=read(X[row, col], x_dtype),
                                              arg=arg_loader(extras, extra_shapes, coords))))

    def finished(v, extras, row, col=None):
        coords = [*unravel(row, lead), col] if normalizing else (
            [*unravel(row, lead), 0] if keepdim else (unravel(row, lead) or [0]))
        return store(emit(consumer, Env(acc=v, arg=arg_loader(extras, extra_shapes, coords))), out_dtype)

    def summand(x, s0):
        """What each element adds to the row's sum s1."""
        if softmax_like:
            return T.exp(x - s0[0])
        if two_pass:
            return (x - s0[0] / T.float32(cols)) * (x - s0[0] / T.float32(cols))
        return x * x if kind == "rms_norm" else x

    def normalized(x, s0, s1, W, Bias, c):
        if kind == "softmax":
            return T.exp(x - s0[0]) / s1[0]
        if kind == "log_softmax":
            return x - s0[0] - T.log(s1[0])
        if kind == "layer_norm":
            y = (x - s0[0] / T.float32(cols)) * T.rsqrt(s1[0] / T.float32(cols) + T.float32(eps))
        else:
            y = x * T.rsqrt(s1[0] / T.float32(cols) + T.float32(eps))
        if W is not None:
            y = y * T.Cast(f32, W[c])
        if Bias is not None:
            y = y + T.Cast(f32, Bias[c])
        return y

    def reduced(s1):
        scale = {"sum": 1, "mean": cols, "var": max(cols - correction, 0)}[kind]
        if scale == 0:  # x / 0 as torch has it; TVM refuses a literal / 0
            return s1[0] * T.float32(math.inf)
        return s1[0] if scale == 1 else s1[0] / T.float32(scale)

    @T.prim_func
    def row_reduction_kernel():
        X = view(param("X", shape, storage_dtype(x_dtype)), (rows, cols))
        W = param("W", (cols,), weight_dtype) if has_weight else None
        Bias = param("Bias", (cols,), weight_dtype) if has_bias else None
        extras = [param(f"extra_{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out = view(param("Out", out_shape, storage_dtype(out_dtype)), (rows, cols) if normalizing else (rows,))
        Pre = view(param("Pre", shape, storage_dtype(pre_dtype)), (rows, cols)) if write_pre else None
        with T.Kernel(rows) as r, T.SimtVF(threads=threads):
            # s0: the row max (softmax) or sum (layer_norm, var); s1: the sum the kind needs. Reducer epochs
            # (init, one update per column, finalize into a fragment): the SIMT threads share the columns.
            s0 = T.alloc_fragment((1,), f32)
            s1 = T.alloc_fragment((1,), f32)
            if softmax_like or two_pass:
                acc0 = T.alloc_reducer((1,), f32, op="max" if softmax_like else "sum")
                T.reducer_init(acc0)
                for c in T.Parallel(cols):
                    T.reducer_update(acc0[0], loaded(X, extras, r, c))
                T.finalize_reducer(acc0, s0)
            acc1 = T.alloc_reducer((1,), f32, op="sum")
            T.reducer_init(acc1)
            for c in T.Parallel(cols):
                T.reducer_update(acc1[0], summand(loaded(X, extras, r, c), s0))
            T.finalize_reducer(acc1, s1)
            if normalizing:
                for c in T.Parallel(cols):
                    Out[r, c] = finished(normalized(loaded(X, extras, r, c), s0, s1, W, Bias, c), extras, r, c)
            else:
                Out[r] = finished(reduced(s1), extras, r)
            if write_pre:
                for c in T.Parallel(cols):
                    Pre[r, c] = store(loaded(X, extras, r, c), pre_dtype)

    return row_reduction_kernel


def get_configs(target: dict | str = "ascend") -> list[dict]:
    """Tunables: SIMT threads per row."""
    return [{"threads": t} for t in (128, 256, 64)]

"""ONNX-only elementwise ops, reductions and scans: ONNX semantics torch has no single function for.

See ``tilefuse.ops.onnx_common`` for the conventions (``"?"`` dims, widened integer dtypes).
"""

from __future__ import annotations

import math

import torch

from tilefuse.ir import TensorType, torch_dtype
from tilefuse.ops.onnx_common import extreme, same_type, widen
from tilefuse.ops.registry import OpKind, get, register
from tilefuse.ops.tensor import cumsum

E, B, R, O = OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.REDUCTION, OpKind.OPAQUE


# ---- elementwise ---------------------------------------------------------------------------------

@register("bitshift", B)
def bitshift(x, shift, direction: str = "LEFT"):
    """ONNX BitShift: shifts outside [0, bit width) give 0 (or -1 for a right shift of a negative)."""
    bits = x.dtype.itemsize * 8
    x, shift = torch.broadcast_tensors(x, shift)
    s = shift.view(torch.int64) if shift.dtype == torch.uint64 else shift.to(torch.int64)
    valid = (s >= 0) & (s < bits)
    s = torch.where(valid, s, torch.zeros_like(s))
    xi = x.view(torch.int64) if x.dtype == torch.uint64 else x.to(torch.int64)
    if direction == "LEFT":
        out = torch.where(valid, xi << s, torch.zeros_like(xi))
    else:
        if x.dtype == torch.uint64:  # logical shift of the 64-bit pattern
            shifted = ((xi >> 1) & 0x7FFFFFFFFFFFFFFF) >> (s - 1).clamp(min=0)
            shifted = torch.where(s == 0, xi, shifted)
        else:  # signed: arithmetic; narrower unsigned were zero-extended
            shifted = xi >> s
        fill = torch.where(xi < 0, -1, 0) if x.dtype.is_signed else torch.zeros_like(xi)
        out = torch.where(valid, shifted, fill)
    return out.view(torch.uint64) if x.dtype == torch.uint64 else out.to(x.dtype)


@register("shrink", E)
def shrink(x, bias: float = 0.0, lambd: float = 0.5):
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    zero = torch.zeros_like(x)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)).to(x.dtype)


# Largest finite value and the rounding boundary above it (max + half an ulp) of each float8 type.
_FLOAT8 = {"float8_e4m3fn": (448.0, 464.0), "float8_e4m3fnuz": (240.0, 248.0),
           "float8_e5m2": (57344.0, 61440.0), "float8_e5m2fnuz": (57344.0, 61440.0)}


@register("cast_float8", E)
def cast_float8(x, dtype: str, saturate: bool = True):
    """ONNX Cast to a float8 type: saturate clamps overflow and inf to the largest value; without
    saturate, overflow becomes inf (e5m2) or nan."""
    top, boundary = _FLOAT8[dtype]
    has_inf = dtype == "float8_e5m2"
    xf = x.float()
    if saturate:
        xf = xf.clamp(-top, top)
    else:
        over = xf.abs() >= boundary
        xf = torch.where(over, torch.copysign(torch.full_like(xf, math.inf if has_inf else math.nan), xf), xf)
    return xf.to(torch_dtype(dtype))


@register("wide_binary", B)
def wide_binary(a, b, fn: str):
    """A canonical binary op on uint16/32/64 operands: computed in int64, narrowed back (wraps)."""
    out = get(fn).run([widen(a), widen(b)], {})[0]
    return out.to(a.dtype) if out.dtype == torch.int64 else out


@register("bitcast", E, traits=("axis",))
def bitcast(x, dtype: str):
    """Reinterpret the bits of ``x`` as ``dtype`` (same width)."""
    return x.view(torch_dtype(dtype))


# ---- reductions and scans ------------------------------------------------------------------------

@register("hardmax", R)
def hardmax(x, dim: int = -1):
    """1 at the first maximum along ``dim``, 0 elsewhere."""
    idx = torch.argmax(x, dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, idx, torch.ones_like(idx, dtype=x.dtype))


def _reduce_dynamic_infer(in_types, attrs):
    x, axes = in_types[0], in_types[1]
    if x.shape is None:
        return [TensorType(None, x.dtype)]
    k = None if axes is None or axes.shape is None else axes.shape[0]
    r = len(x.shape)
    if attrs.get("keepdim", True):
        rank = r
    elif k is None or isinstance(k, str):
        return [TensorType(None, x.dtype)]
    else:
        rank = r - k if k else (r if attrs.get("noop") else 0)
    return [TensorType(("?",) * rank, x.dtype)]


_PRE = {"l1": torch.abs, "l2": torch.square, "sum_square": torch.square}


_POST = {"l2": torch.sqrt, "log_sum": torch.log}


@register("reduce_dynamic", R, infer=_reduce_dynamic_infer, traits=("fold_dynamic",))
def reduce_dynamic(x, axes=None, kind: str = "sum", keepdim: bool = True, noop: bool = False):
    """ONNX ReduceX with runtime axes: ``kind`` in sum, mean, max, min, prod, l1, l2, log_sum,
    log_sum_exp, sum_square; empty axes reduce everything, or nothing when ``noop``."""
    dims = [] if axes is None else [int(a) % max(x.dim(), 1) for a in axes.tolist()]
    dtype = x.dtype
    y = widen(x)
    if kind == "mean" and not y.dtype.is_floating_point:
        y = y.double()
    y = _PRE.get(kind, lambda t: t)(y)
    if dims or not noop:
        dims = dims or list(range(x.dim()))
        if kind in ("max", "min") and any(x.shape[d] == 0 for d in dims):
            shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
            y = torch.full(shape, extreme(dtype, kind == "min"), dtype=dtype, device=x.device)
            return y if keepdim else y.reshape([s for i, s in enumerate(x.shape) if i not in dims])
        if kind == "prod":
            for d in sorted(dims, reverse=True):
                y = torch.prod(y, d, keepdim=True)
            y = y if keepdim else y.squeeze(tuple(dims))
        else:
            fn = {"mean": torch.mean, "max": torch.amax, "min": torch.amin, "log_sum_exp": torch.logsumexp}.get(
                kind, torch.sum)
            y = fn(y, tuple(dims), keepdim)
    return _POST.get(kind, lambda t: t)(y).to(dtype)


@register("cumprod", O)
def cumprod(x, dim: int, exclusive: int = 0, reverse: int = 0):
    if reverse:
        x = x.flip(dim)
    out = torch.cumprod(widen(x), dim).to(x.dtype)
    if exclusive:
        ones = torch.ones_like(x.narrow(dim, 0, 1))
        out = torch.cat([ones, out.narrow(dim, 0, x.shape[dim] - 1)], dim)
    return out.flip(dim) if reverse else out


@register("cum_dynamic", O, infer=same_type)
def cum_dynamic(x, axis, kind: str = "sum", exclusive: int = 0, reverse: int = 0):
    """ONNX CumSum / CumProd with a runtime axis."""
    dim = int(axis.reshape(-1)[0].item()) % x.dim()
    if kind == "prod":
        return cumprod(x, dim, exclusive, reverse)
    return cumsum(widen(x), dim, exclusive, reverse).to(x.dtype)


@register("topk_stable", O, num_outputs=2)
def topk_stable(x, k: int, dim: int = -1, largest: bool = True):
    """ONNX TopK: sorted values and int64 indices; equal values keep the lower index first."""
    v, i = torch.sort(widen(x), dim=dim, descending=largest, stable=True)
    return v.narrow(dim, 0, k).to(x.dtype), i.narrow(dim, 0, k)


def _topk_dynamic_infer(in_types, attrs):
    x = in_types[0]
    shape = list(x.shape)
    shape[attrs["dim"]] = "?"
    return [TensorType(tuple(shape), x.dtype), TensorType(tuple(shape), "int64")]


@register("topk_dynamic", O, infer=_topk_dynamic_infer, num_outputs=2, traits=("fold_dynamic",))
def topk_dynamic(x, k, dim: int = -1, largest: bool = True):
    """ONNX TopK with a runtime k."""
    return topk_stable(x, int(k.reshape(-1)[0].item()), dim, largest)


# ---- linear algebra ------------------------------------------------------------------------------

@register("einsum", OpKind.GEMM)
def einsum(*xs, equation: str):
    return torch.einsum(equation, *xs)


@register("det", O)
def det(x):
    return torch.linalg.det(x)

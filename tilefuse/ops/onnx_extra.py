"""Ops only the ONNX frontend needs: ONNX semantics torch has no single function for, and the
runtime-tensor forms of ops whose shape/axes/sizes inputs are not constants.

Note: an op whose output shape depends on input *values* (``nonzero``, ``slice_dynamic``, ...) declares
``infer`` returning dims named ``"?"``; the ONNX importer renames each to a fresh symbol. Integer
dtypes torch cannot compute in (uint16/32/64) are widened to int64 inside a reference and narrowed
back, which wraps exactly like C.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType, torch_dtype
from tilefuse.ops.registry import OpKind, register

E, B, I, R, O = OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE, OpKind.REDUCTION, OpKind.OPAQUE
_WIDE = (torch.uint16, torch.uint32, torch.uint64)


def _dynamic(rank_of=None, rank: int | None = None, dtype_of: int = 0, dtype: str | None = None,
             len_of: int | None = None):
    """``infer`` for a data-dependent op: unknown dims; the rank is ``rank``, the rank of input
    ``rank_of``, the length of the 1-D input ``len_of``, or the larger of the last two."""

    def infer(in_types, attrs):
        ranks = []
        if rank is not None:
            ranks.append(rank)
        if rank_of is not None:
            ranks.append(in_types[rank_of].rank)
        if len_of is not None:
            s = in_types[len_of].shape
            ranks.append(s[0] if s and isinstance(s[0], int) else None)
        r = None if None in ranks else max(ranks)
        d = dtype or attrs.get("dtype") or in_types[dtype_of].dtype
        return [TensorType(None if r is None else ("?",) * r, d)]

    return infer


def _extreme(dtype: torch.dtype, high: bool):
    """The largest (``high``) or smallest value of ``dtype``: the identity of min / max."""
    if dtype == torch.bool:
        return high
    if dtype.is_floating_point:
        return math.inf if high else -math.inf
    return torch.iinfo(dtype).max if high else torch.iinfo(dtype).min


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) if x.dtype in _WIDE else x


# ---- elementwise --------------------------------------------------------------------------------

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
    from tilefuse.ops import get

    out = get(fn).run([_wide(a), _wide(b)], {})[0]
    return out.to(a.dtype) if out.dtype == torch.int64 else out


@register("hardmax", R)
def hardmax(x, dim: int = -1):
    """1 at the first maximum along ``dim``, 0 elsewhere."""
    idx = torch.argmax(x, dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, idx, torch.ones_like(idx, dtype=x.dtype))


# ---- shapes known only at run time ---------------------------------------------------------------

@register("numel", O, infer=lambda t, a: [TensorType((), "int64")])
def numel(x):
    """Number of elements as a 0-d int64 tensor (ONNX Size)."""
    return torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


@register("flatten2d", I, infer=_dynamic(rank=2))
def flatten2d(x, axis: int = 1):
    """ONNX Flatten: dims before ``axis`` into the first dim, the rest into the second."""
    lead = math.prod(x.shape[:axis])
    return x.reshape(lead, math.prod(x.shape[axis:]))


@register("slice_dynamic", I, infer=_dynamic(rank_of=0))
def slice_dynamic(x, starts, ends, axes=None, steps=None):
    """ONNX Slice with runtime starts/ends/axes/steps (int tensors)."""
    from tilefuse.ops import get

    starts, ends = starts.tolist(), ends.tolist()
    axes = list(range(len(starts))) if axes is None else axes.tolist()
    steps = [1] * len(starts) if steps is None else steps.tolist()
    for s, e, a, st in zip(starts, ends, axes, steps):
        x = get("onnx_slice").ref(x, a % x.dim(), s, e, st)
    return x


@register("onnx_slice", I)
def onnx_slice(x, dim: int, start: int, end: int, step: int = 1):
    """One axis of ONNX Slice: negative indices wrap, bounds clamp, negative steps walk backwards."""
    n = x.shape[dim]
    if step > 0:
        return x[(slice(None),) * dim + (slice(start, end, step),)]
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)  # ONNX clamps, unlike numpy
    count = max(0, (start - end + (-step) - 1) // (-step))
    idx = torch.arange(count, device=x.device) * step + start
    return x.index_select(dim, idx)


@register("expand_dynamic", I, infer=_dynamic(rank_of=0, len_of=1))
def expand_dynamic(x, shape):
    """ONNX Expand with a runtime shape: bidirectional broadcast of ``x`` and ``shape``."""
    target = torch.broadcast_shapes(tuple(x.shape), tuple(int(d) for d in shape.tolist()))
    return x.expand(target)


@register("tile_dynamic", I, infer=_dynamic(rank_of=0))
def tile_dynamic(x, repeats):
    return x.repeat([int(r) for r in repeats.tolist()])


@register("constant_of_shape", I, infer=_dynamic(len_of=0))
def constant_of_shape(shape, value: float = 0.0, dtype: str = "float32"):
    """A tensor of runtime ``shape`` filled with ``value``."""
    return torch.full([int(d) for d in shape.tolist()], value, dtype=torch_dtype(dtype), device=shape.device)


@register("range_dynamic", I, infer=_dynamic(rank=1))
def range_dynamic(start, limit, delta):
    """ONNX Range: ``start + i * delta`` for i < ceil((limit - start) / delta), in the inputs' dtype."""
    s, lim, d = start.item(), limit.item(), delta.item()
    n = max(math.ceil((lim - s) / d), 0)
    if start.dtype.is_floating_point:
        return (start + torch.arange(n, dtype=torch.float64, device=start.device).to(start.dtype) * delta).to(
            start.dtype)
    return torch.arange(n, dtype=torch.int64, device=start.device).mul(int(d)).add(int(s)).to(start.dtype)


@register("nonzero", O, infer=lambda t, a: [TensorType((t[0].rank if t[0].rank is not None else "?", "?"), "int64")])
def nonzero(x):
    """Indices of the non-zero elements, one column each (ONNX NonZero): int64 (rank, n)."""
    return torch.nonzero(x).t().contiguous()


@register("compress", O, infer=lambda t, a: _dynamic(rank_of=0 if a.get("axis") is not None else None,
                                                     rank=None if a.get("axis") is not None else 1)(t, a))
def compress(x, condition, axis: int | None = None):
    """The slices of ``x`` along ``axis`` (or of flattened ``x``) where ``condition`` is true."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    idx = torch.nonzero(condition.bool().reshape(-1)).reshape(-1)
    return x.index_select(axis, idx)


# ---- indexing -----------------------------------------------------------------------------------

def _wrap(index: torch.Tensor, size) -> torch.Tensor:
    index = index.long()
    return torch.where(index < 0, index + size, index)


@register("gather_elements", I)
def gather_elements(x, index, dim: int):
    """torch.gather with ONNX's negative indices."""
    return torch.gather(x, dim, _wrap(index, x.shape[dim]))


@register("gather_nd", I)
def gather_nd(x, index, batch_dims: int = 0):
    """ONNX GatherND: the last dim of ``index`` addresses the leading dims after the batch dims."""
    b, k = batch_dims, index.shape[-1]
    bshape, mid, rest = x.shape[:b], index.shape[b:-1], x.shape[b + k:]
    nb = math.prod(bshape)
    xf = x.reshape(nb, *x.shape[b:])
    idx = index.long().reshape(nb, -1, k)
    idx = _wrap(idx, idx.new_tensor(list(x.shape[b:b + k])))
    bi = torch.arange(nb, device=x.device)[:, None].expand(nb, idx.shape[1])
    out = xf[(bi, *idx.unbind(-1))]
    return out.reshape(*bshape, *mid, *rest)


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@register("scatter_elements", I)
def scatter_elements(x, index, updates, dim: int, reduction: str = "none"):
    """ONNX ScatterElements (and the old Scatter): torch.scatter / scatter_reduce, negatives wrap."""
    index = _wrap(index, x.shape[dim])
    if reduction == "none":
        return x.scatter(dim, index, updates)
    return x.scatter_reduce(dim, index, updates, _SCATTER_REDUCE[reduction], include_self=True)


@register("scatter_nd", I)
def scatter_nd(x, index, updates, reduction: str = "none"):
    """ONNX ScatterND: ``out[index[i]] (op)= updates[i]``, applied in order for a reduction."""
    k = index.shape[-1]
    idx = _wrap(index.reshape(-1, k), index.new_tensor(list(x.shape[:k])).long())
    upd = updates.reshape(idx.shape[0], *x.shape[k:])
    out = x.clone()
    if reduction in ("none", "add"):
        return out.index_put_(tuple(idx.unbind(-1)), upd, accumulate=reduction == "add")
    for row, u in zip(idx, upd):
        at = tuple(row.tolist())
        fn = {"mul": torch.mul, "max": torch.maximum, "min": torch.minimum}[reduction]
        out[at] = fn(out[at], u)
    return out


@register("one_hot", I)
def one_hot(indices, values, depth: int, axis: int = -1):
    """ONNX OneHot: ``values[1]`` at each (wrapped) index along a new ``axis``, ``values[0]`` elsewhere."""
    idx = _wrap(indices, depth)
    valid = (idx >= 0) & (idx < depth)
    hot = F.one_hot(torch.where(valid, idx, torch.zeros_like(idx)), depth).bool() & valid.unsqueeze(-1)
    out = torch.where(hot, values[1], values[0])
    return out.movedim(-1, axis % out.dim())


@register("topk_stable", O, num_outputs=2)
def topk_stable(x, k: int, dim: int = -1, largest: bool = True):
    """ONNX TopK: sorted values and int64 indices; equal values keep the lower index first."""
    v, i = torch.sort(_wide(x), dim=dim, descending=largest, stable=True)
    return v.narrow(dim, 0, k).to(x.dtype), i.narrow(dim, 0, k)


@register("cumprod", O)
def cumprod(x, dim: int, exclusive: int = 0, reverse: int = 0):
    if reverse:
        x = x.flip(dim)
    out = torch.cumprod(_wide(x), dim).to(x.dtype)
    if exclusive:
        ones = torch.ones_like(x.narrow(dim, 0, 1))
        out = torch.cat([ones, out.narrow(dim, 0, x.shape[dim] - 1)], dim)
    return out.flip(dim) if reverse else out


@register("reverse_sequence", I)
def reverse_sequence(x, lengths, batch_axis: int = 1, time_axis: int = 0):
    """Reverse the first ``lengths[b]`` steps along ``time_axis`` of each batch entry ``b``."""
    out = x.clone()
    for bi, n in enumerate(lengths.tolist()):
        src = x.select(batch_axis, bi)
        t = time_axis - (time_axis > batch_axis)
        out.select(batch_axis, bi).narrow(t, 0, n).copy_(src.narrow(t, 0, n).flip(t))
    return out


@register("einsum", OpKind.GEMM)
def einsum(*xs, equation: str):
    return torch.einsum(equation, *xs)


@register("det", O)
def det(x):
    return torch.linalg.det(x)


# ---- neural-net ops with ONNX-only semantics --------------------------------------------------

@register("lrn", R)
def lrn(x, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0):
    """ONNX LRN: the square sum runs over channels [c - (size-1)//2, c + ceil((size-1)/2)]."""
    sq = (x * x).unsqueeze(1)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = F.pad(sq, (0, 0) * (x.dim() - 2) + (lo, hi))
    s = sq.unfold(2, size, 1).sum(-1).squeeze(1)
    return x / (bias + alpha / size * s) ** beta


def _windows(x, kernel, strides, dilations):
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        x = x.unfold(2 + i, (k - 1) * d + 1, s)[..., ::d]
    return x


def _pool_geometry(shape, kernel, strides, pads, dilations, ceil_mode):
    nd = len(kernel)
    out, extra = [], []
    for i in range(nd):
        n, k, s, d = shape[2 + i], kernel[i], strides[i], dilations[i]
        span = (k - 1) * d + 1
        size = (n + pads[i] + pads[nd + i] - span) / s + 1
        o = math.ceil(size) if ceil_mode else math.floor(size)
        if ceil_mode and (o - 1) * s >= n + pads[i]:
            o -= 1
        out.append(o)
        extra.append(max(0, (o - 1) * s + span - n - pads[i] - pads[nd + i]))
    return out, extra


@register("onnx_pool", R)
def onnx_pool(x, mode: str, kernel: tuple, strides: tuple, pads: tuple, dilations: tuple,
              ceil_mode: int = 0, count_include_pad: int = 0, p: float = 2.0):
    """ONNX Max/Average/Lp pooling with any pads ([begins..., ends...]), dilations and ceil mode."""
    nd = len(kernel)
    out, extra = _pool_geometry(x.shape, kernel, strides, pads, dilations, ceil_mode)
    if min(out) <= 0:  # the window is larger than the padded input
        return x.new_empty(tuple(x.shape[:2]) + tuple(max(o, 0) for o in out))
    torch_pads = []
    for i in reversed(range(nd)):
        torch_pads += [pads[i], pads[nd + i] + extra[i]]
    if mode == "max":
        low = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        return _windows(F.pad(x, torch_pads, value=low), kernel, strides, dilations).amax(
            tuple(range(-nd, 0)))
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if mode == "lp":
        w = _windows(F.pad(xf.abs() ** p, torch_pads), kernel, strides, dilations)
        return (w.sum(tuple(range(-nd, 0))) ** (1.0 / p)).to(x.dtype)
    total = _windows(F.pad(xf, torch_pads), kernel, strides, dilations).sum(tuple(range(-nd, 0)))
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=xf.dtype, device=x.device)
    if count_include_pad:  # padding counts; the extra cells of ceil mode do not
        mask_pads = []
        for i in reversed(range(nd)):
            mask_pads += [0, extra[i]]
        ones = F.pad(F.pad(ones, [q for i in reversed(range(nd)) for q in (pads[i], pads[nd + i])], value=1.0),
                     mask_pads)
    else:
        ones = F.pad(ones, torch_pads)
    count = _windows(ones, kernel, strides, dilations).sum(tuple(range(-nd, 0)))
    return (total / count).to(x.dtype)


@register("max_pool_indices", R, num_outputs=2)
def max_pool_indices(x, kernel: tuple, strides: tuple, pads: tuple, dilations: tuple, ceil_mode: int = 0,
                     storage_order: int = 0):
    """ONNX MaxPool with its second output: flat indices into ``x`` (row- or column-major per plane)."""
    nd = len(kernel)
    _, extra = _pool_geometry(x.shape, kernel, strides, pads, dilations, ceil_mode)
    torch_pads = []
    for i in reversed(range(nd)):
        torch_pads += [pads[i], pads[nd + i] + extra[i]]
    low = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    w = _windows(F.pad(x, torch_pads, value=low), kernel, strides, dilations)
    spatial = tuple(x.shape[2:])
    plane = torch.arange(math.prod(spatial), device=x.device)
    if storage_order:
        plane = plane.reshape(tuple(reversed(spatial))).permute(tuple(reversed(range(nd)))).reshape(spatial)
    n, c = x.shape[:2]
    base = (torch.arange(n * c, device=x.device) * math.prod(spatial)).reshape(n, c, *([1] * nd))
    idx = plane.reshape(1, 1, *spatial) + base
    wi = _windows(F.pad(idx, torch_pads, value=-1), kernel, strides, dilations)
    flat = w.flatten(-nd)
    arg = flat.argmax(-1, keepdim=True)
    return flat.gather(-1, arg).squeeze(-1), wi.flatten(-nd).gather(-1, arg).squeeze(-1)


@register("pad_nd", I)
def pad_nd(x, pads: tuple, mode: str = "reflect"):
    """Reflect / replicate / circular padding of any dims (torch F.pad order, last dim first);
    negative pads crop."""
    for k in range(len(pads) // 2):
        dim, lo, hi = x.dim() - 1 - k, pads[2 * k], pads[2 * k + 1]
        if lo == 0 and hi == 0:
            continue
        n = x.shape[dim]
        pos = torch.arange(-lo, n + hi, device=x.device)
        if mode == "replicate":
            pos = pos.clamp(0, n - 1)
        elif mode == "circular":
            pos = pos.remainder(n)
        elif n == 1:
            pos = torch.zeros_like(pos)
        else:
            period = 2 * (n - 1)
            pos = pos.remainder(period)
            pos = torch.where(pos >= n, period - pos, pos)
        x = x.index_select(dim, pos)
    return x


# ---- ONNX ops whose axes / sizes / pads arrive as runtime tensors ------------------------------

def _same_type(in_types, attrs):
    return [in_types[0]]


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


@register("reduce_dynamic", R, infer=_reduce_dynamic_infer)
def reduce_dynamic(x, axes=None, kind: str = "sum", keepdim: bool = True, noop: bool = False):
    """ONNX ReduceX with runtime axes: ``kind`` in sum, mean, max, min, prod, l1, l2, log_sum,
    log_sum_exp, sum_square; empty axes reduce everything, or nothing when ``noop``."""
    dims = [] if axes is None else [int(a) % max(x.dim(), 1) for a in axes.tolist()]
    dtype = x.dtype
    y = _wide(x)
    if kind == "mean" and not y.dtype.is_floating_point:
        y = y.double()
    y = _PRE.get(kind, lambda t: t)(y)
    if dims or not noop:
        dims = dims or list(range(x.dim()))
        if kind in ("max", "min") and any(x.shape[d] == 0 for d in dims):
            shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
            y = torch.full(shape, _extreme(dtype, kind == "min"), dtype=dtype, device=x.device)
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


@register("pad_dynamic", I, infer=lambda t, a: [TensorType(None if t[0].shape is None else ("?",) * len(t[0].shape),
                                                           t[0].dtype)])
def pad_dynamic(x, pads, value=None, axes=None, mode: str = "constant"):
    """ONNX Pad with runtime pads ([begins..., ends...] over ``axes``) and constant value."""
    pads = [int(p) for p in pads.tolist()]
    axes = list(range(x.dim())) if axes is None else [int(a) % x.dim() for a in axes.tolist()]
    half = len(axes)
    per = {a: (pads[i], pads[half + i]) for i, a in enumerate(axes)}
    torch_pads = [p for d in reversed(range(x.dim())) for p in per.get(d, (0, 0))]
    if mode == "constant":
        v = 0 if value is None or value.numel() == 0 else value.reshape(-1)[0].item()
        return F.pad(x, torch_pads, "constant", v)
    return pad_nd(x, tuple(torch_pads), mode)


@register("trilu_dynamic", I, infer=_same_type)
def trilu_dynamic(x, k=None, upper: bool = True):
    """ONNX Trilu with a runtime diagonal offset ``k``."""
    d = 0 if k is None else int(k.reshape(-1)[0].item())
    return torch.triu(x, d) if upper else torch.tril(x, d)


@register("cum_dynamic", O, infer=_same_type)
def cum_dynamic(x, axis, kind: str = "sum", exclusive: int = 0, reverse: int = 0):
    """ONNX CumSum / CumProd with a runtime axis."""
    from tilefuse.ops import get

    dim = int(axis.reshape(-1)[0].item()) % x.dim()
    if kind == "prod":
        return cumprod(x, dim, exclusive, reverse)
    return get("cumsum").ref(_wide(x), dim, exclusive, reverse).to(x.dtype)


def _split_dynamic_infer(in_types, attrs):
    x = in_types[0]
    shape = list(x.shape)
    shape[attrs["dim"]] = "?"
    return [TensorType(tuple(shape), x.dtype)] * attrs["num_outputs"]


@register("split_dynamic", I, infer=_split_dynamic_infer, num_outputs=-1)
def split_dynamic(x, sizes, dim: int, num_outputs: int):
    """ONNX Split with runtime sizes."""
    return tuple(torch.split(x, [int(s) for s in sizes.tolist()], dim))


def _topk_dynamic_infer(in_types, attrs):
    x = in_types[0]
    shape = list(x.shape)
    shape[attrs["dim"]] = "?"
    return [TensorType(tuple(shape), x.dtype), TensorType(tuple(shape), "int64")]


@register("topk_dynamic", O, infer=_topk_dynamic_infer, num_outputs=2)
def topk_dynamic(x, k, dim: int = -1, largest: bool = True):
    """ONNX TopK with a runtime k."""
    return topk_stable(x, int(k.reshape(-1)[0].item()), dim, largest)


def _axes_rank_infer(sign: int):
    def infer(in_types, attrs):
        x, axes = in_types
        if x.shape is None or axes.shape is None or not isinstance(axes.shape[0] if axes.shape else 1, int):
            return [TensorType(None, x.dtype)]
        k = axes.shape[0] if axes.shape else 1
        return [TensorType(("?",) * (len(x.shape) + sign * k), x.dtype)]
    return infer


@register("unsqueeze_dynamic", I, infer=_axes_rank_infer(+1))
def unsqueeze_dynamic(x, axes):
    from tilefuse.ops import get

    return get("unsqueeze").ref(x, tuple(int(a) for a in axes.reshape(-1).tolist()))


@register("squeeze_dynamic", I, infer=_axes_rank_infer(-1))
def squeeze_dynamic(x, axes):
    from tilefuse.ops import get

    return get("squeeze").ref(x, tuple(int(a) for a in axes.reshape(-1).tolist()))


@register("one_hot_dynamic", I, infer=lambda t, a: [TensorType(None if t[0].shape is None else ("?",) * (
    len(t[0].shape) + 1), t[2].dtype)])
def one_hot_dynamic(indices, depth, values, axis: int = -1):
    """ONNX OneHot with a runtime depth."""
    return one_hot(indices, values, int(depth.reshape(-1)[0].item()), axis)

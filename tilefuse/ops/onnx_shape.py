"""ONNX-only data movement whose shapes, sizes, axes or pads arrive as runtime tensors, and ONNX's own
slicing and padding rules.

See ``tilefuse.ops.onnx_common`` for the conventions (``"?"`` dims).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType, torch_dtype
from tilefuse.ops.onnx_common import dynamic_infer, same_type
from tilefuse.ops.registry import OpKind, register
from tilefuse.ops.tensor import squeeze, unsqueeze

I, O = OpKind.INJECTIVE, OpKind.OPAQUE


# ---- shapes and sizes known only at run time -----------------------------------------------------

@register("numel", O, infer=lambda t, a: [TensorType((), "int64")], traits=("fold_dynamic",))
def numel(x):
    """Number of elements as a 0-d int64 tensor (ONNX Size)."""
    return torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


@register("flatten2d", I, infer=dynamic_infer(rank=2))
def flatten2d(x, axis: int = 1):
    """ONNX Flatten: dims before ``axis`` into the first dim, the rest into the second."""
    lead = math.prod(x.shape[:axis])
    return x.reshape(lead, math.prod(x.shape[axis:]))


@register("slice_dynamic", I, infer=dynamic_infer(rank_of=0), traits=("fold_dynamic",))
def slice_dynamic(x, starts, ends, axes=None, steps=None):
    """ONNX Slice with runtime starts/ends/axes/steps (int tensors)."""
    starts, ends = starts.tolist(), ends.tolist()
    axes = list(range(len(starts))) if axes is None else axes.tolist()
    steps = [1] * len(starts) if steps is None else steps.tolist()
    for s, e, a, st in zip(starts, ends, axes, steps):
        x = onnx_slice(x, a % x.dim(), s, e, st)
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


@register("expand_dynamic", I, infer=dynamic_infer(rank_of=0, len_of=1))
def expand_dynamic(x, shape):
    """ONNX Expand with a runtime shape: bidirectional broadcast of ``x`` and ``shape``."""
    target = torch.broadcast_shapes(tuple(x.shape), tuple(int(d) for d in shape.tolist()))
    return x.expand(target)


@register("tile_dynamic", I, infer=dynamic_infer(rank_of=0))
def tile_dynamic(x, repeats):
    return x.repeat([int(r) for r in repeats.tolist()])


@register("constant_of_shape", I, infer=dynamic_infer(len_of=0))
def constant_of_shape(shape, value: float = 0.0, dtype: str = "float32"):
    """A tensor of runtime ``shape`` filled with ``value``."""
    return torch.full([int(d) for d in shape.tolist()], value, dtype=torch_dtype(dtype), device=shape.device)


@register("range_dynamic", I, infer=dynamic_infer(rank=1), traits=("fold_dynamic",))
def range_dynamic(start, limit, delta):
    """ONNX Range: ``start + i * delta`` for i < ceil((limit - start) / delta), in the inputs' dtype."""
    s, lim, d = start.item(), limit.item(), delta.item()
    n = max(math.ceil((lim - s) / d), 0)
    if start.dtype.is_floating_point:
        return (start + torch.arange(n, dtype=torch.float64, device=start.device).to(start.dtype) * delta).to(
            start.dtype)
    return torch.arange(n, dtype=torch.int64, device=start.device).mul(int(d)).add(int(s)).to(start.dtype)


@register("nonzero", O, infer=lambda t, a: [TensorType((t[0].rank if t[0].rank is not None else "?", "?"), "int64")],
          traits=("fold_dynamic",))
def nonzero(x):
    """Indices of the non-zero elements, one column each (ONNX NonZero): int64 (rank, n)."""
    return torch.nonzero(x).t().contiguous()


@register("compress", O, infer=lambda t, a: dynamic_infer(rank_of=0 if a.get("axis") is not None else None,
                                                     rank=None if a.get("axis") is not None else 1)(t, a),
          traits=("fold_dynamic",))
def compress(x, condition, axis: int | None = None):
    """The slices of ``x`` along ``axis`` (or of flattened ``x``) where ``condition`` is true."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    idx = torch.nonzero(condition.bool().reshape(-1)).reshape(-1)
    return x.index_select(axis, idx)


# ---- axes, pads and offsets known only at run time -----------------------------------------------

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


@register("trilu_dynamic", I, infer=same_type)
def trilu_dynamic(x, k=None, upper: bool = True):
    """ONNX Trilu with a runtime diagonal offset ``k``."""
    d = 0 if k is None else int(k.reshape(-1)[0].item())
    return torch.triu(x, d) if upper else torch.tril(x, d)


def _split_dynamic_infer(in_types, attrs):
    x = in_types[0]
    shape = list(x.shape)
    shape[attrs["dim"]] = "?"
    return [TensorType(tuple(shape), x.dtype)] * attrs["num_outputs"]


@register("split_dynamic", I, infer=_split_dynamic_infer, num_outputs=-1, traits=("fold_dynamic",))
def split_dynamic(x, sizes, dim: int, num_outputs: int):
    """ONNX Split with runtime sizes."""
    return tuple(torch.split(x, [int(s) for s in sizes.tolist()], dim))


def _axes_rank_infer(sign: int):
    def infer(in_types, attrs):
        x, axes = in_types
        if x.shape is None or axes.shape is None or not isinstance(axes.shape[0] if axes.shape else 1, int):
            return [TensorType(None, x.dtype)]
        k = axes.shape[0] if axes.shape else 1
        return [TensorType(("?",) * (len(x.shape) + sign * k), x.dtype)]
    return infer


@register("unsqueeze_dynamic", I, infer=_axes_rank_infer(+1), traits=("fold_dynamic",))
def unsqueeze_dynamic(x, axes):
    return unsqueeze(x, tuple(int(a) for a in axes.reshape(-1).tolist()))


@register("squeeze_dynamic", I, infer=_axes_rank_infer(-1), traits=("fold_dynamic",))
def squeeze_dynamic(x, axes):
    return squeeze(x, tuple(int(a) for a in axes.reshape(-1).tolist()))

"""Injective and data-movement ops: views, slicing, joining, indexing, padding, generators.

Note: shapes and axes are attributes (static), as in ATen. A reshape whose target shape is only
known at run time (ONNX ``Reshape`` fed by a ``Shape`` computation) uses ``reshape_dynamic``, whose
second input is the int64 shape tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType, torch_dtype
from tilefuse.ops.registry import OpKind, register

I, O = OpKind.INJECTIVE, OpKind.OPAQUE


@register("reshape", I, traits=("view", "may_alias"))
def reshape(x, shape: tuple):
    """Reshape to ``shape`` (one dim may be -1)."""
    return x.reshape(shape)


@register("reshape_dynamic", I, traits=("fold_dynamic",))
def reshape_dynamic(x, shape, allowzero: int = 0):
    """Reshape to the shape held in an int64 tensor (ONNX semantics: 0 copies the input dim)."""
    dims = [int(d) for d in shape.tolist()]
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@register("permute", I, traits=("permute", "may_alias"))
def permute(x, perm: tuple):
    return x.permute(perm)


@register("transpose", I, traits=("permute", "may_alias"))
def transpose(x, dim0: int, dim1: int):
    return x.transpose(dim0, dim1)


@register("expand", I, traits=("view", "may_alias"))
def expand(x, shape: tuple):
    """Broadcast to ``shape`` (-1 keeps a dim)."""
    return x.expand(shape)


@register("slice", I, traits=("slicing", "may_alias"))
def slice_(x, dim: int, start: int | None = None, end: int | None = None, step: int = 1):
    idx = [slice(None)] * x.dim()
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


@register("flip", I)
def flip(x, dims: tuple):
    return torch.flip(x, dims)


@register("roll", I)
def roll(x, shifts: tuple, dims: tuple):
    """``torch.roll`` along ``dims``, or of the flattened tensor where ``dims`` is empty: Swin's shifted windows."""
    return torch.roll(x, shifts, dims)


@register("concat", I)
def concat(*xs, dim: int):
    return torch.cat(xs, dim)


@register("stack", I)
def stack(*xs, dim: int):
    return torch.stack(xs, dim)


def _split_infer(in_types, attrs):
    (t,) = in_types
    dim, sizes = attrs["dim"], attrs["sizes"]
    if t is None or t.shape is None:
        return [TensorType(None, t.dtype if t else "float32") for _ in sizes]
    shape = list(t.shape)
    out = []
    for s in sizes:
        shape[dim] = s
        out.append(TensorType(tuple(shape), t.dtype))
    return out


@register("split", I, infer=_split_infer, num_outputs=-1, traits=("slicing", "may_alias"))
def split(x, dim: int, sizes: tuple):
    """Split into pieces of ``sizes`` along ``dim`` (one output per piece)."""
    return tuple(torch.split(x, list(sizes), dim))


@register("squeeze", I, traits=("view", "may_alias"))
def squeeze(x, dims: tuple | None = None):
    if dims is None:
        return x.squeeze()
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        x = x.squeeze(d)
    return x


@register("unsqueeze", I, traits=("view", "may_alias"))
def unsqueeze(x, dims: tuple):
    """Insert size-1 dims at ``dims`` (positions in the output)."""
    rank = x.dim() + len(dims)
    for d in sorted(d % rank for d in dims):
        x = x.unsqueeze(d)
    return x


@register("flatten", I, traits=("view", "may_alias"))
def flatten(x, start_dim: int = 0, end_dim: int = -1):
    return torch.flatten(x, start_dim, end_dim)


@register("gather", I)
def gather(x, index, dim: int):
    """torch.gather semantics (ONNX GatherElements)."""
    return torch.gather(x, dim, index.long())


@register("index_select", I)
def index_select(x, index, dim: int):
    """Select along ``dim`` by an index tensor of any shape (ONNX Gather); negatives wrap."""
    index = index.long()
    index = torch.where(index < 0, index + x.shape[dim], index)
    out = torch.index_select(x, dim, index.reshape(-1))
    return out.reshape(x.shape[:dim] + index.shape + x.shape[dim + 1:])


@register("index_copy", O, traits=("in_place",))
def index_copy(x, index, src, dim: int):
    """``x.index_copy_(dim, index, src)``: ``src``'s slices along ``dim`` into ``x`` at ``index``, in ``x`` itself (a
    static KV cache's update; the importer makes it only where nothing else reads ``x``). Returns ``x``."""
    return x.index_copy_(dim, index, src)


@register("embedding", I)
def embedding(weight, ids, padding_idx: int | None = None):
    """Rows of ``weight`` selected by ``ids``."""
    return F.embedding(ids.long(), weight)


@register("pad", I)
def pad(x, pads: tuple, mode: str = "constant", value: float = 0.0):
    """torch.nn.functional.pad order: (last_lo, last_hi, prev_lo, prev_hi, ...)."""
    if mode == "constant":
        return F.pad(x, pads, mode, value)
    return F.pad(x, pads, mode)


@register("repeat", I)
def repeat(x, repeats: tuple):
    return x.repeat(repeats)


@register("tril", I)
def tril(x, diagonal: int = 0):
    return torch.tril(x, diagonal)


@register("triu", I)
def triu(x, diagonal: int = 0):
    return torch.triu(x, diagonal)


@register("arange", I)
def arange(start: float = 0, end: float = 1, step: float = 1, dtype: str = "int64"):
    """A generator: no tensor inputs."""
    return torch.arange(start, end, step, dtype=torch_dtype(dtype))


@register("full", I)
def full(shape: tuple, value: float, dtype: str = "float32"):
    """A generator: a tensor of ``shape`` filled with ``value``."""
    return torch.full(tuple(shape), value, dtype=torch_dtype(dtype))


@register("shape_of", O, traits=("fold_dynamic",))
def shape_of(x, start: int = 0, end: int | None = None):
    """The shape of ``x`` as an int64 tensor (ONNX Shape)."""
    return torch.tensor(list(x.shape)[start:end], dtype=torch.int64, device=x.device)


@register("cumsum", O)
def cumsum(x, dim: int, exclusive: int = 0, reverse: int = 0):
    if reverse:
        x = x.flip(dim)
    out = torch.cumsum(x, dim)
    if exclusive:
        out = out - x
    return out.flip(dim) if reverse else out


@register("topk", O, num_outputs=2)
def topk(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    v, i = torch.topk(x, k, dim, largest, sorted)
    return v, i


@register("masked_fill", OpKind.BROADCAST)
def masked_fill(x, mask, value: float):
    return x.masked_fill(mask.bool(), value)


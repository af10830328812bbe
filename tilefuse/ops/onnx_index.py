"""ONNX-only indexing: gathers and scatters with ONNX's negative indices, one-hot encoding, and the selections
whose output size depends on the data (unique values, non-maximum suppression).

See ``tilefuse.ops.onnx_common`` for the conventions (``"?"`` dims).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType
from tilefuse.ops.onnx_common import dynamic_infer
from tilefuse.ops.registry import OpKind, register

I, O = OpKind.INJECTIVE, OpKind.OPAQUE


# ---- gathers and scatters ------------------------------------------------------------------------

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


@register("tensor_scatter", I)
def tensor_scatter(cache, update, write_indices=None, mode: str = "linear", axis: int = -2):
    """ONNX TensorScatter: write ``update`` into ``cache`` along ``axis`` from each batch entry's
    write index (wrapping around when ``mode`` is circular)."""
    axis %= cache.dim()
    out = cache.clone()
    starts = [0] * cache.shape[0] if write_indices is None else write_indices.tolist()
    for b, start in enumerate(starts):
        pos = torch.arange(update.shape[axis]) + int(start)
        if mode == "circular":
            pos = pos % cache.shape[axis]
        out[b].index_copy_(axis - 1, pos.to(cache.device), update[b])
    return out


@register("reverse_sequence", I)
def reverse_sequence(x, lengths, batch_axis: int = 1, time_axis: int = 0):
    """Reverse the first ``lengths[b]`` steps along ``time_axis`` of each batch entry ``b``."""
    out = x.clone()
    for bi, n in enumerate(lengths.tolist()):
        src = x.select(batch_axis, bi)
        t = time_axis - (time_axis > batch_axis)
        out.select(batch_axis, bi).narrow(t, 0, n).copy_(src.narrow(t, 0, n).flip(t))
    return out


# ---- one-hot -------------------------------------------------------------------------------------

@register("one_hot", I)
def one_hot(indices, values, depth: int, axis: int = -1):
    """ONNX OneHot: ``values[1]`` at each (wrapped) index along a new ``axis``, ``values[0]`` elsewhere."""
    idx = _wrap(indices, depth)
    valid = (idx >= 0) & (idx < depth)
    hot = F.one_hot(torch.where(valid, idx, torch.zeros_like(idx)), depth).bool() & valid.unsqueeze(-1)
    out = torch.where(hot, values[1], values[0])
    return out.movedim(-1, axis % out.dim())


@register("one_hot_dynamic", I, infer=lambda t, a: [TensorType(None if t[0].shape is None else ("?",) * (
    len(t[0].shape) + 1), t[2].dtype)])
def one_hot_dynamic(indices, depth, values, axis: int = -1):
    """ONNX OneHot with a runtime depth."""
    return one_hot(indices, values, int(depth.reshape(-1)[0].item()), axis)


# ---- selections sized by the data ----------------------------------------------------------------

def _unique_infer(in_types, attrs):
    x = in_types[0]
    axis = attrs.get("axis")
    y_rank = 1 if axis is None else x.rank
    return [TensorType(("?",) * y_rank, x.dtype)] + [TensorType(("?",), "int64")] * 3


@register("unique", O, infer=_unique_infer, num_outputs=4)
def unique(x, axis: int | None = None, sorted: int = 1):
    """ONNX Unique: (values, first-occurrence indices, inverse indices, counts), sorted or in
    order of first occurrence."""
    flat = x.reshape(-1) if axis is None else x.movedim(axis, 0).reshape(x.shape[axis], -1)
    values, inverse, counts = torch.unique(flat, sorted=True, return_inverse=True, return_counts=True, dim=0)
    n = flat.shape[0]
    dev = x.device
    first = torch.full((values.shape[0],), n, dtype=torch.int64, device=dev).scatter_reduce(
        0, inverse, torch.arange(n, device=dev), "amin")
    order = torch.arange(values.shape[0], device=dev) if sorted else torch.argsort(first)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=dev))
    values = values[order]
    if axis is not None:
        axis %= x.dim()
        values = values.reshape(-1, *[s for i, s in enumerate(x.shape) if i != axis]).movedim(0, axis)
    return values, first[order], rank[inverse], counts[order]


@register("non_max_suppression", O, infer=dynamic_infer(rank=2, dtype="int64"))
def non_max_suppression(boxes, scores, max_output=None, iou_threshold=None, score_threshold=None,
                        center_point_box: int = 0):
    """ONNX NonMaxSuppression: greedy per batch and class; rows (batch, class, box) as int64."""
    limit = int(max_output.reshape(-1)[0].item()) if max_output is not None and max_output.numel() else 0
    iou_t = float(iou_threshold.reshape(-1)[0].item()) if iou_threshold is not None and iou_threshold.numel() else 0.0
    score_t = float(score_threshold.reshape(-1)[0].item()) if score_threshold is not None and \
        score_threshold.numel() else None
    b = boxes.double()
    if center_point_box:
        xc, yc, w, h = b.unbind(-1)
        y1, x1, y2, x2 = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    else:
        y1, x1, y2, x2 = b.unbind(-1)
        y1, y2 = torch.minimum(y1, y2), torch.maximum(y1, y2)
        x1, x2 = torch.minimum(x1, x2), torch.maximum(x1, x2)
    area = (y2 - y1) * (x2 - x1)
    rows = []
    for bi in range(scores.shape[0]):
        for ci in range(scores.shape[1]):
            s = scores[bi, ci].double()
            order = [int(i) for i in torch.sort(s, descending=True, stable=True).indices.tolist()
                     if score_t is None or s[i] > score_t]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                ok = True
                for j in kept:
                    ih = (torch.minimum(y2[bi, i], y2[bi, j]) - torch.maximum(y1[bi, i], y1[bi, j])).clamp(min=0)
                    iw = (torch.minimum(x2[bi, i], x2[bi, j]) - torch.maximum(x1[bi, i], x1[bi, j])).clamp(min=0)
                    inter = ih * iw
                    union = area[bi, i] + area[bi, j] - inter
                    if union > 0 and inter / union > iou_t:
                        ok = False
                        break
                if ok:
                    kept.append(i)
            rows += [[bi, ci, i] for i in kept]
    return torch.tensor(rows, dtype=torch.int64, device=boxes.device).reshape(-1, 3)

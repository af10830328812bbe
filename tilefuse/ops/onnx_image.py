"""ONNX-only image ops: Resize (every coordinate mode, nearest / linear / cubic, antialiasing) and sampling
(GridSample, AffineGrid, RoiAlign).

See ``tilefuse.ops.onnx_common`` for the conventions (``"?"`` dims).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ops.onnx_common import dynamic_infer
from tilefuse.ops.registry import OpKind, register

O = OpKind.OPAQUE


# ---- resize --------------------------------------------------------------------------------------

def _source_coords(mode: str, out: int, n: int, scale: float, roi: tuple | None):
    """Source coordinate of each output index along one axis (ONNX coordinate_transformation_mode)."""
    y = torch.arange(out, dtype=torch.float64)
    length = scale * n
    if mode == "align_corners":
        return torch.zeros(out, dtype=torch.float64) if length == 1 else y * (n - 1) / (length - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        x = torch.full((out,), (hi - lo) * (n - 1) / 2, dtype=torch.float64) if length == 1 else \
            y * (hi - lo) * (n - 1) / (length - 1)
        return x + lo * (n - 1)
    if mode == "pytorch_half_pixel" and length == 1:
        return torch.full((out,), -0.5, dtype=torch.float64)
    if mode == "half_pixel_symmetric":
        offset = n / 2 * (1 - out / length)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5  # half_pixel, pytorch_half_pixel


def _cubic(d: torch.Tensor, a: float) -> torch.Tensor:
    d = d.abs()
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))


def _resize_weights(mode: str, r: torch.Tensor, scale: float, antialias: bool, cubic_a: float,
                    nearest_mode: str) -> tuple[torch.Tensor, int]:
    """Per output position: weights of the taps ``i0 + start ... i0 + start + n - 1`` where
    ``i0 = ceil(x) - 1`` and ``r = x - i0`` lies in (0, 1]. Returns (weights [out, n], start)."""
    if mode == "nearest":
        if nearest_mode == "round_prefer_ceil":
            hi = r >= 0.5
        elif nearest_mode == "floor":
            hi = r == 1
        elif nearest_mode == "ceil":
            hi = torch.ones_like(r, dtype=torch.bool)
        else:  # round_prefer_floor
            hi = r > 0.5
        return torch.stack([(~hi).double(), hi.double()], -1), 0
    s = min(scale, 1.0) if antialias else 1.0
    support = 1 if mode == "linear" else 2
    start = math.floor(-support / s) + 1
    offsets = torch.arange(start, 2 - start if antialias else support + 1, dtype=torch.float64)
    if not antialias:
        start = 1 - support
        offsets = torch.arange(start, start + 2 * support, dtype=torch.float64)
    d = (offsets[None, :] - r[:, None]) * s
    w = (1 - d.abs()).clamp(0, 1) if mode == "linear" else _cubic(d, cubic_a)
    if antialias:
        w = w / w.sum(-1, keepdim=True)
    return w, start


@register("resize", O)
def resize(x, sizes: tuple, scales: tuple, mode: str = "nearest", coordinate_mode: str = "half_pixel",
           nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75, exclude_outside: int = 0,
           extrapolation_value: float = 0.0, antialias: int = 0, roi: tuple | None = None):
    """ONNX Resize, one axis at a time (the interpolation is separable): ``sizes`` is the whole output
    shape, ``scales`` one factor per axis, ``roi`` [starts..., ends...] for tf_crop_and_resize."""
    y = x.double()
    rank = x.dim()
    for axis in range(rank):
        n, out, scale = x.shape[axis], sizes[axis], scales[axis]
        ax_roi = None if roi is None else (roi[axis], roi[rank + axis])
        if out == n and scale == 1.0 and (ax_roi is None or ax_roi == (0.0, 1.0)):
            continue
        src = _source_coords(coordinate_mode, out, n, scale, ax_roi)
        i0 = torch.ceil(src).long() - 1
        w, start = _resize_weights(mode, src - i0, scale, bool(antialias), cubic_coeff_a, nearest_mode)
        idx = i0[:, None] + start + torch.arange(w.shape[1])[None, :]
        if exclude_outside:
            w = torch.where((idx < 0) | (idx >= n), torch.zeros_like(w), w)
            total = w.sum(-1, keepdim=True)
            w = w / torch.where(total == 0, torch.ones_like(total), total)
        taps = y.index_select(axis, idx.clamp(0, n - 1).reshape(-1).to(x.device))
        taps = taps.reshape(y.shape[:axis] + (out, w.shape[1]) + y.shape[axis + 1:])
        w = w.reshape((1,) * axis + tuple(w.shape) + (1,) * (rank - axis - 1)).to(x.device)
        y = (taps * w).sum(axis + 1)
        if coordinate_mode == "tf_crop_and_resize":
            outside = ((src < 0) | (src > n - 1)).reshape((1,) * axis + (out,) + (1,) * (rank - axis - 1))
            y = torch.where(outside.to(x.device), torch.full_like(y, extrapolation_value), y)
    if not x.dtype.is_floating_point:
        info = torch.iinfo(x.dtype)
        y = torch.round(y).clamp(info.min, info.max)
    return y.to(x.dtype)


def resize_geometry(shape, scales=None, sizes=None, roi=None, axes=None, policy: str = "stretch"):
    """ONNX Resize's (sizes, scales, roi) over all axes from its scales/sizes/roi tensors over ``axes``
    (``keep_aspect_ratio_policy`` applied). Returns tuples: output shape, per-axis scales, full roi."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    out_scales, out_sizes = [1.0] * rank, list(shape)
    if sizes is not None and sizes.numel():
        want = [int(v) for v in sizes.reshape(-1).tolist()]
        ratio = [want[k] / shape[a] for k, a in enumerate(axes)]
        if policy != "stretch":
            s = min(ratio) if policy == "not_larger" else max(ratio)
            ratio, want = [s] * len(axes), [int(s * shape[a] + 0.5) for a in axes]
        for k, a in enumerate(axes):
            out_scales[a], out_sizes[a] = ratio[k], want[k]
    elif scales is not None and scales.numel():
        for k, a in enumerate(axes):
            out_scales[a] = float(scales.reshape(-1)[k])
            out_sizes[a] = math.floor(out_scales[a] * shape[a])
    else:
        raise ValueError("Resize needs scales or sizes")
    full = None
    if roi is not None and roi.numel():
        full = [0.0] * rank + [1.0] * rank
        vals = [float(v) for v in roi.reshape(-1).tolist()]
        for k, a in enumerate(axes):
            full[a], full[rank + a] = vals[k], vals[len(axes) + k]
        full = tuple(full)
    return tuple(out_sizes), tuple(out_scales), full


@register("resize_dynamic", O, infer=dynamic_infer(rank_of=0))
def resize_dynamic(x, roi=None, scales=None, sizes=None, axes: tuple | None = None, policy: str = "stretch",
                   **attrs):
    """ONNX Resize whose scales / sizes / roi are runtime tensors."""
    out_sizes, out_scales, full = resize_geometry(tuple(x.shape), scales, sizes, roi, axes, policy)
    if attrs.get("coordinate_mode") != "tf_crop_and_resize":
        full = None
    return resize(x, out_sizes, out_scales, roi=full, **attrs)


# ---- sampling ------------------------------------------------------------------------------------

@register("grid_sample", O)
def grid_sample(x, grid, mode: str = "bilinear", padding_mode: str = "zeros", align_corners: int = 0):
    """ONNX GridSample (PyTorch's semantics); ``mode`` in bilinear, nearest, bicubic."""
    return F.grid_sample(x, grid.to(x.dtype), mode=mode, padding_mode=padding_mode, align_corners=bool(align_corners))


@register("affine_grid", O, infer=dynamic_infer(len_of=1))
def affine_grid(theta, size, align_corners: int = 0):
    """ONNX AffineGrid: the sampling grid of the affine maps ``theta`` for an output of ``size``."""
    return F.affine_grid(theta, [int(s) for s in size.tolist()], align_corners=bool(align_corners))


@register("roi_align", O)
def roi_align(x, rois, batch_indices, mode: str = "avg", output_height: int = 1, output_width: int = 1,
              sampling_ratio: int = 0, spatial_scale: float = 1.0, half_pixel: int = 1):
    """ONNX RoiAlign: bilinear samples averaged (or maxed) over each bin of each region."""
    out = []
    h, w = x.shape[2], x.shape[3]
    offset = 0.5 if half_pixel else 0.0
    for roi, b in zip(rois.double(), batch_indices.tolist()):
        x0, y0, x1, y1 = (roi * spatial_scale - offset).tolist()
        rw, rh = (x1 - x0, y1 - y0) if half_pixel else (max(x1 - x0, 1.0), max(y1 - y0, 1.0))
        bh, bw = rh / output_height, rw / output_width
        sh = sampling_ratio or math.ceil(rh / output_height)
        sw = sampling_ratio or math.ceil(rw / output_width)
        ys = y0 + torch.arange(output_height, dtype=torch.float64)[:, None] * bh + \
            (torch.arange(sh, dtype=torch.float64)[None, :] + 0.5) * bh / sh
        xs = x0 + torch.arange(output_width, dtype=torch.float64)[:, None] * bw + \
            (torch.arange(sw, dtype=torch.float64)[None, :] + 0.5) * bw / sw
        img = x[int(b)].double()
        corners = _bilinear(img, ys.reshape(-1).to(x.device), xs.reshape(-1).to(x.device), h, w)  # 4 x [C, OH*SH, OW*SW]
        # max mode takes the largest weighted corner of each sample, as onnxruntime does
        vals = torch.stack(corners).amax(0) if mode == "max" else sum(corners)
        vals = vals.reshape(x.shape[1], output_height, sh, output_width, sw)
        out.append(vals.amax((2, 4)) if mode == "max" else vals.mean((2, 4)))
    return torch.stack(out).to(x.dtype) if out else x.new_zeros((0, x.shape[1], output_height, output_width))


def _bilinear(img, ys, xs, h, w):
    """The four weighted corner terms of bilinear samples of ``img`` [C, H, W] at the grid ys x xs,
    zero outside [-1, H] x [-1, W] (RoiAlign)."""
    def axis(coords, n):
        valid = (coords >= -1.0) & (coords <= n)
        c = coords.clamp(min=0)
        lo = c.floor().long().clamp(max=n - 1)
        hi = (lo + 1).clamp(max=n - 1)
        c = torch.where(lo >= n - 1, lo.double(), c)
        frac = c - lo
        return lo, hi, 1 - frac, frac, valid

    ylo, yhi, wy0, wy1, vy = axis(ys, h)
    xlo, xhi, wx0, wx1, vx = axis(xs, w)
    inside = vy[:, None] & vx[None, :]
    return [img[:, yi][:, :, xi] * (wy[:, None] * wx[None, :]) * inside
            for yi, wy in ((ylo, wy0), (yhi, wy1)) for xi, wx in ((xlo, wx0), (xhi, wx1))]

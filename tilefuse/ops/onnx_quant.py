"""ONNX quantization: quantize / dequantize (per tensor, per axis, blocked), quantized matmul and convolutions
(computed in float64 from the dequantized operands, then requantized).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tilefuse.ir import torch_dtype
from tilefuse.ops.onnx_math import cast_float8
from tilefuse.ops.registry import OpKind, register

E = OpKind.ELEMENTWISE


def _per_axis(scale, x, axis: int, block_size: int):
    """``scale`` (or a zero point) broadcast against ``x``: scalar, per-axis 1-D, or blocked."""
    if scale.dim() == 0 or scale.numel() == 1 and not block_size:
        return scale.reshape(())
    axis %= x.dim()
    if block_size:
        return scale.repeat_interleave(block_size, dim=axis).narrow(axis, 0, x.shape[axis])
    return scale.reshape([-1 if i == axis else 1 for i in range(x.dim())])


@register("quantize_linear", E, traits=("axis",))
def quantize_linear(x, scale, zero_point=None, axis: int = 1, block_size: int = 0, dtype: str = "uint8",
                    saturate: int = 1):
    """round(x / scale) + zero_point, saturated to ``dtype`` (ties to even); float8 outputs cast."""
    s = _per_axis(scale, x, axis, block_size)
    work = torch.promote_types(x.dtype, s.dtype)
    y = x.to(work) / s.to(work)  # ONNX divides in the input's precision
    out = torch_dtype(dtype)
    if out.is_floating_point:
        return cast_float8(y.float(), dtype, bool(saturate)) if dtype.startswith("float8") else y.to(out)
    y = torch.round(y).double()
    if zero_point is not None:
        y = y + _per_axis(zero_point, x, axis, block_size).double()
    info = torch.iinfo(out)
    return torch.round(y).clamp(info.min, info.max).to(out)


@register("dequantize_linear", E, traits=("axis",))
def dequantize_linear(x, scale, zero_point=None, axis: int = 1, block_size: int = 0, dtype: str | None = None):
    """(x - zero_point) * scale in the scale's dtype (or ``dtype``)."""
    s = _per_axis(scale, x, axis, block_size)
    y = x.double() if not x.dtype.is_floating_point or x.dtype.itemsize > 1 else x.float().double()
    if zero_point is not None:
        y = y - _per_axis(zero_point, x, axis, block_size).double()
    return (y * s.double()).to(torch_dtype(dtype) if dtype else scale.dtype)


@register("qlinear_matmul", OpKind.GEMM)
def qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """Quantized matmul: dequantize, multiply exactly, requantize to ``y_zp``'s dtype."""
    af = (a.double() - a_zp.double()) * a_scale.double()
    bf = (b.double() - _per_axis(b_zp, b, -1, 0).double()) * _per_axis(b_scale, b, -1, 0).double()
    return quantize_linear(torch.matmul(af, bf), y_scale, y_zp, dtype=str(y_zp.dtype).removeprefix("torch."))


@register("qlinear_conv", OpKind.CONV)
def qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None, stride: tuple = (1, 1),
                 padding: tuple = (0, 0), dilation: tuple = (1, 1), groups: int = 1):
    """Quantized convolution: dequantize, convolve in float64, add the int32 bias, requantize."""
    xf = (x.double() - x_zp.double()) * x_scale.double()
    wf = (w.double() - _per_axis(w_zp, w, 0, 0).double()) * _per_axis(w_scale, w, 0, 0).double()
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[w.dim()]
    y = fn(xf, wf, None, tuple(stride), tuple(padding), tuple(dilation), groups)
    if bias is not None:
        scale = (x_scale.double() * w_scale.double()).reshape(-1)
        y = y + (bias.double() * scale).reshape(1, -1, *([1] * (w.dim() - 2)))
    return quantize_linear(y, y_scale, y_zp, dtype=str(y_zp.dtype).removeprefix("torch."))


@register("conv_integer", OpKind.CONV)
def conv_integer(x, w, x_zp=None, w_zp=None, stride: tuple = (1, 1), padding: tuple = (0, 0),
                 dilation: tuple = (1, 1), groups: int = 1):
    """Integer convolution with zero points, int32 result (exact through float64)."""
    xf = x.double() - (x_zp.double() if x_zp is not None else 0)
    wf = w.double() - (_per_axis(w_zp, w, 0, 0).double() if w_zp is not None else 0)
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[w.dim()]
    return fn(xf, wf, None, tuple(stride), tuple(padding), tuple(dilation), groups).round().to(torch.int32)

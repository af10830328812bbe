"""Elementwise and broadcast ops: math, activations, comparisons, where, cast.

Note: binary ops follow torch's type promotion (a 0-d constant operand behaves like a Python
scalar). Frontends turn scalar operands into 0-d constants, so every operand is a tensor here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tilefuse.ir import torch_dtype
from tilefuse.ops.registry import OpKind, register

E, B = OpKind.ELEMENTWISE, OpKind.BROADCAST

_UNARY = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "erf": torch.erf,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "neg": torch.neg,
    "abs": torch.abs,
    "reciprocal": torch.reciprocal,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "sign": torch.sign,
    "silu": F.silu,
    "softplus": F.softplus,
    "mish": F.mish,
    "softsign": F.softsign,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "identity": lambda x: x,
}

_BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "atan2": torch.atan2,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
}


def _declare(table, kind):
    for name, fn in table.items():
        register(name, kind)(lambda *xs, _fn=fn: _fn(*xs))


_declare(_UNARY, E)
_declare(_BINARY, B)


@register("floor_divide", B)
def floor_divide(a, b):
    """Integer/float division rounding toward negative infinity."""
    return torch.div(a, b, rounding_mode="floor")


@register("trunc_divide", B)
def trunc_divide(a, b):
    """Division rounding toward zero (C semantics, as ONNX Div on integers)."""
    return torch.div(a, b, rounding_mode="trunc")


@register("gelu", E)
def gelu(x, approximate: str = "none"):
    """GELU, exact (erf) or the tanh approximation."""
    return F.gelu(x, approximate=approximate)


@register("leaky_relu", E)
def leaky_relu(x, alpha: float = 0.01):
    return F.leaky_relu(x, alpha)


@register("elu", E)
def elu(x, alpha: float = 1.0):
    return F.elu(x, alpha)


@register("selu", E)
def selu(x, alpha: float = 1.6732632423543772, gamma: float = 1.0507009873554805):
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@register("celu", E)
def celu(x, alpha: float = 1.0):
    return F.celu(x, alpha)


@register("hardsigmoid", E)
def hardsigmoid(x, alpha: float = 1 / 6, beta: float = 0.5):
    return torch.clamp(alpha * x + beta, 0, 1)


@register("hardswish", E)
def hardswish(x):
    return F.hardswish(x)


@register("thresholded_relu", E)
def thresholded_relu(x, alpha: float = 1.0):
    return torch.where(x > alpha, x, torch.zeros_like(x))


@register("clamp", E)
def clamp(x, min: float | None = None, max: float | None = None):
    """Clamp to [min, max]; either bound may be absent."""
    return torch.clamp(x, min, max)


@register("clamp_tensor", B)
def clamp_tensor(x, lo=None, hi=None):
    """Clamp with tensor bounds (ONNX Clip with inputs); absent bounds are skipped."""
    if lo is not None:
        x = torch.maximum(x, lo.to(x.dtype))
    if hi is not None:
        x = torch.minimum(x, hi.to(x.dtype))
    return x


@register("where", B)
def where(cond, a, b):
    return torch.where(cond.bool() if cond.dtype != torch.bool else cond, a, b)


@register("cast", E)
def cast(x, dtype: str):
    """Convert to ``dtype`` (a torch dtype name)."""
    return x.to(torch_dtype(dtype))


@register("scale", E)
def scale(x, factor: float):
    """Multiply by a constant (kept as an attribute so epilogues see it)."""
    return x * factor


@register("erfinv", E)
def erfinv(x):
    return torch.erfinv(x)


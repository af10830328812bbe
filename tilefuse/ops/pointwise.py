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
EPI, FLT = "epilogue", "float_only"  # traits (ops.registry.TRAITS)

# name: (torch function, *traits)
_UNARY = {
    "relu": (torch.relu, EPI, FLT),
    "sigmoid": (torch.sigmoid, EPI, FLT),
    "tanh": (torch.tanh, EPI, FLT),
    "erf": (torch.erf, EPI, FLT),
    "exp": (torch.exp, EPI, FLT),
    "log": (torch.log, EPI, FLT),
    "sqrt": (torch.sqrt, EPI, FLT),
    "rsqrt": (torch.rsqrt, EPI, FLT),
    "neg": (torch.neg, EPI),
    "abs": (torch.abs, EPI),
    "reciprocal": (torch.reciprocal, EPI, FLT),
    "sin": (torch.sin, EPI, FLT),
    "cos": (torch.cos, EPI, FLT),
    "tan": (torch.tan, FLT),
    "asin": (torch.asin,),
    "acos": (torch.acos,),
    "atan": (torch.atan,),
    "sinh": (torch.sinh,),
    "cosh": (torch.cosh,),
    "asinh": (torch.asinh,),
    "acosh": (torch.acosh,),
    "atanh": (torch.atanh,),
    "floor": (torch.floor, FLT),
    "ceil": (torch.ceil, FLT),
    "round": (torch.round,),
    "sign": (torch.sign, FLT),
    "silu": (F.silu, EPI, FLT),
    "softplus": (F.softplus, EPI, FLT),
    "mish": (F.mish, FLT),
    "softsign": (F.softsign, FLT),
    "logical_not": (torch.logical_not,),
    "bitwise_not": (torch.bitwise_not,),
    "isnan": (torch.isnan,),
    "isinf": (torch.isinf,),
    "identity": (lambda x: x, EPI, "view", "may_alias"),
}

_BINARY = {
    "add": (torch.add, EPI),
    "sub": (torch.sub, EPI),
    "mul": (torch.mul, EPI),
    "div": (torch.div, EPI, FLT),
    "pow": (torch.pow, EPI, FLT),
    "maximum": (torch.maximum, EPI),
    "minimum": (torch.minimum, EPI),
    "remainder": (torch.remainder,),
    "fmod": (torch.fmod,),
    "atan2": (torch.atan2,),
    "eq": (torch.eq, EPI),
    "ne": (torch.ne, EPI),
    "lt": (torch.lt, EPI),
    "le": (torch.le, EPI),
    "gt": (torch.gt, EPI),
    "ge": (torch.ge, EPI),
    "logical_and": (torch.logical_and,),
    "logical_or": (torch.logical_or,),
    "logical_xor": (torch.logical_xor,),
    "bitwise_and": (torch.bitwise_and,),
    "bitwise_or": (torch.bitwise_or,),
    "bitwise_xor": (torch.bitwise_xor,),
}


def _declare(table, kind):
    for name, (fn, *traits) in table.items():
        register(name, kind, traits=traits)(lambda *xs, _fn=fn: _fn(*xs))


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


@register("gelu", E, traits=(EPI, FLT))
def gelu(x, approximate: str = "none"):
    """GELU, exact (erf) or the tanh approximation."""
    return F.gelu(x, approximate=approximate)


@register("leaky_relu", E, traits=(EPI, FLT))
def leaky_relu(x, alpha: float = 0.01):
    return F.leaky_relu(x, alpha)


@register("elu", E, traits=(FLT,))
def elu(x, alpha: float = 1.0):
    return F.elu(x, alpha)


@register("selu", E)
def selu(x, alpha: float = 1.6732632423543772, gamma: float = 1.0507009873554805):
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@register("celu", E)
def celu(x, alpha: float = 1.0):
    return F.celu(x, alpha)


@register("hardsigmoid", E, traits=(FLT,))
def hardsigmoid(x, alpha: float = 1 / 6, beta: float = 0.5):
    return torch.clamp(alpha * x + beta, 0, 1)


@register("hardswish", E, traits=(FLT,))
def hardswish(x):
    return F.hardswish(x)


@register("thresholded_relu", E)
def thresholded_relu(x, alpha: float = 1.0):
    return torch.where(x > alpha, x, torch.zeros_like(x))


@register("clamp", E, traits=(EPI, FLT))
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


@register("where", B, traits=(EPI,))
def where(cond, a, b):
    return torch.where(cond.bool() if cond.dtype != torch.bool else cond, a, b)


@register("cast", E, traits=(EPI, "may_alias"))
def cast(x, dtype: str):
    """Convert to ``dtype`` (a torch dtype name)."""
    return x.to(torch_dtype(dtype))


@register("scale", E, traits=(EPI, FLT))
def scale(x, factor: float):
    """Multiply by a constant (kept as an attribute so epilogues see it)."""
    return x * factor


@register("erfinv", E, traits=(EPI, FLT))
def erfinv(x):
    return torch.erfinv(x)


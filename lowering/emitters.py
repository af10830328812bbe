"""The TileLang emitters of the expression ops: ``EMITTERS`` maps an op name to the function that builds its TIR
PrimExpr from the lowered operands (``lowering.expr.emit`` walks the tree and calls them). A new elementwise op
that a fused kernel computes adds its row here.

NaN and signed zeros follow torch, not the targets' ``max``/``min`` (C's ``a > b ? a : b`` and CUDA's
``fmaxf`` return the other operand for a NaN): ``maximum``/``minimum`` give NaN when either operand is NaN;
relu, clamp (hardtanh, relu6) and the hard activations keep NaN and keep ``x`` where it equals a bound
(``relu(-0.0)`` is ``-0.0``). They are selects, which TileLang does not vectorize on GPUs. TVM's simplifier
folds ``x == x`` to true and ``x != x`` to false for floats too, so float ``eq``/``ne`` also test for NaN.

Note: TVM folds float arithmetic as if it were real numbers, in two places: building a node folds a literal
zero operand (``x * 0.0`` -> 0, ``x + 0.0`` -> x, ``0.0 / x`` -> 0, ``x - (-0.0)`` -> x; ``x / 0.0`` is refused),
and the simplifier that runs inside TileLang's lowering cancels subtractions (``x - x`` -> 0, ``(x + y) - y``
-> x, ``select(c, y, z) - z`` -> ``select(c, y - z, 0)``) and negates float comparisons (``not x < y`` ->
``y <= x``). Each is wrong for NaN, +-Inf, -0.0 or an overflow. So float ``sub`` is emitted as ``a + b * -1``
(exact in IEEE arithmetic, no ``Sub`` node for a rule to match; gcc and nvcc turn it back into one subtraction),
a literal zero operand of add/sub/mul/div as ``copysign(0, +-1)`` (an intrinsic call the simplifier keeps and
the C and CUDA compilers fold back into the constant) and ``logical_not`` as a select.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

_HALF = ("float16", "bfloat16")
_FLOAT_RANK = {"float32": 1, "float64": 2}


def prim(x):
    """A PrimExpr for ``x``: TVM's ``a == b`` / ``a != b`` give lazy EqualOp/NotEqualOp objects
    (they have no ``dtype`` until converted)."""
    return x.asobject() if hasattr(x, "asobject") else x


def widen(T, v):
    """``v`` computed in fp32 when it is fp16/bf16 (see ``lowering.expr``'s numerics)."""
    return T.Cast("float32", v) if str(v.dtype) in _HALF else v


def constant(T, value: float, dtype: str):
    """A scalar constant of ``dtype``: fp16/bf16 ones rounded through their dtype and held in fp32."""
    if dtype == "bool":
        return T.bool(bool(value))
    if dtype in _HALF:  # round through the narrow dtype, compute in fp32
        return T.float32(float(torch.tensor(value, dtype=getattr(torch, dtype)).float()))
    if dtype.startswith("float"):
        return T.FloatImm(dtype, float(value))
    return T.IntImm(dtype, int(value))


def _rank(dtype: str) -> float:
    if dtype == "bool":
        return 0
    return _FLOAT_RANK.get(dtype, 0.5)  # integers sit between bool and fp32


def _unify(T, *xs):
    """Cast operands to their common dtype: bool < int < float32 < float64 (torch's promotion)."""
    dts = [str(x.dtype) for x in xs]
    top = max(dts, key=_rank)
    if top == "bool" and len(set(dts)) == 1:
        return xs
    if _rank(top) < 1 and len(set(dts)) > 1:
        top = next(d for d in dts if d != "bool")
    return tuple(x if str(x.dtype) == top else T.Cast(top, x) for x in xs)


def as_float(T, x):
    """``x`` as a float: integers and bools become float32."""
    return x if str(x.dtype) in _FLOAT_RANK else T.Cast("float32", x)


def _c(x, v: float):
    """A constant of x's float dtype."""
    from tilelang import language as T

    return T.FloatImm(str(x.dtype), v)


def _as_bool(T, x):
    return x if str(x.dtype) == "bool" else x != T.Cast(str(x.dtype), 0)


def _binary(fn):
    return lambda T, a, attrs: fn(T, *_unify(T, *a))


def _unary(fn):
    return lambda T, a, attrs: fn(T, a[0], attrs)


# erfinv: Giles' single-precision approximation ("Approximating the erfinv function", GPU Gems / 2010): a polynomial
# in w - 2.5 where w = -log(1 - x^2) < 5, else in sqrt(w) - 3; coefficients highest degree first.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                   -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                0.00943887047, 1.00167406, 2.83297682)


def _erfinv(T, x, attrs):
    """torch.erfinv: +-inf at +-1, NaN past them and for NaN, -0.0 at -0.0."""
    one = _c(x, 1.0)
    w = -T.log((one - x) * (one + x))
    central, tail = w - _c(x, 2.5), T.sqrt(w) - _c(x, 3.0)
    p, q = _c(x, _ERFINV_CENTRAL[0]), _c(x, _ERFINV_TAIL[0])
    for a, b in zip(_ERFINV_CENTRAL[1:], _ERFINV_TAIL[1:]):
        p, q = _c(x, a) + p * central, _c(x, b) + q * tail
    edge = T.copysign(_c(x, math.inf), x)
    return T.Select(T.Or(x == one, x == -one), edge, T.Select(w < _c(x, 5.0), p, q) * x)


def _expm1(T, x):
    """exp(x) - 1 without its cancellation near 0 (Kahan): ``exp(x) - 1`` gives elu(-1e-42) = 0 where torch's expm1
    gives -1e-42, and a later 0 * inf is NaN where eager has an infinity. (TVM has no expm1 intrinsic.)"""
    u = T.exp(x)
    um1 = u - _c(x, 1.0)
    return T.Select(u == _c(x, 1.0), x, T.Select(um1 == _c(x, -1.0), um1, um1 * x / T.log(u)))


def _gelu(T, x, attrs):
    if attrs.get("approximate", "none") == "tanh":
        inner = _c(x, math.sqrt(2.0 / math.pi)) * (x + _c(x, 0.044715) * x * x * x)
        return _c(x, 0.5) * x * (_c(x, 1.0) + T.tanh(inner))
    return _c(x, 0.5) * x * (_c(x, 1.0) + T.erf(x * _c(x, math.sqrt(0.5))))


def _abs(T, x):
    # T.abs lowers to tirx.fabs, which the C codegen cannot print; a select works everywhere. ``0 - x`` (not
    # ``-x``) on the non-positive side: abs(-0.0) is +0.0, as in torch.
    zero = T.Cast(str(x.dtype), 0)
    return T.Select(x <= zero, zero - x, x)


def _pow(T, a, b):
    # Small integral exponents as products: exact for negative bases, cheaper than powf.
    if isinstance(b, T.FloatImm) and float(b.value) in (1.0, 2.0, 3.0):
        return {1.0: a, 2.0: a * a, 3.0: a * a * a}[float(b.value)]
    return T.pow(a, b)


def _zero(x) -> float | None:
    """The value of ``x`` if it is a literal float zero (``0.0`` or ``-0.0``, maybe a cast integer 0), else None."""
    from tilelang import tvm

    tir = tvm.tirx
    if not _is_float(x):
        return None
    if isinstance(x, tir.Cast):
        x = x.value
    if isinstance(x, (tir.IntImm, tir.FloatImm)) and float(x.value) == 0.0:
        return math.copysign(0.0, float(x.value))
    return None


def _opaque(T, x):
    """A literal float zero operand as ``copysign(0, +-1)``: TVM folds ``x * 0`` to 0, ``x + 0`` to x and
    ``0 / x`` to 0 when it builds the node (see the module note); the compilers fold the call back."""
    z = _zero(x)
    if z is None:
        return x
    dtype = str(x.dtype)
    return T.copysign(T.FloatImm(dtype, 0.0), T.FloatImm(dtype, math.copysign(1.0, z)))


def _add(T, a, b):
    if not _is_float(a):
        return a + b
    if _zero(a) is not None:
        a, b = b, a  # exact either way round
    z = _zero(b)
    if z is not None and math.copysign(1.0, z) < 0:
        return a  # x + -0.0 is x, bit for bit
    return a + _opaque(T, b)


def _sub(T, a, b):
    # a + b * -1: the same IEEE result (negation is exact), with no Sub node for TVM's cancellation rules.
    if not _is_float(a):
        return a - b
    z = _zero(b)
    if z is not None and math.copysign(1.0, z) > 0:
        return a  # x - 0.0 is x, bit for bit
    return _add(T, a, _mul(T, b, _c(b, -1.0)))


def _mul(T, a, b):
    if not _is_float(a):
        return a * b
    return _opaque(T, a) * _opaque(T, b)


def _div(T, a, b):
    # 0 / x and x / 0 keep IEEE's NaN, Inf and signed zeros (TVM folds the first to 0 and refuses the second).
    return _opaque(T, a) / _opaque(T, b) if _is_float(a) else a / b


def _softplus(T, x, attrs):
    # torch's defaults (beta=1, threshold=20), as the registry's softplus takes no attributes.
    return T.Select(x > _c(x, 20.0), x, T.log1p(T.exp(x)))


def _clamp(T, x, attrs):
    lo, hi = attrs.get("min"), attrs.get("max")
    if any(b is not None and math.isnan(b) for b in (lo, hi)):
        return _c(x, math.nan)  # torch.clamp with a NaN bound gives NaN everywhere
    if lo is not None:
        x = _at_least(T, x, _c(x, lo))
    if hi is not None:
        x = _at_most(T, x, _c(x, hi))
    return x


def _at_least(T, x, lo):
    """``x`` raised to ``lo``, as torch's clamp_min: NaN stays NaN and ``x == lo`` keeps ``x`` (relu(-0.0) is -0.0).

    Note: not ``T.max``: C's ``a > b ? a : b`` and CUDA's ``fmaxf`` both drop a NaN operand."""
    return T.Select(x < lo, lo, x)


def _at_most(T, x, hi):
    """``x`` lowered to ``hi``, as torch's clamp_max (NaN stays NaN, ``x == hi`` keeps ``x``)."""
    return T.Select(x > hi, hi, x)


def _maximum(T, a, b):
    """torch.maximum: NaN if either operand is NaN (``T.max`` drops it on every target)."""
    if not _is_float(a):
        return T.max(a, b)
    return T.Select(T.Or(T.isnan(a), a > b), a, b)


def _minimum(T, a, b):
    """torch.minimum: NaN if either operand is NaN."""
    if not _is_float(a):
        return T.min(a, b)
    return T.Select(T.Or(T.isnan(a), a < b), a, b)


def _cast(T, a, attrs):
    dtype = attrs["dtype"]
    x = a[0]
    if dtype in _HALF and str(x.dtype) not in _FLOAT_RANK:
        # Integers reach fp16/bf16 through fp32 (exact below 2**24): cutlass's half_t has no
        # unambiguous int64 constructor.
        x = T.Cast("float32", x)
    v = x if str(x.dtype) == dtype else T.Cast(dtype, x)
    return widen(T, v)


def _where(T, a, attrs):
    x, y = _unify(T, a[1], a[2])
    return T.Select(_as_bool(T, a[0]), x, y)


def _is_float(x) -> bool:
    return str(x.dtype) in _FLOAT_RANK


def _floor_divide(T, a, b):
    """torch.floor_divide. Integers: floored. Floats as torch and Python compute them: the exact
    ``(a - fmod(a, b)) / b``, one less where the remainder and ``b`` differ in sign, rounded to the nearest integer,
    a zero quotient signed as ``a / b``; a zero divisor gives ``a / b``. ``floor(a / b)`` was off where ``a / b``
    rounds up to an integer (1 // 0.1 is 9) and for infinities (inf // 2 is NaN, -2 // inf is -1)."""
    if not _is_float(a):
        return T.floordiv(a, b)
    dtype = str(a.dtype)
    wide = dtype in ("float32", "float64")
    x, y = (a, b) if wide else (T.Cast("float32", a), T.Cast("float32", b))
    ct = str(x.dtype)
    zero, one, half = T.Cast(ct, 0), T.Cast(ct, 1), T.Cast(ct, 0.5)
    m = T.call_pure_extern(ct, "fmodf" if ct == "float32" else "fmod", x, y)
    q = (x - m) / y
    q = T.Select((m != zero) & ((y < zero) != (m < zero)), q - one, q)
    f = T.floor(q)
    f = T.Select(q - f > half, f + one, f)
    r = T.Select(y == zero, x / y, T.Select(q != zero, f, T.copysign(zero, x / y)))
    return r if wide else T.Cast(dtype, r)


def _remainder(T, a, b):
    # torch.remainder: the sign of the divisor (floor modulo), for floats and integers alike. Floats as torch's
    # scalar path: the exact fmod, moved to the divisor's sign when nonzero (a - b * floor(a / b) gave NaN for an
    # infinite divisor, remainder(1, inf) is 1, and lost the low digits of large quotients).
    if not _is_float(a):
        return T.floormod(a, b)
    dtype = str(a.dtype)
    wide = dtype in ("float32", "float64")
    x, y = (a, b) if wide else (T.Cast("float32", a), T.Cast("float32", b))
    # fmodf/fmod by name: TVM's C codegen has no lowering for its fmod intrinsic (CUDA has both functions too)
    m = T.call_pure_extern(str(x.dtype), "fmodf" if str(x.dtype) == "float32" else "fmod", x, y)
    zero = T.Cast(str(m.dtype), 0)
    r = T.Select((m != zero) & ((y < zero) != (m < zero)), m + y, m)
    return r if wide else T.Cast(dtype, r)


def _not(T, c):
    """Logical not as a select: TVM's simplifier turns ``not x < y`` into ``y <= x``, false for NaN where torch
    says true."""
    return T.Select(c, T.bool(False), T.bool(True))


def _bitwise(logical, bitwise):
    """An op that is logical on bools and bitwise on integers (torch's bitwise_* on bool tensors)."""
    def fn(T, a, attrs):
        xs = _unify(T, *a)
        if str(xs[0].dtype) == "bool":
            return logical(T, *xs)
        return bitwise(T, *xs)
    return fn


def _masked_fill(T, a, attrs):
    x, mask = a[0], _as_bool(T, a[1])
    v = attrs["value"]
    dt = str(x.dtype)
    fill = T.bool(bool(v)) if dt == "bool" else T.FloatImm(dt, float(v)) if dt in _FLOAT_RANK else T.IntImm(dt, int(v))
    return T.Select(mask, fill, x)


# One table: op name -> emitter(T, lowered args, attrs). ``lowering.expr.emit`` widens the integer/bool operands
# of the ops with the trait float_only (``lowering.expr.FLOAT_ONLY``) to float32 before it calls theirs.
EMITTERS: dict[str, Callable] = {
    "add": _binary(_add),
    "sub": _binary(_sub),
    "mul": _binary(_mul),
    "div": _binary(_div),
    "pow": _binary(_pow),
    "maximum": _binary(_maximum),
    "minimum": _binary(_minimum),
    "eq": _binary(lambda T, a, b: T.And(a == b, T.Not(T.isnan(a))) if _is_float(a) else a == b),
    "ne": _binary(lambda T, a, b: T.Or(a != b, T.isnan(a)) if _is_float(a) else a != b),
    "lt": _binary(lambda T, a, b: a < b),
    "le": _binary(lambda T, a, b: a <= b),
    "gt": _binary(lambda T, a, b: a > b),
    "ge": _binary(lambda T, a, b: a >= b),
    "logical_and": lambda T, a, attrs: T.And(_as_bool(T, a[0]), _as_bool(T, a[1])),
    "logical_or": lambda T, a, attrs: T.Or(_as_bool(T, a[0]), _as_bool(T, a[1])),
    "logical_not": lambda T, a, attrs: _not(T, _as_bool(T, a[0])),
    "where": _where,
    "cast": _cast,
    "identity": lambda T, a, attrs: a[0],
    "neg": lambda T, a, attrs: -a[0],
    "abs": lambda T, a, attrs: _abs(T, a[0]) if str(a[0].dtype) != "bool" else a[0],
    "scale": _unary(lambda T, x, at: _mul(T, x, _c(x, at["factor"]))),
    "reciprocal": _unary(lambda T, x, at: _c(x, 1.0) / x),
    "relu": _unary(lambda T, x, at: _at_least(T, x, _c(x, 0.0))),
    "leaky_relu": _unary(lambda T, x, at: T.Select(x > _c(x, 0.0), x, _mul(T, x, _c(x, at.get("alpha", 0.01))))),
    "elu": _unary(lambda T, x, at: T.Select(x > _c(x, 0.0), x, _c(x, at.get("alpha", 1.0)) * _expm1(T, x))),
    "gelu": _unary(_gelu),
    "silu": _unary(lambda T, x, at: x / (_c(x, 1.0) + T.exp(-x))),
    "sigmoid": _unary(lambda T, x, at: _c(x, 1.0) / (_c(x, 1.0) + T.exp(-x))),
    "hardsigmoid": _unary(lambda T, x, at: _clamp(
        T, x * _c(x, at.get("alpha", 1 / 6)) + _c(x, at.get("beta", 0.5)), {"min": 0.0, "max": 1.0})),
    "hardswish": _unary(lambda T, x, at: x * _clamp(T, x + _c(x, 3.0), {"min": 0.0, "max": 6.0}) / _c(x, 6.0)),
    "softplus": _unary(_softplus),
    "mish": _unary(lambda T, x, at: x * T.tanh(_softplus(T, x, {}))),
    "softsign": _unary(lambda T, x, at: x / (_c(x, 1.0) + _abs(T, x))),
    "clamp": _unary(_clamp),
    "tanh": _unary(lambda T, x, at: T.tanh(x)),
    "erf": _unary(lambda T, x, at: T.erf(x)),
    "erfinv": _unary(_erfinv),
    "exp": _unary(lambda T, x, at: T.exp(x)),
    "log": _unary(lambda T, x, at: T.log(x)),
    "sqrt": _unary(lambda T, x, at: T.sqrt(x)),
    "rsqrt": _unary(lambda T, x, at: T.rsqrt(x)),
    "sin": _unary(lambda T, x, at: T.sin(x)),
    "cos": _unary(lambda T, x, at: T.cos(x)),
    "tan": _unary(lambda T, x, at: T.tan(x)),
    "floor": _unary(lambda T, x, at: T.floor(x)),
    "ceil": _unary(lambda T, x, at: T.ceil(x)),
    # torch.round: half to even, as rint/nearbyint in the default rounding mode (C's round() goes away from zero)
    "round": lambda T, a, attrs: T.nearbyint(a[0]) if str(a[0].dtype) in _FLOAT_RANK else a[0],
    "sign": _unary(lambda T, x, at: T.Cast(str(x.dtype), x > _c(x, 0.0)) - T.Cast(str(x.dtype), x < _c(x, 0.0))),
    "isnan": lambda T, a, attrs: T.isnan(a[0]) if str(a[0].dtype) in _FLOAT_RANK else T.bool(False),
    "floor_divide": _binary(_floor_divide),
    "remainder": _binary(_remainder),
    "bitwise_and": _bitwise(lambda T, a, b: T.And(a, b), lambda T, a, b: T.bitwise_and(a, b)),
    "bitwise_or": _bitwise(lambda T, a, b: T.Or(a, b), lambda T, a, b: T.bitwise_or(a, b)),
    "bitwise_xor": _bitwise(lambda T, a, b: a != b, lambda T, a, b: T.bitwise_xor(a, b)),
    "bitwise_not": _bitwise(lambda T, a: _not(T, a), lambda T, a: T.bitwise_not(a)),
    "logical_xor": lambda T, a, attrs: _as_bool(T, a[0]) != _as_bool(T, a[1]),
    "masked_fill": _masked_fill,
}


def _fast_rcp(T, x):
    """1 / x by ``__fdividef`` (``rcp.approx`` and a multiply; 0 where |x| passes 2^126): a pure call the compilers may
    share and schedule, where TileLang's ``tl::fast_rcp`` is an ``asm volatile`` that nvcc must issue at every use and
    in order (LLaMA's gate GEMM with silu * up: 0.434 against 0.480 ms on the H200, bench/results/2026-12-04-h200-
    session29; its exact form 0.563)."""
    return T.call_pure_extern(str(x.dtype), "__fdividef", _c(x, 1.0), x)


def _fast_sigmoid(T, x):
    """1 / (1 + e^-x) by ``ex2.approx`` and ``rcp.approx`` (CUDA): a few instructions where ``expf`` and an IEEE
    division are some thirty, which made a GEMM's silu epilogue compute-bound. Relative error about 1e-6 for |x| < 80,
    far below a half-precision output's rounding (fp16 4.9e-4, bf16 2e-3); NaN stays NaN, +-inf give 1 and 0, and
    where e^-x passes 2^126 the result is 0 instead of a value below 1.2e-38."""
    return _fast_rcp(T, _c(x, 1.0) + T.__exp(-x))


def _fast_gelu_tanh(T, x):
    """GELU's tanh form, 0.5 x (1 + tanh(z)) = x sigmoid(2 z): tanhf gone from a GEMM's epilogue (GPT-2's fc1)."""
    z = _c(x, math.sqrt(2.0 / math.pi)) * (x + _c(x, 0.044715) * x * x * x)
    return x * _fast_sigmoid(T, _c(x, 2.0) * z)


# GELU exact to an fp16 output's rounding: x Phi(x), Phi(-t) = exp(P(t)) for t = |x| and Phi(x) = 1 - Phi(-x) for
# x > 0. P, degree 7, fitted to log Phi(-t) (torch.special.log_ndtr, float64) on [0, 5.7], minimax by reweighted least
# squares: within 3.2e-6 there. Past 5.7 GELU rounds in fp16 to x or to -0, and P, decreasing, keeps |x| exp(P(|x|))
# below fp16's half least subnormal up to 1e38 with no clamp or select; so only for a value rounded straight to fp16
# (``ROUNDED_EMITTERS``: multiplied first, the tail's error could show). Relative error 6.7e-6 wherever GELU is an fp16
# value; 0.1-0.2% of fp16 outputs round otherwise than exact GELU's (eager's fp32 erf formula: 3.4-11%). Some 15 SASS
# instructions an element over a bias epilogue's, one MUFU ex2, against erff's 28 (bench/proto_gemm_ws.py).
LOGPHI = (-0.6931439638137817, -0.7979854345321655, -0.3177870810031891, -0.03739707171916962, 0.005893937312066555,
          -0.0006439543794840574, 4.2538089473964646e-05, -1.2624366263480624e-06)
# A bf16 output's: bf16 reaches GELU's tail down to t = 13.5 (its least subnormal), so P, degree 9, is fitted on
# [0, 13.5] the same way: within 2.5e-5 there (6.8e-5 in float32's Horner steps), a bf16 rounding's 1/30; decreasing
# past it (exp(P) below 1e-41: ex2.approx flushes it to 0, as eager's 1 + erf has cancelled to 0 since t = 5.7).
# Its GPU numerics (bench/run_pending_h200.sh part 47: every schedule, tails, NaN/Inf rows) passed on the H100,
# 2026-12-06; a ws GEMM's code with it is 43.5 KB against erff's 58.8 KB (fp16's 39.9; bench/results/
# 2026-12-06-h100-session42).
LOGPHI_BF16 = (-0.6931722164154053, -0.7977438569068909, -0.3181263506412506, -0.0373055599629879,
               0.005969085264950991, -0.0006988918175920844, 5.680631147697568e-05, -3.0031671940378146e-06,
               9.225842489968272e-08, -1.2446171870905687e-09)


def logpoly_gelu(x, *, c, absolute, exp, select, bind, coefficients=LOGPHI):
    """GELU by ``coefficients`` (``LOGPHI``, ``LOGPHI_BF16``) over any arithmetic: ``c`` a float32 constant,
    ``select(cond, a, b)``, ``bind(value, body)`` (the value computed once). The TIR form (``_gelu_logpoly``) and the
    tests' torch replica are this code."""
    def phi_neg(t):  # Phi(-|x|) = exp(P(|x|)), Horner's rule
        p = c(coefficients[-1])
        for k in reversed(coefficients[:-1]):
            p = p * t + c(k)
        return exp(p)
    return bind(phi_neg(absolute(x)), lambda q: x * select(x < c(0.0), q, c(1.0) - q))


def let(T, value, body):
    """``body(v)`` with ``v`` bound to ``value`` by a TIR ``Let``: a value used more than once computed once (nvcc did
    not share repeated uses of one expression, docs/architecture.md)."""
    v = T.Var("v", str(value.dtype))
    return T.Let(body(v), where={v: value})


def _gelu_logpoly(T, x, coefficients=LOGPHI):
    def bind(value, body):
        return let(T, value, body)
    return bind(x, lambda x: bind(T.abs(x), lambda t: logpoly_gelu(
        x, c=lambda v: T.FloatImm("float32", v), absolute=lambda _: t, exp=T.__exp, select=T.Select, bind=bind,
        coefficients=coefficients)))


def rounded_gelu(coefficients):
    """The exact GELU's form by ``coefficients`` where it applies (float32 arithmetic), GELU's fast forms elsewhere."""
    return lambda T, a, at: _gelu_logpoly(T, a[0], coefficients) \
        if at.get("approximate", "none") == "none" and str(a[0].dtype) == "float32" else FAST_EMITTERS["gelu"](T, a, at)


# The fast forms of some emitters, for a template to ask for (``Env.fast``) where its output is fp16/bf16 on CUDA:
# torch's values to within the output's rounding, NaN and +-inf as torch gives them (silu(-inf) = -inf * 0 = NaN).
# The exact GELU keeps erff: a form by erfc's Chebyshev fit (bench/proto_gemm_ws.py, "gelu=erfc") measured even with
# it on the H200 (MLP's fc1 1.3% faster, BERT's 1.4-3% slower).
FAST_EMITTERS: dict[str, Callable] = {
    "silu": _unary(lambda T, x, at: x * _fast_sigmoid(T, x)),
    "sigmoid": _unary(lambda T, x, at: _fast_sigmoid(T, x)),
    "gelu": _unary(lambda T, x, at: _fast_gelu_tanh(T, x) if at.get("approximate") == "tanh" else _gelu(T, x, at)),
}
# Forms exact to one output dtype's rounding only, for an epilogue's root whose value is rounded straight to that
# dtype (``expr.emit_rounded``); otherwise the fast form.
ROUNDED_EMITTERS: dict[str, dict[str, Callable]] = {
    "float16": {"gelu": rounded_gelu(LOGPHI)},
    "bfloat16": {"gelu": rounded_gelu(LOGPHI_BF16)},
}

"""Float constants a C kernel reads exactly: TVM's C code generator prints a ``float32`` constant with
seven significant digits, which is not enough to name every float.

Note: ``math.log(16)`` became ``2.772589e+00f`` in the C source, one ulp from the float torch uses
(``2.7725887f``), so ``x / math.log(16)`` was one ulp off. That alone is below any tolerance, but
T5's relative-position buckets truncate such a quotient to an integer: ``log(16 / 8) / log(16) * 8``
came out 1.9999999 and bucket 1 instead of 2, a different bias row, and a relative error of 5e-3 in
the encoder's output. Every template and expression emitter writes constants (scales, epsilons, GELU
coefficients, finfo.min masks), so the fix is one rewrite of the finished PrimFunc, applied before
compiling for a CPU target: a ``float32`` constant that seven significant digits do not round-trip
becomes ``reinterpret(uint32 bits)``, which the C source spells as an integer, exactly. Constants
that print exactly (0, 1, 0.5, 1e-05 rounded...) and the infinities are left as they are, so the
code stays readable and TVM's simplifier still folds them. CUDA prints constants with enough
digits (``kernel_source`` on sm_90a shows ``2.7725887e+00f``) and is not rewritten.
"""

from __future__ import annotations

import math
import struct


def _bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def prints_exactly(value: float) -> bool:
    """Whether TVM's ``%e``-style print of the float32 ``value`` (seven significant digits) parses back to it."""
    if not math.isfinite(value):
        return True
    f = _f32(value)
    return _f32(float(f"{f:.6e}")) == f


def exact_float_constants(func):
    """``func`` (a ``tir.PrimFunc``) with each float32 constant that would print inexactly replaced by a
    reinterpretation of its bits; the function itself when it has none."""
    import tilelang  # noqa: F401  (puts TileLang's TVM on the path)
    from tvm import tirx as tir

    changed = []

    def post(node):
        if not isinstance(node, tir.FloatImm) or str(node.dtype) != "float32" or prints_exactly(node.value):
            return None
        changed.append(node)
        return tir.reinterpret("float32", tir.const(_bits(_f32(node.value)), "uint32"))

    body = tir.stmt_functor.ir_transform(func.body, None, post, ["ir.FloatImm"])
    return func.with_body(body) if changed else func

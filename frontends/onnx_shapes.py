"""Partial values of shape tensors: what the importer knows about small int tensors computed at run time.

Note: exported models compute target shapes at run time (``Shape -> Gather -> Concat -> Reshape``).
With symbolic input dims such a tensor is not a constant, yet most of its elements are known: ints,
or symbols such as ``"batch"``. ``propagate`` follows those elements through the registry ops that
shape arithmetic uses, so that Reshape / Expand / ConstantOfShape get precise output types (``[batch,
seq, 32]`` rather than three unknown dims). An element is an int, a symbol name, or ``None``
(unknown). Pure functions; the importer keeps the table.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from tilefuse.ir import Dim, TensorType

Elements = tuple[Dim | None, ...]
MAX_ELEMENTS = 64  # only small (shape-like) tensors are followed


def _same(vals, types, attrs):
    return vals[0]


def _shape_of(vals, types, attrs):
    shape = types[0].shape
    return None if shape is None else tuple(shape[attrs.get("start", 0):attrs.get("end")])


def _concat(vals, types, attrs):
    out: list = []
    for v, t in zip(vals, types):
        if v is None:  # unknown elements, but a known count
            if t is None or t.shape is None or len(t.shape) != 1 or not isinstance(t.shape[0], int):
                return None
            v = (None,) * t.shape[0]
        out += v
    return tuple(out)


def _index_select(vals, types, attrs):
    data, index = vals
    if data is None or index is None or any(not isinstance(i, int) for i in index):
        return None
    n = len(data)
    return tuple(data[i % n] if -n <= i < n else None for i in index)


def _slice(vals, types, attrs):
    return None if vals[0] is None else vals[0][attrs.get("start"):attrs.get("end"):attrs.get("step", 1)]


def _arith(fn: Callable[[int, int], int]):
    def rule(vals, types, attrs):
        a, b = vals
        if a is None or b is None:
            return None
        if len(a) == 1 and len(b) > 1:
            a = a * len(b)
        if len(b) == 1 and len(a) > 1:
            b = b * len(a)
        return tuple(fn(x, y) if isinstance(x, int) and isinstance(y, int) and not (fn is _div and y == 0) else
                     _symbolic(fn, x, y) for x, y in zip(a, b))
    return rule


def _mul(x: int, y: int) -> int:
    return x * y


def _symbolic(fn, x, y):
    """x (op) y where one side is a symbol: only the identities (s*1, s+0, s-0, s/1) stay known."""
    if fn is _mul and (x == 1 or y == 1):
        return y if x == 1 else x
    if fn in (_add, _sub) and y == 0:
        return x
    if fn is _add and x == 0:
        return y
    if fn is _div and y == 1:
        return x
    return None


def _add(x: int, y: int) -> int:
    return x + y


def _sub(x: int, y: int) -> int:
    return x - y


def _div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


RULES: dict[str, Callable[[Sequence[Elements | None], Sequence[TensorType | None], dict], Elements | None]] = {
    "shape_of": _shape_of, "concat": _concat, "index_select": _index_select, "slice": _slice,
    "identity": _same, "squeeze": _same, "unsqueeze": _same, "reshape": _same, "cast": _same,
    "mul": _arith(_mul), "add": _arith(_add), "sub": _arith(_sub), "trunc_divide": _arith(_div),
}


def propagate(op: str, vals: Sequence[Elements | None], types: Sequence[TensorType | None],
              attrs: dict[str, Any], out: TensorType) -> Elements | None:
    """The known elements of ``op``'s (single) output, given those of its inputs (None: unknown)."""
    rule = RULES.get(op)
    if rule is None or out.shape is None or len(out.shape) > 1 or not out.dtype.startswith("int"):
        return None
    if op == "cast" and not types[0].dtype.startswith("int"):
        return None
    try:
        result = rule(vals, types, attrs)
    except (TypeError, IndexError, ValueError):
        return None
    if result is None or len(result) > MAX_ELEMENTS or all(e is None for e in result):
        return None
    return tuple(result)


def resolve_reshape(elements: Elements, shape: tuple | None, allowzero: int) -> tuple[Dim, ...]:
    """Output dims of ONNX Reshape to a partially known target (unknown dims as ``"?"``); a -1 is
    solved when the input dims divide by the others (symbols cancel: [b, 3, 4] -> [b, -1] is [b, 12])."""
    dims: list[Dim] = []
    for i, e in enumerate(elements):
        if e == 0 and not allowzero:
            e = shape[i] if shape is not None and i < len(shape) else None
        dims.append("?" if e is None else e)
    if -1 in dims and shape is not None and "?" not in dims:
        others = [d for d in dims if d != -1]
        num, den = Counter(d for d in shape if isinstance(d, str)), Counter(d for d in others if isinstance(d, str))
        top, bottom = math.prod(d for d in shape if isinstance(d, int)), math.prod(d for d in others if isinstance(d, int))
        left = num - den
        solved: Dim | None = None
        if not den - num and bottom and top % bottom == 0:
            ratio = top // bottom
            solved = ratio if not left else next(iter(left)) if ratio == 1 and sum(left.values()) == 1 else None
        dims[dims.index(-1)] = "?" if solved is None else solved
    return tuple("?" if d == -1 else d for d in dims)

"""The ONNX converter table, part 1: elementwise math, casts, shapes and data movement (``onnx.CONVERTERS``
merges it with ``onnx_nn``).

Note: ``CONVERTERS`` maps an ONNX op type to a function ``(ctx, node) -> [output value names]``;
the many 1:1 ops are one-liners built by ``_unary``/``_binary``. An input that ONNX passes as a
tensor but that is static in practice (Reshape's shape, Slice's starts, axes...) becomes an attribute
when it is a constant and a runtime-tensor op otherwise. ``OLDEST`` names, per op, the oldest op
version the converter understands (default 7, where numpy broadcasting began); an older version is
expanded through its ONNX function or refused.
"""

from __future__ import annotations

import math

import torch

from tilefuse.frontends.onnx_context import (
    FOLD_LIMIT,
    WIDE,
    Converter,
    Ctx,
    OnnxNode,
    Unsupported,
    axis_of,
    const_input,
    dim_in,
    ints,
    runtime,
)
from tilefuse.frontends.onnx_shapes import resolve_reshape
from tilefuse.frontends.onnx_tensors import onnx_dtype
from tilefuse.ir import TensorType

# ---- helpers ------------------------------------------------------------------------------------

def binary(ctx: Ctx, op: str, a: str, b: str) -> str:
    if ctx.dtype(a) in WIDE:
        return ctx.add1("wide_binary", [a, b], fn=op)
    return ctx.add1(op, [a, b])


def _unary(op: str, **defaults):
    """A 1:1 unary op; ``defaults`` maps registry attr -> (ONNX attr, ONNX default)."""
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        attrs = {k: n.attr(onnx_name, d) for k, (onnx_name, d) in defaults.items()}
        x = ctx.inp(n, 0)
        if ctx.dtype(x) in WIDE:
            return [ctx.cast(ctx.add1(op, [ctx.cast(x, "int64")], **attrs), ctx.dtype(x))]
        return ctx.add(op, [x], **attrs)
    return conv


def _binary(op: str):
    return lambda ctx, n: [binary(ctx, op, ctx.inp(n, 0), ctx.inp(n, 1))]


def _variadic(op: str):
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        names = [ctx.inp(n, i) for i in range(len(n.inputs))]
        out = names[0]
        for other in names[1:]:
            out = binary(ctx, op, out, other)
        return [out if len(names) > 1 else ctx.add1("identity", [out])]
    return conv


def identity(ctx: Ctx, n: OnnxNode) -> list[str]:
    return [ctx.inp(n, 0)]


# ---- elementwise --------------------------------------------------------------------------------

def div(ctx: Ctx, n: OnnxNode) -> list[str]:
    a, b = ctx.inp(n, 0), ctx.inp(n, 1)
    floating = torch.empty(0, dtype=getattr(torch, ctx.dtype(a))).is_floating_point()
    return [binary(ctx, "div" if floating else "trunc_divide", a, b)]


def pow_(ctx: Ctx, n: OnnxNode) -> list[str]:
    a = ctx.inp(n, 0)
    return [ctx.cast(ctx.add1("pow", [a, ctx.inp(n, 1)]), ctx.dtype(a))]


def mean(ctx: Ctx, n: OnnxNode) -> list[str]:
    (total,) = _variadic("add")(ctx, n)
    return [ctx.add1("div", [total, ctx.scalar(len(n.inputs), ctx.dtype(total))])]


def mod(ctx: Ctx, n: OnnxNode) -> list[str]:
    return [binary(ctx, "fmod" if n.attr("fmod", 0) else "remainder", ctx.inp(n, 0), ctx.inp(n, 1))]


def clip(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if n.version < 11:
        lo, hi = n.attr("min"), n.attr("max")
        return ctx.add("clamp", [x], min=lo, max=hi) if (lo, hi) != (None, None) else [ctx.add1("identity", [x])]
    lo, hi = ctx.inp(n, 1), ctx.inp(n, 2)
    if all(v == "" or ctx.const(v) is not None for v in (lo, hi)):
        integral = not ctx.dtype(x).startswith(("float", "bfloat"))
        conv = int if integral else float
        bound = {k: conv(ctx.const(v).item()) if v else None for k, v in (("min", lo), ("max", hi))}
        if bound == {"min": None, "max": None}:
            return [ctx.add1("identity", [x])]
        if ctx.dtype(x) in WIDE:
            return [ctx.cast(ctx.add1("clamp", [ctx.cast(x, "int64")], **bound), ctx.dtype(x))]
        return ctx.add("clamp", [x], **bound)
    return ctx.add("clamp_tensor", [x, lo, hi])


def prelu(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, slope = ctx.inp(n, 0), ctx.inp(n, 1)
    neg = ctx.add1("lt", [x, ctx.scalar(0, ctx.dtype(x))])
    return ctx.add("where", [neg, ctx.add1("mul", [x, slope]), x])


def is_inf(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    neg, pos = n.attr("detect_negative", 1), n.attr("detect_positive", 1)
    if neg and pos:
        return ctx.add("isinf", [x])
    if not (neg or pos):  # always false: an inf is never a nan
        return ctx.add("logical_and", [ctx.add1("isinf", [x]), ctx.add1("isnan", [x])])
    return ctx.add("eq", [x, ctx.scalar(math.inf if pos else -math.inf, ctx.dtype(x))])


def cast_to(ctx: Ctx, x: str, dtype: str, saturate: int = 1) -> str:
    if dtype.startswith("float8") and ctx.dtype(x).startswith(("float", "bfloat")):
        return ctx.add1("cast_float8", [x], dtype=dtype, saturate=bool(saturate))
    return ctx.cast(x, dtype) if ctx.dtype(x) != dtype else ctx.add1("identity", [x])


def cast(ctx: Ctx, n: OnnxNode) -> list[str]:
    return [cast_to(ctx, ctx.inp(n, 0), onnx_dtype(n.attr("to")), n.attr("saturate", 1))]


def cast_like(ctx: Ctx, n: OnnxNode) -> list[str]:
    return [cast_to(ctx, ctx.inp(n, 0), ctx.dtype(ctx.inp(n, 1)), n.attr("saturate", 1))]


# ---- shapes -------------------------------------------------------------------------------------

def constant(ctx: Ctx, n: OnnxNode) -> list[str]:
    a = n.attrs
    if "value" in a:
        return [ctx.constant(a["value"], n.outputs[0])]
    for key, dtype in (("value_float", torch.float32), ("value_floats", torch.float32),
                       ("value_int", torch.int64), ("value_ints", torch.int64)):
        if key in a:
            return [ctx.constant(torch.tensor(a[key], dtype=dtype), n.outputs[0])]
    raise Unsupported(f"Constant with {sorted(a)} (strings and sparse tensors are not supported)")


def shape(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    start, end = n.attr("start", 0), n.attr("end")
    dims = ctx.shape(x)
    if dims is not None and all(isinstance(d, int) for d in dims[start:end]):
        return [ctx.constant(torch.tensor(dims[start:end], dtype=torch.int64), "shape")]
    return ctx.add("shape_of", [x], start=start, end=end)


def size(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    t = ctx.type(x)
    if t.is_static:
        return [ctx.constant(torch.tensor(t.numel, dtype=torch.int64), "size")]
    return ctx.add("numel", [x])


def reshape(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, s = ctx.inp(n, 0), ctx.inp(n, 1)
    allowzero = n.attr("allowzero", 0)
    target = ctx.const(s)
    if target is None:  # the rank is the length of the shape tensor, the dims what is known of it
        length, elements = (ctx.shape(s) or (None,))[0], ctx.known(s)
        if elements is None and isinstance(length, int):
            elements = (None,) * length
        types = None if elements is None else [TensorType(resolve_reshape(elements, ctx.shape(x), allowzero),
                                                          ctx.dtype(x))]
        return ctx.add("reshape_dynamic", [x, s], types=types, allowzero=allowzero)
    dims = [int(d) for d in target.tolist()]
    xs = ctx.shape(x) or ()
    if not allowzero:
        dims = [xs[i] if d == 0 and i < len(xs) else d for i, d in enumerate(dims)]
    if any(isinstance(d, str) for d in dims):  # keep what is known; 0 copies a symbolic dim at run time
        types = [TensorType(tuple(d if d != -1 else "?" for d in dims), ctx.dtype(x))]
        return ctx.add("reshape_dynamic", [x, s], types=types, allowzero=allowzero)
    t = ctx.type(x)
    if t.is_static and dims.count(-1) == 1 and 0 not in dims:  # resolve -1: static attrs for the planner
        dims[dims.index(-1)] = t.numel // -math.prod(dims)
    return ctx.add("reshape", [x], shape=tuple(dims))


def flatten(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    axis = dim_in(n.attr("axis", 1), ctx.rank(x), repr(x), upto_rank=True)  # (the rank itself: one row of all)
    t = ctx.type(x)
    if t.is_static:
        return ctx.add("reshape", [x], shape=(math.prod(t.shape[:axis]), math.prod(t.shape[axis:])))
    return ctx.add("flatten2d", [x], axis=axis)


def transpose(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    perm = n.attr("perm") or list(reversed(range(ctx.rank(x))))
    return ctx.add("permute", [x], perm=tuple(perm))


def squeeze(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if runtime(ctx, n, 1):
        return ctx.add("squeeze_dynamic", [x, ctx.inp(n, 1)])
    axes = ints(ctx, n, 1, "axes")
    if axes is None:
        dims = ctx.static_shape(x, "Squeeze without axes")
        axes = [i for i, d in enumerate(dims) if d == 1]
    return ctx.add("squeeze", [x], dims=tuple(axis_of(ctx, x, a) for a in axes))


def unsqueeze(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if runtime(ctx, n, 1):
        return ctx.add("unsqueeze_dynamic", [x, ctx.inp(n, 1)])
    axes = ints(ctx, n, 1, "axes")
    rank = ctx.rank(x) + len(axes)
    return ctx.add("unsqueeze", [x], dims=tuple(sorted(dim_in(a, rank, 'the output') for a in axes)))


def concat(ctx: Ctx, n: OnnxNode) -> list[str]:
    xs = [ctx.inp(n, i) for i in range(len(n.inputs)) if n.inputs[i]]
    return ctx.add("concat", xs, dim=axis_of(ctx, xs[0], n.attr("axis")))


def split(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    axis = axis_of(ctx, x, n.attr("axis", 0))
    if runtime(ctx, n, 1):
        return ctx.add("split_dynamic", [x, ctx.inp(n, 1)], dim=axis, num_outputs=len(n.outputs))
    sizes = ints(ctx, n, 1, "split")
    if sizes is None:
        dim = ctx.shape(x)[axis]
        if not isinstance(dim, int):
            raise Unsupported(f"Split of the symbolic dim {dim!r} without sizes")
        parts = n.attr("num_outputs", len(n.outputs))
        chunk = -(-dim // parts)
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
        if n.attr("num_outputs") is None and dim % parts:
            raise ValueError(f"Split of dim {dim} into {parts} equal parts")
    return ctx.add("split", [x], dim=axis, sizes=tuple(sizes))


def slice_(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    try:
        starts, ends = ints(ctx, n, 1, "starts"), ints(ctx, n, 2, "ends")
        axes, steps = ints(ctx, n, 3, "axes"), ints(ctx, n, 4)
    except Unsupported:
        inputs = [ctx.inp(n, i) for i in range(1, 5)]
        return ctx.add("slice_dynamic", [x, *[ctx.cast(i, "int64") if i else "" for i in inputs]])
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    dims = ctx.shape(x)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = axis_of(ctx, x, a)
        if not isinstance(dims[a], int):
            if not (s in (0, -(2**63)) and e >= 2**31 - 1 and st == 1):  # not the whole axis
                sl = lambda v: ctx.constant(torch.tensor([v], dtype=torch.int64))
                x = ctx.add1("slice_dynamic", [x, sl(s), sl(e), sl(a), sl(st)])
        elif st > 0:
            x = ctx.add1("slice", [x], dim=a, start=s, end=e, step=st)
        else:
            x = ctx.add1("onnx_slice", [x], dim=a, start=s, end=e, step=st)
    return [x]


def gather(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    return ctx.add("index_select", [x, ctx.inp(n, 1)], dim=axis_of(ctx, x, n.attr("axis", 0)))


def gather_elements(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    return ctx.add("gather_elements", [x, ctx.inp(n, 1)], dim=axis_of(ctx, x, n.attr("axis", 0)))


def scatter_elements(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    return ctx.add("scatter_elements", [x, ctx.inp(n, 1), ctx.inp(n, 2)], dim=axis_of(ctx, x, n.attr("axis", 0)),
                   reduction=n.attr("reduction", "none"))


def tile(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, r = ctx.inp(n, 0), ctx.inp(n, 1)
    reps = ctx.const(r)
    if reps is None:
        return ctx.add("tile_dynamic", [x, r])
    return ctx.add("repeat", [x], repeats=tuple(int(v) for v in reps.tolist()))


def expand(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, s = ctx.inp(n, 0), ctx.inp(n, 1)
    target = ctx.const(s)
    xs = ctx.shape(x)
    if target is None or xs is None:
        elements = ctx.known(s)
        types = None if elements is None or xs is None else [TensorType(broadcast_dims(xs, elements), ctx.dtype(x))]
        return ctx.add("expand_dynamic", [x, s], types=types)
    want = [int(d) for d in target.tolist()]
    rank = max(len(want), len(xs))
    want = [1] * (rank - len(want)) + want
    have = [1] * (rank - len(xs)) + list(xs)
    out = []
    for i, (h, w) in enumerate(zip(have, want)):
        if w == 1:
            out.append(h if isinstance(h, int) else -1)
        elif h == 1 or h == w or isinstance(h, str):
            out.append(w)
        else:
            raise ValueError(f"cannot expand dim {i} of size {h} to {w}")
    if any(d == -1 for d in out[: rank - len(xs)]):
        return ctx.add("expand_dynamic", [x, s])
    return ctx.add("expand", [x], shape=tuple(out))


def broadcast_dims(have: tuple, want: tuple) -> tuple:
    """ONNX Expand's output dims from the input dims and the partially known target (``"?"``: unknown)."""
    rank = max(len(have), len(want))
    have = (1,) * (rank - len(have)) + tuple(have)
    want = (1,) * (rank - len(want)) + tuple(want)
    out = []
    for h, w in zip(have, want):
        if w is None:
            out.append(h if isinstance(h, int) and h > 1 else "?")
        elif w == 1 or h == w:
            out.append(h)
        elif h == 1:
            out.append(w)
        else:
            out.append(w if isinstance(w, int) else h if isinstance(h, int) else "?")
    return tuple(out)


def constant_of_shape(ctx: Ctx, n: OnnxNode) -> list[str]:
    value = n.attr("value")
    v = value.reshape(-1)[0].item() if value is not None else 0.0
    dtype = str(value.dtype).removeprefix("torch.") if value is not None else "float32"
    s = ctx.inp(n, 0)
    dims = ctx.const(s)
    if dims is None:
        elements = ctx.known(s)
        types = None if elements is None else [TensorType(tuple("?" if e is None else e for e in elements), dtype)]
        return ctx.add("constant_of_shape", [s], types=types, value=v, dtype=dtype)
    return ctx.add("full", [], shape=tuple(int(d) for d in dims.tolist()), value=v, dtype=dtype)


def range_(ctx: Ctx, n: OnnxNode) -> list[str]:
    ins = [ctx.inp(n, i) for i in range(3)]
    vals = [ctx.const(i) for i in ins]
    if all(v is not None for v in vals):
        start, limit, delta = (v.item() for v in vals)
        if delta == 0 or math.ceil((limit - start) / delta) > FOLD_LIMIT:  # the runtime computes (or reports) it
            return ctx.b.add("range_dynamic", ins, out_types=[TensorType((f"{n.outputs[0]}_len",), ctx.dtype(ins[0]))])
    return ctx.add("range_dynamic", ins)


def eye_like(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    rows, cols = ctx.static_shape(x, "EyeLike")
    dtype = onnx_dtype(n.attr("dtype")) if n.attr("dtype") is not None else ctx.dtype(x)
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    return [ctx.constant((j - i == n.attr("k", 0)).to(getattr(torch, dtype)), "eye")]


def trilu(ctx: Ctx, n: OnnxNode) -> list[str]:
    if runtime(ctx, n, 1):
        return ctx.add("trilu_dynamic", [ctx.inp(n, 0), ctx.inp(n, 1)], upper=bool(n.attr("upper", 1)))
    k = ints(ctx, n, 1)
    return ctx.add("triu" if n.attr("upper", 1) else "tril", [ctx.inp(n, 0)], diagonal=k[0] if k else 0)


def cumsum(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if runtime(ctx, n, 1):
        return ctx.add("cum_dynamic", [x, ctx.inp(n, 1)], kind="sum", exclusive=n.attr("exclusive", 0),
                       reverse=n.attr("reverse", 0))
    (axis,) = ints(ctx, n, 1)
    out = ctx.add1("cumsum", [ctx.cast(x, "int64") if ctx.dtype(x) in WIDE else x], dim=axis_of(ctx, x, axis),
                   exclusive=n.attr("exclusive", 0), reverse=n.attr("reverse", 0))
    return [ctx.cast(out, ctx.dtype(x))]


def cumprod(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if runtime(ctx, n, 1):
        return ctx.add("cum_dynamic", [x, ctx.inp(n, 1)], kind="prod", exclusive=n.attr("exclusive", 0),
                       reverse=n.attr("reverse", 0))
    (axis,) = ints(ctx, n, 1)
    return ctx.add("cumprod", [x], dim=axis_of(ctx, x, axis), exclusive=n.attr("exclusive", 0),
                   reverse=n.attr("reverse", 0))


def topk(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if runtime(ctx, n, 1):
        return ctx.add("topk_dynamic", [x, ctx.inp(n, 1)], dim=axis_of(ctx, x, n.attr("axis", -1)),
                       largest=bool(n.attr("largest", 1)))
    (k,) = ints(ctx, n, 1)
    return ctx.add("topk_stable", [x], k=k, dim=axis_of(ctx, x, n.attr("axis", -1)),
                   largest=bool(n.attr("largest", 1)))


def one_hot(ctx: Ctx, n: OnnxNode) -> list[str]:
    depth = const_input(ctx, n, 1)
    if depth is None:
        return ctx.add("one_hot_dynamic", [ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)], axis=n.attr("axis", -1))
    return ctx.add("one_hot", [ctx.inp(n, 0), ctx.inp(n, 2)], depth=int(depth.reshape(-1)[0].item()),
                   axis=n.attr("axis", -1))


def space_to_depth(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    b, (N, C, H, W) = n.attr("blocksize"), ctx.static_shape(x, "SpaceToDepth")
    perm = (0, 1, 3, 5, 2, 4) if n.attr("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = ctx.add1("reshape", [x], shape=(N, C, H // b, b, W // b, b))
    y = ctx.add1("permute", [y], perm=perm)
    return ctx.add("reshape", [y], shape=(N, C * b * b, H // b, W // b))


def depth_to_space(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    b, (N, C, H, W) = n.attr("blocksize"), ctx.static_shape(x, "DepthToSpace")
    if n.attr("mode", "DCR") == "CRD":
        y = ctx.add1("reshape", [x], shape=(N, C // (b * b), b, b, H, W))
        y = ctx.add1("permute", [y], perm=(0, 1, 4, 2, 5, 3))
    else:
        y = ctx.add1("reshape", [x], shape=(N, b, b, C // (b * b), H, W))
        y = ctx.add1("permute", [y], perm=(0, 3, 4, 1, 5, 2))
    return ctx.add("reshape", [y], shape=(N, C // (b * b), H * b, W * b))


def dropout(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    training, ratio = const_input(ctx, n, 2), const_input(ctx, n, 1)
    no_drop = ratio is not None and float(ratio.item()) == 0.0
    if n.has_input(2) and (training is None or bool(training.item())) and not no_drop:
        raise Unsupported("Dropout in training mode (random) is not supported")
    outs = [ctx.add1("identity", [x])]
    if len(n.outputs) > 1 and n.outputs[1]:
        outs.append(ctx.constant(torch.ones(ctx.static_shape(x, "Dropout mask"), dtype=torch.bool), "mask"))
    return outs


def einsum(ctx: Ctx, n: OnnxNode) -> list[str]:
    return ctx.add("einsum", [ctx.inp(n, i) for i in range(len(n.inputs))], equation=n.attr("equation").replace(" ", ""))


def compress(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    axis = n.attr("axis")
    return ctx.add("compress", [x, ctx.inp(n, 1)], axis=None if axis is None else axis_of(ctx, x, axis))


def reverse_sequence(ctx: Ctx, n: OnnxNode) -> list[str]:
    return ctx.add("reverse_sequence", [ctx.inp(n, 0), ctx.inp(n, 1)], batch_axis=n.attr("batch_axis", 1),
                   time_axis=n.attr("time_axis", 0))


def pad(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    rank = ctx.rank(x)
    mode = {"edge": "replicate", "wrap": "circular"}.get(n.attr("mode", "constant"), n.attr("mode", "constant"))
    if n.version < 11:
        pads, value = list(n.attr("pads")), n.attr("value", 0.0)
    elif any(runtime(ctx, n, i) for i in (1, 2, 3)):
        inputs = [x, ctx.cast(ctx.inp(n, 1), "int64"), ctx.inp(n, 2), ctx.inp(n, 3)]
        return ctx.add("pad_dynamic", inputs, mode=mode)
    else:
        pads = ints(ctx, n, 1)
        v = const_input(ctx, n, 2)
        value = v.reshape(-1)[0].item() if v is not None and v.numel() else 0
    axes = [dim_in(a, rank, repr(x)) for a in (ints(ctx, n, 3) or range(rank))]
    per = {a: (pads[i], pads[len(axes) + i]) for i, a in enumerate(axes)}
    torch_pads = [p for a in reversed(range(rank)) for p in per.get(a, (0, 0))]
    while torch_pads[-2:] == [0, 0] and len(torch_pads) > 2:
        torch_pads = torch_pads[:-2]
    if mode == "constant":
        return ctx.add("pad", [x], pads=tuple(torch_pads), mode=mode, value=value)
    return ctx.add("pad_nd", [x], pads=tuple(torch_pads), mode=mode)


_UNARY = {
    "Abs": "abs", "Acos": "acos", "Acosh": "acosh", "Asin": "asin", "Asinh": "asinh", "Atan": "atan",
    "Atanh": "atanh", "Ceil": "ceil", "Cos": "cos", "Cosh": "cosh", "Erf": "erf", "Exp": "exp", "Floor": "floor",
    "IsNaN": "isnan", "Log": "log", "Neg": "neg", "Not": "logical_not", "BitwiseNot": "bitwise_not",
    "Reciprocal": "reciprocal", "Relu": "relu", "Round": "round", "Sigmoid": "sigmoid", "Sign": "sign",
    "Sin": "sin", "Sinh": "sinh", "Softsign": "softsign", "Sqrt": "sqrt", "Tan": "tan", "Tanh": "tanh",
    "Mish": "mish", "Softplus": "softplus", "HardSwish": "hardswish", "Det": "det",
}
_WIDE_UNARY = {"Abs", "Neg", "Sign", "BitwiseNot", "Relu"}
_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt",
    "GreaterOrEqual": "ge", "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
}

CONVERTERS: dict[str, Converter] = {
    **{k: _unary(v) for k, v in _UNARY.items()},
    **{k: _binary(v) for k, v in _BINARY.items()},
    "Div": div, "Pow": pow_, "Mod": mod, "Max": _variadic("maximum"), "Min": _variadic("minimum"),
    "Sum": _variadic("add"), "Mean": mean, "Clip": clip, "PRelu": prelu, "IsInf": is_inf,
    "Where": lambda ctx, n: ctx.add("where", [ctx.inp(n, i) for i in range(3)]),
    "BitShift": lambda ctx, n: ctx.add("bitshift", [ctx.inp(n, 0), ctx.inp(n, 1)], direction=n.attr("direction")),
    "Elu": _unary("elu", alpha=("alpha", 1.0)),
    "Celu": _unary("celu", alpha=("alpha", 1.0)),
    "Selu": _unary("selu", alpha=("alpha", 1.67326319217681884765625), gamma=("gamma", 1.05070102214813232421875)),
    "LeakyRelu": _unary("leaky_relu", alpha=("alpha", 0.01)),
    "HardSigmoid": _unary("hardsigmoid", alpha=("alpha", 0.2), beta=("beta", 0.5)),
    "ThresholdedRelu": _unary("thresholded_relu", alpha=("alpha", 1.0)),
    "Gelu": _unary("gelu", approximate=("approximate", "none")),
    "Shrink": _unary("shrink", bias=("bias", 0.0), lambd=("lambd", 0.5)),
    "Cast": cast, "CastLike": cast_like, "Identity": identity, "Constant": constant,
    "Shape": shape, "Size": size, "Reshape": reshape, "Flatten": flatten, "Transpose": transpose,
    "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Concat": concat, "Split": split, "Slice": slice_,
    "Gather": gather, "GatherElements": gather_elements,
    "GatherND": lambda ctx, n: ctx.add("gather_nd", [ctx.inp(n, 0), ctx.inp(n, 1)], batch_dims=n.attr("batch_dims", 0)),
    "ScatterElements": scatter_elements, "Scatter": scatter_elements,
    "ScatterND": lambda ctx, n: ctx.add("scatter_nd", [ctx.inp(n, i) for i in range(3)],
                                        reduction=n.attr("reduction", "none")),
    "Tile": tile, "Expand": expand, "ConstantOfShape": constant_of_shape, "EyeLike": eye_like,
    "Range": range_,
    "NonZero": lambda ctx, n: ctx.add("nonzero", [ctx.inp(n, 0)]),
    "Trilu": trilu, "CumSum": cumsum, "CumProd": cumprod, "TopK": topk, "OneHot": one_hot,
    "SpaceToDepth": space_to_depth, "DepthToSpace": depth_to_space, "Dropout": dropout, "Einsum": einsum,
    "Compress": compress, "ReverseSequence": reverse_sequence, "Pad": pad,
}

# The oldest op version each converter understands, where it is not 7.
OLDEST = {"Not": 1, "Identity": 1, "Constant": 1, "Shape": 1, "Size": 1, "Transpose": 1, "Flatten": 1,
          "Concat": 4, "Reshape": 5, "Squeeze": 1, "Unsqueeze": 1, "Split": 2, "Slice": 1, "Gather": 1,
          "Tile": 6, "Abs": 6, "Neg": 6, "Exp": 6, "Log": 6, "Sqrt": 6, "Reciprocal": 6, "Relu": 6, "Sigmoid": 6,
          "Tanh": 6, "Floor": 6, "Ceil": 6, "Clip": 6, "Elu": 6, "LeakyRelu": 6, "Selu": 6, "HardSigmoid": 6,
          "Softsign": 1, "Softplus": 1, "Pad": 2, "TopK": 10, "Max": 8, "Min": 8, "Sum": 8, "Mean": 8,
          "Cast": 6, "Dropout": 7}

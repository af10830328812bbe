"""The ATen -> registry converter table of the fx frontend, grouped by meaning.

A converter is ``fn(cx: Ctx, a: dict) -> outputs | None``: ``a`` holds the op's arguments by schema
name (tensors as value names, ``Tensor[]`` as lists of names, everything else as in the fx graph);
it returns the value name of a single-output op, a list with one entry per output of a multi-output
op (``None`` for an output it does not compute: a fallback supplies it if it is used), or ``None``
when it does not apply, which makes the node a ``torch_fallback``. Keys are overload packets
(``aten.add``: every overload) or single overloads (``aten.round.default``), looked up overload first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tilefuse.ir import torch_dtype

from .c10d_table import COLLECTIVES
from .fx_context import Ctx

aten = torch.ops.aten
Converter = Callable[[Ctx, dict], Any]
_INT_MAX = 2**63 - 1


# ---- helpers --------------------------------------------------------------------------------------

def _unary(name: str, **attrs: Any) -> Converter:
    return lambda cx, a: cx.op(name, a["self"], **attrs)


_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def _binary(name: str, x: str = "self", y: str = "other") -> Converter:
    return lambda cx, a: cx.op(name, *_operands(cx, a[x], a[y], consts=name in _COMPARISONS))


def _operands(cx: Ctx, x: Any, y: Any, consts: bool = False) -> tuple[str, str]:
    """``x`` and ``y`` as values, a tensor's cast to torch's promoted dtype where the two differ, as eager computes: a
    0-d float32 tensor against a float16 one is rounded to float16 first (a kernel subtracting it in float32 gave
    3.9e-5 where eager gives 0). A Python number's constant is cast only with ``consts`` (comparisons: eager compares
    in that dtype, so 3e38 against a float16 tensor is inf there); in arithmetic it stays the scalar it was."""
    lhs, rhs = cx.tensor(x, y), cx.tensor(y, x)
    tl, tr = cx.type(lhs), cx.type(rhs)
    if tl.dtype == tr.dtype or tl.shape is None or tr.shape is None:
        return lhs, rhs
    common = torch.result_type(torch.empty(tl.shape, dtype=torch_dtype(tl.dtype), device="meta"),
                               torch.empty(tr.shape, dtype=torch_dtype(tr.dtype), device="meta"))
    if consts:
        return _cast(cx, lhs, common), _cast(cx, rhs, common)

    def rounds(v: str) -> bool:  # (arithmetic: a value the result's dtype rounds; widening is the kernels' own)
        t = torch_dtype(cx.type(v).dtype)
        return common.is_floating_point and t != common and (common.itemsize <= t.itemsize if t.is_floating_point
                                                             else common.itemsize < 4)
    return tuple(_cast(cx, v, common) if isinstance(o, str) and rounds(v) else v for v, o in ((lhs, x), (rhs, y)))


def _alias(cx: Ctx, a: dict) -> str:
    return a["self"]


def _dims(dim: Any) -> tuple | None:
    """An ATen ``int[1]?`` dim list: ``None`` or empty means every dim."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return dims or None


def _cast(cx: Ctx, x: str, dtype: torch.dtype | None) -> str:
    if dtype is None or cx.type(x).dtype == str(dtype).removeprefix("torch."):
        return x
    return cx.op("cast", x, dtype=dtype)


def _ntuple(v: Any, n: int) -> tuple:
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * n if len(v) == 1 else v


def _transposed_weight(cx: Ctx, arg: str) -> str | None:
    """``W`` when argument ``arg`` is ``W.t()`` of a 2-D ``W`` (so ``x @ arg`` is ``linear(x, W)``)."""
    p = cx.producer(arg)
    if p is None or not isinstance(p.target, torch._ops.OpOverload):
        return None
    w = p.args[0] if p.args else None
    val = getattr(w, "meta", {}).get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or not isinstance(cx.value_of(w), str):
        return None
    packet, rest = p.target.overloadpacket, p.args[1:]
    if packet is aten.t or (packet is aten.transpose and sorted(d % 2 for d in rest) == [0, 1]) or \
            (packet is aten.permute and list(rest[0]) == [1, 0]):
        return cx.value_of(w)
    return None


# ---- pointwise ------------------------------------------------------------------------------------

_SAME_NAME_UNARY = ("relu", "sigmoid", "tanh", "erf", "exp", "log", "sqrt", "rsqrt", "neg", "abs", "reciprocal",
                    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
                    "floor", "ceil", "round", "sign", "silu", "mish", "logical_not", "bitwise_not", "isnan",
                    "isinf", "erfinv", "hardswish", "hardsigmoid")
_SAME_NAME_BINARY = ("mul", "maximum", "minimum", "remainder", "fmod", "atan2", "eq", "ne", "lt", "le", "gt", "ge",
                     "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor")


def _add_sub(name: str, swap: bool = False) -> Converter:
    """add/sub (``self op alpha*other``); ``swap`` gives rsub (``other - alpha*self``)."""
    def conv(cx: Ctx, a: dict) -> str:
        x, y, alpha = a["self"], a["other"], a.get("alpha", 1)
        if swap:
            x, y = y, x
        lhs, rhs = _operands(cx, x, y if isinstance(y, str) else y * alpha)  # (a number takes alpha here)
        if alpha != 1 and isinstance(y, str):  # (a tensor after its promotion, as eager scales it)
            rhs = cx.op("mul", rhs, cx.tensor(alpha, rhs))
        return cx.op(name, lhs, rhs)
    return conv


def _div(cx: Ctx, a: dict) -> str:
    op = {None: "div", "floor": "floor_divide", "trunc": "trunc_divide"}[a.get("rounding_mode")]
    return _binary(op)(cx, a)


def _where(cx: Ctx, a: dict) -> str:
    return cx.op("where", a["condition"], *_operands(cx, a["self"], a["other"]))


def _masked_fill(cx: Ctx, a: dict) -> str:
    x, value = a["self"], a["value"]
    if isinstance(value, str):  # a 0-d tensor value
        return cx.op("where", a["mask"], _cast(cx, value, cx.out_type().dtype), x)
    return cx.op("masked_fill", x, a["mask"], value=value)


def _clamp(cx: Ctx, a: dict, lo: str = "min", hi: str = "max") -> str:
    x, mn, mx = a["self"], a.get(lo), a.get(hi)
    if isinstance(mn, str) or isinstance(mx, str):
        return cx.op("clamp_tensor", x, *(None if b is None else cx.tensor(b, x) for b in (mn, mx)))
    return cx.op("clamp", a["self"], min=mn, max=mx)


def _to_copy(cx: Ctx, a: dict) -> str:
    """A dtype change is a cast; a device or layout-only copy is the identity here."""
    return _cast(cx, a["self"], a.get("dtype"))


def _copy(cx: Ctx, a: dict) -> str:
    """Functional ``copy``: ``src`` cast to ``self``'s dtype and broadcast to its shape."""
    out = cx.out_type()
    src = _cast(cx, a["src"], torch.empty(0, dtype=getattr(torch, out.dtype)).dtype)
    return src if cx.type(src).shape == out.shape else cx.op("expand", src, shape=out.shape)


POINTWISE: dict[Any, Converter] = {
    **{getattr(aten, n).default: _unary(n) for n in _SAME_NAME_UNARY},
    **{getattr(aten, n): _binary(n) for n in _SAME_NAME_BINARY},
    aten.add: _add_sub("add"),
    aten.sub: _add_sub("sub"),
    aten.rsub: _add_sub("sub", swap=True),
    aten.div: _div,
    aten.true_divide: _binary("div"),
    aten.floor_divide: _binary("floor_divide"),
    aten.pow: _binary("pow", "self", "exponent"),
    aten.where.self: _where,
    aten.where.ScalarSelf: _where,
    aten.where.ScalarOther: _where,
    aten.where.Scalar: _where,
    aten.masked_fill: _masked_fill,
    aten.gelu.default: lambda cx, a: cx.op("gelu", a["self"], approximate=a["approximate"]),
    aten.leaky_relu.default: lambda cx, a: cx.op("leaky_relu", a["self"], alpha=a["negative_slope"]),
    aten.elu.default: lambda cx, a: (cx.op("elu", a["self"], alpha=a["alpha"])
                                     if a["scale"] == 1 and a["input_scale"] == 1 else None),
    aten.celu.default: lambda cx, a: cx.op("celu", a["self"], alpha=a["alpha"]),
    aten.softplus.default: lambda cx, a: (cx.op("softplus", a["self"])
                                          if a["beta"] == 1 and a["threshold"] == 20 else None),
    aten.clamp: _clamp,
    aten.clamp_min: lambda cx, a: _clamp(cx, a, lo="min", hi="_"),
    aten.clamp_max: lambda cx, a: _clamp(cx, a, lo="_", hi="max"),
    aten.hardtanh.default: lambda cx, a: _clamp(cx, a, lo="min_val", hi="max_val"),
    aten._to_copy.default: _to_copy,
    aten.copy.default: _copy,
    aten.clone.default: _alias,
    aten.alias.default: _alias,
    aten.lift_fresh_copy.default: _alias,
    aten.detach.default: _alias,
    aten.dropout.default: lambda cx, a: a["input"] if not a["train"] or a["p"] == 0 else None,
    aten.native_dropout.default: lambda cx, a: [a["input"], None] if not a["train"] or a["p"] == 0 else None,
}


# ---- views and data movement ----------------------------------------------------------------------

def _reshape(cx: Ctx, a: dict) -> str:
    shape = cx.out_type().shape
    return a["self"] if cx.type(a["self"]).shape == shape else cx.op("reshape", a["self"], shape=shape)


def _t(cx: Ctx, a: dict) -> str:
    return cx.op("transpose", a["self"], dim0=0, dim1=1) if cx.type(a["self"]).rank == 2 else a["self"]


def _expand(cx: Ctx, a: dict) -> str:
    shape = cx.out_type().shape
    return a["self"] if cx.type(a["self"]).shape == shape else cx.op("expand", a["self"], shape=shape)


def _squeeze(cx: Ctx, a: dict) -> str:
    return cx.op("squeeze", a["self"], dims=_dims(a.get("dim")) if "dim" in a else None)


def _slice(cx: Ctx, a: dict) -> str:
    x, dim, step = a["self"], a["dim"], a["step"]
    size = cx.type(x).shape[dim]
    start = 0 if a["start"] is None else a["start"]
    end = None if a["end"] is None or a["end"] >= min(size, _INT_MAX) else a["end"]
    if (start == 0 or start <= -size) and end is None and step == 1:
        return x
    return cx.op("slice", x, dim=dim, start=start, end=end, step=step)


def _select(cx: Ctx, a: dict) -> str:
    x, dim = a["self"], a["dim"]
    i = a["index"] % cx.type(x).shape[dim]
    return cx.op("squeeze", cx.op("slice", x, dim=dim, start=i, end=i + 1, step=1), dims=(dim,))


def _cat(cx: Ctx, a: dict) -> str:
    # torch.cat skips legacy empty 1-D inputs (shape (0,)): HF's empty KV caches are those.
    xs = [x for x in a["tensors"] if cx.type(x).shape != (0,)] or a["tensors"][:1]
    return xs[0] if len(xs) == 1 else cx.op("concat", *xs, dim=a["dim"])


def _split(cx: Ctx, a: dict) -> list[str]:
    x, dim = a["self"], a["dim"]
    size = cx.type(x).shape[dim]
    if "split_sizes" in a:
        sizes = tuple(a["split_sizes"])
    else:
        step = a["split_size"]
        sizes = tuple(min(step, size - i) for i in range(0, size, step)) or (0,)
    return cx.ops("split", x, dim=dim % cx.type(x).rank, sizes=sizes)


def _unbind(cx: Ctx, a: dict) -> list[str]:
    x, dim = a["self"], a["dim"] % cx.type(a["self"]).rank
    pieces = cx.ops("split", x, dim=dim, sizes=(1,) * cx.type(x).shape[dim])
    return [cx.op("squeeze", p, dims=(dim,)) for p in pieces]


def _index(cx: Ctx, a: dict) -> str | None:
    x, idx = a["self"], list(a["indices"])
    if any(i is not None and cx.type(i).dtype in ("bool", "uint8") for i in idx):
        return None  # a mask index has a data-dependent shape
    given = [k for k, i in enumerate(idx) if i is not None]
    if len(given) == 1:
        return cx.op("index_select", x, idx[given[0]], dim=given[0])
    return cx.op("index", x, *idx)


def _pad_dim(cx: Ctx, x: str, dim: int, lo: int, hi: int) -> str:
    """Zero-pad ``x`` along ``dim`` (``pad`` takes F.pad order: last dim first)."""
    rank = cx.type(x).rank
    dim %= rank
    pads = [0] * (2 * (rank - dim))
    pads[-2:] = [lo, hi]
    return cx.op("pad", x, pads=tuple(pads), value=0.0)


def _slice_backward(cx: Ctx, a: dict) -> str | None:
    """The gradient of a unit-step slice: the slice's gradient zero-padded back to the input size."""
    size, dim = a["input_sizes"][a["dim"]], a["dim"]
    start, end = (slice(a["start"], a["end"], a["step"]).indices(size))[:2]
    if a["step"] != 1:
        return None
    return _pad_dim(cx, a["grad_output"], dim, start, size - max(end, start))


def _select_backward(cx: Ctx, a: dict) -> str:
    dim = a["dim"] % len(a["input_sizes"])
    size = a["input_sizes"][dim]
    i = a["index"] % size
    return _pad_dim(cx, cx.op("unsqueeze", a["grad_output"], dims=(dim,)), dim, i, size - i - 1)


def _scatter_slice(cx: Ctx, x: str, src: str, dim: int, start: int, end: int) -> str:
    """``x`` with its unit-step slice ``start:end`` along ``dim`` replaced by ``src``: the parts around it
    concatenated."""
    if end <= start:  # (an empty slice: ``src`` is empty along ``dim``)
        return x
    size = cx.type(x).shape[dim]
    parts = ([cx.op("slice", x, dim=dim, start=0, end=start, step=1)] if start > 0 else []) + [src] + \
        ([cx.op("slice", x, dim=dim, start=end, end=None, step=1)] if end < size else [])
    return parts[0] if len(parts) == 1 else cx.op("concat", *parts, dim=dim)


def _slice_scatter(cx: Ctx, a: dict) -> str | None:
    x = a["self"]
    dim = a["dim"] % cx.type(x).rank
    start, end, step = slice(a["start"], a["end"], a["step"]).indices(cx.type(x).shape[dim])
    return _scatter_slice(cx, x, a["src"], dim, start, end) if step == 1 else None


def _select_scatter(cx: Ctx, a: dict) -> str:
    x = a["self"]
    dim = a["dim"] % cx.type(x).rank
    i = a["index"] % cx.type(x).shape[dim]
    return _scatter_slice(cx, x, cx.op("unsqueeze", a["src"], dims=(dim,)), dim, i, i + 1)


def _mode_pad(mode: str):
    def pad(cx: Ctx, a: dict) -> str:
        return cx.op("pad", a["self"], pads=tuple(a["padding"]), mode=mode)
    return pad


VIEWS: dict[Any, Converter] = {
    aten.view.default: _reshape,
    aten._unsafe_view.default: _reshape,
    aten.reshape.default: _reshape,
    aten.t.default: _t,
    aten.permute.default: lambda cx, a: cx.op("permute", a["self"], perm=tuple(a["dims"])),
    aten.transpose.int: lambda cx, a: cx.op("transpose", a["self"], dim0=a["dim0"], dim1=a["dim1"]),
    aten.expand.default: _expand,
    aten.unsqueeze.default: lambda cx, a: cx.op("unsqueeze", a["self"], dims=(a["dim"],)),
    aten.squeeze: _squeeze,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.cat.default: _cat,
    aten.stack.default: lambda cx, a: cx.op("stack", *a["tensors"], dim=a["dim"]),
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.unbind.int: _unbind,
    aten.flip.default: lambda cx, a: cx.op("flip", a["self"], dims=tuple(a["dims"])),
    aten.roll.default: lambda cx, a: cx.op("roll", a["self"], shifts=tuple(a["shifts"]),
                                           dims=tuple(a.get("dims") or ())),  # (no dims: the flattened tensor's)
    aten.repeat.default: lambda cx, a: cx.op("repeat", a["self"], repeats=tuple(a["repeats"])),
    aten.tril.default: lambda cx, a: cx.op("tril", a["self"], diagonal=a["diagonal"]),
    aten.triu.default: lambda cx, a: cx.op("triu", a["self"], diagonal=a["diagonal"]),
    aten.constant_pad_nd.default: lambda cx, a: cx.op("pad", a["self"], pads=tuple(a["pad"]), value=a["value"]),
    # F.pad's other modes (Conv1d(padding_mode="reflect"), HiFi-GAN's and EnCodec's reflection pads): the same op
    **{getattr(aten, f"{kind}_pad{n}d").default: _mode_pad(mode) for kind, mode in
       (("reflection", "reflect"), ("replication", "replicate")) for n in (1, 2, 3)},
    aten.gather.default: lambda cx, a: cx.op("gather", a["self"], a["index"], dim=a["dim"]),
    aten.index_select.default: lambda cx, a: cx.op("index_select", a["self"], a["index"], dim=a["dim"]),
    aten.embedding.default: lambda cx, a: cx.op("embedding", a["weight"], a["indices"]),
    aten.index.Tensor: _index,
    aten._unsafe_index.Tensor: _index,
    aten.slice_backward.default: _slice_backward,
    aten.select_backward.default: _select_backward,
    aten.slice_scatter.default: _slice_scatter,
    aten.select_scatter.default: _select_scatter,
    # a tensor of ``self``'s shape and dtype, every element the 0-d ``value``
    aten.fill.Tensor: lambda cx, a: cx.op("expand", _cast(cx, a["value"], cx.out_type().dtype),
                                          shape=cx.out_type().shape),
}


# ---- reductions and normalizations ----------------------------------------------------------------

def _reduce(name: str) -> Converter:
    def conv(cx: Ctx, a: dict) -> str:
        x = _cast(cx, a["self"], a.get("dtype"))
        return cx.op(name, x, dims=_dims(a.get("dim")), keepdim=a.get("keepdim", False))
    return conv


def _truth_reduce(name: str) -> Converter:
    """``aten.any``/``aten.all`` (default: every dim; ``dim``: one; ``dims``: a list, None for every dim). An
    empty dim list reduces nothing (unlike sum's): each element's truth, ``x != 0`` (NaN is true)."""
    def conv(cx: Ctx, a: dict) -> str:
        x, dim, keepdim = a["self"], a.get("dim"), a.get("keepdim", False)
        if dim is not None and not isinstance(dim, int) and len(dim) == 0:
            truth = cx.op("ne", x, cx.tensor(0, x))
            out = cx.out_type().dtype
            return truth if out == "bool" else cx.op("cast", truth, dtype=getattr(torch, out))
        return cx.op(name, x, dims=_dims(dim), keepdim=keepdim)
    return conv


def _arg_reduce(name: str) -> Converter:
    def conv(cx: Ctx, a: dict) -> str:
        x, dim, keepdim = a["self"], a.get("dim"), a.get("keepdim", False)
        if dim is not None:
            return cx.op(name, x, dim=dim, keepdim=keepdim)
        out = cx.op(name, cx.op("reshape", x, shape=(-1,)), dim=0)
        return cx.op("reshape", out, shape=cx.out_type().shape) if keepdim else out
    return conv


def _max_min_dim(values: str, indices: str) -> Converter:
    def conv(cx: Ctx, a: dict) -> list:
        x, dim, keepdim = a["self"], a["dim"], a["keepdim"]
        return [cx.op(values, x, dims=(dim,), keepdim=keepdim) if cx.used(0) else None,
                cx.op(indices, x, dim=dim, keepdim=keepdim) if cx.used(1) else None]
    return conv


def _correction(a: dict) -> float:
    if "unbiased" in a:
        return 1 if a["unbiased"] else 0
    return 1 if a.get("correction") is None else a["correction"]


def _var(cx: Ctx, a: dict) -> str:
    return cx.op("var", a["self"], dims=_dims(a.get("dim")), correction=_correction(a), keepdim=a["keepdim"])


def _var_mean(cx: Ctx, a: dict) -> list[str]:
    return [_var(cx, a), cx.op("mean", a["self"], dims=_dims(a.get("dim")), keepdim=a["keepdim"])]


def _softmax(name: str) -> Converter:
    def conv(cx: Ctx, a: dict) -> str:
        x = a["self"]
        if a.get("half_to_float"):
            x = cx.op("cast", x, dtype="float32")
        return cx.op(name, _cast(cx, x, a.get("dtype")), dim=a["dim"])
    return conv


def _weight_norm(cx: Ctx, a: dict) -> list:
    """``v * (g / ||v||)`` and ``||v||``, the norm over every dim of ``v`` but ``dim``, kept (its shape is ``g``'s;
    torch's fused op takes ``dim`` 0 or the last). Half weights are computed in float32 as torch's kernel does; the
    norm keeps the traced dtype (``g``'s: torch's meta function says so, though its CPU kernel returns float32)."""
    out = cx.type(a["v"]).dtype
    v, g = (_cast(cx, a[k], torch.float32) for k in ("v", "g"))
    rank = cx.type(v).rank
    dims = tuple(d for d in range(rank) if d != a["dim"] % rank)
    norm = cx.op("sqrt", cx.op("sum", cx.op("mul", v, v), dims=dims, keepdim=True))
    return [_cast(cx, cx.op("mul", v, cx.op("div", g, norm)), out), _cast(cx, norm, cx.type(a["g"]).dtype)]


def _layer_norm(cx: Ctx, a: dict) -> list:
    """Output 0 is ``layer_norm``; mean and rstd (training graphs) are computed where they are used."""
    x, n = a["input"], len(a["normalized_shape"])
    out = cx.op("layer_norm", x, a["weight"], a["bias"], axis=-n, eps=a["eps"])
    if not (cx.used(1) or cx.used(2)):
        return [out, None, None]
    rank = cx.type(x).rank
    dims = tuple(range(rank - n, rank))
    xs = _cast(cx, x, cx.val[1].dtype)
    mean = cx.op("mean", xs, dims=dims, keepdim=True)
    var = cx.op("var", xs, dims=dims, correction=0, keepdim=True)
    rstd = cx.op("rsqrt", cx.op("add", var, cx.tensor(a["eps"], var)))
    return [out, mean, rstd]


def _batch_norm(cx: Ctx, a: dict) -> list | None:
    if a.get("training"):
        return None
    return [cx.op("batch_norm", a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"],
                  eps=a["eps"]), None, None]


REDUCTIONS: dict[Any, Converter] = {
    aten.sum.dim_IntList: _reduce("sum"),
    aten.sum.default: _reduce("sum"),
    aten.mean.dim: _reduce("mean"),
    aten.mean.default: _reduce("mean"),
    aten.amax.default: _reduce("amax"),
    aten.amin.default: _reduce("amin"),
    aten.max.default: _reduce("amax"),
    aten.min.default: _reduce("amin"),
    aten.max.dim: _max_min_dim("amax", "argmax"),
    aten.min.dim: _max_min_dim("amin", "argmin"),
    aten.argmax.default: _arg_reduce("argmax"),
    aten.argmin.default: _arg_reduce("argmin"),
    aten.prod.dim_int: _reduce("prod"),
    aten.prod.default: _reduce("prod"),
    aten.logsumexp.default: _reduce("logsumexp"),
    aten.any.default: _truth_reduce("any"),
    aten.any.dim: _truth_reduce("any"),
    aten.any.dims: _truth_reduce("any"),
    aten.all.default: _truth_reduce("all"),
    aten.all.dim: _truth_reduce("all"),
    aten.all.dims: _truth_reduce("all"),
    aten.var.correction: _var,
    aten.var.dim: _var,
    aten.std.correction: lambda cx, a: cx.op("sqrt", _var(cx, a)),
    aten.var_mean.correction: _var_mean,
    # (with ``dtype`` torch sums in it; the op sums integers in int64: the same bits, wrapped back by the cast)
    aten.cumsum.default: lambda cx, a: _cast(cx, cx.op("cumsum", _cast(cx, a["self"], a["dtype"]), dim=a["dim"]),
                                             a["dtype"]),
    aten.topk.default: lambda cx, a: cx.ops("topk", a["self"], k=a["k"], dim=a["dim"], largest=a["largest"],
                                            sorted=a["sorted"]),
    aten._softmax.default: _softmax("softmax"),
    aten._log_softmax.default: _softmax("log_softmax"),
    aten.softmax.int: _softmax("softmax"),
    aten.log_softmax.int: _softmax("log_softmax"),
    aten.native_layer_norm.default: _layer_norm,
    aten.native_group_norm.default: lambda cx, a: [cx.op("group_norm", a["input"], a["weight"], a["bias"],
                                                         groups=a["group"], eps=a["eps"]), None, None],
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten.native_batch_norm.default: _batch_norm,
    aten._weight_norm_interface.default: _weight_norm,
}


# ---- GEMM, convolution, pooling, attention --------------------------------------------------------

def _mm(cx: Ctx, a: dict) -> str:
    w = _transposed_weight(cx, "mat2")
    return cx.op("linear", a["self"], w) if w else cx.op("matmul", a["self"], a["mat2"])


def _addmm(cx: Ctx, a: dict) -> str:
    """``beta*bias + alpha*(mat1 @ mat2)``; ``linear`` when mat2 is a transposed weight and bias a row."""
    bias, beta, alpha = a["self"], a["beta"], a["alpha"]
    x, mat2 = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    w = _transposed_weight(cx, "mat2") if "mat2" in a else None
    if w and beta == 1 and alpha == 1 and cx.type(bias).shape == cx.out_type().shape[-1:]:
        return cx.op("linear", x, w, bias)
    out = cx.op("linear", x, w) if w else cx.op("matmul", x, mat2)
    if alpha != 1:
        out = cx.op("mul", out, cx.tensor(alpha, out))
    if beta == 0:
        return out
    if beta != 1:
        bias = cx.op("mul", bias, cx.tensor(beta, bias))
    return cx.op("add", out, bias)


def _convolution(cx: Ctx, a: dict) -> str:
    x, w, b = a["input"], a["weight"], a["bias"]
    n = cx.type(w).rank - 2  # (torch takes one value for every spatial dim too: SigLIP's padding="valid" is [0])
    conv = {"stride": _ntuple(a["stride"], n), "padding": _ntuple(a["padding"], n),
            "dilation": _ntuple(a["dilation"], n), "groups": a["groups"]}
    if a["transposed"]:
        return cx.op("conv_transpose", x, w, b, output_padding=_ntuple(a["output_padding"], n), **conv)
    return cx.op("conv", x, w, b, **conv)


def _pool(name: str, n: int, with_indices: bool = False) -> Converter:
    def conv(cx: Ctx, a: dict) -> Any:
        kernel = _ntuple(a["kernel_size"], n)
        attrs: dict[str, Any] = {"kernel": kernel, "stride": _ntuple(a["stride"] or kernel, n),
                                 "padding": _ntuple(a["padding"], n), "ceil_mode": a["ceil_mode"]}
        if name == "max_pool":
            attrs["dilation"] = _ntuple(a["dilation"], n)
        elif a.get("divisor_override") is not None:
            return None
        else:
            attrs["count_include_pad"] = a["count_include_pad"]
        out = cx.op(name, a["self"], **attrs)
        return [out, None] if with_indices else out
    return conv


def _sdpa(cx: Ctx, a: dict) -> Any:
    """SDPA's ATen forms: output 0 is ``sdpa``; logsumexp and the rest come from a fallback if used."""
    if a.get("dropout_p", 0.0) != 0.0:
        return None
    mask = a.get("attn_mask", a.get("attn_bias"))
    out = cx.op("sdpa", a["query"], a["key"], a["value"], mask, is_causal=a["is_causal"], scale=a["scale"])
    n_outputs = len(cx.node.target._schema.returns)
    return out if n_outputs == 1 else [out] + [None] * (n_outputs - 1)


GEMM: dict[Any, Converter] = {
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
    aten.baddbmm.default: _addmm,
    aten.bmm.default: lambda cx, a: cx.op("matmul", a["self"], a["mat2"]),
    aten.matmul.default: lambda cx, a: cx.op("matmul", a["self"], a["other"]),
    aten.linear.default: lambda cx, a: cx.op("linear", a["input"], a["weight"], a["bias"]),
    aten.convolution.default: _convolution,
    aten.max_pool1d_with_indices.default: _pool("max_pool", 1, with_indices=True),
    aten.max_pool2d_with_indices.default: _pool("max_pool", 2, with_indices=True),
    aten.max_pool3d_with_indices.default: _pool("max_pool", 3, with_indices=True),
    aten.max_pool2d.default: _pool("max_pool", 2),
    aten.avg_pool1d.default: _pool("avg_pool", 1),
    aten.avg_pool2d.default: _pool("avg_pool", 2),
    aten.avg_pool3d.default: _pool("avg_pool", 3),
    aten._adaptive_avg_pool2d.default: lambda cx, a: cx.op("adaptive_avg_pool", a["self"],
                                                           output_size=tuple(a["output_size"])),
    aten.scaled_dot_product_attention.default: _sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa,
    aten._scaled_dot_product_efficient_attention.default: _sdpa,
    aten._scaled_dot_product_flash_attention.default: _sdpa,
    aten._scaled_dot_product_cudnn_attention.default: _sdpa,
}


# ---- the table ------------------------------------------------------------------------------------

CONVERTERS: dict[Any, Converter] = {**POINTWISE, **VIEWS, **REDUCTIONS, **GEMM, **COLLECTIVES}

# Ops that make a tensor from sizes and values only, with the one value every element holds (an int, the name of
# the argument that gives it, or None where elements differ): the importer evaluates a small one into a constant,
# and makes a large uniform one an expand of a 0-d constant (frontends/fx.py: FOLD_NUMEL).
GENERATORS: dict[Any, int | str | None] = {
    aten.arange: None, aten.eye: None, aten.scalar_tensor: None, aten.full: "fill_value", aten.full_like: "fill_value",
    aten.new_full: "fill_value", aten.ones: 1, aten.ones_like: 1, aten.new_ones: 1, **dict.fromkeys((
        aten.zeros, aten.zeros_like, aten.new_zeros, aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
        aten.new_empty_strided), 0)}

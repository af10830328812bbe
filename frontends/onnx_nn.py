"""The ONNX converter table, part 2: reductions, GEMM, convolution, pooling, normalization, resize, sampling,
quantization, signal processing and recurrent layers (``onnx.CONVERTERS`` merges it with ``onnx_ops``).

Note: convolution and pooling pads are resolved at import (``auto_pad`` needs the static spatial
size); symmetric pads map onto the canonical ``conv``/``max_pool``/``avg_pool``, asymmetric ones get
an explicit ``pad`` before a convolution or the general ``onnx_pool``.
"""

from __future__ import annotations

import math

import torch

from tilefuse.frontends.onnx_context import WIDE, Ctx, OnnxNode, Unsupported, axis_of, const_input, ints, runtime
from tilefuse.frontends.onnx_tensors import onnx_dtype
from tilefuse.ops.onnx_common import extreme
from tilefuse.ops.onnx_image import resize_geometry
from tilefuse.ops.onnx_layers import pool_geometry

FLOATS = ("float16", "bfloat16", "float32", "float64")


# ---- reductions ---------------------------------------------------------------------------------

def _reduce_axes(ctx: Ctx, n: OnnxNode, x: str) -> tuple[int, ...] | None:
    """The reduced dims; ``None`` for all dims, ``()`` for none (noop_with_empty_axes)."""
    axes = ints(ctx, n, 1, "axes")
    if not axes:
        return () if n.attr("noop_with_empty_axes", 0) else None
    return tuple(sorted(axis_of(ctx, x, a) for a in axes))


def _reduce(kind: str):
    """ReduceX as pre-map, reduction, post-map (L2 = sqrt . sum . square, ...)."""
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        x = ctx.inp(n, 0)
        dtype = ctx.dtype(x)
        keep = bool(n.attr("keepdims", 1))
        if runtime(ctx, n, 1):
            return ctx.add("reduce_dynamic", [x, ctx.inp(n, 1)], kind=kind, keepdim=keep,
                           noop=bool(n.attr("noop_with_empty_axes", 0)))
        dims = _reduce_axes(ctx, n, x)
        work = x if dtype not in WIDE and (kind != "mean" or dtype in FLOATS) else ctx.cast(
            x, "float64" if kind == "mean" else "int64")
        if kind in ("l1",):
            work = ctx.add1("abs", [work])
        elif kind in ("l2", "sum_square"):
            work = ctx.add1("mul", [work, work])
        if dims != ():
            op = {"max": "amax", "min": "amin", "prod": "prod", "mean": "mean", "log_sum_exp": "logsumexp"}.get(
                kind, "sum")
            shape = ctx.shape(x)
            reduced = range(len(shape)) if dims is None and shape is not None else (dims or ())
            if op in ("amax", "amin") and shape is not None and any(shape[d] == 0 for d in reduced):
                return [_empty_reduction(ctx, x, kind, dims, keep)]
            attrs = {"dtype": ctx.dtype(work)} if op == "sum" else {}
            work = ctx.add1(op, [work], dims=dims, keepdim=keep, **attrs)
        if kind == "l2":
            work = ctx.add1("sqrt", [work])
        elif kind == "log_sum":
            work = ctx.add1("log", [work])
        return [ctx.cast(work, dtype)]
    return conv


def _empty_reduction(ctx: Ctx, x: str, kind: str, dims, keep: bool) -> str:
    """Max/min over an empty set: the identity (-inf / +inf, or the integer extremes)."""
    t = ctx.type(x)
    dims = range(len(t.shape)) if dims is None else dims
    shape = [1 if i in dims else d for i, d in enumerate(t.shape)] if keep else [
        d for i, d in enumerate(t.shape) if i not in dims]
    dt = getattr(torch, t.dtype)
    value = extreme(dt, high=kind == "min")
    return ctx.constant(torch.full(shape, value, dtype=dt), "empty_reduce")


def arg(op: str):
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        x = ctx.inp(n, 0)
        if ctx.dtype(x) in WIDE:
            x = ctx.cast(x, "int64")
        return ctx.add(op, [x], dim=axis_of(ctx, x, n.attr("axis", 0)), keepdim=bool(n.attr("keepdims", 1)),
                       select_last_index=bool(n.attr("select_last_index", 0)))
    return conv


def softmax(op: str):
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        x = ctx.inp(n, 0)
        if n.version >= 13:
            return ctx.add(op, [x], dim=axis_of(ctx, x, n.attr("axis", -1)))
        shape = ctx.static_shape(x, f"{n.op} before opset 13 works on the 2-D coercion")
        axis = axis_of(ctx, x, n.attr("axis", 1))
        flat = ctx.add1("reshape", [x], shape=(math.prod(shape[:axis]), math.prod(shape[axis:])))
        return ctx.add("reshape", [ctx.add1(op, [flat], dim=1)], shape=tuple(shape))
    return conv


# ---- GEMM ---------------------------------------------------------------------------------------

def gemm(ctx: Ctx, n: OnnxNode) -> list[str]:
    a, b, c = ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)
    if n.attr("transA", 0):
        a = ctx.add1("permute", [a], perm=(1, 0))
    if n.attr("transB", 0):
        b = ctx.add1("permute", [b], perm=(1, 0))
    y = ctx.add1("matmul", [a, b])
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    if alpha != 1.0:
        y = ctx.add1("scale", [y], factor=alpha)
    if c:
        if beta != 1.0:
            c = ctx.add1("scale", [c], factor=beta)
        y = ctx.add1("add", [y, c])
    return [y]


def matmul_integer(ctx: Ctx, n: OnnxNode) -> list[str]:
    a, b = ctx.cast(ctx.inp(n, 0), "int32"), ctx.cast(ctx.inp(n, 1), "int32")
    if n.has_input(2):
        a = ctx.add1("sub", [a, ctx.cast(ctx.inp(n, 2), "int32")])
    if n.has_input(3):
        b = ctx.add1("sub", [b, ctx.cast(ctx.inp(n, 3), "int32")])
    # float64 holds every int8/uint8 product sum exactly, and every device multiplies it
    return [ctx.cast(ctx.add1("matmul", [ctx.cast(a, "float64"), ctx.cast(b, "float64")]), "int32")]


# ---- convolution and pooling -------------------------------------------------------------------

def _window(ctx: Ctx, n: OnnxNode, x: str, kernel) -> tuple[list, list, list]:
    """strides, dilations and pads ([begins..., ends...]) with auto_pad resolved."""
    nd = len(kernel)
    strides = list(n.attr("strides") or [1] * nd)
    dil = list(n.attr("dilations") or [1] * nd)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return strides, dil, list(n.attr("pads") or [0] * 2 * nd)
    if auto == "VALID":
        return strides, dil, [0] * 2 * nd
    spatial = ctx.static_shape(x, f"auto_pad={auto}")[2:]
    lo, hi = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dil):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        lo.append(small if auto == "SAME_UPPER" else big)
        hi.append(big if auto == "SAME_UPPER" else small)
    return strides, dil, lo + hi


def _torch_pads(pads: list) -> list:
    nd = len(pads) // 2
    out = []
    for i in reversed(range(nd)):
        out += [pads[i], pads[nd + i]]
    return out


def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, w, b = ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)
    kernel = list(n.attr("kernel_shape") or ctx.static_shape(w, "Conv weight")[2:])
    strides, dil, pads = _window(ctx, n, x, kernel)
    nd = len(kernel)
    if pads[:nd] != pads[nd:]:
        x = ctx.add1("pad", [x], pads=tuple(_torch_pads(pads)), mode="constant", value=0.0)
        pads = [0] * 2 * nd
    return ctx.add("conv", [x, w, b], stride=tuple(strides), padding=tuple(pads[:nd]), dilation=tuple(dil),
                   groups=n.attr("group", 1))


def conv_transpose(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, w, b = ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)
    kernel = list(n.attr("kernel_shape") or ctx.static_shape(w, "ConvTranspose weight")[2:])
    nd = len(kernel)
    strides = list(n.attr("strides") or [1] * nd)
    dil = list(n.attr("dilations") or [1] * nd)
    out_pad = list(n.attr("output_padding") or [0] * nd)
    pads = list(n.attr("pads") or [0] * 2 * nd)
    auto, out_shape = n.attr("auto_pad", "NOTSET"), n.attr("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        spatial = ctx.static_shape(x, "ConvTranspose output_shape/auto_pad")[2:]
        want = list(out_shape)[-nd:] if out_shape is not None else [s * st for s, st in zip(spatial, strides)]
        lo, hi = [], []
        for i in range(nd):
            total = strides[i] * (spatial[i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - want[i]
            upper = auto == "SAME_UPPER"
            lo.append(total // 2 if upper else total - total // 2)
            hi.append(total - total // 2 if upper else total // 2)
        pads = lo + hi
    elif auto == "VALID":
        pads = [0] * 2 * nd
    groups = n.attr("group", 1)
    if pads[:nd] == pads[nd:] and all(p >= 0 for p in pads) and all(
            op < max(s, d) for op, s, d in zip(out_pad, strides, dil)):
        return ctx.add("conv_transpose", [x, w, b], stride=tuple(strides), padding=tuple(pads[:nd]),
                       output_padding=tuple(out_pad), dilation=tuple(dil), groups=groups)
    y = ctx.add1("conv_transpose", [x, w], stride=tuple(strides), padding=(0,) * nd,
                 output_padding=(0,) * nd, dilation=tuple(dil), groups=groups)
    crop = [-p for p in pads[:nd]] + [op - p for op, p in zip(out_pad, pads[nd:])]
    y = ctx.add1("pad", [y], pads=tuple(_torch_pads(crop)), mode="constant", value=0.0)
    if b:
        b = ctx.add1("reshape", [b], shape=(-1,) + (1,) * nd)
        y = ctx.add1("add", [y, b])
    return [y]


def _windows_fit(ctx: Ctx, x: str, kernel, strides, pads, dil, ceil) -> bool:
    """Whether every pooled dim is non-empty (torch's pools refuse empty outputs)."""
    shape = ctx.shape(x)
    if shape is None or not all(isinstance(d, int) for d in shape[2:]):
        return True
    out, _ = pool_geometry(shape, kernel, strides, pads, dil, ceil)
    return min(out) > 0


def max_pool(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _window(ctx, n, x, kernel)
    nd, ceil = len(kernel), n.attr("ceil_mode", 0)
    if len(n.outputs) > 1 and n.outputs[1]:
        return ctx.add("max_pool_indices", [x], kernel=tuple(kernel), strides=tuple(strides), pads=tuple(pads),
                       dilations=tuple(dil), ceil_mode=ceil, storage_order=n.attr("storage_order", 0))
    if pads[:nd] == pads[nd:] and all(2 * p <= k for p, k in zip(pads, kernel)) and \
            ctx.dtype(x) in FLOATS and nd <= 3 and _windows_fit(ctx, x, kernel, strides, pads, dil, ceil):
        return ctx.add("max_pool", [x], kernel=tuple(kernel), stride=tuple(strides), padding=tuple(pads[:nd]),
                       dilation=tuple(dil), ceil_mode=bool(ceil))
    return ctx.add("onnx_pool", [x], mode="max", kernel=tuple(kernel), strides=tuple(strides), pads=tuple(pads),
                   dilations=tuple(dil), ceil_mode=ceil)


def avg_pool(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _window(ctx, n, x, kernel)
    nd, ceil, include = len(kernel), n.attr("ceil_mode", 0), n.attr("count_include_pad", 0)
    if pads[:nd] == pads[nd:] and all(2 * p <= k for p, k in zip(pads, kernel)) and all(d == 1 for d in dil) and \
            nd <= 3 and ctx.dtype(x) in FLOATS and _windows_fit(ctx, x, kernel, strides, pads, dil, ceil):
        return ctx.add("avg_pool", [x], kernel=tuple(kernel), stride=tuple(strides), padding=tuple(pads[:nd]),
                       ceil_mode=bool(ceil), count_include_pad=bool(include))
    return ctx.add("onnx_pool", [x], mode="avg", kernel=tuple(kernel), strides=tuple(strides), pads=tuple(pads),
                   dilations=tuple(dil), ceil_mode=ceil, count_include_pad=include)


def lp_pool(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _window(ctx, n, x, kernel)
    return ctx.add("onnx_pool", [x], mode="lp", kernel=tuple(kernel), strides=tuple(strides), pads=tuple(pads),
                   dilations=tuple(dil), ceil_mode=n.attr("ceil_mode", 0), p=float(n.attr("p", 2)))


def global_pool(kind: str):
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        x = ctx.inp(n, 0)
        dims = tuple(range(2, ctx.rank(x)))
        if kind == "lp":
            p = float(n.attr("p", 2))
            s = ctx.add1("sum", [ctx.add1("pow", [ctx.add1("abs", [x]), ctx.scalar(p, ctx.dtype(x))])], dims=dims,
                         keepdim=True)
            return ctx.add("pow", [s, ctx.scalar(1.0 / p, ctx.dtype(x))])
        return ctx.add("amax" if kind == "max" else "mean", [x], dims=dims, keepdim=True)
    return conv


# ---- normalization ------------------------------------------------------------------------------

def batch_norm(ctx: Ctx, n: OnnxNode) -> list[str]:
    if not n.attr("spatial", 1):
        raise Unsupported("BatchNormalization with spatial=0")
    ins, eps = [ctx.inp(n, i) for i in range(5)], n.attr("epsilon", 1e-5)
    if not n.attr("training_mode", 0):
        return ctx.add("batch_norm", ins, eps=eps)
    # training mode: normalize with the batch statistics, return the updated running ones
    x, momentum = ins[0], n.attr("momentum", 0.9)
    dims = tuple(d for d in range(ctx.rank(x)) if d != 1)
    mean = ctx.add1("mean", [x], dims=dims)
    var = ctx.add1("var", [x], dims=dims, correction=0)
    y = ctx.add1("batch_norm", [x, ins[1], ins[2], mean, var], eps=eps)
    blend = lambda old, new: ctx.add1("add", [ctx.add1("scale", [old], factor=momentum),
                                              ctx.add1("scale", [new], factor=1 - momentum)])
    return [y, blend(ins[3], mean), blend(ins[4], var)]


def layer_norm(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, scale, bias = ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)
    axis, eps = axis_of(ctx, x, n.attr("axis", -1)), n.attr("epsilon", 1e-5)
    norm_shape = ctx.shape(x)[axis:]
    fits = all(not v or ctx.shape(v) == norm_shape for v in (scale, bias))
    y = ctx.add1("layer_norm", [x, scale, bias] if fits else [x], axis=axis, eps=eps)
    if not fits:
        y = ctx.add1("mul", [y, scale])
        y = ctx.add1("add", [y, bias]) if bias else y
    outs = [y]
    if any(n.outputs[1:]):
        stash = "float64" if ctx.dtype(x) == "float64" else "float32"
        xf = ctx.cast(x, stash)
        dims = tuple(range(axis, ctx.rank(x)))
        m = ctx.add1("mean", [xf], dims=dims, keepdim=True)
        var = ctx.add1("var", [xf], dims=dims, correction=0, keepdim=True)
        inv = ctx.add1("rsqrt", [ctx.add1("add", [var, ctx.scalar(eps, stash)])])
        outs += [m, inv]
    return outs


def group_norm(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, scale, bias = ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)
    groups, eps = n.attr("num_groups"), n.attr("epsilon", 1e-5)
    if n.version < 21:  # scale/bias per group: per channel once repeated
        s, b = ctx.const(scale), ctx.const(bias)
        if s is None or b is None:
            raise Unsupported("GroupNormalization-18 with runtime per-group scale/bias")
        per = ctx.static_shape(x, "GroupNormalization")[1] // groups
        scale = ctx.constant(s.repeat_interleave(per), "scale")
        bias = ctx.constant(b.repeat_interleave(per), "bias")
    return ctx.add("group_norm", [x, scale, bias], groups=groups, eps=eps)


def rms_norm(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    return ctx.add("rms_norm", [x, ctx.inp(n, 1)], axis=axis_of(ctx, x, n.attr("axis", -1)),
                   eps=n.attr("epsilon", 1e-5))


def lp_norm(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    dim, p = axis_of(ctx, x, n.attr("axis", -1)), n.attr("p", 2)
    if p == 1:
        norm = ctx.add1("sum", [ctx.add1("abs", [x])], dims=(dim,), keepdim=True)
    else:
        norm = ctx.add1("sqrt", [ctx.add1("sum", [ctx.add1("mul", [x, x])], dims=(dim,), keepdim=True)])
    zero = ctx.scalar(0, ctx.dtype(x))
    return ctx.add("where", [ctx.add1("eq", [norm, zero]), zero, ctx.add1("div", [x, norm])])


CONVERTERS = {
    "ReduceSum": _reduce("sum"), "ReduceMean": _reduce("mean"), "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"), "ReduceProd": _reduce("prod"), "ReduceL1": _reduce("l1"),
    "ReduceL2": _reduce("l2"), "ReduceLogSum": _reduce("log_sum"), "ReduceLogSumExp": _reduce("log_sum_exp"),
    "ReduceSumSquare": _reduce("sum_square"), "ArgMax": arg("argmax"), "ArgMin": arg("argmin"),
    "Softmax": softmax("softmax"), "LogSoftmax": softmax("log_softmax"), "Hardmax": softmax("hardmax"),
    "MatMul": lambda ctx, n: ctx.add("matmul", [ctx.inp(n, 0), ctx.inp(n, 1)]),
    "Gemm": gemm, "MatMulInteger": matmul_integer,
    "Conv": conv, "ConvTranspose": conv_transpose, "MaxPool": max_pool, "AveragePool": avg_pool, "LpPool": lp_pool,
    "GlobalAveragePool": global_pool("avg"), "GlobalMaxPool": global_pool("max"),
    "GlobalLpPool": global_pool("lp"),
    "BatchNormalization": batch_norm,
    "InstanceNormalization": lambda ctx, n: ctx.add("instance_norm", [ctx.inp(n, i) for i in range(3)],
                                                    eps=n.attr("epsilon", 1e-5)),
    "LayerNormalization": layer_norm, "GroupNormalization": group_norm, "RMSNormalization": rms_norm,
    "LRN": lambda ctx, n: ctx.add("lrn", [ctx.inp(n, 0)], size=n.attr("size"), alpha=n.attr("alpha", 1e-4),
                                  beta=n.attr("beta", 0.75), bias=n.attr("bias", 1.0)),
    "LpNormalization": lp_norm,
}

OLDEST = {"Softmax": 1, "LogSoftmax": 1, "Hardmax": 1, "MatMul": 1, "ReduceSum": 1, "ReduceMean": 1,
          "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1, "ReduceL1": 1, "ReduceL2": 1, "ReduceLogSum": 1,
          "ReduceLogSumExp": 1, "ReduceSumSquare": 1, "ArgMax": 1, "ArgMin": 1, "Conv": 1, "ConvTranspose": 1, "MaxPool": 1,
          "AveragePool": 7, "GlobalAveragePool": 1, "GlobalMaxPool": 1, "GlobalLpPool": 2, "LpPool": 2,
          "InstanceNormalization": 6, "LRN": 1, "LpNormalization": 1, "Gemm": 7, "BatchNormalization": 7}

__all__ = ["CONVERTERS", "OLDEST", "const_input"]


# ---- resize ---------------------------------------------------------------------------------------

def resize(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    if n.op == "Upsample" or n.version < 11:
        inputs = {"scales": ctx.inp(n, 1)}
        attrs = {"mode": n.attr("mode", "nearest"), "coordinate_mode": "asymmetric", "nearest_mode": "floor"}
    else:
        inputs = {"roi": ctx.inp(n, 1), "scales": ctx.inp(n, 2), "sizes": ctx.inp(n, 3)}
        attrs = {"mode": n.attr("mode", "nearest"),
                 "coordinate_mode": n.attr("coordinate_transformation_mode", "half_pixel"),
                 "nearest_mode": n.attr("nearest_mode", "round_prefer_floor"),
                 "cubic_coeff_a": n.attr("cubic_coeff_a", -0.75), "exclude_outside": n.attr("exclude_outside", 0),
                 "extrapolation_value": n.attr("extrapolation_value", 0.0), "antialias": n.attr("antialias", 0)}
    geometry = {"axes": tuple(n.attr("axes")) if n.attr("axes") else None,
                "policy": n.attr("keep_aspect_ratio_policy", "stretch")}
    shape = ctx.shape(x)
    consts = {k: ctx.const(v) if v else None for k, v in inputs.items()}
    if ctx.type(x).is_static and all(v == "" or consts[k] is not None for k, v in inputs.items()):
        sizes, scales, roi = resize_geometry(shape, consts.get("scales"), consts.get("sizes"), consts.get("roi"),
                                             **geometry)
        if attrs["coordinate_mode"] != "tf_crop_and_resize":
            roi = None
        factors = _nearest_repeats(shape, sizes, scales, attrs)
        if factors is not None:
            return [_repeat_each(ctx, x, shape, factors)]
        return ctx.add("resize", [x], sizes=sizes, scales=scales, roi=roi, **attrs)
    names = [inputs.get(k, "") for k in ("roi", "scales", "sizes")]
    return ctx.add("resize_dynamic", [x, *names], **geometry, **attrs)


# Nearest modes whose source index along an axis scaled by a whole number s is floor(o / s) (each input element
# repeated s times): asymmetric takes floor(o / s) itself; the half-pixel modes take o / s + (r + 0.5) / s - 0.5 for
# r = o mod s, always less than half away from floor(o / s), so either rounding of a tie gives it.
_REPEATING = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
              ("pytorch_half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", "round_prefer_ceil"),
              ("half_pixel_symmetric", "round_prefer_floor"), ("half_pixel_symmetric", "round_prefer_ceil")}


def _nearest_repeats(shape, sizes, scales, attrs: dict) -> tuple[int, ...] | None:
    """Per axis, how many times a nearest Resize repeats each element (a YOLO's or a VAE decoder's 2x upsample), or
    None where it is not a repetition (other modes, fractional scales)."""
    if attrs["mode"] != "nearest" or attrs.get("antialias"):
        return None
    factors = []
    for n, out, scale in zip(shape, sizes, scales):
        k = out // n if n and out % n == 0 else 0
        if k < 1 or abs(scale - k) > 1e-6 * k:  # (sizes give scales as their ratio: whole numbers exactly)
            return None
        factors.append(k)
    if all(k == 1 for k in factors):
        return tuple(factors)  # the identity in every mode
    return tuple(factors) if (attrs["coordinate_mode"], attrs["nearest_mode"]) in _REPEATING else None


def _repeat_each(ctx: Ctx, x: str, shape, factors) -> str:
    """``x`` with each element repeated ``factors[a]`` times along axis ``a``: a size-1 axis after each repeated one,
    expanded, then merged (views and a broadcast, which fuse with what reads them)."""
    if all(k == 1 for k in factors):
        return ctx.add1("identity", [x])
    split = [d for n, k in zip(shape, factors) for d in ((n, 1) if k > 1 else (n,))]
    wide = [d for n, k in zip(shape, factors) for d in ((n, k) if k > 1 else (n,))]
    y = ctx.add1("expand", [ctx.add1("reshape", [x], shape=tuple(split))], shape=tuple(wide))
    return ctx.add1("reshape", [y], shape=tuple(n * k for n, k in zip(shape, factors)))


CONVERTERS.update({"Resize": resize, "Upsample": resize})
OLDEST.update({"Resize": 10, "Upsample": 9})


# ---- sampling, quantization, signal processing, detection ---------------------------------------

def grid_sample(ctx: Ctx, n: OnnxNode) -> list[str]:
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(n.attr("mode", "bilinear"), n.attr("mode", "bilinear"))
    return ctx.add("grid_sample", [ctx.inp(n, 0), ctx.inp(n, 1)], mode=mode,
                   padding_mode=n.attr("padding_mode", "zeros"), align_corners=n.attr("align_corners", 0))


def roi_align(ctx: Ctx, n: OnnxNode) -> list[str]:
    half = n.attr("coordinate_transformation_mode", "half_pixel" if n.version >= 16 else "output_half_pixel")
    return ctx.add("roi_align", [ctx.inp(n, i) for i in range(3)], mode=n.attr("mode", "avg"),
                   output_height=n.attr("output_height", 1), output_width=n.attr("output_width", 1),
                   sampling_ratio=n.attr("sampling_ratio", 0), spatial_scale=n.attr("spatial_scale", 1.0),
                   half_pixel=int(half == "half_pixel"))


def max_unpool(ctx: Ctx, n: OnnxNode) -> list[str]:
    x = ctx.inp(n, 0)
    shape = ctx.static_shape(x, "MaxUnpool")
    kernel = list(n.attr("kernel_shape"))
    nd = len(kernel)
    strides, pads = list(n.attr("strides") or [1] * nd), list(n.attr("pads") or [0] * 2 * nd)
    inferred = tuple(shape[:2]) + tuple((shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[nd + i]
                                        for i in range(nd))
    if runtime(ctx, n, 2):
        return ctx.add("max_unpool", [x, ctx.inp(n, 1), ctx.inp(n, 2)], inferred_shape=inferred)
    out = ints(ctx, n, 2)
    return ctx.add("max_unpool", [x, ctx.inp(n, 1)], inferred_shape=inferred, output_shape=tuple(out or inferred))


def col2im(ctx: Ctx, n: OnnxNode) -> list[str]:
    return ctx.add("col2im", [ctx.inp(n, i) for i in range(3)], dilations=tuple(n.attr("dilations") or ()),
                   pads=tuple(n.attr("pads") or ()), strides=tuple(n.attr("strides") or ()))


def quantize(ctx: Ctx, n: OnnxNode) -> list[str]:
    zp = ctx.inp(n, 2)
    dtype = ctx.dtype(zp) if zp else (onnx_dtype(n.attr("output_dtype")) if n.attr("output_dtype") else "uint8")
    return ctx.add("quantize_linear", [ctx.inp(n, 0), ctx.inp(n, 1), zp], axis=n.attr("axis", 1),
                   block_size=n.attr("block_size", 0), dtype=dtype, saturate=n.attr("saturate", 1))


def dequantize(ctx: Ctx, n: OnnxNode) -> list[str]:
    out = n.attr("output_dtype")
    return ctx.add("dequantize_linear", [ctx.inp(n, i) for i in range(3)], axis=n.attr("axis", 1),
                   block_size=n.attr("block_size", 0), dtype=onnx_dtype(out) if out else None)


def _conv_attrs(ctx: Ctx, n: OnnxNode, x: str, w: str) -> dict:
    kernel = list(n.attr("kernel_shape") or ctx.static_shape(w, f"{n.op} weight")[2:])
    strides, dil, pads = _window(ctx, n, x, kernel)
    nd = len(kernel)
    if pads[:nd] != pads[nd:]:
        raise Unsupported(f"{n.op} with asymmetric pads")
    return {"stride": tuple(strides), "padding": tuple(pads[:nd]), "dilation": tuple(dil), "groups": n.attr("group", 1)}


def qlinear_conv(ctx: Ctx, n: OnnxNode) -> list[str]:
    ins = [ctx.inp(n, i) for i in range(9)]
    return ctx.add("qlinear_conv", ins, **_conv_attrs(ctx, n, ins[0], ins[3]))


def conv_integer(ctx: Ctx, n: OnnxNode) -> list[str]:
    ins = [ctx.inp(n, i) for i in range(4)]
    return ctx.add("conv_integer", ins, **_conv_attrs(ctx, n, ins[0], ins[1]))


def window(kind: str):
    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        return ctx.add("window", [ctx.inp(n, 0)], kind=kind, periodic=n.attr("periodic", 1),
                       dtype=onnx_dtype(n.attr("output_datatype", 1)))
    return conv


def dft(ctx: Ctx, n: OnnxNode) -> list[str]:
    attrs = {"inverse": n.attr("inverse", 0), "onesided": n.attr("onesided", 0)}
    if n.version < 20:
        return ctx.add("dft", [ctx.inp(n, 0), ctx.inp(n, 1)], axis=n.attr("axis", 1), **attrs)
    if runtime(ctx, n, 2):
        return ctx.add("dft", [ctx.inp(n, 0), ctx.inp(n, 1), ctx.inp(n, 2)], **attrs)
    return ctx.add("dft", [ctx.inp(n, 0), ctx.inp(n, 1)], axis=(ints(ctx, n, 2) or [-2])[0], **attrs)


CONVERTERS.update({
    "GridSample": grid_sample, "RoiAlign": roi_align, "MaxUnpool": max_unpool, "Col2Im": col2im,
    "AffineGrid": lambda ctx, n: ctx.add("affine_grid", [ctx.inp(n, 0), ctx.inp(n, 1)],
                                         align_corners=n.attr("align_corners", 0)),
    "TensorScatter": lambda ctx, n: ctx.add("tensor_scatter", [ctx.inp(n, i) for i in range(3)],
                                            mode=n.attr("mode", "linear"), axis=n.attr("axis", -2)),
    "QuantizeLinear": quantize, "DequantizeLinear": dequantize, "QLinearConv": qlinear_conv,
    "QLinearMatMul": lambda ctx, n: ctx.add("qlinear_matmul", [ctx.inp(n, i) for i in range(8)]),
    "ConvInteger": conv_integer,
    "BitCast": lambda ctx, n: ctx.add("bitcast", [ctx.inp(n, 0)], dtype=onnx_dtype(n.attr("to"))),
    "HannWindow": window("hann"), "HammingWindow": window("hamming"), "BlackmanWindow": window("blackman"),
    "DFT": dft,
    "STFT": lambda ctx, n: ctx.add("stft", [ctx.inp(n, i) for i in range(4)], onesided=n.attr("onesided", 1)),
    "MelWeightMatrix": lambda ctx, n: ctx.add("mel_weight_matrix", [ctx.inp(n, i) for i in range(5)],
                                              dtype=onnx_dtype(n.attr("output_datatype", 1))),
    "NonMaxSuppression": lambda ctx, n: ctx.add("non_max_suppression", [ctx.inp(n, i) for i in range(5)],
                                                center_point_box=n.attr("center_point_box", 0)),
    "Unique": lambda ctx, n: ctx.add("unique", [ctx.inp(n, 0)], axis=n.attr("axis"), sorted=n.attr("sorted", 1)),
})
OLDEST.update({"RoiAlign": 10, "MaxUnpool": 9, "QuantizeLinear": 10, "DequantizeLinear": 10, "QLinearMatMul": 10,
               "QLinearConv": 10, "ConvInteger": 10, "NonMaxSuppression": 10, "Unique": 11, "DFT": 17})


def recurrent(kind: str):
    """ONNX RNN / GRU / LSTM onto the ``rnn`` op (all inputs kept; absent ones are '')."""
    defaults = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind]

    def conv(ctx: Ctx, n: OnnxNode) -> list[str]:
        direction = n.attr("direction", "forward")
        dirs = 2 if direction == "bidirectional" else 1
        acts = n.attr("activations") or defaults * dirs
        count = 8 if kind == "lstm" else 6
        ins = [ctx.inp(n, i) for i in range(count)] + [""] * (8 - count)
        return ctx.add("rnn", ins, kind=kind, hidden_size=n.attr("hidden_size"), num_directions=dirs,
                       direction=direction, activations=tuple(acts), alphas=tuple(n.attr("activation_alpha") or ()),
                       betas=tuple(n.attr("activation_beta") or ()), clip=n.attr("clip"), layout=n.attr("layout", 0),
                       linear_before_reset=n.attr("linear_before_reset", 0), input_forget=n.attr("input_forget", 0))
    return conv


CONVERTERS.update({"RNN": recurrent("rnn"), "GRU": recurrent("gru"), "LSTM": recurrent("lstm")})


def deform_conv(ctx: Ctx, n: OnnxNode) -> list[str]:
    x, w = ctx.inp(n, 0), ctx.inp(n, 1)
    if ctx.rank(x) != 4:
        raise Unsupported("DeformConv other than 2-D")
    attrs = _conv_attrs(ctx, n, x, w)
    return ctx.add("deform_conv", [x, w, ctx.inp(n, 2), ctx.inp(n, 3), ctx.inp(n, 4)],
                   offset_groups=n.attr("offset_group", 1), **attrs)


CONVERTERS["DeformConv"] = deform_conv

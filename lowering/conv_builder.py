"""The convolution and pooling region builders (``dispatch.build`` calls them for ``gemm`` regions anchored on a
convolution and ``reduction`` regions anchored on a pool): a region -> one ``conv2d``, ``gemm`` (a 1x1
convolution), ``elementwise`` (a grouped convolution: ``_grouped_conv``) or ``pool2d`` template instance. NCHW, or
NHWC where ``planner.layout`` made the region channels last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilefuse.ir import Node, TensorType
from tilefuse.lowering import index
from tilefuse.lowering.builders import (
    PASS_VIEWS,
    TEMPLATE_DTYPES,
    Builder,
    KernelSpec,
    broadcast,
    check_dtypes,
    domain_shape,
    epilogue_exprs,
    gemm_spec,
    loaded_operand,
    require,
    result_operand,
)
from tilefuse.lowering.expr import Acc, Call, Const, Expr, Load, substitute, tree_size
from tilefuse.lowering.templates import depthwise, pool

# A grouped convolution (depthwise: one input channel per group) runs as an elementwise kernel that sums each output's
# taps (input channels per group x KH x KW) when there are at most this many: MobileNet's and MobileViT's 3x3 (9),
# ConvNeXt's 7x7 (49). More taps would unfold past the expression limit; such convolutions (ResNeXt's 3x3 over 4-32
# channels a group, wav2vec2's positional one) take the convolution template, one implicit GEMM a group. On CUDA a
# depthwise one channels last takes the depthwise template (``_depthwise_conv``).
MAX_TAPS = 64


def build_pool(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """max_pool / avg_pool / adaptive_avg_pool over the last two dims, with elementwise producers
    (same shape as the input) and consumers (the pooled result, any view of it)."""
    x, a = anchor.inputs[0], anchor.attr
    xs = tuple(b.types[x].shape)
    kind = {"max_pool": "max", "avg_pool": "avg", "adaptive_avg_pool": "adaptive_avg"}[anchor.op]
    dims = len(a["output_size"]) if kind == "adaptive_avg" else len(a["kernel"])
    require(dims == 2 and len(xs) >= 3, f"{anchor.op} over {dims} dims (the pool template does 2-D)")
    require(not (target.get("kind") == "cuda" and "bfloat16" in {b.types[v].dtype for v in b.region.inputs}),
             "bf16 pooling on CUDA: TileLang 0.1.15 emits an undefined __pack_bfloat162 (seen on the H200)")
    if kind == "adaptive_avg":
        geometry = {"output_size": tuple(a["output_size"])}
    else:
        geometry = {"kernel": tuple(a["kernel"]), "stride": tuple(a.get("stride") or a["kernel"]),
                    "padding": tuple(a.get("padding", (0, 0))), "ceil_mode": bool(a.get("ceil_mode", False))}
    if kind == "max":
        geometry["dilation"] = tuple(a.get("dilation", (1, 1)))
    if kind == "avg":
        geometry["count_include_pad"] = bool(a.get("count_include_pad", True))
    if a.get("channels_last", False):
        geometry["channels_last"] = True
    out_shape = tuple(anchor.outputs[0].type.shape)
    require(pool.output_shape(xs, kind, **{k: v for k, v in geometry.items() if k != "count_include_pad"})
             == out_shape, f"{anchor.op} output {out_shape} differs from the template's")
    pos = b.members.index(anchor)
    before, after = b.members[:pos], b.members[pos + 1:]
    loaded, env = loaded_operand(b, x, before, lambda t: tuple(t.shape) == xs,
                                  f"the {anchor.op} input is not built from an operand of its shape")
    producer = env.get(x) if x in b.produced else None
    pre_values = [o for o in b.region.outputs if o in env]
    for o in pre_values:
        require(env[o] == producer, f"the {anchor.op} region writes an intermediate other than its input")
    n_pro = len(b.args)
    cenv = b.pointwise(after, {anchor.outputs[0].name: Acc()})
    outs = [o for o in b.region.outputs if o not in pre_values]
    require(all(o in cenv for o in outs) and len({cenv[o] for o in outs}) == 1,
             f"the {anchor.op} region writes more than its pooled result")
    consumer = cenv[outs[0]]
    extra_shapes = []
    for i, e in enumerate(b.args):
        t = tuple(b.types[e].shape)
        shape = t if i < n_pro and broadcast(t, xs) == xs else result_operand(t, out_shape) if i >= n_pro else None
        require(shape is not None, f"operand {e} ({b.types[e]}) does not broadcast against the {anchor.op}")
        extra_shapes.append(shape)
    pre_dtype = b.types[pre_values[0]].dtype if pre_values else None
    dtypes = (b.types[loaded].dtype, b.types[outs[0]].dtype, *(b.types[e].dtype for e in b.args))
    require(dtypes[0] in TEMPLATE_DTYPES, f"input dtype {dtypes[0]}")
    check_dtypes((*dtypes, pre_dtype or dtypes[0]), target, "pool2d")
    params = {"x_shape": xs, "kind": kind, **geometry, "x_dtype": dtypes[0], "out_dtype": dtypes[1],
              "producer": producer if producer != Acc() else None,
              "consumer": consumer if consumer != Acc() else None, "extra_shapes": tuple(extra_shapes),
              "extra_dtypes": dtypes[2:], "write_pre": bool(pre_values), "pre_dtype": pre_dtype}
    inputs = ((loaded, xs), *zip(b.args, extra_shapes))
    mapping = tuple((1 if o in pre_values else 0, o, tuple(b.types[o].shape)) for o in b.region.outputs)
    return KernelSpec("pool2d", tuple(params.items()), (-2, -1) if pre_values else (-1,), inputs, mapping,
                      tuple(b.pre))


def build_conv(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    x, w = anchor.inputs[0], anchor.inputs[1]
    xt, wt = b.types[x], b.types[w]
    a = anchor.attr
    last = bool(a.get("channels_last", False))
    g = conv_geometry(tuple(xt.shape), tuple(wt.shape), tuple(anchor.outputs[0].type.shape), a,
                      anchor.op == "conv_transpose")
    x, w, g = _through_views(b, anchor, g)
    require(xt.dtype in TEMPLATE_DTYPES, f"input dtype {xt.dtype}")
    exprs, mapping = epilogue_exprs(b, anchor, anchor.inputs[2] if len(anchor.inputs) > 2 else None,
                                    b.members[b.members.index(anchor) + 1:], "convolution")
    extra = list(b.args)
    extra_shapes = [_epilogue_shape(b, anchor, e, g, last) for e in extra]
    if last and _depthwise(g) and target.get("kind") == "cuda":
        return _depthwise_conv(b, x, w, g, exprs[0], mapping, extra, extra_shapes, target)
    if g.groups != 1 and not g.transposed and _taps(g) <= MAX_TAPS:
        return _grouped_conv(b, x, w, g, exprs[0], mapping, extra, extra_shapes, last, target)
    if g.groups == 1 and not g.transposed and _pointwise_conv(g):
        if last:
            return _conv_1x1_nhwc(b, x, w, g, exprs, mapping, extra, extra_shapes)
        return _conv_1x1_as_gemm(b, x, w, g, exprs, mapping, extra, extra_shapes)
    params = {"x_shape": g.x_shape, "w_shape": g.w_shape, "stride": g.stride, "padding": g.padding,
              "dilation": g.dilation, "in_dtype": xt.dtype, "out_dtype": b.types[b.region.outputs[0]].dtype,
              "epilogue": exprs[0] if exprs[0] != Acc() else None, "extra_shapes": tuple(extra_shapes),
              "extra_dtypes": tuple(b.types[e].dtype for e in extra)}
    if g.groups != 1:  # more taps than the elementwise kernel unrolls: a GEMM a group (the template's)
        params["groups"] = g.groups
    if g.transposed:
        params.update(transposed=True, output_padding=g.output_padding)
    if last:  # NHWC activations, the model's (O, C, KH, KW) weight
        params.update(layout="NHWC", weight_layout="OIHW")
    inputs = ((x, g.x_view), (w, g.w_view), *zip(extra, extra_shapes))
    return KernelSpec("conv2d", tuple(params.items()), (-1,), tuple(inputs), tuple(mapping), tuple(b.pre))


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution as the 2-D templates see it. A 1-D one, ``(N, C, L)`` by ``(O, C/g, K)``, is the 2-D
    convolution of ``(N, C, 1, L)`` by ``(O, C/g, 1, K)`` with unit stride, no padding and no dilation along the
    new H; ``x_view`` and ``w_view`` are those shapes (None for a 2-D convolution, whose tensors are read as they
    are). ``out_shape`` is the output as the kernel writes it; the region's outputs are reshaped from it."""

    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    one_d: bool = False
    transposed: bool = False  # a transposed convolution: the weight is (C, O / groups, KH, KW)
    output_padding: tuple[int, int] = (0, 0)
    x_view: tuple[int, ...] | None = None
    w_view: tuple[int, ...] | None = None


def conv_geometry(x_shape: tuple, w_shape: tuple, out_shape: tuple, attr: dict,
                  transposed: bool = False) -> ConvGeometry:
    """``ConvGeometry`` of a ``conv`` (or ``conv_transpose``) node's shapes and attributes; NotLowerable for 3-D
    convolutions and 1-D ones channels last (``planner.layout`` makes none)."""
    groups = int(attr.get("groups", 1))
    if len(w_shape) == 4:
        require(len(x_shape) == 4, f"an unbatched convolution of {x_shape}")
        return ConvGeometry(x_shape, w_shape, out_shape, tuple(attr.get("stride", (1, 1))),
                            tuple(attr.get("padding", (0, 0))), tuple(attr.get("dilation", (1, 1))), groups,
                            transposed=transposed, output_padding=tuple(attr.get("output_padding", (0, 0))))
    require(len(w_shape) == 3, "only 1-D and 2-D convolutions")
    require(len(x_shape) == 3, f"an unbatched convolution of {x_shape}")
    require(not attr.get("channels_last", False), "a 1-D convolution channels last")
    (s,), (p,), (d,), (op,) = (tuple(attr.get(k, (v,))) for k, v in (("stride", 1), ("padding", 0), ("dilation", 1),
                                                                      ("output_padding", 0)))
    x4, w4 = (x_shape[0], x_shape[1], 1, x_shape[2]), (w_shape[0], w_shape[1], 1, w_shape[2])
    return ConvGeometry(x4, w4, (out_shape[0], out_shape[1], 1, out_shape[2]), (1, s), (0, p), (1, d), groups,
                        True, transposed, (0, op), x4, w4)


def _through_views(b: Builder, anchor: Node, g: ConvGeometry) -> tuple[str, str, ConvGeometry]:
    """The values the kernel reads for the convolution's input and weight: where the region's prologue reshapes
    them (torch's unbatched convolution unsqueezes its input), the values before those views, read at the shapes
    the convolution sees."""
    pro = b.members[:b.members.index(anchor)]
    require(all(n.op in PASS_VIEWS for n in pro), "a prologue before the convolution")
    by_out = {v.name: n for n in pro for v in n.outputs}
    roots, seen = [], set()
    for v in anchor.inputs[:2]:
        while v in by_out:
            seen.add(by_out[v].name)
            v = by_out[v].inputs[0]
        roots.append(v)
    require(seen == {n.name for n in pro}, "a prologue before the convolution")
    x, w = roots
    if x != anchor.inputs[0]:
        g = replace(g, x_view=g.x_shape)
    if w != anchor.inputs[1]:
        g = replace(g, w_view=g.w_shape)
    return x, w, g


def _epilogue_shape(b: Builder, anchor: Node, e: str, g: ConvGeometry, last: bool) -> tuple[int, ...]:
    """The shape an epilogue operand is read at against the kernel's 4-D output (right-aligned broadcasting): a
    per-channel (C,) vector (the convolution's bias, a batch norm's) as ``(C, 1, 1)`` channels first (as it is
    channels last); another operand of a 1-D convolution with the new H put in; any other as it is."""
    t = tuple(b.types[e].shape)

    def per_channel(n: Node) -> bool:
        return (n is anchor or n.op == "batch_norm") and e in n.inputs[1:] and e != n.inputs[0]

    if any(per_channel(n) for n in b.members):
        require(all(per_channel(n) for n in b.members if e in n.inputs),
                f"{e} is a per-channel vector and read otherwise too")
        require(t == (g.out_shape[-1 if last else 1],), f"a per-channel vector of shape {t}")
        return t if last else (t[0], 1, 1)
    if g.one_d and len(t) >= 2:  # (..., O, L') -> (..., O, 1, L')
        return (*t[:-1], 1, t[-1])
    return t


def _taps(g: ConvGeometry) -> int:
    """Products an output element sums: its group's input channels times the kernel's taps."""
    return g.w_shape[1] * g.w_shape[2] * g.w_shape[3]


def _pointwise_conv(g: ConvGeometry) -> bool:
    """A 1x1 convolution with unit stride, no padding or dilation: a (batched) GEMM."""
    return g.w_shape[2:] == (1, 1) and g.stride == (1, 1) and g.padding == (0, 0) and g.dilation == (1, 1)


def _conv_1x1_as_gemm(b: Builder, x: str, w: str, g: ConvGeometry, exprs, mapping, extra, extra_shapes) -> KernelSpec:
    """``out[n] = W (O, C) @ x[n] (C, H*W)``: the NCHW output is the GEMM's (N, O, H*W) output as it lies in
    memory, and x is read as (N, C, H*W) with H*W contiguous (the tensor-core GEMM template's TMA loads), where
    the implicit-GEMM convolution gathers element by element. Epilogue operands broadcast against
    (N, O, H, W) are read as (N, O, H*W); one that broadcasts along only one of H and W cannot be, and the
    region keeps the convolution template."""
    Nb, C, H, W = g.x_shape
    O = g.w_shape[0]
    gemm_shapes = []
    for s in extra_shapes:
        d0, d1, d2, d3 = (1,) * (4 - len(s)) + tuple(s)
        require((d2, d3) in ((1, 1), (H, W)), f"an epilogue operand {tuple(s)} broadcast along H or W alone")
        gemm_shapes.append((d0, d1, 1 if (d2, d3) == (1, 1) else H * W))
    return gemm_spec(b, O, H * W, C, (w, (O, C)), (x, (Nb, C, H * W)), exprs[0], mapping, extra, gemm_shapes,
                      batch_B=(Nb,))


def _conv_1x1_nhwc(b: Builder, x: str, w: str, g: ConvGeometry, exprs, mapping, extra, extra_shapes) -> KernelSpec:
    """``out (N*H*W, O) = x (N*H*W, C) @ W (O, C)^T``: on NHWC data a 1x1 convolution is one plain GEMM, a
    linear layer over the pixels. Epilogue operands read in its (rows, cols) domain: the full output, a
    per-channel vector or a scalar."""
    Nb, H, W, C = g.x_shape
    O, M = g.w_shape[0], Nb * H * W
    shapes = tuple(domain_shape(TensorType(tuple(s), "float32"), M, O) for s in extra_shapes)
    return gemm_spec(b, M, O, C, (x, (M, C)), (w, (O, C)), exprs[0], mapping, extra, shapes, trans_B=True)


def _grouped_conv(b: Builder, x: str, w: str, g: ConvGeometry, epilogue: Expr, mapping, extra: list,
                  extra_shapes: list, last: bool, target: dict) -> KernelSpec:
    """A grouped convolution and its epilogue as one ``elementwise`` kernel: each output element sums its taps,
    ``x`` at the input position a tap reads (0 where that lies in the padding) times the tap's weight, in the
    epilogue's place of the accumulator. Inputs: the epilogue's operands (``Arg`` i as ``epilogue_exprs`` numbers
    them), then ``x`` and ``w``. Padding is never read: a tap's index is clamped into the input and its value
    selected away (TIR's ``Select`` may evaluate both sides)."""
    xs, ws, out_shape = g.x_shape, g.w_shape, g.out_shape
    O, Cg, KH, KW = ws
    require(O % g.groups == 0, f"a grouped convolution of {xs} by {ws}")
    stride, pad, dil = g.stride, g.padding, g.dilation
    if last:
        (n, oh, ow, o), (H, W) = index.coords(out_shape), xs[1:3]
        OH, OW = out_shape[1:3]
    else:
        (n, o, oh, ow), (H, W) = index.coords(out_shape), xs[2:]
        OH, OW = out_shape[2:]
    xi, wi = len(extra), len(extra) + 1
    zero = Const(0.0, "float32")

    def taps(out: Expr, size: int, n_out: int, k: int, dim: int) -> list[tuple[Expr, Expr | None]]:
        """For each tap along one spatial dim: the input index it reads (clamped) and when it lies inside."""
        found = []
        for t in range(k):
            off = t * dil[dim] - pad[dim]
            at = index.add(index.mul(out, stride[dim]), index.lit(off))
            lo, hi = off < 0, (n_out - 1) * stride[dim] + off > size - 1
            inside = _all_of(([index.cmp("ge", at, 0)] if lo else []) + ([index.cmp("lt", at, size)] if hi else []))
            found.append((index.clamp(at, 0 if lo else None, size - 1 if hi else None), inside))
        return found

    rows, cols = taps(oh, H, OH, KH, 0), taps(ow, W, OW, KW, 1)
    first = index.mul(index.floordiv(o, O // g.groups), Cg)  # the group's first input channel
    total: Expr | None = None
    for c in range(Cg):
        ch = index.add(first, index.lit(c))
        for i, (hi, hin) in enumerate(rows):
            for j, (wj, win) in enumerate(cols):
                v: Expr = Load(xi, (n, hi, wj, ch) if last else (n, ch, hi, wj))
                inside = _all_of([e for e in (hin, win) if e is not None])
                if inside is not None:
                    v = Call("where", (inside, v, zero))
                term = Call("mul", (v, Load(wi, (o, index.lit(c), index.lit(i), index.lit(j)))))
                total = term if total is None else Call("add", (total, term))
    expr = substitute(epilogue, {Acc(): total})
    n_nodes = tree_size([expr])
    require(n_nodes <= index.MAX_EXPR_NODES, f"the convolution unfolds to {n_nodes} nodes")
    in_shapes = (*(tuple(s) for s in extra_shapes), xs, ws)
    in_dtypes = (*(b.types[e].dtype for e in extra), b.types[x].dtype, b.types[w].dtype)
    out_dtype = b.types[b.region.outputs[0]].dtype
    check_dtypes((*in_dtypes, out_dtype), target, "elementwise")
    params = {"in_shapes": in_shapes, "in_dtypes": in_dtypes, "exprs": (expr,), "out_dtypes": (out_dtype,),
              "out_shapes": (out_shape,)}
    inputs = (*zip(extra, (tuple(s) for s in extra_shapes)), (x, g.x_view), (w, g.w_view))
    return KernelSpec("elementwise", tuple(params.items()), (-1,), tuple(inputs), tuple(mapping), tuple(b.pre))


def _depthwise(g: ConvGeometry) -> bool:
    """A 2-D convolution with a group a channels-last input channel (ConvNeXt's 7x7, MobileNet's and EfficientNet's
    3x3 and 5x5): the weight is (C * mult, 1, KH, KW)."""
    return (not g.transposed and not g.one_d and g.groups > 1 and g.groups == g.x_shape[3] and g.w_shape[1] == 1
            and g.x_view is None and g.w_view is None)


def _depthwise_conv(b: Builder, x: str, w: str, g: ConvGeometry, epilogue: Expr, mapping, extra: list,
                    extra_shapes: list, target: dict) -> KernelSpec:
    """A depthwise convolution over NHWC data and its epilogue as one ``depthwise_conv2d`` kernel (on CUDA: the
    elementwise form of ``_grouped_conv`` reads each tap's input and weight from global memory, ConvNeXt-T's 7x7 at
    1.79 ms against cuDNN's 0.19 on an H100; the template's picks ran 1.12-3.5x cuDNN at ConvNeXt-T's and
    EfficientNet-B0's shapes on the H200, bench/results/2026-12-07-h200-session56)."""
    require(depthwise.output_shape(g.x_shape, g.w_shape, g.stride, g.padding, g.dilation) == tuple(g.out_shape),
            f"a depthwise convolution's output {g.out_shape}")
    dtypes = (b.types[x].dtype, b.types[w].dtype, b.types[b.region.outputs[0]].dtype)
    check_dtypes((*dtypes, *(b.types[e].dtype for e in extra)), target, "depthwise_conv2d")
    params = {"x_shape": g.x_shape, "w_shape": g.w_shape, "stride": g.stride, "padding": g.padding,
              "dilation": g.dilation, "in_dtype": dtypes[0], "w_dtype": dtypes[1], "out_dtype": dtypes[2],
              "epilogue": epilogue if epilogue != Acc() else None, "extra_shapes": tuple(map(tuple, extra_shapes)),
              "extra_dtypes": tuple(b.types[e].dtype for e in extra)}
    inputs = ((x, None), (w, None), *zip(extra, (tuple(s) for s in extra_shapes)))
    return KernelSpec("depthwise_conv2d", tuple(params.items()), (-1,), tuple(inputs), tuple(mapping), tuple(b.pre))


def _all_of(conds: list[Expr]) -> Expr | None:
    """The conjunction of ``conds`` (None for none)."""
    return None if not conds else conds[0] if len(conds) == 1 else Call("logical_and", tuple(conds))

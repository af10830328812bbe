"""Channels-last: a convolutional network's 4-D activations run as NHWC between its first convolution and
the ops that need them channels first.

Note: an NCHW convolution costs layout changes on both sides on the GPU (cuDNN's fast fp16 kernels are
NHWC: on ResNet-50 b64, 37 input and 21 output transposes, 0.74 of 4.9 ms on the H200), and a 1x1
convolution on NHWC data is one plain GEMM, (N*H*W, C) x (C, O), where NCHW needs a batched one. So the
pass rewrites, as Inductor's layout optimization does, the convolutions, batch norms, 2-D pools, spatial
means, the elementwise ops and concatenations between them to act on (N, H, W, C) tensors (``channels_last=True``;
weights stay (O, C, KH, KW), channel vectors become (C,)-shaped). A value enters through one permute
(the image) and leaves through one where an op outside the set (a reshape, a linear layer) or the
graph's caller reads it; where H = W = 1 that is a reshape. Graph outputs keep their names and layout. A model that
permutes to channels last itself (ConvNeXt's blocks) reads the NHWC value as it is: the two permutes compose to none.
A pure function: the graph it returns computes the same values (checked in tests against the original).
"""

from __future__ import annotations

import torch

from tilefuse import ops
from tilefuse.ir import Graph, Node, TensorType, Value
from tilefuse.planner.canonicalize import simplify

TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
POOLS = ops.with_trait("pool")
AXIS_OPS = ops.with_trait("axis")  # pointwise ops whose attributes or operands name an axis: not layout-free


def _pointwise(op: str) -> bool:
    return ops.has(op) and ops.get(op).kind in ops.FUSIBLE_POINTWISE and op not in AXIS_OPS


def _spatial_mean(n: Node, rank: int) -> bool:
    dims = n.attr.get("dims")
    return dims is not None and {d % rank for d in dims} == {2, 3}


def _takes_nhwc(n: Node, types: dict[str, TensorType], nhwc: set[str]) -> bool:
    """Does ``n`` run channels last (given which of its inputs already are)?"""
    def rank4(v: str) -> bool:
        return bool(v) and types[v].shape is not None and len(types[v].shape) == 4

    x = n.inputs[0] if n.inputs else ""
    if len(n.outputs) != 1 or not x:
        return False
    if n.op == "conv":
        return rank4(x) and len(types[n.inputs[1]].shape) == 4 and not n.attr.get("channels_last", False)
    if n.op == "permute":  # a model's own NHWC -> NCHW (ConvNeXt's blocks): its input is the value channels last
        return rank4(x) and x not in nhwc and tuple(n.attr["perm"]) == TO_NCHW
    if n.op == "pad":  # constant, of H and W only (EfficientNet's zero pad before a strided depthwise convolution;
        # torch pads three dims of a 4-D tensor in constant mode only)
        return x in nhwc and rank4(x) and len(n.attr["pads"]) <= 4 and n.attr.get("mode", "constant") == "constant"
    if n.op in ("batch_norm", *POOLS):
        dims = n.attr.get("kernel") or n.attr.get("output_size") or (0, 0)
        return x in nhwc and len(dims) == 2 and not n.attr.get("channels_last", False)
    if n.op == "mean":
        return x in nhwc and _spatial_mean(n, 4)
    if (_pointwise(n.op) or n.op == "concat") and rank4(n.outputs[0].name):
        return any(i in nhwc for i in n.inputs if i)
    return False


def channels_last(graph: Graph) -> Graph:
    """``graph`` with its 2-D convolution network's activations in NHWC (see the module note); unchanged if it
    has no 2-D convolution, or a shape not known yet (it is planned again once specialized)."""
    types = {k: v.type for k, v in graph.values().items()}
    if not all(t.is_static for t in types.values()):
        return graph
    nhwc: set[str] = set()  # values (original names) computed channels last
    rewrite: set[str] = set()  # nodes that run channels last
    for n in graph.nodes:
        if _takes_nhwc(n, types, nhwc):
            rewrite.add(n.name)
            if not (n.op == "mean" and not n.attr.get("keepdim")):  # a mean to (N, C) has no layout left
                nhwc.add(n.outputs[0].name)
    convs = sum(1 for n in graph.nodes if n.name in rewrite and n.op == "conv")
    if convs < 2:  # one convolution (a ViT's patch embedding) gains nothing and pays two transposes
        return graph
    return simplify(_Rewriter(graph, types, nhwc, rewrite).run())  # (the model's own permutes after ours: one each)


class GraphEdit:
    """A graph's nodes rewritten into ``nodes``: fresh names, and new nodes typed as they are made."""

    def __init__(self, graph: Graph, types: dict[str, TensorType]):
        self.graph, self.types = graph, types
        self.used = set(types) | {n.name for n in graph.nodes}
        self.nodes: list[Node] = []

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def emit(self, op: str, inputs: tuple[str, ...], attrs: dict, out: str | None = None, base: str = "",
             node: str | None = None) -> str:
        """A new node ``op`` (named ``node``, else after ``base``) writing ``out`` (else a fresh name)."""
        in_types = [self.types[i] if i else None for i in inputs]
        (t,) = ops.infer_types(op, in_types, attrs, node=node or base or op)
        out = out or self.fresh(base or op)
        self.types[out] = t
        self.nodes.append(Node(node or self.fresh(f"{base}_{op}"), op, inputs, (Value(out, t),), attrs))
        return out


class _Rewriter(GraphEdit):
    def __init__(self, graph: Graph, types: dict[str, TensorType], nhwc: set[str], rewrite: set[str]):
        super().__init__(graph, types)
        self.nhwc, self.rewrite = nhwc, rewrite
        self.last: dict[str, str] = {v: self.fresh(f"{v}_nhwc") for v in nhwc}  # channels-last name of each
        self.first: dict[str, str] = {}  # channels-first copies made of nhwc values
        self.vectors: dict[str, str] = {}  # operands broadcast against NHWC values, rearranged

    def _reshape_or_permute(self, v: str, perm: tuple[int, ...], out: str | None, base: str) -> str:
        """``v`` (right-aligned to rank ``len(perm)``) permuted by ``perm``: a reshape where only size-1 dims
        move."""
        shape = tuple(self.types[v].shape)
        padded = (1,) * (len(perm) - len(shape)) + shape
        moved = tuple(padded[p] for p in perm)
        kept = [p for p in perm if padded[p] != 1]  # the dims that hold data, in their new order
        if kept == sorted(kept):  # (not sizes compared: NHWC and NCHW are one shape where C = H = W)
            return self.emit("reshape", (v,), {"shape": moved}, out, base)
        if padded != shape:
            v = self.emit("reshape", (v,), {"shape": padded}, base=f"{base}_4d")
        return self.emit("permute", (v,), {"perm": perm}, out, base)

    def channels_first(self, v: str, out: str | None = None) -> str:
        """The NCHW value of NHWC-computed ``v`` (made once)."""
        if v not in self.first:
            self.first[v] = self._reshape_or_permute(self.last[v], TO_NCHW, out, f"{v}_nchw")
        return self.first[v]

    def operand(self, v: str) -> str:
        """``v`` as an operand of a channels-last op of rank 4: computed so, or rearranged once."""
        if not v or v in self.nhwc:
            return self.last.get(v, v)
        if v not in self.vectors:
            shape = tuple(self.types[v].shape)
            if all(d == 1 for d in shape):
                self.vectors[v] = v  # a scalar broadcasts either way
            else:
                self.vectors[v] = self._reshape_or_permute(v, TO_NHWC, None, f"{v}_nhwc")
        return self.vectors[v]

    def run(self) -> Graph:
        for n in self.graph.nodes:
            if n.name in self.rewrite:
                self._rewrite(n)
            else:
                ins = tuple(self.channels_first(i) if i in self.nhwc else i for i in n.inputs)
                self.nodes.append(Node(n.name, n.op, ins, n.outputs, n.attrs))
        outputs = []
        for o in self.graph.outputs:
            if o in self.nhwc and o not in self.first:
                self.channels_first(o, out=o)  # the caller's value under its own name
            outputs.append(self.first.get(o, o))
        # A graph output that was also read channels first inside got another name: alias it back.
        renamed = {self.first[o]: o for o in self.graph.outputs if o in self.first and self.first[o] != o}
        if renamed:
            self.nodes = [Node(n.name, n.op, tuple(renamed.get(i, i) for i in n.inputs),
                               tuple(Value(renamed.get(v.name, v.name), v.type) for v in n.outputs), n.attrs)
                          for n in self.nodes]
            outputs = [renamed.get(o, o) for o in outputs]
        return self.graph.replace(nodes=tuple(self.nodes), outputs=tuple(outputs)).verify()

    def _rewrite(self, n: Node) -> None:
        attrs, name, x = n.attr, n.name, n.inputs[0]
        if n.op == "permute":  # (to channels first: no node; its readers channels last read its input)
            self.last[n.outputs[0].name] = x
        elif n.op == "pad":  # (W, H) pads move behind C's, which has none
            pads = tuple(attrs["pads"]) + (0,) * (4 - len(attrs["pads"]))
            self.emit("pad", (self.last[x],), {**attrs, "pads": (0, 0, *pads)}, self.last[n.outputs[0].name],
                      node=name)
        elif n.op == "conv":
            x, attrs = self._strided_pointwise(n, self.operand(x))
            self.emit("conv", (x, *n.inputs[1:]), {**attrs, "channels_last": True}, self.last[n.outputs[0].name],
                      node=name)
        elif n.op in ("batch_norm", *POOLS):
            self.emit(n.op, (self.last[x], *n.inputs[1:]), {**attrs, "channels_last": True},
                      self.last[n.outputs[0].name], node=name)
        elif n.op == "mean":  # over H and W: an adaptive average pool to 1x1, (N, 1, 1, C)
            keep = attrs.get("keepdim")
            pooled = self.emit("adaptive_avg_pool", (self.last[x],), {"output_size": (1, 1), "channels_last": True},
                               self.last[n.outputs[0].name] if keep else None, base=name, node=name)
            if not keep:
                self.emit("reshape", (pooled,), {"shape": tuple(n.outputs[0].type.shape)}, n.outputs[0].name,
                          base=name)
        else:  # elementwise, or a concat (of channels: a UNet's skip connection) along the same dim, moved
            if n.op == "concat":
                attrs = {**attrs, "dim": TO_NHWC.index(attrs["dim"] % 4)}
            self.emit(n.op, tuple(self.operand(i) for i in n.inputs), attrs, self.last[n.outputs[0].name],
                      node=name)

    def _strided_pointwise(self, n: Node, x: str) -> tuple[str, dict]:
        """(input, attributes) of conv ``n`` on NHWC ``x``: a 1x1 convolution with a stride, no padding or dilation
        (ResNet's downsampling shortcut) reads every stride-th pixel, so it is that strided slice of x, then a 1x1
        convolution with unit stride: one plain GEMM (``lowering.conv_builder``) where the strided one is an
        implicit-GEMM convolution gathering element by element (0.13 ms at ResNet-50's 50176x512x256 on the H100,
        against 0.09 for cuDNN and torch's batch norm)."""
        a = n.attr
        stride = tuple(a.get("stride") or (1, 1))
        w = self.types[n.inputs[1]].shape
        if len(stride) != 2 or stride == (1, 1) or tuple(w[2:]) != (1, 1) or a.get("groups", 1) != 1 or \
                any(tuple(a.get(k) or (v, v)) != (v, v) for k, v in (("padding", 0), ("dilation", 1))):
            return x, a
        for dim, step in ((1, stride[0]), (2, stride[1])):
            if step != 1:
                x = self.emit("slice", (x,), {"dim": dim, "start": 0, "end": None, "step": step},
                              base=f"{n.name}_s{dim}")
        return x, {**a, "stride": (1, 1)}


# ---- aligned GEMM outputs -----------------------------------------------------------------------------------------

# Note: a GEMM whose output rows are not a multiple of 16 bytes (GPT-2's LM head, N = 50257 in fp16) gets no vector or
# TMA stores: cuBLAS falls back to an old kernel (7.4 ms for 8192 x 50257 x 768 on the H200; our kernel with guarded
# stores 1.64 ms), where the same product with N rounded up to 50264 takes 0.93 ms in cuBLAS. So, as Inductor's
# shape padding does, such a linear layer computes N' = N rounded up to 16 bytes of output from its weight padded with
# zero rows (a copy per call: 0.036 ms there; a constant weight, an ONNX model's, is padded once when the graph is
# planned), and its value is the first N columns, a view whose rows are N' apart (Inductor returns the same strided
# view). Not for few rows (a decode step), where the weight's copy would cost as much as the product.
ALIGN_BYTES = 16
ALIGN_MIN_ROWS = 1024  # the padded weight's copy is ~150/M of the GEMM's time at M rows (H200: 4.8 TB/s, ~700 TF/s)
ALIGN_TARGETS = ("cuda", "hip")


def aligned_gemm_outputs(graph: Graph, target: dict | None) -> Graph:
    """``graph`` with each large ``linear`` whose output rows are not ``ALIGN_BYTES``-aligned computed padded (see the
    note); unchanged off ``ALIGN_TARGETS`` or where no linear needs it. A pure function: the values are the same."""
    if target is None or target.get("kind") not in ALIGN_TARGETS:
        return graph
    types = {k: v.type for k, v in graph.values().items()}
    todo = [n for n in graph.nodes if _unaligned_linear(n, types)]
    if not todo:
        return graph
    edit, constants, folded = GraphEdit(graph, types), dict(graph.constants), set()

    def padded(v: str, pads: tuple[int, ...]) -> str:
        """``v`` with zero rows added: a constant (an ONNX model's weight) padded once here, else a pad node."""
        if v not in constants:
            return edit.emit("pad", (v,), {"pads": pads, "mode": "constant", "value": 0.0}, base=f"{v}_pad")
        name = edit.fresh(f"{v}_padded")
        constants[name] = torch.nn.functional.pad(constants[v], pads)
        types[name] = TensorType(tuple(constants[name].shape), types[v].dtype)
        folded.add(v)
        return name

    pad = {n.name for n in todo}
    for n in graph.nodes:
        if n.name not in pad:
            edit.nodes.append(n)
            continue
        x, w, *rest = n.inputs
        y = n.outputs[0]
        rows = types[w].shape[0]
        extra = _padded(rows, y.type.dtype) - rows
        w = padded(w, (0, 0, 0, extra))
        bias = tuple(padded(b, (0, extra)) if b else b for b in rest)
        wide = edit.emit("linear", (x, w, *bias), n.attr, out=edit.fresh(f"{y.name}_padded"), node=n.name)
        edit.emit("slice", (wide,), {"dim": len(types[wide].shape) - 1, "start": 0, "end": rows, "step": 1},
                  out=y.name, base=y.name)
    nodes = edit.nodes
    read = {i for n in nodes for i in n.inputs} | set(graph.outputs)
    constants = {k: c for k, c in constants.items() if k not in folded or k in read}  # the unpadded copy, if unread
    return graph.replace(nodes=tuple(nodes), constants=constants).verify()


def _padded(n: int, dtype: str) -> int:
    per = ALIGN_BYTES // _itemsize(dtype)
    return -(-n // per) * per


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4}.get(dtype, 0)


def _unaligned_linear(n: Node, types: dict[str, TensorType]) -> bool:
    """A static ``linear`` of a float dtype, ``ALIGN_MIN_ROWS`` rows or more, aligned K, unaligned N."""
    if n.op != "linear" or len(n.outputs) != 1 or len(n.inputs) < 2:
        return False
    x, w = types[n.inputs[0]], types[n.inputs[1]]
    y = n.outputs[0].type
    size = _itemsize(y.dtype)
    if not size or not (x.is_static and w.is_static and y.is_static) or len(w.shape) != 2:
        return False
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    n_out, k = w.shape
    return rows >= ALIGN_MIN_ROWS and (k * size) % ALIGN_BYTES == 0 and (n_out * size) % ALIGN_BYTES != 0

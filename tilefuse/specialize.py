"""Specialize a graph with symbolic dims to concrete input shapes (a pure pass).

Note: templates need static shapes, so a graph imported with symbolic dims (an ONNX model with a
``batch`` dim) is specialized per input signature before planning and lowering: input dims are
bound, every node's output type is inferred again through the op registry, and the graph is
verified. A dim bound twice to different sizes, or an input that does not fit its declared rank or
static dims, is an error naming the input.
"""

from __future__ import annotations

from typing import Sequence

import torch

from tilefuse import ops
from tilefuse.ir import Graph, Node, TensorType, Value


def is_static(graph: Graph) -> bool:
    return all(v.type.is_static for v in graph.inputs)


def bind_dims(graph: Graph, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    """The value of each symbolic input dim given concrete input ``shapes``."""
    if len(shapes) != len(graph.inputs):
        raise ValueError(f"{graph.name}: expected {len(graph.inputs)} inputs, got {len(shapes)}")
    bound: dict[str, int] = {}
    for v, shape in zip(graph.inputs, shapes):
        declared = v.type.shape
        if declared is None:
            continue
        if len(declared) != len(shape):
            raise ValueError(f"{graph.name}: input {v.name!r} has rank {len(shape)}, expected {v.type}")
        for d, s in zip(declared, shape):
            if isinstance(d, int):
                if d != s:
                    raise ValueError(f"{graph.name}: input {v.name!r} has shape {tuple(shape)}, expected {v.type}")
            elif bound.setdefault(d, int(s)) != s:
                raise ValueError(f"{graph.name}: dim {d!r} is {bound[d]} in one input and {s} in {v.name!r}")
    return bound


def specialize(graph: Graph, shapes: Sequence[Sequence[int]]) -> Graph:
    """``graph`` with its inputs fixed to ``shapes`` and every type inferred again."""
    bind_dims(graph, shapes)
    types: dict[str, TensorType] = {k: TensorType.of(t) for k, t in graph.constants.items()}
    inputs = []
    for v, shape in zip(graph.inputs, shapes):
        t = TensorType(tuple(int(s) for s in shape), v.type.dtype)
        inputs.append(Value(v.name, t))
        types[v.name] = t
    nodes = []
    for n in graph.nodes:
        in_types = [types[i] if i else None for i in n.inputs]
        try:
            outs = ops.infer_types(n.op, in_types, n.attr, node=n.name)
        except ops.InferenceError:
            outs = [o.type for o in n.outputs]  # e.g. a fallback op whose inference needs its recorded types
        if len(outs) != len(n.outputs):
            outs = [o.type for o in n.outputs]
        new_outs = []
        for o, t in zip(n.outputs, outs):
            t = t if t.shape is not None or o.type.shape is None else TensorType(None, o.type.dtype)
            if t.dtype != o.type.dtype and t.shape is not None:
                t = TensorType(t.shape, o.type.dtype)
            types[o.name] = t
            new_outs.append(Value(o.name, t))
        nodes.append(Node(n.name, n.op, n.inputs, tuple(new_outs), n.attrs))
    return graph.replace(inputs=tuple(inputs), nodes=tuple(nodes)).verify()


def signature(args: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.device.type) for a in args)

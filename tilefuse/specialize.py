"""Specialize a graph with symbolic dims to concrete input shapes (a pure pass).

Note: templates need static shapes, so a graph imported with symbolic dims (an ONNX model with a
``batch`` dim) is specialized per input signature before planning and lowering: input dims are
bound, every node's output type is inferred again through the op registry, and the graph is
verified. A dim bound twice to different sizes, or an input that does not fit its declared rank or
static dims, is an error naming the input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tilefuse import ops
from tilefuse.ir import Graph, Node, TensorType, Value, prune, torch_dtype


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


FOLD_LIMIT = 4096  # elements: shape arithmetic folds into constants, activations never do


def specialize(graph: Graph, shapes: Sequence[Sequence[int]]) -> Graph:
    """``graph`` with its inputs fixed to ``shapes``, every type inferred again, and the shape
    arithmetic that became constant (``shape_of`` a static value and what is computed from it)
    folded, so runtime-shape ops (``reshape_dynamic``...) get static output types."""
    bind_dims(graph, shapes)
    consts: dict[str, torch.Tensor] = dict(graph.constants)
    types: dict[str, TensorType] = {k: TensorType.of(t) for k, t in consts.items()}
    inputs = []
    for v, shape in zip(graph.inputs, shapes):
        t = TensorType(tuple(int(s) for s in shape), v.type.dtype)
        inputs.append(Value(v.name, t))
        types[v.name] = t
    nodes = []
    for n in graph.nodes:
        folded = _fold(n, consts, types)
        if folded is not None:
            for v, t in zip(n.outputs, folded):
                consts[v.name], types[v.name] = t, TensorType.of(t)
            continue
        outs = _infer(n, consts, types)
        new_outs = []
        for o, t in zip(n.outputs, outs):
            types[o.name] = t
            new_outs.append(Value(o.name, t))
        nodes.append(Node(n.name, n.op, n.inputs, tuple(new_outs), n.attrs))
    return prune(graph.replace(inputs=tuple(inputs), nodes=tuple(nodes), constants=consts)).verify()


def _fold(n: Node, consts: dict, types: dict) -> tuple[torch.Tensor, ...] | None:
    if n.op == "shape_of" and types[n.inputs[0]].is_static:
        a = n.attr
        return (torch.tensor(types[n.inputs[0]].shape[a.get("start", 0):a.get("end")], dtype=torch.int64),)
    if not n.inputs or not all(i in consts for i in n.inputs if i):
        return None
    if any(o.type.shape is not None and o.type.is_static and o.type.numel > FOLD_LIMIT for o in n.outputs):
        return None
    try:
        outs = ops.get(n.op).run([consts[i] if i else None for i in n.inputs], n.attr)
    except Exception:  # noqa: BLE001  (not foldable here: it stays a node and runs at run time)
        return None
    if len(outs) != len(n.outputs) or any(o.numel() > FOLD_LIMIT for o in outs):
        return None
    return outs


def _infer(n: Node, consts: dict, types: dict) -> list[TensorType]:
    """Output types from the registry; where those depend on data (a shape held in a constant
    tensor), from running the reference on uninitialized tensors of the now static input shapes."""
    in_types = [types[i] if i else None for i in n.inputs]
    try:
        outs = ops.infer_types(n.op, in_types, n.attr, node=n.name)
    except (ops.InferenceError, TypeError, ValueError):
        outs = [o.type for o in n.outputs]
    if len(outs) == len(n.outputs) and all(t.shape is not None and t.is_static for t in outs):
        return outs
    if all(i in consts or (types[i].is_static and types[i].numel <= 1 << 28) for i in n.inputs if i):
        try:
            args = [None if not i else consts[i] if i in consts else
                    torch.empty(types[i].shape, dtype=torch_dtype(types[i].dtype)) for i in n.inputs]
            real = ops.get(n.op).run(args, n.attr)
            if len(real) == len(n.outputs):
                return [TensorType.of(t) for t in real]
        except Exception:  # noqa: BLE001, S110  (cannot run it here: the recorded types stand)
            pass
    return [o.type if len(outs) != len(n.outputs) else t for o, t in zip(n.outputs, outs)]


def signature(args: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.device.type) for a in args)

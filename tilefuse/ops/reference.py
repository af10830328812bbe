"""The IR's meaning: run a graph (or some of its nodes) node by node through the registry's torch references.

Every compiled form of a graph is checked against this, and a region without a kernel runs through it.

Note: each intermediate is dropped right after its last use, so peak memory follows liveness
rather than the whole graph. Constants are moved to the target device once, when the executor is
built, not on every call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tilefuse.ir import Graph, TensorType, torch_dtype
from tilefuse.ops.registry import get


class ExecutionError(RuntimeError):
    """A node failed at run time; the message names the node and its op."""


def last_uses(graph: Graph) -> dict[int, list[str]]:
    """For each node index, the values whose last reader is that node (graph outputs excluded)."""
    last: dict[str, int] = {}
    for idx, n in enumerate(graph.nodes):
        for i in n.inputs:
            if i:
                last[i] = idx
    keep = set(graph.outputs) | set(graph.constants)
    frees: dict[int, list[str]] = {}
    for name, idx in last.items():
        if name not in keep:
            frees.setdefault(idx, []).append(name)
    return frees


def check_inputs(graph: Graph, args: Sequence[torch.Tensor]) -> None:
    """Raise a ``ValueError`` naming the first input whose count, rank, static dim or dtype is wrong."""
    if len(args) != len(graph.inputs):
        names = ", ".join(v.name for v in graph.inputs)
        raise ValueError(f"{graph.name}: expected {len(graph.inputs)} inputs ({names}), got {len(args)}")
    for v, a in zip(graph.inputs, args):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{graph.name}: input {v.name!r} must be a torch.Tensor, got {type(a).__name__}")
        t = v.type
        if t.shape is not None and (
                a.dim() != len(t.shape) or any(isinstance(d, int) and d != s for d, s in zip(t.shape, a.shape))):
            raise ValueError(f"{graph.name}: input {v.name!r} has shape {tuple(a.shape)}, expected {t}")
        if a.dtype != torch_dtype(t.dtype):
            raise ValueError(f"{graph.name}: input {v.name!r} has dtype {a.dtype}, expected {t.dtype}")


class Executor:
    """Runs ``graph`` on torch tensors (CPU or CUDA)."""

    def __init__(self, graph: Graph, device: torch.device | str = "cpu", check: bool = True):
        self.graph = graph
        self.device = torch.device(device)
        self.check = check
        self.constants = {k: t.to(self.device) for k, t in graph.constants.items()}
        self.specs = [get(n.op) for n in graph.nodes]
        self.attrs = [n.attr for n in graph.nodes]
        self.frees = last_uses(graph)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.check:
            check_inputs(self.graph, args)
        env: dict[str, torch.Tensor | None] = dict(self.constants)
        env.update({v.name: a for v, a in zip(self.graph.inputs, args)})
        for idx, (node, spec, attrs) in enumerate(zip(self.graph.nodes, self.specs, self.attrs)):
            inputs = [env[i] if i else None for i in node.inputs]
            outs = run_node(node, spec, inputs, attrs, self.device)
            if len(outs) != len(node.outputs):
                raise ExecutionError(f"node {node.name!r} ({node.op}) returned {len(outs)} outputs, "
                                     f"expected {len(node.outputs)}")
            for v, o in zip(node.outputs, outs):
                env[v.name] = o
            for name in self.frees.get(idx, ()):
                env.pop(name, None)
        return tuple(env[o] for o in self.graph.outputs)


def run_node(node, spec, inputs: list, attrs: dict, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Run one node through its reference; generators (no tensor inputs) land on ``device``."""
    try:
        outs = spec.run(inputs, attrs)
    except Exception as e:
        shapes = [None if x is None else f"{x.dtype}{list(x.shape)}" for x in inputs]
        raise ExecutionError(f"node {node.name!r} ({node.op}) failed on inputs {shapes}: {e}") from e
    if not node.inputs:
        outs = tuple(o.to(device) for o in outs)
    return outs


def run_graph(graph: Graph, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Run ``graph`` once on the device of its first input."""
    device = args[0].device if args else "cpu"
    return Executor(graph, device)(*args)


def types_of(args: Sequence[torch.Tensor]) -> list[TensorType]:
    return [TensorType.of(a) for a in args]


class NodesFn:
    """Some of a graph's nodes run through their references: ``fn(args)`` takes the values named ``inputs``
    and returns those named ``outputs`` (a fusion region without a kernel runs so). Each node runs the reference
    ``OpSpec.for_node`` gives it, which may keep state between calls (a channels-last convolution's weight)."""

    def __init__(self, graph: Graph, nodes: Sequence[str], inputs: Sequence[str], outputs: Sequence[str]):
        by_name = {n.name: n for n in graph.nodes}
        self.steps = [(n, get(n.op).for_node(n.attr), n.attr) for n in (by_name[m] for m in nodes)]
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)

    def __call__(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env = dict(zip(self.inputs, args))
        device = args[0].device if args else torch.device("cpu")
        for node, spec, attrs in self.steps:
            outs = run_node(node, spec, [env[i] if i else None for i in node.inputs], attrs, device)
            for v, o in zip(node.outputs, outs):
                env[v.name] = o
        return [env[o] for o in self.outputs]

"""Graph IR: small immutable values, nodes and graphs.

Note: a node names its inputs by value name; a graph is the ordered tuple of its nodes plus its
inputs, outputs and constants (weights). Everything is frozen: passes build new graphs
(``Graph.replace`` / ``dataclasses.replace``) instead of mutating. Dims are ints or strings
(symbolic dims such as ``"batch"``). Dtypes are torch dtype names without the ``torch.`` prefix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch

Dim = int | str

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
        "uint16", "uint32", "uint64", "complex64", "complex128",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    )
    if hasattr(torch, name)
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class TensorType:
    """Shape (ints or symbolic names) and dtype of a tensor. ``shape=None`` means unknown rank."""

    shape: tuple[Dim, ...] | None
    dtype: str

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(d) if not isinstance(d, str) else d for d in self.shape))
        torch_dtype(self.dtype)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int | None:
        if not self.is_static:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        n = self.numel
        return None if n is None else n * torch_dtype(self.dtype).itemsize

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorType:
        return cls(tuple(t.shape), dtype_name(t.dtype))

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


@dataclass(frozen=True)
class Value:
    """A named tensor: a graph input, a constant or a node output."""

    name: str
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.name}: {self.type}"


def freeze(v: Any) -> Any:
    """Make an attribute value hashable and printable (lists become tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, torch.Size):
        return tuple(v)
    if isinstance(v, Mapping):
        return tuple(sorted((k, freeze(x)) for k, x in v.items()))
    return v


@dataclass(frozen=True)
class Node:
    """One op application. ``inputs`` are value names ('' for an absent optional input)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if isinstance(self.attrs, Mapping):
            object.__setattr__(self, "attrs", tuple(sorted((k, freeze(v)) for k, v in self.attrs.items())))

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def __str__(self) -> str:
        outs = ", ".join(str(o) for o in self.outputs)
        ins = ", ".join(f"%{i}" if i else "_" for i in self.inputs)
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs)
        return f"{outs} = {self.op}({ins}{attrs})  # {self.name}"


@dataclass(frozen=True)
class Graph:
    """A dataflow graph in topological order.

    ``constants`` maps value names to tensors (weights); they are not graph inputs. ``outputs``
    names the values the graph returns, in order.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    constants: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("inputs", "outputs", "nodes"):
            object.__setattr__(self, f, tuple(getattr(self, f)))

    # -- lookup -------------------------------------------------------------------------------
    def values(self) -> dict[str, Value]:
        """Every value of the graph by name: inputs, constants and node outputs."""
        vals = {v.name: v for v in self.inputs}
        vals.update({k: Value(k, TensorType.of(t)) for k, t in self.constants.items()})
        for n in self.nodes:
            vals.update({o.name: o for o in n.outputs})
        return vals

    def producers(self) -> dict[str, Node]:
        return {o.name: n for n in self.nodes for o in n.outputs}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def output_values(self) -> list[Value]:
        vals = self.values()
        return [vals[o] for o in self.outputs]

    def replace(self, **changes: Any) -> Graph:
        return dataclasses.replace(self, **changes)

    # -- algorithms ---------------------------------------------------------------------------
    def to_networkx(self) -> nx.DiGraph:
        """Node-level DAG: one networkx node per graph node name, edges along data flow."""
        g = nx.DiGraph()
        prod = self.producers()
        for n in self.nodes:
            g.add_node(n.name, op=n.op)
            for i in n.inputs:
                if i in prod:
                    g.add_edge(prod[i].name, n.name, value=i)
        return g

    def verify(self) -> Graph:
        """Check the graph's invariants; raise ``GraphError`` naming the first broken one."""
        defined: set[str] = set()
        for v in self.inputs:
            _define(defined, v.name, "graph input")
        for k in self.constants:
            _define(defined, k, "constant")
        names: set[str] = set()
        for n in self.nodes:
            if n.name in names:
                raise GraphError(f"duplicate node name {n.name!r}")
            names.add(n.name)
            for i in n.inputs:
                if i and i not in defined:
                    raise GraphError(f"node {n.name!r} ({n.op}) reads {i!r} before it is defined")
            for o in n.outputs:
                _define(defined, o.name, f"output of node {n.name!r}")
        for o in self.outputs:
            if o not in defined:
                raise GraphError(f"graph output {o!r} is never defined")
        return self

    def __str__(self) -> str:
        lines = [f"graph {self.name}(" + ", ".join(str(v) for v in self.inputs) + ") {"]
        for k, t in self.constants.items():
            lines.append(f"  const %{k}: {TensorType.of(t)}")
        lines += [f"  {n}" for n in self.nodes]
        lines.append("  return " + ", ".join(f"%{o}" for o in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts


def prune(graph: Graph) -> Graph:
    """A new graph without the nodes and constants that no graph output depends on."""
    live = set(graph.outputs)
    keep: list[Node] = []
    for n in reversed(graph.nodes):
        if any(o.name in live for o in n.outputs):
            keep.append(n)
            live.update(i for i in n.inputs if i)
    consts = {k: t for k, t in graph.constants.items() if k in live}
    return graph.replace(nodes=tuple(reversed(keep)), constants=consts)


class GraphError(ValueError):
    """A graph broke one of its invariants."""


def _define(defined: set[str], name: str, what: str) -> None:
    if not name:
        raise GraphError(f"{what} has an empty name")
    if name in defined:
        raise GraphError(f"value {name!r} defined twice ({what})")
    defined.add(name)


# (op, input types (None for an absent input), attributes, node name) -> output types
InferTypes = Callable[[str, Sequence[TensorType | None], dict[str, Any], str], list[TensorType]]


class GraphBuilder:
    """Incremental construction of a ``Graph`` with unique names and type inference.

    ``b.add(op, inputs, **attrs)`` infers the output types with ``infer`` and returns the output value names.

    Note: the op registry sits above this module (``tilefuse.ops`` imports ``ir``, never the reverse), so
    the builder is handed its type inference: ``tilefuse.ops.GraphBuilder`` is this builder with the
    registry's ``infer_types``, the one frontends, passes and tests build. Without ``infer``, every ``add``
    must give its ``out_types``; one that does not raises ``RuntimeError`` (no type is guessed).
    """

    def __init__(self, name: str, infer: InferTypes | None = None):
        self.name = name
        self.infer = infer
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.types: dict[str, TensorType] = {}
        self._used: set[str] = set()
        self._used_nodes: set[str] = set()
        self._next: dict[tuple[int, str], int] = {}

    def fresh(self, base: str, used: set[str] | None = None) -> str:
        """A value name (or, with ``used=self._used_nodes``, a node name) not taken yet."""
        used = self._used if used is None else used
        base = _sanitize(base) or "v"
        name, i = base, self._next.get((id(used), base), 0)
        while name in used:
            name, i = f"{base}_{i}", i + 1
        self._next[(id(used), base)] = i
        used.add(name)
        return name

    def reserve(self, names: Iterable[str]) -> None:
        """Take ``names`` for values and nodes alike: a builder of nodes to add to an existing graph."""
        names = set(names)
        self._used |= names
        self._used_nodes |= names

    def input(self, name: str, type: TensorType) -> str:
        name = self.fresh(name)
        self.inputs.append(Value(name, type))
        self.types[name] = type
        return name

    def constant(self, name: str, tensor: torch.Tensor) -> str:
        name = self.fresh(name)
        self.constants[name] = tensor
        self.types[name] = TensorType.of(tensor)
        return name

    def add(self, op: str, inputs: Iterable[str], *, name: str | None = None,
            out_names: Iterable[str] | None = None, out_types: list[TensorType] | None = None,
            **attrs: Any) -> list[str]:
        inputs = tuple(inputs)
        attrs = {k: freeze(v) for k, v in attrs.items()}
        if out_types is None:
            if self.infer is None:
                raise RuntimeError(f"GraphBuilder {self.name!r} has no type inference for {op} ({name or op}): "
                                   "build the graph with tilefuse.ops.GraphBuilder, or pass infer= or out_types")
            in_types = [self.types[i] if i else None for i in inputs]
            out_types = self.infer(op, in_types, attrs, name or op)
        node_name = self.fresh(name or op, self._used_nodes)
        bases = list(out_names) if out_names is not None else [node_name] * len(out_types)
        outs = [Value(self.fresh(b), t) for b, t in zip(bases, out_types)]
        for v in outs:
            self.types[v.name] = v.type
        self.nodes.append(Node(node_name, op, inputs, tuple(outs), attrs))
        return [v.name for v in outs]

    def add1(self, op: str, inputs: Iterable[str], **kw: Any) -> str:
        (out,) = self.add(op, inputs, **kw)
        return out

    def build(self, outputs: Iterable[str]) -> Graph:
        return Graph(self.name, tuple(self.inputs), tuple(outputs), tuple(self.nodes), dict(self.constants)).verify()


def _sanitize(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "_." else "_" for c in str(name))
    return out.strip("_") or ""

"""Canonicalization: drop no-op nodes, then rewrite decomposed forms with the pattern table."""

from __future__ import annotations

from tilefuse.ir import Graph, Node
from tilefuse.planner.pattern import RewriteLog, eliminate_dead, rewrite
from tilefuse.planner.patterns import PATTERNS


_EXACT_UPCASTS = {("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"),
                  ("bfloat16", "float64"), ("float32", "float64")}


def _round_trip(n: Node, types, producers) -> str | None:
    """``cast(cast(x, wider), x.dtype)`` is ``x`` exactly (every fp16/bf16/fp32 value is representable in the
    wider float): the value to read instead, else None. Attention rewritten from torch's math SDPA leaves one."""
    if n.op != "cast" or not n.inputs or not n.inputs[0]:
        return None
    inner = producers.get(n.inputs[0])
    if inner is None or inner.op != "cast" or not inner.inputs or not inner.inputs[0]:
        return None
    x = inner.inputs[0]
    ok = (types[x].dtype, types[n.inputs[0]].dtype) in _EXACT_UPCASTS and types[x] == n.outputs[0].type
    return x if ok else None


def _is_noop(n: Node, types) -> bool:
    if len(n.inputs) < 1 or len(n.outputs) != 1 or not n.inputs[0]:
        return False
    src, out = types[n.inputs[0]], n.outputs[0].type
    if src != out:
        return False
    a = n.attr
    if n.op in ("identity", "dropout", "cast", "reshape", "expand", "flatten", "squeeze", "unsqueeze"):
        return True
    if n.op == "permute":
        return list(a["perm"]) == list(range(len(a["perm"])))
    if n.op == "slice":
        return a.get("step", 1) == 1
    if n.op == "concat":
        return len([i for i in n.inputs if i]) == 1
    return False


def simplify(graph: Graph) -> Graph:
    """Remove nodes that return their input unchanged (same type, same values)."""
    types = {k: v.type for k, v in graph.values().items()}
    alias: dict[str, str] = {}
    producers = graph.producers()
    nodes = []
    for n in graph.nodes:
        n = Node(n.name, n.op, tuple(alias.get(i, i) for i in n.inputs), n.outputs, n.attrs)
        if n.outputs and n.outputs[0].name not in graph.outputs:
            same = n.inputs[0] if _is_noop(n, types) else _round_trip(n, types, producers)
            if same is not None:
                alias[n.outputs[0].name] = same
                continue
        nodes.append(n)
    if not alias:
        return graph
    return eliminate_dead(graph.replace(nodes=tuple(nodes)))


def canonicalize(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """simplify, then the pattern table until nothing matches, then simplify again."""
    return simplify(rewrite(simplify(graph), PATTERNS, log))

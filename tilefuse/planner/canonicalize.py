"""Canonicalization: drop no-op nodes, then rewrite decomposed forms with the pattern table."""

from __future__ import annotations

from tilefuse.ir import Graph, Node
from tilefuse.planner.pattern import RewriteLog, eliminate_dead, rewrite
from tilefuse.planner.patterns import PATTERNS


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
    nodes = []
    for n in graph.nodes:
        n = Node(n.name, n.op, tuple(alias.get(i, i) for i in n.inputs), n.outputs, n.attrs)
        if _is_noop(n, types) and n.outputs[0].name not in graph.outputs:
            alias[n.outputs[0].name] = n.inputs[0]
            continue
        nodes.append(n)
    if not alias:
        return graph
    return eliminate_dead(graph.replace(nodes=tuple(nodes)))


def canonicalize(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """simplify, then the pattern table until nothing matches, then simplify again."""
    return simplify(rewrite(simplify(graph), PATTERNS, log))

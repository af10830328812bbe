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


def _composed(n: Node, permuted: dict[str, tuple[str, tuple[int, ...]]]) -> Node:
    """A permute of a permuted value as one permute of the first's input (``permuted``: value -> (its source, the
    perm that made it)): NHWC -> NCHW -> NHWC, as the layout pass leaves before a model's own permute, reads the
    source as it is."""
    if n.op != "permute" or not n.inputs or n.inputs[0] not in permuted:
        return n
    src, first = permuted[n.inputs[0]]
    perm = tuple(first[p] for p in n.attr["perm"])
    return Node(n.name, n.op, (src, *n.inputs[1:]), n.outputs, {**n.attr, "perm": perm})


def simplify(graph: Graph) -> Graph:
    """Remove nodes that return their input unchanged (same type, same values); a permute of a permute is one."""
    types = {k: v.type for k, v in graph.values().items()}
    alias: dict[str, str] = {}
    permuted: dict[str, tuple[str, tuple[int, ...]]] = {}
    nodes = []
    changed = False
    for n in graph.nodes:
        n = Node(n.name, n.op, tuple(alias.get(i, i) for i in n.inputs), n.outputs, n.attrs)
        folded = _composed(n, permuted)
        changed |= folded is not n
        n = folded
        if n.op == "permute" and len(n.outputs) == 1:
            permuted[n.outputs[0].name] = (n.inputs[0], tuple(n.attr["perm"]))
        if _is_noop(n, types) and n.outputs[0].name not in graph.outputs:
            alias[n.outputs[0].name] = n.inputs[0]
            continue
        nodes.append(n)
    if not alias and not changed:
        return graph
    return eliminate_dead(graph.replace(nodes=tuple(nodes)))


def canonicalize(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """simplify, then the pattern table until nothing matches, then simplify again."""
    return simplify(rewrite(simplify(graph), PATTERNS, log))

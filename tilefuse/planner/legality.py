"""Legality: is a fusion *correct*? Each check returns ``None`` (legal) or the reason it is not.

Note: legality never asks whether a fusion pays (that is ``cost.py``). A fusion is legal when the
merged region stays acyclic in the region graph (a search over the networkx DAG), the shapes fit the
template's iteration domain, and the template can take the op (its epilogue vocabulary).

Note: collectives and their waits (the ``collective`` trait) are side effects every rank must issue in the same
order. Each is alone in its region (``can_join_collective`` refuses any fusion with one, with the reason), and
``Facts.dag`` carries an order edge from each to the next in program order besides the data edges: a fusion that
would run a node both before one collective and after a later one is then a cycle and refused, and the regions'
execution order (a topological sort of the same DAG) keeps the collectives in program order.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import networkx as nx

from tilefuse import ops
from tilefuse.ir import Graph, Node, TensorType
from tilefuse.ops import OpKind
from tilefuse.planner.plan import VIEW_OPS

EPILOGUE_OPS = ops.with_trait("epilogue")  # what the templates' epilogue/prologue expressions compute
LAYOUT_OPS = ops.with_trait("permute") | VIEW_OPS
SPLIT_OPS = ops.with_trait("slicing")
NORM_OPS = ops.with_trait("norm")
COLLECTIVE_OPS = ops.with_trait("collective")
MAX_OUTPUTS = {"gemm": 1, "gemm_sp": 1, "attention": 1, "reduction": 2, "elementwise": 8}


@dataclass
class Facts:
    """Read-only facts about the graph that every check uses."""

    graph: Graph
    dag: nx.DiGraph
    nodes: dict[str, Node]
    producers: dict[str, Node]
    users: dict[str, list[Node]]
    types: dict[str, TensorType]
    outputs: frozenset[str]
    order: dict[str, int]  # each node's position in a topological order of ``dag``

    @classmethod
    def of(cls, graph: Graph) -> Facts:
        dag = graph.to_networkx()
        dag.add_edges_from(collective_order(graph))
        return cls(graph, dag, {n.name: n for n in graph.nodes}, graph.producers(),
                   graph.users(), {k: v.type for k, v in graph.values().items()}, frozenset(graph.outputs),
                   {n: k for k, n in enumerate(nx.topological_sort(dag))})

    def kind(self, node: Node) -> OpKind:
        return ops.get(node.op).kind

    def out_type(self, node: Node) -> TensorType:
        return node.outputs[0].type


def collective_order(graph: Graph) -> list[tuple[str, str]]:
    """Edges from each collective (or wait) node to the next one in program order: the order every rank issues them."""
    seq = [n.name for n in graph.nodes if n.op in COLLECTIVE_OPS]
    return list(pairwise(seq))


def can_join_collective(node: Node, region_kind: str) -> str | None:
    """May ``node`` share a region of ``region_kind``? Never when either is a collective: the reason, else None."""
    if node.op in COLLECTIVE_OPS:
        return (f"{node.op} is a collective: alone in its region, in program order, through torch (every rank must "
                "issue the same collectives in the same order)")
    if region_kind == "collective":
        return "a collective region holds its collective alone"
    return None


def creates_cycle(f: Facts, members: set[str], new: set[str]) -> bool:
    """True when merging ``new`` into ``members`` puts a node outside on a path out of and back
    into the merged set (the fused kernel would have to run both before and after it).

    Such a path ends at a merged node, so every node on it comes before the last merged node in
    topological order: the search from the merged set's outside successors stops there (a window of
    the graph, not the whole graph per candidate, which made planning quadratic in the layer count)."""
    merged = members | new
    last = max(f.order[n] for n in merged)
    stack = [s for n in merged for s in f.dag.successors(n) if s not in merged and f.order[s] < last]
    seen = set(stack)
    while stack:
        for s in f.dag.successors(stack.pop()):
            if s in merged:
                return True
            if s not in seen and f.order[s] < last:
                seen.add(s)
                stack.append(s)
    return False


def escaping(f: Facts, members: set[str]) -> list[str]:
    """Values produced inside ``members`` that are read outside it or returned by the graph."""
    out = []
    for name in members:
        for v in f.nodes[name].outputs:
            if v.name in f.outputs or any(u.name not in members for u in f.users.get(v.name, ())):
                out.append(v.name)
    return out


def distinct_outputs(f: Facts, members: set[str]) -> int:
    """How many tensors the region must write: escaping values that are views of another escaping
    value (a reshape of the norm's output, say) cost nothing extra."""
    return len(output_bases(f, members))


def output_bases(f: Facts, members: set[str]) -> set[str]:
    """The nodes whose values the region writes (``distinct_outputs``), a view's through to what it views."""
    esc = escaping(f, members)
    bases = set()
    for v in esc:
        node = f.producers[v]
        while node.op in VIEW_OPS and node.op != "expand" and f.producers.get(node.inputs[0]) is not None \
                and f.producers[node.inputs[0]].name in members:
            node = f.producers[node.inputs[0]]
        bases.add(node.name)
    return bases


def downstream(f: Facts, members: set[str], anchor: str) -> set[str]:
    """``anchor`` and the members that read it, directly or through other members."""
    seen, stack = {anchor}, [anchor]
    while stack:
        for v in f.nodes[stack.pop()].outputs:
            for u in f.users.get(v.name, ()):
                if u.name in members and u.name not in seen:
                    seen.add(u.name)
                    stack.append(u.name)
    return seen


def _row_broadcastable(operand: TensorType, out: TensorType) -> bool:
    """Reads as a (rows, cols) tile: the full shape, a vector over the last dim, or a scalar."""
    if operand.shape is None or out.shape is None:
        return False
    if operand.shape == out.shape or all(d == 1 for d in operand.shape):
        return True
    lead = operand.shape[:-1]
    return all(d == 1 for d in lead) and operand.shape[-1:] == out.shape[-1:] and len(operand.shape) <= len(out.shape)


def _channel_vector(operand: TensorType, out: TensorType, op: str, channels_last: bool = False) -> bool:
    """A per-channel vector of a convolution output: (C,) for batch_norm; else (C,1,1) or (1,C,1,1) for
    NCHW, (C,) or (1,1,1,C) for NHWC."""
    if operand.shape is None or out.shape is None or len(out.shape) < 3:
        return False
    axis = len(out.shape) - 1 if channels_last else 1
    c = out.shape[axis]
    if op == "batch_norm":
        return operand.shape == (c,)
    dims = (1,) * (len(out.shape) - len(operand.shape)) + tuple(operand.shape)
    return all(d == 1 for k, d in enumerate(dims) if k != axis) and dims[axis] in (1, c)


def _same_domain(a: TensorType, b: TensorType) -> bool:
    """Same element count and last dim: a view of the same 2-D iteration domain."""
    if a.shape is None or b.shape is None or not a.shape or not b.shape:
        return a.shape == b.shape
    if a.shape[-1] != b.shape[-1]:
        return False
    return _numel(a) == _numel(b)


def _numel(t: TensorType):
    n, sym = 1, []
    for d in t.shape:
        if isinstance(d, int):
            n *= d
        else:
            sym += d.split("*")
    return n, tuple(sorted(sym))


def can_fuse_epilogue(f: Facts, kind: str, members: set[str], domain: TensorType, node: Node,
                      anchor: Node | None = None) -> str | None:
    """May ``node`` (a consumer of the region) run inside the region, after its anchor?"""
    why = can_join_collective(node, kind)
    if why is not None:
        return why
    conv = anchor is not None and f.kind(anchor) == OpKind.CONV
    nk = f.kind(node)
    if node.op in VIEW_OPS and node.op != "expand":
        pass
    elif kind == "attention":
        if node.op not in LAYOUT_OPS:
            return f"the attention template takes only a layout change after it, not {node.op}"
    elif kind == "elementwise":
        if nk not in ops.FUSIBLE_POINTWISE and nk != OpKind.INJECTIVE:
            return f"{node.op} is {nk.value}, not elementwise/injective"
    elif nk not in ops.FUSIBLE_POINTWISE:
        return f"{node.op} is {nk.value}; a {kind} epilogue takes elementwise ops"
    elif node.op not in EPILOGUE_OPS:
        return f"the {kind} template's epilogue cannot compute {node.op}"
    if len(node.outputs) != 1:
        return f"{node.op} has {len(node.outputs)} outputs"
    out = f.out_type(node)
    if conv and nk in ops.FUSIBLE_POINTWISE:
        if out.shape != domain.shape:
            return f"{node.op} output {out} is not the convolution's output {domain}"
        for i in node.inputs:
            p = f.producers.get(i)
            if i and (p is None or p.name not in members) and f.types[i].shape != out.shape and \
                    not _channel_vector(f.types[i], out, node.op, anchor.attr.get("channels_last", False)):
                return f"operand {i} ({f.types[i]}) is neither the full output nor a per-channel vector"
    elif kind in ("gemm", "gemm_sp", "reduction") and nk in ops.FUSIBLE_POINTWISE:
        if node.op == "batch_norm":
            return "batch_norm fuses only after a convolution"
        if not _same_domain(out, domain):
            return f"{node.op} output {out} is not the region's domain {domain}"
        for i in node.inputs:
            p = f.producers.get(i)
            if i and (p is None or p.name not in members) and not _row_broadcastable(f.types[i], out):
                return f"operand {i} ({f.types[i]}) broadcasts along a leading dim"
    if kind == "elementwise" and nk in ops.FUSIBLE_POINTWISE and out.shape != domain.shape and \
            not (_same_domain(out, domain)):
        return f"{node.op} output {out} differs from the region's shape {domain}"
    new_members = members | {node.name}
    if kind == "reduction" and anchor is not None:  # the row reduction writes its input and one result
        after = output_bases(f, new_members) & downstream(f, new_members, anchor.name)
        if len(after) > 1:
            return f"the reduction region would write {len(after)} values computed after its {anchor.op}"
    n_out = distinct_outputs(f, new_members)
    if n_out > MAX_OUTPUTS.get(kind, 1):
        esc = escaping(f, new_members)
        return f"the {kind} region would write {n_out} outputs ({', '.join(sorted(esc))})"
    if creates_cycle(f, members, {node.name}):
        return "fusing would create a cycle through another region"
    return None


def can_fuse_prologue(f: Facts, kind: str, anchor: Node, members: set[str], producers: set[str]) -> str | None:
    """May the producer nodes ``producers`` run inside the region, before its anchor?"""
    in_type = f.types[anchor.inputs[0]]
    why = can_join_collective(anchor, kind) or next(
        (w for name in sorted(producers) if (w := can_join_collective(f.nodes[name], kind))), None)
    if why is not None:
        return why
    for name in producers:
        p = f.nodes[name]
        pk = f.kind(p)
        if kind == "reduction":
            if pk not in ops.FUSIBLE_POINTWISE or p.op not in EPILOGUE_OPS:
                return f"{p.op} is not an elementwise op the reduction template can apply to its input"
            if f.out_type(p).shape != in_type.shape:
                return f"{p.op} output {f.out_type(p)} is not the reduction's input shape {in_type}"
        elif kind == "gemm_sp":
            if p.op not in VIEW_OPS or p.op == "expand":
                return f"the gemm_sp template reads its input as is (views only), not through {p.op}"
        elif kind == "gemm":
            if f.kind(anchor) == OpKind.CONV:
                return "the convolution template reads its input as is (no prologue)"
            if p.op not in ("cast", "scale") and p.op not in LAYOUT_OPS:
                return f"the gemm template takes a cast, a scale or a layout change as prologue, not {p.op}"
        elif kind == "attention":
            if p.op not in LAYOUT_OPS and p.op not in SPLIT_OPS:
                return f"the attention template reads q/k/v through layout changes only, not {p.op}"
        elif kind == "elementwise":
            if pk not in ops.FUSIBLE_POINTWISE and pk != OpKind.INJECTIVE:
                return f"{p.op} is {pk.value}, not elementwise/injective"
        else:
            return f"a {kind} region takes no prologue"
    merged = members | producers
    n_out = distinct_outputs(f, merged)
    if n_out > MAX_OUTPUTS.get(kind, 1):
        return f"the {kind} region would write {n_out} outputs ({', '.join(sorted(escaping(f, merged)))})"
    if creates_cycle(f, members, producers):
        return "fusing would create a cycle through another region"
    return None

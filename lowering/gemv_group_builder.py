"""The builder of ``gemv_group`` regions (``planner.grouping``: a decode step's linears of one input, one launch):
each linear's part built as ``builders.build_gemm`` builds a ``gemv`` spec, then one ``templates.gemv.gemv_group``
spec of them."""

from __future__ import annotations

from tilefuse.ir import Graph, Node
from tilefuse.lowering import builders
from tilefuse.lowering.builders import Builder, KernelSpec, build_gemm, require
from tilefuse.planner.grouping import reshaped_from
from tilefuse.planner.plan import Region


def build_gemv_group(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """A ``gemv_group`` region (``planner.grouping``: linears of one decode-step input): each linear's part built as a
    ``gemv`` spec, then one ``gemv_group`` spec of them; they must agree on A, its prologue, rows, depth and dtypes.
    Only where a decode step's linear is a gemv (``builders.GEMV_TARGETS``)."""
    require(target.get("kind") in builders.GEMV_TARGETS, f"no gemv on {target.get('kind')} targets: the linears apart")
    nodes = {n.name: n for n in b.graph.nodes}
    producer = {v.name: n for n in b.graph.nodes for v in n.outputs}
    specs = [build_gemm(Builder(part, b.graph, nodes, b.types, target), nodes[part.anchor], target, as_gemv=True)
             for part in gemv_group_parts(b.region, b.graph)]
    kws = [s.factory_kwargs() for s in specs]
    same = ("M", "K", "A_dtype", "B_dtype", "out_dtype", "prologue")
    base = [(reshaped_from(b.graph, s.inputs[0][0], producer), s.inputs[0][1]) for s in specs]  # A: one tensor's data
    require(all(x == base[0] and x[1] is not None for x in base) and
            all(kw[k] == kws[0][k] for kw in kws for k in same), "the group's linears differ in A, rows or dtypes")
    extras, extra_dtypes, extras_of = [], [], []
    for s, kw in zip(specs, kws):
        extras_of.append(tuple(range(len(extras), len(extras) + len(s.inputs) - 2)))
        extras += s.inputs[2:]
        extra_dtypes += kw["extra_dtypes"]
    params = {k: kws[0][k] for k in same} | {
        "Ns": tuple(kw["N"] for kw in kws), "epilogues": tuple(kw["epilogue"] for kw in kws),
        "extra_shapes": tuple(tuple(shape) for _, shape in extras), "extra_dtypes": tuple(extra_dtypes),
        "extras_of": tuple(extras_of)}
    outputs = tuple((i, v, shape) for i, s in enumerate(specs) for _, v, shape in s.outputs)
    pre = tuple(dict.fromkeys(p for s in specs for p in s.pre))
    return KernelSpec("gemv_group", tuple(params.items()), tuple(range(-len(specs), 0)),
                      (specs[0].inputs[0], *(s.inputs[1] for s in specs), *extras), outputs, pre)


def gemv_group_parts(region: Region, graph: Graph) -> list[Region]:
    """A ``gemv_group`` region's linears as GEMM regions: each linear (in order) with the nodes that read what it makes
    (its epilogue) and the views before it that feed it (its operand's layout), their inputs and outputs as the group's
    graph gives them."""
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    nodes = {n.name: n for n in graph.nodes if n.name in set(region.nodes)}
    producer = {v.name: n.name for n in nodes.values() for v in n.outputs}
    users: dict[str, list[str]] = {}
    for n in nodes.values():
        for i in n.inputs:
            if i in producer:
                users.setdefault(producer[i], []).append(n.name)
    anchors = [m for m in region.nodes if nodes[m].op == "linear"]
    parts = []
    for a in anchors:
        part, todo = {a}, list(users.get(a, ()))
        while todo:  # the epilogue: what reads the linear's value, and so on
            m = todo.pop()
            if m not in part:
                part.add(m)
                todo += users.get(m, ())
        todo = [producer[i] for m in list(part) for i in nodes[m].inputs if i in producer]
        while todo:  # the operands' layouts made inside the group (a view of A, say)
            m = todo.pop()
            if m not in part:
                part.add(m)
                todo += [producer[i] for i in nodes[m].inputs if i in producer]
        members = sorted(part, key=order.__getitem__)
        made = {v.name for m in members for v in nodes[m].outputs}
        inputs = tuple(dict.fromkeys(i for m in members for i in nodes[m].inputs if i and i not in made))
        outputs = tuple(o for o in region.outputs if o in made)
        parts.append(Region(f"{region.name}.{len(parts)}", "gemm", tuple(members),
                            tuple(nodes[m].op for m in members), inputs, outputs, a))
    return parts

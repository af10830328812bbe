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
    ``gemv`` spec, then one ``gemv_group`` spec of them; they must agree on A, its prologue or norm, rows, depth and
    dtypes. A part that reads another's output (a gated MLP's up reading ``silu(gate)``) reads it in registers (the
    template's joined weights): as its epilogue's extra itself, of the same rows and width; that output is stored only
    where the group's outputs name it. Only where a decode step's linear is a gemv (``builders.GEMV_TARGETS``)."""
    require(target.get("kind") in builders.GEMV_TARGETS, f"no gemv on {target.get('kind')} targets: the linears apart")
    nodes = {n.name: n for n in b.graph.nodes}
    producer = {v.name: n for n in b.graph.nodes for v in n.outputs}
    parts = gemv_group_parts(b.region, b.graph)
    specs = [build_gemm(Builder(part, b.graph, nodes, b.types, target), nodes[part.anchor], target, as_gemv=True)
             for part in parts]
    kws = [{"norm_eps": None, "norm_weight": None} | s.factory_kwargs() for s in specs]
    same = ("M", "K", "A_dtype", "B_dtype", "out_dtype", "prologue", "norm_eps", "norm_weight")
    w = 2 if kws[0]["norm_weight"] else 1  # B's place among a part's inputs (after A and a norm's weight G)
    require(all(s.inputs[1:w] == specs[0].inputs[1:w] for s in specs), "the group's linears differ in their norm")
    base = [(reshaped_from(b.graph, s.inputs[0][0], producer), s.inputs[0][1]) for s in specs]  # A: one tensor's data
    require(all(x == base[0] and x[1] is not None for x in base) and
            all(kw[k] == kws[0][k] for kw in kws for k in same), "the group's linears differ in A, rows or dtypes")
    made = {v: i for i, s in enumerate(specs) for _, v, _ in s.outputs}  # a part's output -> the part
    M = kws[0]["M"]
    extras, extra_dtypes, extras_of = [], [], []
    for i, (part, s, kw) in enumerate(zip(parts, specs, kws)):
        own = []
        for (v, shape), dt in zip(s.inputs[w + 1:], kw["extra_dtypes"]):
            k = made.get(v)
            if k is None:
                own.append(len(extras))
                extras.append((v, shape))
                extra_dtypes.append(dt)
            else:  # another part's output, read in registers: element (m, n) of the same rows and width
                require(k < i and kws[k]["N"] == kw["N"] and tuple(shape or ()) == (M, kw["N"]) and
                        len(specs[k].outputs) == 1, f"{v}: a part's output read by another not element for element")
                own.append(-1 - k)
        fed = {v for v in part.inputs if v in made}
        require(fed <= {v for v, _ in s.inputs[w + 1:]}, f"{sorted(fed)}: another part's output read other than by the "
                "epilogue itself")
        extras_of.append(tuple(own))
    stored = tuple(any(v in b.region.outputs for _, v, _ in s.outputs) for s in specs)
    require(all(stored[k] or len(s.outputs) == 1 for k, s in enumerate(specs)), "a part with several outputs")
    params = {k: kws[0][k] for k in same if k in specs[0].factory_kwargs()} | {
        "Ns": tuple(kw["N"] for kw in kws), "epilogues": tuple(kw["epilogue"] for kw in kws),
        "extra_shapes": tuple(tuple(shape) for _, shape in extras), "extra_dtypes": tuple(extra_dtypes),
        "extras_of": tuple(extras_of)} | ({"stored": stored} if not all(stored) else {})
    kept = [s for s, keep in zip(specs, stored) if keep]
    outputs = tuple((i, v, shape) for i, s in enumerate(kept) for _, v, shape in s.outputs)
    pre = tuple(dict.fromkeys(p for s in specs for p in s.pre))
    return KernelSpec("gemv_group", tuple(params.items()), tuple(range(-len(kept), 0)),
                      (*specs[0].inputs[:w], *(s.inputs[w] for s in specs), *extras), outputs, pre)


def gemv_group_parts(region: Region, graph: Graph) -> list[Region]:
    """A ``gemv_group`` region's linears as GEMM regions: each linear (in order) with the nodes that read what it makes
    (its epilogue; a node that reads what several make, the up projection's ``silu(gate) * up``, is the last one's) and
    the views (and a folded norm) before it that feed it (its operand's layout), their inputs and outputs as the group's
    graph gives them (a part's outputs: the group's, and what another part reads)."""
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    nodes = {n.name: n for n in graph.nodes if n.name in set(region.nodes)}
    producer = {v.name: n.name for n in nodes.values() for v in n.outputs}
    users: dict[str, list[str]] = {}
    for n in nodes.values():
        for i in n.inputs:
            if i in producer:
                users.setdefault(producer[i], []).append(n.name)
    anchors = sorted((m for m in region.nodes if nodes[m].op == "linear"), key=order.__getitem__)
    owner: dict[str, str] = {}
    for a in anchors:  # later anchors take what they reach too
        todo = [a]
        while todo:  # the epilogue: what reads the linear's value, and so on
            m = todo.pop()
            if owner.get(m) != a:
                owner[m] = a
                todo += users.get(m, ())
    members_of = {a: {m for m, o in owner.items() if o == a} for a in anchors}
    for a in anchors:
        part = members_of[a]
        todo = [producer[i] for m in list(part) for i in nodes[m].inputs if i in producer]
        while todo:  # the operands' layouts made inside the group (a view of A, say), never another part's nodes
            m = todo.pop()
            if m not in part and m not in owner:
                part.add(m)
                todo += [producer[i] for i in nodes[m].inputs if i in producer]
    made_by = {a: {v.name for m in members_of[a] for v in nodes[m].outputs} for a in anchors}
    read_by = {a: {i for m in members_of[a] for i in nodes[m].inputs} for a in anchors}
    parts = []
    for a in anchors:
        members = sorted(members_of[a], key=order.__getitem__)
        made = made_by[a]
        inputs = tuple(dict.fromkeys(i for m in members for i in nodes[m].inputs if i and i not in made))
        # what another part reads of this one's (a value both make, a norm's output they each read, is not fed)
        fed = {v for b in anchors if b != a for v in (read_by[b] - made_by[b]) & made}
        outputs = tuple(dict.fromkeys([o for o in region.outputs if o in made] + sorted(fed)))
        parts.append(Region(f"{region.name}.{len(parts)}", "gemm", tuple(members),
                            tuple(nodes[m].op for m in members), inputs, outputs, a))
    return parts

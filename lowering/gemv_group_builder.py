"""The builder of ``gemv_group`` regions (``planner.grouping``: a decode step's linears of one input, one launch):
each linear's part built as ``builders.build_gemm`` builds a ``gemv`` spec, then one ``templates.gemv.gemv_group``
spec of them."""

from __future__ import annotations

from typing import NamedTuple

from tilefuse.ir import Graph, Node
from tilefuse.lowering import builders
from tilefuse.lowering.builders import Builder, KernelSpec, build_gemm, require
from tilefuse.planner.grouping import RESHAPES, reshaped_from
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
    parts, tails = zip(*(_split_tail(part, nodes, b) for part in gemv_group_parts(b.region, b.graph)))
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
    stored = tuple(t.out is not None if t else any(v in b.region.outputs for _, v, _ in s.outputs)
                   for s, t in zip(specs, tails))
    require(all(stored[k] or len(s.outputs) == 1 for k, s in enumerate(specs)), "a part with several outputs")
    params = {k: kws[0][k] for k in same if k in specs[0].factory_kwargs()} | {
        "Ns": tuple(kw["N"] for kw in kws), "epilogues": tuple(kw["epilogue"] for kw in kws)}
    params |= _tail_params(tails, kws, M, extras, extra_dtypes, b)
    shapes = tuple(tuple(b.types[v].shape if shape is None else shape) for v, shape in extras)  # (a cache: as it is)
    params |= {"extra_shapes": shapes, "extra_dtypes": tuple(extra_dtypes), "extras_of": tuple(extras_of)} | (
        {"stored": stored} if not all(stored) else {})
    outputs = []
    for i, (s, t) in enumerate((s, t) for s, t, keep in zip(specs, tails, stored) if keep):
        outputs += [(i, t.out, tuple(b.types[t.out].shape))] if t else [(i, v, shape) for _, v, shape in s.outputs]
    pre = tuple(dict.fromkeys([*(p for s in specs for p in s.pre), *(p for t in tails if t for p in t.pre)]))
    inputs = (*specs[0].inputs[:w], *(s.inputs[w] for s in specs), *extras)
    aliases = tuple((t.stored, inputs.index((t.cache, None))) for t in tails if t and t.stored)
    return KernelSpec("gemv_group", tuple(params.items()), tuple(range(-sum(stored), 0)), inputs, tuple(outputs), pre,
                      aliases=aliases)


class _Tail(NamedTuple):
    """What a part does with its linear's rows after the views (``planner.rotary_fold``): rotate them by
    ``rotary_embedding`` (``cos``/``sin``, None: not) and store them into ``cache`` at ``index`` (None: into its
    own output ``out``)."""

    D: int
    cos: str | None
    sin: str | None
    cache: str | None
    index: str | None
    out: str | None  # the rotated rows, a region output (where not stored into a cache)
    stored: str | None  # the cache's update (``index_copy``'s value), a region output
    pre: tuple[str, ...]  # views of the tables and index torch runs before the kernel


TAIL_OPS = ("transpose", "rotary_embedding", "index_copy")


def _split_tail(part: Region, nodes: dict, b: Builder) -> tuple[Region, _Tail | None]:
    """A part as its linear (the region ``build_gemm`` takes) and what follows its views: ``transpose(1, 2)`` of the
    rows viewed ``(B, 1, heads, D)``, then ``rotary_embedding``, ``index_copy`` into a cache along its dim 2, or both
    (a decode step's q, k and v). None where the part has none of them."""
    tail = [m for m in part.nodes if nodes[m].op in TAIL_OPS]
    if not tail:
        return part, None
    made = {v.name: m for m in part.nodes for v in nodes[m].outputs}
    ts = [m for m in tail if nodes[m].op == "transpose"]
    require(len(ts) == 1, f"{part.name}: one transpose of the rows before the rotary or store")
    t = nodes[ts[0]]
    x = t.inputs[0]
    xs = tuple(b.types[x].shape)
    require(len(xs) == 4 and xs[1] == 1 and sorted((t.attr.get("dim0"), t.attr.get("dim1"))) in ([1, 2], [-3, -2]),
            f"{part.name}: rows viewed (B, 1, heads, D) and transposed (1, 2) wanted, got {xs} {dict(t.attr)}")
    value, cos = t.outputs[0].name, None
    sin = cache = index = stored = None
    seen = {t.name}
    for op in ("rotary_embedding", "index_copy"):
        users = [m for m in tail if value in nodes[m].inputs and m not in seen]
        if not users:
            break
        require(len(users) == 1 and nodes[users[0]].op in TAIL_OPS[TAIL_OPS.index(op):],
                f"{part.name}: {value} read by {users}")
        n = nodes[users[0]]
        if n.op != op:  # (no rotary: the rows stored as they are)
            continue
        seen.add(n.name)
        if op == "rotary_embedding":
            require(n.inputs[0] == value and not n.attr.get("interleaved", False), f"{part.name}: an interleaved "
                    "rotary or one that rotates a table")
            cos, sin = n.inputs[1], n.inputs[2]
        else:
            require(n.inputs[2] == value and n.attr.get("dim", 0) % 4 == 2, f"{part.name}: a store along dim 2 wanted")
            cache, index, stored = n.inputs[0], n.inputs[1], n.outputs[0].name
        value = n.outputs[0].name
    require(seen == set(tail), f"{part.name}: {sorted(set(tail) - seen)} after the rotary or store")
    require(stored is not None or value in part.outputs, f"{part.name}: the rotated rows are not an output")
    after = {v.name for m in tail for v in nodes[m].outputs} - {value}
    require(not after & set(part.outputs), f"{part.name}: a value between the rows and their store is read after")
    down = set(tail)
    todo = [i for m in tail for i in nodes[m].inputs if i in made and made[i] not in down and i != x]
    views = set()
    while todo:  # the tables' and index's views made in the part (torch runs them first)
        m = made[todo.pop()]
        if m not in views and m not in down:
            require(nodes[m].op in RESHAPES, f"{part.name}: {m} ({nodes[m].op}) feeds the rotary or store")
            views.add(m)
            todo += [i for i in nodes[m].inputs if i in made]
    core = [m for m in part.nodes if m not in down and m not in views]
    core_made = {v.name for m in core for v in nodes[m].outputs}
    require(x in core_made, f"{part.name}: the rows come from outside")
    require(not set(part.outputs) & core_made, f"{part.name}: the rows are read before their rotary or store")
    core_inputs = tuple(dict.fromkeys(i for m in core for i in nodes[m].inputs if i and i not in core_made))
    region = Region(part.name, "gemm", tuple(core), tuple(nodes[m].op for m in core), core_inputs, (x,), part.anchor)
    pre = tuple(m for m in part.nodes if m in views)
    return region, _Tail(xs[3], cos, sin, cache, index, None if stored else value, stored, pre)


def _tail_params(tails, kws, M: int, extras: list, extra_dtypes: list, b: Builder) -> dict:
    """``gemv_group``'s ``head_dim``, ``rotary_of`` and ``scatter_of`` for the parts' tails, their tables, caches and
    index added to ``extras`` (one extra a value)."""
    if not any(tails):
        return {}
    Ds = {t.D for t in tails if t}
    require(len(Ds) == 1, f"heads of several sizes {sorted(Ds)}")
    (D,) = Ds

    def extra(v: str, shape: tuple | None) -> int:
        for j, (u, s) in enumerate(extras):
            if u == v and s == shape:
                return j
        extras.append((v, shape))
        extra_dtypes.append(b.types[v].dtype)
        return len(extras) - 1

    rotary, scatter = [], []
    for t, kw in zip(tails, kws):
        rot = sc = None
        if t and t.cos is not None:
            tables = []
            for v in (t.cos, t.sin):
                shape = (1,) * (4 - len(b.types[v].shape)) + tuple(b.types[v].shape)
                require(shape[1:] == (1, 1, D) and shape[0] in (1, M), f"a rotary table {shape}: (1 or {M}, 1, 1, "
                        f"{D}) wanted")
                tables.append(extra(v, (shape[0], D)))
            rot = tuple(tables)
        if t and t.cache is not None:
            require(tuple(b.types[t.index].shape) == (1,), f"a cache store at {b.types[t.index].shape} positions")
            sc = (extra(t.cache, None), extra(t.index, (1,)))
        rotary.append(rot)
        scatter.append(sc)
    return {"head_dim": D, "rotary_of": tuple(rotary), "scatter_of": tuple(scatter)}


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

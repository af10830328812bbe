"""Region growing: anchors (GEMM, conv, attention, reductions) take their producers and consumers.

Note: nodes are visited in topological order (Hidet's anchor-centred growth). An anchor opens a
region and pulls in the elementwise/layout region that feeds it when the template can take it as a
prologue (a residual add before a norm; q/k/v layout changes before attention). Elementwise,
layout and view nodes then join the region of a producer as an epilogue when legality allows and
the cost model says it pays; else they open an elementwise (or, for metadata-only ops, a view)
region. ``GROUPS`` reservations keep a residual add for its norm rather than the GEMM before it. A collective or
its wait (``legality.can_join_collective``) opens a ``collective`` region that nothing joins, and the region order
keeps them in program order (``legality.collective_order``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from tilefuse import ops
from tilefuse.ir import Graph, Node, TensorType
from tilefuse.ops import OpKind
from tilefuse.planner.cost import CostModel
from tilefuse.planner.legality import (
    COLLECTIVE_OPS,
    MAX_OUTPUTS,
    NORM_OPS,
    Facts,
    can_fuse_epilogue,
    can_fuse_prologue,
    can_join_collective,
    creates_cycle,
    escaping,
)
from tilefuse.planner.plan import VIEW_OPS, Region

ANCHOR_KIND = {OpKind.GEMM: "gemm", OpKind.CONV: "gemm", OpKind.ATTENTION: "attention",
               OpKind.REDUCTION: "reduction"}
CLOSED = ("opaque", "collective")  # region kinds no other node joins


@dataclass
class _Open:
    """A region while it grows (local to one ``partition`` call)."""

    kind: str
    members: list[str]
    anchor: str | None = None
    domain: TensorType | None = None
    patterns: list[str] = field(default_factory=list)


def partition(graph: Graph, cost: CostModel | None = None) -> tuple[list[Region], list[str]]:
    """Group ``graph``'s nodes into regions; return them in execution order and the refusals."""
    cost = cost or CostModel()
    f = Facts.of(graph)
    regions: list[_Open] = []
    region_of: dict[str, int] = {}
    refusals: list[str] = []

    def place(node: Node, rid: int) -> None:
        regions[rid].members.append(node.name)
        region_of[node.name] = rid

    def open_region(node: Node, kind: str, domain: TensorType | None) -> int:
        regions.append(_Open(kind, [], node.name if kind not in ("elementwise", "view", *CLOSED) else None, domain))
        place(node, len(regions) - 1)
        return len(regions) - 1

    for node in graph.nodes:
        kind = ops.get(node.op).kind
        if node.op in COLLECTIVE_OPS:
            open_region(node, "collective", None)
            refusals.append(f"{node.name}: {can_join_collective(node, 'collective')}")
        elif kind in ANCHOR_KIND:
            rkind = "gemm_sp" if node.op == "sparse_linear" else ANCHOR_KIND[kind]  # 2:4 weight: its own template
            rid = open_region(node, rkind, node.outputs[0].type if node.outputs else None)
            if rkind == "attention":
                regions[rid].patterns.append(attention_pattern(node, f.types))
            _take_prologue(f, node, rid, regions, region_of, refusals)
        elif "in_place" in ops.get(node.op).traits:  # a cache's update: the store of what makes its rows
            if not _join_scatter(f, node, regions, region_of, refusals, place):
                open_region(node, "elementwise", f.types[node.inputs[2]])
        elif kind in ops.FUSIBLE_POINTWISE or kind == OpKind.INJECTIVE or node.op in VIEW_OPS:
            if not _join_producer(f, node, regions, region_of, refusals, cost, place):
                rk = "view" if node.op in VIEW_OPS or _narrowed_gemm_output(f, node, regions, region_of) else "elementwise"
                open_region(node, rk, node.outputs[0].type if node.outputs else None)
        else:
            open_region(node, "opaque", None)
    _merge_views(f, regions, region_of)
    _merge_input_only(f, regions, region_of)
    _merge_into_scatters(f, regions, region_of)
    return _finish(f, regions, cost), refusals


def _join_scatter(f: Facts, node: Node, regions, region_of, refusals, place) -> bool:
    """An in-place scatter (``index_copy`` of a static cache) joins the elementwise region that makes its rows (a
    rotary embedding's, a transpose's) as that region's store; True when it did."""
    p = f.producers.get(node.inputs[2])
    rid = region_of.get(p.name) if p is not None else None
    if rid is None or regions[rid].kind != "elementwise":
        return False
    if creates_cycle(f, set(regions[rid].members), {node.name}):
        refusals.append(f"{node.name} ({node.op}) not fused into the elementwise region of {regions[rid].members[0]}: "
                        "a cycle")
        return False
    place(node, rid)
    return True


def _merge_into_scatters(f: Facts, regions, region_of) -> None:
    """Merge into each elementwise region that stores into a cache (``in_place``) the elementwise regions that read a
    value it reads (a layer's rotary of q and its k and v stores, of one position and one cos/sin: one kernel of
    three), where no cycle forms and the outputs stay within the template's ``MAX_OUTPUTS``."""
    cap = MAX_OUTPUTS["elementwise"]
    reads: dict[int, set[str]] = {}  # an elementwise region's inputs from outside it (constants apart: a shared
    readers: dict[str, set[int]] = {}  # scalar says nothing), and the regions reading each value
    for rid, r in enumerate(regions):
        if r.kind == "elementwise" and r.members:
            inside = set(r.members)
            reads[rid] = {i for m in r.members for i in f.nodes[m].inputs if i and i not in f.graph.constants
                          and (f.producers.get(i) is None or f.producers[i].name not in inside)}
            for i in reads[rid]:
                readers.setdefault(i, set()).add(rid)
    stores = [rid for rid in reads if any("in_place" in ops.get(f.nodes[m].op).traits for m in regions[rid].members)]
    for into in stores:
        target = regions[into]
        for rid in sorted({k for i in reads[into] for k in readers[i]} - {into}):
            r = regions[rid]
            if not r.members or not target.members:
                continue
            if len(escaping(f, set(target.members) | set(r.members))) > cap or \
                    creates_cycle(f, set(target.members), set(r.members)):
                continue
            for m in r.members:
                region_of[m] = into
            target.members.extend(r.members)
            r.members.clear()


def _narrowed_gemm_output(f: Facts, node: Node, regions, region_of) -> bool:
    """``node`` keeps the first columns of a GEMM's output (``planner.layout.aligned_gemm_outputs`` computes an
    unaligned one padded): torch's view of it, not a kernel that copies it (GPT-2's logits: 823 MB)."""
    if node.op != "slice" or not node.inputs:
        return False
    a = node.attr
    rank = len(f.types[node.inputs[0]].shape or ())
    p = f.producers.get(node.inputs[0])
    return (a.get("dim", 0) % max(rank, 1) == rank - 1 and a.get("start") in (0, None) and a.get("step", 1) == 1
            and p is not None and region_of.get(p.name) is not None and regions[region_of[p.name]].kind == "gemm")


def _join_producer(f: Facts, node: Node, regions, region_of, refusals, cost: CostModel, place) -> bool:
    """Try the regions of ``node``'s producers, in input order; True when one took it."""
    seen: list[int] = []
    for i in node.inputs:
        p = f.producers.get(i)
        if p is None or region_of.get(p.name) is None or region_of[p.name] in seen:
            continue
        rid = region_of[p.name]
        seen.append(rid)
        r = regions[rid]
        if r.kind in CLOSED:
            continue
        if r.kind == "view":
            if node.op in VIEW_OPS and node.op != "expand":
                place(node, rid)
                return True
            continue
        reason = _reserved(f, node, r)
        if reason is None:
            anchor = f.nodes[r.anchor] if r.anchor else None
            reason = can_fuse_epilogue(f, r.kind, set(r.members), r.domain, node, anchor)
        if reason is None:
            crossing = [f.types[i] for i in node.inputs if i and f.producers.get(i) is not None
                        and region_of.get(f.producers[i].name) == rid]
            gain = cost.fusion_gain_us(crossing, [])
            if gain <= 0:
                reason = f"not profitable (gain {gain:.2f} us)"
        if reason is None:
            place(node, rid)
            if r.kind == "elementwise":
                _take_siblings(f, node, rid, regions, region_of, refusals)
            return True
        refusals.append(f"{node.name} ({node.op}) not fused into the {r.kind} region of "
                        f"{r.anchor or r.members[0]}: {reason}")
    return False


def _take_siblings(f: Facts, node: Node, rid: int, regions, region_of, refusals) -> None:
    """After ``node`` joined elementwise region ``rid``, pull in the other elementwise regions that
    feed it (``tok_emb + pos_emb``: two producer chains, one kernel)."""
    r = regions[rid]
    for i in node.inputs:
        p = f.producers.get(i)
        if p is None or region_of.get(p.name) in (None, rid):
            continue
        src = regions[region_of[p.name]]
        if src.kind not in ("elementwise", "view"):
            continue
        reason = can_fuse_prologue(f, "elementwise", node, set(r.members), set(src.members))
        if reason is not None:
            refusals.append(f"elementwise region of {src.members[0]} not merged with {node.name}: {reason}")
            continue
        for m in src.members:
            region_of[m] = rid
        r.members[:0] = src.members
        src.members.clear()


def _reserved(f: Facts, node: Node, r: _Open) -> str | None:
    """GROUPS: a residual add that feeds a norm goes with the norm, not with the GEMM before it."""
    if r.kind in ("gemm", "gemm_sp") and node.op == "add" and any(
            u.op in NORM_OPS for u in f.users.get(node.outputs[0].name, ())):
        return "kept for its norm (norm.residual: the residual add goes with the norm)"
    return None


def _take_prologue(f: Facts, anchor: Node, rid: int, regions, region_of, refusals) -> None:
    """Pull the elementwise/layout regions feeding ``anchor`` into its region when legal."""
    r = regions[rid]
    inputs = anchor.inputs[:3] if r.kind == "attention" else anchor.inputs[:1] if r.kind == "reduction" \
        else anchor.inputs[:2]
    for i in inputs:
        p = f.producers.get(i)
        if p is None or region_of.get(p.name) is None:
            continue
        src = regions[region_of[p.name]]
        if src.kind not in ("elementwise", "view") or src is r:
            continue
        producers = set(src.members)
        reason = can_fuse_prologue(f, r.kind, anchor, set(r.members), producers)
        if reason is None:
            pattern = "norm.residual" if r.kind == "reduction" and any(
                f.nodes[m].op == "add" for m in producers) and anchor.op in NORM_OPS else None
            for m in src.members:
                region_of[m] = rid
            r.members[:0] = src.members
            src.members.clear()
            if pattern:
                r.patterns.append(pattern)
        else:
            refusals.append(f"{src.kind} region of {src.members[0]} not fused into {anchor.name} "
                            f"({anchor.op}) as prologue: {reason}")


def _merge_views(f: Facts, regions, region_of) -> None:
    """A view region whose values feed a single other region is just that region's input view."""
    for r in regions:
        if r.kind != "view" or not r.members:
            continue
        consumers = {region_of[u.name] for m in r.members for v in f.nodes[m].outputs
                     for u in f.users.get(v.name, ()) if region_of[u.name] != region_of[m]}
        if len(consumers) == 1 and not any(v.name in f.outputs for m in r.members for v in f.nodes[m].outputs):
            target = regions[next(iter(consumers))]
            if target.kind in ("view", *CLOSED):
                continue
            if creates_cycle(f, set(target.members), set(r.members)):
                continue
            for m in r.members:
                region_of[m] = next(iter(consumers))
            target.members.extend(r.members)
            r.members.clear()


# Elementwise regions that read only graph inputs and constants, with at most this many elements each, run as one
# kernel (horizontal fusion), whatever their shapes (the elementwise template gives each output its own shape), up to
# HORIZONTAL_MAX_OUTPUTS outputs a kernel: a decode step's per-layer positions, cache counters and masks (HF LLaMA, 8
# layers: 16 one-element kernels a step, session 12; then three kernels of 8 outputs and the position's cast, one a
# shape, session 18) cost a launch and a dependent step each, not their arithmetic.
HORIZONTAL_MAX_NUMEL = 16384
HORIZONTAL_MAX_OUTPUTS = 32


def _merge_input_only(f: Facts, regions, region_of) -> None:
    """Merge the small elementwise regions that depend on no other region (or only on such regions before them, whose
    values the merged kernel computes again where it reads them), up to ``HORIZONTAL_MAX_OUTPUTS`` outputs a kernel:
    they depend on nothing but each other, in order, so no merge can create a cycle."""
    group: list[int] = []
    for rid, r in enumerate(regions):
        if r.kind != "elementwise" or not r.members or r.domain is None or r.domain.numel is None \
                or r.domain.numel > HORIZONTAL_MAX_NUMEL:
            continue
        nodes = [f.nodes[m] for m in r.members]
        if any(f.kind(n) not in ops.FUSIBLE_POINTWISE and f.kind(n) != OpKind.INJECTIVE and n.op not in VIEW_OPS
               for n in nodes):
            continue
        if any(i and f.producers.get(i) is not None and region_of.get(f.producers[i].name) not in (rid, *group)
               for n in nodes for i in n.inputs):  # (what an earlier merged region makes: computed again here)
            continue
        outs = escaping(f, set(r.members))
        if any(f.types[o].numel is None or f.types[o].numel > HORIZONTAL_MAX_NUMEL for o in outs):
            continue
        group.append(rid)
    into, count = None, 0
    for rid in group:
        r = regions[rid]
        n_out = len(escaping(f, set(r.members)))
        if into is None or count + n_out > HORIZONTAL_MAX_OUTPUTS:
            into, count = rid, n_out
            continue
        for m in r.members:
            region_of[m] = into
        regions[into].members.extend(r.members)
        r.members.clear()
        count += n_out


def _finish(f: Facts, regions: list[_Open], cost: CostModel) -> list[Region]:
    order = {n.name: i for i, n in enumerate(f.graph.nodes)}
    live = [r for r in regions if r.members]
    # Execution order: a topological sort of the region graph, ties broken by first member.
    idx = {m: k for k, r in enumerate(live) for m in r.members}
    rg = nx.DiGraph()
    rg.add_nodes_from(range(len(live)))
    for a, b in f.dag.edges:
        if idx[a] != idx[b]:
            rg.add_edge(idx[a], idx[b])
    first = {k: min(order[m] for m in r.members) for k, r in enumerate(live)}
    topo = list(nx.lexicographical_topological_sort(rg, key=lambda k: first[k]))
    out: list[Region] = []
    for pos, k in enumerate(topo):
        r = live[k]
        members = sorted(r.members, key=order.__getitem__)
        mset = set(members)
        nodes = [f.nodes[m] for m in members]
        produced = {v.name for n in nodes for v in n.outputs}
        inputs = list(dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in produced))
        outputs = escaping(f, mset)
        outputs.sort(key=lambda v: order[f.producers[v].name])
        op_names = [n.op for n in nodes]
        in_t = [f.types[i] for i in inputs]
        out_t = [f.types[o] for o in outputs]
        est = int(cost.region_us(in_t, out_t, 0) * cost.bandwidth_bytes_per_us) if r.kind != "view" else 0
        out.append(Region(region_name(op_names, r.kind, pos), r.kind, tuple(members), tuple(op_names), tuple(inputs),
                          tuple(outputs), r.anchor, ",".join(r.patterns) or None, "torch", est))
    return out


def attention_pattern(node: Node, types) -> str:
    """``attention.<what the kernel does>``: causal, sliding_window, masked (a per-key or bias operand), gqa,
    cross (Sq != Skv), softcap, joined by ``_``; ``attention.plain`` for none."""
    a = node.attr
    q, k = (types[x].shape for x in node.inputs[:2])
    parts = ["sliding_window" if a.get("window") else "causal" if a.get("is_causal") else None,
             "masked" if len(node.inputs) > 3 and node.inputs[3] else None,
             "gqa" if q and k and len(q) == 4 and len(k) == 4 and q[1] != k[1] else None,
             "cross" if q and k and q[-2] != k[-2] else None, "softcap" if a.get("softcap") is not None else None]
    return "attention." + ("_".join(p for p in parts if p) or "plain")


def region_name(op_names: list[str], kind: str, pos: int) -> str:
    compute = [o for o in dict.fromkeys(op_names) if o not in VIEW_OPS] or list(dict.fromkeys(op_names))
    base = "_".join(compute[:4])
    return f"fused_{base}_{pos}" if len(op_names) > 1 else f"{base}_{pos}"

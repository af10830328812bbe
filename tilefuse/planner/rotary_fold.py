"""Rotary folding: a decode step's rotary embedding of q and k and its KV-cache stores join the ``gemv_group`` that
makes q, k and v.

Note: after the q/k/v group, each layer of a decode step ran one elementwise kernel that read q, k and v back, rotated
q and k and stored k and v into the static cache: a launch and a dependent step of its own per layer (HF LLaMA on the
H200, 2026-12-02: 13-14 elementwise kernels a step, 3.2 us each). At one token a row the group's warps hold each
output element in registers; with a rotary weight's rows paired (``n`` and ``n + D/2`` in one warp) they hold both
halves the rotation mixes, so the group rotates and stores itself (``lowering/templates/gemv.py``). Legality here (an
elementwise region whose nodes that read the group's outputs, and their readers, are only ``transpose``/reshapes,
``rotary_embedding`` and ``index_copy``; whose other inputs exist where the group runs; whose group outputs nothing
else reads; and whose caches no region in between reads). What else that region computes (the first layer's also
makes the step's cos and sin) moves into the elementwise region before the group that makes what it reads, where
there is one. Whether the merged regions lower
(one token a row, heads of one size, the layouts) is the lowering's answer (``why_not``), asked before any region is
replaced: a store that does not lower stays its own kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tilefuse.ir import Graph
from tilefuse.planner.grouping import RESHAPES
from tilefuse.planner.plan import Region

FOLDED_OPS = RESHAPES | {"transpose", "rotary_embedding", "index_copy"}


def fold_rotary(graph: Graph, regions: Sequence[Region], target: dict | None,
                why_not: Callable[[Region, Graph], str | None] | None) -> list[Region]:
    """``regions`` with each decode step's rotary-and-store region merged into the ``gemv_group`` before it that
    makes its rows, where the lowering takes the merged group."""
    regions = list(regions)
    if why_not is None or not target:
        return regions
    nodes = {n.name: n for n in graph.nodes}
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    outside = {v.name for v in graph.inputs} | set(graph.constants)
    k = 0
    while k < len(regions):
        folded = _fold(graph, nodes, order, outside, regions, k, why_not)
        if folded is None:
            k += 1
            continue
        regions = folded  # region k is gone: the same position now holds the next region
    return regions


def _fold(graph, nodes, order, outside, regions, k, why_not) -> list[Region] | None:
    """``regions`` with region ``k``'s rotary and stores merged into its group (and what else it computes, the
    step's cos and sin in the first layer's, into the elementwise region before the group that makes what that reads),
    or None where it is not a foldable store or does not lower."""
    r = regions[k]
    if r.kind != "elementwise" or "index_copy" not in r.ops:
        return None
    made_at = {v: j for j, q in enumerate(regions) for v in q.outputs}
    groups = {made_at[i] for i in r.inputs if i in made_at and regions[made_at[i]].kind == "gemv_group"}
    if len(groups) != 1:
        return None
    (g,) = groups
    group = regions[g]
    fed = {i for i in r.inputs if made_at.get(i) == g}
    tail, rest = _downstream(r, nodes, fed)
    tail_ops = {nodes[m].op for m in tail}
    if not tail_ops <= FOLDED_OPS or "index_copy" not in tail_ops:
        return None
    rest_made = _made(nodes, rest)
    p = _rest_home(nodes, outside, regions, made_at, rest, rest_made, g)
    if rest and p is None:
        return None
    tail_made = _made(nodes, tail)
    tail_in = list(dict.fromkeys(i for m in tail for i in nodes[m].inputs if i and i not in tail_made))
    # what the tail reads exists where the group runs; what the group gives it, nothing else reads
    if any(i not in fed and i not in outside and i not in rest_made and made_at.get(i, len(regions)) >= g
           for i in tail_in):
        return None
    if fed & set(graph.outputs) or any(fed & set(q.inputs) for j, q in enumerate(regions) if j not in (g, k)):
        return None
    caches = {nodes[m].inputs[0] for m in tail if nodes[m].op == "index_copy"}
    if any(caches & set(q.inputs) for q in regions[g + 1:k]):  # (the stores move before these regions)
        return None
    new = {g: _with(group, nodes, order, group.nodes + tuple(tail),
                    [*group.inputs, *(i for i in tail_in if i not in fed)],
                    [*(o for o in group.outputs if o not in fed), *(o for o in r.outputs if o in tail_made)],
                    group.est_bytes + r.est_bytes)}
    if rest:
        home = regions[p]
        members = set(home.nodes) | set(rest)
        wanted = set(graph.outputs) | {i for n in graph.nodes if n.name not in members for i in n.inputs}
        made = _made(nodes, members)
        producer = {v.name: m for m in members for v in nodes[m].outputs}
        new[p] = _with(home, nodes, order, home.nodes + tuple(rest),
                       [*home.inputs, *(i for m in rest for i in nodes[m].inputs if i and i not in made)],
                       sorted(made & wanted, key=lambda v: order[producer[v]]), home.est_bytes)
    if any(why_not(q, graph) is not None for q in new.values()):
        return None
    return [new.get(j, q) for j, q in enumerate(regions) if j != k]


def _downstream(r: Region, nodes, fed: set) -> tuple[list[str], list[str]]:
    """``r``'s nodes that read (through each other) the ``fed`` values, and the rest, each in order."""
    tail, rest, reached = [], [], set(fed)
    for m in r.nodes:
        if any(i in reached for i in nodes[m].inputs):
            tail.append(m)
            reached |= {v.name for v in nodes[m].outputs}
        else:
            rest.append(m)
    return tail, rest


def _made(nodes, members) -> set[str]:
    return {v.name for m in members for v in nodes[m].outputs}


def _rest_home(nodes, outside, regions, made_at, rest, rest_made, g) -> int | None:
    """The elementwise region before the group ``g`` that makes everything ``rest`` reads (from outside it, or
    graph inputs and constants): where ``rest`` can run instead. None where there is none."""
    reads = {i for m in rest for i in nodes[m].inputs if i and i not in rest_made}
    homes = {made_at[i] for i in reads if i in made_at}
    if len(homes) != 1 or any(i not in outside and i not in made_at for i in reads):
        return None
    (p,) = homes
    return p if p < g and regions[p].kind == "elementwise" else None


def _with(region: Region, nodes, order, members, inputs, outputs, est_bytes) -> Region:
    members = tuple(sorted(set(members), key=order.__getitem__))
    return dataclasses.replace(region, nodes=members, ops=tuple(nodes[m].op for m in members),
                               inputs=tuple(dict.fromkeys(inputs)), outputs=tuple(dict.fromkeys(outputs)),
                               est_bytes=est_bytes)

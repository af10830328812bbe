"""Rotary folding: a decode step's rotary embedding of q and k and its KV-cache stores join the ``gemv_group`` that
makes q, k and v.

Note: after the q/k/v group, each layer of a decode step ran one elementwise kernel that read q, k and v back, rotated
q and k and stored k and v into the static cache: a launch and a dependent step of its own per layer (HF LLaMA on the
H200, 2026-12-02: 13-14 elementwise kernels a step, 3.2 us each). At one token a row the group's warps hold each
output element in registers; with a rotary weight's rows paired (``n`` and ``n + D/2`` in one warp) they hold both
halves the rotation mixes, so the group rotates and stores itself (``lowering/templates/gemv.py``). Legality here (an
elementwise region of only ``transpose``/reshapes, ``rotary_embedding`` and ``index_copy``, whose every other input
exists where the group runs, that reads the group's outputs and nothing else reads them, and whose caches no region
in between reads); whether the merged group lowers (one token a row, heads of one size, the layouts) is the lowering's
answer (``why_not``), asked before any region is replaced: a store that does not lower stays its own kernel.
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
    """``regions`` with region ``k`` merged into its group, or None where it is not a foldable store or does not
    lower."""
    r = regions[k]
    if r.kind != "elementwise" or not set(r.ops) <= FOLDED_OPS or "index_copy" not in r.ops:
        return None
    made_at = {v: j for j, q in enumerate(regions) for v in q.outputs}
    groups = {made_at[i] for i in r.inputs if i in made_at and regions[made_at[i]].kind == "gemv_group"}
    if len(groups) != 1:
        return None
    (g,) = groups
    group = regions[g]
    fed = {i for i in r.inputs if made_at.get(i) == g}
    # the rest exists where the group runs; what the group gives the store, nothing else reads
    if any(i not in fed and i not in outside and made_at.get(i, len(regions)) >= g for i in r.inputs):
        return None
    if fed & set(graph.outputs) or any(fed & set(q.inputs) for j, q in enumerate(regions) if j not in (g, k)):
        return None
    caches = {nodes[m].inputs[0] for m in r.nodes if nodes[m].op == "index_copy"}
    if any(caches & set(q.inputs) for q in regions[g + 1:k]):  # (the stores move before these regions)
        return None
    members = tuple(sorted({*group.nodes, *r.nodes}, key=order.__getitem__))
    inputs = tuple(dict.fromkeys([*group.inputs, *(i for i in r.inputs if i not in fed)]))
    outputs = tuple(dict.fromkeys([*(o for o in group.outputs if o not in fed), *r.outputs]))
    merged = dataclasses.replace(group, nodes=members, ops=tuple(nodes[m].op for m in members), inputs=inputs,
                                 outputs=outputs, est_bytes=group.est_bytes + r.est_bytes)
    if why_not(merged, graph) is not None:
        return None
    return [merged if j == g else q for j, q in enumerate(regions) if j != k]

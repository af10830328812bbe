"""Horizontal grouping: a decode step's linears of one input (q, k and v of a normalized hidden state) as one region,
one ``gemv_group`` launch.

Note: at a decode step's few rows each linear streams its weight once; apart, each also pays a launch, the GPU's ramp
up and its tail (HF LLaMA on the H200, 2026-12-02: q 4.2 us, k and v 2.6 us each, at 2.0 and 0.8 TB/s, where a
larger weight reads at 2.9-3.7). Grouped they share them. Legality here (GEMM regions of a ``linear`` whose input is
the same value up to reshapes, whose other inputs exist where the first of them runs or are made by another of them: a
gated MLP's up projection, whose epilogue multiplies by ``silu(gate)``); whether the group lowers is the lowering's
answer (``why_not``: the ``gemv_group`` builder wants a GPU target, at most ``gemv.GEMV_ROWS`` unbatched
rows, the same prologue and dtypes), asked before the regions are replaced: a group that does not lower stays apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tilefuse.ir import Graph
from tilefuse.planner.plan import Region

# Linears a group takes at most: each is its own copy of the kernel's body (a mixture of experts' dozens of linears of one
# input would make one kernel of dozens, slow to compile); q, k and v are three.
GROUP_MAX = 4
RESHAPES = frozenset({"reshape", "flatten", "squeeze", "unsqueeze", "identity"})  # the same data, another shape


def reshaped_from(graph: Graph, value: str, producer: dict | None = None) -> str:
    """The value ``value`` is a reshape of (through any chain of them), or itself. ``producer``: value -> node, where
    the caller has it."""
    producer = producer if producer is not None else {v.name: n for n in graph.nodes for v in n.outputs}
    while value in producer and producer[value].op in RESHAPES and producer[value].inputs:
        value = producer[value].inputs[0]
    return value


def group_gemvs(graph: Graph, regions: Sequence[Region], target: dict | None,
                why_not: Callable[[Region, Graph], str | None] | None) -> list[Region]:
    """``regions`` with each set of GEMM regions whose ``linear`` reads the same input (up to reshapes) made one
    ``gemv_group`` region where the first of them ran, when the lowering takes it."""
    regions = list(regions)
    if why_not is None or not target:
        return regions
    nodes = {n.name: n for n in graph.nodes}
    producer = {v.name: n for n in graph.nodes for v in n.outputs}
    outside = {v.name for v in graph.inputs} | set(graph.constants)
    made_at = {v: k for k, r in enumerate(regions) for v in r.outputs}
    by_input: dict[str, list[int]] = {}
    for k, r in enumerate(regions):
        if r.kind == "gemm" and r.anchor is not None and nodes[r.anchor].op == "linear":
            by_input.setdefault(reshaped_from(graph, nodes[r.anchor].inputs[0], producer), []).append(k)
    merged: dict[int, Region] = {}
    dropped: set[int] = set()
    for ks in by_input.values():
        while len(ks) > 1:
            pos, parts = ks[0], []
            for k in ks:  # what a part reads exists where the group runs, or is another part's (the lowering decides)
                if len(parts) < GROUP_MAX and all(i in outside or made_at.get(i, len(regions)) < pos or
                                                  made_at.get(i) in parts for i in regions[k].inputs):
                    parts.append(k)
            ks = [k for k in ks[1:] if k not in parts]
            if len(parts) < 2:
                continue
            group = _merge(graph, nodes, [regions[k] for k in parts])
            if why_not(group, graph) is None:
                merged[pos] = group
                dropped |= set(parts[1:])
    return [merged.get(k, r) for k, r in enumerate(regions) if k not in dropped]


def _merge(graph: Graph, nodes: dict, parts: list[Region]) -> Region:
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    members = sorted({m for p in parts for m in p.nodes}, key=order.__getitem__)
    made = {v for p in parts for v in p.outputs}
    inputs = tuple(dict.fromkeys(i for p in parts for i in p.inputs if i not in made))
    inside = set(members)
    wanted = set(graph.outputs) | {i for n in graph.nodes if n.name not in inside for i in n.inputs}
    outputs = tuple(dict.fromkeys(o for p in parts for o in p.outputs if o in wanted))  # (a gate's, read by the up only: no)
    ops = tuple(nodes[m].op for m in members)
    return Region(f"gemv_group_{parts[0].name}", "gemv_group", tuple(members), ops, inputs, outputs,
                  parts[0].anchor, "gemv.group", "torch", sum(p.est_bytes for p in parts))

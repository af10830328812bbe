"""The fusion planner: graph -> FusionPlan (canonicalize, partition into regions, pick backends)."""

from __future__ import annotations

import dataclasses

from tilefuse.ir import Graph
from tilefuse.planner.canonicalize import canonicalize, simplify  # noqa: F401
from tilefuse.planner.cost import CostModel
from tilefuse.planner.partition import partition
from tilefuse.planner.pattern import RewriteLog
from tilefuse.planner.plan import FusionPlan, Region, compute_nodes


def plan(graph: Graph, target: dict | None = None, cost: CostModel | None = None, fuse: bool = True) -> FusionPlan:
    """Plan ``graph``: canonicalize it, group its nodes into regions, say how each region runs."""
    log = RewriteLog()
    canon = canonicalize(graph, log) if fuse else graph
    regions, refusals = partition(canon, cost) if fuse else _one_per_node(canon)
    backends = [_backend(r, canon, target) for r in regions]
    regions = [dataclasses.replace(r, backend=b) for r, (b, _) in zip(regions, backends)]
    rewrites = [f"{p}: {node}" for p, node in log.applied]
    refusals = refusals + [f"pattern {p} at {node}: {why}" for p, node, why in log.refused]
    refusals += [f"{r.name} runs through torch: {why}" for r, (b, why) in zip(regions, backends)
                 if b == "torch" and r.kind != "view"]
    return FusionPlan(canon, tuple(regions), tuple(refusals), tuple(rewrites), compute_nodes(graph))


def _backend(region: Region, graph: Graph, target: dict | None) -> tuple[str, str]:
    """("tilelang", "") when a template takes the region for ``target``, else ("torch", why)."""
    if region.kind == "view":
        return "torch", "metadata only"
    if target is None:
        return "torch", "no target given"
    from tilefuse.lowering.registry import KernelSpec, build

    spec = build(region, graph, target)
    return ("tilelang", "") if isinstance(spec, KernelSpec) else ("torch", spec)


def _one_per_node(graph: Graph):
    from tilefuse.planner.partition import _name

    regions = []
    for i, n in enumerate(graph.nodes):
        regions.append(Region(_name([n.op], "opaque", i), "opaque", (n.name,), (n.op,), tuple(x for x in n.inputs if x),
                              tuple(o.name for o in n.outputs)))
    return regions, []

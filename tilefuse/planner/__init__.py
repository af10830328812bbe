"""The fusion planner: graph -> FusionPlan (canonicalize, partition into regions, pick backends)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tilefuse.ir import Graph
from tilefuse.planner.canonicalize import canonicalize, simplify  # noqa: F401
from tilefuse.planner.cost import CostModel
from tilefuse.planner.grouping import group_gemvs
from tilefuse.planner.layout import aligned_gemm_outputs, channels_last
from tilefuse.planner.norm_fold import fold_norms
from tilefuse.planner.norm_split import split_long_norms
from tilefuse.planner.partition import partition, region_name
from tilefuse.planner.pattern import RewriteLog
from tilefuse.planner.plan import FusionPlan, Region, compute_nodes
from tilefuse.planner.rotary_fold import fold_rotary
from tilefuse.planner.sparsity import SparsityReport, sparsify


def plan(graph: Graph, target: dict | None = None, cost: CostModel | None = None, fuse: bool = True,
         sparsity: str | None = None, layout: bool | None = None,
         why_not: Callable[[Region, Graph], str | None] | None = None, group: bool = True,
         fold: bool = True, rotary: bool = True) -> FusionPlan:
    """Plan ``graph``: canonicalize it, apply ``sparsity`` (``"2:4"`` prunes linear weights; 2:4 weights take
    the sparse GEMM where the target has one, see ``planner.sparsity``), group its nodes into regions, say
    how each region runs. With ``layout`` (None: on) convolutional networks run channels last (``planner.layout``;
    ``Options.channels_last`` says why). On GPU targets group norms of few, long groups are split into chunks
    (``planner.norm_split``). Which regions a kernel takes is the lowering's answer, asked through
    ``why_not(region, graph)``: None where a template takes the region for ``target``, else the reason it runs
    through torch (``tilefuse.pipeline`` asks ``lowering.dispatch``); without it every region runs through torch. With
    ``group`` a decode step's linears of one input become one region where the lowering takes it (``planner.grouping``);
    with ``fold`` a decode step's RMSNorm becomes its linears' prologue (``planner.norm_fold``); with ``rotary`` its
    rotary embedding and cache stores join its q/k/v group (``planner.rotary_fold``)."""
    log = RewriteLog()
    canon = canonicalize(graph, log) if fuse else graph
    if fuse and layout is not False:
        canon = channels_last(canon)
    canon, sparse = sparsify(canon, target, sparsity)
    if fuse:
        canon = split_long_norms(aligned_gemm_outputs(canon, target), target, log)
    regions, refusals = partition(canon, cost) if fuse else _one_per_node(canon)
    if fuse and group:
        regions = group_gemvs(canon, regions, target, why_not)
    if fuse and fold:
        regions = fold_norms(canon, regions, target, why_not)
    if fuse and group and rotary:
        regions = fold_rotary(canon, regions, target, why_not)
    regions, notes = _mark_sparse(regions, canon, sparse)
    backends = [_backend(r, canon, target, why_not) for r in regions]
    regions = [dataclasses.replace(r, backend=b) for r, (b, _) in zip(regions, backends)]
    rewrites = [f"{p}: {node}" for p, node in log.applied]
    refusals = refusals + [f"pattern {p} at {node}: {why}" for p, node, why in log.refused]
    refusals += [f"{r.name} runs through torch: {why}" for r, (b, why) in zip(regions, backends)
                 if b == "torch" and r.kind != "view"]
    return FusionPlan(canon, tuple(regions), tuple(refusals), tuple(rewrites), compute_nodes(graph), notes,
                      sparse if sparse.mode or sparse.sparse_kernel else None)


def _mark_sparse(regions: list[Region], graph: Graph, report: SparsityReport) -> tuple[list[Region], tuple[str, ...]]:
    """Patterns and notes for the regions of 2:4 weights: ``gemm.sparse_2_4`` (the gemm_sp kernel) or
    ``gemm.dense_2_4`` (a dense GEMM on the 2:4 weight, with the reason in the plan's notes)."""
    dense, weight_of = dict(report.dense), dict(report.dense_nodes)
    if not (dense or report.sparse_kernel):
        return regions, ()
    nodes = {n.name: n for n in graph.nodes}
    out, notes = [], []
    for r in regions:
        anchor = nodes.get(r.anchor) if r.anchor else None
        if anchor is not None and anchor.op == "sparse_linear":
            r = dataclasses.replace(r, pattern="gemm.sparse_2_4")
        elif r.anchor in weight_of:
            w = weight_of[r.anchor]
            r = dataclasses.replace(r, pattern="gemm.dense_2_4")
            notes.append(f"{r.name}: 2:4 weight {w}: {dense[w]}")
        out.append(r)
    return out, tuple(notes)


def _backend(region: Region, graph: Graph, target: dict | None, why_not) -> tuple[str, str]:
    """("tilelang", "") when a template takes the region for ``target``, else ("torch", why)."""
    if region.kind == "view":
        return "torch", "metadata only"
    if target is None:
        return "torch", "no target given"
    if why_not is None:
        return "torch", "planned without lowering (tilefuse.pipeline.plan decides which regions take kernels)"
    why = why_not(region, graph)
    return ("tilelang", "") if why is None else ("torch", why)


def _one_per_node(graph: Graph):
    regions = []
    for i, n in enumerate(graph.nodes):
        regions.append(Region(region_name([n.op], "opaque", i), "opaque", (n.name,), (n.op,), tuple(x for x in n.inputs if x),
                              tuple(o.name for o in n.outputs)))
    return regions, []

"""A GEMM region in two: its anchor through torch, the rest of the region as one TileLang elementwise kernel.

Note: the pipeline's ``decide`` step weighs three ways of running a GEMM region: the fused kernel, the region's ops
through torch, and this split (``runtime.kernels.SplitRegion`` runs it). The split pays where the library GEMM beats our fused kernel but the
epilogue has several ops that torch would run one kernel each: LLaMA's ``silu(gate) * up`` after the up
projection (fused kernel 0.71 ms, cuBLAS then two torch kernels 0.62 ms, on the H200), or a convolution's
batch norm, residual add and ReLU. A 2:4 region (``gemm_sp``) splits the same way: its head is the dense GEMM on the
2:4 weight (``sparse_linear`` with its dense form), for where the sparse kernel loses to the dense library GEMM.
"""

from __future__ import annotations

from collections.abc import Sequence

from tilefuse.planner.plan import VIEW_OPS, FusionPlan, Region

# A single epilogue op is one torch kernel either way: splitting gains nothing there.
MIN_EPILOGUE_OPS = 2


def node_maps(plan: FusionPlan) -> tuple[dict, dict]:
    """(nodes by name, producer node of each value) of ``plan``'s graph: what ``split`` reads, made once a plan."""
    return {n.name: n for n in plan.graph.nodes}, {v.name: n for n in plan.graph.nodes for v in n.outputs}


def split(plan: FusionPlan, region: Region, maps: tuple[dict, dict] | None = None) -> tuple[Region, Region] | None:
    """(head, tail) of a GEMM region: the head is the anchor and the region's nodes it depends on, the tail
    every other node as an elementwise region reading what the head computes; None where there is no
    epilogue of ``MIN_EPILOGUE_OPS`` compute ops, or the head's values other than the tail's inputs escape.
    ``maps``: ``node_maps(plan)``, when splitting several regions of one plan."""
    if region.kind not in ("gemm", "gemm_sp") or region.anchor is None:
        return None
    nodes, producer = maps if maps is not None else node_maps(plan)
    members = set(region.nodes)
    head: set[str] = set()
    todo = [region.anchor]
    while todo:
        name = todo.pop()
        if name in head:
            continue
        head.add(name)
        todo += [producer[i].name for i in nodes[name].inputs if i in producer and producer[i].name in members]
    tail = [m for m in region.nodes if m not in head]
    if sum(1 for m in tail if nodes[m].op not in VIEW_OPS) < MIN_EPILOGUE_OPS:
        return None
    made_by_head = {v.name for m in head for v in nodes[m].outputs}
    if made_by_head & set(region.outputs):
        return None
    made_by_tail = {v.name for m in tail for v in nodes[m].outputs}
    tail_reads = list(dict.fromkeys(i for m in tail for i in nodes[m].inputs if i and i not in made_by_tail))
    head_nodes = tuple(m for m in region.nodes if m in head)
    head_region = Region(f"{region.name}_head", region.kind, head_nodes, tuple(nodes[m].op for m in head_nodes),
                         _reads(nodes, head_nodes, region.inputs),
                         tuple(v for v in tail_reads if v in made_by_head), region.anchor, backend="torch")
    tail_region = Region(f"{region.name}_tail", "elementwise", tuple(tail), tuple(nodes[m].op for m in tail),
                         tuple(tail_reads), region.outputs, backend="tilelang")
    return head_region, tail_region


def _reads(nodes: dict, members: Sequence[str], inputs: Sequence[str]) -> tuple[str, ...]:
    used = {i for m in members for i in nodes[m].inputs}
    return tuple(i for i in inputs if i in used)

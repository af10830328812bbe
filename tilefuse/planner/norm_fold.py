"""Norm folding: a decode step's RMSNorm read only by linears becomes their prologue, and the residual add before it
the epilogue of the linear that makes its other operand.

Note: at a decode step's few rows a linear is a ``gemv`` whose every warp reads the whole row of A, so it can sum the
row's squares in the same pass and scale its sums at the end (``lowering/templates/gemv.py``): the norm's own
launch, and the trip of its normalized row through memory, go. A LLaMA layer's two norms (and the final one) each
read the residual stream ``h + x`` that the o and down projections add to: that add moves into their epilogues, so a
layer runs qkv -> rotary and cache store -> attention -> o (+ residual) -> gate/up -> down (+ residual), 17 launches
fewer in 8 layers. Legality here (a ``reduction`` region of an ``rms_norm`` over the last dim, optionally after one
``add``, followed only by reshapes; every value it makes but the add's read only by ``gemm``/``gemv_group`` regions;
the add's operand made by a GEMM region that nothing else reads); whether each new region lowers is the lowering's
answer (``why_not``: only a gemv takes a norm, so a prefill's GEMMs keep their norm kernel), asked before any region
is replaced. A norm whose folding does not lower in every reader stays as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tilefuse.ir import Graph
from tilefuse.planner.grouping import RESHAPES
from tilefuse.planner.plan import Region

LINEAR_KINDS = ("gemm", "gemv_group")


class _GraphFacts(NamedTuple):
    """What ``_fold`` reads of the graph, made once a pass."""

    graph: Graph
    nodes: dict  # name -> node
    order: dict  # node name -> its position
    users: dict  # value -> the nodes that read it (``Graph.users``)
    outside: set  # graph inputs and constants
    outputs: set


def fold_norms(graph: Graph, regions: Sequence[Region], target: dict | None,
               why_not: Callable[[Region, Graph], str | None] | None) -> list[Region]:
    """``regions`` with each foldable RMSNorm region merged into its readers (and its residual add into the GEMM
    region before it), where the lowering takes every region so made."""
    regions = list(regions)
    if why_not is None or not target:
        return regions
    g = _GraphFacts(graph, {n.name: n for n in graph.nodes}, {n.name: k for k, n in enumerate(graph.nodes)},
                    graph.users(), {v.name for v in graph.inputs} | set(graph.constants), set(graph.outputs))
    k = 0
    while k < len(regions):
        folded = _fold(g, regions, k, why_not)
        if folded is None:
            k += 1
            continue
        regions = folded  # the norm's region is gone: the same position now holds the next region
    return regions


def _fold(g: _GraphFacts, regions, k, why_not) -> list[Region] | None:
    """``regions`` with region ``k``'s norm folded, or None where it is not a foldable norm or does not lower."""
    nodes, order = g.nodes, g.order
    r = regions[k]
    if r.kind != "reduction" or r.anchor is None or nodes[r.anchor].op != "rms_norm":
        return None
    norm = nodes[r.anchor]
    x = norm.inputs[0]
    rank = len(norm.outputs[0].type.shape)
    if rank == 0 or norm.attr.get("axis", -1) % rank != rank - 1:
        return None
    before = [m for m in r.nodes if order[m] < order[norm.name]]
    after = [m for m in r.nodes if order[m] > order[norm.name]]
    if any(nodes[m].op not in RESHAPES for m in after) or len(before) > 1:
        return None
    add = nodes[before[0]] if before else None
    if add is not None and (add.op != "add" or add.outputs[0].name != x):
        return None
    normed = {norm.outputs[0].name} | {v.name for m in after for v in nodes[m].outputs}
    if normed & g.outputs:
        return None
    readers = {j for j, q in enumerate(regions) if j != k and normed & set(q.inputs)}
    if not readers or any(regions[j].kind not in LINEAR_KINDS for j in readers):
        return None
    new: dict[int, Region] = {}
    producer = {v.name: m for m in after for v in nodes[m].outputs}
    for j in readers:
        q = regions[j]
        members = tuple(sorted({norm.name, *_views_to(nodes, producer, after, normed & set(q.inputs)), *q.nodes},
                               key=order.__getitem__))
        inputs = tuple(dict.fromkeys([*(i for i in norm.inputs if i), *(i for i in q.inputs if i not in normed)]))
        new[j] = dataclasses.replace(q, nodes=members, ops=tuple(nodes[m].op for m in members), inputs=inputs)
    if add is not None:
        p = _residual_producer(g, regions, k, add)
        if p is None:
            return None
        q = regions[p]
        members = tuple(sorted({*q.nodes, add.name}, key=order.__getitem__))
        made = {v.name for m in members for v in nodes[m].outputs}
        inputs = tuple(dict.fromkeys([*q.inputs, *(i for i in add.inputs if i not in made)]))
        new[p] = dataclasses.replace(q, nodes=members, ops=tuple(nodes[m].op for m in members), inputs=inputs,
                                     outputs=(x,))
    if any(why_not(q, g.graph) is not None for q in new.values()):
        return None
    return [new.get(j, q) for j, q in enumerate(regions) if j != k]


def _views_to(nodes, producer, after, wanted) -> set[str]:
    """The reshapes among ``after`` that make the ``wanted`` values from the norm's output."""
    out, todo = set(), list(wanted)
    while todo:
        m = producer.get(todo.pop())
        if m is not None and m not in out:
            out.add(m)
            todo += nodes[m].inputs
    return out


def _residual_producer(g: _GraphFacts, regions, k, add) -> int | None:
    """The GEMM region before region ``k`` that makes one of ``add``'s operands (read by nothing but the add), whose
    other operand exists before it: it can take the add as its epilogue. None where there is none."""
    made_at = {v: j for j, q in enumerate(regions) for v in q.outputs}
    for v, w in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        p = made_at.get(v)
        if p is None or p >= k or regions[p].kind != "gemm" or regions[p].outputs != (v,):
            continue
        if [u.name for u in g.users.get(v, ())] != [add.name] or v in g.outputs:
            continue
        if w in g.outside or made_at.get(w, k) < p:
            return p
    return None

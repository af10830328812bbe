"""FusionPlan: ordered regions, each one future kernel, with its reasons; text and JSON forms."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tilefuse import ops
from tilefuse.ir import Graph

# Region kinds. ``view`` regions hold only metadata ops (reshape, squeeze, ...): no kernel.
KINDS = ("gemm", "gemm_sp", "gemv_group", "attention", "reduction", "elementwise", "opaque", "view", "collective")


BACKENDS = ("tilelang", "torch", "split")


@dataclass(frozen=True)
class Region:
    """A group of nodes that becomes one kernel.

    ``anchor`` is the node the template is built around (the GEMM, the norm...); ``inputs`` are the
    values it reads from outside, ``outputs`` the values others read (or the graph returns). ``backend``
    is one of ``BACKENDS``: its TileLang kernel, its ops through torch, or (chosen by measurement,
    ``lowering/split.py``) its GEMM through torch and the rest as one TileLang kernel.
    """

    name: str
    kind: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    anchor: str | None = None
    pattern: str | None = None
    backend: str = "torch"
    est_bytes: int = 0

    @property
    def launches(self) -> int:
        return 0 if self.kind == "view" else 1

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "ops": list(self.ops), "nodes": list(self.nodes),
                "inputs": list(self.inputs), "outputs": list(self.outputs), "anchor": self.anchor,
                "pattern": self.pattern, "backend": self.backend, "est_bytes": self.est_bytes}


@dataclass(frozen=True)
class FusionPlan:
    """The planner's output: the (canonicalized) graph and its regions in execution order."""

    graph: Graph
    regions: tuple[Region, ...]
    refusals: tuple[str, ...] = ()
    rewrites: tuple[str, ...] = ()
    source_nodes: int = 0  # compute nodes of the graph as imported, before canonicalization
    notes: tuple[str, ...] = field(default_factory=tuple)
    sparsity: Any = field(default=None, compare=False)  # planner.sparsity.SparsityReport, when sparsity applied

    @property
    def kernels(self) -> int:
        return sum(r.launches for r in self.regions)

    def region_of(self) -> dict[str, Region]:
        return {n: r for r in self.regions for n in r.nodes}

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for r in self.regions:
            if r.launches:
                kinds[r.kind] = kinds.get(r.kind, 0) + 1
        by_kind = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        tl = sum(1 for r in self.regions if r.launches and r.backend == "tilelang")
        split = sum(1 for r in self.regions if r.launches and r.backend == "split")
        return (f"{self.graph.name}: {self.source_nodes} compute nodes -> {self.kernels} kernels "
                f"({by_kind}); {tl} TileLang, {self.kernels - tl - split} torch"
                + (f", {split} split (GEMM through torch, epilogue TileLang)" if split else ""))

    def to_text(self, reasons: bool = True) -> str:
        lines = [self.summary()]
        for r in self.regions:
            mb = r.est_bytes / 1e6
            lines.append(f"  {r.name:<40} {r.kind:<11} {r.backend:<8} {mb:>9.3f} MB  ops: {' '.join(r.ops)}")
            lines.append(f"  {'':<40} in: {', '.join(r.inputs) or '-'}  out: {', '.join(r.outputs)}")
        if self.rewrites:
            lines.append("rewrites:")
            lines += [f"  {w}" for w in self.rewrites]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {w}" for w in self.notes]
        if reasons and self.refusals:
            lines.append("refused fusions:")
            lines += [f"  {w}" for w in self.refusals]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"graph": self.graph.name, "nodes": self.source_nodes, "kernels": self.kernels,
                "regions": [r.to_json() for r in self.regions], "rewrites": list(self.rewrites),
                "refusals": list(self.refusals)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


# Ops that only change metadata (no data movement when the input is contiguous).
VIEW_OPS = ops.with_trait("view")


def compute_nodes(graph: Graph) -> int:
    """Nodes that do work: everything except metadata-only ops."""
    return sum(1 for n in graph.nodes if n.op not in VIEW_OPS)

"""Region -> kernel spec: which template builder takes a fused region, as a table (like the planner's patterns).

Note: a region lowers in three parts. *Pre* nodes are metadata-only views of the region's inputs
(torch runs them for free before the kernel); the *kernel* is one template instance whose fused
expressions (``lowering.expr``) are built from the region's elementwise nodes; *post* reshapes
give each region output its shape. Elementwise values inside a GEMM or reduction region live in
one 2-D iteration domain (rows, cols) — the planner's legality guarantees every extra operand is
the full domain, a vector over the last dim, or a scalar — so interior reshapes are free too.
Elementwise regions may also hold injective ops (layouts, slices, concat, gathers, pads, rotary
embeddings...): each output element is pulled through the nodes' index maps (``lowering.index``),
so every output keeps its own shape and inputs are read where the maps say. Reductions run as row
reductions over their trailing dims (rows = the dims before); pooling has its own template, except
a global average pool, which is a mean. ``build(region, graph, target)`` returns a ``KernelSpec``
or the reason the region runs through torch.
"""

from __future__ import annotations

from collections.abc import Callable

from tilefuse.ir import Graph, Node
from tilefuse.lowering.attention_builder import build_attention
from tilefuse.lowering.builders import (
    Builder,
    KernelSpec,
    build_elementwise,
    build_gemm,
    build_reduction,
    check_divisors,
    check_static,
    is_global_pool,
)
from tilefuse.lowering.conv_builder import build_conv, build_pool
from tilefuse.lowering.gemv_group_builder import build_gemv_group
from tilefuse.lowering.index import NotLowerable
from tilefuse.lowering.norm_builder import build_group_norm
from tilefuse.lowering.sparse_builder import build_gemm_sp
from tilefuse.lowering.templates.ascend import ASCEND_KINDS, ascend_spec
from tilefuse.ops import POOL_OPS
from tilefuse.planner.plan import FusionPlan, Region

# Targets whose kernels TileLang builds here; the others (hip, metal, ascend) stop at source.
KERNEL_TARGETS = ("c", "cuda")
# Targets whose kernels are built as source (and, for hip, a code object) for their vendor's toolchain
# (``lowering/vendor.py``, ``tilefuse compile --target``); planned for running, their regions go through torch.
SOURCE_TARGETS = ("hip", "metal", "ascend")

Builds = Callable[[Builder, Node | None, dict], KernelSpec]


def _pool(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """A pool: the pool template, except a global average pool, which is a mean (a row reduction)."""
    return build_reduction(b, anchor, target) if is_global_pool(anchor) else build_pool(b, anchor, target)


# (region kind, anchor op) -> builder; an anchor op of None is the kind's builder for every other anchor.
BUILDERS: dict[tuple[str, str | None], Builds] = {
    ("elementwise", None): lambda b, anchor, target: build_elementwise(b, target),
    ("gemm", "linear"): build_gemm,
    ("gemm", "matmul"): build_gemm,
    ("gemm", "conv"): build_conv,
    ("gemm", "conv_transpose"): build_conv,  # (the convolution template, transposed)
    ("gemv_group", None): build_gemv_group,  # a decode step's linears of one input (planner.grouping)
    ("gemm_sp", None): build_gemm_sp,  # a 2:4 sparse weight (lowering/sparse_builder.py)
    **{("reduction", op): _pool for op in sorted(POOL_OPS)},
    ("reduction", "group_norm"): build_group_norm,  # lowering/norm_builder.py
    ("reduction", "instance_norm"): build_group_norm,
    ("reduction", None): build_reduction,
    ("attention", "sdpa"): build_attention,
}
# Region kinds no template takes, and why.
NO_KERNEL = {"view": "view regions run through torch (metadata only, no kernel)",
             "opaque": "no template takes opaque ops; it runs through torch",
             "collective": "collectives run through torch, each alone and in program order (tilefuse/ops/collective.py)"}
# Why a region of a kind with builders finds none for its anchor.
NO_TEMPLATE = {"gemm": "no GEMM template for {op}", "attention": "an attention region without an sdpa anchor"}


def builder(kind: str, anchor: str | None) -> Builds | None:
    return BUILDERS.get((kind, anchor)) or BUILDERS.get((kind, None))


def build(region: Region, graph: Graph, target: dict, facts: tuple | None = None,
          source: bool = False) -> KernelSpec | str:
    """The kernel spec for ``region`` on ``target``, or the reason it runs through torch. ``source``: the spec is
    for the target's source (``SOURCE_TARGETS`` take templates then), not for a kernel that runs here."""
    if region.kind in NO_KERNEL:
        why = NO_KERNEL[region.kind]
        return f"opaque region ({' '.join(dict.fromkeys(region.ops))}): {why}" if region.kind == "opaque" else why
    if target.get("kind") not in KERNEL_TARGETS and not (source and target.get("kind") in SOURCE_TARGETS):
        return f"target {target.get('kind')!r} compiles only with its vendor toolchain"
    if target.get("kind") == "ascend" and region.kind not in ASCEND_KINDS:
        return f"no Ascend template for {region.kind} regions; it runs through torch"
    nodes, types = facts if facts is not None else graph_facts(graph)
    anchor = nodes[region.anchor] if region.anchor else None
    try:
        check_static(region, types, target)
        check_divisors(region, nodes, types, graph.constants)
        empty = [v for v in region.outputs if types[v].numel == 0]
        if empty:  # (TileLang allocates an empty output with strides its own wrapper then refuses)
            return f"empty output {', '.join(empty)}: nothing to compute, torch makes it"
        fn = builder(region.kind, anchor.op if anchor is not None else None)
        if fn is None:
            return NO_TEMPLATE.get(region.kind, "no template for {kind} regions").format(
                kind=region.kind, op=anchor.op if anchor is not None else None)
        spec = fn(Builder(region, graph, nodes, types, target), anchor, target)
        return ascend_spec(spec) if target.get("kind") == "ascend" else spec  # its own templates (templates/ascend)
    except NotLowerable as e:
        return str(e)
    except (KeyError, IndexError, TypeError, ValueError) as e:  # a shape the builders did not foresee
        return f"lowering refused: {type(e).__name__}: {e}"


def graph_facts(graph: Graph) -> tuple[dict[str, Node], dict]:
    """What ``build`` reads of ``graph`` (its nodes by name, its values' types): made once per plan, not per region."""
    return {n.name: n for n in graph.nodes}, {k: v.type for k, v in graph.values().items()}


def region_specs(plan: FusionPlan, target: dict) -> dict[str, KernelSpec]:
    """The kernel spec of each TileLang region of ``plan`` that lowers on ``target``, by region name."""
    facts = graph_facts(plan.graph)
    return {r.name: s for r in plan.regions if r.backend == "tilelang"
            for s in [build(r, plan.graph, target, facts)] if isinstance(s, KernelSpec)}

"""Region -> template: which TileLang factory takes a fused region, with what arguments, for a target.

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
or the reason the region runs through torch; ``lower_plan`` compiles every distinct spec once
(repeated layers share kernels).
"""

from __future__ import annotations

import collections
import logging
import math
import time

import torch

from tilefuse import ops
from tilefuse.ir import Graph, Node
from tilefuse.lowering.builders import (  # noqa: F401  (KernelSpec and friends are public here)
    PASS_VIEWS,
    POOL_OPS,
    TEMPLATE_DTYPES,
    KernelSpec,
    _attention,
    _Builder,
    _elementwise,
    _gemm,
    _global_pool,
    _numel,
    _reduction,
    _require,
    _static,
    broadcast,
)
from tilefuse.lowering.conv_builder import build_conv, build_pool
from tilefuse.lowering.index import NotLowerable
from tilefuse.planner.plan import FusionPlan, Region

_log = logging.getLogger("tilefuse")


def build(region: Region, graph: Graph, target: dict, facts: tuple | None = None) -> KernelSpec | str:
    """The kernel spec for ``region`` on ``target``, or the reason it runs through torch."""
    if region.kind == "view":
        return "view regions run through torch (metadata only, no kernel)"
    if region.kind == "opaque":
        ops_ = " ".join(dict.fromkeys(region.ops))
        return f"opaque region ({ops_}): no template takes opaque ops; it runs through torch"
    if target.get("kind") not in ("c", "cuda"):
        return f"target {target.get('kind')!r} compiles only with its vendor toolchain"
    nodes, types = facts if facts is not None else graph_facts(graph)
    try:
        _static(region, types, target)
        empty = [v for v in region.outputs if types[v].numel == 0]
        if empty:  # (TileLang allocates an empty output with strides its own wrapper then refuses)
            return f"empty output {', '.join(empty)}: nothing to compute, torch makes it"
        b = _Builder(region, graph, nodes, types)
        anchor = nodes[region.anchor] if region.anchor else None
        if region.kind == "elementwise":
            return _elementwise(b, target)
        if region.kind == "gemm" and anchor.op == "conv":
            return build_conv(b, anchor, target)
        if region.kind == "gemm":
            _require(anchor.op in ("linear", "matmul"), f"no GEMM template for {anchor.op}")
            return _gemm(b, anchor, target)
        if region.kind == "gemm_sp":  # 2:4 sparse weight (lowering/sparse_builder.py)
            from tilefuse.lowering.sparse_builder import build_gemm_sp

            return build_gemm_sp(b, anchor, target)
        if region.kind == "reduction" and anchor.op in POOL_OPS and not _global_pool(anchor):
            return build_pool(b, anchor, target)
        if region.kind == "reduction":
            return _reduction(b, anchor, target)
        if region.kind == "attention":
            _require(anchor is not None and anchor.op == "sdpa", "an attention region without an sdpa anchor")
            return _attention(b, anchor, target)
        return f"no template for {region.kind} regions"
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


def can_lower(region: Region, graph: Graph, target: dict) -> bool:
    return isinstance(build(region, graph, target), KernelSpec)


class RegionKernel:
    """A compiled region: views torch runs first, the kernel, the output reshapes."""

    def __init__(self, spec: KernelSpec, kernel, region: Region, nodes: dict[str, Node]):
        self.spec, self.kernel, self.region = spec, kernel, region
        self.pre = [(nodes[p], ops.get(nodes[p].op), nodes[p].attr) for p in spec.pre]
        self.post = [(nodes[p], ops.get(nodes[p].op), nodes[p].attr) for p in spec.post]
        # Bool tensors cross the kernel boundary as int8 (see templates/elementwise.py; the row reduction's Out, Pre).
        kw = spec.factory_kwargs()
        dts = kw.get("out_dtypes") or ((kw.get("out_dtype"), kw.get("pre_dtype")) if spec.template == "row_reduction"
                                       else ())
        self.bool_outputs = {k for k, dt in enumerate(dts) if dt == "bool"}

    def __call__(self, args):
        env = dict(zip(self.region.inputs, args))
        _run_nodes(self.pre, env)
        tensors = [_as_storage(_dense(env[v].reshape(s) if s is not None else env[v])) for v, s in self.spec.inputs]
        try:
            outs = self.kernel(*tensors)
        except (RuntimeError, ValueError) as e:
            raise _boundary_error(self.region.name, self.spec.inputs, tensors, e) or e
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        outs = [o.view(torch.bool) if k in self.bool_outputs else o for k, o in enumerate(outs)]
        if not self.post:
            return [outs[k].reshape(shape) for k, _, shape in self.spec.outputs]
        env.update({v: outs[k].reshape(shape) for k, v, shape in self.spec.outputs})
        _run_nodes(self.post, env)
        return [env[o] for o in self.region.outputs]


def _run_nodes(nodes, env: dict) -> None:
    """Run layout nodes through torch, every output (a split has several)."""
    for node, spec, attrs in nodes:
        for v, t in zip(node.outputs, spec.run([env[i] for i in node.inputs], attrs)):
            env[v.name] = t


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the row-major strides a kernel parameter is compiled for. ``contiguous()`` alone keeps any
    stride on a dim of size 1 and every stride of an empty tensor (numpy's zero-row arrays: strides (0, 0)),
    which TileLang's wrapper refuses ("Static stride mismatch"): those get their canonical strides over the
    same memory (no copy), an empty one a new empty tensor."""
    t = t.contiguous()
    canon = _STRIDES.get(t.shape)
    if canon is None:  # the products of the later dims, as TileLang compiles them: (3, 0) has (0, 1), not torch's (1, 1)
        canon = _STRIDES[t.shape] = tuple(math.prod(t.shape[i + 1:]) for i in range(t.dim()))
    if t.stride() == canon:
        return t
    if t.numel() == 0:
        return torch.empty_strided(t.shape, canon, dtype=t.dtype, device=t.device)
    return t.as_strided(t.shape, canon)


_STRIDES: dict[torch.Size, tuple[int, ...]] = {}  # shape -> row-major strides (kernels see a few shapes each)


def _boundary_error(region: str, inputs, tensors: list[torch.Tensor], e: Exception) -> Exception | None:
    """A clear error for inputs a kernel cannot take because they are on different devices (a host tensor
    reaching a GPU kernel), naming the region and the inputs; None when that is not why it failed."""
    devices = {t.device for t in tensors}
    if len(devices) < 2:
        return None
    where = ", ".join(f"{v} on {t.device}" for (v, _), t in zip(inputs, tensors))
    return RuntimeError(f"region {region}: its kernel's inputs are on different devices ({where}); a plan runs on "
                        f"one device (PlanRunner.place stages the others onto it): {e}")


def _as_storage(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int8) if t.dtype == torch.bool else t


def _template(name: str):
    """(module, factory) of a template by its KernelSpec name."""
    from tilefuse.lowering.templates import attention, conv, elementwise, gemm, gemm_sp, pool, reduction

    return {"gemm": (gemm, gemm.gemm), "row_reduction": (reduction, reduction.row_reduction),
            "elementwise": (elementwise, elementwise.elementwise), "conv2d": (conv, conv.conv2d),
            "pool2d": (pool, pool.pool2d), "flash_attention": (attention, attention.flash_attention),
            "gemm_sp": (gemm_sp, gemm_sp.gemm_sp)}[name]


def config_space(spec: KernelSpec, target: dict) -> list[dict]:
    """The tile configs ``spec``'s template offers for ``target``: its ``config_space`` where it has one wider
    than its ``get_configs`` seeds (the seeds come first either way; the default pick is made from them)."""
    module, _ = _template(spec.template)
    kw = spec.factory_kwargs()
    if spec.template == "gemm_sp":  # block_K must divide the padded K; the output tile's bytes count too
        return module.get_configs(target, kw["K"], kw.get("out_dtype"))
    space = getattr(module, "config_space", module.get_configs)
    # gemm/conv seeds depend on the operand dtype, flash attention's on the head dim
    arg = {"gemm": kw.get("B_dtype"), "conv2d": kw.get("in_dtype"), "flash_attention": kw.get("D")}.get(spec.template)
    return space(target, arg) if arg else space(target)


def kernel_key(spec: KernelSpec, target: dict, config: dict | None = None, tuned: bool = True) -> tuple[dict, str]:
    """The tile config ``spec`` builds with (``config``, else a tuned one while tuning applies, else the
    template default) and the key of the function so built (``func_cache.key``)."""
    from tilefuse.lowering import func_cache
    from tilefuse.lowering.tune import best_config

    config = best_config(spec, target) if config is None and tuned else config
    if config is None:
        configs = config_space(spec, target)
        if spec.template == "gemm":
            config = _pick_gemm_config(configs, spec.factory_kwargs(), target)
        elif spec.template == "gemm_sp" and configs and target.get("kind") == "cuda":
            config = min(configs, key=lambda c: gemm_wave_cost(c, spec.factory_kwargs()))
        else:
            config = configs[0] if configs else {}
    return config, func_cache.key(spec.template, spec.params, spec.out_idx, config, target)


def make_prim_func(spec: KernelSpec, target: dict, config: dict | None = None):
    """The template's ``T.prim_func`` for ``spec`` (with tile ``config`` or the template default)."""
    from tilefuse.lowering import func_cache

    _, factory = _template(spec.template)
    config, key = kernel_key(spec, target, config)
    return func_cache.cached(key, lambda: factory(**spec.factory_kwargs(), **config, target=target))


# Kernels compiled in this process, by ``kernel_key``: a recompile (dynamo's, after a guard fails or a reset)
# takes them as they are, without reading the function back or asking TileLang's cache.
_COMPILED: collections.OrderedDict[str, object] = collections.OrderedDict()
COMPILED_KEEP = 1024


def _pick_gemm_config(configs: list[dict], kw: dict, target: dict) -> dict:
    """Until tuning measures: the template's untuned pick (``gemm_configs.default_config``: the measured leaders,
    fewest padded waves over the SMs)."""
    from tilefuse.lowering.templates.gemm_configs import default_config

    batch = _numel(broadcast(tuple(kw.get("batch_A", ())), tuple(kw.get("batch_B", ()))))
    return default_config(configs, kw["M"], kw["N"], batch, target)


def gemm_wave_cost(config: dict, kw: dict) -> int:
    """Padded output elements one SM computes over the waves of ``config``'s tiles on the H200's 132 SMs
    (less is better: it counts tile padding and a last, partly idle wave)."""
    from tilefuse.lowering.templates.gemm_configs import wave_cost

    batch = _numel(broadcast(tuple(kw.get("batch_A", ())), tuple(kw.get("batch_B", ()))))
    return wave_cost(config, kw["M"], kw["N"], batch)


def lower_plan(plan: FusionPlan, target: dict, log=None, progress: bool = False) -> dict[str, RegionKernel]:
    """Compile every lowerable region of ``plan`` (each distinct spec once, in parallel); with ``progress``,
    report kernels compiled and the time left on stderr (``tilefuse.progress``)."""
    from tilefuse.lowering.compile import compile_many
    from tilefuse.progress import Progress

    graph = plan.graph
    specs = region_specs(plan, target)
    distinct = list(dict.fromkeys((s.template, s.params, s.out_idx) for s in specs.values()))
    t0 = time.perf_counter()
    by_key = {(s.template, s.params, s.out_idx): s for s in specs.values()}
    kernels: dict = {}
    funcs, built = [], []
    for k in distinct:
        try:
            config, key = kernel_key(by_key[k], target)
            if key in _COMPILED:
                _COMPILED.move_to_end(key)
                kernels[k] = _COMPILED[key]
                continue
            funcs.append((make_prim_func(by_key[k], target, config), list(k[2])))
            built.append((k, key))
        except Exception as e:  # noqa: BLE001 -- a template refusing the spec is reported like a compile failure
            kernels[k] = e
    with Progress(f"compiling {graph.name}", len(funcs), "kernels", enabled=progress) as bar:
        compiled = compile_many(funcs, target, return_exceptions=True, on_done=bar.tick) if funcs else []
    for (k, key), kernel in zip(built, compiled):
        kernels[k] = kernel
        if not isinstance(kernel, BaseException):
            _COMPILED[key] = kernel
            while len(_COMPILED) > COMPILED_KEEP:
                _COMPILED.popitem(last=False)
    if log is not None:
        log(f"compiled {len(distinct)} distinct kernels for {len(specs)} regions in {time.perf_counter() - t0:.1f} s")
    nodes, out = {n.name: n for n in graph.nodes}, {}
    for r in plan.regions:
        s = specs.get(r.name)
        if s is None:
            continue
        k = kernels[(s.template, s.params, s.out_idx)]
        if isinstance(k, BaseException):
            # Reported, never hidden: the region runs through torch and the plan says so.
            _log.warning("%s: region %s did not compile for %s (%s); it runs through torch", plan.graph.name,
                         r.name, target, str(k).strip().splitlines()[0][:300] if str(k).strip() else type(k).__name__)
            continue
        out[r.name] = RegionKernel(s, k, r, nodes)
    return out

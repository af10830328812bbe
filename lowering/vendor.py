"""Kernels for a vendor's toolchain: each region's template as HIP, Metal or AscendC source, and for HIP a code object.

Note: ``hip``, ``metal`` and ``ascend`` kernels cannot run through tilefuse here (TileLang's builds for them need
hipcc, macOS or bisheng), so a model planned to *run* on them sends every region through torch
(``dispatch.build``). ``tilefuse compile --target hip|metal|ascend`` plans for *source* instead
(``build(..., source=True)``): each region a template takes becomes a kernel, its source is produced with the
template's default tile config, and for hip clang-19 makes the ``.hsaco`` where the toolchain is installed
(``vendor_hip``). A region whose template cannot produce source for the vendor (TileLang refuses, or the template
has no form for it) is marked torch fallback with the reason, in the plan's refusals as any other. Identical kernels
(same template, parameters and config) are produced once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

from tilefuse.ir import Graph
from tilefuse.lowering import vendor_hip, vendor_metal
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import lower_source
from tilefuse.lowering.dispatch import SOURCE_TARGETS, build, graph_facts
from tilefuse.lowering.lower import default_config, func_key, make_prim_func
from tilefuse.planner import FusionPlan, Region
from tilefuse.planner import plan as plan_regions

# target kind -> extension of its source file
SOURCE_EXT = {"hip": "hip", "metal": "metal", "ascend": "cpp"}


def is_source_target(target: dict) -> bool:
    return target.get("kind") in SOURCE_TARGETS


def check_target(target: dict) -> dict:
    """``target`` with its arch checked (hip: a known gfx arch, else ValueError listing them)."""
    if target.get("kind") == "hip":
        return {"kind": "hip", "mcpu": vendor_hip.arch_of(target)}
    return dict(target)


def source_plan(graph: Graph, target: dict, fuse: bool = True, sparsity: str | None = None,
                layout: bool | None = None) -> tuple[FusionPlan, dict[str, KernelSpec]]:
    """``graph`` planned for ``target``'s source: the plan and the spec of each region a template takes."""
    specs: dict[str, KernelSpec] = {}
    facts: dict[int, tuple] = {}

    def why_not(region: Region, g: Graph) -> str | None:
        f = facts.get(id(g))
        if f is None:
            f = facts[id(g)] = graph_facts(g)
        s = build(region, g, target, f, source=True)
        if isinstance(s, str):
            return s
        specs[region.name] = s
        return None

    p = plan_regions(graph, target, fuse=fuse, sparsity=sparsity, layout=layout, why_not=why_not)
    return p, {r.name: specs[r.name] for r in p.regions if r.backend == "tilelang" and r.name in specs}


@dataclass(frozen=True)
class VendorKernel:
    """One region's kernel for a vendor: its source, and the build product where the toolchain made one."""

    region: str
    template: str
    key: str  # func_key: identical kernels share it
    config: dict
    source: str
    ext: str  # source file extension
    product: bytes | None = None  # hip: the .hsaco
    product_ext: str | None = None
    resources: tuple = ()  # vendor_hip.Resources of each kernel in the product

    def summary(self) -> str:
        """Registers and occupancy where the toolchain reported them, else what was produced."""
        if self.resources:
            return "; ".join(f"{r.vgprs} VGPR, {r.agprs} AGPR, {r.sgprs} SGPR, {r.spills} spills, "
                             f"{r.lds // 1024} KB LDS, occupancy {r.occupancy}" for r in self.resources)
        return "source"


@dataclass(frozen=True)
class VendorBuild:
    """A plan for a vendor target (regions whose source failed marked torch with the reason) and its kernels."""

    target: dict
    plan: FusionPlan
    kernels: tuple[VendorKernel, ...]
    toolchain: str  # what made the build products, or why there are none

    def table(self) -> str:
        """One line per kernel: region, template, registers/occupancy where known."""
        w = max([len(k.region) for k in self.kernels] + [6])
        lines = [f"{'kernel':<{w}}  {'template':<15}  resources", f"{'-' * w}  {'-' * 15}  {'-' * 9}"]
        lines += [f"{k.region:<{w}}  {k.template:<15}  {k.summary()}" for k in self.kernels]
        return "\n".join(lines)


def _produce(spec: KernelSpec, func, target: dict, toolchain) -> tuple[str, object | None]:
    """The kernel's source from its PrimFunc ``func`` (or the exception building it: raised here); hip: its code
    object (raises on a compile error or a spill); metal: the source syntax-checked (raises where it does not
    parse). Without their toolchain, the source alone."""
    if isinstance(func, BaseException):
        raise func
    src, shared = lower_source(func, target)
    if target["kind"] == "hip" and toolchain is not None:
        return src, vendor_hip.compile_hip(src, vendor_hip.arch_of(target), toolchain, dynamic_lds=shared)
    if target["kind"] == "metal" and toolchain is not None:
        vendor_metal.check_or_raise(src, spec.template, toolchain)
    return src, None


def _why(e: BaseException) -> str:
    """The gist of a failure: TVM's check messages without their target dump, clang's first errors."""
    text = str(e).strip()
    if "is false:" in text:  # TVM: "Check failed: (...) is false: <what>"
        text = text.split("is false:", 1)[1].split(' for {"kind"', 1)[0]
    return f"{type(e).__name__}: {' '.join(text.split())[:400]}"


def emit(plan: FusionPlan, specs: dict[str, KernelSpec], target: dict, workers: int | None = None,
         on_done: Callable[[], None] | None = None) -> VendorBuild:
    """Each spec's source (and hip code object) for ``target``, produced in parallel threads, once per distinct
    kernel; a region whose source or compile fails runs through torch with the reason."""
    toolchain = {"hip": vendor_hip.find_toolchain, "metal": vendor_metal.find_clang}.get(target["kind"], lambda: None)()
    configs = {name: default_config(spec, target) for name, spec in specs.items()}
    keys = {name: func_key(spec, target, configs[name]) for name, spec in specs.items()}
    first = {}
    for name in specs:
        first.setdefault(keys[name], name)
    workers = workers or min(len(first), os.cpu_count() or 1) or 1
    funcs = {}
    for key, n in first.items():  # built here, one by one: TileLang's PrimFunc builder is not safe across threads
        try:
            funcs[key] = make_prim_func(specs[n], target, configs[n])
        except Exception as e:  # noqa: BLE001 -- reported with the region, as a failed compile is
            funcs[key] = e
    with concurrent.futures.ThreadPoolExecutor(workers, "tilefuse-vendor") as pool:
        futures = {key: pool.submit(_produce, specs[n], funcs[key], target, toolchain) for key, n in first.items()}
        for _ in concurrent.futures.as_completed(futures.values()):
            if on_done is not None:
                on_done()
    kernels, failed = [], {}
    ext = SOURCE_EXT[target["kind"]]
    for name, spec in specs.items():
        f = futures[keys[name]]
        if f.exception() is not None:
            e = f.exception()
            failed[name] = f"no {target['kind']} kernel: {_why(e)}"
            continue
        src, obj = f.result()
        kernels.append(VendorKernel(name, spec.template, keys[name], configs[name], src, ext,
                                    obj.hsaco if obj is not None else None, "hsaco" if obj is not None else None,
                                    obj.resources if obj is not None else ()))
    if failed:
        plan = dataclasses.replace(
            plan, regions=tuple(dataclasses.replace(r, backend="torch") if r.name in failed else r
                                for r in plan.regions),
            refusals=plan.refusals + tuple(f"{n} runs through torch: {why}" for n, why in failed.items()))
    return VendorBuild(dict(target), plan, tuple(kernels), _made_by(target["kind"], toolchain))


def _made_by(kind: str, toolchain) -> str:
    if kind == "hip":
        return f"code objects by clang-19 ({toolchain.rocm})" if toolchain else vendor_hip.missing_message()
    if kind == "metal":
        return (f"source, syntax-checked by {toolchain} against stand-in headers (Apple's compiler builds it)"
                if toolchain else f"source, not checked: {vendor_metal.INSTALL_HINT}")
    return f"source only ({kind} kernels build with the vendor's compiler)"

"""The compile, as named steps from data to data. Every entry point runs them: ``torch.compile`` (``tilefuse.backend``),
``compile_onnx`` and ``compile_graph`` (``tilefuse.api``), artifact load (``restore``) and ``tilefuse explain``.

    graph (frontends) -> plan -> configs -> lower -> runner -> decide (first call, on its inputs)

* ``plan``: the planner groups the graph into regions (``planner.plan``); each region's kernel spec is built once
  (``lowering.dispatch.build``), which says whether a template takes it: ``Planned(plan, specs)``.
* ``configs``: the tile config of each spec: tuned ones (``Options.tune``: measured, or from the tuning database),
  else ``lowering.lower.default_config``.
* ``lower``: each distinct (spec, config) compiled once; a region whose kernel did not compile runs through torch,
  and the plan says so.
* ``runner``: a ``PlanRunner`` over the plan and its kernels, with CUDA graphs where the options say.
* ``decide``: on the first call (``Options.measure``), each region's kernel, its own ops through torch and (a GEMM
  with an epilogue) its split are timed on that call's inputs, or read from the database: a list of ``Decision``
  that the runner then applies (``PlanRunner.apply``).

An artifact's load runs ``restore``: the same ``lower`` and ``runner`` steps with the plan, decisions and configs
the artifact recorded.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

import torch

from tilefuse.config import CPU_KINDS, Options
from tilefuse.ir import Graph
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import failure_reason
from tilefuse.lowering.dispatch import build, graph_facts
from tilefuse.lowering.lower import Lowered, library_first, lower
from tilefuse.lowering.split import node_maps, split
from tilefuse.lowering.timing import device_time, rotations
from tilefuse.lowering.tune import BUDGETS, stored_choices, tune_specs, tuned_configs
from tilefuse.lowering.tuning_db import TuningDB
from tilefuse.ops.reference import NodesFn
from tilefuse.ops.registry import with_trait
from tilefuse.planner import FusionPlan, Region
from tilefuse.planner import plan as plan_regions
from tilefuse.planner.sparsity import example_inputs, output_change
from tilefuse.progress import wanted
from tilefuse.runtime.distributed import from_rank0
from tilefuse.runtime.kernels import RegionKernel, SplitRegion
from tilefuse.runtime.plan_runner import PlanRunner

_log = logging.getLogger("tilefuse")


# ---- plan -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Planned:
    """The plan and the kernel spec of each region a template takes (by region name), built once."""

    plan: FusionPlan
    specs: dict[str, KernelSpec]


def _lowerable(target: dict, specs: dict[str, KernelSpec]) -> Callable[[Region, Graph], str | None]:
    """The planner's ``why_not`` for ``target``: None where a template takes the region (its spec kept in ``specs``),
    else the reason it runs through torch."""
    facts: dict[int, tuple] = {}

    def why_not(region: Region, g: Graph) -> str | None:
        f = facts.get(id(g))
        if f is None:
            f = facts[id(g)] = graph_facts(g)
        s = build(region, g, target, f)
        if isinstance(s, str):
            return s
        specs[region.name] = s
        return None

    return why_not


def plan_step(graph: Graph, options: Options) -> Planned:
    """Plan ``graph`` for ``options.target``; each region's spec is built once, and says how the region runs."""
    specs: dict[str, KernelSpec] = {}
    p = plan_regions(graph, options.target, fuse=options.fuse, sparsity=options.sparsity,
                     layout=options.channels_last, why_not=_lowerable(options.target, specs),
                     group=options.group_linears, fold=options.fold_norms, rotary=options.fold_rotary)
    return Planned(p, {r.name: specs[r.name] for r in p.regions if r.backend == "tilelang" and r.name in specs})


def plan(graph: Graph, target: dict | None = None, **kw) -> FusionPlan:
    """The plan of ``graph`` for ``target`` with each region's backend decided (what ``explain`` shows):
    ``planner.plan`` with the lowering's answer to which regions a template takes. ``kw``: the planner's
    ``cost``, ``fuse``, ``sparsity``, ``layout``, ``group``, ``fold``, ``rotary``."""
    if target is None:
        return plan_regions(graph, None, **kw)
    return plan_regions(graph, target, why_not=_lowerable(target, {}), **kw)


# ---- configs ----------------------------------------------------------------------------------------------------

def configs_step(planned: Planned, options: Options, db: TuningDB | None = None) -> tuple[dict[str, dict], TuningDB | None]:
    """The tile config of each region's spec that tuning chose (``Options.tune``), and the tuning database used
    (None without tuning); regions left out build with ``default_config``."""
    if options.tune == "none":
        return {}, db
    if options.tune not in BUDGETS:
        raise ValueError(f"unknown tune mode {options.tune!r}; use one of {', '.join(BUDGETS)} (TILEFUSE_TUNE)")
    name = planned.plan.graph.name
    log = (lambda m: _log.info("%s: %s", name, m)) if options.verbose else None
    db = tune_specs(planned.specs, options.target, options.tune, db, seconds=options.tune_seconds, name=name,
                    log=log, progress=wanted(options.quiet))
    return from_rank0(tuned_configs(planned.specs, options.target, db), planned.plan), db  # every rank: rank 0's


def stored(planned: Planned, target: dict, db: TuningDB | None = None) -> dict[str, dict]:
    """What the tuning database holds for the plan's regions (``explain``): tuned configs and measured choices."""
    return stored_choices(planned.specs, target, db)


# ---- lower --------------------------------------------------------------------------------------------------------

def lower_step(planned: Planned, configs: Mapping[str, dict], target: dict, progress: bool = False,
               prefetch: Mapping[str, KernelSpec] | None = None, **kw) -> tuple[FusionPlan, dict[str, RegionKernel]]:
    """Compile the plan's kernels: (the plan with each region whose kernel did not compile marked torch, the
    kernels by region). A failure is logged with its reason, never hidden. ``prefetch``: more specs (by region)
    compiled in the same batch with their default configs, for a later step to find in the process cache: the
    measured choice's split tails (``split_tails``), which then need no batch of their own after the plan's
    (ResNet-50's 12 tails: 2.8 s of its 23.6 s cold compile on the H100's machine, 2026-12-06). ``kw``: ``lower``'s
    options."""
    p = planned.plan
    tails = {f"{name} (split tail)": spec for name, spec in (prefetch or {}).items()}
    lowered = lower({**planned.specs, **tails}, configs, target, p.graph.name, progress=progress, **kw)
    nodes = {n.name: n for n in p.graph.nodes}
    kernels = {}
    for r in p.regions:
        got = lowered.get(r.name)
        if isinstance(got, Lowered):
            kernels[r.name] = RegionKernel(got, r, nodes)
        elif got is not None:
            _log.warning("%s: region %s did not compile for %s (%s); it runs through torch", p.graph.name, r.name,
                         target, failure_reason(got)[:300])
    p = dataclasses.replace(p, regions=tuple(
        r if r.backend != "tilelang" or r.name in kernels else dataclasses.replace(r, backend="torch")
        for r in p.regions))
    return p, kernels


def split_tails(p: FusionPlan, regions: Sequence[Region], target: dict) -> dict[str, KernelSpec]:
    """The spec of each of ``regions``' split tail (``lowering.split``: the epilogue after a GEMM through torch), by
    region, where the region splits and a template takes its tail."""
    maps = node_maps(p)
    return _tail_specs(p, {r.name: s for r in regions for s in [split(p, r, maps)] if s is not None}, target)


def _tail_specs(p: FusionPlan, halves: Mapping[str, tuple], target: dict) -> dict[str, KernelSpec]:
    """The spec of each split's tail (``halves``: region name -> (head, tail)) that a template takes."""
    facts = graph_facts(p.graph)
    return {name: spec for name, (_, tail) in halves.items() for spec in [build(tail, p.graph, target, facts)]
            if isinstance(spec, KernelSpec)}


def split_candidates(regions: Sequence[Region], specs: Mapping[str, KernelSpec], db: TuningDB,
                     target: dict) -> list[Region]:
    """The regions with a kernel (``specs``: by region) whose split the measured choice times: all but those whose
    stored choice rules the split out."""
    return [r for r in regions if r.name in specs
            and (db.get(specs[r.name], target, "choice") or {}).get("split", True) is not False]


def library_regions(specs: Mapping[str, KernelSpec], db: TuningDB, target: dict) -> dict[str, KernelSpec]:
    """The regions (by name, with their specs) whose fused kernel the measured choice would not run, so it is not
    built: those whose stored choice is torch or the split, and, with no stored choice, those whose template's
    profitability rule says the library leads (``lower.library_first``: ResNet-50's 3x3 convolutions on sm_90). A
    stored choice of the kernel builds it."""
    out = {}
    for name, spec in specs.items():
        choice = db.get(spec, target, "choice")
        if (choice is None and library_first(spec, target)) or \
                (choice is not None and (choice.get("torch") or choice.get("split"))):
            out[name] = spec
    return out


def splits_step(p: FusionPlan, regions: Sequence[Region], target: dict,
                configs: Mapping[str, dict] | None = None, **kw) -> dict[str, SplitRegion]:
    """The split of each of ``regions`` that has one and whose tail lowers (all tails compiled in one batch, or
    found in the process cache where ``lower_step`` prefetched them): the GEMM through torch, the epilogue as one
    elementwise kernel (``lowering.split``). ``configs``: the tails' configs by the split region's name (a
    restore's), else the default."""
    maps = node_maps(p)
    pairs = {r.name: (r, s) for r in regions for s in [split(p, r, maps)] if s is not None}
    specs = _tail_specs(p, {name: halves for name, (_, halves) in pairs.items()}, target)
    lowered = lower(specs, configs or {}, target, p.graph.name, **kw)
    out = {}
    for name, got in lowered.items():
        if isinstance(got, Lowered):
            region, (head, tail) = pairs[name]
            out[name] = SplitRegion(region, head, tail, NodesFn(p.graph, head.nodes, head.inputs, head.outputs),
                                    RegionKernel(got, tail, maps[0]))
    return out


# ---- runner and decide ------------------------------------------------------------------------------------------

def runner_step(p: FusionPlan, kernels: Mapping[str, Callable], options: Options, static_inputs: Collection[int] = (),
                check: bool = True, updates: Collection[tuple[int, int]] = ()) -> PlanRunner:
    runner = PlanRunner(p, kernels, check=check, device_type="cuda" if options.target.get("kind") == "cuda" else "cpu")
    runner.static_inputs = tuple(static_inputs)
    runner.updates = tuple(updates)
    if options.cuda_graphs and options.target.get("kind") == "cuda" and p.kernels:
        runner.enable_cuda_graphs(options.eager_tail)  # (a plan of views alone launches nothing: no graph)
    return runner


# A kernel is kept unless another way is this much faster (timing noise must not flip choices).
KEEP_KERNEL_MARGIN = 0.97


@dataclasses.dataclass(frozen=True)
class Decision:
    """How one region with a kernel runs: ``"kernel"``, ``"torch"`` (its ops through torch) or ``"split"`` (its GEMM
    through torch, its epilogue as a kernel), and the times (ms, cold caches) it was chosen on."""

    region: str
    runs: str
    kernel_ms: float | None = None
    torch_ms: float | None = None
    split_ms: float | None = None
    sparse: bool = False  # a 2:4 region: its kernel is gemm_sp, torch and the split run the dense 2:4 weight

    def line(self) -> str:
        built = self.kernel_ms is not None  # (a region the library leads: no kernel built, ``library_regions``)
        kernel = f"kernel {self.kernel_ms:.3f} ms" if built else "no kernel built"
        if self.sparse:
            dense = "dense GEMM on the 2:4 weight" + (" + TileLang epilogue" if self.runs == "split" else "")
            if self.runs == "kernel":
                others = " / ".join(f"{t:.3f}" for t in (self.torch_ms, self.split_ms) if t is not None)
                return f"{self.region}: gemm_sp {self.kernel_ms:.3f} ms, dense GEMM on the 2:4 weight {others} ms"
            return f"{self.region}: {dense} {self.split_ms if self.runs == 'split' else self.torch_ms:.3f} ms < " \
                   f"gemm_sp {f'{self.kernel_ms:.3f} ms' if built else 'not built'}"
        if self.runs == "split":
            return (f"{self.region}: split {self.split_ms:.3f} ms (torch GEMM + TileLang epilogue) < "
                    f"torch {self.torch_ms:.3f} ms, {kernel}")
        split = f", split {self.split_ms:.3f} ms" if self.split_ms is not None else ""
        return f"{self.region}: torch {self.torch_ms:.3f} ms < {kernel}{split}"

    def note(self) -> str:
        """The plan's note: the line and what it means."""
        if self.sparse:
            return self.line() + (" (measured: runs the 2:4 sparse kernel)" if self.runs == "kernel" else
                                  " (measured: runs dense on the 2:4 weight)")
        return self.line() + (" (measured: its GEMM runs through torch, its epilogue as a TileLang kernel)"
                              if self.runs == "split" else " (measured: the region runs through torch)")


ALIASING = with_trait("may_alias")  # ops whose torch way may make a view of their input, moving nothing


class Dense:
    """A region of views' torch way as a kernel reading its outputs will get them: made dense. Through torch a permute
    or a strided slice is a view, free to make, and the kernel after it copies it (``runtime.kernels.dense``); timed
    as a view, ResNet-50's input permute ran so (``torch 0.000 ms < kernel 0.014 ms``) and cost a 0.027 ms copy in the
    stem, its shortcuts' strided slices 0.019-0.036 ms copies (H100, session 52). Only regions whose every op may
    alias its input (``ALIASING``): a compute region's view of its result may be one the kernel after it reads in
    place (ViT's 12 linears into heads, at 0.082 ms through torch against 0.085 for their kernels, went to the
    kernels when charged a copy, and the model ran 2% slower on the H100)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, args):
        return [o.contiguous() for o in self.fn(args)]


def decide(runner: PlanRunner, args: Sequence[torch.Tensor], db: TuningDB, target: dict,
           splits: Mapping[str, SplitRegion], library: Mapping[str, KernelSpec] | None = None) -> list[Decision]:
    """Run ``runner``'s plan once on ``args``, region by region; for each region with a kernel, time the kernel, the
    region's own ops through torch and its split where ``splits`` has one, on the same inputs (answers come from
    ``db`` when it has them; new ones are stored there), and choose the fastest: the fused kernel stays unless
    another way is ``KEEP_KERNEL_MARGIN`` faster. Each region then runs the way chosen, so the regions after it are
    timed on inputs as they will get them (strides and layout included: measured on a kernel's output instead, one
    of ResNet-50's convolutions took its split at 0.21 ms and ran it at 0.63, 2026-12-01 on the H200). Nothing is
    changed: the runner applies the decisions. ``library``: regions without a kernel (``library_regions``), by name
    with their specs: torch or the split, whichever is faster."""
    p, kind, out, library = runner.plan, target.get("kind", "c"), [], library or {}
    fed = {v for r in p.regions if r.name in runner.kernels for v in r.inputs}  # read by a kernel: dense

    def measure(k: int, region: Region, ins: list) -> Callable | None:
        kernel = runner.kernels.get(region.name)
        spec = getattr(kernel, "spec", None) or library.get(region.name)
        if spec is None:
            return None
        sp = splits.get(region.name)
        choice = db.get(spec, target, "choice")
        ref = NodesFn(p.graph, region.nodes, region.inputs, region.outputs)
        if fed & set(region.outputs) and all(op in ALIASING for op in region.ops):
            ref = Dense(ref)
        if choice is None or ("split_ms" not in choice and sp is not None):
            sets = rotations((ins,)) if kind == "cuda" else None  # (one set of cold copies for every way)
            choice = {"kernel_ms": device_time(kernel, (ins,), kind, sets) * 1e3 if kernel is not None else None,
                      "torch_ms": device_time(ref, (ins,), kind, sets) * 1e3,
                      "split_ms": device_time(sp, (ins,), kind, sets) * 1e3 if sp is not None else None}
            other = min(("torch", "split"), key=lambda w: choice[f"{w}_ms"] or float("inf"))
            beaten = kernel is None or choice[f"{other}_ms"] < KEEP_KERNEL_MARGIN * choice["kernel_ms"]
            choice.update({"torch": beaten and other == "torch", "split": beaten and other == "split"})
            db.put(spec, target, choice, "choice")
        runs = "split" if choice.get("split") and sp is not None else "torch" \
            if choice["torch"] or choice.get("split") or kernel is None else "kernel"  # (a split that does not lower)
        out.append(Decision(region.name, runs, choice.get("kernel_ms"), choice.get("torch_ms"), choice.get("split_ms"),
                            sparse=region.kind == "gemm_sp"))
        return {"split": sp, "torch": ref}.get(runs)  # the later regions' inputs come as the chosen way makes them

    runner.run(*args, before_region=measure)
    return out


def choose(runner: PlanRunner, args: Sequence[torch.Tensor], db: TuningDB, target: dict,
           library: Mapping[str, KernelSpec] | None = None) -> list[str]:
    """The measured choice on ``args``: ``decide``, then the runner applies the decisions. Returns one line per
    region not run as its fused kernel, e.g. ``"fused_sdpa_3: torch 0.096 ms < kernel 0.197 ms"``. ``library``: the
    regions built without a kernel (``library_regions``)."""
    p, library = runner.plan, library or {}
    # splits are compiled (one batch) only where no stored choice rules them out
    specs = {**{name: k.spec for name, k in runner.kernels.items() if hasattr(k, "spec")}, **library}
    candidates = split_candidates(p.regions, specs, db, target)
    t0 = time.perf_counter()
    splits = splits_step(p, candidates, target)
    t1 = time.perf_counter()
    with torch.no_grad():
        decided = from_rank0(decide(runner, args, db, target, splits, library), p)  # several ranks run rank 0's choice
    runner.phases.update(splits=t1 - t0, decide=time.perf_counter() - t1)
    changed = [d for d in decided if d.runs != "kernel"]
    missing = {d.region for d in changed if d.runs == "split" and d.region not in splits}
    if missing:  # (rank 0 chose a split that this rank's tuning database had ruled out)
        splits.update(splits_step(p, [r for r in p.regions if r.name in missing], target))
    notes = [d.note() for d in decided if d.runs != "kernel" or d.sparse]  # a 2:4 region's says which way either way
    runner.apply({d.region: d.runs for d in changed}, splits, notes)
    if changed:
        _log.info("%s: %d regions run through torch, measured faster than their kernels: %s", p.graph.name,
                  len(changed), "; ".join(d.line() for d in changed))
    return [d.line() for d in changed]


def measured_choice(runner: PlanRunner, db: TuningDB, target: dict, library: Mapping[str, KernelSpec] | None = None
                    ) -> Callable[[Sequence[torch.Tensor]], None]:
    """The runner's first-call step (``PlanRunner.first_call``): ``choose`` on that call's inputs."""

    def first_call(args: Sequence[torch.Tensor]) -> None:
        choose(runner, args, db, target, library)

    return first_call


# ---- the whole compile -------------------------------------------------------------------------------------------

def build_runner(graph: Graph, options: Options, example_inputs_: Sequence[torch.Tensor] | None = None,
                 static_inputs: Collection[int] = (), check: bool = True,
                 updates: Collection[tuple[int, int]] = ()) -> PlanRunner:
    """Run the steps on ``graph``: the runner of its plan. With ``options.sparsity`` the runner's
    ``sparsity_report`` says how much pruning changed the outputs on ``example_inputs_`` (random ones when not
    given). ``static_inputs``: positions of the graph's inputs that keep their address across calls (a module's
    parameters and buffers), read in place by CUDA graphs. ``check=False`` skips checking each call's inputs
    against the graph, for callers that already have (dynamo's guards). ``updates``: (output, input) positions where
    the caller copies that output into that input after each call (an input mutation; a CUDA graph writes it)."""
    t0 = time.perf_counter()
    planned = plan_step(graph, options)
    t_plan = time.perf_counter()
    p = planned.plan
    if p.sparsity is not None:
        p = dataclasses.replace(p, sparsity=_measure_sparsity(graph, p, options, example_inputs_))
        planned = Planned(p, planned.specs)
    kernels, db, library = {}, None, {}
    measure = options.measure and options.target.get("kind") in ("cuda", *CPU_KINDS)
    if options.lower:
        db = TuningDB() if measure else None
        # regions the measured choice runs through the library: no kernel built (nor tuned) for them; rank 0's (each
        # rank's tuning database may hold other choices, and the ranks' plans must agree)
        names = from_rank0(sorted(library_regions(planned.specs, db, options.target)) if measure else [], p)
        library = {name: planned.specs[name] for name in names}
        built = Planned(p, {name: s for name, s in planned.specs.items() if name not in library})
        configs, db = configs_step(built, options, db)
        tails = split_tails(p, split_candidates(p.regions, planned.specs, db, options.target), options.target) \
            if measure else {}
        p, kernels = lower_step(built, configs, options.target, progress=wanted(options.quiet), prefetch=tails)
    t_lower = time.perf_counter()
    runner = runner_step(p, kernels, options, static_inputs, check, updates)
    runner.phases.update(plan=t_plan - t0, lower=t_lower - t_plan)
    runner.sparsity_report = p.sparsity
    if from_rank0(bool(kernels or library) and measure, p):
        runner.first_call = measured_choice(runner, db, options.target, library)
    runner.compile_seconds = time.perf_counter() - t0
    runner.source_graph = graph
    if options.observer is not None:
        options.observer(runner)
    return runner


def restore(p: FusionPlan, configs: Mapping[str, dict], templates: Mapping[str, str], options: Options,
            **kw) -> tuple[PlanRunner, list[str]]:
    """An artifact's plan as a runner: its kernels lowered with the configs and templates it recorded (by region;
    a split region's are its epilogue's), the runs it decided (``Region.backend``: tilelang, split or torch) kept.
    Returns
    the runner and the regions whose kernel failed (they run through torch). ``kw``: ``lower``'s options (a saved
    PrimFunc per spec, no process cache). Raises ``RestoreMismatch`` where the plan lowers differently here."""
    kernels, failed = {}, []
    if options.lower:
        facts, tl = graph_facts(p.graph), [r for r in p.regions if r.backend == "tilelang"]
        specs = {}
        for r in tl:
            s = build(r, p.graph, options.target, facts)
            if not isinstance(s, KernelSpec):
                raise RestoreMismatch(f"region {r.name} does not lower here ({s})")
            specs[r.name] = s
        for name, s in specs.items():
            if templates.get(name) != s.template:
                raise RestoreMismatch(f"region {name} lowers differently here ({s.template}) than when it was "
                                      f"saved ({templates.get(name)})")
        p, kernels = lower_step(Planned(p, specs), configs, options.target, **kw)
        failed = [r.name for r in tl if r.name not in kernels]
        sp = [r for r in p.regions if r.backend == "split"]
        splits = splits_step(p, sp, options.target, configs, **kw)
        missing = [r.name for r in sp if split(p, r) is None]
        if missing:
            raise RestoreMismatch(f"region {missing[0]} was saved split in two and does not split here")
        kernels.update(splits)
        failed += [r.name for r in sp if r.name not in splits]
        p = dataclasses.replace(p, regions=tuple(dataclasses.replace(r, backend="torch") if r.name in failed else r
                                                 for r in p.regions))
    return runner_step(p, kernels, options), failed


class RestoreMismatch(Exception):
    """The artifact's plan does not lower here as it did when saved: recompile it from its graph."""


def _measure_sparsity(graph: Graph, p: FusionPlan, options: Options, inputs: Sequence[torch.Tensor] | None):
    """The plan's sparsity report with the outputs' change measured (when pruning changed any weight), and
    logged: pruning changes what the model computes, so the compile says by how much."""
    report = p.sparsity
    if report.pruned:
        how = "example inputs"
        if inputs is None:
            device = "cuda" if options.target.get("kind") == "cuda" and torch.cuda.is_available() else "cpu"
            inputs, how = example_inputs(graph.inputs, device), "random N(0, 1) inputs"
        if inputs is not None:
            try:
                report = dataclasses.replace(report, max_rel_change=output_change(graph, p.graph, inputs),
                                             measured_on=how)
            except Exception as e:  # noqa: BLE001 -- the report says it could not measure, the compile goes on
                report = dataclasses.replace(report, measured_on=f"not measured ({type(e).__name__}: {e})")
        _log.warning("%s: %s", graph.name, report.summary())
    elif report.sparse_kernel or report.mode:
        _log.info("%s: %s", graph.name, report.summary())
    return report

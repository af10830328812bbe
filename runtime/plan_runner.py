"""Run a FusionPlan region by region: a compiled kernel where lowering gave one, else the region's
nodes through their torch references (an explicit, reported fallback: ``backend == "torch"``).

Note: values are freed after the last region that reads them, so peak memory follows liveness at
region granularity (a fused region's interior values never exist in device memory at all once it
runs as one kernel).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from tilefuse import ops
from tilefuse.config import Options
from tilefuse.ir import Graph
from tilefuse.planner import FusionPlan
from tilefuse.planner import plan as make_plan
from tilefuse.runtime.executor import check_inputs, run_node

RegionFn = Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]


class _RefRegion:
    """A region run node by node through the registry references."""

    def __init__(self, graph_nodes, region):
        self.steps = [(n, ops.get(n.op), n.attr) for n in graph_nodes]
        self.inputs = region.inputs
        self.outputs = region.outputs

    def __call__(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env = dict(zip(self.inputs, args))
        device = args[0].device if args else torch.device("cpu")
        for node, spec, attrs in self.steps:
            ins = [env[i] if i else None for i in node.inputs]
            outs = run_node(node, spec, ins, attrs, device)
            for v, o in zip(node.outputs, outs):
                env[v.name] = o
        return [env[o] for o in self.outputs]


class PlanRunner:
    """Executes ``plan`` on torch tensors; ``kernels`` maps region names to compiled callables."""

    def __init__(self, plan: FusionPlan, kernels: Mapping[str, RegionFn] | None = None, check: bool = True):
        self.plan = plan
        self.check = check
        self.kernels = dict(kernels or {})
        nodes = {n.name: n for n in plan.graph.nodes}
        self.fns: list[RegionFn] = [self.kernels.get(r.name) or _RefRegion([nodes[m] for m in r.nodes], r)
                                    for r in plan.regions]
        last: dict[str, int] = {}
        for k, r in enumerate(plan.regions):
            for i in r.inputs:
                last[i] = k
        keep = set(plan.graph.outputs) | set(plan.graph.constants)
        self.frees: dict[int, list[str]] = {}
        for name, k in last.items():
            if name not in keep:
                self.frees.setdefault(k, []).append(name)
        self._constants: dict[torch.device, dict[str, torch.Tensor]] = {}
        self._graphed = None
        self.record = False  # keep the last call's inputs (benchmarks re-run regions on them)
        self.last_inputs: tuple[torch.Tensor, ...] | None = None

    def constants(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._constants:
            self._constants[device] = {k: t.to(device) for k, t in self.plan.graph.constants.items()}
        return self._constants[device]

    def enable_cuda_graphs(self) -> None:
        """Replay the plan from captured CUDA graphs (static shapes; one graph per input signature)."""
        from tilefuse.runtime.graphs import CudaGraphRunner

        self._graphed = CudaGraphRunner(self.run)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.record:
            self.last_inputs = args
        graphed = self._graphed
        if graphed is not None and args and args[0].is_cuda:
            if self.check:
                check_inputs(self.plan.graph, args)
            try:
                return graphed(*args)
            except RuntimeError as e:  # e.g. a region that reads a tensor's values on the host
                logging.getLogger("tilefuse").warning(
                    "%s: CUDA graph capture failed (%s); running without graphs", self.plan.graph.name,
                    str(e).splitlines()[0] if str(e) else type(e).__name__)
                self._graphed = None
        return self.run(*args)

    def run(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Execute the plan once, region by region (no CUDA graph)."""
        g = self.plan.graph
        if self.check:
            check_inputs(g, args)
        device = args[0].device if args else torch.device("cpu")
        env: dict[str, torch.Tensor] = dict(self.constants(device))
        env.update({v.name: a for v, a in zip(g.inputs, args)})
        for k, (region, fn) in enumerate(zip(self.plan.regions, self.fns)):
            outs = fn([env[i] for i in region.inputs])
            for name, o in zip(region.outputs, outs):
                env[name] = o
            for name in self.frees.get(k, ()):
                env.pop(name, None)
        return tuple(env[o] for o in g.outputs)

    def summary(self) -> str:
        return self.plan.summary()


def build_runner(graph: Graph, options: Options) -> PlanRunner:
    """Plan ``graph`` for ``options.target``, lower what can be lowered, return the runner."""
    t0 = time.perf_counter()
    p = make_plan(graph, options.target, fuse=options.fuse)
    kernels = {}
    if options.lower:
        try:
            from tilefuse.lowering.registry import lower_plan
            from tilefuse.lowering.tune import tuned
        except ImportError:
            lower_plan = None
        if lower_plan is not None:
            with tuned(p, options):  # a no-op unless options.tune: winners apply while lowering
                kernels = lower_plan(p, options.target)
        # Regions whose kernel did not compile run through torch: the plan must say so.
        p = dataclasses.replace(p, regions=tuple(
            r if r.backend != "tilelang" or r.name in kernels else dataclasses.replace(r, backend="torch")
            for r in p.regions))
    runner = PlanRunner(p, kernels)
    if options.cuda_graphs and options.target.get("kind") == "cuda":
        runner.enable_cuda_graphs()
    runner.compile_seconds = time.perf_counter() - t0
    runner.source_graph = graph
    if options.observer is not None:
        options.observer(runner)
    return runner

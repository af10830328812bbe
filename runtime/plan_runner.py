"""Run a FusionPlan region by region: a compiled kernel where lowering gave one, else the region's
nodes through their torch references (an explicit, reported fallback: ``backend == "torch"``). The runner is
built by ``tilefuse.pipeline``; its first call may decide, per region, between kernel, torch and split
(``first_call``, then ``apply``).

Note: values are freed after the last region that reads them, so peak memory follows liveness at
region granularity (a fused region's interior values never exist in device memory at all once it
runs as one kernel).

Note: a plan runs on one device: for a CUDA target, the GPU its inputs are on. Inputs elsewhere (a CPU
0-d tensor: a position counter, a flag; indices torch's eager ops accept on the host) are copied into a
buffer on that device kept per input (``_stage``): one small host-to-device copy per call, at a fixed
address a captured CUDA graph reads, and never a CPU tensor handed to a GPU kernel. Where outputs belong
on the host, the frontend moves them back (``frontends.fx.OutSpec.device``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from tilefuse.ops.reference import NodesFn, check_inputs
from tilefuse.planner.plan import FusionPlan
from tilefuse.runtime.graphs import CudaGraphRunner
from tilefuse.runtime.straight import straight_line

RegionFn = Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]


def reference_region(plan: FusionPlan, region) -> RegionFn:
    """``region`` of ``plan`` run node by node through torch (what a region without a kernel runs)."""
    return NodesFn(plan.graph, region.nodes, region.inputs, region.outputs)


class PlanRunner:
    """Executes ``plan`` on torch tensors; ``kernels`` maps region names to compiled callables."""

    def __init__(self, plan: FusionPlan, kernels: Mapping[str, RegionFn] | None = None, check: bool = True,
                 device_type: str = "cpu"):
        self.plan = plan
        self.check = check
        self.device_type = device_type  # "cuda" for a CUDA target's plan: inputs elsewhere are staged onto it
        self._staged: dict[int, torch.Tensor] = {}  # input position -> its buffer on the plan's device
        self._foreign: tuple[torch.device, tuple[int, ...]] | None = None  # decided once when check is off
        self.static_inputs: tuple[int, ...] = ()  # inputs CUDA graphs read in place (set by the pipeline)
        # (output, input) positions: the caller copies that output into that input after each call (an input
        # mutation; set by the pipeline): CUDA graphs write it themselves where the input is static
        self.updates: tuple[tuple[int, int], ...] = ()
        self.kernels = dict(kernels or {})
        self.fns: list[RegionFn] = [self.kernels.get(r.name) or reference_region(plan, r) for r in plan.regions]
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
        self.tail_start: int | None = None  # where the regions run after the CUDA graph start (enable_cuda_graphs)
        self._straight: dict[tuple[int, int], tuple[list, Callable]] = {}  # (lo, hi) -> (its fns, straight_line)
        # Called once with the first call's inputs (on the plan's device), before it runs: the pipeline's measured
        # choice, which decides per region and calls ``apply``.
        self.first_call: Callable[[Sequence[torch.Tensor]], None] | None = None
        # Seconds by compile phase, as they happen: the backend's "import" (the ATen graph in), the pipeline's "plan"
        # and "lower", the first call's "splits" and "decide", and here the first call's "measured_choice" (all of
        # first_call). ``compile_phases`` adds the CUDA graphs' capture.
        self.phases: dict[str, float] = {}
        self.record = False  # keep the last call's inputs (benchmarks re-run regions on them)
        # "torch" where the whole graph was measured faster as traced, through torch (the backend's whole-graph choice)
        self.graph_backend = "tilefuse"
        self.last_inputs: tuple[torch.Tensor, ...] | None = None

    def constants(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._constants:
            self._constants[device] = {k: t.to(device) for k, t in self.plan.graph.constants.items()}
        return self._constants[device]

    def enable_cuda_graphs(self, tail: bool = False, tail_min_bytes: int | None = None) -> None:
        """Replay the plan from captured CUDA graphs (static shapes; one graph per input signature). The
        ``static_inputs`` (parameters: they keep their address across calls) are read in place rather than
        copied in before each replay (``runtime.graphs.CudaGraphRunner``), and the ``updates`` into them are written
        by the graph itself. With ``tail`` (``Options.eager_tail``) the plan's last regions, where they write its
        outputs (a language model's logits), run after the replay outside the graph: their outputs are then fresh
        tensors, where an output of the graph is copied out of its memory (GPT-2's logits, 8x1024x50257 fp16: 0.39 ms
        of copy per call on the H200). Only where those outputs hold at least ``tail_min_bytes`` (``TAIL_MIN_BYTES``):
        below that the copy costs less than launching the tail's kernels from Python (a decode step's logits)."""
        g, regions = self.plan.graph, self.plan.regions
        start = eager_tail(self.plan) if tail else len(regions)
        if start < len(regions) and tail_output_bytes(self.plan, start) < \
                (TAIL_MIN_BYTES if tail_min_bytes is None else tail_min_bytes):
            start = len(regions)
        self.tail_start = start
        # graph outputs the caller copies into an input: written by the graph where the input is read in place and
        # nothing after the graph reads its old value
        later = {v for r in regions[start:] for v in r.inputs}
        names = [v.name for v in g.inputs]
        updates = {g.outputs[k]: i for k, i in self.updates if names[i] not in later}
        if start == len(regions) or not any(r.launches for r in regions[:start]):  # the plan whole in the graph
            start = self.tail_start = len(regions)
            self._graphed = CudaGraphRunner(self.run, static_inputs=self.static_inputs, guarded=not self.check,
                                            updates=[(k, updates[v]) for k, v in enumerate(g.outputs) if v in updates])
            return
        made = {v for r in regions[:start] for v in r.outputs}
        read = list(dict.fromkeys(v for r in regions[start:] for v in r.inputs if v in made))
        kept = [o for o in dict.fromkeys(g.outputs) if o in made]  # outputs the graph writes: copied out

        def head(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            env = self._env(args)
            self._run_regions(env, 0, start)
            return tuple(env[v] for v in (*read, *kept))

        def finish(args, outs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            env = self._env(args, check=False)
            env.update(zip(read, outs))
            # graph memory is copied out; an output that is an argument (a KV cache the head updated in place: the
            # graph runner hands it back as the caller's tensor) is not: a copy would cost a whole cache per step,
            # and the caller's input mutation would then be written back from it
            given = {id(a) for a in args}
            copies = {v: o if id(o) in given else o.clone() for v, o in zip(kept, outs[len(read):])}
            self._run_regions(env, start, len(regions))
            return tuple(copies[o] if o in copies else env[o] for o in g.outputs)

        self._graphed = CudaGraphRunner(head, static_inputs=self.static_inputs, finish=finish, guarded=not self.check,
                                        updates=[(len(read) + k, updates[v]) for k, v in enumerate(kept)
                                                 if v in updates])

    def place(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``args`` on the plan's device: those elsewhere copied into their staging buffers. Without input
        checks (torch.compile, whose guards fix each input's device) which ones move is decided once."""
        args = tuple(args)
        if self.device_type == "cpu" or not args:
            return args
        where = self._foreign if not self.check else None
        if where is None:
            device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == self.device_type),
                          None)
            if device is None:  # nothing on the target's device: run where the inputs are (kernels will say)
                return args
            where = (device, tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device != device))
            if not self.check:
                self._foreign = where
        device, moved = where
        if not moved:
            return args
        out = list(args)
        for i in moved:
            out[i] = self._stage(i, args[i], device)
        return tuple(out)

    def _stage(self, i: int, a: torch.Tensor, device: torch.device) -> torch.Tensor:
        buf = self._staged.get(i)
        if buf is None or buf.shape != a.shape or buf.dtype != a.dtype or buf.device != device:
            buf = self._staged[i] = torch.empty(a.shape, dtype=a.dtype, device=device)
        return buf.copy_(a)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = self.place(args)
        if self.record:
            self.last_inputs = args
        if self.first_call is not None and args and (args[0].is_cuda or self.device_type == "cpu"):
            first, self.first_call = self.first_call, None
            t0 = time.perf_counter()
            first(args)
            self.phases["measured_choice"] = time.perf_counter() - t0
        graphed = self._graphed
        if graphed is not None and args and args[0].device.type == graphed.device_type:
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

    def compile_phases(self) -> dict[str, float]:
        """``phases`` and, where CUDA graphs were captured, ``graph_capture``: where this graph's compile went
        (benchmarks print it beside the compile's seconds)."""
        graphed = self._graphed
        extra = {"graph_capture": graphed.capture_seconds} if graphed is not None and graphed.capture_seconds else {}
        return {**self.phases, **extra}

    def apply(self, runs: Mapping[str, str], splits: Mapping[str, RegionFn], notes: Sequence[str] = ()) -> None:
        """Run each region named in ``runs`` as decided: ``"torch"`` (its nodes through torch) or ``"split"`` (its
        entry of ``splits``); the plan says so (backend, and ``notes``)."""
        if not runs and not notes:
            return
        regions = list(self.plan.regions)
        for k, region in enumerate(regions):
            how = runs.get(region.name)
            if how == "split":
                self.fns[k] = self.kernels[region.name] = splits[region.name]
            elif how == "torch":
                self.fns[k] = reference_region(self.plan, region)
                self.kernels.pop(region.name, None)
            elif how is not None:
                raise ValueError(f"region {region.name}: unknown way to run {how!r}")
            if how is not None:
                regions[k] = dataclasses.replace(region, backend=how)
        self.plan = dataclasses.replace(self.plan, regions=tuple(regions), notes=self.plan.notes + tuple(notes))

    def run(self, *args: torch.Tensor, before_region: Callable | None = None) -> tuple[torch.Tensor, ...]:
        """Execute the plan once, region by region (no CUDA graph). ``before_region(k, region, inputs)`` is
        called before region ``k`` runs and may return another function to run it with in this call (the pipeline's
        ``decide`` times the ways to run it there, then runs the one it chose, so that the regions after it see
        their inputs as they will be made: a torch GEMM's output strides are not a kernel's)."""
        env = self._env(args)
        self._run_regions(env, 0, len(self.plan.regions), before_region)
        return tuple(env[o] for o in self.plan.graph.outputs)

    def _env(self, args: Sequence[torch.Tensor], check: bool = True) -> dict[str, torch.Tensor]:
        """The values a run starts from: the plan's constants and the call's inputs (checked, unless not)."""
        g = self.plan.graph
        if check and self.check:
            check_inputs(g, args)
        device = args[0].device if args else torch.device("cpu")
        env: dict[str, torch.Tensor] = dict(self.constants(device))
        env.update({v.name: a for v, a in zip(g.inputs, args)})
        return env

    def _run_regions(self, env: dict[str, torch.Tensor], lo: int, hi: int,
                     before_region: Callable | None = None) -> None:
        """Run regions ``lo`` to ``hi - 1`` on ``env``, adding their outputs and dropping values read for the last
        time."""
        if before_region is None and hi > lo:  # the decided plan: one straight-line function per range
            fns = self.fns[lo:hi]
            entry = self._straight.get((lo, hi))
            if entry is None or entry[0] != fns:  # (built again where a region's function changed: ``apply``)
                entry = self._straight[(lo, hi)] = (fns, straight_line(self.plan.regions, self.fns, self.frees, lo, hi))
            entry[1](env)
            return
        for k in range(lo, hi):
            region = self.plan.regions[k]
            ins = [env[i] for i in region.inputs]
            fn = self.fns[k]
            if before_region is not None:  # (it may run this region another way, for this call only)
                fn = before_region(k, region, ins) or fn
            outs = fn(ins)
            for name, o in zip(region.outputs, outs):
                env[name] = o
            for name in self.frees.get(k, ()):
                env.pop(name, None)

    def summary(self) -> str:
        return self.plan.summary()


MAX_EAGER_TAIL = 2  # regions with kernels run outside the CUDA graph at most
# The eager tail only where the outputs it makes hold this much: a graph's copy of 1 MiB takes under 1 us on the H200,
# less than one kernel launched from Python (about 10 us of host time)
TAIL_MIN_BYTES = 1 << 20


def eager_tail(plan: FusionPlan) -> int:
    """Where the plan's eager tail starts: the last regions that write graph outputs, up to ``MAX_EAGER_TAIL``
    of them launching kernels (``len(plan.regions)`` when there is none), never between a collective and its wait
    (``collectives_together``). A view region in the tail takes the region making its input with it: a view of graph
    memory handed to the caller would change with the next replay (no tail where that region cannot come)."""
    outs, regions = set(plan.graph.outputs), plan.regions
    start, launching = len(regions), 0
    while start > 0 and outs & set(regions[start - 1].outputs):
        launching += bool(regions[start - 1].launches)
        if launching > MAX_EAGER_TAIL:
            break
        start -= 1
        if not regions[start].launches:
            outs |= set(regions[start].inputs)
    made_before = {v for r in regions[:start] for v in r.outputs}
    if any(not r.launches and made_before & set(r.inputs) for r in regions[start:]):
        return len(regions)
    return collectives_together(plan, start)


def tail_output_bytes(plan: FusionPlan, start: int) -> int:
    """The bytes of the plan's outputs that its regions from ``start`` on make (unknown sizes count as large)."""
    made = {v for r in plan.regions[start:] for v in r.outputs} & set(plan.graph.outputs)
    values = plan.graph.values()
    sizes = [values[v].type.nbytes for v in made]
    return sum(n for n in sizes if n is not None) if all(n is not None for n in sizes) else 1 << 62


def collectives_together(plan: FusionPlan, start: int) -> int:
    """The first place at or after ``start`` where the plan may be cut in two (a CUDA graph, then the eager tail)
    without a collective before the cut whose wait comes after it: a wait on the far side of a CUDA-graph boundary
    from its collective crashes (torch's own experience with captured collectives). A collective region that reads
    another's output is that one's wait; the cut moves past it (``len(plan.regions)``: no tail)."""
    regions = plan.regions
    made_by = {v: k for k, r in enumerate(regions) if r.kind == "collective" for v in r.outputs}
    for k in range(start, len(regions)):
        r = regions[k]
        if r.kind == "collective" and any(made_by.get(v, k) < start for v in r.inputs):
            start = k + 1
    return start

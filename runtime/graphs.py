"""CUDA graphs: capture a static-shape plan once and replay it.

Note: measured on the H200, a TileLang kernel called from Python costs about 10 us of host time and
about 0.9 us inside a replayed graph, so a plan of 100 kernels drops from ~1 ms of launch overhead
to ~0.1 ms. Inputs are copied into static buffers before each replay, except ``static_inputs``
(positions of tensors that keep their address from call to call: a module's parameters and buffers),
which the graph reads in place: a graph is captured per address of those, so a parameter replaced by
a new tensor gets a new graph, and one changed in place is read as it is now. (GPT-2 through
torch.compile passes 148 parameters: copying them cost 0.7 ms of GPU time and about 1.5 ms of host
time per call on the H200.) Outputs are the graph's own buffers, overwritten by the next replay;
``clone_outputs`` (the default) hands back copies so a caller can keep results across calls, or ``finish``
takes them with the call's arguments and makes the results (``PlanRunner`` runs the regions that write
the plan's outputs there, outside the graph: their outputs are fresh tensors, not copies of graph memory).
An output that is a static input itself (a KV cache the plan updated in place) is handed back as the caller's
tensor, never copied: it holds the result once the replay is done. ``finish`` gets it that way too. ``updates`` are
outputs the caller would copy into a static input after each call (an input mutation: a decode step's position
counter): the graph copies them there itself, at its end, and hands the input back for them, so that a step costs
neither a clone of each nor a copy back (HF LLaMA, 8 layers: 16 copies a decode step launched from Python).
A caller that passes its other inputs at the same addresses call after call (a preallocated input buffer; a benchmark
loop) gets, after ``PIN_AFTER`` such replays, a twin of the graph that reads them in place too, captured into the
same memory pool: the copies are gone (the zoo MLP's 8192x4096 fp16 input: 0.03 ms of a 3.16 ms call on the H200).
Another address then replays the copying graph again, and that signature is never pinned again (its twin freed).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# (fn, inputs, warmup[, another graph's pool]) -> (graph, outputs): ``record_cuda_graph``
Recorder = Callable[..., tuple[Any, tuple[torch.Tensor, ...]]]


clock = time.perf_counter  # (what capture_seconds is read with)
PIN_AFTER = 4  # replays with the copied inputs at the same addresses before a twin reads them in place
NEVER = "never"  # a signature's twin: not to be captured (its inputs moved after it was; or it would alias them)


@dataclass(frozen=True)
class CapturedGraph:
    """One captured graph of a ``CudaGraphRunner`` and what a replay needs."""

    graph: Any  # a torch.cuda.CUDAGraph (anything with ``replay()``)
    inputs: tuple[torch.Tensor, ...]  # what the graph reads: static inputs themselves, buffers for the others
    outputs: tuple[torch.Tensor, ...]  # the graph's own memory (overwritten by each replay) or static inputs
    copied: tuple[int, ...]  # input positions copied into ``inputs`` before each replay
    aliases: tuple[tuple[int, int], ...]  # (output, static input) pairs where the output is that input

    @functools.cached_property
    def kept(self) -> frozenset[int]:
        """The outputs that are static inputs (handed back as the caller's tensors, never copied)."""
        return frozenset(k for k, _ in self.aliases)

    def replay(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Replay on ``args`` (at the addresses captured for the static inputs): the outputs, those that are a
        static input being the caller's tensor ``args[i]``, the others the graph's memory."""
        for i in self.copied:
            self.inputs[i].copy_(args[i])
        self.graph.replay()
        if not self.aliases:
            return self.outputs
        outs = list(self.outputs)
        for k, i in self.aliases:
            outs[k] = args[i]
        return tuple(outs)


def record_cuda_graph(fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                      warmup: int, pool: Any = None) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """Capture ``fn(*inputs)`` in a CUDA graph after ``warmup`` calls on a side stream (allocations, lazy
    initialisation and autotuning must not be captured); returns the graph and the outputs it writes. ``pool``:
    another graph's memory pool (``graph.pool()``) to allocate from, where the two never run at once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = tuple(fn(*inputs))
    return graph, outputs


class CudaGraphRunner:
    """Wraps ``fn(*tensors) -> tuple of tensors``; one captured graph per input signature. ``record`` captures
    one (``record_cuda_graph``) and ``device_type`` is where the arguments must be for a replay: others call
    ``fn`` directly (tests stand a replaying recorder and ``"cpu"`` in for CUDA). ``guarded``: the caller fixes each
    argument's shape, strides, dtype and device from call to call (dynamo's guards do), so the signature need only
    name the static inputs' addresses (and the copied inputs' shapes, a check that costs little)."""

    def __init__(self, fn: Callable[..., Sequence[torch.Tensor]], clone_outputs: bool = True, warmup: int = 2,
                 max_graphs: int = 8, static_inputs: Collection[int] = (),
                 finish: Callable[[Sequence[torch.Tensor], tuple[torch.Tensor, ...]], tuple] | None = None,
                 record: Recorder = record_cuda_graph, device_type: str = "cuda",
                 updates: Collection[tuple[int, int]] = (), guarded: bool = False):
        self.fn = fn
        self.guarded = guarded
        self._positions: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # argument count -> (copied, static)
        self.finish = finish
        self.static_inputs = tuple(sorted(set(static_inputs)))
        # (output, static input) pairs the graph writes: the first for each input (any other is left to the caller)
        first: dict[int, tuple[int, int]] = {}
        for k, i in updates:
            if i in self.static_inputs:
                first.setdefault(i, (k, i))
        self.updates = tuple(first.values())
        self.clone_outputs = clone_outputs
        self.warmup = warmup
        self.max_graphs = max_graphs
        self.record = record
        self.device_type = device_type
        self._graphs: dict[tuple, CapturedGraph] = {}  # input signature -> its graph
        # input signature -> (the copied inputs' addresses and strides, replays at them in a row, the twin reading them:
        # a CapturedGraph, None before it is captured, or NEVER)
        self._pins: dict[tuple, tuple[tuple[int, ...], int, Any]] = {}
        self.pin_after = PIN_AFTER
        self.capture_seconds = 0.0  # spent capturing (warm-up calls included), all signatures

    @property
    def graphs(self) -> list[CapturedGraph]:
        """The graphs captured so far, oldest first."""
        return list(self._graphs.values())

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # the key first: a captured graph's key names every argument's device, so a hit needs no device check (a
        # decode step's 100 arguments: the check cost as much as the key); a miss checks them before capturing.
        # List comprehensions, not generators: this runs before every replay (GPT-2: 150 inputs, 78 -> 58 us)
        n = len(args)
        try:
            if self.guarded:  # shapes, strides, dtypes and devices fixed by the caller: the addresses read in place
                others, static = self._positions.get(n) or self._position_split(n)
                key = tuple([(args[i].shape, args[i].dtype, args[i].device) for i in others]) + tuple(
                    [args[i].data_ptr() for i in static])
            else:
                key = tuple([(a.shape, a.dtype, a.device) for a in args]) + tuple(
                    [(args[i].data_ptr(), args[i].stride()) for i in self.static_inputs if i < n])
        except AttributeError:  # an argument that is not a tensor: no graph
            key = None
        entry = self._graphs.get(key) if key is not None else None
        if entry is None and (not args or key is None or not all(isinstance(a, torch.Tensor) and a.device.type ==
                                                                 self.device_type for a in args)):
            outs = tuple(self.fn(*args))
            return self.finish(args, outs) if self.finish is not None else outs
        if entry is None:
            if len(self._graphs) >= self.max_graphs:  # a bounded cache: evict the oldest signature
                self._pins.pop(oldest := next(iter(self._graphs)), None)
                self._graphs.pop(oldest)
            entry = self._graphs[key] = self._capture(args)
        elif entry.copied and self.pin_after:
            entry = self._pinned(key, entry, args)
        outs = entry.replay(args)  # the static inputs are at the captured addresses (the key says so)
        if self.finish is not None:
            return self.finish(args, outs)
        if not self.clone_outputs:
            return outs
        if not entry.aliases:
            return tuple([o.clone() for o in outs])
        kept = entry.kept
        return tuple([o if k in kept else o.clone() for k, o in enumerate(outs)])

    def _pinned(self, key: tuple, entry: CapturedGraph, args: Sequence[torch.Tensor]) -> CapturedGraph:
        """The graph to replay for signature ``key``: its twin that reads every input in place where the copied
        inputs are where they were on the last ``pin_after`` replays (captured then), else ``entry``."""
        last, repeats, twin = self._pins.get(key) or ((), 0, None)
        if twin is NEVER:
            return entry
        at = tuple([(args[i].data_ptr(), args[i].stride()) for i in entry.copied])  # (a view of other strides moves)
        if at != last:  # moved: count again; a twin's addresses left behind: this signature copies from now on
            self._pins[key] = ((), 0, NEVER) if twin is not None else (at, 1, None)
            return entry
        if twin is None and repeats + 1 >= self.pin_after:
            twin = self._capture(args, pinned=entry)
            if any(k not in entry.kept for k, _ in twin.aliases):  # an output that is a copied input: keep copying
                twin = NEVER
        self._pins[key] = (at, repeats + 1, twin)
        return entry if twin is None or twin is NEVER else twin

    def _position_split(self, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        static = tuple(i for i in self.static_inputs if i < n)
        kept = set(static)
        split = self._positions[n] = (tuple(i for i in range(n) if i not in kept), static)
        return split

    def _capture(self, args: Sequence[torch.Tensor], pinned: CapturedGraph | None = None) -> CapturedGraph:
        t0 = clock()
        try:
            return self._record(args, pinned)
        finally:
            self.capture_seconds += clock() - t0

    def _record(self, args: Sequence[torch.Tensor], pinned: CapturedGraph | None = None) -> CapturedGraph:
        """A graph of ``fn`` on ``args``: the static inputs read in place, the others copied into buffers of its own
        before each replay; or, as ``pinned``'s twin, all read in place (in ``pinned``'s memory pool: the two never
        run at once). Aliases are outputs that are an input, found among all inputs (the twin's that are not among
        ``pinned``'s: it is not used)."""
        static = set(range(len(args)) if pinned is not None else self.static_inputs)
        inputs = tuple(a if i in static else a.clone() for i, a in enumerate(args))
        fn = writing_updates(self.fn, self.updates, self.warmup) if self.updates else self.fn
        pool = getattr(pinned.graph, "pool", None) if pinned is not None else None
        graph, outputs = self.record(fn, inputs, self.warmup, *([pool()] if pool is not None else []))
        return CapturedGraph(graph, inputs, tuple(outputs), tuple(i for i in range(len(args)) if i not in static),
                             tuple(input_aliases(outputs, inputs, static)))


def writing_updates(fn: Callable[..., Sequence[torch.Tensor]], updates: Sequence[tuple[int, int]], skip: int) \
        -> Callable[..., tuple[torch.Tensor, ...]]:
    """``fn`` that then copies its output ``k`` into its input ``i`` and returns that input as output ``k``, for each
    ``(k, i)`` of ``updates``, from its call ``skip + 1`` on: the recorder's warm-up calls before the capture run on
    the caller's tensors and must leave them as they were (a counter incremented there would be incremented twice)."""
    calls = 0

    def run(*ins: torch.Tensor) -> tuple[torch.Tensor, ...]:
        nonlocal calls
        calls += 1
        outs = tuple(fn(*ins))
        if calls <= skip:
            return outs
        outs = list(outs)
        # the outputs that are not the input already (a KV cache updated in place is: no copy of it onto itself), in
        # one call (torch's multi-tensor apply where it takes them)
        moved = [(k, i) for k, i in updates if not same_tensor(outs[k], ins[i])]
        if moved:
            torch._foreach_copy_([ins[i] for _, i in moved], [outs[k] for k, _ in moved])
        for k, i in updates:
            outs[k] = ins[i]
        return tuple(outs)
    return run


def input_aliases(outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], positions: Collection[int]) \
        -> list[tuple[int, int]]:
    """(output, input) pairs where an output is input ``i`` (``i`` in ``positions``) in full: the same memory,
    shape, strides and dtype."""
    return [(k, i) for k, o in enumerate(outs) for i in sorted(positions)
            if isinstance(o, torch.Tensor) and same_tensor(o, ins[i])]


def same_tensor(o: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether ``o`` is ``a`` in full: the same memory, shape, strides and dtype."""
    return o is a or (o.device == a.device and o.data_ptr() == a.data_ptr() and o.shape == a.shape
                      and o.stride() == a.stride() and o.dtype == a.dtype)

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
tensor, never copied: it holds the result once the replay is done.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch


class CudaGraphRunner:
    """Wraps ``fn(*tensors) -> tuple of tensors``; one captured graph per input signature."""

    def __init__(self, fn: Callable[..., Sequence[torch.Tensor]], clone_outputs: bool = True, warmup: int = 2,
                 max_graphs: int = 8, static_inputs: Collection[int] = (),
                 finish: Callable[[Sequence[torch.Tensor], tuple[torch.Tensor, ...]], tuple] | None = None):
        self.fn = fn
        self.finish = finish
        self.static_inputs = tuple(sorted(set(static_inputs)))
        self.clone_outputs = clone_outputs
        self.warmup = warmup
        self.max_graphs = max_graphs
        # signature -> (graph, its input tensors, its outputs, the positions copied in before each replay,
        # (output, static input) pairs where the output is that input)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], tuple[torch.Tensor, ...],
                                        list[int], list[tuple[int, int]]]] = {}

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not args or not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            outs = tuple(self.fn(*args))
            return self.finish(args, outs) if self.finish is not None else outs
        # list comprehensions, not generators: this runs before every replay (GPT-2: 150 inputs, 78 -> 58 us)
        key = tuple([(a.shape, a.dtype, a.device) for a in args]) + tuple(
            [(args[i].data_ptr(), args[i].stride()) for i in self.static_inputs if i < len(args)])
        entry = self._graphs.get(key)
        if entry is None:
            if len(self._graphs) >= self.max_graphs:  # a bounded cache: evict the oldest signature
                self._graphs.pop(next(iter(self._graphs)))
            entry = self._graphs[key] = self._capture(args)
        graph, static_in, static_out, copied, aliases = entry
        for i in copied:  # the static inputs are at the captured addresses (the key says so): not copied
            static_in[i].copy_(args[i])
        graph.replay()
        if self.finish is not None:
            return self.finish(args, static_out)
        if not self.clone_outputs:
            return static_out
        if not aliases:
            return tuple(o.clone() for o in static_out)
        kept = dict(aliases)
        return tuple(args[kept[k]] if k in kept else o.clone() for k, o in enumerate(static_out))

    def _capture(self, args: Sequence[torch.Tensor]):
        static = set(self.static_inputs)
        static_in = [a if i in static else a.clone() for i, a in enumerate(args)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up outside capture: allocations, lazy init, autotune
            for _ in range(self.warmup):
                self.fn(*static_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = tuple(self.fn(*static_in))
        return graph, static_in, static_out, [i for i in range(len(args)) if i not in static], \
            input_aliases(static_out, static_in, static)


def input_aliases(outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], positions: Collection[int]) \
        -> list[tuple[int, int]]:
    """(output, input) pairs where an output is input ``i`` (``i`` in ``positions``) in full: the same memory,
    shape, strides and dtype."""
    def same(o: torch.Tensor, a: torch.Tensor) -> bool:
        return o is a or (o.device == a.device and o.data_ptr() == a.data_ptr() and o.shape == a.shape
                          and o.stride() == a.stride() and o.dtype == a.dtype)

    return [(k, i) for k, o in enumerate(outs) for i in sorted(positions)
            if isinstance(o, torch.Tensor) and same(o, ins[i])]

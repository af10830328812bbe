"""Build the callable that runs a compiled graph: the plan, its kernels and the executor."""

from __future__ import annotations

import torch

from tilefuse.config import Options
from tilefuse.ir import Graph
from tilefuse.runtime.executor import Executor


class GraphRunner:
    """Runs a graph through the reference executor, one executor per device."""

    def __init__(self, graph: Graph, options: Options):
        self.graph = graph
        self.options = options
        self._executors: dict[torch.device, Executor] = {}

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        device = args[0].device if args else torch.device("cpu")
        ex = self._executors.get(device)
        if ex is None:
            ex = self._executors[device] = Executor(self.graph, device)
        return ex(*args)

    def summary(self) -> str:
        return f"{self.graph.name}: {len(self.graph.nodes)} nodes (reference executor)"


def build_runner(graph: Graph, options: Options):
    return GraphRunner(graph, options)

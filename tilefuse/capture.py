"""Capture the tilefuse graphs that ``torch.compile(backend="tilefuse")`` builds for a model."""

from __future__ import annotations

import torch

import tilefuse
from tilefuse.ir import Graph


def capture_graphs(model: torch.nn.Module, inputs: tuple, **options) -> list[Graph]:
    """Compile ``model`` with tilefuse, run it once on ``inputs`` (no grad), return the imported graphs."""
    runners: list = []
    torch._dynamo.reset()
    compiled = tilefuse.compile(model, observer=runners.append, **options)
    with torch.no_grad():
        compiled(*inputs)
    return [r.source_graph for r in runners]

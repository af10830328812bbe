"""Public entry points: ``compile`` (torch modules) and ``compile_onnx`` (ONNX models)."""

from __future__ import annotations

import os
from typing import Any

import torch

from tilefuse.config import Options, parse_target
from tilefuse.ir import Graph


class CompiledModel:
    """A graph compiled for a target: call it with torch tensors, get a tuple of tensors back."""

    def __init__(self, graph: Graph, options: Options):
        from tilefuse.runtime.plan_runner import build_runner

        self.graph = graph
        self.options = options
        self.runner = build_runner(graph, options)

    @property
    def plan(self):
        return getattr(self.runner, "plan", None)

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.runner(*args)

    def summary(self) -> str:
        fn = getattr(self.runner, "summary", None)
        return fn() if fn else f"{len(self.graph.nodes)} nodes"


def _options(target: str | dict | None, **kw: Any) -> Options:
    return Options(target=parse_target(target), **kw)


def compile_onnx(model: str | os.PathLike | Any, *, target: str | dict | None = None, **kw: Any) -> CompiledModel:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) and compile it for ``target``."""
    from tilefuse.frontends.onnx import import_onnx

    return CompiledModel(import_onnx(model), _options(target, **kw))


def compile_graph(graph: Graph, *, target: str | dict | None = None, **kw: Any) -> CompiledModel:
    """Compile a tilefuse ``Graph`` directly."""
    return CompiledModel(graph, _options(target, **kw))


def compile(model: torch.nn.Module, *, target: str | dict | None = None, dynamic: bool | None = False,
            **kw: Any):
    """``torch.compile(model, backend=tilefuse)`` with tilefuse options (target, fuse, lower...)."""
    from tilefuse.frontends.dynamo import make_backend

    return torch.compile(model, backend=make_backend(_options(target, **kw)), dynamic=dynamic)

"""Public entry points: ``compile`` (torch modules) and ``compile_onnx`` (ONNX models)."""

from __future__ import annotations

import os
from typing import Any

import torch

from tilefuse.config import Options, parse_target
from tilefuse.ir import Graph


class CompiledModel:
    """A graph compiled for a target: call it with torch tensors, get a tuple of tensors back."""

    def __init__(self, graph: Graph, options: Options, runner=None):
        from tilefuse.runtime.plan_runner import build_runner
        from tilefuse.specialize import is_static

        self.graph = graph
        self.options = options
        # A given runner comes from a loaded artifact. A graph with symbolic input dims is planned
        # and compiled per concrete input signature (bounded, least recently used out first); a
        # static graph once, now.
        if runner is None and is_static(graph):
            runner = build_runner(graph, options)
        self.runner = runner
        self._specialized: dict[tuple, object] = {}

    def runner_for(self, args) -> object:
        """The runner for these inputs: the static one, or a cached specialization."""
        if self.runner is not None:
            return self.runner
        from tilefuse.runtime.plan_runner import build_runner
        from tilefuse.specialize import signature, specialize

        key = signature(args)
        runner = self._specialized.pop(key, None)
        if runner is None:
            runner = build_runner(specialize(self.graph, [a.shape for a in args]), self.options)
            if len(self._specialized) >= self.options.max_specializations:
                self._specialized.pop(next(iter(self._specialized)))
        self._specialized[key] = runner
        return runner

    @property
    def plan(self):
        runner = self.runner or next(reversed(self._specialized.values()), None)
        return getattr(runner, "plan", None)

    @property
    def sparsity_report(self):
        """What ``Options.sparsity`` did (``planner.sparsity.SparsityReport``: weights pruned, the outputs'
        change), or None when sparsity did not apply."""
        p = self.plan
        return getattr(p, "sparsity", None)

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from tilefuse.runtime.executor import check_inputs

        if self.runner is None:
            check_inputs(self.graph, args)  # names the input whose rank, static dim or dtype is off
        return self.runner_for(args)(*args)

    def summary(self) -> str:
        p = self.plan
        if p is None:
            return f"{self.graph.name}: {len(self.graph.nodes)} nodes; symbolic input dims: planned per input shape"
        return p.summary()


def _options(target: str | dict | None, **kw: Any) -> Options:
    from tilefuse.planner.sparsity import check_mode

    options = Options(target=parse_target(target), **kw)
    check_mode(options.sparsity)  # a bad value fails here, not inside a torch.compile backend
    return options


def compile_onnx(model: str | os.PathLike | Any, *, target: str | dict | None = None,
                 save: str | os.PathLike | None = None, **kw: Any) -> CompiledModel:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) and compile it for ``target``; with ``save``,
    also write the artifact there (see ``tilefuse.save``). Progress on stderr as ``compile`` says (``quiet``)."""
    from tilefuse.frontends.onnx import import_onnx

    return _saved(CompiledModel(import_onnx(model), _options(target, **kw)), save)


def compile_graph(graph: Graph, *, target: str | dict | None = None, save: str | os.PathLike | None = None,
                  **kw: Any) -> CompiledModel:
    """Compile a tilefuse ``Graph`` directly (e.g. one from ``frontends.capture.capture_graphs``)."""
    return _saved(CompiledModel(graph, _options(target, **kw)), save)


def save(compiled: CompiledModel, path: str | os.PathLike):
    """Write ``compiled`` to the artifact ``path`` (one ``.tfz`` zip: graph, plan, weights, kernels)."""
    from tilefuse.runtime import artifact

    return artifact.save(compiled, path)


def load(path: str | os.PathLike, *, target: str | dict | None = None, strict: bool = False) -> CompiledModel:
    """Load an artifact without compiling (``tilefuse.runtime.artifact.load`` says what else it checks)."""
    from tilefuse.runtime import artifact

    return artifact.load(path, target=target, strict=strict)


def _saved(compiled: CompiledModel, path: str | os.PathLike | None) -> CompiledModel:
    if path is not None:
        save(compiled, path)
    return compiled


def compile(model: torch.nn.Module, *, target: str | dict | None = None, dynamic: bool | None = False,
            **kw: Any):
    """``torch.compile(model, backend=tilefuse)`` with tilefuse options (target, fuse, lower, sparsity...).

    With ``sparsity="2:4"`` the result carries ``sparsity_report`` (a ``planner.sparsity.SparsityLog``, filled
    when the model first runs: weights pruned and the outputs' change on that call's inputs). Sparsity
    applies to inference (run under ``torch.no_grad()``) and freezes the pruned weights: later changes to
    those parameters are not seen.

    Tuning and compiling kernels report progress on stderr (``tuning m: 3/10 kernels, ~40 s left``) only
    when stderr is a terminal, so library use and test logs stay clean; ``quiet=True`` (or
    ``TILEFUSE_QUIET=1``) silences it, ``quiet=False`` shows it always (the command line does so unless
    given ``--quiet``)."""
    from tilefuse.frontends.dynamo import make_backend

    backend = make_backend(_options(target, **kw))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    if backend.options.sparsity:
        if isinstance(model, torch.nn.Module):  # frozen weights keep their parameter names in plans and reports
            backend.param_names = {id(p): n for n, p in model.named_parameters()}
        # object.__setattr__: an OptimizedModule forwards attribute writes to the user's module
        object.__setattr__(compiled, "sparsity_report", backend.sparsity)
    return compiled

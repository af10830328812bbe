"""Public entry points: ``compile`` (torch modules) and ``compile_onnx`` (ONNX models)."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse.frontends.onnx import import_onnx
from tilefuse.ir import Graph
from tilefuse.ops.reference import check_inputs
from tilefuse.pipeline import RestoreMismatch, build_runner, restore
from tilefuse.planner.sparsity import check_mode
from tilefuse.runtime import artifact
from tilefuse.runtime.artifact import ArtifactMismatchError, ArtifactWarning, KernelStore, LoadReport
from tilefuse.specialize import is_static, signature, specialize


class CompiledModel:
    """A graph compiled for a target: call it with torch tensors, get a tuple of tensors back."""

    def __init__(self, graph: Graph, options: Options, runner=None):
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
        if self.runner is None:
            check_inputs(self.graph, args)  # names the input whose rank, static dim or dtype is off
        return self.runner_for(args)(*args)

    def summary(self) -> str:
        p = self.plan
        if p is None:
            return f"{self.graph.name}: {len(self.graph.nodes)} nodes; symbolic input dims: planned per input shape"
        return p.summary()


def _options(target: str | dict | None, **kw: Any) -> Options:
    options = Options(target=parse_target(target), **kw)
    check_mode(options.sparsity)  # a bad value fails here, not inside a torch.compile backend
    return options


def compile_onnx(model: str | os.PathLike | Any, *, target: str | dict | None = None,
                 save: str | os.PathLike | None = None, **kw: Any) -> CompiledModel:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) and compile it for ``target``; with ``save``,
    also write the artifact there (see ``tilefuse.save``). Progress on stderr as ``compile`` says (``quiet``)."""
    return _saved(CompiledModel(import_onnx(model), _options(target, **kw)), save)


def compile_graph(graph: Graph, *, target: str | dict | None = None, save: str | os.PathLike | None = None,
                  **kw: Any) -> CompiledModel:
    """Compile a tilefuse ``Graph`` directly (e.g. one from ``tilefuse.capture.capture_graphs``)."""
    return _saved(CompiledModel(graph, _options(target, **kw)), save)


def save(compiled: CompiledModel, path: str | os.PathLike):
    """Write ``compiled`` to the artifact ``path`` (one ``.tfz`` zip: graph, plan, weights, kernels)."""
    return artifact.save(compiled, path)


def load(path: str | os.PathLike, *, target: str | dict | None = None, strict: bool = False) -> CompiledModel:
    """Load the artifact at ``path`` as a runnable ``CompiledModel`` without compiling anything
    (``tilefuse.runtime.artifact`` describes the format and what is checked).

    ``target`` defaults to the artifact's. On another target, tilelang version or host the model is
    recompiled from the artifact's graph with an ``ArtifactWarning``, or, with ``strict``,
    ``ArtifactMismatchError`` is raised. A corrupted, tampered or malformed artifact raises
    ``ArtifactError`` naming the member. ``model.load_report`` says what happened (``compiled == 0``).
    Each stored plan runs the pipeline's ``restore``: the lowering and runner steps with the decisions and
    tile configs the artifact recorded.
    """
    t0 = time.perf_counter()
    contents = artifact.read(path, _saved_options, target, strict)
    why, runners = list(contents.why), []
    if not why:
        store = KernelStore(contents)
        keys, failed = [], []
        try:
            with artifact.kernel_cache(store.scratch.name):
                for sig, plan, tuning in contents.plans:
                    configs = {r: t[1] for r, t in tuning.items() if t[1] is not None}
                    runner, bad = restore(plan, configs, {r: t[0] for r, t in tuning.items()}, contents.options,
                                          prebuilt=store.prebuilt(tuning), use_process_cache=False)
                    runner.artifact_dir = store.scratch  # the unpacked kernels live as long as a runner using them
                    runners.append((sig, runner))
                    failed += bad
                    keys += [getattr(getattr(k, "kernel", None), "_tilelang_cache_key", None)
                             for k in _kernels_of(runner)]
        except RestoreMismatch as e:
            why = [str(e)]
    if why:
        if strict:
            raise ArtifactMismatchError(f"{contents.path}: {'; '.join(why)} (strict load: not recompiling)")
        warnings.warn(f"{contents.path}: {'; '.join(why)}; recompiling it from its graph", ArtifactWarning,
                      stacklevel=2)
        model = CompiledModel(contents.graph, contents.options)
        n = len({id(k.kernel) for k in getattr(model.runner, "kernels", {}).values()})
        model.load_report = LoadReport(str(contents.path), time.perf_counter() - t0, n, 0, n, "; ".join(why))
        return model
    load_report = artifact.report(contents, keys, store.rebuilt(), failed, time.perf_counter() - t0, strict)
    static = [r for sig, r in runners if sig is None]
    model = CompiledModel(contents.graph, contents.options, runner=static[0] if static else None)
    for sig, runner in runners:
        if sig is not None:  # a symbolic graph's specializations compiled before saving
            model._specialized[sig] = runner
        runner.compile_seconds = load_report.seconds
        runner.source_graph = contents.graph if sig is None else runner.plan.graph  # a specialization's: as planned
    model.load_report = load_report
    return model


def _saved_options(target: str | dict, saved: dict) -> Options:
    return Options(target=parse_target(target), fuse=bool(saved["fuse"]), lower=bool(saved["lower"]),
                   cuda_graphs=bool(saved["cuda_graphs"]), sparsity=saved.get("sparsity"))


def _kernels_of(runner) -> list:
    """The distinct TileLang kernels a runner runs (a split region's: its epilogue's)."""
    out = {}
    for k in runner.kernels.values():
        k = getattr(k, "tail_fn", k)
        out[id(k.kernel)] = k
    return list(out.values())


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
    backend = make_backend(_options(target, **kw))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    if backend.options.sparsity:
        if isinstance(model, torch.nn.Module):  # frozen weights keep their parameter names in plans and reports
            backend.param_names = {id(p): n for n, p in model.named_parameters()}
        # object.__setattr__: an OptimizedModule forwards attribute writes to the user's module
        object.__setattr__(compiled, "sparsity_report", backend.sparsity)
    return compiled

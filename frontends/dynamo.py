"""The ``torch.compile`` backend: dynamo graph -> AOTAutograd (ATen, forward and backward) -> tilefuse.

``torch.compile(model, backend="tilefuse")`` finds ``tilefuse_backend`` through the
``torch_dynamo_backends`` entry point; ``tilefuse.compile(model, ...)`` goes through ``make_backend``.

Note: AOTAutograd hands each forward, backward or inference graph to ``TilefuseBackend.compile_graph``
as ATen; it is imported with ``import_fx_program`` and run by ``build_runner``. The compiled function
uses AOTAutograd's boxed calling convention (one list argument, cleared by the callee). A graph with
symbolic sizes (dynamo's automatic dynamic shapes, after a recompile) is specialized: on each new
concrete signature it is re-traced with ``make_fx`` at those sizes and compiled as a static graph.
Nothing ever crashes a model: a graph that cannot be imported or planned runs as traced, through
torch, with a warning naming why (and the reason is kept in ``TilefuseBackend.failures``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tilefuse.config import Options, parse_target

from .fx import FxProgram, import_fx_program, is_symbolic

log = logging.getLogger("tilefuse")
aten = torch.ops.aten

# Decompositions AOTAutograd applies while tracing: rare ops and backward ops become ops the converter
# table knows. SDPA, layer_norm, softmax, gelu and silu are deliberately absent (the planner matches them).
_DECOMPOSED = (
    # backward ops of the activations and norms we keep whole in the forward
    aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward, aten.threshold_backward,
    aten.hardtanh_backward, aten.leaky_relu_backward, aten.elu_backward, aten.hardswish_backward,
    aten.hardsigmoid_backward, aten.glu_backward, aten.native_layer_norm_backward, aten.native_group_norm_backward,
    aten.native_batch_norm_backward, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten._fused_rms_norm_backward, aten.mse_loss_backward,
    # rare forward ops
    aten.addcmul, aten.addcdiv, aten.lerp, aten.std_mean, aten.mse_loss, aten.glu, aten.logit,
    aten.log_sigmoid_forward, aten._safe_softmax, aten._fused_rms_norm, aten.linalg_vector_norm,
    aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
)
KEPT_WHOLE = (aten.gelu, aten.silu, aten._softmax, aten.native_layer_norm, aten.scaled_dot_product_attention,
              aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_efficient_attention,
              aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_cudnn_attention)


def decompositions() -> dict:
    """The decomposition table handed to AOTAutograd (``_DECOMPOSED`` that torch knows how to split)."""
    from torch._decomp import get_decompositions

    return get_decompositions([op for op in _DECOMPOSED if op is not None])


class TilefuseBackend:
    """A dynamo backend compiling every graph with ``options``.

    ``programs`` collects the imported graphs (forward, backward, inference, specializations) and
    ``failures`` the reasons a graph ran through torch instead, so callers and tests can inspect them.
    """

    def __init__(self, options: Options | None = None):
        self.options = options or Options()
        self.programs: list[FxProgram] = []
        self.failures: list[str] = []
        self._ids = itertools.count()
        self.__name__ = "tilefuse"

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **kw: Any) -> Callable:
        if kw:
            log.warning("tilefuse: ignoring backend arguments %s (pass options to make_backend)", sorted(kw))
        from torch._dynamo.backends.common import aot_autograd

        graph_id = next(self._ids)

        def compiler(kind: str) -> Callable:
            return lambda g, ex: self.compile_graph(g, ex, f"graph{graph_id}_{kind}")

        aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           inference_compiler=compiler("inference"), decompositions=decompositions())
        try:
            return aot(gm, example_inputs)
        except Exception as e:
            if _is_dynamo_signal(e):
                raise
            self._fail(f"graph{graph_id}: AOTAutograd failed ({type(e).__name__}: {_first_line(e)})")
            return gm.forward

    def compile_graph(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str) -> Callable:
        """Compile one ATen graph; returns a boxed callable (AOTAutograd's calling convention)."""
        if is_symbolic(gm):
            return _Specializing(self, gm, name)
        try:
            program = import_fx_program(gm, example_inputs, name)
        except Exception as e:  # noqa: BLE001  (the graph then runs as traced, through torch)
            self._fail(f"{name}: cannot import ({type(e).__name__}: {_first_line(e)})")
            return _boxed(gm)
        try:
            from tilefuse.runtime.plan_runner import build_runner

            with unset_fake_temporarily():
                runner = build_runner(program.graph, self.options)
        except Exception as e:  # noqa: BLE001
            self._fail(f"{name}: cannot plan ({type(e).__name__}: {_first_line(e)})")
            return _boxed(gm)
        self.programs.append(program)
        if self.options.verbose:
            log.info("tilefuse: %s", getattr(runner, "summary", lambda: name)())
        return _Compiled(program, runner)

    def _fail(self, why: str) -> None:
        self.failures.append(why)
        log.warning("tilefuse: %s; running that graph through torch", why)

    def fallback_ops(self) -> set[str]:
        """The ATen ops that became ``torch_fallback`` nodes in any graph compiled so far."""
        return {op for p in self.programs for op in p.fallback_ops}


def _unbox(args: tuple) -> list:
    """The fx graph's arguments from a boxed call (one list, which the callee clears) or a plain one."""
    if len(args) == 1 and type(args[0]) is list:  # fx graphs never take a list argument themselves
        fx_args = list(args[0])
        args[0].clear()
        return fx_args
    return list(args)


class _Compiled:
    """A compiled graph with the fx graph's calling convention.

    Boxed (one list argument) as AOTAutograd prefers; the flag is an instance attribute so that
    ``functools.wraps`` wrappers (dynamo's ``disable`` around backward graphs) carry it too.
    """

    def __init__(self, program: FxProgram, runner: Callable):
        self._boxed_call = True
        self.program = program
        self.runner = runner

    def __call__(self, *args: Any) -> Any:
        fx_args = _unbox(args)
        results = self.runner(*self.program.graph_inputs(fx_args))
        return self.program.fx_outputs(fx_args, results)


class _Specializing:
    """A graph with symbolic sizes: compiled anew for each concrete input signature."""

    def __init__(self, backend: TilefuseBackend, gm: fx.GraphModule, name: str):
        self._boxed_call = True
        self.backend = backend
        self.gm = gm
        self.name = name
        self.cache: dict[tuple, Callable] = {}

    def __call__(self, *args: Any) -> Any:
        fx_args = _unbox(args)
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in fx_args)
        fn = self.cache.get(key)
        if fn is None:
            fn = self.cache[key] = self._specialize(fx_args)
        return fn(fx_args)

    def _specialize(self, args: list) -> Callable:
        from torch.fx.experimental.proxy_tensor import make_fx

        name = f"{self.name}_static{len(self.cache)}"
        try:
            static = make_fx(self.gm, tracing_mode="fake")(*args)
        except Exception as e:  # noqa: BLE001
            self.backend._fail(f"{name}: cannot specialize symbolic shapes ({type(e).__name__}: {_first_line(e)})")
            return _boxed(self.gm)
        return self.backend.compile_graph(static, args, name)


def _boxed(gm: fx.GraphModule) -> Callable:
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(gm)


def _is_dynamo_signal(e: Exception) -> bool:
    from torch._dynamo import exc

    signals = tuple(getattr(exc, n) for n in ("RestartAnalysis", "TensorifyScalarRestartAnalysis") if hasattr(exc, n))
    return isinstance(e, signals)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def make_backend(options: Options | None = None) -> TilefuseBackend:
    """A dynamo backend (``torch.compile(model, backend=make_backend(options))``) compiling with ``options``."""
    return TilefuseBackend(options)


def tilefuse_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kw: Any) -> Callable:
    """The registered ``"tilefuse"`` backend: default options, or those given as
    ``torch.compile(..., backend="tilefuse", options={"target": "cuda", "fuse": False})``."""
    given = dict(kw.pop("options", None) or {})
    kw.pop("mode", None)
    fields = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(given) - fields)
    if unknown:
        log.warning("tilefuse: unknown options %s ignored; known: %s", unknown, sorted(fields))
    opts = {k: v for k, v in given.items() if k in fields}
    if "target" in opts:
        opts["target"] = parse_target(opts["target"])
    return make_backend(Options(**opts))(gm, example_inputs, **kw)

"""The ``torch.compile`` backend: dynamo graph -> AOTAutograd (ATen, forward and backward) -> tilefuse.

``torch.compile(model, backend="tilefuse")`` finds ``tilefuse_backend`` through the
``torch_dynamo_backends`` entry point; ``tilefuse.compile(model, ...)`` goes through ``make_backend``.

Note: AOTAutograd hands each forward, backward or inference graph to ``TilefuseBackend.compile_graph``
as ATen; it is imported with ``import_fx_program`` and compiled by ``tilefuse.pipeline.build_runner``. The
compiled function uses AOTAutograd's boxed calling convention (one list argument, cleared by the callee). A graph with
symbolic sizes (dynamo's automatic dynamic shapes, after a recompile) is specialized: on each new
concrete signature it is re-traced with ``make_fx`` at those sizes and compiled as a static graph.
Nothing ever crashes a model: a graph that cannot be imported or planned runs as traced, through
torch, with a warning naming why (and the reason is kept in ``TilefuseBackend.failures``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import operator
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tilefuse import graph_cache, ops
from tilefuse.config import Options, parse_target
from tilefuse.frontends.fx import FxProgram, import_fx_program, is_symbolic, warn_fallback
from tilefuse.lowering.tuning_db import TuningDB, TuningDBError
from tilefuse.pipeline import build_runner
from tilefuse.planner.sparsity import SparsityLog, freeze_linear_weights
from tilefuse.runtime.distributed import from_rank0, rank, world_size
from tilefuse.runtime.serialize import graph_to_json

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
        self.sparsity = SparsityLog()  # the sparsity report of every graph compiled (Options.sparsity)
        self.param_names: dict[int, str] = {}  # id(parameter) -> its name in the module: frozen weights' names
        self._ids = itertools.count()
        self.graph_choices: dict[str, str] = {}  # dynamo graph -> "tilefuse" or "torch" (_WholeGraphChoice), with times
        self.cached: list[str] = []  # dynamo graphs compiled from the graph cache's import, without AOTAutograd
        self.__name__ = "tilefuse"

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **kw: Any) -> Callable:
        if kw:
            log.warning("tilefuse: ignoring backend arguments %s (pass options to make_backend)", sorted(kw))
        from torch._dynamo.backends.common import aot_autograd

        graph_id = next(self._ids)
        # a graph compiled before (this process or another) is planned from its cached import, without AOTAutograd
        cache_key = None if self.options.sparsity else graph_cache.key(gm, example_inputs)
        if cache_key is not None:
            fn = self._from_cache(cache_key, gm, graph_id)
            if fn is not None:
                return fn
        compiled: list[tuple[str, Any]] = []  # (kind, what compile_graph returned) for this dynamo graph
        plain: list[frozenset[int]] = []  # an inference graph's static inputs, where it may be cached (plain_inference)
        # Sparsity prunes constant weights: the inference graph's parameters are frozen into constants, so
        # keep the real tensors dynamo passes here (AOTAutograd hands the compilers fake ones).
        real = [list(example_inputs)] if self.options.sparsity else []

        def compiler(kind: str) -> Callable:
            def compile_one(g, ex):
                frozen = real.pop() if real else None
                frozen = frozen if kind == "inference" else None
                static = _static_input_indices() if kind != "backward" else frozenset()
                if kind == "inference" and cache_key is not None and graph_cache.plain_inference(g, example_inputs):
                    plain.append(static)
                fn = self.compile_graph(g, ex, f"graph{graph_id}_{kind}", frozen, static)
                compiled.append((kind, fn))
                return fn
            return compile_one

        # keep_inference_input_mutations: an inference graph's in-place updates of its inputs (a static KV cache's
        # index_copy_) stay in the graph as copy_ into them, which the import does in place (FxProgram.mutations)
        # instead of AOTAutograd copying each updated input back whole after every call.
        aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           inference_compiler=compiler("inference"), decompositions=decompositions(),
                           keep_inference_input_mutations=True)
        try:
            fn = aot(gm, example_inputs)
        except Exception as e:
            if _is_dynamo_signal(e) or isinstance(e, RankAlone):
                raise
            self._fail(f"graph{graph_id}: AOTAutograd failed ({type(e).__name__}: {_first_line(e)})")
            return gm.forward
        if plain and len(compiled) == 1 and isinstance(compiled[0][1], _Compiled) \
                and not compiled[0][1].program.mutations:
            graph_cache.store(cache_key, compiled[0][1].program, plain[0])
        runners = [c.runner for kind, c in compiled if kind == "inference" and isinstance(c, _Compiled)
                   and not c.program.mutations]
        return self._whole_graph(fn, gm, graph_id, runners, len(compiled))

    def _whole_graph(self, fn: Callable, gm: fx.GraphModule, graph_id: int, runners: list, graphs: int) -> Callable:
        """``fn``, or where the target weighs whole graphs (``WHOLE_GRAPH_TARGETS``) and dynamo's graph became one
        inference plan, the faster of that plan and dynamo's graph (``_WholeGraphChoice``)."""
        if self.options.measure and self.options.target.get("kind") in WHOLE_GRAPH_TARGETS \
                and len(runners) == graphs == 1:
            return _WholeGraphChoice(fn, gm, f"graph{graph_id}", runners[0], self.graph_choices, self.options.target)
        return fn

    def _from_cache(self, cache_key: str, gm: fx.GraphModule, graph_id: int) -> Callable | None:
        """Dynamo's graph ``gm`` compiled from the import the graph cache kept under ``cache_key`` (``graph_cache``),
        called as AOTAutograd's wrapper calls an inference graph; None on a miss, or where the cached program does
        not plan (the compile then takes the whole path, which reports why)."""
        t0, name = time.perf_counter(), f"graph{graph_id}"
        got = graph_cache.load(cache_key, f"{name}_inference")
        if got is None:
            return None
        program, static = got
        try:
            compiled = self._plan(program, static, None, t0)
        except Exception as e:  # noqa: BLE001
            log.debug("tilefuse: %s: the cached import does not plan (%s); compiling the graph anew", name, e)
            return None
        for op in program.fallback_ops:
            warn_fallback(op, "(cached)", "as when this graph was first imported")
        self.cached.append(name)
        fn = torch._dynamo.disable(_Inference(compiled), reason="do not trace tilefuse's compiled graph")
        return self._whole_graph(fn, gm, graph_id, [compiled.runner], 1)

    def compile_graph(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str,
                      real_inputs: Sequence[Any] | None = None, static_inputs: Collection[int] = ()) -> Callable:
        """Compile one ATen graph; returns a boxed callable (AOTAutograd's calling convention). With
        ``Options.sparsity``, ``real_inputs`` (dynamo's, parameters included) let it freeze linear weights.
        ``static_inputs``: positions of ``gm``'s placeholders that keep their address across calls (parameters
        and buffers): CUDA-graph replays read them in place instead of copying them in."""
        if is_symbolic(gm):
            return _Specializing(self, gm, name, static_inputs)
        t0 = time.perf_counter()
        try:
            program = import_fx_program(gm, example_inputs, name)
        except Exception as e:  # noqa: BLE001  (the graph then runs as traced, through torch)
            self._fail(f"{name}: cannot import ({type(e).__name__}: {_first_line(e)})")
            return _boxed(gm)
        try:
            compiled = self._plan(program, static_inputs, (gm, real_inputs) if self.options.sparsity else None, t0)
        except Exception as e:
            if world_size() > 1 and _exchanges(program):
                raise RankAlone(f"tilefuse: {name}: cannot plan on rank {rank()} ({type(e).__name__}: "
                                f"{_first_line(e)}). The graph exchanges tensors with the other ranks, whose plans "
                                "may wait in broadcasts this rank would skip: running it through torch on this rank "
                                "alone could hang them all, so the compile stops here") from e
            self._fail(f"{name}: cannot plan ({type(e).__name__}: {_first_line(e)})")
            return _boxed(gm)
        return compiled

    def _plan(self, program: FxProgram, static_inputs: Collection[int], freeze: tuple | None, t0: float) -> _Compiled:
        """``program`` planned and lowered (``build_runner``); ``freeze``: the ATen graph and real inputs whose linear
        weights sparsity freezes; ``t0``: when its import began (the runner's "import" phase)."""
        name = program.graph.name
        inputs = None
        with unset_fake_temporarily():
            if freeze is not None:
                program, inputs = self._freeze(freeze[0], program, freeze[1], name)
            # inputs updated in place are read in place by CUDA graphs too: the update must land in them
            mutated = set(program.mutated_inputs)
            static = [j for j, i in enumerate(program.input_indices) if i in static_inputs or j in mutated]
            # dynamo's guards check the inputs' shapes and dtypes before every call: the runner need not
            # (about 1 us an input on the hot path, 150 inputs for GPT-2)
            t1 = time.perf_counter()
            runner = build_runner(program.graph, self.options, inputs, static, check=False,
                                  updates=program.input_updates)
            runner.phases = {"import": t1 - t0, **runner.phases}  # (the ATen graph into tilefuse's)
        if getattr(runner, "sparsity_report", None) is not None:
            self.sparsity.reports.append(runner.sparsity_report)
        self.programs.append(program)
        if self.options.verbose:
            log.info("tilefuse: %s", getattr(runner, "summary", lambda: name)())
        return _Compiled(program, runner)

    def _freeze(self, gm: fx.GraphModule, program: FxProgram, real: Sequence[Any] | None, name: str):
        """``program`` with its parameters that are read only as linear weights made constants (sparsity
        prunes constants), and the real inputs left to it; unchanged (with a warning) when that is not safe."""
        if real is None:
            log.warning("tilefuse: %s: sparsity applies to static-shape inference graphs (run the model under "
                        "torch.no_grad(), without dynamic shapes); this graph keeps its dense weights", name)
            return program, None
        vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        if len(vals) != len(real) or not all(_same_tensor_type(v, r) for v, r in zip(vals, real)):
            log.warning("tilefuse: %s: cannot match AOTAutograd's inputs to the module's parameters; sparsity is "
                        "not applied to this graph", name)
            return program, None
        names = [v.name for v in program.graph.inputs]
        params = {v: real[i] for v, i in zip(names, program.input_indices) if isinstance(real[i], torch.nn.Parameter)}
        labels = {v: self.param_names[id(t)] for v, t in params.items() if id(t) in self.param_names}
        graph = freeze_linear_weights(program.graph, params, labels)
        kept = {v.name for v in graph.inputs}
        indices = tuple(i for v, i in zip(names, program.input_indices) if v in kept)
        return dataclasses.replace(program, graph=graph, input_indices=indices), [real[i] for i in indices]

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


class _Inference:
    """A cached inference graph (``graph_cache``) called as AOTAutograd's runtime wrapper calls it: dynamo's arguments
    as they are, autograd off for the call (no input mutated, every output fresh: nothing else to do)."""

    def __init__(self, compiled: _Compiled):
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            return self.compiled(list(args))
        finally:
            if grad:
                torch._C._set_grad_enabled(True)


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
        if self.program.mutations:
            self.program.write_back(fx_args, results)
        return self.program.fx_outputs(fx_args, results)


# Targets where the measured choice also weighs the whole compiled graph against dynamo's own graph run by torch.
# On the CPU, per-region choices do not add up: each region is timed alone, while in the model a kernel's OpenMP
# fork and join and the caches between regions cost more, and running the plan costs Python time eager does not pay
# (2 cores, 2026-12-01: with every region given to torch BERT ran 6.1 ms, dynamo's graph 5.06, eager 5.16).
WHOLE_GRAPH_TARGETS = ("c",)
WHOLE_GRAPH_ROUNDS = 15
# The plan is kept only where it is this much faster than dynamo's graph: within the timing noise of a shared CPU
# (+-3% between runs of the same graph) the graph that runs eager's own ops is the safe side.
WHOLE_GRAPH_MARGIN = 0.97


class _WholeGraphChoice:
    """An inference graph that runs whichever is faster on its first call's inputs: its compiled plan (after that
    plan's own first call, which makes the per-region choices) or dynamo's graph through torch. Both compute the
    same ops; the timings interleave the two (``WHOLE_GRAPH_ROUNDS`` calls each, median), and the plan must win by
    ``WHOLE_GRAPH_MARGIN``. Taken only for graphs
    without input mutations (each is run several times), and not while autograd records (a training call keeps the
    plan). The choice is kept on the runner (``PlanRunner.graph_backend``), in ``choices`` and in the tuning database
    (keyed by the graph's structure: a later process takes it without timing)."""

    def __init__(self, compiled: Callable, gm: fx.GraphModule, name: str, runner: Any, choices: dict[str, str],
                 target: dict | None = None):
        self.compiled, self.gm, self.name, self.runner, self.choices = compiled, gm, name, runner, choices
        self.target = target or {"kind": "c"}
        self.fn: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        if self.fn is not None:
            return self.fn(*args)
        out = self.compiled(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            self.fn = self.compiled
            return out
        ways = {"tilefuse": self.compiled, "torch": self.gm.forward}
        plan = getattr(self.runner, "plan", None)
        key, db = _graph_key(plan), TuningDB()
        stored = db.get(key, self.target, "whole") if key is not None else None
        # a plan with collectives: every rank times (its calls exchange tensors) or none does, as rank 0's database
        # says, and runs rank 0's way (ranks with databases of their own would otherwise make different numbers of
        # calls, and wait in collectives that never come)
        stored = from_rank0(stored, plan)
        if stored is not None and stored.get("runs") in ways:
            way, ms = stored["runs"], {w: stored.get(f"{w}_ms", float("nan")) for w in ways}
        else:
            times: dict[str, list[float]] = {w: [] for w in ways}
            for _ in range(WHOLE_GRAPH_ROUNDS):
                for w, fn in ways.items():
                    t0 = time.perf_counter()
                    fn(*args)
                    times[w].append(time.perf_counter() - t0)
            ms = {w: sorted(t)[len(t) // 2] * 1e3 for w, t in times.items()}
            way = "tilefuse" if ms["tilefuse"] < WHOLE_GRAPH_MARGIN * ms["torch"] else "torch"
            way = from_rank0(way, plan)
            if key is not None:
                try:
                    db.put(key, self.target, {"runs": way, "tilefuse_ms": ms["tilefuse"], "torch_ms": ms["torch"]},
                           "whole")
                except TuningDBError as e:
                    log.warning("tilefuse: %s: the whole-graph choice is not remembered: %s", self.name, e)
        self.fn = ways[way]
        self.runner.graph_backend = way
        self.choices[self.name] = f"{way} (plan {ms['tilefuse']:.3f} ms, dynamo's graph through torch {ms['torch']:.3f} ms)"
        log.info("tilefuse: %s runs %s", self.name, self.choices[self.name])
        return out


@dataclasses.dataclass(frozen=True)
class _GraphKey:
    """What the tuning database keys a whole graph's choice by (``tuning_db.db_key`` reads these fields)."""

    template: str
    params: tuple
    out_idx: tuple = ()


def _graph_key(plan: Any) -> _GraphKey | None:
    """The key of a plan's graph: a digest of its structure (ops, attributes, types; not its name, not weights);
    None where the graph has an attribute JSON cannot hold."""
    try:
        doc = graph_to_json(plan.graph)
    except Exception:  # noqa: BLE001 -- then the choice is made again in each process
        return None
    doc.pop("name", None)
    return _GraphKey("graph", (("digest", hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()),))


class _Specializing:
    """A graph with symbolic sizes: compiled anew for each concrete input signature. A symbolic int that only feeds
    int arithmetic the graph returns (``_int_only_inputs``: Gemma 2's sliding cache hands back its length + 1 each
    decode step) is no part of the signature: those outputs are computed here from the call's ints."""

    def __init__(self, backend: TilefuseBackend, gm: fx.GraphModule, name: str, static_inputs: Collection[int] = ()):
        self._boxed_call = True
        self.backend = backend
        self.gm = gm
        self.name = name
        self.static_inputs = static_inputs  # make_fx keeps the placeholders' order
        self.cache: dict[tuple, Callable] = {}
        self.varying = _varying_inputs(gm)
        self.int_only, self.int_outputs = _int_only_inputs(gm)
        if self.varying is not None:
            self.varying = tuple(i for i in self.varying if i not in self.int_only)

    def __call__(self, *args: Any) -> Any:
        fx_args = _unbox(args)
        # keyed by the inputs that can vary between calls that reach this graph (a decode step: 3 of its 100)
        pick = [a for i, a in enumerate(fx_args) if i not in self.int_only] if self.varying is None else \
            [fx_args[i] for i in self.varying]
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                    for a in pick)
        ints = _int_results(self.gm, fx_args, self.int_outputs) if self.int_outputs else {}
        fn = self.cache.get(key)
        if fn is None:
            fn = self.cache[key] = self._specialize(fx_args)
        out = fn(fx_args)
        if not ints:
            return out
        out = list(out)
        for i, v in ints.items():
            out[i] = v
        return out

    def _specialize(self, args: list) -> Callable:
        from torch.fx.experimental.proxy_tensor import make_fx

        name = f"{self.name}_static{len(self.cache)}"
        try:
            static = make_fx(self.gm, tracing_mode="fake")(*args)
        except Exception as e:  # noqa: BLE001
            self.backend._fail(f"{name}: cannot specialize symbolic shapes ({type(e).__name__}: {_first_line(e)})")
            return _boxed(self.gm)
        return self.backend.compile_graph(static, args, name, static_inputs=self.static_inputs)


def _varying_inputs(gm: fx.GraphModule) -> tuple[int, ...] | None:
    """Positions of a graph's inputs that can differ between calls reaching it: symbolic ints, and tensors with a
    symbolic size or stride. Dynamo's guards fix every other input's shape, strides, dtype and device before the call
    gets here. None where a placeholder carries no example value: then every input is keyed."""
    out = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        if val is None:
            return None
        if not isinstance(val, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
            out.append(i)
    return tuple(out)


def _int_only_inputs(gm: fx.GraphModule) -> tuple[frozenset[int], dict[int, fx.Node]]:
    """Positions of the symbolic-int inputs that reach nothing but int arithmetic (``operator``'s, on SymInts) and
    the graph's outputs, and the outputs those compute (by output position). Such an input changes no shape and no
    tensor: a specialization need not be keyed by it."""
    arith = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg}
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out_node is None or not out_node.args or not isinstance(out_node.args[0], (tuple, list)):
        return frozenset(), {}

    def reach(n: fx.Node, seen: set) -> bool:  # n and what it feeds: int arithmetic up to the output only
        for u in n.users:
            if u.op == "output":
                continue
            if u.op != "call_function" or u.target not in arith or not isinstance(u.meta.get("val"), torch.SymInt):
                return False
            if u not in seen:
                seen.add(u)
                if not reach(u, seen):
                    return False
        return True

    only, nodes = set(), set()
    for i, n in enumerate(places):
        seen: set = set()
        if isinstance(n.meta.get("val"), torch.SymInt) and reach(n, seen):
            only.add(i)
            nodes |= seen | {n}
    # an output all of whose inputs come from those inputs (a node mixing in another input keeps the key)
    ok = {n for n in nodes if all(a in nodes for a in n.all_input_nodes)}
    outs = {i: a for i, a in enumerate(out_node.args[0]) if isinstance(a, fx.Node) and a in ok}
    if any(n in nodes and n not in ok for n in gm.graph.nodes):  # int arithmetic also reading another input
        return frozenset(), {}
    return frozenset(only), outs


def _int_results(gm: fx.GraphModule, args: Sequence, outputs: dict[int, fx.Node]) -> dict[int, Any]:
    """The values of ``outputs`` (int arithmetic on int inputs, ``_int_only_inputs``) for this call's ``args``."""
    env: dict[fx.Node, Any] = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), args))

    def value(n: fx.Node) -> Any:  # (only the int arithmetic the outputs need: nothing else of the graph runs here)
        if n not in env:
            env[n] = n.target(*fx.node.map_arg(n.args, value), **fx.node.map_arg(n.kwargs, value))
        return env[n]
    return {i: value(n) for i, n in outputs.items()}


def _static_input_indices() -> frozenset[int]:
    """Positions of the graph's inputs that AOTAutograd records as keeping their address (parameters and
    buffers), read from the tracing context it compiles under; empty where there is none."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return frozenset(getattr(meta, "static_input_indices", None) or ())


def _same_tensor_type(fake: Any, real: Any) -> bool:
    return isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor) and \
        tuple(fake.shape) == tuple(real.shape) and fake.dtype == real.dtype


class RankAlone(RuntimeError):
    """A graph with collectives that one rank of several cannot plan: not run through torch on that rank alone."""


def _exchanges(program: FxProgram) -> bool:
    """Whether ``program``'s graph has a collective (an op with the ``collective`` trait)."""
    return any("collective" in ops.get(n.op).traits for n in program.graph.nodes)


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

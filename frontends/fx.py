"""Import an ATen-level torch.fx graph (what AOTAutograd hands a backend) into a tilefuse ``Graph``.

Note: each ``call_function`` node is looked up in the converter table (``aten_table.CONVERTERS``,
by overload, then by overload packet). A converter returns the value names of the op's outputs; it
returns ``None`` when it does not apply (an argument it cannot express), and the node then becomes a
``torch_fallback`` node that runs the ATen op through torch; so does every op the table does not
know. Each fallback op is logged once per process, at warning level, on ``logging.getLogger("tilefuse")``.
Every converted value is checked against the fx node's fake-tensor metadata (shape and dtype); a
converter that disagrees is treated as not applying. A collective (``_c10d_functional``: ``c10d_table``) without
a converter becomes a ``collective_fallback`` node instead, and a collective whose result nothing reads is made a
graph output: every rank must issue it, so no pass may drop it as dead. Ops that create tensors from nothing
(``arange``, ``full``, ``scalar_tensor``, ...) are evaluated once here and become constants, so the
graph stays device-agnostic. Placeholders stay graph inputs (under AOTAutograd parameters are inputs).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from tilefuse.ir import Graph, TensorType, dtype_name, torch_dtype
from tilefuse.ops import COLLECTIVES, MAY_ALIAS, GraphBuilder, fallback

from .aten_table import CONVERTERS, GENERATORS
from .c10d_table import is_collective
from .fx_context import Ctx, FxImportError, tensor_type, used

log = logging.getLogger("tilefuse")
# A generator's result with more elements than this that holds one value throughout is not folded into a constant
# (an expand of a 0-d one instead: ``_Importer._uniform``).
FOLD_NUMEL = 1 << 16

aten = torch.ops.aten

# Functional scatters AOTAutograd makes of in-place updates (``cache.index_copy_(...)``), by the in-place op that
# writes the input itself: a static KV cache then takes each step's new rows where it lives, with no copy of it.
_IN_PLACE = {aten.index_copy.default: aten.index_copy_.default, aten.index_put.default: aten.index_put_.default}


@dataclass(frozen=True)
class OutSpec:
    """Where one fx output comes from: ``"graph"`` output ``index`` of the graph (``copy``: it may be an
    input or constant tensor itself, so hand out a copy), ``"input"``: placeholder ``index`` unchanged,
    ``"value"``: the Python ``value`` (``None``, a number)."""

    kind: str
    index: int = -1
    copy: bool = False
    value: Any = None
    device: torch.device | None = None  # where torch puts a "graph" output (the plan may compute it elsewhere)


@dataclass(frozen=True)
class FxProgram:
    """An imported fx graph with its calling convention.

    ``input_indices`` are the positions of the fx placeholders that became graph inputs, in graph
    input order (non-tensor placeholders are baked in). ``outputs`` mirrors the fx graph's output
    structure (tuples and lists) with an ``OutSpec`` per leaf. ``fallback_ops`` names the ATen ops
    that became ``torch_fallback`` nodes. ``mutations`` are the graph's in-place updates of its inputs
    (``copy_`` into a placeholder, as AOTAutograd keeps them): (fx argument position, graph output index)
    pairs, written back into the caller's tensor after each run (``write_back``); an update the importer
    made in place (``index_copy_`` on the input itself) is that very tensor, and costs nothing.
    """

    graph: Graph
    input_indices: tuple[int, ...]
    outputs: Any
    fallback_ops: tuple[str, ...]
    mutations: tuple[tuple[int, int], ...] = ()

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        """Positions among the graph's inputs (not the fx arguments) that the graph updates in place."""
        return tuple(self.input_indices.index(i) for i, _ in self.mutations if i in self.input_indices)

    @property
    def input_updates(self) -> tuple[tuple[int, int], ...]:
        """(graph output, graph input) positions of the mutations whose new value the fx graph does not also return:
        a runner may write them into the input itself (then ``write_back`` finds the caller's tensor and skips it)."""
        returned: set[int] = set()

        def walk(spec: Any) -> None:
            if isinstance(spec, (list, tuple)):
                for s in spec:
                    walk(s)
            elif spec.kind == "graph":
                returned.add(spec.index)

        walk(self.outputs)
        return tuple((k, self.input_indices.index(i)) for i, k in self.mutations
                     if i in self.input_indices and k not in returned)

    def write_back(self, args: Sequence[Any], results: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """Apply the graph's input mutations to the caller's tensors (across devices where the plan ran
        elsewhere); returns the positions of the arguments copied into. A result that already is the caller's
        tensor, or a view of all of it, is left alone."""
        copied = []
        for i, k in self.mutations:
            dst, src = args[i], results[k]
            if src is dst or (src.data_ptr() == dst.data_ptr() and src.device == dst.device
                              and src.shape == dst.shape and src.stride() == dst.stride()):
                continue
            dst.copy_(src)
            copied.append(i)
        return tuple(copied)

    def graph_inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """Pick the graph's inputs out of the fx graph's arguments."""
        return [args[i] for i in self.input_indices]

    def fx_outputs(self, args: Sequence[Any], results: Sequence[torch.Tensor]) -> Any:
        """Assemble what the fx graph returns from its arguments and the graph's results."""
        return _assemble(self.outputs, args, results)


def _assemble(spec: Any, args: Sequence[Any], results: Sequence[torch.Tensor]) -> Any:
    """``FxProgram.fx_outputs`` for one output spec. A module-level function, not a closure that calls itself: such a
    closure is a reference cycle holding the call's results until the garbage collector runs, so each call's outputs
    outlived it and the allocator took fresh memory for the next (the zoo LLaMA's 500 MB logits: a cudaMalloc a call
    on the H200)."""
    if isinstance(spec, (list, tuple)):
        return type(spec)(_assemble(s, args, results) for s in spec)
    if spec.kind == "graph":
        r = results[spec.index]
        if spec.device is not None and r.device != spec.device:
            return r.to(spec.device)  # a host value (a position, a flag) the plan computed on the GPU
        return r.clone() if spec.copy else r
    return args[spec.index] if spec.kind == "input" else spec.value


def import_fx(gm: fx.GraphModule, example_inputs: Sequence[Any], name: str | None = None) -> Graph:
    """Convert an ATen-level fx graph onto registry ops; ``example_inputs`` (real or fake tensors)
    give placeholder types where the graph carries no ``meta["val"]``. Returns the tilefuse Graph;
    its inputs are the tensor placeholders in order (see ``import_fx_program`` for the mapping)."""
    return import_fx_program(gm, example_inputs, name).graph


def import_fx_program(gm: fx.GraphModule, example_inputs: Sequence[Any], name: str | None = None) -> FxProgram:
    """Like ``import_fx`` but returns the ``FxProgram`` (graph plus calling convention)."""
    for n in gm.graph.nodes:
        if n.op in ("call_module", "call_method"):
            raise FxImportError(f"node {n.name!r} is a {n.op}: the graph is not ATen-level; import_fx expects a "
                                "graph from AOTAutograd or make_fx")
    if any("val" not in n.meta for n in gm.graph.nodes if n.op == "placeholder"):
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm).propagate(*example_inputs)
    if is_symbolic(gm):
        raise FxImportError("the graph has symbolic shapes; specialize it to concrete shapes first")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # backends are called under AOTAutograd's fake mode; constants must be real
        return _Importer(gm, example_inputs, name or type(gm).__name__).run()


def is_symbolic(gm: fx.GraphModule) -> bool:
    """Whether any placeholder of ``gm`` is a SymInt or a tensor with a symbolic size."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape):
            return True
    return False


# Process-wide, like the ``warnings`` registry: each fallback op type is reported once, not per graph.
_WARNED: set[str] = set()


def warn_fallback(target: str, node: str, why: str) -> None:
    if target not in _WARNED:
        _WARNED.add(target)
        log.warning("tilefuse: %s (node %s) runs through torch as torch_fallback: %s; add a converter to "
                    "frontends/aten_table.py to compile it", target, node, why)


def bind(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Name an ATen call's arguments by its schema, filling in defaults."""
    out: dict[str, Any] = {}
    pos = list(args)
    for a in op._schema.arguments:
        if pos and not a.kwarg_only:
            out[a.name] = pos.pop(0)
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            raise FxImportError(f"{op}: missing argument {a.name!r}")
    return out


class _Ref(str):
    """A value name inside fx arguments being encoded for a fallback (tells it from a str argument)."""


class _Importer:
    """One import: walks the fx graph in order, filling a GraphBuilder."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str):
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.b = GraphBuilder(name)
        self.env: dict[fx.Node, Any] = {}
        self.fallbacks: list[str] = []
        self.keep: set[str] = set()  # node names dead-code elimination must keep (mutating fallbacks)
        self.persistent: dict[str, str] = {}  # value -> "input"/"constant" when it may be that tensor itself
        self.input_indices: list[int] = []
        self._placeholders: dict[fx.Node, int] = {}
        self._scalars: dict[tuple, str] = {}
        self._attrs: dict[str, str] = {}
        # copy_ nodes writing a placeholder -> that placeholder; scatters done in place -> their in-place op
        self._copies, self._in_place = input_mutations(gm)
        self.mutations: list[tuple[fx.Node, str]] = []  # (placeholder, value it ends up holding), in order

    # -- the walk --------------------------------------------------------------------------------
    def run(self) -> FxProgram:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "get_attr":
                self.env[node] = self._get_attr(node)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                return self._finish(node)
            else:
                raise FxImportError(f"node {node.name!r}: {node.op} nodes are not ATen-level; import_fx expects "
                                    "a graph from AOTAutograd or make_fx")
        raise FxImportError("the fx graph has no output node")

    def _placeholder(self, node: fx.Node) -> None:
        i = len(self._placeholders)
        self._placeholders[node] = i
        val = node.meta.get("val")
        if val is None and i < len(self.example_inputs):
            val = self.example_inputs[i]
        if isinstance(val, torch.Tensor):
            name = self.b.input(node.name, tensor_type(val))
            self.persistent[name] = "input"
            self.input_indices.append(i)
            self.env[node] = name
        else:  # a non-tensor argument (an int size, None): baked into the graph
            self.env[node] = self.example_inputs[i] if i < len(self.example_inputs) else val

    def _get_attr(self, node: fx.Node) -> Any:
        if node.target in self._attrs:
            return self._attrs[node.target]
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            return obj
        name = self.b.constant(str(node.target), obj.detach())
        self.persistent[name] = "constant"
        self._attrs[node.target] = name
        return name

    def _call(self, node: fx.Node) -> Any:
        target = node.target
        if node in self._copies:  # an update of a graph input: written back after the run (FxProgram.write_back)
            value = self.env[node.args[1]]
            if not isinstance(value, str) or self.b.types[value] != tensor_type(node.meta["val"]):
                return self._aten(node, target)  # a broadcasting or casting copy_: torch does it in the plan
            self.mutations.append((self._copies[node], value))
            return node  # copy_ returns its destination: the placeholder, which holds the value after the run
        if node in self._in_place:
            return self._scatter_in_place(node)
        if target is operator.getitem:
            seq = self.env[node.args[0]]
            if not isinstance(seq, (list, tuple)):
                raise FxImportError(f"node {node.name!r}: getitem on {node.args[0]} which is not multi-output")
            return seq[node.args[1]]
        if isinstance(target, torch._ops.OpOverload):
            return self._aten(node, target)
        args = fx.node.map_arg((node.args, node.kwargs), lambda n: self.env[n])
        if callable(target) and not _has_values(args, self.b.types):
            return target(*args[0], **args[1])  # arithmetic on sizes and the like
        raise FxImportError(f"node {node.name!r} calls {getattr(target, '__name__', target)}, which is not an "
                            "ATen op; import_fx expects an ATen-level graph (AOTAutograd or make_fx)")

    def _aten(self, node: fx.Node, op: torch._ops.OpOverload) -> Any:
        raw = bind(op, node.args, node.kwargs)
        if op.overloadpacket in GENERATORS:
            folded = self._fold(node, op)
            if folded is not None:
                return folded
            return self._fallback(node, op, "could not evaluate it at import")
        conv = CONVERTERS.get(op) or CONVERTERS.get(op.overloadpacket)
        if conv is None:
            return self._fallback(node, op, "no converter")
        args = {k: fx.node.map_arg(v, lambda n: self.env[n]) for k, v in raw.items()}
        try:
            result = conv(Ctx(self, node, raw), args)
        except Exception as e:  # noqa: BLE001  (a converter bug or an inference error: never fatal)
            log.debug("tilefuse: converter for %s failed on node %s: %s", op, node.name, e)
            result = None
        why = "the converter does not apply to these arguments"
        if result is not None:
            mismatch = self._mismatch(node.meta.get("val"), result)
            if mismatch:
                log.warning("tilefuse: converter for %s gave %s on node %s; using torch instead", op, mismatch,
                            node.name)
                result, why = None, mismatch
        if result is None:
            return self._fallback(node, op, why)
        if isinstance(result, list) and any(r is None and used(node, k) for k, r in enumerate(result)):
            full = self._fallback(node, op, "outputs the converter does not give are used")
            result = [full[k] if r is None else r for k, r in enumerate(result)]
        return result

    def _mismatch(self, val: Any, result: Any) -> str | None:
        """Why ``result`` does not match the fx metadata ``val`` (None when it does)."""
        if val is None or result is None:
            return None
        if isinstance(val, torch.Tensor):
            if not isinstance(result, str):
                return f"{type(result).__name__} for a single tensor"
            got, want = self.b.types[result], tensor_type(val)
            return None if got == want else f"type {got} where torch has {want}"
        if isinstance(val, (list, tuple)):
            if not isinstance(result, (list, tuple)) or len(result) != len(val):
                return f"{result!r} for {len(val)} outputs"
            return next((m for v, r in zip(val, result) if (m := self._mismatch(v, r))), None)
        return None

    def _scatter_in_place(self, node: fx.Node) -> Any:
        """A functional scatter made in place on its input (``input_mutations``): ``index_copy`` along a static dim by
        a 1-D index as the registry's in-place ``index_copy`` (a kernel may write it); anything else as the in-place
        ATen op through torch."""
        op = self._in_place[node]
        if op is aten.index_copy_.default:
            x, dim, index, src = (self.env[a] if isinstance(a, fx.Node) else a for a in node.args[:4])
            if all(isinstance(v, str) for v in (x, index, src)) and isinstance(dim, int) and \
                    len(self.b.types[index].shape or ()) == 1 and self.b.types[index].dtype in ("int64", "int32"):
                (name,) = self.b.add("index_copy", [x, index, src], name=node.name, dim=dim)
                self.keep.add(self.b.nodes[-1].name)
                return name
        return self._fallback(node, op, "", warn=False)

    # -- fallbacks and folding -------------------------------------------------------------------
    def _fallback(self, node: fx.Node, op: torch._ops.OpOverload, why: str, warn: bool = True) -> Any:
        target = fallback.qualified_name(op)
        collective = is_collective(op)  # (runs through torch by design: no warning)
        if warn and not collective:
            warn_fallback(target, node.name, why)
        log.debug("tilefuse: node %s (%s) runs through torch: %s", node.name, target, why)
        inputs: list[str] = []
        position: dict[str, int] = {}

        def tensor_index(x: Any) -> int | None:
            if not isinstance(x, _Ref):
                return None
            if x not in position:
                position[x] = len(inputs)
                inputs.append(str(x))
            return position[x]

        def ref(n: fx.Node) -> Any:
            v = self.env[n]
            return _Ref(v) if isinstance(v, str) else v

        args, kwargs = fx.node.map_arg((node.args, node.kwargs), ref)
        enc_args = tuple(fallback.encode_arg(a, tensor_index) for a in args)
        enc_kwargs = tuple(sorted((k, fallback.encode_arg(v, tensor_index)) for k, v in kwargs.items()))
        val = node.meta.get("val")
        out_types = None
        layout: Any = None
        if val is not None:
            layout, leaves = fallback.flat_layout(val)
            out_types = [_leaf_type(v) for v in leaves]
        names = self.b.add("collective_fallback" if collective else "torch_fallback", inputs, name=node.name, out_types=out_types, target=target,
                           args=enc_args, kwargs=enc_kwargs)
        self.fallbacks.append(target)
        if op._schema.is_mutable:
            self.keep.add(self.b.nodes[-1].name)
        if layout is None:
            return names[0] if len(names) == 1 else names

        def rebuild(x: Any) -> Any:
            if isinstance(x, list):
                return [rebuild(i) for i in x]
            return None if leaves[x] is None else names[x]

        return rebuild(layout)

    def _fold(self, node: fx.Node, op: torch._ops.OpOverload) -> str | None:
        """Evaluate a tensor-creating op now (on the CPU) and make its result a constant; a large one whose elements
        all hold one value becomes that value as a 0-d constant, expanded (``_uniform``)."""
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.numel() > FOLD_NUMEL:
            uniform = self._uniform(node, op, val)
            if uniform is not None:
                return uniform

        def concrete(n: fx.Node) -> Any:
            v = self.env[n]
            if isinstance(v, str):
                t = self.b.types[v]
                return torch.zeros(t.shape, dtype=torch_dtype(t.dtype))
            return v

        args, kwargs = fx.node.map_arg((node.args, node.kwargs), concrete)
        kwargs = dict(kwargs)
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        kwargs.pop("pin_memory", None)
        try:
            t = op(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (then it runs through torch instead)
            log.debug("tilefuse: cannot fold %s (%s): %s", node.name, op, e)
            return None
        if "empty" in op.overloadpacket.__name__:
            t = torch.zeros_like(t)  # uninitialised memory: any value is right, pick a reproducible one
        name = self.b.constant(node.name, t)
        if self._mismatch(node.meta.get("val"), name):
            return None
        self.persistent[name] = "constant"
        return name

    def _uniform(self, node: fx.Node, op: torch._ops.OpOverload, val: torch.Tensor) -> str | None:
        """``op``'s result as an expand of its one value (``GENERATORS``), or None where its elements differ or the
        value is not a Python number. HF BERT's SDPA made each layer's float mask from ``zeros_like`` of the
        (32, 12, 512, 512) boolean one: folded, 12 constants of 403 MB (4.8 GB on the GPU, and 42 s of a cold
        compile to write them into the graph cache)."""
        value = GENERATORS[op.overloadpacket]
        if isinstance(value, str):
            value = bind(op, node.args, node.kwargs).get(value)
        if not isinstance(value, int | float):  # a SymInt, a tensor, None
            return None
        dtype = val.dtype
        name = self.add("expand", [self.scalar(torch.tensor(value, dtype=dtype).item(), dtype)], node.name,
                        {"shape": tuple(val.shape)})[0]
        return None if self._mismatch(val, name) else name

    # -- helpers the converters reach through Ctx ------------------------------------------------
    def add(self, op: str, inputs: Sequence[str | None], base: str, attrs: dict[str, Any]) -> list[str]:
        names = self.b.add(op, [i or "" for i in inputs], name=base, **attrs)
        # an output computed through an op that may share its input's storage (a view, a no-op cast) from a
        # graph input or constant may be that very tensor: the caller copies it before handing it out
        if op in MAY_ALIAS and inputs and inputs[0] in self.persistent:
            for n in names:
                self.persistent[n] = self.persistent[inputs[0]]
        return names

    def scalar(self, value: Any, dtype: torch.dtype) -> str:
        key = (dtype, type(value), repr(value))
        if key not in self._scalars:
            self._scalars[key] = self.b.constant("scalar", torch.tensor(value, dtype=dtype))
            self.persistent[self._scalars[key]] = "constant"
        return self._scalars[key]

    # -- the end ---------------------------------------------------------------------------------
    def _finish(self, node: fx.Node) -> FxProgram:
        graph_outputs: list[str] = []

        def spec(o: Any) -> Any:
            if isinstance(o, (list, tuple)):
                return type(o)(spec(x) for x in o)
            if isinstance(o, fx.Node) and self.env.get(o) is o:  # a copy_ into a placeholder: the caller's tensor
                o = self._copies[o]
            if isinstance(o, fx.Node) and o in self._placeholders:
                return OutSpec("input", self._placeholders[o])
            v = self.env[o] if isinstance(o, fx.Node) else o
            if isinstance(v, str):
                graph_outputs.append(v)
                val = o.meta.get("val") if isinstance(o, fx.Node) else None
                device = val.device if isinstance(val, torch.Tensor) else None
                return OutSpec("graph", len(graph_outputs) - 1, self._needs_copy(o, v), device=device)
            return OutSpec("value", value=v)

        outputs = spec(node.args[0])
        mutations = []
        for ph, value in self.mutations:
            graph_outputs.append(value)
            mutations.append((self._placeholders[ph], len(graph_outputs) - 1))
        graph_outputs += self._effects(graph_outputs)
        graph = _prune(self.b.build(graph_outputs), self.keep)
        return FxProgram(graph, tuple(self.input_indices), outputs, tuple(dict.fromkeys(self.fallbacks)),
                         tuple(mutations))

    def _effects(self, outputs: Sequence[str]) -> list[str]:
        """The outputs of the collectives that nothing the graph returns depends on (a wait whose result is unused),
        to be returned too: every rank must still issue them, in order, so no pass may drop them as dead."""
        live, effects = set(outputs), []
        for n in reversed(self.b.nodes):
            if n.name not in self.keep and not any(o.name in live for o in n.outputs):
                if n.op not in COLLECTIVES:
                    continue
                effects += [o.name for o in reversed(n.outputs)]
            live.update(i for i in n.inputs if i)
        return effects[::-1]

    def _needs_copy(self, o: fx.Node, value: str) -> bool:
        """An output computed as a copy in torch but that may be an input or constant tensor here.

        View ops are left alone for inputs: AOTAutograd regenerates outputs that alias inputs itself.
        """
        kind = self.persistent.get(value)
        if kind is None:
            return False
        target = o.target
        is_view = isinstance(target, torch._ops.OpOverload) and any(r.alias_info is not None
                                                                     for r in target._schema.returns)
        return not (is_view and kind == "input")


def input_mutations(gm: fx.GraphModule) -> tuple[dict[fx.Node, fx.Node], dict[fx.Node, Any]]:
    """The graph's updates of its inputs, as AOTAutograd leaves them (``keep_inference_input_mutations``): each
    ``copy_(placeholder, value)`` -> its placeholder; and the functional scatters (``_IN_PLACE``) that may run in
    place on the placeholder itself -> their in-place op. A scatter may when its placeholder is read by nothing
    else (no reader of the old value can then run after it), its result is what is copied back, and it does
    not accumulate."""
    copies: dict[fx.Node, fx.Node] = {}
    in_place: dict[fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not aten.copy_.default:
            continue
        dst, src = n.args[0], n.args[1]
        if not (isinstance(dst, fx.Node) and dst.op == "placeholder" and isinstance(src, fx.Node)) or \
                any(u.op != "output" for u in n.users):  # AOTAutograd's copy_ come last, read by nothing
            continue
        copies[n] = dst
        op = _IN_PLACE.get(src.target)
        accumulates = src.target is aten.index_put.default and (src.args[3:] or [src.kwargs.get("accumulate")])[0]
        if op is not None and src.args[0] is dst and set(dst.users) == {src, n} and not accumulates:
            in_place[src] = op
    return copies, in_place


def _has_values(args: Any, types: dict[str, TensorType]) -> bool:
    found = []
    fx.node.map_aggregate(args, lambda x: found.append(x) if isinstance(x, str) and x in types else None)
    return bool(found)


def _leaf_type(v: Any) -> TensorType:
    if isinstance(v, torch.Tensor):
        return tensor_type(v)
    if v is None:
        return TensorType((0,), "float32")
    return TensorType((), dtype_name(torch.tensor(v).dtype))


def _prune(graph: Graph, keep: set[str]) -> Graph:
    """Drop nodes nobody reads (converters may leave some, e.g. the ``t`` folded into ``linear``)."""
    live = set(graph.outputs)
    nodes = []
    for n in reversed(graph.nodes):
        if n.name in keep or any(o.name in live for o in n.outputs):
            nodes.append(n)
            live.update(i for i in n.inputs if i)
    constants = {k: t for k, t in graph.constants.items() if k in live}
    return graph.replace(nodes=tuple(reversed(nodes)), constants=constants).verify()

"""The op registry: each op declared once with its fusion kind, type inference and torch reference.

Note: type inference defaults to running the reference on meta tensors (one source of truth for
semantics and shapes). Symbolic dims are substituted by distinct large primes for the meta run and
mapped back afterwards; a dim that is not one of them (``batch*seq`` after a reshape, say) becomes a
fresh symbol. An op whose output shape depends on data (``nonzero``, a reshape whose target shape is
a runtime tensor) gets an unknown shape; the runtime still executes it through its reference.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from tilefuse import ir
from tilefuse.ir import TensorType, dtype_name, torch_dtype


class OpKind(str, enum.Enum):
    """How an op fuses (TVM Relax's vocabulary, plus our anchors)."""

    ELEMENTWISE = "elementwise"  # same-shape, one output element from the same input elements
    BROADCAST = "broadcast"  # elementwise with numpy broadcasting between inputs
    INJECTIVE = "injective"  # each output element reads one input element (reshape, slice, ...)
    REDUCTION = "reduction"  # reduces along axes (sum, softmax, norms)
    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    OPAQUE = "opaque"  # anything else: runs as its own kernel / through torch


FUSIBLE_POINTWISE = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST})

# Facts about an op that passes ask by name (TVM Relax's op attributes), set where the op is registered;
# ``with_trait`` gives the ops that have one (planner.plan.VIEW_OPS is ``with_trait("view")``).
TRAITS = {
    "view": "metadata only: no data moves when the input is contiguous (reshape, squeeze, ...)",
    "may_alias": "the output may share the (first) input's storage (a view, a no-op cast)",
    "permute": "reorders axes only (permute, transpose)",
    "slicing": "takes a part of its input along one dim (slice, split)",
    "epilogue": "a template's epilogue/prologue expression may compute it (lowering/expr.py has its emitter)",
    "float_only": "in a fused expression its integer and bool operands are widened to float32 first",
    "norm": "a normalization over the last dims (layer_norm, rms_norm): an add before it fuses into its kernel",
    "pool": "a pooling window (max, average, adaptive average)",
    "axis": "pointwise, but an attribute or an operand names an axis: not free of the layout",
    "fold_dynamic": "shape arithmetic whose output size depends on its inputs' values but is no larger than them: "
                    "folded when every input is a constant (range_dynamic: the ONNX Range converter bounds the count)",
    "in_place": "writes into its first input's memory and returns it (a static KV cache's ``index_copy_``): made only "
                "where nothing reads that input otherwise (frontends.fx.input_mutations); a kernel stores there",
    "collective": "a collective or its wait (tilefuse/ops/collective.py): a side effect every rank takes part in, in the "
                  "same order: its own region, in program order, never fused, dropped or duplicated; runs through torch",
}


@dataclass(frozen=True)
class OpSpec:
    """One op: ``ref(*tensors, **attrs)`` returns a tensor or a tuple of tensors."""

    name: str
    kind: OpKind
    ref: Callable[..., Any]
    infer: Callable[[Sequence[TensorType | None], dict[str, Any]], list[TensorType]] | None = None
    num_outputs: int = 1
    doc: str = ""
    traits: frozenset[str] = frozenset()  # names from TRAITS
    # (ref, a node's attrs) -> the reference that node runs with where it keeps state between calls (a convolution's
    # weight rearranged once, ``ops.nn.conv``); None: ``ref`` itself
    per_node: Callable[[Callable[..., Any], dict[str, Any]], Callable[..., Any]] | None = None

    def run(self, inputs: Sequence[torch.Tensor | None], attrs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        out = self.ref(*inputs, **attrs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def for_node(self, attrs: dict[str, Any]) -> OpSpec:
        """This op as a node with ``attrs`` runs it, called again and again (``NodesFn``): ``per_node``'s reference."""
        return self if self.per_node is None else replace(self, ref=self.per_node(self.ref, attrs))


class UnsupportedOpError(NotImplementedError):
    """An op that the registry does not know."""


class InferenceError(ValueError):
    """Type inference failed: wrong shapes, dtypes or attributes for an op."""


_REGISTRY: dict[str, OpSpec] = {}


def register(name: str, kind: OpKind, *, infer=None, num_outputs: int = 1, traits: Iterable[str] = (),
             per_node=None):
    """Decorator: declare the op ``name`` with the decorated function as its torch reference and the facts
    ``traits`` (names from ``TRAITS``) about it; ``per_node``: ``OpSpec.per_node``."""
    traits = frozenset(traits)
    unknown = traits - TRAITS.keys()
    if unknown:
        raise ValueError(f"op {name!r}: unknown traits {sorted(unknown)}; known: {sorted(TRAITS)}")

    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"op {name!r} is registered twice")
        _REGISTRY[name] = OpSpec(name, kind, fn, infer, num_outputs, (fn.__doc__ or "").strip(), traits, per_node)
        return fn

    return deco


def get(name: str) -> OpSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedOpError(f"op {name!r} is not in the tilefuse op registry") from None


def has(name: str) -> bool:
    return name in _REGISTRY


def all_ops() -> dict[str, OpSpec]:
    return dict(_REGISTRY)


def with_trait(trait: str) -> frozenset[str]:
    """The names of the registered ops that have ``trait`` (a name from ``TRAITS``)."""
    if trait not in TRAITS:
        raise ValueError(f"unknown trait {trait!r}; known: {sorted(TRAITS)}")
    return frozenset(name for name, spec in _REGISTRY.items() if trait in spec.traits)


# ---- type inference ------------------------------------------------------------------------

_PRIMES = (10007, 10009, 10037, 10039, 10061, 10067, 10069, 10079, 10091, 10093, 10099, 10103, 10111,
           10133, 10139, 10141, 10151, 10159, 10163, 10169, 10177, 10181, 10193, 10211, 10223, 10243)


def infer_types(op: str, in_types: Sequence[TensorType | None], attrs: dict[str, Any],
                node: str = "") -> list[TensorType]:
    """Output types of ``op`` applied to inputs of ``in_types`` (``None`` for absent inputs)."""
    spec = get(op)
    if spec.infer is not None:
        return list(spec.infer(in_types, attrs))
    key = _meta_key(op, in_types, attrs)
    if key is None:
        return _infer_by_meta(spec, in_types, attrs, node)
    if key not in _META_CACHE:
        if len(_META_CACHE) >= _META_CACHE_SIZE:
            _META_CACHE.pop(next(iter(_META_CACHE)))
        _META_CACHE[key] = tuple(_infer_by_meta(spec, in_types, attrs, node))
    return list(_META_CACHE[key])


class GraphBuilder(ir.GraphBuilder):
    """``tilefuse.ir.GraphBuilder`` whose output types come from the registry (``infer_types``)."""

    def __init__(self, name: str):
        super().__init__(name, infer_types)


# Inference on meta tensors costs about 0.8 ms a node; a model's repeated layers ask the same question again
# and again (planning a 16-layer LLaMA asked it 1262 times). Answers are kept by op, input types and attributes.
_META_CACHE: dict[tuple, tuple[TensorType, ...]] = {}
_META_CACHE_SIZE = 8192


def _meta_key(op: str, in_types: Sequence[TensorType | None], attrs: dict[str, Any]) -> tuple | None:
    """A hashable key for one inference, or None when an attribute is not plain data (a tensor, say)."""
    def plain(v):
        if v is None or isinstance(v, (bool, int, float, str, torch.dtype)):
            return (type(v).__name__, v)
        if isinstance(v, (list, tuple)):
            items = tuple(plain(x) for x in v)
            return None if None in items else (type(v).__name__, items)
        return None

    frozen = tuple((k, plain(v)) for k, v in sorted(attrs.items()))
    if any(v is None for _, v in frozen):
        return None
    return op, tuple(in_types), frozen


def _infer_by_meta(spec: OpSpec, in_types, attrs, node: str) -> list[TensorType]:
    sym_of: dict[int, str] = {}
    val_of: dict[str, int] = {}
    args: list[torch.Tensor | None] = []
    unknown_rank = False
    for t in in_types:
        if t is None:
            args.append(None)
            continue
        if t.shape is None:
            unknown_rank = True
            args.append(None)
            continue
        dims = []
        for d in t.shape:
            if isinstance(d, str):
                if d not in val_of:
                    if len(val_of) >= len(_PRIMES):
                        raise InferenceError(f"{node}: too many symbolic dims")
                    val_of[d] = _PRIMES[len(val_of)]
                    sym_of[val_of[d]] = d
                d = val_of[d]
            dims.append(d)
        args.append(torch.empty(dims, dtype=torch_dtype(t.dtype), device="meta"))
    first_dtype = next((t.dtype for t in in_types if t is not None), "float32")
    if unknown_rank or spec.num_outputs < 0 and any(a is None for a, t in zip(args, in_types) if t is not None):
        if spec.num_outputs < 0:
            raise InferenceError(f"node {node!r} ({spec.name}): output count unknown for inputs of unknown rank")
        return [TensorType(None, first_dtype)] * spec.num_outputs
    try:
        outs = spec.run(args, dict(attrs))
    except (NotImplementedError, RuntimeError) as e:
        if _is_data_dependent(e) and spec.num_outputs > 0:
            return [TensorType(None, first_dtype)] * spec.num_outputs
        raise InferenceError(f"node {node!r} ({spec.name}): {_first_line(e)}; input types "
                             f"{[str(t) for t in in_types]}, attrs {attrs}") from e
    except (TypeError, ValueError, IndexError) as e:
        raise InferenceError(f"node {node!r} ({spec.name}): {_first_line(e)}; input types "
                             f"{[str(t) for t in in_types]}, attrs {attrs}") from e
    result = []
    for o in outs:
        shape = tuple(sym_of.get(d, d) if d not in sym_of else sym_of[d] for d in o.shape)
        if val_of:
            shape = tuple(_unmap_dim(d, sym_of) for d in shape)
        result.append(TensorType(shape, dtype_name(o.dtype)))
    return result


def _unmap_dim(d, sym_of: dict[int, str]):
    if isinstance(d, str) or d in sym_of:
        return sym_of.get(d, d)
    # A product or multiple of substituted primes: name it by its factors.
    if d >= _PRIMES[0]:
        factors, rest = [], d
        for p, s in sym_of.items():
            while rest % p == 0:
                factors.append(s)
                rest //= p
        if factors:
            return "*".join(([str(rest)] if rest != 1 else []) + factors)
    return d


def _is_data_dependent(e: Exception) -> bool:
    msg = str(e)
    return any(s in msg for s in ("meta", "data-dependent", "item()", "Cannot copy out", "tolist"))


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

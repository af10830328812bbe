"""What an ONNX converter sees: the conversion context ``Ctx``, the node ``OnnxNode``, ``Unsupported``, and the
helpers that read a node's inputs (``ints``, ``runtime``, ``const_input``, ``axis_of``).

The converter tables (``onnx_ops``, ``onnx_nn``) build on this module; the importer (``onnx``) builds on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import onnx
import torch

from tilefuse import ops
from tilefuse.frontends.onnx_shapes import MAX_ELEMENTS, Elements, propagate
from tilefuse.ir import TensorType, freeze

FOLD_LIMIT = 1 << 16  # fold a node on constants only if its outputs have at most this many elements
WIDE = ("uint16", "uint32", "uint64")  # torch computes little in these: widened to int64 and back


class Unsupported(Exception):
    """Raised by a converter for an attribute/input combination it does not handle (with the reason)."""


@dataclass(frozen=True)
class OnnxNode:
    """One ONNX node as converters see it: attributes parsed, ``version`` = the op's since_version."""

    op: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    version: int
    opsets: Mapping[str, int]
    proto: onnx.NodeProto

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and bool(self.inputs[i])


Converter = Callable[["Ctx", OnnxNode], list[str]]


# ---- the conversion context ---------------------------------------------------------------------

class Ctx:
    """State of one import: the builder, ONNX name -> tilefuse value name, known constants."""

    def __init__(self, builder: ops.GraphBuilder, label: str, base_dir: str, onnx_types: Mapping[str, onnx.TypeProto]):
        self.b = builder
        self.label = label
        self.base_dir = base_dir
        self.onnx_types = onnx_types
        self.env: dict[str, str] = {}
        self.unknown: set[str] = set()  # symbolic dims we named for values whose size is data-dependent
        self.symbols: set[str] = set()  # the symbolic dims of the graph inputs
        self.values: dict[str, Elements] = {}  # known elements of shape tensors computed at run time

    # -- values ------------------------------------------------------------------------------
    def inp(self, n: OnnxNode, i: int) -> str:
        """Our value name for input ``i`` of ``n`` ('' when absent)."""
        if not n.has_input(i):
            return ""
        return self.env[n.inputs[i]]

    def const(self, name: str) -> torch.Tensor | None:
        """The tensor of value ``name`` if it is a constant, else ``None``."""
        return self.b.constants.get(name) if name else None

    def type(self, name: str) -> TensorType:
        return self.b.types[name]

    def shape(self, name: str) -> tuple | None:
        return self.b.types[name].shape

    def rank(self, name: str) -> int:
        r = self.b.types[name].rank
        if r is None:
            raise Unsupported(f"value {name!r} has unknown rank")
        return r

    def static_shape(self, name: str, why: str = "") -> tuple[int, ...]:
        t = self.b.types[name]
        if not t.is_static:
            raise Unsupported(f"needs the static shape of {name!r} ({t}){': ' + why if why else ''}")
        return t.shape

    def dtype(self, name: str) -> str:
        return self.b.types[name].dtype

    def constant(self, tensor: torch.Tensor, base: str = "const") -> str:
        return self.b.constant(base, tensor)

    def scalar(self, value: Any, dtype: str) -> str:
        """A 0-d constant of ``dtype``."""
        return self.constant(torch.tensor(value, dtype=getattr(torch, dtype)), "scalar")

    # -- ops ---------------------------------------------------------------------------------
    def add(self, op: str, inputs: Iterable[str], *, types: list[TensorType] | None = None,
            **attrs: Any) -> list[str]:
        """Add registry op ``op``; fold it right away when every input is a constant and its outputs
        are small (known before evaluating: static shapes, or a shape-arithmetic op, ``ops.FOLD_DYNAMIC``).
        ``types`` overrides the registry's inference (dims named ``"?"`` are unknown)."""
        inputs = tuple(inputs)
        attrs = {k: freeze(v) for k, v in attrs.items()}
        if types is None:
            types = self._infer(op, inputs, attrs)
        consts = [self.const(i) if i else None for i in inputs]
        small = all(t.is_static for t in types) and sum(t.numel for t in types) <= FOLD_LIMIT
        if all(c is not None for c, i in zip(consts, inputs) if i) and (small or op in ops.FOLD_DYNAMIC):
            outs = evaluate(op, consts, attrs)
            if outs is not None:
                return [self.constant(t, op) for t in outs]
        if any(t.shape and "?" in t.shape for t in types):  # data-dependent dims: name each one
            base = self.b.fresh(f"{op}_dim")
            types = [t if not t.shape else TensorType(tuple(f"{base}{j}_{k}" if d == "?" else d
                                                            for k, d in enumerate(t.shape)), t.dtype)
                     for j, t in enumerate(types)]
            self.unknown.update(d for t in types if t.shape for d in t.shape if isinstance(d, str))
        outs = self.b.add(op, inputs, out_types=types, **attrs)
        if len(outs) == 1:
            elements = propagate(op, [self.known(i) for i in inputs], [self.b.types.get(i) for i in inputs], attrs,
                                 types[0])
            if elements is not None:
                self.values[outs[0]] = elements
        return outs

    def known(self, name: str) -> Elements | None:
        """The elements of a small int tensor as far as known at import (see ``onnx_shapes``)."""
        t = self.const(name)
        if t is not None:
            ok = t.dim() <= 1 and t.numel() <= MAX_ELEMENTS and not t.dtype.is_floating_point
            return tuple(int(v) for v in t.reshape(-1).tolist()) if ok and t.dtype != torch.bool else None
        return self.values.get(name)

    def _infer(self, op: str, inputs: tuple[str, ...], attrs: dict) -> list[TensorType]:
        """Registry inference; when distinct symbolic dims make it fail (two unknown dims that the
        model's semantics make equal), retry with every symbol identified and leave the symbolic
        output dims unknown."""
        in_types = [self.b.types[i] if i else None for i in inputs]
        try:
            return ops.infer_types(op, in_types, attrs, node=op)
        except ops.InferenceError:
            if not any(t is not None and t.shape and any(isinstance(d, str) for d in t.shape) for t in in_types):
                raise
            one = [t if t is None or t.shape is None else
                   TensorType(tuple("sym" if isinstance(d, str) else d for d in t.shape), t.dtype) for t in in_types]
            types = ops.infer_types(op, one, attrs, node=op)
            return [t if t.shape is None else TensorType(tuple("?" if isinstance(d, str) else d for d in t.shape),
                                                         t.dtype) for t in types]

    def add1(self, op: str, inputs: Iterable[str], **attrs: Any) -> str:
        (out,) = self.add(op, inputs, **attrs)
        return out

    def cast(self, name: str, dtype: str) -> str:
        return name if self.dtype(name) == dtype else self.add1("cast", [name], dtype=dtype)


def evaluate(op: str, inputs: list[torch.Tensor | None], attrs: dict) -> tuple[torch.Tensor, ...] | None:
    """Outputs of ``op`` on constant ``inputs`` through its reference, or ``None`` when too big to fold."""
    try:
        outs = ops.get(op).run(inputs, dict(attrs))
    except Exception:  # noqa: BLE001  (leave it to the runtime, which reports the node)
        return None
    if sum(o.numel() for o in outs) > FOLD_LIMIT:
        return None
    return tuple(o.contiguous() for o in outs)


# ---- reading a node's inputs --------------------------------------------------------------------

def ints(ctx: Ctx, n: OnnxNode, i: int, attr: str | None = None) -> list[int] | None:
    """Input ``i`` (or, for old op versions, attribute ``attr``) as constant ints; None if absent;
    ``Unsupported`` if it is a runtime tensor."""
    if attr is not None and attr in n.attrs:
        return [int(v) for v in n.attrs[attr]]
    if not n.has_input(i):
        return None
    t = ctx.const(ctx.inp(n, i))
    if t is None:
        raise Unsupported(f"input {i} ({n.inputs[i]!r}) must be a constant")
    return [int(v) for v in t.reshape(-1).tolist()]


def runtime(ctx: Ctx, n: OnnxNode, i: int) -> bool:
    """Whether input ``i`` is present and only known at run time."""
    return n.has_input(i) and ctx.const(ctx.inp(n, i)) is None


def const_input(ctx: Ctx, n: OnnxNode, i: int):
    """Input ``i`` as a constant tensor, ``None`` if absent or computed at run time."""
    return ctx.const(ctx.inp(n, i)) if n.has_input(i) else None


def axis_of(ctx: Ctx, name: str, axis: int) -> int:
    """A node's ``axis`` of value ``name``, a negative one counted from the end; ONNX takes ``[-r, r - 1]`` (``dim_in``
    refuses the rest)."""
    return dim_in(axis, ctx.rank(name), repr(name))


def dim_in(axis: int, rank: int, what: str, upto_rank: bool = False) -> int:
    """``axis`` of a ``rank``-d value (``what`` names it in the error), counted from the end where negative; one
    outside ``[-rank, rank - 1]`` (``[-rank, rank]`` with ``upto_rank``: Flatten's) is refused, where a modulo would
    pick another dim (or divide by zero at rank 0)."""
    last = rank if upto_rank else rank - 1
    if not -rank <= axis <= last:
        raise ValueError(f"axis {axis} is out of range for {what} of rank {rank}"
                         + (" (a 0-d value has no axis)" if last < 0 else f" (ONNX: -{rank} to {last})"))
    return axis + rank if axis < 0 else axis

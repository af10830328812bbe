"""Ops the torch frontend needs beyond the canonical set: the torch fallback and advanced indexing.

Note: ``torch_fallback`` runs one ATen op that no converter maps. Its attributes must stay hashable
and printable (they live in a frozen ``Node``), so the op's non-tensor arguments are stored as a
small tagged encoding: every tuple in it starts with a tag string, tensors are
``("tensor", k)`` (the k-th node input), lists are ``("list", items)``, dtypes ``("dtype", name)``
and so on; plain ``int``/``float``/``bool``/``str``/``None`` stand for themselves. The op's
results are flattened to a tuple of tensors (lists spliced in, ``None`` as an empty tensor, numbers
as 0-d tensors) so that a multi-output op has one node output per flat result; ``flat_layout``
gives the same flattening for the fx frontend, which maps ``getitem`` through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tilefuse.ir import dtype_name, torch_dtype
from tilefuse.ops.registry import OpKind, register

# ---- advanced indexing (canonical, general: numpy/ATen ``x[i0, i1, ...]``) -------------------


@register("index", OpKind.INJECTIVE)
def index(x, *indices):
    """``x[i0, i1, ...]`` with integer index tensors, one per leading dim; an absent input is a
    full slice (``:``). Index tensors broadcast together, as in numpy/ATen advanced indexing."""
    return x[tuple(slice(None) if i is None else i for i in indices)]


# ---- the torch fallback -------------------------------------------------------------------------


@register("torch_fallback", OpKind.OPAQUE, num_outputs=-1)
def torch_fallback(*tensors, target: str, args: tuple = (), kwargs: tuple = ()):
    """Run the ATen op ``target`` (``"aten::name.overload"``) through torch. ``args``/``kwargs``
    are the encoded non-tensor arguments (see the module note); results come back flattened."""
    op = resolve_op(target)
    device = next((t.device for t in tensors if isinstance(t, torch.Tensor)), None)
    a = [decode_arg(x, tensors, device) for x in args]
    kw = {k: decode_arg(v, tensors, device) for k, v in kwargs}
    return flatten_outputs(op(*a, **kw))


def qualified_name(op: torch._ops.OpOverload) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``"aten::add.Tensor"``."""
    schema = op._schema
    return f"{schema.name}.{schema.overload_name or 'default'}"


def resolve_op(target: str) -> torch._ops.OpOverload:
    """``"aten::add.Tensor"`` -> ``torch.ops.aten.add.Tensor`` (a missing overload means ``default``)."""
    ns, _, rest = target.partition("::")
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    except AttributeError:
        raise ValueError(f"torch_fallback: no torch op {target!r}") from None


def encode_arg(x: Any, tensor_index: Callable[[Any], int | None]) -> Any:
    """Encode one argument; ``tensor_index(x)`` gives the node-input position of a tensor argument
    (or ``None`` when ``x`` is not one)."""
    k = tensor_index(x)
    if k is not None:
        return ("tensor", k)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        return ("list", tuple(encode_arg(v, tensor_index) for v in x))
    if isinstance(x, torch.dtype):
        return ("dtype", dtype_name(x))
    if isinstance(x, torch.device):
        return ("device", str(x))
    if isinstance(x, torch.layout):
        return ("layout", str(x).removeprefix("torch."))
    if isinstance(x, torch.memory_format):
        return ("memory_format", str(x).removeprefix("torch."))
    if isinstance(x, complex):
        return ("complex", (x.real, x.imag))
    raise TypeError(f"torch_fallback cannot encode an argument of type {type(x).__name__}: {x!r}")


def decode_arg(x: Any, tensors: Sequence[torch.Tensor | None], device: torch.device | None) -> Any:
    """Inverse of ``encode_arg``; a ``device`` argument follows the tensors' device when there is one."""
    if not isinstance(x, tuple):
        return x
    tag, v = x
    if tag == "tensor":
        return tensors[v]
    if tag == "list":
        return [decode_arg(i, tensors, device) for i in v]
    if tag == "dtype":
        return torch_dtype(v)
    if tag == "device":
        return device if device is not None else torch.device(v)
    if tag in ("layout", "memory_format"):
        return getattr(torch, v)
    if tag == "complex":
        return complex(*v)
    raise ValueError(f"torch_fallback: unknown argument tag {tag!r}")


def flatten_outputs(result: Any) -> tuple[torch.Tensor, ...]:
    """The op's result as a flat tuple of tensors (the order ``flat_layout`` describes)."""
    flat: list[torch.Tensor] = []
    _flatten(result, flat)
    return tuple(flat)


def _flatten(r: Any, flat: list) -> None:
    if isinstance(r, torch.Tensor):
        flat.append(r)
    elif isinstance(r, (list, tuple)):
        for x in r:
            _flatten(x, flat)
    elif r is None:
        flat.append(torch.empty(0))
    else:
        flat.append(torch.tensor(r))


def flat_layout(result: Any) -> tuple[Any, list[Any]]:
    """For an op result (tensors, fake tensors or numbers): ``(layout, leaves)`` where ``layout``
    mirrors the result with each leaf replaced by its flat position and ``leaves`` lists the leaves
    in flat order, as ``flatten_outputs`` produces them."""
    leaves: list[Any] = []

    def walk(r):
        if isinstance(r, (list, tuple)):
            return [walk(x) for x in r]
        leaves.append(r)
        return len(leaves) - 1

    return walk(result), leaves

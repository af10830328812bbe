"""What an ATen converter sees while the fx frontend imports a graph: ``Ctx``, and the type facts it shares with
the importer (``tensor_type``, ``scalar_dtype``).

The converter table (``aten_table``) builds on this module; the importer (``fx``) builds on both.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import fx

from tilefuse.ir import GraphBuilder, TensorType, dtype_name, torch_dtype


class FxImportError(ValueError):
    """The fx graph cannot be imported (not ATen-level, symbolic shapes, an unusable node)."""


def tensor_type(v: Any) -> TensorType:
    """The TensorType of a (fake) tensor whose shape is concrete."""
    if any(isinstance(d, torch.SymInt) for d in v.shape):
        raise FxImportError(f"symbolic shape {tuple(v.shape)} (data-dependent or dynamic)")
    return TensorType(tuple(int(d) for d in v.shape), dtype_name(v.dtype))


def used(node: fx.Node, k: int) -> bool:
    """Whether output ``k`` of a multi-output node is read (through a getitem that is itself read)."""
    return any(u.target is operator.getitem and u.args[1] == k and u.users for u in node.users)


_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}
_DEFAULT = {0: torch.bool, 1: torch.int64, 2: torch.float32, 3: torch.complex64}


def _dtype_category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def scalar_dtype(x: Any, other: TensorType | None) -> torch.dtype:
    """dtype of the 0-d constant standing for the Python scalar ``x`` next to a tensor of type ``other``.

    A 0-d tensor of the scalar's default dtype promotes like the scalar against a tensor with dims
    (its category does not beat the tensor's); against another 0-d tensor of the same or higher
    category it must take that tensor's dtype.
    """
    cat = _CATEGORY.get(type(x), 2)
    if other is not None and other.rank == 0:
        odt = torch_dtype(other.dtype)
        if cat <= _dtype_category(odt):
            return odt
    return _DEFAULT[cat]


class ImportState(Protocol):
    """The importer's side of a ``Ctx``: the graph being built, the fx node -> value map, and how it adds nodes."""

    b: GraphBuilder
    env: dict[fx.Node, Any]

    def add(self, op: str, inputs: Sequence[str | None], base: str, attrs: dict[str, Any]) -> list[str]: ...

    def scalar(self, value: Any, dtype: torch.dtype) -> str: ...


class Ctx:
    """What a converter sees: the fx node, its bound arguments (tensors as value names) and helpers
    that add nodes and constants to the graph being built."""

    def __init__(self, imp: ImportState, node: fx.Node, raw: dict[str, Any]):
        self._imp = imp
        self.node = node
        self.raw = raw  # bound arguments as in the fx graph (fx nodes for tensors)
        self.val = node.meta.get("val")

    # -- reading ---------------------------------------------------------------------------------
    def type(self, value: str) -> TensorType:
        return self._imp.b.types[value]

    def out_type(self, k: int | None = None) -> TensorType:
        """Type of the node's output (or of output ``k`` of a multi-output op), from fx metadata."""
        return tensor_type(self.val if k is None else self.val[k])

    def used(self, k: int) -> bool:
        """Whether output ``k`` of this multi-output node is read."""
        return used(self.node, k)

    def producer(self, arg: str) -> fx.Node | None:
        """The fx node feeding argument ``arg`` (None for a non-tensor argument)."""
        x = self.raw.get(arg)
        return x if isinstance(x, fx.Node) else None

    def value_of(self, n: fx.Node) -> Any:
        return self._imp.env[n]

    # -- building --------------------------------------------------------------------------------
    def op(self, op: str, *inputs: str | None, **attrs: Any) -> str:
        """Add a single-output node; ``None`` inputs are absent optional inputs."""
        return self._imp.add(op, inputs, self.node.name, attrs)[0]

    def ops(self, op: str, *inputs: str | None, **attrs: Any) -> list[str]:
        """Add a multi-output node; returns its output names."""
        return self._imp.add(op, inputs, self.node.name, attrs)

    def tensor(self, x: Any, like: Any = None) -> str:
        """``x`` as a value name: a name stays, a Python number becomes a 0-d constant whose dtype
        makes torch's type promotion against ``like`` (a value name) come out as with a scalar."""
        if isinstance(x, str):
            return x
        other = self.type(like) if isinstance(like, str) else None
        return self._imp.scalar(x, scalar_dtype(x, other))

    def constant(self, t: torch.Tensor, base: str = "const") -> str:
        return self._imp.b.constant(base, t)

"""The head split and merge around an sdpa read as flash-attention operand layouts (``TokenRows``).

Note: models hand attention a fused projection ``qkv (B, S, 3*H*D)`` and take back ``(B, S, H*D)``:
``split``/``slice`` along the last dim, ``view (B, S, H, D)``, ``transpose(1, 2)`` before the sdpa, and
``transpose(1, 2)``, ``view (B, S, H*D)`` after it. Run through torch those are copies (the kernel
takes contiguous operands); read here as ``TokenRows(width, offset)`` the kernel reads the columns in
place and writes the merged heads itself, and the nodes drop out of the region's pre and post lists.
Every rule below keeps torch's meaning exactly: reshapes are flat reinterpretations, so a reshape of
whole token rows is free, while a reshape of a column slice is followed only when it keeps ``(B, S)``
in front (it regroups one token's columns). A chain no rule matches keeps the sdpa input as it is
(the kernel reads it as contiguous ``(B, H, S, D)`` and torch runs its layouts): never a wrong layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tilefuse.ir import Node, TensorType
from tilefuse.lowering.templates.attention import TokenRows

# Ops that reinterpret a tensor's flat data with another shape (torch may copy; the values are the same).
REINTERPRET = frozenset({"reshape", "squeeze", "unsqueeze", "flatten", "identity", "dropout", "contiguous"})


@dataclass(frozen=True)
class Operand:
    """What the kernel reads for q, k or v: ``value`` (reshaped to ``shape`` when set) in ``layout``."""

    value: str
    shape: tuple | None = None
    layout: TokenRows | None = None  # None: the value itself, contiguous (B, H, S, D)


@dataclass(frozen=True)
class _Rows:
    """``value`` is columns ``offset .. offset + cols`` of the (B, S, width) rows of ``source``."""

    source: str
    width: int
    offset: int
    cols: int

    @property
    def whole(self) -> bool:
        return self.offset == 0 and self.cols == self.width


def is_head_swap(n: Node) -> bool:
    """``transpose(1, 2)`` or ``permute(0, 2, 1, 3)`` of a rank-4 tensor: (B, S, H, D) <-> (B, H, S, D)."""
    if n.op == "transpose":
        return {n.attr["dim0"] % 4, n.attr["dim1"] % 4} == {1, 2}
    return n.op == "permute" and tuple(p % 4 for p in n.attr["perm"]) == (0, 2, 1, 3)


def operand(x: str, B: int, S: int, producers: dict[str, Node], types: dict[str, TensorType]) -> Operand:
    """q, k or v (``(B, H, S, D)``) read in place from the rows its head split started from, if it matches."""
    _, H, _, D = types[x].shape
    n = producers.get(x)
    if n is None or not is_head_swap(n) or _shape(n.inputs[0], types) != (B, S, H, D):
        return Operand(x)
    rows = _rows(n.inputs[0], B, S, producers, types)
    if rows is None or rows.cols != H * D:
        return Operand(x)
    return Operand(rows.source, (B, S, rows.width), TokenRows(rows.width, rows.offset))


def _rows(y: str, B: int, S: int, producers: dict[str, Node], types: dict[str, TensorType]) -> _Rows | None:
    """``y`` as columns of token rows of a value the kernel can read, or None."""
    shape = _shape(y, types)
    n = producers.get(y)
    if shape is None:
        return None
    if n is None:  # read from outside the region: its flat data are the rows
        total = math.prod(shape)
        return _Rows(y, total // (B * S), 0, total // (B * S)) if total % (B * S) == 0 else None
    src = n.inputs[0]
    if n.op in REINTERPRET and len([i for i in n.inputs if i]) == 1:
        r = _rows(src, B, S, producers, types)
        per_token = shape[:2] == (B, S) and (_shape(src, types) or ())[:2] == (B, S)
        return r if r is not None and (r.whole or per_token) else None
    if n.op not in ("split", "slice"):
        return None
    src_shape = _shape(src, types) or ()
    if len(src_shape) != 3 or src_shape[:2] != (B, S) or n.attr["dim"] % 3 != 2:
        return None
    r = _rows(src, B, S, producers, types)
    if r is None:
        return None
    if n.op == "split":
        k = [o.name for o in n.outputs].index(y)
        start, cols = sum(n.attr["sizes"][:k]), n.attr["sizes"][k]
    else:
        if n.attr.get("step", 1) != 1:
            return None
        start, stop, _ = slice(n.attr.get("start"), n.attr.get("end")).indices(src_shape[2])
        cols = max(stop - start, 0)
    return _Rows(r.source, r.width, r.offset + start, cols)


def merged_output(out: str, post: Sequence[Node], region_outputs: Sequence[str], types: dict[str, TensorType]) -> bool:
    """Whether the post nodes are only the head merge of ``out`` (``(B, H, S, D)``): a head swap, then
    reshapes, every region output among their results, so the kernel can write ``(B, S, H*D)`` itself."""
    if not post or out in region_outputs:
        return False
    B, H, S, D = types[out].shape
    merged: set[str] = set()
    for n in post:
        if n.inputs[0] == out and is_head_swap(n) and _shape(n.outputs[0].name, types) == (B, S, H, D):
            merged.add(n.outputs[0].name)
        elif n.inputs[0] in merged and n.op in REINTERPRET and len([i for i in n.inputs if i]) == 1:
            merged.update(o.name for o in n.outputs)
        else:
            return False
    return set(region_outputs) <= merged


def _shape(v: str, types: dict[str, TensorType]) -> tuple | None:
    t = types.get(v)
    return tuple(t.shape) if t is not None and t.is_static else None


def needed(pre: Sequence[Node], reads: set[str]) -> list[Node]:
    """The pre nodes whose results (transitively) feed ``reads``, in order."""
    keep, want = [], set(reads)
    for n in reversed(pre):
        if any(o.name in want for o in n.outputs):
            keep.append(n)
            want.update(i for i in n.inputs if i)
    return keep[::-1]

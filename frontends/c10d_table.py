"""The collective converters of the fx frontend: ``_c10d_functional`` ops onto the registry's collectives.

A model parallelized with ``torch.distributed.tensor.parallel`` and compiled carries them in its ATen graphs
(``all_reduce`` + ``wait_tensor`` for tensor parallel; ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` for
sequence parallel). Each becomes the registry op of the same name (``tilefuse/ops/collective.py``: the
``collective`` trait, which the planner keeps alone and in program order). A collective op of these namespaces
without a converter here (the coalesced forms, send and receive), or with an argument a converter cannot keep as an
attribute, becomes a ``collective_fallback`` node: also a collective, run through torch.
"""

from __future__ import annotations

from typing import Any

import torch

from .fx_context import Ctx

# The namespaces whose ops talk to other ranks: every op of theirs is a collective (``is_collective``).
C10D_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d"})


def is_collective(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` talks to other ranks (a collective, its wait, a send or a receive)."""
    return getattr(op, "namespace", None) in C10D_NAMESPACES


def _group(a: dict) -> str | None:
    g = a["group_name"]
    return g if isinstance(g, str) else None  # (a process group object is no attribute: the fallback keeps it)


def _all_reduce(cx: Ctx, a: dict) -> str | None:
    g = _group(a)
    return None if g is None else cx.op("all_reduce", a["input"], reduce_op=a["reduce_op"], group_name=g)


def _all_gather(cx: Ctx, a: dict) -> str | None:
    g = _group(a)
    return None if g is None else cx.op("all_gather_into_tensor", a["input"], group_size=a["group_size"],
                                        group_name=g)


def _reduce_scatter(cx: Ctx, a: dict) -> str | None:
    g = _group(a)
    return None if g is None else cx.op("reduce_scatter_tensor", a["input"], reduce_op=a["reduce_op"],
                                        group_size=a["group_size"], group_name=g)


def _broadcast(cx: Ctx, a: dict) -> str | None:
    g = _group(a)
    return None if g is None else cx.op("rank_broadcast", a["input"], src=a["src"], group_name=g)


def _all_to_all(cx: Ctx, a: dict) -> str | None:
    g, out, inp = _group(a), a["output_split_sizes"], a["input_split_sizes"]
    if g is None or not all(isinstance(s, int) for s in (*(out or ()), *(inp or ()))):
        return None
    return cx.op("all_to_all_single", a["input"], output_split_sizes=tuple(out or ()),
                 input_split_sizes=tuple(inp or ()), group_name=g)


def _table() -> dict[Any, Any]:
    if not hasattr(torch.ops, "_c10d_functional") or not hasattr(torch.ops._c10d_functional, "wait_tensor"):
        return {}  # a torch built without distributed: no graph carries them
    c10d = torch.ops._c10d_functional
    return {
        c10d.all_reduce.default: _all_reduce,
        c10d.all_gather_into_tensor.default: _all_gather,
        c10d.reduce_scatter_tensor.default: _reduce_scatter,
        c10d.broadcast.default: _broadcast,
        c10d.all_to_all_single.default: _all_to_all,
        c10d.wait_tensor.default: lambda cx, a: cx.op("wait_tensor", a["tensor"]),
    }


COLLECTIVES = _table()

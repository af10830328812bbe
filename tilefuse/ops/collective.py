"""Collectives: the ``_c10d_functional`` ops of a model split over several devices, as torch.compile traces it
(tensor parallel: ``all_reduce``; sequence parallel: ``all_gather_into_tensor``, ``reduce_scatter_tensor``), each
followed by the ``wait_tensor`` that makes its result ready.

Note: a collective is a side effect that every rank of its group takes part in. Each rank must issue the same
collectives in the same order, or the ranks wait on each other for ever (or exchange the wrong tensors); a
collective's result may be read only after its wait. So every op here carries the ``collective`` trait: the
planner gives each its own region (kind ``collective``), kept in program order with the other collectives and
waits, never fused, dropped as dead or duplicated; it runs through torch (``torch.ops._c10d_functional``); and a
collective and its wait stay in one CUDA-graph segment (``runtime.plan_runner.eager_tail``). Output types come
from the attributes, never from running the op (that would talk to the other ranks). ``collective_fallback`` runs
any other collective (the coalesced forms, send and receive) through torch, with ``torch_fallback``'s encoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tilefuse.ir import TensorType
from tilefuse.ops import fallback
from tilefuse.ops.registry import OpKind, register

COLLECTIVE = ("collective",)


def _c10d():
    return torch.ops._c10d_functional


def _same(in_types: Sequence[TensorType | None], attrs: dict) -> list[TensorType]:
    return [in_types[0]]


def _dim0(in_types: Sequence[TensorType | None], scale) -> list[TensorType]:
    t = in_types[0]
    if t.shape is None or not t.shape:
        return [t]
    return [TensorType((scale(t.shape[0]), *t.shape[1:]), t.dtype)]


def _gathered(in_types, attrs) -> list[TensorType]:
    n = attrs["group_size"]
    return _dim0(in_types, lambda d: d * n if isinstance(d, int) else f"{n}*{d}")


def _scattered(in_types, attrs) -> list[TensorType]:
    n = attrs["group_size"]
    return _dim0(in_types, lambda d: d // n if isinstance(d, int) else f"{d}/{n}")


def _exchanged(in_types, attrs) -> list[TensorType]:
    sizes = attrs.get("output_split_sizes") or ()
    return _dim0(in_types, lambda d: sum(sizes)) if sizes else [in_types[0]]


@register("all_reduce", OpKind.OPAQUE, infer=_same, traits=COLLECTIVE)
def all_reduce(x, reduce_op: str, group_name: str):
    """Reduce ``x`` over the ranks of ``group_name`` (``reduce_op``: sum, avg, max, ...); ready after its wait."""
    return _c10d().all_reduce(x, reduce_op, group_name)


@register("all_gather_into_tensor", OpKind.OPAQUE, infer=_gathered, traits=COLLECTIVE)
def all_gather_into_tensor(x, group_size: int, group_name: str):
    """Every rank's ``x`` concatenated along dim 0, in rank order; ready after its wait."""
    return _c10d().all_gather_into_tensor(x, group_size, group_name)


@register("reduce_scatter_tensor", OpKind.OPAQUE, infer=_scattered, traits=COLLECTIVE)
def reduce_scatter_tensor(x, reduce_op: str, group_size: int, group_name: str):
    """``x`` reduced over the ranks, each rank keeping its ``1 / group_size`` of dim 0; ready after its wait."""
    return _c10d().reduce_scatter_tensor(x, reduce_op, group_size, group_name)


@register("rank_broadcast", OpKind.OPAQUE, infer=_same, traits=COLLECTIVE)
def rank_broadcast(x, src: int, group_name: str):
    """Rank ``src``'s ``x`` on every rank; ready after its wait."""
    return _c10d().broadcast(x, src, group_name)


@register("all_to_all_single", OpKind.OPAQUE, infer=_exchanged, traits=COLLECTIVE)
def all_to_all_single(x, output_split_sizes: tuple, input_split_sizes: tuple, group_name: str):
    """Dim 0 of ``x`` split by ``input_split_sizes``, part ``k`` sent to rank ``k``; the parts received, by
    ``output_split_sizes`` (empty: equal parts), concatenated; ready after its wait."""
    return _c10d().all_to_all_single(x, list(output_split_sizes), list(input_split_sizes), group_name)


@register("wait_tensor", OpKind.OPAQUE, infer=_same, traits=COLLECTIVE)
def wait_tensor(x):
    """Wait until the collective that made ``x`` is done; returns ``x``."""
    return _c10d().wait_tensor(x)


@register("collective_fallback", OpKind.OPAQUE, num_outputs=-1, traits=COLLECTIVE)
def collective_fallback(*tensors, target: str, args: tuple = (), kwargs: tuple = ()):
    """Any other collective (``target``: ``"_c10d_functional::name.overload"``) through torch; arguments and results
    as ``torch_fallback`` encodes them."""
    return fallback.torch_fallback(*tensors, target=target, args=args, kwargs=kwargs)

"""Several processes, one plan: a decision that depends on a measurement is taken on rank 0 and used by every rank.

Note: a model split over several devices (tensor or sequence parallel under torch.compile) is compiled by every rank,
each from the same graph; the plans agree except where a measurement decides: the first call's choice between a region's
kernel, its ops through torch and its split (``pipeline.decide``), tuned tile configs (``pipeline.configs_step``), and
the whole-graph choice between the plan and dynamo's graph, whose timing calls run the collectives
(``backend._WholeGraphChoice``: whether to time, and the way). Timing noise may answer differently on each rank;
replicated values would then be computed by different code on different ranks (results that must be equal differ in
their last bits, and the replicas drift apart). So where torch.distributed runs several processes and the plan carries
collectives, ``from_rank0`` hands every rank rank 0's answer, through the process group's key-value store rather than
a collective, so that the answer is no part of the sequence of collectives the model's own graphs exchange. (On gloo a
planning ``broadcast_object_list``, matched on both ranks, hung about one run in five between the model's collectives:
the receiver in the broadcast, the sender waiting for its send, for 600 s; 2026-12-03, 2 of 9 runs of the CPU tensor-
parallel benchmark on a loaded machine.) A plan without collectives keeps each rank's own answer: such a graph may be
compiled and run by one rank alone (an evaluation on rank 0), where the others would never ask; and nothing its ranks
exchange depends on it.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from tilefuse.planner.plan import FusionPlan

T = TypeVar("T")
Broadcast = Callable[[list], None]  # replaces box[0] by rank 0's box[0]


def world_size() -> int:
    """How many processes torch.distributed runs (1 when it is not initialized, or not built in)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 when torch.distributed is not initialized, or not built in)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def has_collectives(plan: FusionPlan | None) -> bool:
    """Whether ``plan`` exchanges tensors with other ranks (a ``collective`` region); None (no plan) does not."""
    return plan is not None and any(r.kind == "collective" for r in plan.regions)


def from_rank0(value: T, plan: FusionPlan | None, broadcast: Broadcast | None = None) -> T:
    """``value`` as rank 0 has it, where the ranks must agree: ``plan`` carries collectives and several processes run
    (``broadcast`` given, or torch.distributed initialized with a world size over 1); else ``value`` itself.
    ``value`` must pickle (the default ``broadcast`` sends it as bytes)."""
    if not has_collectives(plan):
        return value
    if broadcast is None:
        if world_size() <= 1:
            return value
        broadcast = _broadcast_object
    box = [value]
    broadcast(box)
    return box[0]


_ANSWERS = itertools.count()  # every rank asks in the same order: the n-th answer of rank 0 is every rank's n-th


def _broadcast_object(box: list) -> None:
    """Rank 0's ``box[0]`` into every rank's ``box``, through the default group's store (rank 0 sets the n-th
    key, the others wait for it up to the group's timeout, then raise)."""
    store, key = dist.distributed_c10d._get_default_store(), f"tilefuse/from_rank0/{next(_ANSWERS)}"
    if dist.get_rank() == 0:
        store.set(key, pickle.dumps(box[0]))
    else:
        box[0] = pickle.loads(store.get(key))

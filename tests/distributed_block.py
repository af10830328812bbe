"""Helper of tests/test_distributed_gloo.py (not a test module): a small transformer block, its tensor-parallel and
sequence-parallel plans, and the worker each spawned rank runs. It lives in a module importable by name because a
spawned process imports the function it runs (the test modules load under --import-mode=importlib, by path).

The worker compiles the block with ``torch.compile(backend="tilefuse")`` on the ``c`` target, runs one forward and
one backward on the shared fresh inputs and saves what the test compares: its outputs, the gradients gathered
whole, and a summary of every plan it compiled (regions, kinds, backends, notes) after the first call's measured
choice. The measurement is injected and disagrees between the ranks on purpose (rank 0 finds every kernel faster
than torch, rank 1 every kernel slower): only rank 0's decisions, broadcast, make the ranks' plans equal.
"""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, SEQ, BATCH, HIDDEN = 32, 4, 8, 2, 64
WORLD = 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / WORLD of them
        q, k, v = (w(x).view(b, t, -1, D // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then h + mlp(norm(h))."""

    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(D), Attention()
        self.ffn_norm, self.feed_forward = nn.LayerNorm(D), MLP()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def inputs(seed: int) -> tuple[Block, torch.Tensor, torch.Tensor]:
    """The block's weights, its input and the output weighting of the loss ``(block(x) * g).sum()``, from ``seed``
    (the same on every process: the CPU generator)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    block = Block()
    with torch.no_grad():  # biases and norm weights away from their 0 / 1 initialisation: they must matter
        for p in block.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return block, torch.randn(BATCH, SEQ, D, generator=gen), torch.randn(BATCH, SEQ, D, generator=gen)


def reference(seed: int) -> dict:
    """The unsharded block in eager fp32: output, input gradient and parameter gradients of the loss."""
    block, x, g = inputs(seed)
    x.requires_grad_(True)
    out = block(x)
    (out * g).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "grads": {n: p.grad for n, p in block.named_parameters()}}


def parallel_plan(mode: str) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    col = {f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")} | {"feed_forward.w1": ColwiseParallel()}
    if mode == "tensor":
        return col | {"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()}
    # sequence parallel: the residual stream and the norms hold 1 / WORLD of the sequence; it is gathered before
    # each projection and the block's halves are reduce-scattered back onto the sequence shards
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return col | {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(), "attention": gather,
                  "feed_forward": gather, "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                  "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}


def plan_summary(plan) -> tuple:
    """What must be equal on every rank: each region's name, kind, backend and ops, and the plan's notes."""
    return plan.graph.name, tuple((r.name, r.kind, r.backend, r.ops) for r in plan.regions), plan.notes


def run_rank(rank: int, seed: int, folder: str) -> None:
    """One rank: both parallel modes; saves ``rank{rank}.pt``, or ``rank{rank}.err`` with the traceback."""
    try:
        torch.save(_run(rank, seed, folder), os.path.join(folder, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(folder, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _run(rank: int, seed: int, folder: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from tilefuse import pipeline
    from tilefuse.runtime.distributed import from_rank0

    os.environ["TILEFUSE_TUNING_DB"] = os.path.join(folder, f"tuning{rank}.json")
    if "lo" in dict(socket.if_nameindex()).values():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)  # two ranks on a 2-core CI machine

    def fake_time(fn, args, kind, sets=None):  # rank 0: every kernel wins; rank 1: every kernel loses
        kernel = hasattr(fn, "spec")
        return (1e-3 if kernel else 2e-3) if rank == 0 else (2e-3 if kernel else 1e-3)

    pipeline.device_time = fake_time
    # a collective that never completes raises after this long instead of hanging the test
    # the ranks meet in a file of their own folder, not on a port: a port found free and bound later by rank 0 could
    # meanwhile be another job's (a concurrent test's gloo listener, which rank 1 would then connect to)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, "store"), rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=90))
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        result = {}
        for mode in ("tensor", "sequence"):
            block, x, g = inputs(seed)
            block = parallelize_module(block, mesh, parallel_plan(mode))
            runners: list = []
            compiled = torch.compile(block, backend="tilefuse",
                                     options={"target": "c", "measure": True, "observer": runners.append})
            if mode == "sequence":  # each rank holds its part of the sequence
                x, g = x.chunk(WORLD, dim=1)[rank].contiguous(), g.chunk(WORLD, dim=1)[rank].contiguous()
            x.requires_grad_(True)
            out = compiled(x)
            (out * g).sum().backward()
            grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                     for n, p in block.named_parameters()}
            result[mode] = {"out": out.detach(), "x_grad": x.grad, "grads": grads,
                            "plans": [plan_summary(r.plan) for r in runners]}
        plan = runners[0].plan
        result["from_rank0"] = (from_rank0(("rank", rank), plan),
                                from_rank0(rank, plan.__class__(plan.graph, ())))  # (a plan without collectives)
        return result
    finally:
        dist.destroy_process_group()

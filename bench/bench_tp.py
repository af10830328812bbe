"""Tensor-parallel zoo models under torchrun (issue #19): correctness against the unsharded model, no hang over many
steps, and time per step against Inductor with the same parallelization and against one device.

Usage:
    torchrun --standalone --nproc_per_node=2 bench/bench_tp.py --out tp.json                   # two GPUs, NCCL
    torchrun --standalone --nproc_per_node=2 bench/bench_tp.py --device cpu --size tiny \\
        --iters 5 --out /tmp/tp.json                                                            # gloo, c: a check

Models (``--models``): the zoo's GPT-2 block (fused QKV: its rows are regrouped so each rank's contiguous shard holds
its heads' q, k and v), the zoo's LLaMA block (separate projections, GQA), and the whole LLaMA-shape model (embedding
replicated, every block sharded, the LM head split by vocabulary and gathered). Projections into the heads and the
MLP's first linears are column-parallel, the output projections row-parallel (``torch.distributed.tensor.parallel``);
each rank's attention then holds heads / world of the heads.

Modes (``--modes``): eager, inductor (default), tilefuse (CUDA graphs on) and tilefuse-nograph (``cuda_graphs`` off;
on the CPU the two are the same). For each model and mode, every rank:
  * inference (no grad): the output against the unsharded model's, run in eager on this rank's device;
  * a training step (``loss = (out * g).sum()``): the input's gradient and every parameter's (gathered whole) against
    the unsharded model's;
  * ``--iters`` timed inference steps and ``--iters`` timed training steps (median ms; a collective that never
    completes fails the run after ``--timeout`` seconds rather than hanging it).
Rank 0 also times the unsharded model under the same mode on its one device: ``x one device`` is that time over the
parallel step's. Tolerances: fp16 2e-2 and fp32 1e-4 of the largest reference value. NCCL runs with NVLink multicast
off (``NCCL_NVLS_ENABLE=0``), as the device machines require.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import faulthandler
import json
import os
import platform
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tilefuse import models
from tilefuse.models.common import PreLNBlock, rotary_tables
from tilefuse.models.llama import LlamaBlock

MODES = ("eager", "inductor", "tilefuse", "tilefuse-nograph")


# ---- the models ---------------------------------------------------------------------------------------------------

class LlamaBlockModel(nn.Module):
    """One zoo LLaMA block with its rotary tables: ``forward(x)``."""

    def __init__(self, cfg: dict, seq: int):
        super().__init__()
        self.block = LlamaBlock(cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["hidden"], 1e-5)
        cos, sin = rotary_tables(cfg["dim"] // cfg["n_heads"], seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        return self.block(x, self.cos, self.sin)


def build(name: str, size: str, dtype: torch.dtype, device: str, seed: int):
    """(unsharded model, example input, its loss weighting, the model's tensor-parallel plan, head attributes)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "gpt2-block":
        cfg, shape = models.ZOO["gpt2"].sizes[size], models.ZOO["gpt2"].shapes[size]
        model = PreLNBlock(cfg["dim"], cfg["n_heads"], 4 * cfg["dim"], causal=True, approximate="tanh", eps=1e-5)
        x = torch.randn(shape["batch"], shape["seq"], cfg["dim"], generator=gen)
        plan = {"attn.qkv": "col", "attn.out": "row", "mlp.fc1": "col", "mlp.fc2": "row"}
        heads = [(model.attn, "n_heads")]
    elif name in ("llama-block", "llama"):
        cfg, shape = models.ZOO["llama"].sizes[size], models.ZOO["llama"].shapes[size]
        layer_plan = {"attn.q_proj": "col", "attn.k_proj": "col", "attn.v_proj": "col", "attn.o_proj": "row",
                      "mlp.gate_proj": "col", "mlp.up_proj": "col", "mlp.down_proj": "row"}
        if name == "llama-block":
            model = LlamaBlockModel(cfg, shape["seq"])
            x = torch.randn(shape["batch"], shape["seq"], cfg["dim"], generator=gen)
            plan = {f"block.{k}": v for k, v in layer_plan.items()}
            heads = [(model.block.attn, "n_heads"), (model.block.attn, "n_kv_heads")]
        else:
            model, (x,) = models.build("llama", size, seed=seed)
            plan = {f"layers.{i}.{k}": v for i in range(len(model.layers)) for k, v in layer_plan.items()}
            plan["lm_head"] = "col-gather"
            heads = [(layer.attn, a) for layer in model.layers for a in ("n_heads", "n_kv_heads")]
    else:
        raise SystemExit(f"unknown model {name!r}; known: gpt2-block, llama-block, llama")
    with torch.no_grad():  # biases and norm weights away from their initialisation: they must matter
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
            p.requires_grad_(True)  # (the zoo builds inference models)
    model = model.to(device, dtype).train()
    x = x.to(device) if not x.is_floating_point() else x.to(device, dtype)
    out_shape = model(x).shape
    g = torch.randn(out_shape, generator=gen).to(device, dtype)
    return model, x, g, plan, heads


def fused_qkv_order(dim: int, world: int) -> torch.Tensor:
    """Row order of a fused (q; k; v) projection whose contiguous shard r holds rank r's heads of q, k and v."""
    part = dim // world
    return torch.cat([torch.arange(w * part, (w + 1) * part) + which * dim
                      for w in range(world) for which in range(3)])


def shard(model: nn.Module, plan: dict, heads: list, mesh, world: int) -> nn.Module:
    """A copy of ``model`` parallelized by ``plan`` over ``mesh``, its attention's head counts per rank."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = copy.deepcopy(model)
    names = dict(tp.named_modules())
    for m, attr in heads:  # the copy's module at the original's path
        mod = names[_path(model, m)]
        setattr(mod, attr, getattr(mod, attr) // world)
    if "attn.qkv" in plan:  # regroup the fused rows (the reference's gradients are compared regrouped the same way)
        order = fused_qkv_order(names["attn.qkv"].in_features, world).to(names["attn.qkv"].weight.device)
        with torch.no_grad():
            names["attn.qkv"].weight.copy_(names["attn.qkv"].weight[order])
            names["attn.qkv"].bias.copy_(names["attn.qkv"].bias[order])
    styles = {"col": ColwiseParallel(), "row": RowwiseParallel(),
              "col-gather": ColwiseParallel(output_layouts=Replicate())}
    return parallelize_module(tp, mesh, {k: styles[v] for k, v in plan.items()})


def _path(model: nn.Module, target: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is target)


# ---- compiling and checking ---------------------------------------------------------------------------------------

def compiled(model: nn.Module, mode: str, device: str):
    torch._dynamo.reset()
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    options = {"quiet": True}
    if mode == "tilefuse-nograph":
        options["cuda_graphs"] = False
    return torch.compile(model, backend="tilefuse", options=options)


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def reference(model: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    with torch.no_grad():
        out = model(x)
    xr = x.clone().requires_grad_(x.is_floating_point())
    model.zero_grad(set_to_none=True)
    (model(xr) * g).sum().backward()
    return {"out": out, "x_grad": xr.grad, "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def check_mode(fn, tp: nn.Module, x, g, ref: dict, plan: dict, world: int) -> dict:
    with torch.no_grad():
        out = fn(x)
    errs = {"out": _close(out, ref["out"])}
    xr = x.clone().requires_grad_(x.is_floating_point())
    tp.zero_grad(set_to_none=True)
    (fn(xr) * g).sum().backward()
    if xr.grad is not None:
        errs["x_grad"] = _close(xr.grad, ref["x_grad"])
    worst = 0.0
    for name, p in tp.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        want = ref["grads"][name]
        if "attn.qkv" in plan and name.startswith("attn.qkv"):
            want = want[fused_qkv_order(p.shape[-1] if p.dim() == 2 else p.shape[0] // 3, world).to(want.device)]
        worst = max(worst, _close(grad, want))
    errs["grads"] = worst
    return errs


def timed(step, iters: int, device: str) -> float:
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def steps(fn, model: nn.Module, x, g):
    def infer():
        with torch.no_grad():
            fn(x)

    def train():
        model.zero_grad(set_to_none=True)
        (fn(x) * g).sum().backward()
    return infer, train


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--models", default="gpt2-block,llama-block,llama")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--size", default="bench")
    ap.add_argument("--iters", type=int, default=1000, help="timed steps of each kind (the no-hang check)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300, help="seconds before a stuck collective fails the run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = a.device
    if device == "cuda":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (the device machines' rule)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", str(rank))))
    elif "lo" in dict(socket.if_nameindex()).values():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on the loopback only
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timedelta(seconds=a.timeout))
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device, (world,))
    dtype = torch.float16 if device == "cuda" else torch.float32
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    rows, ok = [], True
    try:
        for name in a.models.split(","):
            model, x, g, plan, heads = build(name, a.size, dtype, device, a.seed)
            ref = reference(model, x, g)
            for mode in a.modes.split(","):
                # where a rank is stuck, if it is: every thread's stack on stderr shortly before the deadline
                faulthandler.dump_traceback_later(max(1.0, a.timeout - 20))
                if device == "cpu" and mode == "tilefuse-nograph":
                    continue  # no CUDA graphs on the CPU: the same as tilefuse
                tp = shard(model, plan, heads, mesh, world)
                fn = compiled(tp, mode, device)
                row = {"model": name, "mode": mode, "world": world, "errors": check_mode(fn, tp, x, g, ref, plan, world)}
                row["ok"] = all(v <= tol for v in row["errors"].values())
                ok &= row["ok"]
                infer, train = steps(fn, tp, x, g)
                for _ in range(a.warmup):
                    infer()
                    train()
                row["infer_ms"], row["train_ms"] = timed(infer, a.iters, device), timed(train, a.iters, device)
                dist.barrier()
                if rank == 0:  # the same compiler on one device, unsharded
                    alone = copy.deepcopy(model)
                    i1, t1 = steps(compiled(alone, mode, device), alone, x, g)
                    for _ in range(a.warmup):
                        i1()
                        t1()
                    n = max(1, a.iters // 10)
                    row["one_device_infer_ms"], row["one_device_train_ms"] = timed(i1, n, device), timed(t1, n, device)
                dist.barrier()
                rows.append(row)
                if rank == 0:
                    print(f"{name:12} {mode:17} infer {row['infer_ms']:8.3f} ms  train {row['train_ms']:8.3f} ms  "
                          f"one device {row.get('one_device_infer_ms', float('nan')):8.3f} / "
                          f"{row.get('one_device_train_ms', float('nan')):8.3f}  errors "
                          + " ".join(f"{k} {v:.1e}" for k, v in row["errors"].items())
                          + ("" if row["ok"] else f"  OVER {tol}"), flush=True)
        if rank == 0:
            _ratios(rows)
            if a.out:
                meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "world": world,
                        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                        "torch": torch.__version__, "python": platform.python_version(), "dtype": str(dtype),
                        "size": a.size, "iters": a.iters, "tolerance": tol}
                Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
                print(f"wrote {a.out}")
        # both ranks done before either tears gloo down: rank 1, through first while rank 0 still wrote the results,
        # once aborted in its teardown ("terminate called without an active exception", CI 2026-12-04)
        dist.barrier()
    finally:
        faulthandler.cancel_dump_traceback_later()
        dist.destroy_process_group()
    return 0 if ok else 1


def _ratios(rows: list[dict]) -> None:
    """Each tilefuse row's speed against Inductor's with the same parallelization, printed."""
    ind = {(r["model"]): r for r in rows if r["mode"] == "inductor"}
    for r in rows:
        peer = ind.get(r["model"])
        if r["mode"].startswith("tilefuse") and peer:
            r["x_inductor_infer"] = peer["infer_ms"] / r["infer_ms"]
            r["x_inductor_train"] = peer["train_ms"] / r["train_ms"]
            print(f"{r['model']:12} {r['mode']:17} x inductor: infer {r['x_inductor_infer']:.2f}, "
                  f"train {r['x_inductor_train']:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

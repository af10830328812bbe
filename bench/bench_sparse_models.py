"""Whole models with ``sparsity="2:4"`` against their dense selves, on a GPU, fp16, in one process.

Usage (on the device machine):  python bench/bench_sparse_models.py [--models mlp,llama] [--size bench]
    [--reps 50] [--json out.json]

For each zoo model at its benchmark size (random weights): eager, Inductor (default) and tilefuse (default options)
on the dense model; torch's own 2:4 path (the pruned model's ``nn.Linear`` weights as
``to_sparse_semi_structured``, eager: cuSPARSELt), and tilefuse with ``sparsity="2:4"``. Times are medians with L2
flushed before every call (``kernels.time_ms``), warm-up (and the measured choice's first call) excluded. Printed
with them: the accuracy report (``sparsity_report``: weights pruned, the outputs' relative change against the dense
model), tilefuse 2:4 against the pruned model in eager (the error of the kernels themselves), each 2:4 region's
measured choice (the plan's notes: gemm_sp or dense on the 2:4 weight) and a kernel profile by category.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_kernels import category_line, profile, time_ms

import tilefuse
from tilefuse import models
from tilefuse.planner.sparsity import prune_module


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def max_rel(a, b) -> float:
    a, b = _first(a).float(), _first(b).float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def torch_2_4(model: torch.nn.Module) -> torch.nn.Module | None:
    """The pruned model with its pruned ``nn.Linear`` weights as torch semi-structured sparse tensors."""
    from torch.sparse import to_sparse_semi_structured

    pruned = prune_module(model)
    dense = dict(model.named_modules())
    for name, m in pruned.named_modules():
        if isinstance(m, torch.nn.Linear) and not torch.equal(m.weight, dense[name].weight):
            m.weight = torch.nn.Parameter(to_sparse_semi_structured(m.weight.detach()), requires_grad=False)
    return pruned


def bench(name: str, size: str, reps: int) -> dict:
    model, inputs = models.build(name, size, dtype=torch.float16, device="cuda")
    row: dict = {"model": name, "size": size, "ms": {}}
    with torch.no_grad():
        ref = model(*inputs)
        pruned_ref = prune_module(model)(*inputs)
        row["ms"]["eager"] = time_ms(model, *inputs, reps=reps)
        torch._dynamo.reset()
        ind = torch.compile(model)
        ind(*inputs)
        row["ms"]["inductor"] = time_ms(ind, *inputs, reps=reps)
        try:
            sp = torch_2_4(model)
            sp(*inputs)
            row["ms"]["torch 2:4 eager"] = time_ms(sp, *inputs, reps=reps)
        except Exception as e:  # noqa: BLE001 -- an optional peer
            row["torch_2_4_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        for label, kw in (("tilefuse", {}), ("tilefuse 2:4", {"sparsity": "2:4"})):
            torch._dynamo.reset()
            runners: list = []
            fn = tilefuse.compile(model, observer=runners.append, **kw)
            out = fn(*inputs)
            row["ms"][label] = time_ms(fn, *inputs, reps=reps)
            p = profile(fn, *inputs)
            row.setdefault("profile", {})[label] = p
            print(f"  {name} {label}: {row['ms'][label]:.3f} ms; kernels ms/call: {category_line(p)}", flush=True)
            if kw:
                row["err_vs_pruned_eager"] = max_rel(out, pruned_ref)
                row["err_vs_dense"] = max_rel(out, ref)
                rep = fn.sparsity_report
                row["sparsity_report"] = rep.summary()
                row["max_rel_change"] = rep.max_rel_change
                row["choices"] = [n for r in runners for n in r.plan.notes if "gemm_sp" in n]
                for n in row["choices"]:
                    print(f"    {n}", flush=True)
            else:
                row["err_dense"] = max_rel(out, ref)
    ms = row["ms"]
    row["sparse_over_dense"] = ms["tilefuse"] / ms["tilefuse 2:4"]
    print(f"| {name} | " + " | ".join(f"{ms.get(k, float('nan')):.3f}" for k in
                                      ("eager", "inductor", "torch 2:4 eager", "tilefuse", "tilefuse 2:4")) +
          f" | {row['sparse_over_dense']:.2f} | {row['max_rel_change']:.3e} | {row['err_vs_pruned_eager']:.2e} |",
          flush=True)
    print(f"    {row['sparsity_report']}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,llama")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_sparse_models: needs a CUDA GPU", file=sys.stderr)
        return 2
    import tilelang

    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "tilelang": tilelang.__version__, "python": platform.python_version(),
              "rows": []}
    print("| model | eager ms | Inductor ms | torch 2:4 eager ms | tilefuse ms | tilefuse 2:4 ms | 2:4 / dense "
          "tilefuse | outputs changed by pruning (rel) | 2:4 vs pruned eager (rel) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        try:
            result["rows"].append(bench(name, a.size, a.reps))
        except Exception as e:  # noqa: BLE001 -- the other models still run
            print(f"  {name}: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)
            result["rows"].append({"model": name, "error": f"{type(e).__name__}: {e}"})
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=1, default=str))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the 2:4 sparse GEMM template (``gemm_sp``) against dense torch (cuBLAS) on a GPU, fp16.

Usage (on the device machine):  python bench/bench_sparse.py [--shapes square|zoo|all] [--reps 20]
    [--json out.json] [--budget-s 220] [--configs all|first]

Each shape is a linear ``y = x @ W^T`` with x (M, K) and a 2:4-pruned W (N, K). Every config of the
template's config space is compiled (all shapes at once, in parallel, with ``compile_many``), checked
against cuBLAS on the same inputs (max |y - y_ref| / max |y_ref| <= 2e-2), then timed: median of ``--reps``
CUDA-event runs after warm-up (``bench_models.cuda_time_ms``). The table gives the best config, its time,
TFLOP/s counted dense-equivalent (2*M*N*K, as if the pruned half were computed) and the speedup over the
dense cuBLAS linear on the same (pruned, but stored dense) weight; torch's own 2:4 kernel
(``to_sparse_semi_structured``, cuSPARSELt/CUTLASS) is timed too where this torch build has it. A config
that fails to build, compile or run, or computes a wrong result, is reported and skipped; the shapes left
when ``--budget-s`` runs out are listed as skipped. A kernel that faults the GPU (an illegal address)
poisons the CUDA context for the rest of the process: the config about to run is printed first and the
JSON is written after every shape, so a crash still says where it stopped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import cuda_time_ms

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import gemm_sp
from tilefuse.ops.sparse_layout import compress_2_4, prune_2_4

# (label, M, N, K)
SQUARE = [("square", s, s, s) for s in (4096, 8192, 16384)]
ZOO = [  # the linears of the zoo's bench sizes (models/*.py): tokens = batch * seq
    ("gpt2 qkv", 8192, 2304, 768), ("gpt2 proj", 8192, 768, 768), ("gpt2 fc", 8192, 3072, 768),
    ("gpt2 fc2", 8192, 768, 3072), ("mlp fc1", 8192, 16384, 4096), ("mlp fc2", 8192, 4096, 16384),
    ("llama q/o", 8192, 2048, 2048), ("llama gate/up", 8192, 8192, 2048), ("llama down", 8192, 2048, 8192),
    ("bert fc", 16384, 3072, 768),
]
TOL = 2e-2


def tflops(M, N, K, ms) -> float:
    return 2.0 * M * N * K / ms / 1e9


def make_inputs(M, N, K, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = prune_2_4(torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen) / K ** 0.5)
    return x, w


def torch_sparse(x, w):
    """torch's own 2:4 linear (cuSPARSELt or CUTLASS), or None where this build/device has none."""
    try:
        from torch.sparse import to_sparse_semi_structured

        ws = to_sparse_semi_structured(w)
        fn = lambda: F.linear(x, ws)
        fn()
        return fn
    except Exception as e:  # noqa: BLE001 -- an optional peer
        print(f"    torch 2:4: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})",
              flush=True)
        return None


def bench_shape(label, M, N, K, configs, kernels, reps) -> dict:
    row = {"label": label, "M": M, "N": N, "K": K, "configs": []}
    x, w = make_inputs(M, N, K)
    values, meta = compress_2_4(w)
    dense = lambda: F.linear(x, w)
    want = dense().float()
    scale = float(want.abs().max())
    row["cublas_ms"] = cuda_time_ms(dense, reps=reps)
    sp = torch_sparse(x, w)
    row["torch_2_4_ms"] = cuda_time_ms(sp, reps=reps) if sp is not None else None
    for cfg, kern in zip(configs, kernels):
        entry = {"config": cfg}
        row["configs"].append(entry)
        if isinstance(kern, BaseException):
            entry["error"] = f"{type(kern).__name__}: {(str(kern).strip().splitlines() or [''])[-1][:200]}"
            continue
        print(f"    running {cfg}", flush=True)
        try:
            got = kern(x, values, meta).float()
            err = float((got - want).abs().max()) / scale
            entry["max_rel_err"] = err
            if not err <= TOL:
                entry["error"] = f"wrong result (max rel err {err:.2e})"
                continue
            entry["ms"] = cuda_time_ms(kern, x, values, meta, reps=reps)
            entry["tflops"] = tflops(M, N, K, entry["ms"])
        except Exception as e:  # noqa: BLE001 -- one config failing must not hide the others
            entry["error"] = f"run: {type(e).__name__}: {str(e)[:200]}"
    ok = [e for e in row["configs"] if "ms" in e]
    row["best"] = min(ok, key=lambda e: e["ms"]) if ok else None
    return row


def build_all(shapes, target, which: str):
    """(configs, prim_funcs) per shape; a config the template refuses gives its exception in place."""
    out = []
    for _, M, N, K in shapes:
        configs = gemm_sp.get_configs(target, K)
        configs = configs[:1] if which == "first" else configs
        funcs = []
        for c in configs:
            try:
                funcs.append(gemm_sp.gemm_sp(M, N, K, **c, target=target))
            except Exception as e:  # noqa: BLE001
                funcs.append(e)
        out.append((configs, funcs))
    return out


def print_row(r) -> None:
    b = r["best"]
    for e in r["configs"]:
        if "error" in e:
            print(f"    config {e['config']}: {e['error']}", flush=True)
    bc = "/".join(str(b["config"][k]) for k in ("block_M", "block_N", "block_K", "num_stages", "threads")) if b else "-"
    ms = b["ms"] if b else float("nan")
    sp = r["torch_2_4_ms"]
    print(f"| {r['label']} | {r['M']}x{r['N']}x{r['K']} | {bc} | {ms:.3f} | "
          f"{tflops(r['M'], r['N'], r['K'], ms):.0f} | {r['cublas_ms']:.3f} | "
          f"{tflops(r['M'], r['N'], r['K'], r['cublas_ms']):.0f} | {r['cublas_ms'] / ms:.2f} | "
          f"{f'{sp:.3f}' if sp else '-'} | {f'{sp / ms:.2f}' if sp else '-'} |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="all", choices=["square", "zoo", "all"])
    p.add_argument("--configs", default="all", choices=["all", "first"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=220.0, help="stop starting new shapes after this many seconds")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_sparse: needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    major, minor = torch.cuda.get_device_capability()
    target = {"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == 9 else "")}
    shapes = {"square": SQUARE, "zoo": ZOO, "all": SQUARE + ZOO}[a.shapes]
    import tilelang

    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "tilelang": tilelang.__version__, "python": platform.python_version(),
              "target": target, "rows": [], "skipped": []}
    built = build_all(shapes, target, a.configs)
    flat = [(f, [-1]) for _, funcs in built for f in funcs if not isinstance(f, BaseException)]
    compiled = iter(compile_many(flat, target, return_exceptions=True))
    kernels = [[f if isinstance(f, BaseException) else next(compiled) for f in funcs] for _, funcs in built]
    print(f"compiled {len(flat)} kernels for {len(shapes)} shapes in {time.monotonic() - t0:.0f} s", flush=True)
    print("| shape | MxNxK | best config (bM/bN/bK/stages/threads) | gemm_sp ms | TFLOP/s (dense-eq) | cuBLAS ms | "
          "cuBLAS TFLOP/s | x cuBLAS | torch 2:4 ms | x torch 2:4 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (label, M, N, K), (configs, _), kerns in zip(shapes, built, kernels):
        if time.monotonic() - t0 > a.budget_s:
            result["skipped"].append(label)
            print(f"  {label}: skipped (--budget-s {a.budget_s:.0f} s spent)", flush=True)
            continue
        try:
            row = bench_shape(label, M, N, K, configs, kerns, a.reps)
            result["rows"].append(row)
            print_row(row)
        except Exception as e:  # noqa: BLE001 -- e.g. out of memory: the other shapes still run
            print(f"  {label}: FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
            result["rows"].append({"label": label, "M": M, "N": N, "K": K, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
        if a.json:  # after every shape: a run cut short still leaves what it measured
            Path(a.json).write_text(json.dumps(result, indent=1, default=str))
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

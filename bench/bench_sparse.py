"""2:4 sparse GEMM (``gemm_sp``) against dense cuBLAS and torch's own semi-structured sparse, fp16, on a GPU.

Usage (on the device machine):
    python bench/bench_sparse.py [--shapes square,llm,zoo] [--space wide|seeds] [--reps 30] [--json out.json]
        [--budget-s 400] [--m 8192,16384]

Each shape is a linear ``y = epilogue(x @ W^T)`` with x (M, K) and a 2:4-pruned W (N, K): the squares (M = N = K),
LLM shapes (``llm``: LLaMA-3-8B's projections at M = 1 to 16384 tokens, and an 8192- and a 16384-wide one) and
the zoo's linears (``zoo``: their bias and GELU as the epilogue, as the plan fuses them). In one process:

* ``cuBLAS``: ``F.linear`` on the pruned weight stored dense (with the bias; the GELU after it, as torch runs it);
* ``torch 2:4``: ``F.linear`` on ``to_sparse_semi_structured(W)``, what a user of torch gets (cuSPARSELt here);
* ``cuSPARSELt*``: ``torch._cslt_sparse_mm`` called directly, the result transposed in the kernel: the same
  kernel without the tensor subclass's per-call work (the algorithm ``torch._cslt_sparse_mm_search`` picked ran
  200-370 ms a call on torch 2.11, 2026-12-01: the default algorithm is timed);
* ``CUTLASS``: torch's CUTLASS 2:4 kernel (``SparseSemiStructuredTensorCUTLASS``) where this build has it;
* ``gemm_sp``: every config of the template's space (``--space wide``: ``gemm_sp.config_space``; ``seeds``: its
  seeds) with the metadata laid out as the planner lays it out for this GPU (``sparsity.meta_k_major``), all
  shapes compiled in one parallel batch, each checked against cuBLAS on the same inputs
  (max |y - y_ref| / max |y_ref| <= 2e-2), the best one reported.

Times are medians with L2 flushed before every call (``kernels.time_ms``), warm-up excluded. TFLOP/s count the
dense-equivalent work, 2*M*N*K. A config that fails to build, compile or run, or computes a wrong result, is
reported and skipped; shapes left when ``--budget-s`` runs out are listed as skipped; the JSON is written after
every shape (a kernel that faults the GPU poisons the process: the config about to run is printed first).
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
from profile_kernels import time_ms

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import Acc, Arg, Call
from tilefuse.lowering.templates import gemm_sp
from tilefuse.ops.sparse_layout import compress_2_4, prune_2_4
from tilefuse.planner.sparsity import meta_k_major

# (label, M, N, K, epilogue): None, "bias" or "bias+gelu"
SQUARE = [("square", s, s, s, None) for s in (4096, 8192, 16384)]
LLAMA3_8B = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate+up", 28672, 4096), ("down", 4096, 14336)]
LLM = [(f"llama3-8b {name}", m, n, k, None) for m in (1, 16, 2048, 8192, 16384) for name, n, k in LLAMA3_8B]
LLM += [("wide", 4096, 16384, 16384, None)]
ZOO = [  # the zoo's linears at its bench sizes (models/*.py): tokens = batch * seq
    ("gpt2 qkv", 8192, 2304, 768, "bias"), ("gpt2 proj", 8192, 768, 768, "bias"),
    ("gpt2 fc", 8192, 3072, 768, "bias+gelu"), ("gpt2 fc2", 8192, 768, 3072, "bias"),
    ("mlp fc1", 8192, 16384, 4096, "bias+gelu"), ("mlp fc2", 8192, 4096, 16384, "bias"),
    ("llama q/o", 8192, 2048, 2048, None), ("llama gate/up", 8192, 8192, 2048, None),
    ("llama down", 8192, 2048, 8192, None), ("bert fc", 16384, 3072, 768, "bias+gelu"),
]
SETS = {"square": SQUARE, "llm": LLM, "zoo": ZOO}
TOL = 2e-2


def tflops(M, N, K, ms) -> float:
    return 2.0 * M * N * K / ms / 1e9


def epilogue_expr(kind):
    x = Acc() + Arg(0)
    return {None: None, "bias": x, "bias+gelu": Call("gelu", (x,), {"approximate": "none"})}[kind]


def torch_epilogue(kind, y):
    return F.gelu(y) if kind == "bias+gelu" else y


def make_inputs(M, N, K, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = prune_2_4(torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen) / K ** 0.5)
    b = torch.randn(N, device="cuda", dtype=torch.float16, generator=gen)
    return x, w, b


def _peer(name, make):
    try:
        fn = make()
        fn()
        return fn
    except Exception as e:  # noqa: BLE001 -- an optional peer
        print(f"    {name}: unavailable ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]})", flush=True)
        return None


def peers(x, w, b, kind) -> dict:
    """The peers' callables (None where unavailable)."""
    bias = b if kind else None
    out = {"cublas": lambda: torch_epilogue(kind, F.linear(x, w, bias))}

    def torch_2_4():
        from torch.sparse import to_sparse_semi_structured
        ws = to_sparse_semi_structured(w)
        return lambda: torch_epilogue(kind, F.linear(x, ws, bias))

    def cslt():
        packed = torch._cslt_compress(w)
        return lambda: torch_epilogue(kind, torch._cslt_sparse_mm(packed, x.t(), bias, transpose_result=True))

    def cutlass():
        from torch.sparse import SparseSemiStructuredTensorCUTLASS
        ws = SparseSemiStructuredTensorCUTLASS.from_dense(w)
        return lambda: torch_epilogue(kind, F.linear(x, ws, bias))

    for name, make in (("torch_2_4", torch_2_4), ("cusparselt", cslt), ("cutlass", cutlass)):
        out[name] = _peer(name, make)
    return out


def configs_for(M, K, target, space):
    cfgs = gemm_sp.config_space(target, K, meta_k_major=meta_k_major(target), seeds_only=space == "seeds", M=M)
    if M < gemm_sp.FEW_TOKENS:  # the narrow-token entries
        cfgs = [c for c in cfgs if c["block_M"] <= 64]
    return cfgs


def build_all(shapes, target, space):
    """(configs, prim_funcs) per shape; a config the template refuses gives its exception in place."""
    out = []
    for _, M, N, K, kind in shapes:
        configs = configs_for(M, K, target, space)
        funcs = []
        for c in configs:
            try:
                funcs.append(gemm_sp.gemm_sp(M, N, K, **c, meta_k_major=meta_k_major(target),
                                             epilogue=epilogue_expr(kind),
                                             extra_shapes=((N,),) if kind else (),
                                             extra_dtypes=("float16",) if kind else (), target=target))
            except Exception as e:  # noqa: BLE001
                funcs.append(e)
        out.append((configs, funcs))
    return out


def bench_shape(label, M, N, K, kind, configs, kernels, reps, k_major) -> dict:
    row = {"label": label, "M": M, "N": N, "K": K, "epilogue": kind, "configs": [], "peers": {}}
    x, w, b = make_inputs(M, N, K)
    values, meta = compress_2_4(w, k_major=k_major)
    extras = (b,) if kind else ()
    ps = peers(x, w, b, kind)
    want = ps["cublas"]().float()
    scale = float(want.abs().max())
    for name, fn in ps.items():
        if fn is not None:
            row["peers"][name] = time_ms(fn, reps=reps)
            if name != "cublas":
                row.setdefault("peer_err", {})[name] = float((fn().float() - want).abs().max()) / scale
    for cfg, kern in zip(configs, kernels):
        entry = {"config": cfg}
        row["configs"].append(entry)
        if isinstance(kern, BaseException):
            entry["error"] = f"{type(kern).__name__}: {(str(kern).strip().splitlines() or [''])[-1][:200]}"
            continue
        print(f"    running {cfg}", flush=True)
        args = (x, values, meta, *extras)
        try:
            got = kern(*args).float()
            err = float((got - want).abs().max()) / scale
            entry["max_rel_err"] = err
            if not err <= TOL:
                entry["error"] = f"wrong result (max rel err {err:.2e})"
                continue
            entry["ms"] = time_ms(kern, *args, reps=reps)
        except Exception as e:  # noqa: BLE001 -- one config failing must not hide the others
            entry["error"] = f"run: {type(e).__name__}: {str(e)[:200]}"
    ok = [e for e in row["configs"] if "ms" in e]
    row["best"] = min(ok, key=lambda e: e["ms"]) if ok else None
    return row


def short(cfg) -> str:
    return "/".join(str(cfg[k]) for k in ("block_M", "block_N", "block_K", "num_stages", "threads")) + \
        "/" + cfg.get("policy", "square")


def print_header() -> None:
    print("| shape | MxNxK | epilogue | best config (tok/rows/bK/stages/threads/policy) | gemm_sp ms | TFLOP/s | "
          "cuBLAS ms | x cuBLAS | torch 2:4 ms | x torch 2:4 | cuSPARSELt* ms | x cuSPARSELt* | CUTLASS ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def print_row(r) -> None:
    b = r["best"]
    for e in r["configs"]:
        if "error" in e:
            print(f"    config {short(e['config'])}: {e['error']}", flush=True)
    ms = b["ms"] if b else float("nan")
    p = r["peers"]
    f = lambda k: f"{p[k]:.4f}" if p.get(k) else "-"
    x = lambda k: f"{p[k] / ms:.2f}" if p.get(k) else "-"
    print(f"| {r['label']} | {r['M']}x{r['N']}x{r['K']} | {r['epilogue'] or '-'} | "
          f"{short(b['config']) if b else '-'} | "
          f"{ms:.4f} | {tflops(r['M'], r['N'], r['K'], ms):.0f} | {f('cublas')} | {x('cublas')} | {f('torch_2_4')} | "
          f"{x('torch_2_4')} | {f('cusparselt')} | {x('cusparselt')} | {f('cutlass')} |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="square,llm,zoo", help="comma-separated: " + ", ".join(SETS))
    p.add_argument("--space", default="wide", choices=["wide", "seeds"])
    p.add_argument("--m", help="comma-separated token counts: only the shapes with these M")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--budget-s", type=float, default=400.0, help="stop starting new shapes after this many seconds")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_sparse: needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    major, minor = torch.cuda.get_device_capability()
    target = {"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == 9 else "")}
    shapes = [s for name in a.shapes.split(",") for s in SETS[name]]
    if a.m:
        shapes = [s for s in shapes if s[1] in {int(m) for m in a.m.split(",")}]
    import tilelang

    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "tilelang": tilelang.__version__, "python": platform.python_version(),
              "cusparselt": getattr(torch.backends.cusparselt, "version", lambda: None)(),
              "target": target, "space": a.space, "meta_k_major": meta_k_major(target), "rows": [], "skipped": []}
    built = build_all(shapes, target, a.space)
    flat = [(f, [-1]) for _, funcs in built for f in funcs if not isinstance(f, BaseException)]
    compiled = iter(compile_many(flat, target, return_exceptions=True))
    kernels = [[f if isinstance(f, BaseException) else next(compiled) for f in funcs] for _, funcs in built]
    print(f"compiled {len(flat)} kernels for {len(shapes)} shapes in {time.monotonic() - t0:.0f} s", flush=True)
    print_header()
    for (label, M, N, K, kind), (configs, _), kerns in zip(shapes, built, kernels):
        if time.monotonic() - t0 > a.budget_s:
            result["skipped"].append(f"{label} {M}x{N}x{K}")
            continue
        try:
            row = bench_shape(label, M, N, K, kind, configs, kerns, a.reps, meta_k_major(target))
            result["rows"].append(row)
            print_row(row)
        except Exception as e:  # noqa: BLE001 -- e.g. out of memory: the other shapes still run
            print(f"  {label}: FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
            result["rows"].append({"label": label, "M": M, "N": N, "K": K, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
        if a.json:  # after every shape: a run cut short still leaves what it measured
            Path(a.json).write_text(json.dumps(result, indent=1, default=str))
    if result["skipped"]:
        print(f"skipped (budget): {', '.join(result['skipped'])}")
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every GEMM config of the template's space, at the zoo's GEMM shapes, against cuBLAS: is the untuned pick the best?

Usage (on the device machine):  python bench/sweep_gemm.py [--models gpt2,bert,llama,vit,mlp] [--json out.json]
                                [--widths 64,96,128,192,256]

Plans each zoo model (bench size, fp16, the CUDA target), takes its distinct ``gemm`` kernel specs (epilogues
included), compiles every config of ``gemm_configs.get_configs`` for each in one parallel batch, and times each
with cold caches (``lowering.timing.device_time``: CUDA-graph replays, each call on its own copy of the operands); cuBLAS is
``torch.matmul`` on the same operands (no epilogue), timed the same way. Prints per shape the untuned pick, the
best config and both against cuBLAS, and the configs within 2% of the best; writes all timings as JSON. Models may be
held-out ones (``bench/heldout.py``: ``timm-convnext``). ``--widths`` adds the ws GEMM's cooperative tiles of those
column widths (as many stages as fit; two output tiles taking turns too where an epilogue stages a full-size extra)
to each ws-eligible spec's candidates: for shapes whose N or K the seeds' widths fit badly (ConvNeXt-T's N and K 96).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout

from tilefuse.capture import capture_graphs
from tilefuse.lowering import tune
from tilefuse.lowering.dispatch import region_specs
from tilefuse.lowering.lower import config_space, default_config
from tilefuse.lowering.templates import gemm, gemm_ws
from tilefuse.pipeline import plan

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def gemm_specs(names: list[str]) -> dict:
    """Distinct GEMM specs of the zoo models, by (template, params, out_idx), with the models using them."""
    out: dict = {}
    for name in names:
        model, inputs = heldout.build(name, "bench")
        for graph in capture_graphs(model, inputs, lower=False, target=TARGET):
            for spec in region_specs(plan(graph, TARGET), TARGET).values():
                if spec.template == "gemm":
                    out.setdefault((spec.template, spec.params, spec.out_idx), (spec, set()))[1].add(name)
    return out


def add_widths(job, widths: list[int]) -> None:
    """``job``'s candidates and the ws GEMM's cooperative tiles of ``widths`` columns (``--widths``)."""
    kw = job.spec.factory_kwargs()
    if not widths or not gemm_ws.eligible(TARGET, **kw):
        return
    out = kw.get("out_dtype") or kw.get("B_dtype") or kw.get("A_dtype", "float16")
    staged = gemm.ws_staged_extra(kw["M"], kw["N"], kw.get("epilogue"), kw.get("extra_shapes") or (),
                                  kw.get("extra_dtypes") or (), out) is not None
    for bn in widths:
        for stages in (4, 5, 6):
            for turns in ((1, 2) if staged else (1,)):
                c = gemm_ws.seed(out, block_N=bn, stages=stages, extra_buffers=turns)
                if c in job.configs:
                    continue
                try:
                    job.funcs.append((tune.make_prim_func(job.spec, TARGET, c), list(job.spec.out_idx)))
                except Exception as e:  # noqa: BLE001 -- the template refuses it: dropped, as candidate_jobs does
                    print(f"  {bn}x{stages}x{turns}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                job.configs.append(c)
                job.idx.append(len(job.configs) - 1)


def cublas_ms(spec) -> float:
    """torch.matmul on operands of ``spec``'s shapes (cuBLAS), cold caches."""
    kw = spec.factory_kwargs()
    M, N, K = kw["M"], kw["N"], kw["K"]
    a = torch.randn(*kw.get("batch_A", ()), *((K, M) if kw.get("trans_A") else (M, K)), device="cuda",
                    dtype=torch.float16)
    b = torch.randn(*kw.get("batch_B", ()), *((N, K) if kw.get("trans_B") else (K, N)), device="cuda",
                    dtype=torch.float16)

    def f(a, b):
        return torch.matmul(a.mT if kw.get("trans_A") else a, b.mT if kw.get("trans_B") else b)

    return tune.device_time(f, (a, b), "cuda") * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,bert,llama,vit,mlp")
    ap.add_argument("--json")
    ap.add_argument("--widths", default="", help="column widths of ws tiles to add (e.g. 64,96,128,192,256)")
    ap.add_argument("--budget", type=int, default=14, help="configs per shape: the untuned pick, the leaders, then "
                    "the rest of the space by padded waves (tune.candidates' order)")
    args = ap.parse_args()
    import tilelang

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "tilelang": tilelang.__version__}
    t0 = time.perf_counter()
    specs = gemm_specs(args.models.split(","))
    space = len(config_space(next(iter(specs.values()))[0], TARGET)) if specs else 0
    jobs = tune.candidate_jobs([s for s, _ in specs.values()], TARGET, budget=args.budget)
    for job in jobs:
        add_widths(job, [int(w) for w in args.widths.split(",") if w])
    n = sum(len(j.funcs) for j in jobs)
    print(f"{len(specs)} distinct GEMM specs, {space} configs each, {n} kernels to compile", flush=True)
    tune.compile_jobs(jobs, TARGET)
    print(f"compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for job, (spec, users) in zip(jobs, specs.values()):
        kw = spec.factory_kwargs()
        timed, failed = tune.time_candidates(job, TARGET)
        pick = default_config(spec, TARGET)
        by_cfg = {json.dumps(job.configs[i], sort_keys=True): s * 1e3 for s, i in timed}
        ref = cublas_ms(spec)
        best_ms, best_i = min(timed) if timed else (None, None)
        pick_ms = by_cfg.get(json.dumps(pick, sort_keys=True))
        shape = f"{'x'.join(map(str, kw.get('batch_A', ())))}{'b ' if kw.get('batch_A') else ''}" \
                f"{kw['M']}x{kw['N']}x{kw['K']}"
        row = {"shape": shape, "models": sorted(users), "epilogue": str(kw.get("epilogue")), "cublas_ms": ref,
               "pick": pick, "pick_ms": pick_ms, "best": job.configs[best_i] if timed else None,
               "best_ms": best_ms * 1e3 if timed else None, "times": by_cfg,
               "failed": {json.dumps(job.configs[i], sort_keys=True): why for i, why in failed.items()}}
        rows.append(row)
        near = sorted((ms, c) for c, ms in by_cfg.items() if timed and ms <= best_ms * 1e3 * 1.02)
        print(f"{shape:24} {','.join(sorted(users)):18} cuBLAS {ref:8.4f} ms | pick "
              f"{pick_ms if pick_ms is not None else float('nan'):8.4f} ms ({ref / pick_ms if pick_ms else 0:.3f}x) | "
              f"best {row['best_ms'] or float('nan'):8.4f} ms ({ref / row['best_ms'] if row['best_ms'] else 0:.3f}x) "
              f"{row['best']} | {len(failed)} dropped", flush=True)
        for ms, c in near[:4]:
            print(f"    {ms:8.4f} {c}")
        if args.json:  # after every shape: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode-step attention on the GPU: one query per sequence against a static KV cache, the flash template's configs
(the default tile of query rows, and packed rows: ``attention.decode_configs``) against torch's SDPA as a Hugging Face
model calls it (kv heads repeated, an additive mask over the whole cache).

Usage (on the device machine):  python bench/bench_decode_attention.py [--out decode_attention.json] [--sweep]

``--sweep``: batch 1 only (a decode step of one sequence, where 8 programs hold the GPU), every packed tile of
``SWEEP_TILES`` with the key loop bounded, its keys split into 1-16 parts: the graph-replayed time (the parts'
combining kernel included) of each, for caches of 512 (256 filled) and 4096 (256 and 4000 filled).

Shapes: the decode benchmark's model (32 query heads, 8 kv heads, head dim 64, fp16), batch 1, 8 and 64, caches of 512
and 4096 positions of which the first ``fill`` are written (the mask hides the rest: 200 of 512, 300 and 4000 of 4096).
Configs: U the default tile of query rows, P packed rows, B packed rows with the key loop bounded by the mask; /n the
parts the keys split into. Timed with triton's do_bench (L2 flushed before each call) as plain calls and as a call
captured in a CUDA graph (what a plan runs: the host's wrapper work is out of it), with each config's kernels
profiled; every config compiled in one parallel batch first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from profile_kernels import profile, time_ms

from tilefuse.config import default_target
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import attention

HQ, HKV, D = 32, 8, 64


def graph_ms(fn, *args) -> float:
    """``time_ms`` of one call captured in a CUDA graph and replayed, as a plan runs it: the kernels' time without
    the host's (the wrapper's allocations and launches, which a plain call of a kernel this short waits on)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    return time_ms(g.replay)


SWEEP_TILES = [(64, 128, 2, 128), (64, 64, 2, 128), (16, 64, 2, 32), (16, 128, 2, 32)]


def sweep(target) -> list[dict]:
    """``--sweep``'s table: per shape, every tile x parts, by graph-replayed ms."""
    shapes = [(512, 256), (4096, 256), (4096, 4000)]
    cfgs = [{**attention._config(*t, pack=True, bound_keys=True), **({"splits": n} if n > 1 else {})}
            for t in SWEEP_TILES for n in (1, 2, 4, 8, 16)]
    items = [(attention.flash_attention(1, HQ, 1, L, D, Hkv=HKV, mask_shape=(1, 1, 1, L), mask_dtype="float16",
                                        dtype="float16", target=target, split_max=attention.SPLIT_MAX, **c),
              [-3, -2, -1]) for L, _ in shapes for c in cfgs]
    kernels = iter(compile_many(items, target, return_exceptions=True))
    rows = []
    for L, fill in shapes:
        q = torch.randn(1, HQ, 1, D, device="cuda", dtype=torch.float16)
        kc, vc = (torch.randn(1, HKV, L, D, device="cuda", dtype=torch.float16) for _ in range(2))
        mask = torch.zeros(1, 1, 1, L, device="cuda", dtype=torch.float16)
        mask[..., fill:] = float("-inf")
        want = F.scaled_dot_product_attention(q, kc.repeat_interleave(HQ // HKV, 1),
                                              vc.repeat_interleave(HQ // HKV, 1), attn_mask=mask).float()
        for c in cfgs:
            kern = next(kernels)
            row = {"cache": L, "fill": fill, "config": c}
            if isinstance(kern, BaseException):
                row["error"] = str(kern).splitlines()[0][:200]
            else:
                def run(*a, kern=kern):
                    return kern(*a)[-1]
                err = ((run(q, kc, vc, mask).float() - want).abs().max() / want.abs().max()).item()
                row |= {"graph_ms": graph_ms(run, q, kc, vc, mask), "rel_err": err}
            rows.append(row)
        done = sorted((r for r in rows if r["cache"] == L and r["fill"] == fill and "graph_ms" in r),
                      key=lambda r: r["graph_ms"])
        print(f"cache {L} fill {fill}: " + "; ".join(
            f"{r['config']['block_M']}x{r['config']['block_N']}s{r['config']['num_stages']}t{r['config']['threads']}"
            f"/{r['config'].get('splits', 1)} {r['graph_ms'] * 1e3:.2f}us (err {r['rel_err']:.0e})" for r in done),
            flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--sweep", action="store_true", help="batch 1: every packed tile x key parts (see the docstring)")
    a = ap.parse_args()
    target = default_target()
    if a.sweep:
        rows = sweep(target)
        if a.out:
            Path(a.out).write_text(json.dumps({"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                                                        "device": torch.cuda.get_device_name(),
                                                        "torch": torch.__version__}, "sweep": rows}, indent=1))
        return 0
    shapes = [(b, L, fill) for L, fill in ((512, 200), (4096, 300), (4096, 4000)) for b in (1, 8, 64)]
    def configs(b, L):  # the default tile, the packed default, then the planner's picks with the bound (and splits)
        bounded = attention.decode_configs(target, 1, HQ // HKV, True, B=b, Hkv=HKV, Skv=L)
        return ([attention.get_configs(target, D)[0], attention.decode_configs(target, 1, HQ // HKV)[0]]
                + bounded[:2 if bounded[0].get("splits") else 1])
    items, keys = [], []
    for b, L, _ in shapes:
        for k, cfg in enumerate(configs(b, L)):  # built as the planner builds them: room for the parts
            items.append((attention.flash_attention(b, HQ, 1, L, D, Hkv=HKV, mask_shape=(b, 1, 1, L),
                                                    mask_dtype="float16", dtype="float16", target=target,
                                                    split_max=attention.SPLIT_MAX, **cfg), [-3, -2, -1]))
            keys.append((b, L, k))
    kernels = dict(zip(keys, compile_many(items, target, return_exceptions=True)))
    rows = []
    for b, L, fill in shapes:
        q = torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.float16)
        kc = torch.randn(b, HKV, L, D, device="cuda", dtype=torch.float16)
        vc = torch.randn(b, HKV, L, D, device="cuda", dtype=torch.float16)
        mask = torch.zeros(b, 1, 1, L, device="cuda", dtype=torch.float16)
        mask[..., fill:] = float("-inf")

        def eager(q, kc, vc, mask):
            rep = HQ // HKV
            return F.scaled_dot_product_attention(q, kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1),
                                                  attn_mask=mask)
        want = eager(q, kc, vc, mask)
        row = {"batch": b, "cache": L, "fill": fill, "torch_ms": time_ms(eager, q, kc, vc, mask),
               "torch_graph_ms": graph_ms(eager, q, kc, vc, mask), "configs": []}
        for k, cfg in enumerate(configs(b, L)):
            kern = kernels[(b, L, k)]
            if isinstance(kern, BaseException):
                row["configs"].append({"config": cfg, "error": str(kern).splitlines()[0][:200]})
                continue

            def run(*a, kern=kern):
                return kern(*a)[-1]
            got = run(q, kc, vc, mask)
            err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            row["configs"].append({"config": cfg, "ms": time_ms(run, q, kc, vc, mask), "rel_err": err,
                                   "graph_ms": graph_ms(run, q, kc, vc, mask),
                                   "kernels": profile(run, q, kc, vc, mask, calls=10, top=4)["top"]})
        rows.append(row)
        best = min((c for c in row["configs"] if "ms" in c), key=lambda c: c["ms"])
        gbest = min((c for c in row["configs"] if "ms" in c), key=lambda c: c["graph_ms"])
        print(f"b={b:3} cache={L:5} fill={fill}: torch {row['torch_ms']:.4f} (graph {row['torch_graph_ms']:.4f}) ms; "
              + "; ".join(f"{'B' if c['config'].get('bound_keys') else 'P' if c['config'].get('pack') else 'U'}"
                          f"{c['config']['block_M']}x{c['config']['block_N']}/{c['config'].get('splits', 1)}"
                          f"s{c['config']['num_stages']}t{c['config']['threads']} {c.get('ms', float('nan')):.4f}"
                          f" (graph {c.get('graph_ms', float('nan')):.4f})"
                          for c in row["configs"]) + f" | best x torch {row['torch_ms'] / best['ms']:.2f}, in graphs "
              f"{row['torch_graph_ms'] / gbest['graph_ms']:.2f}", flush=True)
    if a.out:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
                "torch": torch.__version__}
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

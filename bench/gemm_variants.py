"""The zoo's hardest GEMM regions under every config and store variant, against cuBLAS: where does a gap come from?

Usage (on the device machine):  python bench/gemm_variants.py [--json out.json]

Takes the real unbatched GEMM region specs of the zoo models named (``sweep_gemm.gemm_specs``: e.g. GPT-2's LM head,
8192 x 50257 x 768, whose fp16 rows are not 16-byte aligned; the MLP block's 8192 x 16384 x 4096 with bias + GELU),
builds each with the first configs of the template's space. Two variants of the template were measured with it on
2026-12-01 (commit 0343a2d, ``bench/results/2026-12-01-h200-gemm-variants/``) and removed: ``persistent`` (one block
per SM walking the tiles with ``T.Persistent``: 0.75-0.96x the plain kernel at every zoo shape but one, and 256x192
tiles with a staged store no longer fit shared memory) and ``ldc`` (output rows padded to 8 for TMA stores: the LM
head 1.41 -> 1.24 ms, but the result is then a strided view, not eager's contiguous tensor, and a contiguous copy
makes it 2.10 ms). All candidates compile
in one parallel batch; each is timed with cold caches (``lowering.timing.device_time``). The torch rows are what
eager runs for the same region (cuBLAS ``addmm`` or ``linear``, then the elementwise ops).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from sweep_gemm import TARGET, gemm_specs  # bench/ is on the path when run as a script

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.lower import make_prim_func
from tilefuse.lowering.templates.gemm import reference
from tilefuse.lowering.templates.gemm_configs import get_configs
from tilefuse.lowering.timing import device_time


def operands(kw: dict) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    M, N, K = kw["M"], kw["N"], kw["K"]
    assert kw["trans_B"] and not kw["trans_A"] and not kw["batch_A"] and not kw["batch_B"], kw  # linears
    a = torch.randn(M, K, device="cuda", generator=g).half()
    b = (torch.randn(N, K, device="cuda", generator=g) / math.sqrt(K)).half()
    extras = [torch.randn(*s, device="cuda", generator=g).to(getattr(torch, dt))
              for s, dt in zip(kw["extra_shapes"], kw["extra_dtypes"])]
    return [a, b, *extras]


def torch_region(kw: dict):
    """What eager runs for the region: the product (with its bias) through cuBLAS, then the epilogue's ops."""
    gelu = "gelu" in str(kw.get("epilogue"))
    bias = next((k for k, s in enumerate(kw["extra_shapes"]) if math.prod(s) == kw["N"]), None)

    def f(a, b, *extras):
        y = F.linear(a, b, extras[bias].reshape(-1) if bias is not None else None)
        for k, e in enumerate(extras):
            if k != bias:
                y = y + e
        return F.gelu(y) if gelu else y
    return f


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--models", default="gpt2,mlp,llama")
    ap.add_argument("--configs", type=int, default=8, help="the space's first configs (the leaders first)")
    args = ap.parse_args()
    import tilelang

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "tilelang": tilelang.__version__}
    specs = [s for s, _ in gemm_specs(args.models.split(",")).values()]
    wanted = [s for s in specs if not s.factory_kwargs()["batch_A"] and not s.factory_kwargs()["batch_B"]]
    space = get_configs(TARGET, "float16")[:args.configs]
    cands = [(i, "plain", c) for i in range(len(wanted)) for c in space]
    funcs, t0 = [], time.perf_counter()
    for i, variant, c in cands:
        spec = wanted[i]
        funcs.append((make_prim_func(spec, TARGET, c), [-1]))
    kernels = compile_many(funcs, TARGET, return_exceptions=True)
    print(f"{len(wanted)} specs, {len(funcs)} kernels compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for i, spec in enumerate(wanted):
        kw = spec.factory_kwargs()
        ops = operands(kw)
        ref = torch_region(kw)
        torch_ms = device_time(ref, ops, "cuda") * 1e3
        mm_ms = device_time(lambda a, b: F.linear(a, b), ops[:2], "cuda") * 1e3
        shape = f"{kw['M']}x{kw['N']}x{kw['K']}"
        print(f"\n{shape} epilogue={kw.get('epilogue')}\n  torch region {torch_ms:.4f} ms, cuBLAS product alone "
              f"{mm_ms:.4f} ms", flush=True)
        expect = reference(ops[0], ops[1], ops[2:], trans_A=kw["trans_A"], trans_B=kw["trans_B"],
                           epilogue=kw.get("epilogue"), out_dtype="float32")
        res = []
        for (j, variant, c), k in zip(cands, kernels):
            if j != i:
                continue
            if isinstance(k, BaseException):
                res.append({"variant": variant, "config": c, "error": str(k).splitlines()[0][:200]})
                continue
            try:
                out, copy_ms = k(*ops), None
                err = ((out.float() - expect).abs().max() / expect.abs().max()).item()
                ms = device_time(k, ops, "cuda") * 1e3
            except Exception as e:  # noqa: BLE001 -- a launch the device refuses (shared memory) is a result
                res.append({"variant": variant, "config": c, "error": str(e).splitlines()[-1][:200]})
                continue
            res.append({"variant": variant, "config": c, "ms": ms, "with_copy_ms": copy_ms, "rel_err": err})
        res.sort(key=lambda r: r.get("ms", 1e9))
        for v in ("plain",):
            best = [r for r in res if r["variant"] == v and "ms" in r]
            failed = sum(1 for r in res if r["variant"] == v and "ms" not in r)
            if best:
                r = best[0]
                extra = f" (+contiguous copy {r['with_copy_ms']:.4f})" if r.get("with_copy_ms") else ""
                print(f"  best {v:10} {r['ms']:8.4f} ms {torch_ms / r['ms']:.3f}x torch{extra} err {r['rel_err']:.1e} "
                      f"{r['config']} ({failed} failed)", flush=True)
        rows.append({"shape": shape, "epilogue": str(kw.get("epilogue")), "torch_ms": torch_ms, "mm_ms": mm_ms,
                     "results": res})
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

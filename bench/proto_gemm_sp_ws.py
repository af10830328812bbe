"""Experiment (session 21, issue #20): a hand-written persistent, warp-specialized 2:4 sparse GEMM
``Y = X @ W^T + bias`` (fp16, fp32 accumulate) in TileLang, against cuBLAS on the pruned weight, torch's
semi-structured sparse linear (cuSPARSELt) and the ``gemm_sp`` template's leading seeds, at LLM shapes.

The recipe is ``attention_ws``'s and ``proto_gemm_ws``'s. As in ``gemm_sp``, the sparse operand of ``wgmma.sp`` is
the weight, so the kernel computes ``Y^T = W X^T``: a tile is ``block_N`` weight rows (64 per consumer warp group)
by ``block_M`` tokens (the wgmma's N, up to 256). One producer warp group issues TMA loads of the compressed
weight's values, its K-major metadata and the tokens into ``stages`` buffers behind full/empty mbarriers; two
consumer warp groups issue ``T.wgmma_gemm_sp`` and wait for each product (one kept in flight was wrong: session 24's
probe, ``gemm_sp_ws.py``'s note; the template's ``in_flight=0`` since), then transpose the
tile through shared memory (with the bias) into a TMA store they wait on only before the buffer's next use, so the
epilogue overlaps the producer's loads of the next tile. Persistent: ``min(SMs, tiles)`` programs, ``group`` token
tiles walking the weight tiles together (L2 reuse).

Usage (device):  python bench/proto_gemm_sp_ws.py [--json out.json]
Not measured yet (written without a GPU: the session had no device time); it lowers for sm_90a without spills. The
kernel lives in the template now (``gemm_sp(ws=True)``, ``lowering/templates/gemm_sp_ws.py``, with any epilogue).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tilefuse.lowering.expr import Acc, Arg
from tilefuse.lowering.templates import gemm_sp

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def gemm_sp_ws(M: int, N: int, K: int, *, block_M: int = 256, block_N: int = 128, block_K: int = 64,
               stages: int = 3, dtype: str = "float16"):
    """``Y = X W^T + bias`` through ``gemm_sp(ws=True)`` (``lowering/templates/gemm_sp_ws.py``, where this prototype now
    lives); parameters ``X (M, K), W_values (N, Kp/2), W_meta (Kp/16, N) int16 (K-major), bias (N), Y (M, N)``."""
    return gemm_sp.gemm_sp(M, N, K, dtype=dtype, epilogue=Acc() + Arg(0), extra_shapes=[(N,)], extra_dtypes=[dtype],
                           block_M=block_M, block_N=block_N, block_K=block_K, num_stages=stages, meta_k_major=True,
                           ws=True, target=TARGET)

# LLaMA-3-8B's projections at 8192 tokens, and the squares
SHAPES = [(8192, 8192, 8192), (16384, 16384, 16384), (8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096),
          (8192, 4096, 14336), (2048, 4096, 4096)]
CONFIGS = [{"block_M": bm, "block_N": 128, "block_K": bk, "stages": st}
           for bm, bk, st in ((256, 64, 3), (192, 64, 4), (128, 64, 5), (128, 128, 3), (192, 128, 2))]


def template(M: int, N: int, K: int, **c):
    """The TileLang-scheduled ``gemm_sp`` with the same bias epilogue (its measured seeds are the baseline)."""
    return gemm_sp.gemm_sp(M, N, K, epilogue=Acc() + Arg(0), extra_shapes=[(N,)], extra_dtypes=["float16"],
                           meta_k_major=True, target=TARGET, **c)


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F
    from proto_gemm_ws import build, time_kernels

    from tilefuse.lowering.compile import compile_many
    from tilefuse.lowering.timing import device_time
    from tilefuse.ops.sparse_layout import compress_2_4, prune_2_4
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    items, meta = [], []
    for M, N, K in SHAPES:
        seeds = gemm_sp.get_configs(TARGET, K, meta_k_major=True, M=M)[:3]  # the template's measured leaders
        i, m = build((M, N, K), [("ws", gemm_sp_ws, CONFIGS), ("template", template, seeds)])
        items, meta = items + i, meta + m
    kernels = compile_many(items, TARGET, return_exceptions=True)
    rows = []
    for M, N, K in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        w = prune_2_4(torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g) / K ** 0.5)
        b = torch.randn(N, device="cuda", dtype=torch.float16, generator=g)
        values, meta_t = compress_2_4(w, k_major=True)
        ref = device_time(lambda x, w, b: F.linear(x, w, b), (x, w, b), "cuda") * 1e3  # (rotated, as ours)
        try:
            from torch.sparse import to_sparse_semi_structured
            ws = to_sparse_semi_structured(w)
            t24 = device_time(lambda x, b, ws=ws: F.linear(x, ws, b), (x, b), "cuda") * 1e3
        except Exception as e:  # noqa: BLE001 -- an optional peer
            t24 = None
            print(f"   torch 2:4 unavailable ({type(e).__name__}: {str(e)[:120]})")
        print(f"{(M, N, K)}: cuBLAS {ref:.4f} ms, torch 2:4 {t24 if t24 else float('nan'):.4f} ms", flush=True)
        rows += time_kernels((M, N, K), meta, kernels, (x, values, meta_t, b), F.linear(x, w, b),
                             {"cuBLAS": ref, "torch 2:4": t24})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0

if __name__ == "__main__":
    sys.exit(main())

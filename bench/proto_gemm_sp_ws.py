"""Experiment (session 21, issue #20): a hand-written persistent, warp-specialized 2:4 sparse GEMM
``Y = X @ W^T + bias`` (fp16, fp32 accumulate) in TileLang, against cuBLAS on the pruned weight, torch's
semi-structured sparse linear (cuSPARSELt) and the ``gemm_sp`` template's leading seeds, at LLM shapes.

The recipe is ``attention_ws``'s and ``proto_gemm_ws``'s. As in ``gemm_sp``, the sparse operand of ``wgmma.sp`` is
the weight, so the kernel computes ``Y^T = W X^T``: a tile is ``block_N`` weight rows (64 per consumer warp group)
by ``block_M`` tokens (the wgmma's N, up to 256). One producer warp group issues TMA loads of the compressed
weight's values, its K-major metadata and the tokens into ``stages`` buffers behind full/empty mbarriers; two
consumer warp groups keep one ``wgmma.sp`` in flight (``T.wgmma_gemm_sp`` + ``T.wait_wgmma(1)``), then transpose the
tile through shared memory (with the bias) into a TMA store they wait on only before the buffer's next use, so the
epilogue overlaps the producer's loads of the next tile. Persistent: ``min(SMs, tiles)`` programs, ``group`` token
tiles walking the weight tiles together (L2 reuse).

Usage (device):  python bench/proto_gemm_sp_ws.py [--json out.json]
Not measured yet (written without a GPU: the session had no device time); it lowers for sm_90a without spills.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tilelang.language as T

from tilefuse.lowering.templates.common import param
from tilefuse.ops.sparse_layout import E_FACTOR, padded_k

PRODUCER_REGS, CONSUMER_REGS = 40, 232
SMEM_MAX = 227 * 1024


def smem_bytes(block_M: int, block_N: int, block_K: int, stages: int) -> int:
    """Operand stages (values, metadata, tokens) and the output tile, fp16."""
    stage = block_N * block_K // 2 * 2 + block_K // E_FACTOR * block_N * 2 + block_M * block_K * 2
    return stages * stage + block_M * block_N * 2


def gemm_sp_ws(M: int, N: int, K: int, *, block_M: int = 256, block_N: int = 128, block_K: int = 64,
               stages: int = 3, group: int = 8, sms: int = 132, dtype: str = "float16"):
    """Parameters ``X (M, K), W_values (N, Kp/2), W_meta (Kp/16, N) int16 (K-major), bias (N), Y (M, N)``."""
    accum = "float32"
    consumers = block_N // 64
    if block_N % 64 or consumers not in (1, 2):
        raise ValueError(f"gemm_sp_ws: block_N={block_N}: 64 weight rows per consumer warp group, 1 or 2 of them")
    if block_M % 16 or not 16 <= block_M <= 256:
        raise ValueError(f"gemm_sp_ws: block_M={block_M} tokens: a multiple of 16 up to 256 (the wgmma's N)")
    Kp = padded_k(K)
    if Kp % block_K or block_K % 32:
        raise ValueError(f"gemm_sp_ws: block_K={block_K} must be a multiple of 32 dividing the padded K={Kp}")
    if stages < 2:  # (a consumer frees a stage only once the next one's wgmma is issued)
        raise ValueError(f"gemm_sp_ws: {stages} stage(s); the pipeline needs at least 2")
    if smem_bytes(block_M, block_N, block_K, stages) > SMEM_MAX:
        raise ValueError(f"gemm_sp_ws: {smem_bytes(block_M, block_N, block_K, stages)} bytes of shared memory for "
                         f"{block_M}x{block_N}x{block_K} with {stages} stages; at most {SMEM_MAX}")
    threads = 128 * consumers
    tm, tn = -(-M // block_M), -(-N // block_N)
    tiles = tm * tn
    grid = min(sms, tiles)
    rounds = -(-tiles // grid)
    nk = Kp // block_K

    def where(t):
        """Token tile and weight tile of ``t``: ``group`` token tiles walk all weight tiles together."""
        per = group * tn
        g = t // per
        first = g * group
        rows = T.min(tm - first, group)
        r = t % per
        return first + r % rows, r // rows

    @T.prim_func
    def main():
        X = param("X", (M, K), dtype)
        W_values = param("W_values", (N, Kp // 2), dtype)
        W_meta = param("W_meta", (Kp // E_FACTOR, N), "int16")
        bias = param("bias", (N,), dtype)
        Y = param("Y", (M, N), dtype)
        with T.Kernel(grid, threads=threads + 128) as pid:
            A_s = T.alloc_shared((stages, block_N, block_K // 2), dtype)
            E_s = T.alloc_shared((stages, block_K // E_FACTOR, block_N), "int16")
            B_s = T.alloc_shared((stages, block_M, block_K), dtype)
            Y_s = T.alloc_shared((block_M, block_N), dtype)
            C_f = T.alloc_fragment((block_N, block_M), accum)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([threads] * stages)
            it = T.alloc_var("int32", init=0)
            if T.get_thread_binding() >= threads:
                T.dec_max_nreg(PRODUCER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        m0, n0 = bm * block_M, bn * block_N
                        for k in T.serial(nk):
                            s = (it + k) % stages
                            T.mbarrier_wait_parity(empty[s], (((it + k) // stages) % 2) ^ 1)
                            T.tma_copy(W_values[n0:n0 + block_N, k * (block_K // 2):(k + 1) * (block_K // 2)],
                                       A_s[s, :, :], barrier=full[s])
                            T.tma_copy(W_meta[k * (block_K // E_FACTOR):(k + 1) * (block_K // E_FACTOR),
                                              n0:n0 + block_N], E_s[s, :, :], barrier=full[s])
                            T.tma_copy(X[m0:m0 + block_M, k * block_K:(k + 1) * block_K], B_s[s, :, :],
                                       barrier=full[s])
                            T.barrier_arrive(full[s])
                        it = it + nk
            else:
                T.inc_max_nreg(CONSUMER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        m0, n0 = bm * block_M, bn * block_N
                        s0 = it % stages
                        T.mbarrier_wait_parity(full[s0], (it // stages) % 2)
                        T.wgmma_gemm_sp(A_s[s0, :, :], E_s[s0, :, :], B_s[s0, :, :], C_f, transpose_E=True,
                                        transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                        for k in T.serial(1, nk):
                            s = (it + k) % stages
                            T.mbarrier_wait_parity(full[s], ((it + k) // stages) % 2)
                            T.wgmma_gemm_sp(A_s[s, :, :], E_s[s, :, :], B_s[s, :, :], C_f, transpose_E=True,
                                            transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                            T.wait_wgmma(1)
                            T.barrier_arrive(empty[(it + k - 1) % stages])
                        T.wait_wgmma(0)
                        T.barrier_arrive(empty[(it + nk - 1) % stages])
                        it = it + nk
                        T.tma_store_wait()  # the previous tile's store has read Y_s
                        for i, j in T.Parallel(block_N, block_M):
                            Y_s[j, i] = T.Cast(dtype, C_f[i, j] + T.Cast(accum, bias[T.min(n0 + i, N - 1)]))
                        T.tma_copy(Y_s, Y[m0:m0 + block_M, n0:n0 + block_N])
                T.tma_store_wait()

    return main


# LLaMA-3-8B's projections at 8192 tokens, and the squares
SHAPES = [(8192, 8192, 8192), (16384, 16384, 16384), (8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096),
          (8192, 4096, 14336), (2048, 4096, 4096)]
CONFIGS = [{"block_M": bm, "block_N": 128, "block_K": bk, "stages": st}
           for bm, bk, st in ((256, 64, 3), (192, 64, 4), (128, 64, 5), (128, 128, 3), (192, 128, 2))]


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F

    from tilefuse.lowering.compile import compile_many
    from tilefuse.lowering.expr import Acc, Arg
    from tilefuse.lowering.templates import gemm_sp
    from tilefuse.lowering.timing import device_time
    from tilefuse.ops.sparse_layout import compress_2_4, prune_2_4
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    target = {"kind": "cuda", "arch": "sm_90a"}
    items, meta = [], []
    for M, N, K in SHAPES:
        for c in CONFIGS:
            try:
                items.append((gemm_sp_ws(M, N, K, **c), [-1]))
            except ValueError as e:
                print(f"{(M, N, K)} ws {c}: {e}")
                continue
            meta.append(((M, N, K), "ws " + json.dumps(c)))
        for c in gemm_sp.get_configs(target, K, meta_k_major=True, M=M)[:3]:  # the template's measured leaders
            items.append((gemm_sp.gemm_sp(M, N, K, epilogue=Acc() + Arg(0), extra_shapes=[(N,)],
                                          extra_dtypes=["float16"], meta_k_major=True, target=target, **c), [-1]))
            meta.append(((M, N, K), "template " + json.dumps(c)))
    kernels = compile_many(items, target, return_exceptions=True)
    rows = []
    for M, N, K in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        w = prune_2_4(torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g) / K ** 0.5)
        b = torch.randn(N, device="cuda", dtype=torch.float16, generator=g)
        values, meta_t = compress_2_4(w, k_major=True)
        want = F.linear(x, w, b)
        ref = device_time(lambda x, w, b: F.linear(x, w, b), (x, w, b), "cuda") * 1e3  # (rotated, as ours)
        line = f"{(M, N, K)}: cuBLAS {ref:.4f} ms"
        try:
            from torch.sparse import to_sparse_semi_structured
            ws = to_sparse_semi_structured(w)
            t24 = device_time(lambda x, b, ws=ws: F.linear(x, ws, b), (x, b), "cuda") * 1e3
            line += f", torch 2:4 {t24:.4f} ms"
        except Exception as e:  # noqa: BLE001 -- an optional peer
            t24 = None
            line += f", torch 2:4 unavailable ({type(e).__name__})"
        print(line, flush=True)
        for (shape, name), k in zip(meta, kernels):
            if shape != (M, N, K):
                continue
            if isinstance(k, BaseException):
                print(f"   {name}: ERROR {type(k).__name__}: {str(k)[:300]}", flush=True)
                continue
            args = (x, values, meta_t, b)
            try:
                got = k(*args)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- one kernel's launch failure is a row, not the end of the sweep
                print(f"   {name}: LAUNCH ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
            ms = device_time(k, args, "cuda") * 1e3 if err < 1e-2 else float("nan")
            vs = f"  x torch 2:4 {t24 / ms:.3f}" if t24 else ""
            print(f"   {name:90s} {ms:.4f} ms  x cuBLAS {ref / ms:.3f}{vs}  err {err:.1e}", flush=True)
            rows.append({"shape": [M, N, K], "name": name, "ms": ms, "cublas_ms": ref, "torch_2_4_ms": t24,
                         "err": err})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

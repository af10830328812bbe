"""Experiment (session 20): a hand-written persistent, warp-specialized GEMM ``C = A @ W^T + bias`` (fp16, fp32
accumulate) in TileLang, against cuBLAS (``torch.addmm``) and the gemm template's leading configs, at the zoo's linear
shapes. The recipe is ``attention_ws``'s: one producer warp group issues TMA loads into ``stages`` buffers guarded by
full/empty mbarriers; two consumer warp groups keep one WGMMA in flight (``T.wgmma_gemm`` + ``T.wait_wgmma(1)``) and
store each tile through shared memory with a TMA store they wait on only before the buffer's next use, so a tile's
epilogue runs while the producer already loads the next tile's operands.

``gemm_ws_pingpong`` (session 21, not measured yet): the consumer warp groups on separate tiles, taking turns.

Usage (device):  python bench/proto_gemm_ws.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tilelang.language as T

from tilefuse.lowering.templates.common import param

PRODUCER_REGS, CONSUMER_REGS = 40, 232
SMEM_MAX = 227 * 1024


def gemm_ws(M: int, N: int, K: int, *, block_M: int = 128, block_N: int = 256, block_K: int = 64, stages: int = 4,
            group: int = 8, sms: int = 132, dtype: str = "float16"):
    """``C (M, N) = A (M, K) @ W (N, K)^T + bias (N)``; tiles in groups of ``group`` row tiles (L2 reuse)."""
    accum = "float32"
    smem = (stages * (block_M + block_N) * block_K + block_M * block_N) * 2
    if smem > SMEM_MAX:  # (operand stages and the output tile; the H200 lets a block have 227 KB)
        raise ValueError(f"gemm_ws: {smem} bytes of shared memory for {block_M}x{block_N}x{block_K} with {stages} "
                         f"stages; at most {SMEM_MAX}")
    tm, tn = -(-M // block_M), -(-N // block_N)
    tiles = tm * tn
    grid = min(sms, tiles)
    rounds = -(-tiles // grid)
    nk = -(-K // block_K)

    def where(t):
        """Row and column tile of ``t``: ``group`` row tiles walk all column tiles together."""
        per = group * tn
        g = t // per
        first = g * group
        rows = T.min(tm - first, group)
        r = t % per
        return first + r % rows, r // rows

    @T.prim_func
    def main():
        A = param("A", (M, K), dtype)
        W = param("W", (N, K), dtype)
        bias = param("bias", (N,), dtype)
        C = param("C", (M, N), dtype)
        with T.Kernel(grid, threads=384) as pid:
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_N, block_K), dtype)
            C_s = T.alloc_shared((block_M, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([256] * stages)
            it = T.alloc_var("int32", init=0)
            if T.get_thread_binding() >= 256:
                T.dec_max_nreg(PRODUCER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        for k in T.serial(nk):
                            s = (it + k) % stages
                            T.mbarrier_wait_parity(empty[s], (((it + k) // stages) % 2) ^ 1)
                            T.tma_copy(A[bm * block_M:(bm + 1) * block_M, k * block_K:(k + 1) * block_K],
                                       A_s[s, :, :], barrier=full[s])
                            T.tma_copy(W[bn * block_N:(bn + 1) * block_N, k * block_K:(k + 1) * block_K],
                                       B_s[s, :, :], barrier=full[s])
                            T.barrier_arrive(full[s])
                        it = it + nk
            else:
                T.inc_max_nreg(CONSUMER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        s0 = it % stages
                        T.mbarrier_wait_parity(full[s0], (it // stages) % 2)
                        T.wgmma_gemm(A_s[s0, :, :], B_s[s0, :, :], C_f, transpose_B=True, clear_accum=True,
                                     policy=T.GemmWarpPolicy.FullRow)
                        for k in T.serial(1, nk):
                            s = (it + k) % stages
                            T.mbarrier_wait_parity(full[s], ((it + k) // stages) % 2)
                            T.wgmma_gemm(A_s[s, :, :], B_s[s, :, :], C_f, transpose_B=True,
                                         policy=T.GemmWarpPolicy.FullRow)
                            T.wait_wgmma(1)
                            T.barrier_arrive(empty[(it + k - 1) % stages])
                        T.wait_wgmma(0)
                        T.barrier_arrive(empty[(it + nk - 1) % stages])
                        it = it + nk
                        T.tma_store_wait()  # the previous tile's store has read C_s
                        for i, j in T.Parallel(block_M, block_N):
                            C_s[i, j] = T.Cast(dtype, C_f[i, j] + T.Cast(accum, bias[bn * block_N + j]))
                        T.tma_copy(C_s, C[bm * block_M:(bm + 1) * block_M, bn * block_N:(bn + 1) * block_N])
                T.tma_store_wait()

    return main



def gemm_ws_pingpong(M: int, N: int, K: int, *, block_M: int = 128, block_N: int = 128, block_K: int = 64,
                     stages: int = 4, group: int = 8, sms: int = 132, dtype: str = "float16"):
    """The same GEMM with the consumer warp groups on separate tiles, taking turns (CUTLASS's "ping-pong" schedule):
    each owns a ``block_M`` x ``block_N`` tile of its own (the CTA's even or odd tiles), and a named barrier lets a group
    start its main loop only once the other finished issuing its own, so one group's epilogue (bias, cast, shared
    memory, TMA store) runs under the other's WGMMAs instead of leaving the tensor cores idle. The producer fills one
    stage ring in tile order; a tile's k-block ``k`` is number ``t * nk + k`` of the ring, so no counter is shared.
    The turn also keeps a group from waiting on a stage's full barrier more than one phase ahead of it."""
    accum = "float32"
    smem = (stages * (block_M + block_N) * block_K + 2 * block_M * block_N) * 2
    if smem > SMEM_MAX:
        raise ValueError(f"gemm_ws_pingpong: {smem} bytes of shared memory for {block_M}x{block_N}x{block_K} with "
                         f"{stages} stages and two output tiles; at most {SMEM_MAX}")
    if block_M * block_N > 128 * 128:  # (a warp group's accumulator: 128 fp32 registers a thread at 128 x 128)
        raise ValueError(f"gemm_ws_pingpong: a {block_M}x{block_N} tile per warp group; at most 128 x 128 elements")
    tm, tn = -(-M // block_M), -(-N // block_N)
    tiles = tm * tn
    grid = min(sms, tiles)
    rounds = -(-tiles // grid)
    nk = -(-K // block_K)
    turn = 12  # named barriers 12 and 13 (TileLang numbers its own from 3)

    def where(t):
        per = group * tn
        g = t // per
        first = g * group
        rows = T.min(tm - first, group)
        r = t % per
        return first + r % rows, r // rows

    @T.macro
    def consumer(w, C_f, C_s, A_s, B_s, full, empty, bias, C, pid):
        """Warp group ``w``'s tiles: main loop in its turn, then the epilogue under the other's."""
        if w == 1:  # the first turn is group 0's
            T.named_barrier_arrive(turn, 256)
        for j in T.serial(-(-rounds // 2)):
            t = 2 * j + w
            if pid + t * grid < tiles:
                bm, bn = where(pid + t * grid)
                T.sync_threads(turn + w, 256)
                g0 = t * nk
                T.mbarrier_wait_parity(full[g0 % stages], (g0 // stages) % 2)
                T.wgmma_gemm(A_s[g0 % stages, :, :], B_s[g0 % stages, :, :], C_f, transpose_B=True,
                             clear_accum=True)
                for k in T.serial(1, nk):
                    g = t * nk + k
                    T.mbarrier_wait_parity(full[g % stages], (g // stages) % 2)
                    T.wgmma_gemm(A_s[g % stages, :, :], B_s[g % stages, :, :], C_f, transpose_B=True)
                    T.wait_wgmma(1)
                    T.barrier_arrive(empty[(g - 1) % stages])
                T.named_barrier_arrive(turn + 1 - w, 256)  # every product of this tile is issued
                T.wait_wgmma(0)
                T.barrier_arrive(empty[(g0 + nk - 1) % stages])
                T.tma_store_wait()  # this group's previous store has read C_s
                for i, jj in T.Parallel(block_M, block_N):
                    C_s[i, jj] = T.Cast(dtype, C_f[i, jj] + T.Cast(accum, bias[T.min(bn * block_N + jj, N - 1)]))
                T.tma_copy(C_s, C[bm * block_M:(bm + 1) * block_M, bn * block_N:(bn + 1) * block_N])
        T.tma_store_wait()

    @T.prim_func
    def main():
        A = param("A", (M, K), dtype)
        W = param("W", (N, K), dtype)
        bias = param("bias", (N,), dtype)
        C = param("C", (M, N), dtype)
        with T.Kernel(grid, threads=384) as pid:
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_N, block_K), dtype)
            C_s0 = T.alloc_shared((block_M, block_N), dtype)
            C_s1 = T.alloc_shared((block_M, block_N), dtype)
            C_f0 = T.alloc_fragment((block_M, block_N), accum)
            C_f1 = T.alloc_fragment((block_M, block_N), accum)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([128] * stages)  # (each fill is one warp group's)
            tx = T.get_thread_binding()

            if tx < 128:
                T.inc_max_nreg(CONSUMER_REGS)
                consumer(0, C_f0, C_s0, A_s, B_s, full, empty, bias, C, pid)
            elif tx < 256:
                T.inc_max_nreg(CONSUMER_REGS)
                consumer(1, C_f1, C_s1, A_s, B_s, full, empty, bias, C, pid)
            else:
                T.dec_max_nreg(PRODUCER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        for k in T.serial(nk):
                            g = t * nk + k
                            s = g % stages
                            T.mbarrier_wait_parity(empty[s], ((g // stages) % 2) ^ 1)
                            T.tma_copy(A[bm * block_M:(bm + 1) * block_M, k * block_K:(k + 1) * block_K],
                                       A_s[s, :, :], barrier=full[s])
                            T.tma_copy(W[bn * block_N:(bn + 1) * block_N, k * block_K:(k + 1) * block_K],
                                       B_s[s, :, :], barrier=full[s])
                            T.barrier_arrive(full[s])

    return main

SHAPES = [(8192, 3072, 768), (8192, 768, 768), (8192, 2304, 768), (8192, 768, 3072), (8192, 50264, 768),
          (8192, 5632, 2048), (8192, 8192, 8192)]
# (128 x 256 with 4 stages needs 256 KB: the first device run of this script stopped on it, 2026-12-03)
CONFIGS = [{"block_M": 128, "block_N": n, "block_K": 64, "stages": st} for n, st in ((256, 3), (192, 4), (128, 5),
                                                                                    (128, 4))]
# ping-pong: a tile per consumer warp group (128 fp32 accumulators a thread), two output tiles in shared memory
PINGPONG_CONFIGS = [{"block_M": m, "block_N": n, "block_K": 64, "stages": st}
                    for m, n, st in ((128, 128, 4), (128, 128, 5), (64, 256, 3), (64, 256, 4))]


def main(argv=None) -> int:
    import torch

    from tilefuse.lowering.compile import compile_many
    from tilefuse.lowering.templates import gemm
    from tilefuse.lowering.timing import device_time
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    target = {"kind": "cuda", "arch": "sm_90a"}
    items, meta = [], []
    ep = None
    for M, N, K in SHAPES:
        for c in CONFIGS:
            try:
                items.append((gemm_ws(M, N, K, **c), [-1]))
            except ValueError as e:
                print(f"{(M, N, K)} ws {c}: {e}")
                continue
            meta.append(((M, N, K), "ws " + json.dumps(c)))
        for c in PINGPONG_CONFIGS:
            try:
                items.append((gemm_ws_pingpong(M, N, K, **c), [-1]))
            except ValueError as e:
                print(f"{(M, N, K)} ws pingpong {c}: {e}")
                continue
            meta.append(((M, N, K), "ws pingpong " + json.dumps(c)))
        for bm, bn, st, th in ((256, 192, 4, 384), (128, 256, 4, 256)):  # the template's measured leaders
            from tilefuse.lowering.expr import Acc, Arg
            ep = Acc() + Arg(0)
            items.append((gemm.gemm(M, N, K, trans_B=True, epilogue=ep, extra_shapes=[(N,)],
                                    extra_dtypes=["float16"], block_M=bm, block_N=bn, block_K=64, num_stages=st,
                                    threads=th, target=target), [-1]))
            meta.append(((M, N, K), f"template {bm}/{bn}/64/{st}/{th}"))
    kernels = compile_many(items, target, return_exceptions=True)
    rows = []
    for M, N, K in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        w = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g) / K ** 0.5
        b = torch.randn(N, device="cuda", dtype=torch.float16, generator=g)
        want = torch.addmm(b, x, w.t())
        ref = device_time(lambda b, x, w: torch.addmm(b, x, w.t()), (b, x, w), "cuda") * 1e3  # (rotated, as ours)
        print(f"{(M, N, K)}: cuBLAS addmm {ref:.4f} ms", flush=True)
        for (shape, name), k in zip(meta, kernels):
            if shape != (M, N, K):
                continue
            if isinstance(k, BaseException):
                print(f"   {name}: ERROR {type(k).__name__}: {str(k)[:300]}", flush=True)
                continue
            args = (x, w, b)
            try:
                got = k(*args)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- one kernel's launch failure is a row, not the end of the sweep
                print(f"   {name}: LAUNCH ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
            ms = device_time(k, args, "cuda") * 1e3 if err < 1e-2 else float("nan")
            print(f"   {name:75s} {ms:.4f} ms  x cuBLAS {ref / ms:.3f}  err {err:.1e}", flush=True)
            rows.append({"shape": [M, N, K], "name": name, "ms": ms, "cublas_ms": ref, "err": err})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

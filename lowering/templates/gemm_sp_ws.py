"""2:4 sparse linear on Hopper with a hand-written producer/consumer pipeline (``gemm_sp(ws=True)``), ``gemm_ws``'s
recipe on ``gemm_sp``'s transposed product ``Y^T = W X^T``.

Note: a tile is ``block_N`` weight rows (64 per consumer warp group, ``wgmma.sp``'s M) by ``block_M`` tokens (its N,
at most 256). The kernel is persistent (``min(SMs, tiles)`` programs, ``group`` token tiles walking the weight tiles
together); one producer warp group issues TMA loads of the compressed weight's values, its K-major metadata and the
tokens into ``num_stages`` buffers behind full/empty mbarriers; two consumer warp groups issue ``T.wgmma_gemm_sp`` and
wait for each product (``in_flight``), then transpose the tile through shared memory, with the epilogue
(its full-size extra inputs staged through shared memory first, as ``gemm_sp`` does), into a TMA store they wait on
only before the buffer's next use.

What it takes (``eligible``): a CUDA sm_90 target, fp16/bf16, K-major metadata (the sm_90 planner's layout), and rows
TMA can address (16-byte multiples: X's, the metadata's (N int16) and Y's). Tails: TMA loads zero-fill past M, N and
K, the TMA store clips; epilogue operands are read at clamped coordinates.

**One product in flight was wrong; none is right; not offered anywhere yet**: on the H200 (2026-12-03,
``bench/diag_gemm_ws.py``) 4096 x 2048 x 512 with no epilogue (256 tiles: two rounds per program) came out wrong in
~77% of its elements (every row but the first 16) while the consumers kept one ``wgmma.sp`` product in flight
(``T.wait_wgmma(1)``), where 2048 x 1024 x 1024 with a bias, 1000 x 1024 x 776 with a staged ``silu(up) *`` and
8192^3 / 16384^3 with a bias (``bench/proto_gemm_sp_ws.py``: 0.89-0.92x torch's cuSPARSELt) were right. A bias, or 2
stages instead of 3, made that shape right; one round, K 1024, 128-token tiles, 3 rounds stayed wrong. The cause:
``wgmma.sp`` takes its metadata from registers, which the next k-block's loads overwrite while the product that
reads them is still running. **Confirmed** (session 24's probe, ``bench/results/2026-12-03-h200-session24``): with
``in_flight=0``, each product waited for before the next metadata loads, the wrong shape and its K 1024 variant come
out right. ``in_flight=0`` is therefore the default; its speed is not yet measured (``proto_gemm_sp_ws.py``), and
keeping a product in flight safely would need the metadata registers double-buffered, which happens inside TileLang's
``wgmma_gemm_sp`` lowering, out of this template's reach. No config space offers it (``Options.experimental``
"gemm_sp_ws" is gone) until it is measured against ``gemm_sp``'s pipelined schedule and cuSPARSELt.
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.language as T

from tilefuse.config import device_facts
from tilefuse.lowering.templates.common import param, target_kind
from tilefuse.lowering.templates.gemm_ws import CONSUMER_REGS, ITEM, PRODUCER_REGS, SMEM_MAX, grouped
from tilefuse.ops.sparse_layout import E_FACTOR, SPARSE_DTYPES, padded_k


def eligible(target: dict | str, *, N: int, K: int, dtype: str = "float16", out_dtype: str | None = None,
             meta_k_major: bool = False, **_: object) -> bool:
    """Whether ``gemm_sp_ws`` builds this 2:4 linear (legality only; which schedule wins is measured)."""
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    out = out_dtype or dtype
    return (target_kind(target) == "cuda" and arch.startswith("sm_90") and dtype in SPARSE_DTYPES
            and out in ITEM and bool(meta_k_major) and K * 2 % 16 == 0 and N * 2 % 16 == 0
            and N * ITEM[out] % 16 == 0)


def smem_bytes(block_M: int, block_N: int, block_K: int, num_stages: int, out_dtype: str = "float16",
               staged: Sequence[str] = ()) -> int:
    """Operand stages (values, metadata, tokens), the output tile and the staged extras' tiles (their dtypes)."""
    stage = block_N * block_K // 2 * 2 + block_K // E_FACTOR * block_N * 2 + block_M * block_K * 2
    return num_stages * stage + block_M * block_N * (ITEM[out_dtype] + sum(ITEM[d] for d in staged))


def seed(K: int, out_dtype: str = "float16", staged: Sequence[str] = ()) -> dict | None:
    """The config ``Options.experimental`` "gemm_sp_ws" puts first: 256 tokens by 128 weight rows (else 128 by 128),
    64 deep where that divides the padded K (else 32), as many stages (at most 3) as shared memory holds; None where
    even 2 do not fit."""
    block_K = 64 if padded_k(K) % 64 == 0 else 32
    for block_M in (256, 128):
        for stages in (3, 2):
            if smem_bytes(block_M, 128, block_K, stages, out_dtype, staged) <= SMEM_MAX:
                return {"block_M": block_M, "block_N": 128, "block_K": block_K, "num_stages": stages, "ws": True}
    return None


def gemm_sp_ws(M: int, N: int, K: int, *, dtype: str, out_dtype: str, y_elem, extra_shapes, extra_dtypes,
               staged: Sequence[int], block_M: int, block_N: int, block_K: int, num_stages: int, group: int = 8,
               in_flight: int = 0, target: dict | str):
    """The warp-specialized ``T.prim_func`` (parameters ``X, W_values, W_meta, extra_0.., Y``; the metadata
    K-major); ``gemm_sp`` checks the arguments and passes ``y_elem(C_f, extras, tiles, i, j, m0, n0)``, accumulator
    element (weight row i, token j) through the epilogue, and the ``staged`` extras' indices. ``in_flight``: the
    ``wgmma.sp`` products a consumer leaves running while it loads the next k-block's metadata: 0 (the default) waits
    for each; 1 is wrong on the H200 (the note above), kept for ``bench/diag_gemm_ws.py --sparse-probe``."""
    if in_flight not in (0, 1):
        raise ValueError(f"gemm_sp(ws=True): in_flight={in_flight}: 0 or 1 products in flight")
    accum = "float32"
    consumers = block_N // 64
    if block_N % 64 or consumers not in (1, 2):
        raise ValueError(f"gemm_sp(ws=True): block_N={block_N}: 64 weight rows per consumer warp group, 1 or 2")
    if block_M % 16 or not 16 <= block_M <= 256:
        raise ValueError(f"gemm_sp(ws=True): block_M={block_M} tokens: a multiple of 16 up to 256 (the wgmma's N)")
    Kp = padded_k(K)
    if Kp % block_K or block_K % 32:
        raise ValueError(f"gemm_sp(ws=True): block_K={block_K} must be a multiple of 32 dividing the padded K={Kp}")
    if num_stages < 2:  # (a consumer frees a stage only once the next one's wgmma is issued)
        raise ValueError(f"gemm_sp(ws=True): {num_stages} stage(s); the pipeline needs at least 2")
    staged_dtypes = [extra_dtypes[k] for k in staged]
    need = smem_bytes(block_M, block_N, block_K, num_stages, out_dtype, staged_dtypes)
    if need > SMEM_MAX:
        raise ValueError(f"gemm_sp(ws=True): {need} bytes of shared memory for {block_M}x{block_N}x{block_K}, "
                         f"{num_stages} stages, {len(staged)} staged extras; at most {SMEM_MAX}")
    threads = 128 * consumers
    tm, tn = -(-M // block_M), -(-N // block_N)
    tiles = tm * tn
    grid = min(device_facts(target).sms, tiles)
    rounds = -(-tiles // grid)
    nk = Kp // block_K

    def where(t):
        """Token tile and weight tile of ``t``: ``group`` token tiles walk all weight tiles together."""
        return grouped(t, tm, tn, group)

    @T.prim_func
    def gemm_sp_ws_kernel():
        X = param("X", (M, K), dtype)
        W_values = param("W_values", (N, Kp // 2), dtype)
        W_meta = param("W_meta", (Kp // E_FACTOR, N), "int16")
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Y = param("Y", (M, N), out_dtype)
        with T.Kernel(grid, threads=threads + 128) as pid:
            A_s = T.alloc_shared((num_stages, block_N, block_K // 2), dtype)
            E_s = T.alloc_shared((num_stages, block_K // E_FACTOR, block_N), "int16")
            B_s = T.alloc_shared((num_stages, block_M, block_K), dtype)
            Y_s = T.alloc_shared((block_M, block_N), out_dtype)
            tiles_s = {k: T.alloc_shared((block_M, block_N), extra_dtypes[k]) for k in staged}
            C_f = T.alloc_fragment((block_N, block_M), accum)
            full = T.alloc_barrier([128] * num_stages)
            empty = T.alloc_barrier([threads] * num_stages)
            if T.get_thread_binding() >= threads:
                T.dec_max_nreg(PRODUCER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        m0, n0 = bm * block_M, bn * block_N
                        for k in T.serial(nk):
                            g = t * nk + k
                            s = g % num_stages
                            T.mbarrier_wait_parity(empty[s], ((g // num_stages) % 2) ^ 1)
                            T.tma_copy(W_values[n0:n0 + block_N, k * (block_K // 2):(k + 1) * (block_K // 2)],
                                       A_s[s, :, :], barrier=full[s])
                            T.tma_copy(W_meta[k * (block_K // E_FACTOR):(k + 1) * (block_K // E_FACTOR),
                                              n0:n0 + block_N], E_s[s, :, :], barrier=full[s])
                            T.tma_copy(X[m0:m0 + block_M, k * block_K:(k + 1) * block_K], B_s[s, :, :],
                                       barrier=full[s])
                            T.barrier_arrive(full[s])
            else:
                T.inc_max_nreg(CONSUMER_REGS)
                for t in T.serial(rounds):
                    if pid + t * grid < tiles:
                        bm, bn = where(pid + t * grid)
                        m0, n0 = bm * block_M, bn * block_N
                        g0 = t * nk
                        T.mbarrier_wait_parity(full[g0 % num_stages], (g0 // num_stages) % 2)
                        T.wgmma_gemm_sp(A_s[g0 % num_stages, :, :], E_s[g0 % num_stages, :, :],
                                        B_s[g0 % num_stages, :, :], C_f, transpose_E=True, transpose_B=True,
                                        clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                        if in_flight == 0:
                            T.wait_wgmma(0)
                            T.barrier_arrive(empty[g0 % num_stages])
                        for k in T.serial(1, nk):
                            g = g0 + k
                            T.mbarrier_wait_parity(full[g % num_stages], (g // num_stages) % 2)
                            T.wgmma_gemm_sp(A_s[g % num_stages, :, :], E_s[g % num_stages, :, :],
                                            B_s[g % num_stages, :, :], C_f, transpose_E=True, transpose_B=True,
                                            policy=T.GemmWarpPolicy.FullRow)
                            T.wait_wgmma(in_flight)
                            T.barrier_arrive(empty[(g - in_flight) % num_stages])
                        if in_flight:
                            T.wait_wgmma(0)
                            T.barrier_arrive(empty[(g0 + nk - 1) % num_stages])
                        for k in staged:  # full-size extras: one coalesced tile copy each, read transposed below
                            T.copy(extras[k][m0, n0], tiles_s[k])
                        T.tma_store_wait()  # (the issuing thread) the previous tile's store has read Y_s
                        for i, j in T.Parallel(block_N, block_M):
                            Y_s[j, i] = y_elem(C_f, extras, tiles_s, i, j, m0, n0)  # (in out_dtype)
                        T.tma_copy(Y_s, Y[m0:m0 + block_M, n0:n0 + block_N])
                T.tma_store_wait()

    return gemm_sp_ws_kernel

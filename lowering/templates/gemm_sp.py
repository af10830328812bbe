"""2:4 sparse linear with a fused epilogue: ``Y = epilogue(X @ W^T, extras...)``, W given compressed.

Note: ``T.gemm_sp`` sparsifies its *A* operand along K, while a linear's sparse operand is its weight,
the right-hand side. So the kernel computes the transposed product ``Y^T = W @ X^T``: the compressed
weight is A (``W_values`` (N, Kp/2), ``W_meta`` (N, Kp/16) int16, see ``tilefuse.ops.sparse_layout``), X (M, K) is
B read K-major (``transpose_B``), and each accumulator tile (block_N weight rows x block_M tokens) is
transposed through shared memory on its way out, so Y is stored row-major with coalesced writes. The
epilogue (``gemm.epilogue_at``, the dense template's) reads its extra inputs at Y's coordinates, those of Y's full
shape from a shared-memory copy of their tile (``staged_extras``).

Tails: the weight side is padded to Kp (a multiple of 32) by the compressor and ``block_K`` must divide
Kp; X keeps its K, and ``T.copy`` zero-fills the part of its last K tile past K, as it does for M and N
tiles past the edge (the store is guarded). Known TileLang 0.1.15 wrong code (TILELANG.md): a tile
extent of 8 mod 16 on the dense side and a K that is not a multiple of 32, hence ``block_M``/``block_N``
multiples of 16 and the padded Kp. There is no gemm_sp on CPU targets: there the region's weight is
decompressed and the dense ``gemm`` template runs (the planner arranges it).
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.language as T
import torch

from tilefuse.lowering.expr import Expr, evaluate
from tilefuse.lowering.templates import gemm_sp_ws
from tilefuse.lowering.templates.common import check_dtype, dialect, normalize_shapes, param
from tilefuse.lowering.templates.gemm import epilogue_at, fast_epilogue, staged_extras
from tilefuse.lowering.templates.gemm_configs import SMEM_LIMIT, wave_cost
from tilefuse.ops.sparse_layout import E_FACTOR, K_ALIGN, SPARSE_DTYPES, decompress_2_4, padded_k

META_DTYPE = "int16"
POLICIES = {"square": "Square", "full_row": "FullRow", "full_col": "FullCol"}


def gemm_sp(
    M: int,
    N: int,
    K: int,
    *,
    dtype: str = "float16",
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    epilogue: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    block_M: int = 128,
    block_N: int = 128,
    block_K: int = 64,
    num_stages: int = 2,
    threads: int = 128,
    enable_rasterization: bool = False,
    panel_size: int = 10,
    policy: str = "square",
    meta_k_major: bool = False,
    ws: bool = False,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` for ``Y = epilogue(X @ W^T)``; parameters ``X, W_values, W_meta, extra_0.., Y``.

    ``X`` is (M, K) in ``dtype`` (fp16/bf16), the weight W (N, K) arrives as ``compress_2_4(W, meta_k_major)``:
    values (N, Kp/2) in ``dtype`` and metadata (N, Kp/16) int16 with Kp = ``padded_k(K)``, or (Kp/16, N) with
    ``meta_k_major`` (read with ``transpose_E``; on sm_90 a TMA load at any ``block_K``). ``epilogue`` reads the
    fp32 accumulator (``Acc``) and ``Arg(i)`` = ``extra_i`` broadcast against Y (M, N); Y is ``out_dtype``.
    Tunables: ``block_M`` (tokens per tile), ``block_N`` (weight rows per tile), ``block_K`` (a multiple of
    32 dividing Kp), ``num_stages``, ``threads``, ``enable_rasterization`` with ``panel_size``, and ``policy``:
    how the warps split the (weight rows x tokens) accumulator, one of ``POLICIES``. On sm_90 a warpgroup's
    ``wgmma.sp`` is 64 weight rows by as many tokens as its share of the tile: ``"full_row"`` gives each
    warpgroup 64 rows and every token of the tile (m64n256 on a 256-token tile), ``"square"`` splits the
    tokens between warpgroups too (m64n64 on the same tile, reading the X tile from shared memory four
    times as often per multiply). ``ws``: the hand-written warp-specialized, persistent schedule (``gemm_sp_ws``; an
    error where it does not apply; ``policy``, ``threads`` and the rasterization are its own there).
    """
    out_dtype = out_dtype or dtype
    extra_shapes = normalize_shapes(extra_shapes)
    if dialect(target).cpu:
        raise NotImplementedError("gemm_sp: the c target has no sparse tensor cores (no T.gemm_sp); run the dense "
                                  "gemm template on the decompressed weight")
    if dtype not in SPARSE_DTYPES:
        raise NotImplementedError(f"gemm_sp: 2:4 sparse tensor cores multiply {'/'.join(SPARSE_DTYPES)}, not {dtype}")
    if len(extra_dtypes) != len(extra_shapes):
        raise ValueError("gemm_sp: one dtype per extra input")
    for dt in (out_dtype, *extra_dtypes):
        check_dtype(dt, target, "gemm_sp")
    Kp = padded_k(K)
    if block_K % K_ALIGN or Kp % block_K:
        raise ValueError(f"gemm_sp: block_K={block_K} must be a multiple of {K_ALIGN} dividing the padded K={Kp}")
    if block_M % 16 or block_N % 16:
        raise ValueError(f"gemm_sp: block_M={block_M} and block_N={block_N} must be multiples of 16 (TileLang 0.1.15 "
                         "computes wrong results for tiles of 8 mod 16)")
    if policy not in POLICIES:
        raise ValueError(f"gemm_sp: policy={policy!r} is not one of {sorted(POLICIES)}")
    warp_policy = getattr(T.GemmWarpPolicy, POLICIES[policy])
    swizzle = bool(enable_rasterization)

    # Extra inputs of the output's full shape (LLaMA's up projection under silu(gate) * up) are staged through
    # shared memory with one coalesced tile copy: read at the accumulator's (weight row, token) layout they would be
    # a strided gather (8192 x 8192 x 2048: 0.85 ms against 0.34 ms without the epilogue, H200 2026-12-01).
    staged = staged_extras(M, N, epilogue, extra_shapes)
    fast = fast_epilogue(target, out_dtype)  # (the dense template's rule)

    def Y_elem(C_f, extras, tiles, i, j, m0, n0):
        """Accumulator element (weight row i, token j) -> Y[m0 + j, n0 + i] through the epilogue."""
        if epilogue is None:
            return T.Cast(out_dtype, C_f[i, j])
        m, n = T.min(m0 + j, M - 1), T.min(n0 + i, N - 1)  # clamped: values past the edge are never stored
        return T.Cast(out_dtype, epilogue_at(epilogue, C_f[i, j], extras, extra_shapes, [m, n], accum_dtype,
                                             staged={k: tile[j, i] for k, tile in tiles.items()}, fast=fast))

    if ws:
        if not gemm_sp_ws.eligible(target, N=N, K=K, dtype=dtype, out_dtype=out_dtype, meta_k_major=meta_k_major):
            raise ValueError("gemm_sp: ws=True needs a CUDA sm_90 target, K-major metadata and rows of 16-byte "
                             "multiples (X's, the metadata's, Y's)")
        return gemm_sp_ws.gemm_sp_ws(M, N, K, dtype=dtype, out_dtype=out_dtype, y_elem=Y_elem,
                                     extra_shapes=extra_shapes, extra_dtypes=extra_dtypes, staged=staged,
                                     block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages,
                                     target=target)

    @T.prim_func
    def gemm_sp_kernel():
        X = param("X", (M, K), dtype)
        W_values = param("W_values", (N, Kp // 2), dtype)
        W_meta = param("W_meta", (Kp // E_FACTOR, N) if meta_k_major else (N, Kp // E_FACTOR), META_DTYPE)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Y = param("Y", (M, N), out_dtype)
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_N, block_K // 2), dtype)
            E_s = T.alloc_shared((block_K // E_FACTOR, block_N) if meta_k_major else (block_N, block_K // E_FACTOR),
                                 META_DTYPE)
            B_s = T.alloc_shared((block_M, block_K), dtype)
            C_f = T.alloc_fragment((block_N, block_M), accum_dtype)
            Y_s = T.alloc_shared((block_M, block_N), out_dtype)
            tiles = {k: T.alloc_shared((block_M, block_N), extra_dtypes[k]) for k in staged}
            if swizzle:
                T.use_swizzle(panel_size)
            n0, m0 = bx * block_N, by * block_M
            T.clear(C_f)
            for ko in T.Pipelined(Kp // block_K, num_stages=num_stages):
                T.copy(W_values[n0, ko * (block_K // 2)], A_s)
                if meta_k_major:
                    T.copy(W_meta[ko * (block_K // E_FACTOR), n0], E_s)
                else:
                    T.copy(W_meta[n0, ko * (block_K // E_FACTOR)], E_s)
                T.copy(X[m0, ko * block_K], B_s)
                T.gemm_sp(A_s, E_s, B_s, C_f, transpose_E=meta_k_major, transpose_B=True, policy=warp_policy)
            for k in staged:
                T.copy(extras[k][m0, n0], tiles[k])
            for i, j in T.Parallel(block_N, block_M):
                Y_s[j, i] = Y_elem(C_f, extras, tiles, i, j, m0, n0)
            T.copy(Y_s, Y[m0, n0])

    return gemm_sp_kernel


def reference(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, extras: Sequence[torch.Tensor] = (), *,
              K: int | None = None, epilogue: Expr | None = None, out_dtype: str | None = None,
              meta_k_major: bool = False) -> torch.Tensor:
    """Torch reference of ``gemm_sp``: the decompressed weight in an fp64 matmul, then the epilogue."""
    K = x.shape[-1] if K is None else K
    w = decompress_2_4(values, meta, K, k_major=meta_k_major)
    acc = (x.double() @ w.double().T).float()
    if epilogue is not None:
        acc = evaluate(epilogue, acc, list(extras)).float()
    return acc.to(getattr(torch, out_dtype) if out_dtype else x.dtype)


def shared_memory_bytes(block_M: int, block_N: int, block_K: int, num_stages: int, dtype: str = "float16",
                        out_dtype: str | None = None, staged_tiles: int = 0) -> int:
    """Bytes of the pipelined tiles (half-K weight values, metadata, X), or of the epilogue's tiles where that is
    larger (the transposed output and ``staged_tiles`` staged extra inputs, counted at 4 bytes an element):
    TileLang 0.1.15 places them over the pipeline's buffers, which are dead by then (checked against
    ``dyn_shared_memory_buf`` of the lowered kernels, sm_90a)."""
    item = 2 if dtype in SPARSE_DTYPES else 4
    out_item = {"float32": 4}.get(out_dtype or dtype, 2)
    stage = block_N * block_K // 2 * item + block_N * block_K // E_FACTOR * 2 + block_M * block_K * item
    return max(stage * max(num_stages, 1), block_M * block_N * (out_item + 4 * staged_tiles))


# sm_90a: (block_M tokens, block_N weight rows, block_K, stages, threads, policy). A warpgroup's wgmma.sp is 64
# weight rows wide; "full_row" gives it every token of the tile (m64n256 on 256 tokens), "square" (the 2026-11-29
# seeds) splits the tokens too (m64n64). Row-major metadata rows of block_K/16 int16 are too narrow for a TMA load
# below block_K=128 (16 bytes): their plain loads leave no warp-specialized producer and the 512-thread kernel
# spills its accumulators (the 10x slower deep tiles of 2026-11-29), so the sm_90 planner stores the metadata
# K-major, which TMA loads at any depth (``meta_k_major``). Measured order (H200, bench_sparse.py --space wide,
# 2026-12-01, K-major metadata): the first six were the fastest at every shape with M >= 4096 (1.18-1.42x dense
# cuBLAS); the narrow-token entries serve a few tokens (M < 256).
SM90_SPACE = [
    (256, 128, 64, 3, 256, "full_row"), (128, 256, 64, 4, 256, "full_row"), (256, 128, 64, 5, 256, "full_row"),
    (128, 256, 128, 2, 256, "full_row"), (256, 128, 64, 4, 256, "full_row"), (128, 128, 128, 3, 128, "full_row"),
    (128, 256, 64, 6, 256, "full_row"), (256, 128, 128, 2, 256, "full_row"), (256, 64, 64, 6, 128, "full_row"),
    (128, 128, 64, 6, 128, "full_row"), (128, 128, 64, 4, 256, "full_row"), (64, 128, 128, 3, 128, "full_row"),
    (64, 128, 64, 6, 128, "full_row"), (16, 128, 128, 4, 128, "full_row"), (32, 128, 128, 4, 128, "full_row"),
    (64, 256, 128, 3, 256, "full_row"), (128, 256, 128, 2, 256, "square"), (128, 128, 128, 2, 128, "square"),
]
SM80_SPACE = [(128, 128, 64, 3, 128, "square"), (128, 256, 64, 2, 256, "square"), (256, 128, 64, 2, 256, "square"),
              (64, 128, 64, 3, 128, "square")]
SEEDS = 6  # the first entries of a space are its seeds (the default pick is made from them)
FEW_TOKENS = 256  # below this many tokens (M) the seeds are the narrow-token entries


def config_space(target: dict | str, K: int | None = None, out_dtype: str | None = None,
                 meta_k_major: bool = False, seeds_only: bool = False, staged_tiles: int = 0,
                 M: int | None = None) -> list[dict]:
    """Configs (keys are exactly ``gemm_sp``'s tunables) for metadata stored as ``meta_k_major`` says, that fit in
    shared memory with an ``out_dtype`` output tile (fp16 by default), each ``block_K`` a divisor of the padded K
    (the largest of 128, 64, 32 not above the entry's). With row-major metadata on sm_90 a config narrower than 128
    in K comes only where no other fits (see ``SM90_SPACE``). With ``M`` below ``FEW_TOKENS`` the narrow-token
    entries come first (decode: 1.10-1.57x dense cuBLAS at LLaMA-3-8B's projections for 1 and 16 tokens, except
    the down projection, 0.93x; H200 2026-12-01). ``seeds_only``: the first ``SEEDS``."""
    if dialect(target).cpu:
        return []
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    space = SM90_SPACE if arch.startswith("sm_90") else SM80_SPACE
    limit = SMEM_LIMIT.get(arch.rstrip("a")[:5], 99 * 1024)
    out, narrow = [], []
    for bm, bn, bk, stages, threads, policy in space:
        if K is not None:
            kp = padded_k(K)
            bk = next(b for b in (bk, 64, K_ALIGN) if b <= bk and kp % b == 0)
        cfg = {"block_M": bm, "block_N": bn, "block_K": bk, "num_stages": stages, "threads": threads,
               "enable_rasterization": True, "policy": policy}
        if shared_memory_bytes(bm, bn, bk, stages, "float16", out_dtype, staged_tiles) > limit or cfg in out \
                or cfg in narrow:
            continue
        if bk < 128 and not meta_k_major and arch.startswith("sm_90"):
            if policy == "square":  # (full-row tiles need more registers than 512 threads leave: ptxas refuses)
                narrow.append(cfg)
            continue
        out.append(cfg)
    out = out or narrow
    if M is not None and M < FEW_TOKENS:  # a few tokens: the narrow-token entries first (the seeds)
        out = [c for c in out if c["block_M"] <= 64] + [c for c in out if c["block_M"] > 64]
    return out[:SEEDS] if seeds_only else out


# A seed later in the space is taken over an earlier one only where the earlier's padded waves cost this much more.
WAVE_TOLERANCE = 1.1


def default_config(configs: list[dict], M: int, N: int, sms: int) -> dict:
    """The untuned pick among ``configs`` (the seeds, measured order): the first seed whose padded waves
    (``gemm_configs.wave_cost``) are within ``WAVE_TOLERANCE`` of the fewest, and for M below ``FEW_TOKENS`` the
    one with the fewest. Smaller tiles win the wave count by a hair and lose more to their lower
    efficiency: 8192 x 16384 x 4096 took 128x128 tiles for 1.6% fewer padded waves (the MLP's first linear, 2:4
    regions 1.5 ms slower over the MLP than the per-shape best, H200 2026-12-01)."""
    if not configs:
        return {}
    cost = {i: wave_cost(c, M, N, 1, sms) for i, c in enumerate(configs)}
    if M < FEW_TOKENS:
        return configs[min(cost, key=cost.get)]  # (ties: the earlier seed)
    best = min(cost.values())
    return next(c for i, c in enumerate(configs) if cost[i] <= WAVE_TOLERANCE * best)


def get_configs(target: dict | str, K: int | None = None, out_dtype: str | None = None,
                meta_k_major: bool = False, staged_tiles: int = 0, M: int | None = None) -> list[dict]:
    """The seeds of ``config_space``."""
    return config_space(target, K, out_dtype, meta_k_major, seeds_only=True, staged_tiles=staged_tiles, M=M)

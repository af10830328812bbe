"""GEMM with fused prologue and epilogue: ``C = epilogue(prologue(A) @ B, extras...)``.

Note: one factory serves plain, transposed (``A`` as (K, M), ``B`` as (N, K) like a linear weight)
and batched GEMMs (batch dims on A and/or B, broadcast like ``torch.matmul``). The batch is
flattened into the grid's third axis and each operand reads its own batch coordinates, so a
broadcast operand is never copied. Tails (M, N, K not multiples of the block) are safe: ``T.copy``
zero-fills out-of-range tile elements and guards the store; the prologue path guards its loads
itself (the prologue of 0 need not be 0), and epilogue operands are read at clamped coordinates
(the values computed past the edge are never stored). The accumulator is ``accum_dtype`` (fp32);
the epilogue computes in fp32 and the store casts to ``out_dtype``. On Metal the ``T.gemm`` accumulator (opaque
``simdgroup_float8x8`` matrices) is staged through threadgroup memory before the epilogue and a guarded store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tilelang.language as T
import torch

from tilefuse.lowering.expr import Acc, Env, Expr, args_used, emit, emit_rounded, evaluate
from tilefuse.lowering.templates import gemm_ws
from tilefuse.lowering.templates.common import (
    arg_loader,
    broadcast_index,
    broadcast_shapes,
    check_dtype,
    dialect,
    normalize_shapes,
    numel,
    param,
    target_kind,
    unravel,
)
from tilefuse.lowering.templates.gemm_configs import get_configs  # noqa: F401 -- the template's config space


def gemm(
    M: int,
    N: int,
    K: int,
    *,
    trans_A: bool = False,
    trans_B: bool = False,
    batch_A: Sequence[int] = (),
    batch_B: Sequence[int] = (),
    A_dtype: str = "float16",
    B_dtype: str | None = None,
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    prologue: Expr | None = None,
    epilogue: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    block_M: int = 128,
    block_N: int = 128,
    block_K: int = 32,
    num_stages: int = 2,
    threads: int = 128,
    enable_rasterization: bool = False,
    panel_size: int = 10,
    stage_C: bool = False,
    allow_tf32: bool = False,
    ws: bool = False,
    pingpong: bool = False,
    stage_extra: bool = True,
    prefetch_extra: bool = True,
    cluster: int = 1,
    slice_N: int | None = None,
    extra_buffers: int = 1,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` for ``C = epilogue(prologue(A) @ B)``; parameters ``A, B, extra_0.., C``.

    ``A`` is ``(*batch_A, M, K)`` (``(*batch_A, K, M)`` if ``trans_A``), ``B`` is ``(*batch_B, K, N)``
    (``(*batch_B, N, K)`` if ``trans_B``), ``C`` is ``(*broadcast(batch_A, batch_B), M, N)``.
    ``prologue`` maps each element of A (``Acc``, constants only) before the MMA, which runs in
    ``B_dtype``; an A of another dtype without a prologue is cast. ``epilogue`` reads the
    accumulator (``Acc``) and ``Arg(i)`` = ``extra_i`` broadcast against C's shape.
    Tunables are TileLang's: ``block_M/N/K``, ``num_stages``, ``threads``, ``enable_rasterization``
    (threadblock swizzle with ``panel_size``), ``stage_C`` (store the output tile through shared memory: whole
    rows per store, a TMA store where rows are 16-byte aligned, instead of the accumulator fragment's
    scattered 4-byte pieces; it matters when K is short and the store is a large part of the kernel);
    CPU targets ignore ``num_stages``/``threads``/swizzle/``stage_C``.
    fp32 operands on GPUs: ``T.gemm`` would run them as TF32 (10-bit mantissa, unlike torch's
    default), so unless ``allow_tf32`` the tile product is a plain fp32 FMA loop (exact, slower).
    ``ws``: the hand-written warp-specialized, persistent schedule (``gemm_ws``; an error where it does not apply), with
    ``pingpong`` its consumer warp groups on tiles of their own, taking turns, and ``stage_extra`` (the default) its
    epilogue reading a full-size extra input of the output's dtype from a coalesced copy in the output tile, which
    ``prefetch_extra`` (the default; cooperative schedule) has the producer load by TMA during the tile's main loop;
    ``cluster=2`` runs it in 2-CTA clusters that share each B stage by TMA multicast, and ``slice_N`` has its epilogue
    store the tile in slices of that many columns, and ``extra_buffers=2`` loads the next tile's staged extra into a
    second output tile during this one's epilogue (``gemm_ws.gemm_ws`` says more of them).
    """
    B_dtype, out_dtype, extra_shapes = operand_types("gemm", A_dtype, B_dtype, out_dtype, extra_shapes, extra_dtypes,
                                                     prologue, target)
    d = dialect(target)
    batch_A, batch_B = tuple(batch_A), tuple(batch_B)
    batch = broadcast_shapes(batch_A, batch_B) if (batch_A or batch_B) else ()
    nb = numel(batch)
    out_shape = (*batch, M, N)
    if broadcast_shapes(out_shape, *extra_shapes) != out_shape:
        raise ValueError(f"gemm: extra inputs {extra_shapes} do not broadcast to the output {out_shape}")
    A_shape = (*batch_A, K, M) if trans_A else (*batch_A, M, K)
    B_shape = (*batch_B, N, K) if trans_B else (*batch_B, K, N)
    A_tile = (block_K, block_M) if trans_A else (block_M, block_K)
    B_tile = (block_N, block_K) if trans_B else (block_K, block_N)
    mma_dtype = B_dtype
    load_A_direct = prologue is None and A_dtype == mma_dtype
    prologue = prologue if prologue is not None else Acc()
    clamp_m, clamp_n = M % block_M != 0, N % block_N != 0
    swizzle = bool(enable_rasterization) and not d.cpu
    simt = mma_dtype == "float32" and not allow_tf32 and not d.cpu
    metal_mma = d.metal and not simt  # the accumulator is simdgroup matrices: staged before the epilogue
    # Note: the fp32 FMA loop read wrong A tiles through the TMA at M = 2 and 4 (not 1, 3, 8 or 16) with K past two
    # tiles (64 x 64 x 32, 2-3 stages: 0.14-0.46 relative error, H100, session 52; ResNet's last shortcut at the
    # tiny size): a tile of rows past M is read element by element, bounds checked, there.
    tma_A = load_A_direct and not (simt and M < block_M)
    fast = fast_epilogue(target, out_dtype)

    def A_elem(A, bcoords, m, k):
        """One A element through the prologue; 0 outside the matrix (the prologue of 0 need not be 0)."""
        src = A[(*broadcast_index(batch_A, bcoords), k, m) if trans_A else (*broadcast_index(batch_A, bcoords), m, k)]
        val = T.Cast(mma_dtype, emit(prologue, Env(acc=src)))
        return T.if_then_else(T.And(m < M, k < K), val, T.Cast(mma_dtype, 0))

    def C_elem(C_f, extras, bcoords, i, j, m0, n0, staged=None):
        """The epilogue of accumulator element (i, j); operands read at clamped coordinates, or from ``staged``
        (extra input -> its element in a shared-memory copy)."""
        m = T.min(m0 + i, M - 1) if clamp_m else m0 + i
        n = T.min(n0 + j, N - 1) if clamp_n else n0 + j
        return epilogue_at(epilogue, C_f[i, j], extras, extra_shapes, [*bcoords, m, n], accum_dtype, staged, fast)

    if (pingpong or cluster != 1 or slice_N or extra_buffers != 1) and not ws:
        raise ValueError("gemm: pingpong=True, cluster=2, slice_N and extra_buffers are options of ws=True")
    if ws:
        if not gemm_ws.eligible(target, N=N, K=K, trans_A=trans_A, trans_B=trans_B, batch_A=batch_A,
                                batch_B=batch_B, A_dtype=A_dtype, B_dtype=B_dtype, out_dtype=out_dtype,
                                prologue=None if load_A_direct else prologue):
            raise ValueError("gemm: ws=True needs a CUDA sm_90 target, fp16/bf16 operands of one dtype, no prologue, "
                             "A not transposed, no batch and rows of 16-byte multiples")
        # a full-size extra of the output's dtype (a residual; LLaMA's up under silu(gate) * up) is copied into the
        # output tile first, coalesced, and read there: at the accumulator's layout it is a strided gather
        staged = ws_staged_extra(M, N, epilogue, extra_shapes, extra_dtypes, out_dtype) if stage_extra else None
        return gemm_ws.gemm_ws(
            M, N, K, trans_B=trans_B, dtype=mma_dtype, out_dtype=out_dtype, extra_shapes=extra_shapes,
            extra_dtypes=extra_dtypes, block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages,
            pingpong=pingpong, target=target, staged=staged, prefetch_extra=prefetch_extra, cluster=cluster,
            slice_N=slice_N, extra_buffers=extra_buffers,
            epilogue_elem=lambda C_f, extras, i, j, m0, n0, tile=None: (
                C_f[i, j] if epilogue is None else
                C_elem(C_f, extras, (), i, j, m0, n0, None if tile is None else {staged: tile[i, j]})))

    @T.prim_func
    def gemm_kernel():
        A = param("A", A_shape, A_dtype)
        B = param("B", B_shape, B_dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        C = param("C", out_shape, out_dtype)
        with d.kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), nb, threads=threads) as (bx, by, bz):
            A_s = d.shared(A_tile, mma_dtype)
            B_s = d.shared(B_tile, mma_dtype)
            C_f = d.fragment((block_M, block_N), accum_dtype)
            B_t = d.shared((block_K, block_N), mma_dtype) if d.cpu and trans_B else None
            if swizzle:
                T.use_swizzle(panel_size)
            bcoords = unravel(bz, batch)
            m0, n0 = by * block_M, bx * block_N
            d.wait_inputs(False, tma=tma_A)  # (PDL only with ``common.PDL_ALL``/``PDL_TMA``)
            T.clear(C_f)
            for ko in d.pipelined(T.ceildiv(K, block_K), num_stages):
                if tma_A:
                    a_at = (ko * block_K, m0) if trans_A else (m0, ko * block_K)
                    T.copy(A[(*broadcast_index(batch_A, bcoords), *a_at)], A_s)
                else:
                    for a, b in d.tile_loop(*A_tile):
                        A_s[a, b] = A_elem(A, bcoords, m0 + (b if trans_A else a), ko * block_K + (a if trans_A else b))
                b_at = (n0, ko * block_K) if trans_B else (ko * block_K, n0)
                T.copy(B[(*broadcast_index(batch_B, bcoords), *b_at)], B_s)
                if simt:
                    for i, j in T.Parallel(block_M, block_N):
                        for k in T.serial(block_K):
                            C_f[i, j] += A_s[(k, i) if trans_A else (i, k)] * B_s[(j, k) if trans_B else (k, j)]
                elif d.cpu:
                    # k outside j, j innermost over contiguous rows of B and C: gcc vectorizes it (T.gemm's i, j, k
                    # order is a reduction gcc cannot reorder, 10x slower with a transposed B); each C element
                    # still sums its products in k order, as T.gemm does.
                    if trans_B:
                        for k, j in T.grid(block_K, block_N):
                            B_t[k, j] = B_s[j, k]
                    for i, k, j in T.grid(block_M, block_K, block_N):
                        C_f[i, j] += (T.Cast(accum_dtype, A_s[(k, i) if trans_A else (i, k)])
                                      * T.Cast(accum_dtype, (B_t if trans_B else B_s)[k, j]))
                else:
                    T.gemm(A_s, B_s, C_f, transpose_A=trans_A, transpose_B=trans_B)
            if metal_mma:
                # Metal: T.gemm's accumulator is opaque simdgroup_float8x8 matrices (no element access, stored only
                # to memory of its own dtype, 2-D): stage it in threadgroup memory, then the epilogue and a guarded
                # store with the cast, whatever the batch rank and tails.
                C_s = T.alloc_shared((block_M, block_N), accum_dtype)
                T.sync_threads()  # C_s may reuse A_s/B_s, which other simdgroups may still be reading
                T.copy(C_f, C_s)
                T.sync_threads()  # TileLang does not sync after a simdgroup_store
                for i, j in T.Parallel(block_M, block_N):
                    if T.And(m0 + i < M, n0 + j < N):
                        C[(*bcoords, m0 + i, n0 + j)] = T.Cast(out_dtype, C_s[i, j] if epilogue is None else
                                                               C_elem(C_s, extras, bcoords, i, j, m0, n0))
            else:
                if epilogue is not None:
                    for i, j in d.tile_loop(block_M, block_N):
                        C_f[i, j] = C_elem(C_f, extras, bcoords, i, j, m0, n0)
                if stage_C and not d.cpu:
                    C_s = T.alloc_shared((block_M, block_N), out_dtype)
                    T.copy(C_f, C_s)
                    T.copy(C_s, C[(*bcoords, m0, n0)])
                else:
                    T.copy(C_f, C[(*bcoords, m0, n0)])

    return gemm_kernel


def operand_types(what: str, A_dtype: str, B_dtype: str | None, out_dtype: str | None,
                  extra_shapes: Sequence[Sequence[int]], extra_dtypes: Sequence[str], prologue: Expr | None,
                  target: dict | str) -> tuple[str, str, tuple]:
    """A GEMM-family template's operand types checked for ``target``: (B's dtype, the output's, the extras' shapes);
    B defaults to A's dtype and the output to B's. The prologue may read only the element and constants."""
    B_dtype = B_dtype or A_dtype
    out_dtype = out_dtype or B_dtype
    extra_shapes = normalize_shapes(extra_shapes)
    if len(extra_dtypes) != len(extra_shapes):
        raise ValueError(f"{what}: one dtype per extra input")
    for dt in (A_dtype, B_dtype, out_dtype, *extra_dtypes):
        check_dtype(dt, target, what)
    if args_used(prologue):
        raise NotImplementedError(f"{what}: the prologue may read only acc and constants (no extra inputs)")
    return B_dtype, out_dtype, extra_shapes


def staged_extras(M: int, N: int, epilogue: Expr | None, extra_shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The extra inputs the epilogue reads that have the output's full (M, N) shape: each is staged through a
    shared-memory tile (``gemm_sp``; ``gemm_ws`` the first of the output's dtype, in its output tile), where read at the
    accumulator's layout it would be a strided gather."""
    return tuple(k for k in sorted(args_used(epilogue)) if tuple(extra_shapes[k]) == (M, N))


def fast_epilogue(target: dict | str, out_dtype: str) -> str:
    """The dtype a GEMM-family template's epilogue rounds to where it takes the fast forms (``FAST_EMITTERS``:
    sigmoid, silu, GELU's tanh form; its root ``ROUNDED_EMITTERS``' for that dtype), else "": an fp16/bf16 output on
    CUDA. Exact, they made a ws GEMM's silu epilogue compute-bound (bench/results/2026-12-04-h200-session28)."""
    return out_dtype if target_kind(target) == "cuda" and out_dtype in ("float16", "bfloat16") else ""


def ws_staged_extra(M: int, N: int, epilogue: Expr | None, extra_shapes: Sequence[Sequence[int]],
                    extra_dtypes: Sequence[str], out_dtype: str) -> int | None:
    """The extra input ``gemm(ws=True)`` stages in its output tile: the first full-size one of the output's dtype."""
    return next((k for k in staged_extras(M, N, epilogue, extra_shapes) if extra_dtypes[k] == out_dtype), None)


def epilogue_at(epilogue: Expr, acc, extras: Sequence, extra_shapes: Sequence[Sequence[int]], coords: Sequence,
                accum_dtype: str = "float32", staged: Mapping[int, Any] | None = None, fast: str = ""):
    """The epilogue of one accumulator element ``acc`` of the output at ``coords``: extra input ``i`` is
    read there under broadcasting, or is ``staged[i]`` (a template's load of it from a shared-memory copy);
    computed in ``accum_dtype``; ``fast``: the output's dtype where fast forms are allowed (``fast_epilogue``), the
    value then rounded straight to it. Shared by the GEMM-family templates."""
    load = arg_loader(extras, extra_shapes, coords)
    env = Env(acc=acc, arg=lambda i: staged[i] if staged and i in staged else load(i), fast=bool(fast))
    return T.Cast(accum_dtype, emit_rounded(epilogue, env, fast))


def reference(A: torch.Tensor, B: torch.Tensor, extras: Sequence[torch.Tensor] = (), *, trans_A: bool = False,
              trans_B: bool = False, prologue: Expr | None = None, epilogue: Expr | None = None,
              out_dtype: str | None = None) -> torch.Tensor:
    """Torch reference of ``gemm``: fp32 matmul (no TF32) of the prologue'd operands, then the epilogue."""
    out_dtype = getattr(torch, out_dtype) if out_dtype else B.dtype
    a = A.transpose(-1, -2) if trans_A else A
    b = B.transpose(-1, -2) if trans_B else B
    if prologue is not None:
        a = evaluate(prologue, a).to(B.dtype)
    elif a.dtype != B.dtype:
        a = a.to(B.dtype)
    acc = torch.matmul(a.double(), b.double()).float()
    if epilogue is not None:
        acc = evaluate(epilogue, acc, list(extras)).float()
    return acc.to(out_dtype)


# The config space and the untuned pick live beside the template, as data (gemm_configs.py).

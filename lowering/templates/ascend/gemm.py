"""GEMM with a fused epilogue on Ascend: the tile product on the Cube core, the epilogue on the two vector cores.

Note: the parameters are the ``gemm`` template's (``lowering.templates.gemm``): ``A, B, extra_0.., C`` with
``C = epilogue(A @ B)``. Each block of the launch owns one (block_M, block_N) output tile: the K loop copies A and B
tiles into L1 (``asc_copy_gm2l1_nd2nz``) and accumulates in L0C (``ascend_gemm_l1``); ``T.dual_copy`` then splits the
accumulator between the two vector cores by rows (a ``__mix__(1, 2)`` kernel), each of which loads its half of the
epilogue's operands into the unified buffer the same way, runs the epilogue in a SIMT vector function and stores its
rows. M and N tails are clamped by the copies; a K tail would leave stale data in the L1 tiles, so ``block_K`` is
taken as the largest multiple of 16 up to the configured one that divides K (a K that is no multiple of 16 is
refused). Not taken here: a transposed A, a prologue, and extras other than the full output, a vector over its
last dim or a scalar.
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.ascend.language as T

from tilefuse.lowering.expr import Env, Expr, emit
from tilefuse.lowering.templates.ascend.common import refusal, store
from tilefuse.lowering.templates.common import normalize_shapes, numel, param, view


def extra_kind(shape: Sequence[int], out_shape: Sequence[int]) -> str | None:
    """How an epilogue operand of ``shape`` reads against the output: "full", "row" (a vector over the last dim),
    "scalar", or None."""
    shape = tuple(shape)
    if shape == tuple(out_shape):
        return "full"
    if numel(shape) == 1:
        return "scalar"
    if numel(shape) == out_shape[-1] and shape[-1:] == tuple(out_shape[-1:]):
        return "row"
    return None


def why_not(M: int, N: int, K: int, *, trans_A: bool = False, batch_A: Sequence[int] = (),
            batch_B: Sequence[int] = (), A_dtype: str = "float16", B_dtype: str | None = None,
            out_dtype: str | None = None, prologue: Expr | None = None, epilogue: Expr | None = None,
            extra_shapes: Sequence[Sequence[int]] = (), extra_dtypes: Sequence[str] = (), **_) -> str | None:
    """Why the Ascend GEMM cannot take this instance (the ``gemm`` template's arguments), or None."""
    B_dtype = B_dtype or A_dtype
    if trans_A:
        return "the Ascend GEMM template takes A as (M, K), not transposed"
    if prologue is not None:
        return "the Ascend GEMM template takes no prologue on A"
    if A_dtype != B_dtype or B_dtype not in ("float16", "bfloat16", "float32"):
        return f"the Ascend GEMM template multiplies float16, bfloat16 or float32 pairs, not {A_dtype} x {B_dtype}"
    if K % 16:
        return f"K={K} is no multiple of 16: a K tail would leave stale data in the Ascend GEMM's L1 tiles"
    if tuple(batch_A) != tuple(batch_B):
        return f"the Ascend GEMM template takes equal batch dims, not {tuple(batch_A)} and {tuple(batch_B)}"
    if batch_A and M % 16:
        return f"a batched GEMM with M={M}, no multiple of 16: the Ascend template's row tiles must not cross batches"
    out_shape = (*batch_A, M, N)
    if any(extra_kind(s, out_shape) is None for s in extra_shapes):
        return (f"an epilogue operand of shape {[tuple(s) for s in extra_shapes]} against the output {out_shape}: "
                "the Ascend GEMM reads the full output, a vector over its last dim or a scalar")
    return refusal((A_dtype, out_dtype or B_dtype, *extra_dtypes), "GEMM")


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
    prologue: Expr | None = None,
    epilogue: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    block_M: int = 128,
    block_N: int = 128,
    block_K: int = 64,
    num_stages: int = 2,
    threads: int = 128,
    target: dict | str = "ascend",
):
    """A ``T.prim_func`` (Ascend dialect) for ``C = epilogue(A @ B)``; parameters ``A, B, extra_0.., C`` as the
    ``gemm`` template has them. ``block_M`` must be even (the two vector cores take half its rows each)."""
    B_dtype = B_dtype or A_dtype
    out_dtype = out_dtype or B_dtype
    extra_shapes = normalize_shapes(extra_shapes)
    why = why_not(M, N, K, trans_A=trans_A, batch_A=batch_A, batch_B=batch_B, A_dtype=A_dtype, B_dtype=B_dtype,
                  out_dtype=out_dtype, prologue=prologue, epilogue=epilogue, extra_shapes=extra_shapes,
                  extra_dtypes=extra_dtypes)
    if why:
        raise NotImplementedError(why)
    if block_M % 2:
        raise ValueError(f"gemm: block_M={block_M} must be even")
    block_K = max(k for k in range(16, max(block_K, 16) + 1, 16) if K % k == 0)
    batch = tuple(batch_A)
    if batch:  # row tiles must not cross batches (the copies clamp only at the end of all rows)
        block_M = max(bm for bm in range(16, max(block_M, 16) + 1, 16) if M % bm == 0)
    nb, mt, nt = numel(batch), -(-M // block_M), -(-N // block_N)
    out_shape = (*batch, M, N)
    kinds = [extra_kind(s, out_shape) for s in extra_shapes]
    half = block_M // 2

    def epilogue_at(C_ub, ubs, i, j):
        def arg(k):
            return ubs[k][i, j] if kinds[k] == "full" else ubs[k][j] if kinds[k] == "row" else ubs[k][0]
        return store(emit(epilogue, Env(acc=C_ub[i, j], arg=arg)) if epilogue is not None else C_ub[i, j], out_dtype)

    @T.prim_func
    def gemm_kernel():
        A = view(param("A", (*batch, M, K), A_dtype), (nb * M, K))
        B = view(param("B", (*batch, N, K) if trans_B else (*batch, K, N), B_dtype), (nb * N, K) if trans_B
                 else (nb * K, N))
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        flat = [view(e, (nb * M, N) if kind == "full" else (numel(s),)) for e, s, kind in zip(extras, extra_shapes,
                                                                                               kinds)]
        C = view(param("C", out_shape, out_dtype), (nb * M, N))
        with T.Kernel(nb * mt * nt) as bx:
            A_l1 = T.alloc_l1((block_M, block_K), A_dtype)
            B_l1 = T.alloc_l1((block_N, block_K), B_dtype)
            C_l0c = T.alloc_l0c((block_M, block_N), "float32")
            C_ub = T.alloc_shared((half, block_N), "float32")
            O_ub = T.alloc_shared((half, block_N), out_dtype)
            ubs = [T.alloc_shared((half, block_N) if kind == "full" else (block_N,) if kind == "row" else (16,), dt)
                   for kind, dt in zip(kinds, extra_dtypes)]
            b, tile = bx // (mt * nt), bx % (mt * nt)
            m, n = b * M + tile // nt * block_M, tile % nt * block_N
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[m, k * block_K], A_l1)
                if trans_B:
                    T.copy(B[b * N + n, k * block_K], B_l1)
                else:  # (K, N) tiles transposed on the way in: the Cube's L1 GEMM takes B as (N, K) only
                    T.copy(B[b * K + k * block_K:b * K + (k + 1) * block_K, n:n + block_N], B_l1, transpose=True)
                T.gemm(A_l1, B_l1, C_l0c, transpose_B=True, clear_accum=(k == 0))
            T.dual_copy(C_l0c, C_ub)
            for e, ub, kind in zip(flat, ubs, kinds):
                if kind == "full":
                    T.dual_copy(e[m:m + block_M, n:n + block_N], ub)
                elif kind == "row":
                    T.copy(e[n:n + block_N], ub)
                else:
                    T.copy(e[0:1], ub[0:1])
            with T.SimtVF(threads=threads):
                for i, j in T.Parallel(half, block_N):
                    O_ub[i, j] = epilogue_at(C_ub, ubs, i, j)
            T.dual_copy(O_ub, C[m:m + block_M, n:n + block_N])

    return gemm_kernel


def get_configs(target: dict | str = "ascend", dtype: str | None = None) -> list[dict]:
    """Tunables: the output tile, the K step (see the module note), the K pipeline's depth, SIMT threads of the
    epilogue."""
    return [{"block_M": bm, "block_N": bn, "block_K": bk, "num_stages": 2, "threads": 128}
            for bm, bn in ((128, 128), (64, 128), (128, 256), (64, 64)) for bk in (64, 128)]

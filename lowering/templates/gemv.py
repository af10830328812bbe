"""A decode step's linear layer: ``C = epilogue(prologue(A) @ B^T)`` for a few rows of ``A`` (M <= ``GEMV_ROWS``).

Note: at batch 1-8 a linear layer streams its weight once and does almost no arithmetic, so its speed is the
bandwidth its weight is read at. A GEMM tile of 64+ rows computes padding there, and cuBLAS's GEMV kernels give a
2048 x 2048 weight 32 programs (H200, HF LLaMA decode, ``bench/results/2026-12-01-h200-session10``: the q/k/v/o
projections read at 0.7 TB/s). Here each warp owns ``block_N // warps`` weight rows (``B`` is a linear weight,
``(N, K)``), its lanes read them 16 bytes at a time along K with several loads in flight, multiply by the same A
elements for every row of A, and combine their partial sums by shuffles; the epilogue and the store follow in the
warp. Programs are small (``block_N`` rows), so even a 512-row weight spreads over the SMs.

A normalized input (``norm_eps``: a decode step's RMSNorm before its linears, ``planner.norm_fold``): every warp reads
the whole row of A anyway, so in the same pass it sums the row's squares and multiplies A by the norm's weight ``G``;
after the shuffles its sums are scaled by ``rsqrt(mean of squares + eps)``. ``C = (rmsnorm(A) * G) @ B^T`` then costs
no kernel of its own, nor a trip of the normalized row through memory (the product differs from the norm's output
rounded to ``A_dtype`` then multiplied by that rounding: fp16's 1e-3, within its tolerance).

Tails: rows past N read row N - 1 and are never stored; K need not divide the step (the last part of a row is
read one vector at a time, guarded). On CPU targets (the numerics tests) a program is one lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import tilelang.language as T

from tilefuse.lowering.expr import Acc, Env, Expr, emit
from tilefuse.lowering.templates.common import broadcast_shapes, check_dtype, dialect, param
from tilefuse.lowering.templates.gemm import epilogue_at, operand_types

# A decode step's rows at most. Each weight element is multiplied by every row of A in registers; on the H200
# (bench_gemv.py, bench/results/2026-12-02-h200-session11) one row reads the weight at 2-3.9 TB/s, 1.05-2.8x cuBLAS,
# where eight rows run out of arithmetic (1.1-2.3 TB/s, 0.6-0.9x cuBLAS but for the smallest weights).
GEMV_ROWS = 4
# Loads of a lane in flight: its rows' vectors for this many steps along K (the default; ``unroll`` is a tunable).
UNROLL = 4


def gemv(
    M: int,
    N: int,
    K: int,
    *,
    A_dtype: str = "float16",
    B_dtype: str | None = None,
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    prologue: Expr | None = None,
    epilogue: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    norm_eps: float | None = None,
    norm_weight: str | None = None,
    block_N: int = 8,
    threads: int = 128,
    unroll: int = UNROLL,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` for ``C = epilogue(prologue(A) @ B^T)``; parameters ``A (M, K), [G (K,)], B (N, K), extra_0..,
    C (M, N)``. With ``norm_eps`` A is RMS-normalized over K first (times the norm's weight ``G`` of dtype
    ``norm_weight``, where given; then no ``prologue``). ``prologue``/``epilogue`` as ``gemm``'s (the product runs in
    ``B_dtype``'s values, summed in fp32). Tunables: ``block_N`` weight rows a program, over ``threads // 32`` warps
    (CPU targets: one lane); ``unroll`` steps along K whose loads a lane issues before it multiplies (a 2048-deep row of
    float16 is 8 steps: 8 is one round trip to memory, 4 two)."""
    return gemv_group(M, (N,), K, A_dtype=A_dtype, B_dtype=B_dtype, out_dtype=out_dtype, accum_dtype=accum_dtype,
                      prologue=prologue, epilogues=(epilogue,), extra_shapes=extra_shapes, extra_dtypes=extra_dtypes,
                      extras_of=(tuple(range(len(extra_shapes))),), norm_eps=norm_eps, norm_weight=norm_weight,
                      block_N=block_N, threads=threads, unroll=unroll,
                      target=target)  # (a group of one names its parameters B and C)


def gemv_group(
    M: int,
    Ns: Sequence[int],
    K: int,
    *,
    A_dtype: str = "float16",
    B_dtype: str | None = None,
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    prologue: Expr | None = None,
    epilogues: Sequence[Expr | None] = (),
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    extras_of: Sequence[Sequence[int]] = (),
    stored: Sequence[bool] = (),
    norm_eps: float | None = None,
    norm_weight: str | None = None,
    head_dim: int = 0,
    rotary_of: Sequence[tuple[int, int] | None] = (),
    scatter_of: Sequence[tuple[int, int] | None] = (),
    block_N: int = 8,
    threads: int = 128,
    unroll: int = UNROLL,
    target: dict | str = "cuda",
):
    """Several linears of the same rows in one launch (a decode step's q, k and v projections of one normalized input):
    ``C_i = epilogue_i(prologue(A) @ B_i^T)``; parameters ``A (M, K), [G (K,)], B_0 (N_0, K).., extra_0.., C_i (M,
    N_i)`` for each ``stored`` weight (default all); ``norm_eps``, ``norm_weight`` as ``gemv``'s. Epilogue ``i`` reads
    the extras ``extras_of[i]`` (their positions among ``extra_shapes``), each broadcasting to ``(M, N_i)``; a position
    ``-1 - k`` there is weight ``k``'s own output instead (``k < i``, ``N_k == N_i``: a gated MLP's up projection
    reading ``silu(gate)``), which never goes through memory: weights so joined are computed by the same programs, one
    after the other. A program computes ``block_N`` rows of one weight (or of each weight of a joined set); the programs
    follow one another, so every weight streams as it would alone, and the launch (and the GPU's ramp up and tail) is
    shared.

    A decode step's rotary embedding and cache store (one token a row, ``planner.rotary_fold``): ``rotary_of[i] = (cos,
    sin)`` (extras ``(1 or M, head_dim)``) rotates weight ``i``'s output by heads of ``head_dim`` as
    ``rotary_embedding`` does (the halves of a head paired), from the output rounded to ``out_dtype``: a warp's rows are
    pairs ``n``, ``n + head_dim / 2``, so each row's partner is in its registers. ``scatter_of[i] = (cache, index)``
    stores weight ``i``'s (rotated) output into the extra ``cache (M, N // head_dim, L, head_dim)`` at position
    ``index[0]`` (an integer extra of one element; outside ``[0, L)`` the GPU traps, as torch's device-side assert), in
    place of a ``C_i`` of its own (not ``stored``)."""
    g = len(Ns)
    epilogues, extras_of = tuple(epilogues) or (None,) * g, tuple(tuple(e) for e in extras_of) or ((),) * g
    stored = tuple(stored) or (True,) * g
    if g < 1 or len(epilogues) != g or len(extras_of) != g or len(stored) != g:
        raise ValueError(f"gemv_group: {g} weights, {len(epilogues)} epilogues, {len(extras_of)} extras lists, "
                         f"{len(stored)} stored flags")
    B_dtype, out_dtype, extra_shapes = operand_types("gemv", A_dtype, B_dtype, out_dtype, extra_shapes, extra_dtypes,
                                                     prologue, target)
    for i, (N, own) in enumerate(zip(Ns, extras_of)):
        shapes = [extra_shapes[j] for j in own if j >= 0]
        if broadcast_shapes((M, N), *shapes) != (M, N):
            raise ValueError(f"{'gemv' if g == 1 else 'gemv_group'}: extra inputs {shapes} do not broadcast to the "
                             f"output {(M, N)}")
        for k in (-1 - j for j in own if j < 0):
            if not (0 <= k < i and Ns[k] == N):
                raise ValueError(f"gemv_group: weight {i} reads weight {k}'s output: it must be an earlier weight of "
                                 f"the same rows ({N})")
    if norm_eps is not None and prologue is not None:
        raise ValueError("gemv: a prologue and a norm of A (the norm reads A as it is)")
    if norm_weight is not None:
        check_dtype(norm_weight, target, "gemv")
    norm = None if norm_eps is None else (float(norm_eps), norm_weight)
    rope = _rope_of(Ns, M, head_dim, rotary_of, scatter_of, extras_of, stored, extra_shapes, extra_dtypes, out_dtype,
                    block_N, threads, target)
    return _gemv(tuple(Ns), M, K, A_dtype, B_dtype, out_dtype, accum_dtype, prologue, epilogues, list(extra_shapes),
                 list(extra_dtypes), extras_of, block_N, threads, unroll, target, stored, norm, rope)


class _Rope(NamedTuple):
    """Weight rows in rotary pairs and stores into a cache (``gemv_group``'s ``rotary_of``/``scatter_of``)."""

    D: int  # the head dim
    rotary: tuple  # per weight: (cos, sin) extra positions, or None
    scatter: tuple  # per weight: (cache, index) extra positions, or None


def _rope_of(Ns, M, D, rotary_of, scatter_of, extras_of, stored, extra_shapes, extra_dtypes, out_dtype, block_N,
             threads, target) -> _Rope | None:
    """``gemv_group``'s rotary and cache-store arguments checked, or None where there are none."""
    g = len(Ns)
    rotary, scatter = tuple(rotary_of) or (None,) * g, tuple(scatter_of) or (None,) * g
    if len(rotary) != g or len(scatter) != g:
        raise ValueError(f"gemv_group: {g} weights, {len(rotary)} rotary and {len(scatter)} scatter entries")
    if not any(rotary) and not any(scatter):
        return None
    warps = 1 if dialect(target).cpu else threads // 32
    joined = {i for ws in joined_sets(extras_of) if len(ws) > 1 for i in ws}
    n_extra = len(extra_shapes)
    for i, N in enumerate(Ns):
        if rotary[i] is None and scatter[i] is None:
            continue
        if D < 2 or D % 2 or N % D:
            raise ValueError(f"gemv_group: weight {i}'s {N} rows are not heads of head_dim={D} (even)")
        if i in joined:
            raise ValueError(f"gemv_group: weight {i} is joined with another: no rotary or cache store")
        if any(not 0 <= j < n_extra for j in (rotary[i] or ()) + (scatter[i] or ())):
            raise ValueError(f"gemv_group: weight {i}'s rotary/scatter extras {rotary[i]}, {scatter[i]} are not "
                             f"among its {n_extra} extras")
        if rotary[i] is not None:
            if block_N % (2 * warps) or N % block_N:
                raise ValueError(f"gemv_group: rotary weight {i}: block_N={block_N} must be whole pairs a warp and "
                                 f"divide its {N} rows")
            for j in rotary[i]:
                if tuple(extra_shapes[j]) not in ((1, D), (M, D)):
                    raise ValueError(f"gemv_group: rotary table {tuple(extra_shapes[j])} for weight {i}: (1 or {M}, "
                                     f"{D}) wanted")
        if scatter[i] is not None:
            cache, index = (tuple(extra_shapes[j]) for j in scatter[i])
            if stored[i] or len(cache) != 4 or cache[0] != M or cache[1] * cache[3] != N or cache[3] != D or \
                    index != (1,) or extra_dtypes[scatter[i][0]] != out_dtype or \
                    "int" not in extra_dtypes[scatter[i][1]]:
                raise ValueError(f"gemv_group: weight {i} stored into a cache {cache} ({extra_dtypes[scatter[i][0]]}) "
                                 f"at index {index}: a ({M}, {N // D}, L, {D}) {out_dtype} cache, one integer index, "
                                 "and no output of its own wanted")
    return _Rope(D, rotary, scatter)


class _RopeBufs(NamedTuple):
    """A weight's rotary tables (None: not rotated) and the cache and index it is stored into (None: its ``C``)."""

    cos: Any
    sin: Any
    cache: Any
    index: Any


class _Norm(NamedTuple):
    """A program's buffers for the norm of A: the norm's weight ``G`` (None: none), a lane's vector of it, each row's
    sum of squares, the rows' vectors times G (fp32), and eps."""

    G: Any
    g_r: Any
    ss: Any
    ag: Any
    eps: float


def joined_sets(extras_of: Sequence[Sequence[int]]) -> list[list[int]]:
    """The weights computed by the same programs (one reads another's output, ``gemv_group``), each set in order,
    the sets in the order of their first weights."""
    of = list(range(len(extras_of)))

    def root(i):
        while of[i] != i:
            i = of[i]
        return i

    for i, own in enumerate(extras_of):
        for k in (-1 - j for j in own if j < 0):
            of[root(i)] = root(k)
    sets: dict[int, list[int]] = {}
    for i in range(len(extras_of)):
        sets.setdefault(root(i), []).append(i)
    return sorted(sets.values())


def _gemv(Ns, M, K, A_dtype, B_dtype, out_dtype, accum_dtype, prologue, epilogues, extra_shapes, extra_dtypes,
          extras_of, block_N, threads, unroll, target, stored=None, norm=None, rope=None):
    """The kernel of ``gemv`` (one weight, its parameters named ``B`` and ``C``) and ``gemv_group`` (``B_i``, ``C_i``);
    ``norm``: (eps, the norm weight's dtype or None) where A is RMS-normalized; ``rope``: a ``_Rope`` or None."""
    stored = stored or (True,) * len(Ns)
    if not 1 <= M <= GEMV_ROWS:
        raise ValueError(f"gemv: {M} rows; at most {GEMV_ROWS} (a GEMM takes more)")
    if unroll < 1:
        raise ValueError(f"gemv: unroll={unroll}; at least 1")
    d = dialect(target)
    lanes = 1 if d.cpu else 32
    warps = 1 if d.cpu else threads // 32
    if not d.cpu and (threads % 32 or block_N % warps):
        raise ValueError(f"gemv: block_N={block_N} rows do not split over {threads} threads' warps")
    R = block_N // warps  # rows of a warp
    vec = 16 // {"float32": 4}.get(B_dtype, 2)  # elements of a 16-byte load
    vec = vec if K % vec == 0 else 1  # a row that is not whole vectors (nor 16-byte aligned) reads elements
    step = lanes * vec
    full = K // step  # steps every lane reads whole
    sets = joined_sets(extras_of)
    blocks = [(Ns[ws[0]] + block_N - 1) // block_N for ws in sets]
    first = [sum(blocks[:i]) for i in range(len(sets))]  # each set's first program
    one = len(Ns) == 1
    g_dtype = A_dtype if norm is None or norm[1] is None else norm[1]  # (the norm weight's; a plain Python value)
    kept = {k for own in extras_of for k in (-1 - j for j in own if j < 0)}  # weights whose output another reads

    def a_elem(a):
        """An element of A as the product reads it: through the prologue, in ``B_dtype``'s values (as ``gemm``)."""
        if prologue is None and A_dtype == B_dtype:
            return T.Cast(accum_dtype, a)
        return T.Cast(accum_dtype, T.Cast(B_dtype, emit(prologue or Acc(), Env(acc=a))))

    def row_n(bx, warp, r, paired):
        """The weight row of this warp's row ``r``: the warp's ``R`` consecutive rows, or (``paired``: a rotary
        weight's) ``R / 2`` pairs, row ``r`` and ``r + R / 2`` a head's ``n`` and ``n + D / 2``."""
        if not paired:
            return bx * block_N + warp * R + r
        half, pairs = rope.D // 2, R // 2
        p = (bx * warps + warp) * pairs + r % pairs
        return p // half * rope.D + p % half + r // pairs * half

    def row(N, bx, warp, r, paired):
        """Weight row ``r`` of this warp (rows past N read row N - 1)."""
        n = row_n(bx, warp, r, paired)
        return T.min(n, N - 1) if N % block_N else n

    @T.macro
    def step_at(N, A, B, acc, a_r, b_r, bx, warp, base, nb, paired):
        """One step along K at ``base`` (this lane's first element): its vectors of A and of its rows, multiplied;
        ``nb``: the norm's buffers (``_Norm``), or None."""
        for m in T.unroll(M):
            for e in T.vectorized(vec):
                a_r[m, e] = A[m, base + e]
        for r in T.unroll(R):
            for e in T.vectorized(vec):
                b_r[r, e] = B[row(N, bx, warp, r, paired), base + e]
        if nb is None:
            for m in T.unroll(M):
                for r in T.unroll(R):
                    for e in T.unroll(vec):
                        acc[m, r] += a_elem(a_r[m, e]) * T.Cast(accum_dtype, b_r[r, e])
        else:
            if nb.G is not None:
                for e in T.vectorized(vec):
                    nb.g_r[e] = nb.G[base + e]
            for m in T.unroll(M):
                for e in T.unroll(vec):
                    nb.ss[m] += T.Cast(accum_dtype, a_r[m, e]) * T.Cast(accum_dtype, a_r[m, e])
                    nb.ag[m, e] = T.Cast(accum_dtype, a_r[m, e]) * (
                        T.Cast(accum_dtype, nb.g_r[e]) if nb.G is not None else T.Cast(accum_dtype, 1))
            for m in T.unroll(M):
                for r in T.unroll(R):
                    for e in T.unroll(vec):
                        acc[m, r] += nb.ag[m, e] * T.Cast(accum_dtype, b_r[r, e])

    def finish(epilogue, acc, extras, shapes, fed, m, r, n):
        """Output element (m, n) of a weight from its sum ``acc[m, r]``: through its epilogue, whose extras are read
        at (m, n) or are the ``fed`` outputs of other weights (kept, (M, R))."""
        if epilogue is None:
            return acc[m, r]
        return epilogue_at(epilogue, acc[m, r], extras, shapes, [m, n], accum_dtype,
                           {p: f[m, r] for p, f in fed.items()})

    def rotated(epilogue, acc, extras, shapes, m, r, n, rp):
        """Output element (m, n) rotated (``rotary_embedding``): it and its pair partner (the warp's row ``r +- R / 2``)
        rounded to ``out_dtype``, times the row's cos and sin (``rp``: the ``_Rope`` buffers of the weight)."""
        pairs, c = R // 2, n % rope.D
        other = T.if_then_else(r < pairs, r + pairs, r - pairs)
        n_other = T.if_then_else(r < pairs, n + rope.D // 2, n - rope.D // 2)
        x = T.Cast(accum_dtype, T.Cast(out_dtype, finish(epilogue, acc, extras, shapes, {}, m, r, n)))
        y = T.Cast(accum_dtype, T.Cast(out_dtype, finish(epilogue, acc, extras, shapes, {}, m, other, n_other)))
        cos, sin = (T.Cast(accum_dtype, t[m if int(t.shape[0]) == M and M > 1 else 0, c]) for t in (rp.cos, rp.sin))
        return x * cos + T.if_then_else(r < pairs, -y, y) * sin

    def store(C, v, m, n, rp):
        """Output element (m, n) into ``C``, or (``rp`` with a cache) into the cache at the index's position: nothing
        outside the cache (the GPU traps there, the c target's caller checks first: ``runtime.kernels``)."""
        if rp is None or rp.cache is None:
            T.buffer_store(C, v, [m, n])
            return
        at = rp.index[0]
        inside = T.And(at >= T.Cast(at.dtype, 0), at < T.Cast(at.dtype, int(rp.cache.shape[2])))
        with T.If(inside), T.Then():
            T.buffer_store(rp.cache, v, [m, n // rope.D, T.Cast("int32", at), n % rope.D])
        if not d.cpu:
            with T.If(T.Not(inside)), T.Then():
                T.evaluate(T.call_extern("int32", d.trap))

    @T.macro
    def rows_of(N, A, B, C, epilogue, extras, shapes, acc, a_r, b_r, bx, lane, warp, keep, fed, nb, rp):
        """This program's ``block_N`` rows of weight ``B`` (``bx``: its program among that weight's) into ``C`` (None:
        not stored) and ``keep`` (None: no other weight reads them); ``fed``: epilogue argument -> the kept output
        (M, R) of the weight it reads; ``nb`` as ``step_at``'s; ``rp``: the weight's ``_RopeBufs`` (None: none)."""
        paired = rp is not None and rp.cos is not None
        T.clear(acc)
        if nb is not None:
            T.clear(nb.ss)
        for t in T.serial(full // unroll):
            for u in T.unroll(unroll):
                step_at(N, A, B, acc, a_r, b_r, bx, warp, ((t * unroll + u) * lanes + lane) * vec, nb, paired)
        for u in T.unroll(full % unroll):
            step_at(N, A, B, acc, a_r, b_r, bx, warp, ((full // unroll * unroll + u) * lanes + lane) * vec, nb, paired)
        if K % step:  # noqa: SIM102 -- a Python test, then a TIR one: the row's last part, a vector a lane
            if (full * lanes + lane) * vec < K:
                step_at(N, A, B, acc, a_r, b_r, bx, warp, (full * lanes + lane) * vec, nb, paired)
        for off in T.unroll(lanes.bit_length() - 1):
            for m in T.unroll(M):
                for r in T.unroll(R):
                    acc[m, r] = acc[m, r] + T.shfl_xor(acc[m, r], 1 << off)
                if nb is not None:
                    nb.ss[m] = nb.ss[m] + T.shfl_xor(nb.ss[m], 1 << off)
        if nb is not None:  # the norm: every lane holds its row's sum of squares
            for m, r in T.grid(M, R):
                acc[m, r] = acc[m, r] * T.rsqrt(nb.ss[m] / T.Cast(accum_dtype, K) + T.Cast(accum_dtype, nb.eps))
        for m, r in T.grid(M, R):
            n = row_n(bx, warp, r, paired)
            if keep is not None:  # every lane holds the sums after the shuffles: each keeps them all
                keep[m, r] = T.Cast(out_dtype, finish(epilogue, acc, extras, shapes, fed, m, r, n))
            if C is not None or rp is not None:  # noqa: SIM102 -- a Python test, then a TIR one
                if T.And(lane == (m * R + r) % lanes, n < N):
                    store(C, T.Cast(out_dtype, rotated(epilogue, acc, extras, shapes, m, r, n, rp) if paired else
                                    finish(epilogue, acc, extras, shapes, fed, m, r, n)), m, n, rp)

    def weight(i, bx, bufs):
        """Weight ``i``'s rows of program ``bx`` (among its set's programs), its epilogue's extras or kept outputs."""
        A, Bs, extras, Cs, acc, a_r, b_r, keeps, lane, warp, nb = bufs
        own = extras_of[i]
        rp = None
        if rope is not None and (rope.rotary[i] is not None or rope.scatter[i] is not None):
            cos, sin = (extras[j] for j in rope.rotary[i]) if rope.rotary[i] is not None else (None, None)
            cache, index = (extras[j] for j in rope.scatter[i]) if rope.scatter[i] is not None else (None, None)
            rp = _RopeBufs(cos, sin, cache, index)
        rows_of(Ns[i], A, Bs[i], Cs[i], epilogues[i], [extras[j] if j >= 0 else None for j in own],
                [extra_shapes[j] if j >= 0 else None for j in own], acc, a_r, b_r, bx, lane, warp, keeps.get(i),
                {p: keeps[-1 - j] for p, j in enumerate(own) if j < 0}, nb, rp)

    @T.prim_func
    def gemv_kernel():
        A = param("A", (M, K), A_dtype)
        G = param("G", (K,), norm[1]) if norm is not None and norm[1] is not None else None
        Bs = [param("B" if one else f"B{i}", (N, K), B_dtype) for i, N in enumerate(Ns)]
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Cs = [param("C" if one else f"C{i}", (M, N), out_dtype) if stored[i] else None for i, N in enumerate(Ns)]
        with d.kernel(sum(blocks), threads=threads) as bx:
            acc = T.alloc_local((M, R), accum_dtype)
            a_r = T.alloc_local((M, vec), A_dtype)
            b_r = T.alloc_local((R, vec), B_dtype)
            keeps = {k: T.alloc_local((M, R), out_dtype) for k in sorted(kept)}
            nb = None
            if norm is not None:  # (named, so the source names them)
                g_r = T.alloc_local((vec,), g_dtype)
                ss = T.alloc_local((M,), accum_dtype)
                ag = T.alloc_local((M, vec), accum_dtype)
                nb = _Norm(G, g_r, ss, ag, norm[0])
            tx = 0 if d.cpu else T.get_thread_binding(0)
            lane, warp = tx % lanes, tx // lanes
            bufs = (A, Bs, extras, Cs, acc, a_r, b_r, keeps, lane, warp, nb)
            d.wait_inputs()  # PDL (see common.py): nothing read before the kernel before is done
            for s, ws in enumerate(sets):
                if one:
                    weight(ws[0], bx, bufs)
                elif T.And(bx >= first[s], bx < first[s] + blocks[s]):
                    for i in ws:
                        weight(i, bx - first[s], bufs)

    return gemv_kernel


def get_configs(target: dict | str, dtype: str = "float16", paired: bool = False) -> list[dict]:
    """Programs of 4-32 weight rows on 4 or 8 warps (one lane on CPU targets), the default pick first: one row a warp
    read every weight fastest or within 6% on the H200 at one row of A (bench_gemv.py,
    bench/results/2026-12-02-h200-session11: 1.04-2.25x cuBLAS on HF LLaMA's and LLaMA-3-8B's projections). The
    same with all eight steps of a 2048-deep row's loads in flight (``unroll`` 8, one trip to memory where 4 makes
    two: the small weights' kernels, 2.6-4.2 us, are mostly that latency) are candidates, not yet measured."""
    if dialect(target).cpu:
        return [{"block_N": 8, "threads": 1}]
    configs = [{"block_N": n, "threads": t} for n, t in ((4, 128), (8, 128), (16, 128), (16, 256), (32, 256))] + \
        [{"block_N": n, "threads": 128, "unroll": 8} for n in (4, 8, 16)]
    # ``paired``: a group that rotates (``rotary_of``) wants whole pairs of rows a warp
    return [c for c in configs if c["block_N"] // (c["threads"] // 32) % 2 == 0] if paired else configs


def config_label(config: dict) -> str:
    """A config as benchmark tables name it: ``block_N/threads``, ``/u8`` where it unrolls other than ``UNROLL``."""
    u = config.get("unroll", UNROLL)
    return f"{config['block_N']}/{config['threads']}" + (f"/u{u}" if u != UNROLL else "")

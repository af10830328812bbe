"""Fused flash-attention forward: ``O = softmax(Q K^T * scale + mask) V`` in one pass over K/V tiles.

Note: each program owns ``block_M`` query rows of one (batch, query head) and walks the keys in
tiles of ``block_N`` with the online softmax (running row max and sum in fp32, rescaling the
output accumulator as the max grows). Scores are kept in the log2 domain (``scale * log2(e)``, the
mask times ``log2(e)``) so the exponent is ``T.exp2``. Grouped-query attention reads kv head
``h // (Hq / Hkv)``; nothing is repeated in memory. Tails: ``T.copy`` zero-fills K/V/Q tile
elements past the sequence ends (so ``0 * V`` never meets garbage) and guards the store; scores
past ``Skv`` (and above the diagonal when causal, top-left aligned as torch) are ``-inf``. Causal
programs stop at the last key tile their rows can see. A row whose scores are all ``-inf`` so far
uses 0 as its max, so ``exp2(-inf - max)`` is 0 and never NaN; a row masked entirely gives 0, as
torch's fused SDPA kernels do (its math path gives NaN). The mask is read at clamped coordinates (values computed for rows and
columns past the edge are never stored).

Metal (source only): the two products' accumulators are opaque simdgroup matrices, so the scores are copied to
threadgroup memory for the softmax (with ``Dialect.reduce``), and each tile's ``P V`` goes to a fresh accumulator
that is copied out and added to the rescaled running output, kept in threadgroup memory (``on["O"]``).

Layouts: each of Q, K, V and O is either a contiguous ``(B, H, S, D)`` tensor (the default) or, with
a ``TokenRows(width, offset)`` layout, a ``(B, S, width)`` buffer whose head ``h`` holds columns
``offset + h*D`` to ``offset + (h+1)*D`` of each token's row. That reads a fused QKV projection
``(B, S, 3*H*D)`` in place (q at offset 0, k at ``H*D``, v at ``2*H*D``; the same tensor is passed for
each) and writes the output straight into ``(B, S, H*D)``, the layout the next projection reads, so
the head split and merge around attention (``view``/``transpose`` copies in torch) disappear. Tile
copies are the same in both layouts: one row of ``D`` features per token, rows past ``S`` zero-filled
on loads and skipped on the store.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import tilelang.language as T
import torch
import torch.nn.functional as F

from tilefuse.config import device_facts
from tilefuse.lowering.templates import attention_ws
from tilefuse.lowering.templates.attention_configs import (  # noqa: F401 -- the template's config space
    SPLIT_MAX,
    config_space,
    cpu_config,
    decode_configs,
    decode_parts,
    decodes,
    get_configs,
    per_key_mask,
)
from tilefuse.lowering.templates.attention_ws import HIDDEN_GAP, LOG2E
from tilefuse.lowering.templates.common import (
    broadcast_index,
    broadcast_shapes,
    check_dtype,
    dialect,
    param,
    target_kind,
)
from tilefuse.ops import nn

SCAN_RUN = 8  # keys a lane reads a step of the bound's scan of the mask
# scan steps a lane issues together (unrolled, runs in registers): 32 x 8 x 16 = 4096 keys one trip a pass, not 16.
# H200, L2 flushed (bench_decode_attention.py, 2026-12-02): batch 1 x 4096 filled 300, 0.0159 -> 0.0130 ms unsplit,
# 0.0169 -> 0.0147 in 16 parts; batch 64, 0.0566 -> 0.0464. Inside a decode step (the mask warm in L2): no change.
SCAN_UNROLL = 16


class TokenRows(NamedTuple):
    """An operand laid out as ``(B, S, width)``: head ``h`` of token ``s`` is ``[s, offset + h*D : offset + (h+1)*D]``.

    ``TokenRows(H * D, 0)`` is a contiguous ``(B, S, H, D)`` tensor; ``TokenRows(3 * H * D, H * D)`` the
    keys of a fused QKV projection."""

    width: int
    offset: int


def _operand(name: str, layout: TokenRows | None, B: int, H: int, S: int, D: int) -> tuple[int, ...]:
    """The parameter shape of an operand with ``H`` heads of ``S`` tokens in ``layout`` (None: BHSD)."""
    if layout is None:
        return (B, H, S, D)
    width, offset = (int(x) for x in layout)
    if offset < 0 or offset + H * D > width:
        raise ValueError(f"flash_attention: {name} heads at columns {offset}..{offset + H * D} do not fit rows of "
                         f"{width}")
    return (B, S, width)


def _tile(buf, layout: TokenRows | None, b, h, s, D: int):
    """The first element of the tile of head ``h`` from token ``s`` on (``T.copy`` takes the extent from
    the tile it fills or reads)."""
    return buf[b, h, s, 0] if layout is None else buf[b, s, layout[1] + h * D]


def _elem(buf, layout: TokenRows | None, b, h, s, c, D: int):
    """Element ``c`` of head ``h`` of token ``s``."""
    return buf[b, h, s, c] if layout is None else buf[b, s, layout[1] + h * D + c]


def flash_attention(
    B: int,
    Hq: int,
    Sq: int,
    Skv: int,
    D: int,
    *,
    Hkv: int | None = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    mask_shape: Sequence[int] | None = None,
    mask_dtype: str | None = None,
    dtype: str = "float16",
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    block_M: int = 64,
    block_N: int = 64,
    num_stages: int = 1,
    threads: int = 128,
    pack: bool = False,
    stage_out: bool = True,
    fold_scale: bool = True,
    ws: bool = False,
    pingpong: bool = False,
    pair_rows: bool = False,
    late_store: bool = False,
    double_q: bool = False,
    chain: bool = False,
    fast_math: bool = False,
    exp_poly: int = 0,
    pin_softmax: bool = False,
    lean_producer: bool = False,
    bound_keys: bool = False,
    splits: int = 1,
    split_max: int | None = None,
    target: dict | str = "cuda",
    q_layout: TokenRows | None = None,
    k_layout: TokenRows | None = None,
    v_layout: TokenRows | None = None,
    o_layout: TokenRows | None = None,
):
    """A ``T.prim_func`` for scaled dot-product attention; parameters ``Q, K, V[, Mask], O``.

    ``Q`` is ``(B, Hq, Sq, D)``, ``K``/``V`` are ``(B, Hkv, Skv, D)`` with ``Hq % Hkv == 0``, ``O`` is ``(B, Hq, Sq,
    D)`` in ``out_dtype`` (default ``dtype``); an operand with a ``TokenRows`` layout (``q_layout``...) is a ``(B, S,
    width)`` buffer instead. ``scale`` defaults to ``1/sqrt(D)``. ``mask_shape`` (rank <= 4, broadcastable to ``(B,
    Hq, Sq, Skv)``) adds an additive mask of ``mask_dtype`` to the scaled scores. ``softcap`` (> 0) caps the scaled
    scores before the mask, ``softcap * tanh(s / softcap)`` (Gemma 2's logit softcapping). Tunables are TileLang's:
    ``block_M`` (query rows per program), ``block_N`` (keys per step), ``num_stages``, ``threads``; CPU targets ignore
    the last two. ``pack``: a program owns one kv head and its rows are the (query head of its group, query) pairs,
    so a decode step's few queries fill the tile and each K/V tile is read once for the whole group
    (``decode_configs``).
    ``bound_keys`` (with a mask): a first pass over the mask finds the first and last key some row of the program
    keeps, and the K/V loop runs over those tiles only (a decode step over a static cache reads its filled part, see
    ``HIDDEN_GAP``). ``split_max`` (a spec argument) adds the parameters ``O_part (split_max, B, Hq, Sq, D)`` and
    ``LSE (split_max, B, Hq, Sq)`` (fp32) before ``O``, which ``splits > 1`` (packed rows only) uses: each program
    takes one of ``splits`` equal parts of the key tiles it would walk and writes its normalized output and
    log-sum-exp there, and a second kernel combines the parts (a decode step of one sequence over a long cache:
    ``Hkv`` programs alone would leave the GPU idle).
    GPUs take fp16/bf16 (the MMAs); fp32 runs only on CPU targets (``T.gemm`` on GPUs would be TF32). No mask and a
    positive scale: scores stay raw, the scale rides in exp2's multiply-add, and only tiles with keys past ``Skv`` or
    on the causal diagonal take the visibility test (``fold_scale=False``: the older form, for A/B runs).
    ``stage_out``: CUDA programs of whole row tiles (a row tail hit TileLang barrier errors) store O via shared memory.
    ``ws``: the hand-written warp-specialized, persistent schedule (``attention_ws``; an error where it does not apply),
    with ``pingpong`` its consumer warp groups taking turns at the tensor cores, with ``pair_rows`` (causal) each program's
    row tiles in heavy/light pairs (``attention_ws.TileOrder``), with ``late_store`` O's TMA store waited for only before
    the next tile's, with ``double_q`` two Q buffers, with ``chain`` each tile's first scores under the previous tile's
    last ``P V``, with ``fast_math`` nvcc's fast math (``ex2.approx.ftz``), with ``lean_producer`` one producer warp.
    """
    Hkv = Hkv or Hq
    out_dtype = out_dtype or dtype
    if Hq % Hkv:
        raise ValueError(f"flash_attention: {Hq} query heads are not a multiple of {Hkv} kv heads")
    mask_dtype = mask_dtype or dtype
    d = dialect(target)
    for dt in (dtype, out_dtype, *([mask_dtype] if mask_shape is not None else [])):
        check_dtype(dt, target, "flash_attention")
    if dtype not in ("float16", "bfloat16", "float32"):
        raise NotImplementedError(f"flash_attention: dtype {dtype!r}; use float16, bfloat16 or float32")
    if dtype == "float32" and not d.cpu:
        raise NotImplementedError("flash_attention: float32 on GPUs would run as TF32; cast q/k/v to fp16 or bf16")
    groups = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    scale_log2 = scale * LOG2E
    if softcap is not None and not float(softcap) > 0:
        raise ValueError(f"flash_attention: softcap must be positive, got {softcap}")
    fold = bool(fold_scale) and mask_shape is None and scale > 0 and softcap is None
    q_layout, k_layout, v_layout, o_layout = (None if lay is None else TokenRows(*lay)
                                              for lay in (q_layout, k_layout, v_layout, o_layout))
    q_shape, k_shape = _operand("q", q_layout, B, Hq, Sq, D), _operand("k", k_layout, B, Hkv, Skv, D)
    v_shape, o_shape = _operand("v", v_layout, B, Hkv, Skv, D), _operand("o", o_layout, B, Hq, Sq, D)
    if mask_shape is not None:
        mask_shape = tuple(int(s) for s in mask_shape)
        if len(mask_shape) > 4 or broadcast_shapes((B, Hq, Sq, Skv), mask_shape) != (B, Hq, Sq, Skv):
            raise ValueError(f"flash_attention: mask {mask_shape} does not broadcast to {(B, Hq, Sq, Skv)}")
    if pack and d.metal:
        raise NotImplementedError("flash_attention: packed rows (pack=True) have no Metal form")
    if window is not None and (not is_causal or int(window) < 1):
        raise ValueError(f"flash_attention: a sliding window ({window}) needs is_causal and at least one key")
    if bound_keys and d.metal:
        raise NotImplementedError("flash_attention: bound_keys has no Metal form")
    bound = bool(bound_keys)
    if (pingpong or pair_rows or late_store or double_q or chain or fast_math or exp_poly or pin_softmax
            or lean_producer) and not ws:
        raise ValueError("flash_attention: pingpong, pair_rows, late_store, double_q, chain, fast_math, exp_poly, "
                         "pin_softmax and lean_producer are options of ws=True")
    if ws:
        if not attention_ws.eligible(target, D=D, dtype=dtype, mask_shape=mask_shape, mask_dtype=mask_dtype,
                                     scale=scale, window=window, softcap=softcap,
                                     pack=pack, splits=splits, bound_keys=bound_keys, q_layout=q_layout,
                                     k_layout=k_layout, v_layout=v_layout, out_dtype=out_dtype):
            raise ValueError("flash_attention: ws=True needs a CUDA sm_90 target, fp16/bf16, at most a padding mask "
                             "(one float per key and batch), a positive scale, no softcap or window, packed rows or "
                             "split keys, a head dim of 16-128 in steps of 16, token rows in 16-byte units and the "
                             "output in the operands' dtype")
        smem, room = 2 * D * (block_M * (3 if double_q else 2) + 2 * num_stages * block_N), device_facts(target)
        if smem > room.smem_per_block:  # (Q once or twice, O's stage, K and V per stage: TileLang's allocation)
            raise ValueError(f"flash_attention(ws=True): {block_M} x {block_N} tiles of head dim {D} in {num_stages} "
                             f"stages{' with two Q buffers' if double_q else ''} need {smem // 1024} KB of shared "
                             f"memory; the target has {room.smem_per_block // 1024} KB")
        return attention_ws.flash_attention_ws(
            B, Hq, Sq, Skv, D, Hkv=Hkv, is_causal=is_causal, scale=scale, dtype=dtype, out_dtype=out_dtype,
            block_M=block_M, block_N=block_N, num_stages=num_stages, threads=threads, target=target,
            shapes=(q_shape, k_shape, v_shape, o_shape), layouts=(q_layout, k_layout, v_layout, o_layout),
            pingpong=bool(pingpong), pair_rows=bool(pair_rows), late_store=bool(late_store),
            double_q=bool(double_q), chain=bool(chain), mask_shape=mask_shape, mask_dtype=mask_dtype,
            bound_keys=bool(bound_keys), fast_math=bool(fast_math), exp_poly=int(exp_poly),
            pin_softmax=bool(pin_softmax), lean_producer=bool(lean_producer))
    stage_out = (bool(stage_out) and target_kind(target) == "cuda" and not (pack or int(splits) > 1)
                 and Sq % block_M == 0)
    rows = groups * Sq if pack else Sq  # a program's rows run over these
    split = int(splits) > 1
    if split and (not pack or split_max is None or int(splits) > int(split_max)):
        raise ValueError(f"flash_attention: splits={splits} needs packed rows and split_max >= splits "
                         f"(split_max={split_max}, pack={pack})")
    if bound_keys and not per_key_mask(mask_shape, is_causal):
        raise ValueError(f"flash_attention: bound_keys needs a mask per key, (B, 1, 1, Skv), without is_causal; got "
                         f"mask {mask_shape}{' and is_causal' if is_causal else ''}")
    lanes = 1 if d.cpu else 32
    cuda = target_kind(target) == "cuda"
    # the scan loads a run of keys at once where every run lies inside the mask's rows
    vector_scan = bound and not d.cpu and Skv % SCAN_RUN == 0 and int(mask_shape[-1]) == Skv
    lane_steps = lanes.bit_length() - 1
    scan_total = -(-Skv // (lanes * SCAN_RUN))  # steps of a pass of the scan over the mask
    scan_steps = min(scan_total, SCAN_UNROLL)

    def head_of(hk, r):  # packed row r of kv head hk: query head hk * groups + r // Sq, query r % Sq
        return hk * groups + r // Sq
    tail_n = Skv % block_N != 0
    neg_inf = -T.infinity(accum_dtype)

    def tested(k, m0):  # the score pass: always unfolded; folded (a uniform branch), tiles past Skv or the diagonal
        if not fold or pack or window is not None:
            return True
        return attention_ws.edge_tile(k, m0, block_N, Skv, is_causal)

    def score(acc, mask, bz, h, m, n):
        """One masked score, scaled to the log2 domain unless ``fold`` (query ``m`` of head ``h``); -inf where the key is
        past the end or causal-hidden."""
        if softcap is not None:  # cap * tanh(acc * scale / cap), in the log2 domain
            s = T.tanh(acc * (scale / float(softcap))) * (float(softcap) * LOG2E)
        else:
            s = acc if fold else acc * scale_log2
        if mask is not None:
            # keys past Skv only in a tail tile (clamped there); else a bounded or split loop's keys stay inside, which
            # the simplifier cannot see through their runtime bounds (a clamp kept there costs the vector loads)
            mi = broadcast_index(mask_shape, (bz, h, T.min(m, Sq - 1), T.min(n, Skv - 1) if tail_n else n))
            s = s + T.Cast(accum_dtype, mask[mi]) * LOG2E
        if not (tail_n or is_causal):
            return s
        return T.if_then_else(attention_ws.visible(m, n, Skv, is_causal, tail_n, window), s, neg_inf)

    def run_key(run, at, base, e):
        """Key ``base + e`` of a scan step's run (held at ``run[at]``): its mask value (log2 domain), -inf past
        ``Skv``."""
        return T.if_then_else(base + e < Skv, T.Cast(accum_dtype, run[at]) * LOG2E, neg_inf)

    def scan_base(t, u, lane):
        """The first key of step ``u`` of round ``t`` of the bound's scan, for ``lane``."""
        return ((t * scan_steps + u) * lanes + lane) * SCAN_RUN

    @T.macro
    def load_run(mask, run, at, bz, h, base):
        """The mask values of keys ``base .. base + SCAN_RUN - 1`` into ``run[at:at + SCAN_RUN]``: one 16-byte load
        where the mask's rows allow (a whole run inside ``Skv``), else one key at a time at clamped positions."""
        if vector_scan:
            for e in T.vectorized(SCAN_RUN):
                run[at + e] = mask[broadcast_index(mask_shape, (bz, h, 0, T.min(base, Skv - SCAN_RUN) + e))]
        else:
            for e in T.unroll(SCAN_RUN):
                run[at + e] = mask[broadcast_index(mask_shape, (bz, h, 0, T.min(base + e, Skv - 1)))]

    @T.macro
    def key_span(mask, span, run, bz, h):
        """``span`` = (largest mask value, last kept key, first kept key; -1 and Skv where none is kept). Each warp
        scans the mask itself, each lane ``SCAN_RUN`` adjacent keys a step, and combines the lanes by shuffles: no
        shared memory, so TileLang's warp-specialized producer computes the same span before its loads."""
        # the lane from the hardware's thread id (tl::get_lane_idx): ``threadIdx.x % 32`` would be simplified by the
        # block's declared thread count (a 32-thread block: threadIdx.x itself), which warp specialization then
        # renumbers for its producer warps (0..127): they scanned other keys, disagreed on the span and hung
        # (HIP has no tl::get_lane_idx and no warp specialization: threadIdx.x % 32 there, the shuffles' 32 lanes)
        lane = 0 if lanes == 1 else T.get_lane_idx(lanes) if cuda else T.get_thread_binding(0) % lanes
        # each pass walks ``rounds`` rounds of ``scan_steps`` steps, a round's loads issued together (steps past the
        # last key read a clamped run and count as -inf)
        rounds = -(-scan_total // scan_steps)
        span[0] = neg_inf
        for t in T.serial(rounds):
            for u in T.unroll(scan_steps):
                load_run(mask, run, u * SCAN_RUN, bz, h, scan_base(t, u, lane))
            for u in T.unroll(scan_steps):
                for e in T.unroll(SCAN_RUN):
                    span[0] = T.max(span[0], run_key(run, u * SCAN_RUN + e, scan_base(t, u, lane), e))
        for off in T.unroll(lane_steps):
            span[0] = T.max(span[0], T.shfl_xor(span[0], 1 << off))
        span[1] = -1
        span[2] = Skv
        for t in T.serial(rounds):
            if rounds > 1:  # (one round: the first pass's runs are still in ``run``)
                for u in T.unroll(scan_steps):
                    load_run(mask, run, u * SCAN_RUN, bz, h, scan_base(t, u, lane))
            for u in T.unroll(scan_steps):
                for e in T.unroll(SCAN_RUN):
                    key = run_key(run, u * SCAN_RUN + e, scan_base(t, u, lane), e)
                    # kept unless hidden (a NaN is kept: it reaches the scores as it would without the bound)
                    if T.Or(T.isnan(key), key > span[0] - HIDDEN_GAP * LOG2E):
                        span[1] = T.max(span[1], T.Cast(accum_dtype, scan_base(t, u, lane) + e))
                        span[2] = T.min(span[2], T.Cast(accum_dtype, scan_base(t, u, lane) + e))
        for off in T.unroll(lane_steps):
            span[1] = T.max(span[1], T.shfl_xor(span[1], 1 << off))
            span[2] = T.min(span[2], T.shfl_xor(span[2], 1 << off))

    @T.macro
    def combine(O_part, LSE, O):
        """O = the parts' outputs weighed by exp2(their LSE - the largest): one program per (query, head, batch),
        a thread per feature; 0 where no part saw a key, NaN where a part is NaN."""
        with d.kernel(Sq, Hq, B, threads=max(32, D)) as (q, h, b):
            d.wait_inputs(pack)  # PDL for a decode step's (packed) attention, and its parts' combine
            top = d.fragment((D,), accum_dtype)
            acc = d.fragment((D,), accum_dtype)
            wsum = d.fragment((D,), accum_dtype)
            for c in d.tile_loop(D):
                top[c] = neg_inf
                acc[c] = 0
                wsum[c] = 0
            for p in T.serial(splits):
                for c in d.tile_loop(D):
                    top[c] = T.max(top[c], LSE[p, b, h, q])
            for p in T.serial(splits):
                for c in d.tile_loop(D):
                    w = T.if_then_else(LSE[p, b, h, q] == neg_inf, T.Cast(accum_dtype, 0),
                                       T.exp2(LSE[p, b, h, q] - top[c]))
                    acc[c] = acc[c] + w * O_part[p, b, h, q, c]
                    wsum[c] = wsum[c] + w
            for c in d.tile_loop(D):
                out = T.Cast(out_dtype, T.if_then_else(wsum[c] == 0, T.Cast(accum_dtype, 0), acc[c] / wsum[c]))
                if o_layout is None:
                    O[b, h, q, c] = out
                else:
                    O[b, q, o_layout[1] + h * D + c] = out

    @T.prim_func
    def flash_attention_kernel():
        Q = param("Q", q_shape, dtype)
        K = param("K", k_shape, dtype)
        V = param("V", v_shape, dtype)
        masks = [param("Mask", mask_shape, mask_dtype)] if mask_shape is not None else []
        if split_max is not None:
            O_part = param("O_part", (split_max, B, Hq, Sq, D), accum_dtype)
            LSE = param("LSE", (split_max, B, Hq, Sq), accum_dtype)
        O = param("O", o_shape, out_dtype)
        with d.kernel(T.ceildiv(rows, block_M), Hkv if pack else Hq, B * splits, threads=threads) as (bx, by, bzs):
            d.wait_inputs(pack)  # PDL for a decode step's (packed) attention, and its parts' combine
            Q_s = d.shared((block_M, D), dtype)
            K_s = d.shared((block_N, D), dtype)
            V_s = d.shared((block_N, D), dtype)
            K_t = d.shared((D, block_N), dtype) if d.cpu else None
            S_f = d.fragment((block_M, block_N), accum_dtype)
            P_c = d.shared((block_M, block_N), dtype) if d.metal else d.fragment((block_M, block_N), dtype)
            O_f = d.fragment((block_M, D), accum_dtype)
            # Metal: the softmax works on threadgroup copies of the simdgroup accumulators (see common.py), and the
            # output accumulates in O_s, each tile's P V added to it (O_t) after the rescale.
            S_s = T.alloc_shared((block_M, block_N), accum_dtype) if d.metal else None
            O_s = T.alloc_shared((block_M, D), accum_dtype) if d.metal else None
            O_t = T.alloc_shared((block_M, D), accum_dtype) if d.metal else None
            # The scores the softmax reads and rewrites, and the running output, in a dict: a buffer bound to a new
            # local name is renamed in the kernel (and the CUDA and C sources would change).
            on = {"S": S_s if d.metal else S_f, "O": O_s if d.metal else O_f}
            m_prev = d.reducible((block_M,), accum_dtype)
            m_cur = d.reducible((block_M,), accum_dtype)
            m_use = d.reducible((block_M,), accum_dtype)
            r_scale = d.reducible((block_M,), accum_dtype)
            r_sum = d.reducible((block_M,), accum_dtype)
            l_sum = d.reducible((block_M,), accum_dtype)
            mask = (masks + [None])[0]
            hk = by if pack else by // groups
            m0 = bx * block_M
            bz = bzs // splits if split else bzs  # the batch row; with splits, part bzs % splits of its keys
            if pack:  # (padding rows past ``rows`` read row rows - 1 and are never stored)
                for i, c in d.tile_loop(block_M, D):
                    r = T.min(m0 + i, rows - 1)
                    Q_s[i, c] = T.if_then_else(m0 + i < rows, _elem(Q, q_layout, bz, head_of(hk, r), r % Sq, c, D),
                                               T.Cast(dtype, 0))
            else:
                T.copy(_tile(Q, q_layout, bz, by, m0, D), Q_s)
            if is_causal and not pack:
                n_tiles = T.ceildiv(T.min(Skv, m0 + block_M), block_N)
            else:
                n_tiles = T.ceildiv(Skv, block_N)
            # a window: the first key tile row m0 can see (key m0 - window + 1); the tiles before it are skipped
            k_lo = T.max(m0 - window + 1, 0) // block_N if window is not None and not pack else 0
            if bound:
                span = T.alloc_local((3,), accum_dtype)
                run = T.alloc_local((scan_steps * SCAN_RUN,), mask_dtype)
                key_span(mask, span, run, bz, head_of(hk, 0) if pack else by)
                last, first = T.Cast("int32", span[1]), T.Cast("int32", span[2])
                # min/max, not selects, so the simplifier keeps the tile index in [0, n_tiles): no last key (-1)
                # gives 0 tiles, and k_lo <= n_tiles
                n_tiles = T.min(n_tiles, T.max(last, -1) // block_N + 1)
                k_lo = T.min(T.max(k_lo, T.max(first, 0) // block_N), n_tiles)
            if split:  # this program's part of the tiles [k_lo, n_tiles)
                per = T.ceildiv(n_tiles - k_lo, splits)
                k_lo, n_tiles = T.min(k_lo + (bzs % splits) * per, n_tiles), T.min(k_lo + (bzs % splits + 1) * per,
                                                                                   n_tiles)
                T.fill(m_use, 0)
            T.fill(on["O"], 0)
            T.fill(l_sum, 0)
            T.fill(m_cur, neg_inf)
            for kk in d.pipelined(n_tiles - k_lo, num_stages):
                k = kk + k_lo
                T.copy(_tile(K, k_layout, bz, hk, k * block_N, D), K_s)
                T.copy(_tile(V, v_layout, bz, hk, k * block_N, D), V_s)
                if d.cpu:  # k outside a vectorized j, as gemm.py does on CPU (the same sums, in k order)
                    T.clear(S_f)
                    for c, j in T.grid(D, block_N):
                        K_t[c, j] = K_s[j, c]
                    for i, c, j in T.grid(block_M, D, block_N):
                        S_f[i, j] += T.Cast(accum_dtype, Q_s[i, c]) * T.Cast(accum_dtype, K_t[c, j])
                else:
                    T.gemm(Q_s, K_s, S_f, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if d.metal:
                    T.sync_threads()  # TileLang does not sync around a simdgroup_store (see gemm.py)
                    T.copy(S_f, S_s)
                    T.sync_threads()
                if tested(k, m0):
                    for i, j in d.tile_loop(block_M, block_N):
                        if pack:
                            r = T.min(m0 + i, rows - 1)
                            on["S"][i, j] = score(on["S"][i, j], mask, bz, head_of(hk, r), r % Sq, k * block_N + j)
                        else:
                            on["S"][i, j] = score(on["S"][i, j], mask, bz, by, m0 + i, k * block_N + j)
                T.copy(m_cur, m_prev)
                d.reduce("max", on["S"], m_cur, clear=False)
                for i in d.tile_loop(block_M):
                    # A row with no visible score yet keeps max -inf; 0 stands in so no exponent is NaN.
                    m_use[i] = T.if_then_else(m_cur[i] == neg_inf, T.Cast(accum_dtype, 0), m_cur[i])
                    r_scale[i] = T.exp2(m_prev[i] * scale_log2 - m_use[i] * scale_log2 if fold else m_prev[i] - m_use[i])
                for i, j in d.tile_loop(block_M, block_N):
                    on["S"][i, j] = T.exp2(on["S"][i, j] * scale_log2 - m_use[i] * scale_log2 if fold
                                           else on["S"][i, j] - m_use[i])
                d.reduce("sum", on["S"], r_sum)
                for i in d.tile_loop(block_M):
                    l_sum[i] = l_sum[i] * r_scale[i] + r_sum[i]
                for i, j in d.tile_loop(block_M, D):
                    on["O"][i, j] = on["O"][i, j] * r_scale[i]
                T.copy(on["S"], P_c)
                if d.cpu:
                    for i, j, c in T.grid(block_M, block_N, D):
                        O_f[i, c] += T.Cast(accum_dtype, P_c[i, j]) * T.Cast(accum_dtype, V_s[j, c])
                elif d.metal:  # this tile's P V into a fresh accumulator, added to the rescaled O_s
                    T.gemm(P_c, V_s, O_f, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.sync_threads()
                    T.copy(O_f, O_t)
                    T.sync_threads()
                    for i, j in T.Parallel(block_M, D):
                        O_s[i, j] = O_s[i, j] + O_t[i, j]
                else:
                    T.gemm(P_c, V_s, O_f, policy=T.GemmWarpPolicy.FullRow)
            for i, j in d.tile_loop(block_M, D):
                on["O"][i, j] = T.if_then_else(l_sum[i] == 0, T.Cast(accum_dtype, 0), on["O"][i, j] / l_sum[i])
            if split:  # the part's normalized output and log-sum-exp (log2 domain; -inf where it saw nothing)
                for i, c in d.tile_loop(block_M, D):
                    if m0 + i < rows:
                        O_part[bzs % splits, bz, head_of(hk, m0 + i), (m0 + i) % Sq, c] = on["O"][i, c]
                for i in d.tile_loop(block_M):
                    if m0 + i < rows:
                        LSE[bzs % splits, bz, head_of(hk, m0 + i), (m0 + i) % Sq] = T.if_then_else(
                            l_sum[i] == 0, neg_inf, (m_use[i] * scale_log2 if fold else m_use[i]) + T.log2(l_sum[i]))
            elif pack:
                for i, c in d.tile_loop(block_M, D):
                    if m0 + i < rows:
                        r = m0 + i
                        if o_layout is None:
                            O[bz, head_of(hk, r), r % Sq, c] = T.Cast(out_dtype, on["O"][i, c])
                        else:
                            O[bz, r % Sq, o_layout[1] + head_of(hk, r) * D + c] = T.Cast(out_dtype, on["O"][i, c])
            elif stage_out:  # through shared memory: whole 16-byte rows (TMA) rather than 4-byte pieces
                O_sh = d.shared((block_M, D), out_dtype)
                T.copy(on["O"], O_sh)
                T.copy(O_sh, _tile(O, o_layout, bz, by, m0, D))
            else:
                T.copy(on["O"], _tile(O, o_layout, bz, by, m0, D))
        if split:
            combine(O_part, LSE, O)

    return flash_attention_kernel


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
              is_causal: bool = False, scale: float | None = None, window: int | None = None,
              softcap: float | None = None) -> torch.Tensor:
    """Torch reference of ``flash_attention`` (fp32 math, kv heads repeated for grouped-query attention; a
    causal flag beside a mask or a window becomes one mask, as ``ops.nn.sdpa`` does, which computes a softcap)."""
    if softcap is not None:
        return nn.sdpa(q.float(), k.float(), v.float(), None if mask is None else mask.float(), is_causal=is_causal,
                       scale=scale, window=window, softcap=softcap).to(q.dtype)
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    m = mask.float() if mask is not None else None
    if is_causal and (m is not None or window is not None):
        i = torch.arange(q.shape[-2], device=q.device).view(-1, 1)
        j = torch.arange(k.shape[-2], device=q.device).view(1, -1)
        visible = (j <= i) & ((j > i - window) if window is not None else True)
        m = torch.zeros(visible.shape, device=q.device) if m is None else m
        m, is_causal = m.masked_fill(~visible, float("-inf")), False
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, is_causal=is_causal,
                                         scale=scale)
    return out.to(q.dtype)

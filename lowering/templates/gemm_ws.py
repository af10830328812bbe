"""GEMM on Hopper with a hand-written producer/consumer pipeline (``gemm(ws=True)``), ``attention_ws``'s recipe.

Note: the kernel is persistent: ``min(SMs, tiles)`` programs walk the output tiles, ``group`` row tiles walking the
column tiles together (their B tiles shared in L2). One producer warp group issues TMA loads of A and B into
``num_stages`` buffers behind full/empty mbarriers; two consumer warp groups keep one WGMMA in flight
(``T.wgmma_gemm`` + ``T.wait_wgmma(1)``) and store each tile through shared memory with a TMA store that they wait on
only before the buffer's next use, so the epilogue overlaps the producer's loads of the next tile. Two schedules:
"cooperative" (both groups on one ``block_M`` x ``block_N`` tile, half its rows each) and ``pingpong`` (each group
on tiles of its own, the CTA's even or odd ones, taking turns at the tensor cores through named barriers, so that one
group's epilogue runs under the other's WGMMAs; CUTLASS's ping-pong kernel schedule).

What it takes (``eligible``): a CUDA sm_90 target, fp16/bf16 operands of one dtype and no prologue, A not
transposed and no batch, and rows that TMA can address (16-byte multiples: A's and B's rows, C's). Tails: TMA loads
zero-fill past M, N and K, the TMA store clips; the epilogue's operands are read at clamped coordinates. Where it
applies to ``MIN_M`` rows or more, its cooperative seeds lead the config space, the first of ``seeds`` (128 x 192,
128 x 256 or 128 x 128 tiles, and 128 x 256 with a sliced epilogue under a GELU at short K, ranked as measured) the
default pick: on the H200
(2026-12-03, bench/results/2026-12-03-h200-session22) every numerics case right (fp16/bf16, tails, NaN/Inf, both
schedules), 1.00-1.08x cuBLAS at the zoo's linear shapes, zoo GPT-2 1.08 -> 1.12x and ViT 1.14 -> 1.17x Inductor.
``pingpong`` measured no better than cooperative; ``Options.experimental`` "gemm_ws_pingpong" offers it. The
cooperative schedule also builds 256 x 128 tiles (each group 128 rows: two m64 WGMMAs a k-step, 128 accumulators a
thread; cuBLAS's ``..._256x128_64x4_1x2_..._coopA`` tile, its pick for most of the zoo's GEMMs on the H200; ptxas: no
spills, no serialized WGMMA, 3 stages, or 4 with a sliced epilogue). No seed offers them: on an H100 (2026-12-05,
bench/results/2026-12-05-h100-session39) 256 x 128 x 4 with 32-column slices led the seeds by 0.6-2.3% under fc1's
GELU at 8192 and 16384 rows, lost 6-7% at 12608 x 3072 x 768 and 8192 x 4096 x 1024, and 3-32% everywhere else.

A full-size epilogue operand of the output's dtype (``staged``: a residual, LLaMA's ``up`` under ``silu(gate) * up``) is
read from the output tile: in the cooperative schedule the producer loads its tile there by TMA once a tile's first
``num_stages`` k-blocks are issued (``prefetch_extra``, the default), behind two mbarriers (loaded; handed back once the
last store has read the tile), so the load runs under the main loop. On the H200 (bench/results/
2026-12-04-h200-session28) that took LLaMA's gate GEMM with ``silu * up`` from 0.548 to 0.490 ms, BERT's fc2 with its
residual from 0.1355 to 0.1289 ms; with the epilogue's fast sigmoid (``lowering.emitters.FAST_EMITTERS``) 0.443 ms,
1.22x cuBLAS followed by torch's silu and mul.

A GELU epilogue (fc1) costs the cooperative schedule about 30% over the bare product: on the H100 (2026-12-05,
bench/results/2026-12-05-h100-session37) 16384 x 3072 x 768 ran 0.1607 ms against cuBLAS's 0.1179 without the GELU
(0.193 with F.gelu after it), where every GEMM without a GELU ran 0.99-1.03x cuBLAS. Tried there and dropped: the
GELU deferred to the next tile's main loop (the epilogue's value written to the output tile, the GELU applied there
in slices between the next tile's WGMMA issues and waits, through registers, two named barriers a k-block), right
at every shape (error 0 against eager's rounding) but 0.82-0.96x cuBLAS + F.gelu where the sliced seed ran 1.14-1.24x
(commit 8d748c8 holds it). Tried and dropped too (session 38, commits 1a9899a-5684c11, bench/results/
2026-12-05-h200-session38): two accumulators taking turns, each tile's epilogue between the next tile's first 1-4
k-blocks' issue and their wait (FlashAttention-3's overlap). 128 x 128 at most (two 128 x 192 accumulators spilled).
With the head and the tail of a tile under separate branches, ptxas serialized every WGMMA (C7514); under one branch
it did not, and the kernel then ran 0.88-0.98x cuBLAS + F.gelu on the H100, against 1.12-1.14x for the same tile
without the overlap and 1.18-1.25x for the best seed. It also failed the GPU numerics at one case (4096 x 4096 x
256, three k-blocks ahead of four: 1% of the elements wrong, a race not found).
What did cut it was a cheaper GELU: since session 40 an fp16 epilogue's root GELU (a bf16 one's since session 42) is
exp of a polynomial (``lowering.emitters.ROUNDED_EMITTERS``, some 15 instructions an element against erff's 28),
0.1848 -> 0.1363 ms at 16384 x 3072 x 768 on the H200, 1.18x cuBLAS's bare product
(bench/results/2026-12-05-h200-session40: the epilogue's time follows its FMA-pipe count, 8 dependent FMAs cost what
one MUFU ex2 does).
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.language as T

from tilefuse.config import DEVICE_FACTS, device_facts
from tilefuse.lowering.expr import Expr
from tilefuse.lowering.templates import gemm_configs
from tilefuse.lowering.templates.common import dialect, param, target_kind

PRODUCER_REGS, CONSUMER_REGS = 40, 232
# The cooperative seed leads (is the default pick) from this many rows: the H200 measured it at 8192 (1.00-1.08x
# cuBLAS, the TileLang-scheduled template 0.64-0.94x) and in GPT-2 / ViT (1000-4096 rows in the numerics tests).
# Fewer rows keep the template's configs and its pick by padded waves (gemm_configs.default_config).
MIN_M = 1024
SMEM_MAX = DEVICE_FACTS["sm_90"].smem_per_block  # (the schedules are sm_90's)
TURN_BARRIER = 12  # ping-pong: group w waits on named barrier 12 + w (TileLang numbers its own from 3)
ITEM = {"float16": 2, "bfloat16": 2, "float32": 4}


def eligible(target: dict | str, *, N: int, K: int, trans_A: bool = False, trans_B: bool = False,
             batch_A: Sequence[int] = (), batch_B: Sequence[int] = (), A_dtype: str = "float16",
             B_dtype: str | None = None, out_dtype: str | None = None, prologue: Expr | None = None,
             **_: object) -> bool:
    """Whether ``gemm_ws`` builds this GEMM (legality only; which schedule wins is measured)."""
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    B_dtype = B_dtype or A_dtype
    out_dtype = out_dtype or B_dtype
    rows_ok = K * ITEM.get(A_dtype, 0) % 16 == 0 and (K if trans_B else N) * ITEM.get(B_dtype, 0) % 16 == 0 \
        and N * ITEM.get(out_dtype, 0) % 16 == 0
    return (target_kind(target) == "cuda" and arch.startswith("sm_90") and A_dtype in ("float16", "bfloat16")
            and B_dtype == A_dtype and out_dtype in ITEM and prologue is None and not trans_A and not batch_A
            and not batch_B and rows_ok)


def seed(out_dtype: str = "float16", pingpong: bool = False, block_N: int | None = None, stages: int = 4,
         slice_N: int | None = None, extra_buffers: int = 1) -> dict:
    """A config of the cooperative schedule (128 x ``block_N`` tiles for both groups, 192 unless given; its epilogue in
    ``slice_N``-column slices where given; two output tiles taking turns with ``extra_buffers=2``) or of ``pingpong``
    (128 x 128 for each; the one ``Options.experimental`` "gemm_ws_pingpong" puts first), 64 deep, with as many stages
    (at most ``stages``) as shared memory holds. ``seeds`` says which leads where."""
    block_N = 128 if pingpong else (block_N or 192)
    while stages > 2 and smem_bytes(128, block_N, 64, stages, out_dtype, pingpong, slice_N, extra_buffers) > SMEM_MAX:
        stages -= 1
    return {"block_M": 128, "block_N": block_N, "block_K": 64, "num_stages": stages, "ws": True,
            **({"pingpong": True} if pingpong else {}), **({"slice_N": slice_N} if slice_N else {}),
            **({"extra_buffers": extra_buffers} if extra_buffers != 1 else {})}


# How the cooperative seeds rank, fitted to the H200's sweeps at M 8192-16384 (bench/proto_gemm_ws.py, bias epilogue;
# 17 shapes: bench/results/2026-12-03-h200-session22 and 2026-12-04-h200-session27; all 17 ranked right):
# - 128 x 192 x 4 against 128 x 256 x 3: fewer padded waves (gemm_configs.wave_cost), ties to 192, the wide tile's cost
#   scaled by WIDE_GAIN where K >= WIDE_K and N >= WIDE_N (its longer k-blocks against the same barrier waits): 256 won
#   all 8 such shapes by 2-17% (5632x2048, 8192x8192, the MLP's, LLaMA's); at N 768 192 won at equal padded waves
#   (16384x768x3072: 1.117 against 1.057x cuBLAS; 8192x768x3072: 1.004 against 0.824).
# - 128 x 128 x 5 leads where the work is short: K in SHORT_K and the wide tile fills at most SHORT_WAVES waves (each
#   SM a few tiles of 32-47 k-blocks): 8192x2048x2048 1.135 against 1.069 (256), 8192x512x2048 1.083 against 0.953.
#   Not at K 768, where 192 won all 6 shapes (768 x 768 at M 8192, 12608, 16384: 1.04-1.11 against 0.95-1.08), nor at
#   K 3072 (16384x768x3072: 1.066 against 1.117), nor with more waves or deeper K (0.84-1.06 against 0.99-1.10).
#   (In LLaMA the measured choice then gave 2048 x 2048 to cuBLAS, 0.102 ms a call in the model, where 256's kernel
#   had been chosen and ran 0.119 ms: bench/results/2026-12-04-h200-session27.)
# - 128 x 256 x 4 with its epilogue in slices of 64 columns (``slice_N``) where K <= SLICE_K, the epilogue evaluates a
#   special function (SPECIAL_OPS) and no full-size extra is staged (sliced, it is read where it lies: LLaMA's silu * up
#   0.430 -> 0.516 ms): its cost scaled by SLICE_GAIN. The H200 (bench/results/2026-12-04-h200-session30), exact GELU,
#   against 128 x 192 x 4: 16384x3072x768 0.1657 / 0.1620 against 0.1715 / 0.1742 ms (two runs), 8192x4096x1024 0.1325
#   against 0.1439 (256 x 3: 0.1413), 8192x3072x768 0.0814 against 0.0825, 12608x3072x768 0.1250 against 0.1233. Not
#   with a bias alone (1.5-2.5% slower at four K-768 shapes), nor at K 4096-16384 (2-6% slower than 256 x 3).
# - Memory-bound shapes (K or N at most MEMORY_DIM: ResNet-50's 1x1 convolutions at batch 64, M 3136-200704; on an H100,
#   bench/results/2026-12-07-h100-session51, BN and ReLU epilogues, residuals where they have one): 128 x 128 x 5 came
#   within 3% of the best of 10 tiles at every bias shape with N > 128 (8 shapes), 128 x 64 x 6 led where N <= 128
#   (200704 x 64 x 256: 0.0450 against 0.0477 ms, 128 x 192's 0.0499); the old picks (128 x 192 x 4, 128 x 256 x 3)
#   ran 6-25% slower at the 8 bias shapes of the model where they differ. With a staged residual, two output tiles
#   taking turns (``extra_buffers=2``: the next tile's residual loaded under this one's epilogue) led at all four conv3
#   shapes: 128 x 128 x 5 (12544x1024x256 0.0230 against 128 x 256 x 3's 0.0274 ms, 3136x2048x512 0.0185 against
#   0.0213), 128 x 64 x 6 at K 64 (200704x256x64 0.0827 against 0.0908). Summed over the model's 33 such GEMMs: 1.197
#   -> 1.073 ms; the whole model 2.629 -> 2.543 ms (1.20x Inductor). The fits above had no shape with K or N that small
#   but 8192x512x2048, where 128 x 128 x 5 led too.
MEMORY_DIM = 512
WIDE_GAIN, WIDE_K, WIDE_N = 0.96, 2048, 2048
SHORT_K, SHORT_WAVES = range(2048, 3072), 4
SLICE_GAIN, SLICE_K = 0.97, 1024
SPECIAL_OPS = frozenset({"gelu", "erf", "tanh", "exp", "sigmoid", "silu"})


def seeds(out_dtype: str, M: int, N: int, K: int, sms: int, epilogue_ops: frozenset[str] = frozenset(),
          staged: bool = False) -> list[dict]:
    """The cooperative schedule's seeds for an ``M`` x ``N`` x ``K`` GEMM over ``sms`` SMs whose epilogue calls
    ``epilogue_ops`` (``staged``: and reads a full-size extra of the output's dtype), the one to build with first:
    128 x 192 x 4 stages, and where shared memory holds 3 stages of 128 x 256, that, 128 x 128 x 5 and, at short K
    under a special function, 128 x 256 x 4 sliced, ranked as the H200 measured (above); memory-bound shapes (K or N
    at most ``MEMORY_DIM``) led by 128 x 128 x 5 or 128 x 64 x 6, with two output tiles taking turns for a staged
    extra, as an H100 measured (above)."""
    narrow = seed(out_dtype)
    wide, short = seed(out_dtype, block_N=256), seed(out_dtype, block_N=128, stages=5)
    if wide["num_stages"] < 3:  # (fp32 outputs: 2 stages of the wide tile; none measured)
        return [narrow]
    if K <= MEMORY_DIM or N <= MEMORY_DIM:  # (memory-bound: the tile whose loads and stores overlap best leads)
        if staged:  # (a 16-bit output here: the producer loads the staged extra, so two output tiles can take turns)
            lead = seed(out_dtype, block_N=64 if K <= 64 else 128, stages=6 if K <= 64 else 5, extra_buffers=2)
        else:
            lead = seed(out_dtype, block_N=64, stages=6) if N <= 128 else short
        return [lead, *[c for c in (short, narrow, wide) if c != lead]]
    if K in SHORT_K and gemm_configs.wave_cost(wide, M, N, 1, sms) <= SHORT_WAVES * 128 * 256:
        return [short, narrow, wide]
    sliced = [seed(out_dtype, block_N=256, slice_N=64)] if K <= SLICE_K and epilogue_ops & SPECIAL_OPS \
        and not staged else []

    def cost(c: dict) -> float:
        gain = WIDE_GAIN if c is wide and K >= WIDE_K and N >= WIDE_N else SLICE_GAIN if c.get("slice_N") else 1.0
        return gemm_configs.wave_cost(c, M, N, 1, sms) * gain
    return sorted([narrow, wide, *sliced], key=cost) + [short]  # (stable: a tie keeps 192 first)


def grouped(t, tm: int, tn: int, group: int):
    """(row tile, column tile) of a persistent program's tile ``t`` of ``tm`` x ``tn``: ``group`` row tiles walk all
    column tiles together (the column operand's tiles shared in L2 between them). Both ws GEMMs' order."""
    per = group * tn
    first = (t // per) * group
    rows = T.max(T.min(tm - first, group), 1)  # (>= 1 where t is a tile; past the last, no division by 0)
    r = t % per
    return first + r % rows, r // rows


class Turn:
    """Output tile ``b`` of the two (``extra_buffers=2``), read as a tile (``[i, j]``) by the epilogue."""

    def __init__(self, tiles, b):
        self.tiles, self.b = tiles, b

    def __getitem__(self, ij):
        return self.tiles[self.b, ij[0], ij[1]]


def smem_bytes(block_M: int, block_N: int, block_K: int, num_stages: int, out_dtype: str, pingpong: bool,
               slice_N: int | None = None, extra_buffers: int = 1) -> int:
    """Operand stages and the output tile(s), or the two output slices of ``slice_N`` columns."""
    out = 2 * block_M * slice_N if slice_N else (2 if pingpong else extra_buffers) * block_M * block_N
    return num_stages * (block_M + block_N) * block_K * 2 + out * ITEM[out_dtype]


def gemm_ws(M: int, N: int, K: int, *, trans_B: bool, dtype: str, out_dtype: str, epilogue_elem, extra_shapes,
            extra_dtypes, block_M: int, block_N: int, block_K: int, num_stages: int, pingpong: bool = False,
            group: int = 8, staged: int | None = None, prefetch_extra: bool = True, cluster: int = 1,
            slice_N: int | None = None, extra_buffers: int = 1, target: dict | str):
    """The warp-specialized ``T.prim_func`` (parameters ``A, B, extra_0.., C``); ``gemm`` checks the arguments and
    passes ``epilogue_elem(C_f, extras, i, j, m0, n0, tile)``, the accumulator element through the epilogue (fp32).
    ``staged``: the extra input (of the output's shape and dtype) copied into the output tile before the epilogue, which
    reads it there (``tile``) and overwrites it in place, element by element. ``cluster=2`` (cooperative schedule):
    programs run in 2-CTA clusters on two row tiles of one column tile, the first CTA's TMA multicasting each B stage
    to both (cuBLAS's ``..._1x2_..._coopA`` kernels do the like), so each stage is released to the producers by both
    CTAs' consumers (on the H200, bench/results/2026-12-04-h200-session30: its best config 2-8% slower than cluster 1's
    at four of the zoo's GEMM-bound shapes; no seed uses it).
    ``slice_N`` (cooperative schedule): the epilogue runs and stores the tile in slices of that many columns through two
    shared-memory buffers taking turns (each waits only for the store two slices back), not one whole output tile: a
    128 x 256 tile then leaves room for a fourth stage. A full-size extra is then read where it lies (not staged).
    ``extra_buffers=2`` (a staged extra the producer loads): two output tiles taking turns, so that the producer loads
    the next tile's extra while this tile's epilogue runs and its store drains. Meant for a residual under a short K,
    where the main loop is too short to hide the load (ResNet-50's 1x1 convolutions: 5-16% faster there on an H100, the
    memory-bound seeds' lead for a residual; ``seeds``)."""
    accum = "float32"
    if slice_N is not None and (pingpong or slice_N <= 0 or block_N % slice_N or slice_N * ITEM[out_dtype] % 16):
        raise ValueError(f"gemm(ws=True): slice_N={slice_N}; a divisor of block_N={block_N} (16-byte rows), with the "
                         "cooperative schedule")
    staged = None if slice_N else staged
    if num_stages < 2:  # (a consumer frees a stage only once the next one's WGMMA is issued)
        raise ValueError(f"gemm(ws=True): {num_stages} stage(s); the pipeline needs at least 2")
    prefetch = staged is not None and not pingpong and prefetch_extra and ITEM[out_dtype] == 2
    if extra_buffers not in (1, 2) or (extra_buffers == 2 and not prefetch):
        raise ValueError(f"gemm(ws=True): extra_buffers={extra_buffers}; 1, or 2 where the producer loads a staged "
                         "full-size extra (the cooperative schedule, a 16-bit output)")
    xb = extra_buffers
    smem = smem_bytes(block_M, block_N, block_K, num_stages, out_dtype, pingpong, slice_N, xb)
    if smem > SMEM_MAX:
        raise ValueError(f"gemm(ws=True): {smem} bytes of shared memory for {block_M}x{block_N}x{block_K}, "
                         f"{num_stages} stages{', two output tiles' if pingpong or xb == 2 else ''}; "
                         f"at most {SMEM_MAX}")
    if pingpong and block_M * block_N > 128 * 128:  # (a warp group's accumulator: 128 registers a thread)
        raise ValueError(f"gemm(ws=True, pingpong=True): a {block_M}x{block_N} tile per warp group; at most 128 x 128")
    if not pingpong and (block_M not in (128, 256) or block_M * block_N > 256 * 128):
        raise ValueError(f"gemm(ws=True): {block_M}x{block_N}; the two consumer warp groups own 64 or 128 rows each, "
                         "and a 256-row tile at most 128 columns (128 accumulators a thread)")
    if cluster not in (1, 2) or (cluster == 2 and pingpong):
        raise ValueError(f"gemm(ws=True): cluster={cluster}; 1, or 2 with the cooperative schedule")
    tm, tn = -(-M // block_M), -(-N // block_N)
    # work items: ``cluster`` row tiles (a row past the last one computes zeros and stores nothing) of one column tile
    tiles = -(-tm // cluster) * tn
    # (prefetch: fp16/bf16 outputs, the ones measured and checked on the H200; an fp32 output's extra is copied by the
    # consumers)
    grid = min(device_facts(target).sms // cluster, tiles)  # programs: clusters of ``cluster`` CTAs
    rounds = -(-tiles // grid)
    nk = -(-K // block_K)
    B_tile = (block_N, block_K) if trans_B else (block_K, block_N)

    def where(t, rank):
        """(row tile, column tile) of work item ``t`` for the cluster's CTA ``rank``."""
        bg, bn = grouped(t, -(-tm // cluster), tn, max(group // cluster, 1))
        return bg * cluster + rank, bn

    @T.macro
    def release(empty, s):
        """A consumer thread frees stage ``s``: in every CTA of the cluster, whose producers all write it."""
        if cluster == 1:
            T.barrier_arrive(empty[s])
        else:
            for r in T.unroll(cluster):
                T.mbarrier_arrive(empty[s], r)

    def b_box(B, bn, k):
        if trans_B:
            return B[bn * block_N:(bn + 1) * block_N, k * block_K:(k + 1) * block_K]
        return B[k * block_K:(k + 1) * block_K, bn * block_N:(bn + 1) * block_N]

    @T.macro
    def produce(A, B, A_s, B_s, full, empty, pid, rank, extras, C_s, xfull, xfree):
        """The producer: each tile's k-blocks into the stage ring, in tile order (k-block ``t * nk + k``); with
        ``prefetch``, once a tile's first ``num_stages`` k-blocks are issued (the consumers are then at the previous
        tile's epilogue), its staged extra's tile into the output tile as soon as the previous store has read it."""
        T.dec_max_nreg(PRODUCER_REGS)
        for t in T.serial(rounds):
            if pid + t * grid < tiles:
                bm, bn = where(pid + t * grid, rank)
                for k in T.serial(nk):
                    g = t * nk + k
                    s = g % num_stages
                    T.mbarrier_wait_parity(empty[s], ((g // num_stages) % 2) ^ 1)
                    T.tma_copy(A[bm * block_M:(bm + 1) * block_M, k * block_K:(k + 1) * block_K], A_s[s, :, :],
                               barrier=full[s])
                    if cluster == 1:
                        T.tma_copy(b_box(B, bn, k), B_s[s, :, :], barrier=full[s])
                    else:  # (issued by the first CTA, into both; each CTA's ``full`` expects its bytes)
                        T.tma_copy(b_box(B, bn, k), B_s[s, :, :], barrier=full[s], cluster_mask=(1 << cluster) - 1)
                    T.barrier_arrive(full[s])
                    if prefetch:
                        if k == min(num_stages, nk) - 1:
                            b = t % xb  # (the output tile it goes to, and its barriers' phase t // xb)
                            T.mbarrier_wait_parity(xfree[b], ((t // xb) % 2) ^ 1)
                            T.tma_copy(extras[staged][bm * block_M:(bm + 1) * block_M,
                                                      bn * block_N:(bn + 1) * block_N],
                                       C_s if xb == 1 else C_s[b, :, :], barrier=xfull[b])
                            T.barrier_arrive(xfull[b])

    @T.macro
    def main_loop(A_s, B_s, C_f, full, empty, t, policy):
        """Tile ``t``'s products, one WGMMA in flight; every stage released."""
        g0 = t * nk
        T.mbarrier_wait_parity(full[g0 % num_stages], (g0 // num_stages) % 2)
        T.wgmma_gemm(A_s[g0 % num_stages, :, :], B_s[g0 % num_stages, :, :], C_f, transpose_B=trans_B,
                     clear_accum=True, policy=policy)
        for k in T.serial(1, nk):
            g = g0 + k
            T.mbarrier_wait_parity(full[g % num_stages], (g // num_stages) % 2)
            T.wgmma_gemm(A_s[g % num_stages, :, :], B_s[g % num_stages, :, :], C_f, transpose_B=trans_B,
                         policy=policy)
            T.wait_wgmma(1)
            release(empty, (g - 1) % num_stages)

    @T.macro
    def sliced_epilogue(C, C_f, C_s, extras, bm, bn):
        """The tile in ``slice_N``-column slices, slice ``c`` through buffer ``c % 2`` once the store that last read it
        (two slices back, maybe the previous tile's) has (the issuing thread waits; TileLang's sync follows)."""
        for c in T.unroll(block_N // slice_N):
            T.tma_store_wait(1)
            for i, j in T.Parallel(block_M, slice_N):
                C_s[c % 2, i, j] = T.Cast(out_dtype, epilogue_elem(C_f, extras, i, c * slice_N + j, bm * block_M,
                                                                   bn * block_N))
            T.tma_copy(C_s[c % 2, :, :], C[bm * block_M:(bm + 1) * block_M,
                                           bn * block_N + c * slice_N:bn * block_N + (c + 1) * slice_N])

    @T.macro
    def epilogue(C, C_f, C_s, extras, bm, bn, t, xfull, xfree):
        if prefetch:  # the producer loaded the extra's tile into C_s (zero past M and N: never stored)
            T.mbarrier_wait_parity(xfull[0], t % 2)
        else:
            T.tma_store_wait()  # (the issuing thread) the previous store from C_s has read it
            if staged is not None:  # one coalesced copy of the extra's tile (zero past M and N)
                T.copy(extras[staged][bm * block_M, bn * block_N], C_s)
        if staged is not None:  # the epilogue into the accumulator, then the cast (C_s read and written in one loop
            for i, j in T.Parallel(block_M, block_N):  # took a barrier each step)
                C_f[i, j] = epilogue_elem(C_f, extras, i, j, bm * block_M, bn * block_N, C_s)
            for i, j in T.Parallel(block_M, block_N):
                C_s[i, j] = T.Cast(out_dtype, C_f[i, j])
        else:
            for i, j in T.Parallel(block_M, block_N):
                C_s[i, j] = T.Cast(out_dtype, epilogue_elem(C_f, extras, i, j, bm * block_M, bn * block_N))
        T.tma_copy(C_s, C[bm * block_M:(bm + 1) * block_M, bn * block_N:(bn + 1) * block_N])
        if prefetch:  # C_s handed back once the store has read it (the issuing thread waits)
            T.tma_store_wait()
            T.barrier_arrive(xfree[0])

    @T.macro
    def turned_epilogue(C, C_f, C_s, extras, bm, bn, t, xfull, xfree):
        """``extra_buffers=2``: tile ``t``'s extra in output tile ``t % 2``, the other handed back to the producer as
        soon as the previous tile's store has read it (the issuing thread waits), before this tile's epilogue."""
        if t > 0:
            T.tma_store_wait()
            T.barrier_arrive(xfree[(t + 1) % 2])
        T.mbarrier_wait_parity(xfull[t % 2], (t // 2) % 2)
        for i, j in T.Parallel(block_M, block_N):
            C_f[i, j] = epilogue_elem(C_f, extras, i, j, bm * block_M, bn * block_N, Turn(C_s, t % 2))
        for i, j in T.Parallel(block_M, block_N):
            C_s[t % 2, i, j] = T.Cast(out_dtype, C_f[i, j])
        T.tma_copy(C_s[t % 2, :, :], C[bm * block_M:(bm + 1) * block_M, bn * block_N:(bn + 1) * block_N])

    @T.macro
    def take_turns(A_s, B_s, C_f, C_s, full, empty, C, extras, pid, w):
        """Ping-pong group ``w``: its tiles' main loops in its turns, each epilogue under the other group's."""
        if w == 1:  # the first turn is group 0's
            T.named_barrier_arrive(TURN_BARRIER, 256)
        for j in T.serial(-(-rounds // 2)):
            t = 2 * j + w
            if pid + t * grid < tiles:
                bm, bn = where(pid + t * grid, 0)
                T.sync_threads(TURN_BARRIER + w, 256)
                main_loop(A_s, B_s, C_f, full, empty, t, T.GemmWarpPolicy.FullRow)
                T.named_barrier_arrive(TURN_BARRIER + 1 - w, 256)  # every product of the tile is issued
                T.wait_wgmma(0)
                release(empty, (t * nk + nk - 1) % num_stages)
                epilogue(C, C_f, C_s, extras, bm, bn, t, None, None)
        T.tma_store_wait()

    @T.macro
    def cooperate(A_s, B_s, C_f, C_s, full, empty, C, extras, pid, rank, xfull, xfree):
        """Both consumer groups on each tile, half its rows each."""
        T.inc_max_nreg(CONSUMER_REGS)
        for t in T.serial(rounds):
            if pid + t * grid < tiles:
                bm, bn = where(pid + t * grid, rank)
                main_loop(A_s, B_s, C_f, full, empty, t, T.GemmWarpPolicy.FullRow)
                T.wait_wgmma(0)
                release(empty, (t * nk + nk - 1) % num_stages)
                if slice_N:
                    sliced_epilogue(C, C_f, C_s, extras, bm, bn)
                elif xb == 2:
                    turned_epilogue(C, C_f, C_s, extras, bm, bn, t, xfull, xfree)
                else:
                    epilogue(C, C_f, C_s, extras, bm, bn, t, xfull, xfree)
        T.tma_store_wait()

    @T.prim_func
    def gemm_ws_kernel():
        A = param("A", (M, K), dtype)
        B = param("B", (N, K) if trans_B else (K, N), dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        C = param("C", (M, N), out_dtype)
        with T.Kernel(grid * cluster, threads=384, cluster_dims=cluster if cluster > 1 else None) as cta:
            A_s = T.alloc_shared((num_stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((num_stages, *B_tile), dtype)
            C_s0 = T.alloc_shared((2, block_M, slice_N) if slice_N else (2, block_M, block_N) if xb == 2
                                  else (block_M, block_N), out_dtype)
            C_f0 = T.alloc_fragment((block_M, block_N), accum)
            C_s1 = T.alloc_shared((block_M, block_N), out_dtype) if pingpong else None  # group 1's own tile
            C_f1 = T.alloc_fragment((block_M, block_N), accum) if pingpong else None
            full = T.alloc_barrier([128] * num_stages)
            if cluster == 1:
                empty = T.alloc_barrier([128 if pingpong else 256] * num_stages)  # (ping-pong: each fill one group's)
            else:  # every consumer of the cluster frees each stage
                empty = T.alloc_cluster_barrier([256 * cluster] * num_stages)
            pid, rank = cta // cluster, cta % cluster  # (a cluster is ``cluster`` consecutive CTAs)
            xfull = T.alloc_barrier([128] * xb) if prefetch else None  # the staged extra's tile is in C_s
            xfree = T.alloc_barrier([256] * xb) if prefetch else None  # the last store has read C_s
            tx = T.get_thread_binding()
            if cluster > 1:  # every CTA's barriers set up before a peer arrives on them or multicasts into it
                T.cluster_sync()
            dialect(target).wait_inputs(False, tma=True)  # (PDL only with ``PDL_ALL``/``PDL_TMA``)
            if tx >= 256:
                produce(A, B, A_s, B_s, full, empty, pid, rank, extras, C_s0, xfull, xfree)
            elif pingpong:
                T.inc_max_nreg(CONSUMER_REGS)
                if tx < 128:
                    take_turns(A_s, B_s, C_f0, C_s0, full, empty, C, extras, pid, 0)
                else:
                    take_turns(A_s, B_s, C_f1, C_s1, full, empty, C, extras, pid, 1)
            else:
                cooperate(A_s, B_s, C_f0, C_s0, full, empty, C, extras, pid, rank, xfull, xfree)
            if cluster > 1:  # no CTA leaves while a peer may still arrive on its barriers
                T.cluster_sync()

    return gemm_ws_kernel

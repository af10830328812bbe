"""Flash-attention forward on Hopper with a hand-written producer/consumer pipeline (``flash_attention(ws=True)``).

Note: the kernel is persistent: ``min(SMs, tiles)`` programs walk the (row tile, head, batch) tiles, causal ones
heaviest first. Each program has one producer warp group and ``threads // 128`` consumer warp groups. The producer
issues TMA loads of Q (one buffer) and of K and V (``num_stages`` buffers each) and waits on "empty" mbarriers before
reusing a buffer; the consumers wait on "full" ones. The consumers overlap the two products inside their warp groups
(FlashAttention-3's intra-warpgroup overlap): key tile ``k``'s ``Q K^T`` and tile ``k - 1``'s ``P V`` are issued
together with ``T.wgmma_gemm``, the softmax of tile ``k`` runs as soon as its scores are done (``T.wait_wgmma(1)``),
while ``P V`` still runs, and only the rescale of O waits for it. TileLang's automatic warp specialization cannot
express this: it refuses a deferred WGMMA wait (see ``attention_configs.config_space``).

What it takes (``eligible``): a CUDA sm_90 target, fp16/bf16 operands, a positive scale (it rides in exp2's
multiply-add, as ``flash_attention``'s fold does), no sliding window, packed rows or split keys, a head dim that is a
multiple of 16 up to 128, and no mask but a padding mask (``key_mask``: one float per key and batch, BERT's). A
padding mask is read from global memory (L1 serves a tile's rows) and added to every key tile's scores, which are then
scaled into the log2 domain before the row max; as in ``flash_attention``, a row that sees no key yet uses 0 for its
max and a row that sees none gives 0 (its GPU tests passed on the H200, 2026-12-05). With ``bound_keys`` (which
``lower.config_space`` adds for a padding mask), every warp of a program first scans whole batches' masks (``key_bounds``) into a per-batch
count of key tiles, up to the last key not hidden (``HIDDEN_GAP``); producer and consumers then walk only those: a
right-padded batch's padding is never loaded or multiplied. Tails: TMA loads zero-fill rows past
``Sq``/``Skv``; scores past ``Skv`` and above the causal diagonal (top-left aligned, as torch) are ``-inf``, tested
only in the tiles that hold such keys; the output goes through shared memory with a TMA store for whole row tiles,
else from the fragment with a guarded store. Measured: see ``WS_SEEDS``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import tilelang.language as T

from tilefuse.config import device_facts
from tilefuse.lowering.templates import common
from tilefuse.lowering.templates.common import broadcast_index, dialect, param, poly_exp2, target_kind

LOG2E = 1.4426950408889634
# ``bound_keys`` (both schedules): a key whose mask is at least this far below its row's largest mask value is skipped.
# Its softmax weight, relative to the row's key with the largest mask, is below exp(-HIDDEN_GAP + their score
# difference): 0 in fp32 unless two scaled scores of a row differ by more than ~9,900. Hugging Face fills hidden keys
# with finfo.min (-65504 in fp16), older models with -10000 (tilefuse.planner.attention_mask.NEG_FILL is the same
# bound).
HIDDEN_GAP = 1e4
PRODUCER_REGS, CONSUMER_REGS = 24, {2: 240, 3: 160}  # setmaxnreg per warp group: 24 + consumers' within 64K
TURN_BARRIER = 12  # ping-pong: consumer warp group w waits on named barrier 12 + w (TileLang numbers its own from 3)
# ``pin_softmax``: ptxas (CUDA 13) sinks key tile k's exponents below the wait for tile k-1's ``P V`` (the
# WARPGROUP.DEPBAR after the scores' wait); a second P buffer, a predicated wait or a named barrier alone leave it so.
# A shared-memory store of each row sum (it reads every exponent of the row), then a named barrier of the warp group
# (``PIN_BARRIER`` + w), moves them: stores do not cross the barrier. Nothing reads the stores.
PIN_BARRIER = 9
PIN_SRC = r"""
__device__ __forceinline__ void tf_pin_store(float* slot, float x) {
  asm volatile("st.shared.f32 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(slot)), "f"(x) : "memory");
}
"""

# (block_M, block_N, num_stages, consumer threads) by head dim, the default pick first. H200, fp16, 2026-12-03
# (bench/results/2026-12-03-h200-session20): 128 x 128 with 2 stages led at 9 of 13 points of the sweep (512-8192
# tokens, D 64 and 128, causal or not) and was within 4% of the best at the rest; 192 rows (3 consumer warp groups) led
# at 8192 tokens without causal masking by 3%. Both beat the TileLang-scheduled template by 0-47% (ViT's 197 tokens).
WS_SEEDS = {64: [(128, 128, 2, 256), (192, 128, 2, 384)], 128: [(128, 128, 2, 256)]}


def key_mask(mask_shape) -> bool:
    """Whether a mask of ``mask_shape`` (rank <= 4, right-aligned to ``(B, H, Sq, Skv)``) holds one value per key (and
    batch), the same for every head and query: a padding mask."""
    if mask_shape is None:
        return False
    padded = (1,) * (4 - len(mask_shape)) + tuple(int(s) for s in mask_shape)
    return padded[1] == 1 and padded[2] == 1


def eligible(target: dict | str, *, D: int, dtype: str = "float16", mask_shape=None, mask_dtype: str | None = None,
             scale: float | None = None, window: int | None = None, softcap: float | None = None, pack: bool = False,
             splits: int = 1, bound_keys: bool = False, q_layout=None, k_layout=None, v_layout=None,
             out_dtype: str | None = None, **_: object) -> bool:
    """Whether ``flash_attention_ws`` builds this attention (legality only; which schedule wins is measured). Q, K and
    V are TMA loads: a token-row operand's row width and column offset must be whole 16-byte units (TileLang refuses
    the descriptor otherwise; the template then copies without TMA). The output is in the operands' dtype (the one
    measured and tested). A mask must be a padding mask (``key_mask``) of floats, added to the scores; ``bound_keys``
    needs one."""
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    rows_ok = all(lay is None or (int(lay[0]) % 8 == 0 and int(lay[1]) % 8 == 0)
                  for lay in (q_layout, k_layout, v_layout))
    mask_ok = mask_shape is None or (key_mask(mask_shape)
                                     and (mask_dtype or dtype) in ("float16", "bfloat16", "float32"))
    return (target_kind(target) == "cuda" and arch.startswith("sm_90") and dtype in ("float16", "bfloat16")
            and mask_ok and (scale is None or scale > 0) and window is None and softcap is None and not pack
            and int(splits) <= 1 and (not bound_keys or mask_shape is not None) and D % 16 == 0 and 16 <= D <= 128
            and rows_ok and out_dtype in (None, dtype))


def visible(m, n, Skv: int, is_causal: bool, tail_n: bool, window: int | None = None):
    """Whether query ``m`` sees key ``n``: inside ``Skv`` (tested only where a tile holds keys past it, ``tail_n``); on
    or below the diagonal when causal (top-left aligned, as torch), within ``window`` keys of it given one. Both
    schedules' score tests."""
    if not is_causal:
        return n < Skv
    seen = T.And(n <= m, n > m - window) if window is not None else n <= m
    return T.And(n < Skv, seen) if tail_n else seen


def edge_tile(k, m0, block_N: int, Skv: int, is_causal: bool):
    """Whether key tile ``k`` of the program whose rows start at ``m0`` holds a key some row cannot see (past ``Skv``,
    or above a row's diagonal when causal): the only tiles given the visibility test, behind a uniform branch."""
    past = (k + 1) * block_N > Skv
    tail_n = Skv % block_N != 0
    if is_causal:
        diagonal = (k + 1) * block_N > m0 + 1
        return T.Or(past, diagonal) if tail_n else diagonal
    return past if tail_n else False


class TileOrder(NamedTuple):
    """Which (row tile, query head, batch) tile a persistent program computes at each of its ``steps``.

    Row tiles run fastest, so that the programs of one round share a head's K/V in L2. Causal row tiles differ in
    work (row tile ``i`` walks about ``i + 1`` key tiles), and with ``grid`` a multiple of the row tile count each
    program met the same row tile in every round: at 512 tokens in 128-row tiles, a quarter of the programs walked 4
    key tiles a round and another quarter 1, so the kernel took 1.65x the balanced time (1.38x for GPT-2's 1024
    tokens, by this model). ``pair``: a program's steps come in pairs, the heaviest row tile left with the lightest, so
    that every pair walks the same number of key tiles. The pairs are drawn from ``group`` heads' row tiles ranked by
    work: one head's for an even row tile count (``nbx - 1 - q`` with ``q``), two heads' for an odd one (whose middle
    tiles then pair with each other). A missing second head (an odd head count) skips its steps.
    """

    nbx: int
    Hq: int
    B: int
    is_causal: bool
    pair: bool
    grid: int

    @classmethod
    def make(cls, nbx: int, Hq: int, B: int, is_causal: bool, sms: int, pair: bool) -> TileOrder:
        order = cls(nbx, Hq, B, is_causal, bool(pair) and is_causal and nbx > 1, 1)
        return order._replace(grid=min(sms, order.slots))

    @property
    def group(self) -> int:
        return 2 if self.nbx % 2 else 1

    @property
    def slots(self) -> int:
        """The pairs (with ``pair``), else the tiles."""
        heads = self.Hq * self.B
        return -(-heads // self.group) * (self.group * self.nbx // 2) if self.pair else self.nbx * heads

    @property
    def gaps(self) -> bool:
        """Whether a program may meet a step with no tile before one with a tile (paired steps of an odd head count
        over an odd row tile count: the missing second head's)."""
        return self.pair and self.group > 1 and (self.Hq * self.B) % self.group != 0

    def live_steps(self, pid):
        """How many steps of program ``pid`` hold a tile (the first ones, without ``gaps``); ``pid`` a TIR
        expression or an int."""
        rounds = (self.slots - pid + self.grid - 1) // self.grid
        return rounds * 2 if self.pair else rounds

    @property
    def steps(self) -> int:
        return -(-self.slots // self.grid) * (2 if self.pair else 1)

    def at(self, pid, t, select=T.if_then_else, both=T.And):
        """(live, row tile, query head, batch) of program ``pid``'s step ``t``: TIR expressions, or ints given Python's
        ``select``/``both`` (the tests enumerate it)."""
        nbx = self.nbx
        if not self.pair:
            tile = pid + t * self.grid
            i = tile % nbx
            return tile < self.slots, (nbx - 1 - i if self.is_causal else i), (tile // nbx) % self.Hq, tile // (nbx * self.Hq)
        g = self.group
        pairs = g * nbx // 2
        slot = pid + (t // 2) * self.grid
        q = slot % pairs
        rank = select(t % 2 == 0, q, g * nbx - 1 - q)  # by work, heaviest first
        hb = (slot // pairs) * g + rank % g
        live = slot < self.slots
        if g > 1 and (self.Hq * self.B) % g:
            live = both(live, hb < self.Hq * self.B)
        return live, nbx - 1 - rank // g, hb % self.Hq, hb // self.Hq


def seeds(D: int) -> list[tuple[int, int, int, int]]:
    """The warp-specialized tiles for head dim ``D`` (the default pick first)."""
    return WS_SEEDS[64] if D <= 64 else WS_SEEDS[128]


def _region(buf, layout, b, h, s, rows: int, D: int):
    """The ``rows`` x ``D`` tile of head ``h`` from token ``s`` on, as a buffer region (a TMA box)."""
    if layout is None:
        return buf[b, h, s:s + rows, :]
    col = layout[1] + h * D
    return buf[b, s:s + rows, col:col + D]


def flash_attention_ws(B: int, Hq: int, Sq: int, Skv: int, D: int, *, Hkv: int, is_causal: bool, scale: float,
                       dtype: str, out_dtype: str, block_M: int, block_N: int, num_stages: int, threads: int,
                       target: dict | str, shapes: tuple, layouts: tuple, pingpong: bool = False,
                       pair_rows: bool = False, late_store: bool = False, double_q: bool = False,
                       chain: bool = False, mask_shape=None, mask_dtype: str | None = None,
                       bound_keys: bool = False, fast_math: bool = False, exp_poly: int = 0,
                       pin_softmax: bool = False, lean_producer: bool = False):
    """The warp-specialized ``T.prim_func`` (parameters ``Q, K, V, O``); ``flash_attention`` checks the arguments
    and passes the operands' parameter ``shapes`` and ``layouts`` (``TokenRows`` or None each, in Q, K, V, O
    order). ``pingpong``: the consumer warp groups take turns at the tensor cores (FlashAttention-3's inter-warpgroup
    schedule): a group issues its products only after the previous group issued its own, through named barriers, so
    one group's softmax runs under another's WGMMAs instead of all groups waiting on the tensor cores together.
    ``pair_rows`` (causal): each program takes a head's row tiles in heavy/light pairs (``TileOrder``); the causal
    seeds carry it (H200, 2026-12-03: 0.79 -> 0.95x cuDNN at GPT-2's shape, 0.62 -> 0.82x at 512 tokens).
    ``late_store`` (whole row tiles): the thread that issued a tile's TMA store of O waits for it to have read shared
    memory only before the next tile writes there (TileLang's ``T.copy`` waits right after issuing, holding the first
    consumer warp group, and with it the next tile's first WGMMA, for the store's read). ``double_q``: two Q buffers,
    so the producer loads the next tile's Q as soon as it has issued this tile's K/V, not only once every ``Q K^T`` of
    this tile is done. ``chain``: a program's tiles run as one pipeline: each tile's first ``Q K^T`` is issued with
    the previous tile's last ``P V`` and its softmax runs while that product does, where otherwise the tensor cores
    wait for every tile's first softmax (a quarter of a tile's key tiles at 512 tokens, half at ViT's 197). It walks
    a program's live steps (``TileOrder.live_steps``), so paired steps with gaps fall back to unpaired. Written
    without a GPU (2026-12-04): it lowers for sm_90a without spills or serialized WGMMAs; its tests passed on the H200
    (2026-12-05), where it ran slower than without at every shape of the sweep. ``fast_math``: nvcc's fast math for the kernel (``common.fast_math``): each
    ``T.exp2`` one ``ex2.approx.ftz`` (MUFU) where the IEEE form, ``ex2.approx`` without ``.ftz``, also rescales
    subnormal results (about three more instructions a score; what FlashAttention-3 compiles with), O's division
    approximate; the default of the ws seeds since the H200's sweep of 2026-12-05 (``attention_configs.get_configs``).
    ``exp_poly`` (k > 1): every k-th 8-column block of a key tile's scores takes its exponents from
    ``common.poly_exp2`` on the FMA units instead of MUFU: on the H100 (2026-12-05, session 37) slower at all 13 of
    the sweep's shapes (k = 4: 0.69-0.97x the plain kernel's speed at 128-row tiles, down to 0.11x at 192-row ones).
    ``pingpong`` (up to 8% slower, H200 2026-12-03) and the others no seed offers (``bench_attention.py``'s variants,
    ``Options.experimental`` but ``exp_poly``); ``late_store`` with ``double_q`` leads up to 2048 keys (fast math made
    them win, H100 2026-12-06: ``attention_configs.SHORT_KEYS``), each alone ran within +-3%. ``pin_softmax``: each
    key tile's exponents computed before the wait for the previous tile's P V, which ptxas puts first (``PIN_SRC``):
    on the H100 (2026-12-06, bench/results/2026-12-06-h100-session46) slower at 16 of 18 D-64 points (to 0.92x).
    ``lean_producer``: one warp of the producer warp group loads (cuDNN's form; the others leave after ``setmaxnreg``),
    where all four wait on every "empty" barrier: on the H100 (2026-12-06, session 47) within 1% at most points, 4-8%
    slower at some: those warps' spin, most of Nsight Compute's stall samples, costs nothing (opt-in)."""
    consumers = threads // 128
    if exp_poly and (exp_poly < 2 or block_N % (8 * exp_poly)):
        raise ValueError(f"flash_attention(ws=True): exp_poly={exp_poly}: every k-th of a key tile's 8-column blocks, "
                         f"k at least 2 and dividing {block_N // 8}")
    if threads % 128 or consumers not in CONSUMER_REGS or block_M != 64 * consumers:
        raise ValueError(f"flash_attention(ws=True): {threads} consumer threads with {block_M}-row tiles; the "
                         f"consumer warp groups own 64 rows each, 2 or 3 of them")
    q_lay, k_lay, v_lay, o_lay = layouts
    groups = Hq // Hkv
    accum = "float32"
    c = scale * LOG2E  # exp2(s*c - max*c) = exp(scale*s - scale*max): the scale in the multiply-add
    neg_inf = -T.infinity(accum)
    nbx = -(-Sq // block_M)
    tiles = nbx * Hq * B
    if tiles == 0 or Skv == 0:  # (the planner hands empty outputs to torch before a template sees them)
        raise ValueError(f"flash_attention(ws=True): nothing to compute for B={B}, Hq={Hq}, Sq={Sq}, Skv={Skv}")
    masked = mask_shape is not None
    if bound_keys and not masked:
        raise ValueError("flash_attention(ws=True): bound_keys reads a padding mask; there is none")
    mask_batches = ((1,) * (4 - len(mask_shape)) + tuple(mask_shape))[0] if masked else 0
    warps = (threads + 128) // 32
    order = TileOrder.make(nbx, Hq, B, is_causal, device_facts(target).sms, pair_rows)
    if chain and order.gaps:  # (the chained schedule walks a program's live steps, which then must come first)
        order = TileOrder.make(nbx, Hq, B, is_causal, device_facts(target).sms, False)
    grid = order.grid
    tail_n = Skv % block_N != 0
    stage_out = Sq % block_M == 0  # a row tail: the bulk store would write past the rows (guarded copy instead)

    def key_tiles(m0):
        return T.ceildiv(T.min(Skv, m0 + block_M), block_N) if is_causal else T.ceildiv(Skv, block_N)

    @T.macro
    def bounded_count(b, m0, bz):
        """``bound_keys``: the key tiles of the tile at row ``m0`` of batch ``bz``, none past its batch's last kept
        key (``key_bounds``), read into ``b.kn`` first (TileLang's thread-sync pass refuses a shared-memory read in a
        loop's extent)."""
        b.kn[0] = T.min(key_tiles(m0), b.bound_s[bz if mask_batches > 1 else 0])
        return b.kn[0]

    def key_count(b, m0, bz):
        """The key tiles of the tile at row ``m0`` of batch ``bz``: causal or all (bounded with ``bound_keys``)."""
        return bounded_count(b, m0, bz) if bound_keys else key_tiles(m0)

    @T.macro
    def key_bounds(b):
        """``bound_s[batch]``: the key tiles up to the batch's last kept key (its mask above the batch's largest minus
        ``HIDDEN_GAP``, or NaN: as the template's ``bound_keys``), all of them where none is kept. Before the warp
        groups part: each warp of the program scans whole batches, its lanes a key each a step (two passes: the
        largest value, then the last kept key), so every program holds every batch's bound."""
        lane = T.get_lane_idx(32)
        for r in T.serial(-(-mask_batches // warps)):
            mb = T.get_thread_binding() // 32 + r * warps
            if mb < mask_batches:
                b.scan[0] = neg_inf
                for e in T.serial(-(-Skv // 32)):
                    key = T.min(e * 32 + lane, Skv - 1)  # (lanes past the keys read the last one again)
                    b.scan[0] = T.max(b.scan[0], T.Cast(accum, b.Mask[broadcast_index(mask_shape, (mb, 0, 0, key))]))
                for off in T.unroll(5):
                    b.scan[0] = T.max(b.scan[0], T.shfl_xor(b.scan[0], 1 << off))
                b.scan[1] = -1.0
                for e in T.serial(-(-Skv // 32)):
                    key = T.min(e * 32 + lane, Skv - 1)
                    value = T.Cast(accum, b.Mask[broadcast_index(mask_shape, (mb, 0, 0, key))])
                    if T.Or(T.isnan(value), value > b.scan[0] - HIDDEN_GAP):
                        b.scan[1] = T.max(b.scan[1], T.Cast(accum, key))
                for off in T.unroll(5):
                    b.scan[1] = T.max(b.scan[1], T.shfl_xor(b.scan[1], 1 << off))
                if lane == 0:
                    b.bound_s[mb] = T.if_then_else(b.scan[1] < 0, T.ceildiv(Skv, block_N),
                                                   T.ceildiv(T.Cast("int32", b.scan[1]) + 1, block_N))
        T.sync_threads()

    @T.macro
    def scores(Q_s, K_s, S_f, s, qi):
        """Issue ``S = Q K^T`` for the key tile in stage ``s`` (no wait); ``qi``: the Q buffer (``double_q``)."""
        if double_q:
            T.wgmma_gemm(Q_s[qi, :, :], K_s[s, :, :], S_f, transpose_B=True, clear_accum=True,
                         policy=T.GemmWarpPolicy.FullRow)
        else:
            T.wgmma_gemm(Q_s, K_s[s, :, :], S_f, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def my_turn(wg):
        """Ping-pong: wait until the previous consumer warp group issued its products (its ``pass_turn``)."""
        if pingpong:
            T.sync_threads(TURN_BARRIER + wg, 256)

    @T.macro
    def pass_turn(wg):
        """Ping-pong: this group's products are issued; the next group may issue its own."""
        if pingpong:
            T.named_barrier_arrive(TURN_BARRIER + (wg + 1) % consumers, 256)

    def exp2_at(j, x):
        """2^x for a score in column ``j`` of its key tile: ``poly_exp2`` in every ``exp_poly``-th 8-column block (a
        block is one register pair of the WGMMA fragment in every thread: the test folds once unrolled)."""
        if not exp_poly:
            return T.exp2(x)
        return T.if_then_else(j // 8 % exp_poly == exp_poly - 1, poly_exp2(x), T.exp2(x))

    @T.macro
    def online_softmax(b, k, m0, bz):
        """Key tile ``k``'s scores to probabilities: with a mask, its values added (every tile; the scores then in
        the log2 domain); hidden keys -inf (tiles past ``Skv`` or on the diagonal only); the running max, the old sums'
        rescale ``r_scale`` and this tile's row sums ``r_sum``."""
        if masked:
            for i, j in T.Parallel(block_M, block_N):
                n = k * block_N + j
                key = T.min(n, Skv - 1) if tail_n else n
                value = T.Cast(accum, b.Mask[broadcast_index(mask_shape, (bz, 0, 0, key))])
                b.S_f[i, j] = b.S_f[i, j] * c + value * LOG2E
        if edge_tile(k, m0, block_N, Skv, is_causal):
            for i, j in T.Parallel(block_M, block_N):
                b.S_f[i, j] = T.if_then_else(visible(m0 + i, k * block_N + j, Skv, is_causal, tail_n), b.S_f[i, j],
                                             neg_inf)
        T.copy(b.m_cur, b.m_prev)
        T.reduce_max(b.S_f, b.m_cur, dim=1, clear=False)
        if masked:  # a row with no visible score yet keeps max -inf; 0 stands in, so no exponent is NaN
            for i in T.Parallel(block_M):
                b.m_use[i] = T.if_then_else(b.m_cur[i] == neg_inf, T.Cast(accum, 0), b.m_cur[i])
                b.r_scale[i] = T.exp2(b.m_prev[i] - b.m_use[i])
            for i, j in T.Parallel(block_M, block_N):
                b.S_f[i, j] = exp2_at(j, b.S_f[i, j] - b.m_use[i])
        else:  # every row sees key 0 in tile 0, so the running max is finite from then on
            for i in T.Parallel(block_M):
                b.r_scale[i] = T.exp2(b.m_prev[i] * c - b.m_cur[i] * c)
            for i, j in T.Parallel(block_M, block_N):
                b.S_f[i, j] = exp2_at(j, b.S_f[i, j] * c - b.m_cur[i] * c)
        T.reduce_sum(b.S_f, b.r_sum, dim=1)

    def q_buffer(count):
        """The Q buffer of the ``count``-th tile a program computes (``double_q``: two take turns)."""
        return count % 2 if double_q else 0

    @T.macro
    def wait_q(b, qi, count):
        """Wait for the ``count``-th tile's Q, in buffer ``qi``."""
        if double_q:
            T.mbarrier_wait_parity(b.q_full[qi], (count // 2) % 2)
        else:
            T.mbarrier_wait_parity(b.q_full, count % 2)

    @T.macro
    def begin_tile(b, it, wg, m0, bz, count):
        """A tile's first key tile alone: its scores, waited for, to probabilities in ``b.P_c``; O cleared."""
        qi = q_buffer(count)
        T.fill(b.O_f, 0)
        T.fill(b.m_cur, neg_inf)
        wait_q(b, qi, count)
        # (peeled: a branch on k around the waits made ptxas serialize the WGMMAs)
        T.mbarrier_wait_parity(b.k_full[it % num_stages], (it // num_stages) % 2)
        my_turn(wg)
        scores(b.Q_s, b.K_s, b.S_f, it % num_stages, qi)
        pass_turn(wg)
        T.wait_wgmma(0)
        T.barrier_arrive(b.k_empty[it % num_stages])
        online_softmax(b, 0, m0, bz)
        T.copy(b.r_sum, b.l_sum)
        T.copy(b.S_f, b.P_c)

    @T.macro
    def rest_of_tile(b, it, wg, m0, bz, n, qi):
        """Key tiles 1 .. n-1: tile k's scores and softmax beside tile k-1's P V; then Q's buffer is free."""
        for k in T.serial(1, n):
            s = (it + k) % num_stages
            sp = (it + k - 1) % num_stages  # tile k - 1's stage
            T.mbarrier_wait_parity(b.k_full[s], ((it + k) // num_stages) % 2)
            if pingpong:  # both operands in before the turn
                T.mbarrier_wait_parity(b.v_full[sp], ((it + k - 1) // num_stages) % 2)
            my_turn(wg)
            scores(b.Q_s, b.K_s, b.S_f, s, qi)
            # tile k - 1's P V runs beside this tile's scores and softmax
            if not pingpong:
                T.mbarrier_wait_parity(b.v_full[sp], ((it + k - 1) // num_stages) % 2)
            T.wgmma_gemm(b.P_c, b.V_s[sp, :, :], b.O_f, policy=T.GemmWarpPolicy.FullRow)
            pass_turn(wg)
            T.wait_wgmma(1)
            T.barrier_arrive(b.k_empty[s])
            online_softmax(b, k, m0, bz)
            if pin_softmax:  # (see PIN_SRC) every exponent computed before the wait for P V
                for i in T.Parallel(block_M):
                    T.call_extern("handle", "tf_pin_store", T.address_of(b.pin[i]), b.r_sum[i])
                T.sync_threads(PIN_BARRIER + wg, 128)
            T.wait_wgmma(0)
            T.barrier_arrive(b.v_empty[sp])
            for i in T.Parallel(block_M):
                b.l_sum[i] = b.l_sum[i] * b.r_scale[i] + b.r_sum[i]
            for i, j in T.Parallel(block_M, D):
                b.O_f[i, j] = b.O_f[i, j] * b.r_scale[i]
            T.copy(b.S_f, b.P_c)
        T.barrier_arrive(b.q_empty[qi] if double_q else b.q_empty)  # every Q K^T of this tile is done

    @T.macro
    def last_pv(b, it, wg, n):
        """The tile's last P V, waited for."""
        sl = (it + n - 1) % num_stages
        T.mbarrier_wait_parity(b.v_full[sl], ((it + n - 1) // num_stages) % 2)
        my_turn(wg)
        T.wgmma_gemm(b.P_c, b.V_s[sl, :, :], b.O_f, policy=T.GemmWarpPolicy.FullRow)
        pass_turn(wg)
        T.wait_wgmma(0)
        T.barrier_arrive(b.v_empty[sl])

    @T.macro
    def store_o(b, m0, by, bz):
        """O normalized and stored (``late_store``: the previous store waited for only now)."""
        for i, j in T.Parallel(block_M, D):
            if masked:  # (a row masked entirely gives 0, as the template and torch's fused kernels do)
                b.O_f[i, j] = T.if_then_else(b.l_sum[i] == 0, T.Cast(accum, 0), b.O_f[i, j] / b.l_sum[i])
            else:
                b.O_f[i, j] = b.O_f[i, j] / b.l_sum[i]
        if stage_out and late_store:
            T.tma_store_wait()  # (the issuing thread) the previous tile's store has read b.O_sh
            T.copy(b.O_f, b.O_sh)
            T.tma_copy(b.O_sh, _region(b.O, o_lay, bz, by, m0, block_M, D))
        elif stage_out:
            T.copy(b.O_f, b.O_sh)
            T.copy(b.O_sh, _region(b.O, o_lay, bz, by, m0, block_M, D))
        else:
            T.copy(b.O_f, _region(b.O, o_lay, bz, by, m0, block_M, D))

    @T.prim_func
    def flash_attention_ws_kernel():
        Q = param("Q", shapes[0], dtype)
        K = param("K", shapes[1], dtype)
        V = param("V", shapes[2], dtype)
        Mask = param("Mask", mask_shape, mask_dtype) if masked else None
        O = param("O", shapes[3], out_dtype)
        with T.Kernel(grid, threads=threads + 128) as pid:
            Q_s = T.alloc_shared((2, block_M, D) if double_q else (block_M, D), dtype)
            K_s = T.alloc_shared((num_stages, block_N, D), dtype)
            V_s = T.alloc_shared((num_stages, block_N, D), dtype)
            O_sh = T.alloc_shared((block_M, D), out_dtype) if stage_out else None
            S_f = T.alloc_fragment((block_M, block_N), accum)
            P_c = T.alloc_fragment((block_M, block_N), dtype)
            pin = T.alloc_shared((block_M,), accum) if pin_softmax else None
            if pin_softmax:
                T.import_source(PIN_SRC)
            O_f = T.alloc_fragment((block_M, D), accum)
            m_prev = T.alloc_fragment((block_M,), accum)
            m_cur = T.alloc_fragment((block_M,), accum)
            r_scale = T.alloc_fragment((block_M,), accum)
            r_sum = T.alloc_fragment((block_M,), accum)
            l_sum = T.alloc_fragment((block_M,), accum)
            m_use = T.alloc_fragment((block_M,), accum) if masked else None
            bound_s = T.alloc_shared((mask_batches,), "int32") if bound_keys else None
            scan = T.alloc_local((2,), accum) if bound_keys else None
            kn = T.alloc_local((1,), "int32") if bound_keys else None
            loaders = 32 if lean_producer else 128  # (the producer's threads that arrive on the "full" barriers)
            q_full = T.alloc_barrier([loaders, loaders] if double_q else loaders)
            q_empty = T.alloc_barrier([threads, threads] if double_q else threads)
            k_full = T.alloc_barrier([loaders] * num_stages)
            v_full = T.alloc_barrier([loaders] * num_stages)
            k_empty = T.alloc_barrier([threads] * num_stages)
            v_empty = T.alloc_barrier([threads] * num_stages)
            it = T.alloc_var("int32", init=0)  # key tiles this warp group walked in earlier tiles (the stage ring)
            # Q buffers filled so far (the Q barriers' phase): the step count, unless paired steps skip some
            qn = T.alloc_var("int32", init=0) if order.pair else None
            b = SimpleNamespace(Q_s=Q_s, K_s=K_s, V_s=V_s, O_sh=O_sh, S_f=S_f, pin=pin, P_c=P_c, O_f=O_f, m_prev=m_prev,
                                m_cur=m_cur, r_scale=r_scale, r_sum=r_sum, l_sum=l_sum, q_full=q_full, q_empty=q_empty,
                                k_full=k_full, v_full=v_full, k_empty=k_empty, v_empty=v_empty, O=O, Mask=Mask,
                                m_use=m_use, bound_s=bound_s, scan=scan, kn=kn)  # (the macros')
            dialect(target).wait_inputs(False, tma=True)  # (PDL only with ``common.PDL_ALL``/``PDL_TMA``)
            if bound_keys:
                key_bounds(b)
            if T.get_thread_binding() >= threads:  # the producer
                T.dec_max_nreg(PRODUCER_REGS)
                if not lean_producer or T.get_thread_binding() < threads + 32:  # (Python decides the first)
                    for t in T.serial(order.steps):
                        if order.at(pid, t)[0]:
                            _, bx, by, bz = order.at(pid, t)
                            m0 = bx * block_M
                            n = key_count(b, m0, bz)
                            if double_q:  # Q buffer (count % 2), its phase (count // 2) % 2
                                qi = (qn if order.pair else t) % 2
                                T.mbarrier_wait_parity(q_empty[qi], (((qn if order.pair else t) // 2) % 2) ^ 1)
                                T.tma_copy(_region(Q, q_lay, bz, by, m0, block_M, D), Q_s[qi, :, :], barrier=q_full[qi])
                                T.barrier_arrive(q_full[qi])
                            else:
                                T.mbarrier_wait_parity(q_empty, ((qn if order.pair else t) % 2) ^ 1)
                                T.tma_copy(_region(Q, q_lay, bz, by, m0, block_M, D), Q_s, barrier=q_full)
                                T.barrier_arrive(q_full)
                            for k in T.serial(n):
                                s = (it + k) % num_stages
                                ph = ((it + k) // num_stages) % 2
                                T.mbarrier_wait_parity(k_empty[s], ph ^ 1)
                                T.tma_copy(_region(K, k_lay, bz, by // groups, k * block_N, block_N, D), K_s[s, :, :],
                                           barrier=k_full[s])
                                T.barrier_arrive(k_full[s])
                                T.mbarrier_wait_parity(v_empty[s], ph ^ 1)
                                T.tma_copy(_region(V, v_lay, bz, by // groups, k * block_N, block_N, D), V_s[s, :, :],
                                           barrier=v_full[s])
                                T.barrier_arrive(v_full[s])
                            it = it + n
                            if order.pair:
                                qn = qn + 1
            else:  # the consumers: 64 rows per warp group
                T.inc_max_nreg(CONSUMER_REGS[consumers])
                wg = T.get_thread_binding() // 128
                if pingpong:  # noqa: SIM102 -- (Python decides this one) the first turn is the first group's: the last one opens it
                    if wg == consumers - 1:
                        T.named_barrier_arrive(TURN_BARRIER, 256)
                if chain:
                    # the program's first tile's first key tile alone; every later tile's comes under its predecessor's
                    # last P V, in the tail
                    live = order.live_steps(pid)
                    _, bx, by, bz = order.at(pid, 0)
                    begin_tile(b, it, wg, bx * block_M, bz, 0)
                    for t in T.serial(live - 1):
                        _, bx, by, bz = order.at(pid, t)
                        m0 = bx * block_M
                        n = key_count(b, m0, bz)
                        rest_of_tile(b, it, wg, m0, bz, n, q_buffer(t))
                        _, bx1, _, bz1 = order.at(pid, t + 1)
                        qj = q_buffer(t + 1)
                        wait_q(b, qj, t + 1)
                        s1 = (it + n) % num_stages  # the next tile's first key tile's stage
                        sl = (it + n - 1) % num_stages
                        T.mbarrier_wait_parity(k_full[s1], ((it + n) // num_stages) % 2)
                        if pingpong:  # both operands in before the turn
                            T.mbarrier_wait_parity(v_full[sl], ((it + n - 1) // num_stages) % 2)
                        my_turn(wg)
                        scores(Q_s, K_s, S_f, s1, qj)
                        if not pingpong:
                            T.mbarrier_wait_parity(v_full[sl], ((it + n - 1) // num_stages) % 2)
                        T.wgmma_gemm(P_c, V_s[sl, :, :], O_f, policy=T.GemmWarpPolicy.FullRow)
                        pass_turn(wg)
                        T.wait_wgmma(1)
                        T.barrier_arrive(k_empty[s1])
                        T.fill(m_cur, neg_inf)
                        online_softmax(b, 0, bx1 * block_M, bz1)
                        T.wait_wgmma(0)
                        T.barrier_arrive(v_empty[sl])
                        store_o(b, m0, by, bz)
                        T.fill(O_f, 0)
                        T.copy(r_sum, l_sum)
                        T.copy(S_f, P_c)
                        it = it + n
                    _, bx, by, bz = order.at(pid, live - 1)
                    m0 = bx * block_M
                    n = key_count(b, m0, bz)
                    rest_of_tile(b, it, wg, m0, bz, n, q_buffer(live - 1))
                    last_pv(b, it, wg, n)
                    it = it + n
                    store_o(b, m0, by, bz)
                else:
                    for t in T.serial(order.steps):
                        if order.at(pid, t)[0]:
                            _, bx, by, bz = order.at(pid, t)
                            m0 = bx * block_M
                            n = key_count(b, m0, bz)
                            qc = qn if order.pair else t  # (paired steps may skip some)
                            begin_tile(b, it, wg, m0, bz, qc)
                            rest_of_tile(b, it, wg, m0, bz, n, q_buffer(qc))
                            last_pv(b, it, wg, n)
                            it = it + n
                            if order.pair:
                                qn = qn + 1
                            store_o(b, m0, by, bz)
                if stage_out and late_store:
                    T.tma_store_wait()  # the last store has read O_sh before the program ends

    return common.fast_math(flash_attention_ws_kernel) if fast_math else flash_attention_ws_kernel

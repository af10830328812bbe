"""The flash-attention template's config space: seeds (the default pick first), the wider Hopper space, the CPU's
config and decode steps' packed configs. Keys are exactly ``attention.flash_attention``'s tunables."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tilefuse.config import device_facts
from tilefuse.lowering.templates import attention_ws
from tilefuse.lowering.templates.common import dialect

# The ws schedule's late store and two Q buffers (``attention_ws.flash_attention_ws``'s ``late_store``, ``double_q``)
# lead the seeds for at most this many keys. H100, fp16, 128 x 128 tiles with fast math, 2026-12-06, two runs
# (bench/results/2026-12-06-h100-session46), x cuDNN without -> with: D 64: 512 keys 0.91 -> 1.07, 0.90 -> 1.06 and
# causal 0.88 -> 1.12; GPT-2's 1024 causal 1.05 -> 1.20; 2048 0.94 -> 0.98 and causal 0.99 -> 1.06; ViT's 197 1.06
# either way; BERT's padding mask at 512 1.47 -> 1.60, at 2048 2.16 -> 2.22 (causal 1.60 -> 1.55, the one loss under
# 8192 keys); D 128: 1024 keys 1.00 -> 1.03, causal 1.03 -> 1.07; 4096 1.02 -> 1.03, causal 1.05 either way. But at
# 8192 keys (D 64) 0.97-0.99 -> 0.94-0.95 (each option alone lost there too).
SHORT_KEYS = 2048
SHORT_OPTIONS = {"late_store": True, "double_q": True}
# Past SHORT_KEYS at head dim 64 without a causal mask, a 192-row ws tile (three consumer warp groups) takes about
# LONG_ROW_COST of a 128-row tile's time a row: H100, fp16, 2 x 32/8 heads x 8192 keys, 0.91 and 0.90 in two runs
# (bench/results/2026-12-06-h100-session46, -session48); x cuDNN 1.04-1.08 against 0.94-0.97 in sessions 45-48. It
# leads where that outweighs the persistent programs' rounds (``long_rows_lead``). Checked after it was set, H100,
# 2026-12-06 (bench/results/2026-12-06-h100-session49): at each of 7 long runs (3072-16384 keys, SDXL's 2 x 10 x
# 4096, causal and not) the seed it put first ran fastest of the seeds.
LONG_ROW_COST = 0.9


def get_configs(target: dict | str, D: int = 128, ws: bool = False, causal: bool = False,
                Skv: int | None = None, Sq: int | None = None, heads: int = 0) -> list[dict]:
    """Seed configs for head dim ``D``; keys are exactly ``flash_attention``'s tunables. The first is the
    default pick; tuning measures the others (and ``config_space``'s) on the device. ``ws``: the attention can take
    the warp-specialized schedule (``attention_ws.eligible``), whose seeds then lead on sm_90; ``causal``: they pair
    heavy and light row tiles (``pair_rows``: on the H200, 2026-12-03, causal D 64 went from 0.63-0.83x cuDNN to
    0.82-0.95x, D 128 from 0.77x to 0.89x; bench/results/2026-12-03-h200-session22). The ws seeds compile with nvcc's
    fast math (``fast_math``: one ex2.approx an exponent): over the 13 shapes of the H200 sweep of 2026-12-05 it took
    the 128x128 seed from 0.80-0.99x cuDNN to 0.90-1.08x, every fp16 test passing
    (bench/results/2026-12-05-h200-session33). ``Skv``: for at most ``SHORT_KEYS`` keys the 128-row seed leads with
    the late store and two Q buffers (``SHORT_OPTIONS``), the plain seeds after it; given ``Sq`` and ``heads`` (batch
    times query heads) too, past it the 192-row seed leads where ``long_rows_lead`` says."""
    if dialect(target).cpu:
        return [_config(32, 32, 0, 1), _config(64, 64, 0, 1)]
    if dialect(target).metal:  # small tiles: Q, K, V, scores and two D-wide fp32 outputs in 32 KB of threadgroup
        return [_config(16, 32, 1, 128) if D <= 64 else _config(16, 16, 1, 128)]
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    if arch.startswith("sm_90"):
        # TileLang's Hopper example shapes; at D 64 (2026-12-03) 128/128/2 was within 10% of the best everywhere
        seeds = [(128, 128, 2, 256), (128, 64, 2, 256), (64, 64, 1, 128)] if D <= 128 else [(64, 64, 1, 128)]
        if D <= 64:
            seeds[1:1] = [(192, 128, 2, 384), (128, 128, 3, 256)]
        if ws and D <= 128:
            plain = [_config(*s, ws=True, pair_rows=causal, fast_math=True) for s in attention_ws.seeds(D)]
            short = Skv is not None and 0 < Skv <= SHORT_KEYS
            if long_rows_lead(target, D, causal, Sq, Skv, heads):
                plain = [c for c in plain if c["block_M"] == 192] + [c for c in plain if c["block_M"] != 192]
            return ([{**plain[0], **SHORT_OPTIONS}] if short else []) + plain + [_config(*s) for s in seeds]
    else:
        # sm_80: causal with num_stages >= 2 crashes codegen (TILELANG.md); one stage is safe for both.
        seeds = [(128, 64, 1, 128), (64, 64, 1, 128)]
    return [_config(*s) for s in seeds]


def long_rows_lead(target: dict | str, D: int, causal: bool, Sq: int | None, Skv: int | None, heads: int) -> bool:
    """Whether the 192-row ws seed leads: head dim 64, no causal mask, more than ``SHORT_KEYS`` keys, and its rounds of
    row tiles over the SMs (``heads`` x row tiles each) take less time than the 128-row seed's at ``LONG_ROW_COST``."""
    if D > 64 or causal or not (Sq and Skv and heads) or Skv <= SHORT_KEYS:
        return False
    sms = device_facts(target).sms

    def rows_walked(rows: int) -> int:  # (a program's rounds times a tile's rows)
        return math.ceil(heads * math.ceil(Sq / rows) / sms) * rows
    return rows_walked(192) * LONG_ROW_COST < rows_walked(128)


def cpu_config(Sq: int, Skv: int, most: int = 128) -> dict:
    """The CPU's config: query and key tiles as long as the sequences, split evenly past ``most`` and rounded up to 8
    (2 cores, fp32, D 32, 2026-12-01: 65 tokens ran 0.18 ms in 72 x 72 tiles against 0.46 in 32 x 32 and 0.68 in
    64 x 64, whose second key tile holds one key; 100 tokens with a mask 0.35 ms in 104 x 104, 0.61 in 128 x 128)."""
    def fit(n: int) -> int:
        tiles = max(1, math.ceil(n / most))
        return max(8, math.ceil(math.ceil(n / tiles) / 8) * 8)
    return _config(fit(Sq), fit(Skv), 0, 1)


# Decode: a step's queries are few (one per sequence), so a tile of 64 or 128 query rows of one head would
# be nearly all padding, and every head of a group would read the same K/V tiles again. Packed, a program holds the
# group's (head, query) pairs as its rows.
DECODE_MAX_QUERIES, DECODE_MAX_ROWS = 16, 64
# H200, 32/8 heads, D 64, fp16 (bench/bench_decode_attention.py, 2026-12-01): 64 x 128 with 2 stages led at batch 1-64
# and caches of 512 and 4096 (0.042 ms at batch 64 x 512, against 0.161 for the 128-row tile): the default pick
DECODE_TILE = (64, 128, 2, 128)


def per_key_mask(mask_shape: Sequence[int] | None, is_causal: bool = False) -> bool:
    """Whether a mask of ``mask_shape`` is one value per key (and batch), the same for every head and query, with no
    causal test beside it: what ``bound_keys`` reads (a decode step's mask over a static cache)."""
    return not is_causal and attention_ws.key_mask(mask_shape)


def decode_configs(target: dict | str, Sq: int, groups: int, keys_masked: bool = False, B: int = 0, Hkv: int = 0,
                   Skv: int = 0) -> list[dict]:
    """Packed configs for a decode-shaped attention on a GPU (``Sq`` queries, ``groups`` query heads per kv head),
    the default pick first; none where the rows do not fit one tile or the target has no packed form. With
    ``keys_masked`` (``per_key_mask``) they bound the key loop by the mask (``bound_keys``): a static cache's
    unfilled part is never read. Given the batch, kv heads and cache length (``B``, ``Hkv``, ``Skv``), a config that
    splits the keys (``decode_parts``) leads where the programs would not fill the GPU."""
    d = dialect(target)
    if d.cpu or d.metal or not decodes(target, Sq, groups):
        return []
    seeds = [DECODE_TILE, (64, 64, 2, 128), (64, 64, 1, 128)]
    if Sq * groups <= 16:  # one warp's 16-row MMA tile holds them all
        seeds += [(16, 64, 2, 32), (16, 128, 2, 32)]
    configs = [_config(*c, pack=True, bound_keys=keys_masked) for c in seeds]
    splits = decode_parts(target, Sq, groups, B, Hkv, Skv) if B and Hkv and Skv else 1
    return ([{**configs[0], "splits": splits}] if splits > 1 else []) + configs


def decodes(target: dict | str, Sq: int, groups: int) -> bool:
    """Whether ``decode_configs`` has packed configs for this shape on ``target``."""
    d = dialect(target)
    return not (d.cpu or d.metal) and Sq <= DECODE_MAX_QUERIES and Sq * groups <= DECODE_MAX_ROWS


def decode_parts(target: dict | str, Sq: int, groups: int, B: int, Hkv: int, Skv: int) -> int:
    """The parts the default decode config splits the keys into (``decode_splits`` for ``DECODE_TILE``; 1: none). A
    spec with more than one carries them as ``split_max``, its room for the parts' outputs."""
    if not decodes(target, Sq, groups):
        return 1
    return decode_splits(target, Sq * groups, B, Hkv, Skv, DECODE_TILE[0], DECODE_TILE[1])


# Splitting the keys: at most this many parts (a spec's O_part/LSE are sized for its own), only for caches of at least
# SPLIT_MIN_TILES key tiles and programs that fill at most 1/SPLIT_FEW of the SMs. A split adds the combining kernel
# (1.2-1.6 us) and each part scans the mask. H200, 32/8 heads, D 64, 4096 keys (bench_decode_attention.py, per call):
# one sequence all filled 0.036 ms unsplit, 0.018 in 16 parts; 300 filled 0.010 bounded, 0.013 in 16 parts; 8
# sequences in 2 parts lost (0.060 -> 0.100 all filled, before the parts' score loop got its vector loads back).
SPLIT_MAX, SPLIT_MIN_TILES, SPLIT_FEW = 16, 16, 8


def decode_splits(target: dict | str, rows: int, B: int, Hkv: int, Skv: int, block_M: int, block_N: int) -> int:
    """Parts to split the keys into so that the programs about fill the GPU's SMs once (1: no split)."""
    tiles = math.ceil(Skv / block_N)
    programs = B * Hkv * math.ceil(rows / block_M)
    sms = device_facts(target).sms
    if tiles < SPLIT_MIN_TILES or programs * SPLIT_FEW > sms:
        return 1
    return max(1, min(SPLIT_MAX, tiles // 2, sms // programs))


def config_space(target: dict | str, D: int = 128, Sq: int | None = None, groups: int = 1,
                 keys_masked: bool = False, B: int = 0, Hkv: int = 0, Skv: int = 0, ws: bool = False,
                 causal: bool = False, heads: int = 0) -> list[dict]:
    """Everything worth measuring for head dim ``D``: the seeds, then more Hopper tiles (``heads``: batch times query
    heads, for ``get_configs``).

    Measured on the H200 (B4 H32 S4096 D128 fp16, bench/results): 128x128 and 128x176 key tiles with
    2 stages and 256 threads lead (491-496 TFLOP/s non-causal); 128 threads on 128-row tiles halve
    it. A FlashAttention-3 style manual schedule (``T.Pipelined`` order/stage) was tried and dropped:
    TileLang 0.1.15 then gives up TMA and warp specialization and it ran 5-10% slower (at D 64 too, 2026-12-03). The
    overlap it aimed at is ``attention_ws``'s hand-written schedule (``ws``: its seeds first, where it applies)."""
    # (the 192-row lead past SHORT_KEYS is measured without masks)
    seeds = get_configs(target, D, ws, causal, Skv or None, Sq, 0 if keys_masked else heads) + (
        decode_configs(target, Sq, groups, keys_masked, B, Hkv, Skv) if Sq is not None else [])
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    if dialect(target).cpu or not arch.startswith("sm_90") or D > 128:
        return seeds
    more = [(128, 176, 2, 256), (128, 128, 1, 256), (64, 128, 2, 128)]
    if D <= 64:  # short rows: smaller programs keep more of them resident
        more += [(64, 64, 2, 128), (128, 64, 2, 128), (64, 128, 3, 128)]
    more = [_config(*c) for c in more]
    return seeds + [c for c in more if c not in seeds]


def _config(block_M, block_N, num_stages, threads, pack: bool = False, bound_keys: bool = False,
            ws: bool = False, pair_rows: bool = False, fast_math: bool = False) -> dict:
    c = {"block_M": block_M, "block_N": block_N, "num_stages": num_stages, "threads": threads}
    return {**c, **({"pack": True} if pack else {}), **({"bound_keys": True} if bound_keys else {}),
            **({"ws": True} if ws else {}), **({"pair_rows": True} if ws and pair_rows else {}),
            **({"fast_math": True} if ws and fast_math else {})}

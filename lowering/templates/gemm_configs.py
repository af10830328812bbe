"""The GEMM template's config space per target, and the config it builds with when nothing was tuned.

Note: what the H200 measured (2026-12-01, ``../shared/measurements/2026-12-01-h200/gemm-sweep.log``; fp16 GEMM +
bias, the output tile stored through shared memory, L2 flushed before every call, against ``torch.addmm``): 256x192
tiles, 64 deep, 4 stages, 256 threads lead at K = 768-3072 (0.92-1.01x cuBLAS at GPT-2's and BERT's shapes, 0.975x at
the LM head); 128x256 with 4 stages leads at LLaMA's 8192x5632x2048 (1.04x), where 192 does not divide N. The space
below holds those and their neighbours (128/256 x 64-256 tiles, 3-4 stages, 256/384 threads, swizzle off or panel 8,
fragment or staged store); ``default_config`` picks from the measured leaders by padded waves over the SMs, which
chooses each shape's measured winner above, so a compile with an empty tuning database starts where tuning ended.
Tuning then measures the space's head (``lowering/tune.py``: the default pick first).

Validity is decided before compiling: a config whose pipelined tiles overflow the arch's shared memory, or whose
thread count WGMMA cannot split the tile over (12 warps on 128x256 or 256x128: "No valid warp partition"), is not
offered.
"""

from __future__ import annotations

import math

from tilefuse.config import DEVICE_FACTS, device_facts
from tilefuse.lowering.templates.common import dialect

# Shared memory per block that a config may use (opt-in maximum), by arch family (``config.DEVICE_FACTS``).
SMEM_LIMIT = {arch: f.smem_per_block for arch, f in DEVICE_FACTS.items()}

# sm_90a, 16-bit operands: (block_M, block_N, block_K, num_stages, threads, panel or 0 for no swizzle).
# The measured leaders come first: default_config chooses among them.
SM90_LEADERS = [(256, 192, 64, 4, 256, 0), (128, 256, 64, 4, 256, 8)]
SM90_SPACE = SM90_LEADERS + [
    (256, 192, 64, 4, 256, 8), (256, 192, 64, 4, 384, 0), (256, 192, 64, 3, 384, 0), (256, 192, 64, 4, 384, 8),
    (128, 256, 64, 3, 256, 0), (128, 256, 64, 4, 256, 0), (256, 128, 64, 4, 256, 8), (256, 128, 64, 3, 256, 0),
    (128, 192, 64, 4, 256, 0), (128, 128, 64, 4, 256, 0), (256, 64, 64, 4, 256, 0), (128, 128, 64, 3, 128, 0),
    (64, 256, 64, 4, 128, 0), (128, 96, 64, 4, 128, 0), (64, 128, 64, 4, 128, 0), (64, 64, 64, 4, 128, 0),
]
# sm_80: mma_sync + cp.async.
SM80_SPACE = [(128, 128, 32, 3, 128, 0), (128, 256, 32, 3, 256, 0), (256, 128, 32, 3, 256, 0),
              (128, 128, 64, 2, 128, 0), (64, 128, 32, 4, 128, 0)]
# fp32 operands run the exact FMA loop (``gemm``'s ``allow_tf32``): modest tiles, as its inner loop is unrolled.
FP32_SPACE = [(64, 64, 32, 2, 128, 0), (128, 64, 32, 2, 128, 0), (64, 128, 32, 3, 128, 0)]
# c: the product loop runs k outside a vectorized j (gemm.py); wide tiles amortize it. Measured on a 2-core AVX-512
# machine (2026-12-01, 2 OpenMP threads): 128x256x32 leads from 200x512x128 to 1024^3 (1.2-1.8x torch's oneDNN there,
# 32x32x32: 3-5x). ``cpu_config`` shrinks the tile to small M and N.
# Metal (source only, never measured): tiles whose A/B stages and the fp32 accumulator gemm.py stages through
# threadgroup memory fit Apple GPUs' 32 KB (64x64x32, 2 stages: 16 KB fp16, 32 KB fp32).
METAL_SPACE = [(64, 64, 32, 2, 128, 0), (32, 64, 32, 2, 128, 0)]
CPU_SPACE = [(128, 256, 32, 0, 1, 0), (64, 256, 32, 0, 1, 0), (64, 128, 64, 0, 1, 0), (32, 128, 32, 0, 1, 0)]


def arch_family(target: dict | str) -> str:
    arch = target.get("arch", "") if isinstance(target, dict) else ""
    return arch.rstrip("a")[:5]


def sm_count(target: dict | str) -> int:
    """``target``'s streaming multiprocessors (a CUDA target without an arch: the default, sm_90a)."""
    return device_facts(target).sms


def shared_memory_bytes(block_M: int, block_N: int, block_K: int, num_stages: int, dtype: str = "float16") -> int:
    """Bytes of the pipelined A and B tiles (the staged output tile reuses them)."""
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)
    return (block_M + block_N) * block_K * itemsize * max(num_stages, 1)


def warp_partition_ok(block_M: int, block_N: int, threads: int, wgmma: bool) -> bool:
    """Whether the tile splits over ``threads // 32`` warps: with WGMMA each warp group (4 warps) takes 64-row
    slices, so 3 warp groups need a tile side divisible by 3 x 64 (12 warps on 128x256 fail to compile)."""
    warps = threads // 32
    if threads % 32 or warps < 1:
        return False
    if not wgmma or threads % 128:
        return True
    groups = threads // 128
    return groups in (1, 2, 4) or block_M % (64 * groups) == 0 or block_N % (64 * groups) == 0


def valid(config: dict, dtype: str, target: dict | str) -> bool:
    """A config that compiles for ``target``: fits shared memory, and its threads split the tile."""
    fam = arch_family(target)
    if dialect(target).cpu:
        return True
    smem = shared_memory_bytes(config["block_M"], config["block_N"], config["block_K"], config["num_stages"], dtype)
    wgmma = fam == "sm_90" and dtype != "float32"
    return smem <= SMEM_LIMIT.get(fam, 99 * 1024) and warp_partition_ok(config["block_M"], config["block_N"],
                                                                         config["threads"], wgmma)


def _config(block_M, block_N, block_K, num_stages, threads, panel=0, stage_C=False) -> dict:
    c = {"block_M": block_M, "block_N": block_N, "block_K": block_K, "num_stages": num_stages, "threads": threads,
         "enable_rasterization": bool(panel)}
    if panel:
        c["panel_size"] = panel
    if stage_C:
        c["stage_C"] = True
    return c


def get_configs(target: dict | str, dtype: str = "float16") -> list[dict]:
    """The configs tuning may measure for operands of ``dtype``, the measured leaders first; keys are exactly
    ``gemm``'s tunables; every one valid for the target (``valid``)."""
    if dialect(target).cpu:
        return [_config(*seed[:5]) for seed in CPU_SPACE]
    if dialect(target).metal:
        return [_config(*s) for s in METAL_SPACE]
    fam = arch_family(target)
    if dtype == "float32":
        seeds = [_config(*s) for s in FP32_SPACE]
    elif fam == "sm_90":
        # The sweep stored the output tile through shared memory (TMA stores): each config so, then with the
        # accumulator fragment's direct stores, for tuning to compare.
        seeds = [_config(*s, stage_C=True) for s in SM90_SPACE] + [_config(*s) for s in SM90_SPACE]
    else:
        seeds = [_config(*s) for s in SM80_SPACE]
    return [c for c in seeds if valid(c, dtype, target)]


def wave_cost(config: dict, M: int, N: int, batch: int = 1, sms: int = 132) -> int:
    """Padded output elements one SM computes over the waves of ``config``'s tiles (less is better: it counts
    tile padding and a last, partly idle wave)."""
    tiles = batch * math.ceil(M / config["block_M"]) * math.ceil(N / config["block_N"])
    return math.ceil(tiles / sms) * config["block_M"] * config["block_N"]


def cpu_config(config: dict, M: int, N: int) -> dict:
    """``config`` (a ``c`` config) with M split evenly over as few tiles as its height allows, rounded up to 8 rows
    (M = 200: two tiles of 104, not 128 and 72 of padding: 0.35 -> 0.25 ms at 200x384x128 on one core; a decode row
    computes 7 rows of padding, not 127), and as wide as it can be with columns of padding at most an eighth of N
    (N = 384: 128, not 256 and a half-empty second tile: 0.45 -> 0.37 ms)."""
    block_N = max(16, min(config["block_N"], 1 << max(N - 1, 0).bit_length()))
    while block_N > 64 and (-N % block_N) * 8 > N:  # narrower than 64, the vector loop is too short
        block_N //= 2
    tiles = max(1, math.ceil(M / config["block_M"]))
    rows = math.ceil(math.ceil(M / tiles) / 8) * 8
    return {**config, "block_M": min(config["block_M"], max(8, rows)), "block_N": block_N}


def default_config(configs: list[dict], M: int, N: int, batch: int, target: dict | str) -> dict:
    """The config a GEMM builds with when the tuning database has none: on CUDA the fewest padded waves over
    the SMs among the measured leaders (the first configs of the space: on sm_90 ``SM90_LEADERS``, staged
    store) where M fills at least one of their tiles, else among all; ties go to the earlier config."""
    if not configs:
        return {}
    if dialect(target).cpu:
        return cpu_config(configs[0], M, N)
    if not isinstance(target, dict) or target.get("kind") != "cuda":
        return configs[0]
    sms = sm_count(target)
    lead = configs[:len(SM90_LEADERS)] if arch_family(target) == "sm_90" else configs
    pool = [c for c in lead if c["block_M"] <= max(M, 64)] or configs
    if M < 128:  # decode-like rows: a tall tile would compute mostly padding
        pool = configs
    pick = min(pool, key=lambda c: wave_cost(c, M, N, batch, sms))
    tiles = batch * math.ceil(M / pick["block_M"]) * math.ceil(N / pick["block_N"])
    if not pick["enable_rasterization"] and tiles > SWIZZLE_WAVES * sms:
        # Many waves: tiles that share operands run together (panel 8): 2.05 -> 1.88 ms at 8192x16384x4096
        # on the H200, no gain at 512 tiles (8192x3072x768).
        swizzled = {**pick, "enable_rasterization": True, "panel_size": 8}
        if swizzled in configs:
            return swizzled
    return pick


SWIZZLE_WAVES = 4

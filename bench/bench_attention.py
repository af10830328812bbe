"""Benchmark the flash-attention template against PyTorch SDPA (cuDNN and flash backends) on a GPU.

Usage (on the device machine):  python bench/bench_attention.py [--json out.json] [--reps 30]
    [--shapes issue|llm|zoo|sweep|d64|d128|masked|long|all]
    [--configs all|seeds|variants|chain|poly|pin|recheck|short|lean|wide]

For each shape every config in the template's config space is compiled (in parallel), checked
against SDPA on the same inputs and timed (median of ``--reps`` CUDA-event runs after warm-up); the
table gives the best config, TFLOP/s (4*B*H*Sq*Skv*D FLOPs, halved when causal, as FlashAttention
counts them) and the speedup over each SDPA backend measured in the same run. ``--timing graph`` (the
default) times replays of a CUDA graph of the call, free of Python's launch latency, which single-call
CUDA-event timings (``--timing events``) include and which matters at the zoo's 0.1 ms shapes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import cuda_time_ms

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import attention, attention_ws
from tilefuse.lowering.templates.attention_configs import SHORT_OPTIONS
from tilefuse.lowering.timing import device_time

# (B, Hq, Hkv, S, D, causal)
ISSUE = [(4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True)]
LLM = [(b, 32, 8, s, 128, c) for b, s in ((16, 1024), (4, 4096), (2, 8192)) for c in (True, False)]
# The zoo's attention at benchmark size (head dim 64): GPT-2 b8x1024 causal, BERT b32x512, ViT b64 (197 tokens)
ZOO = [(8, 12, 12, 1024, 64, True), (32, 12, 12, 512, 64, False), (64, 12, 12, 197, 64, False)]
# The issue's sweep at head dim 64 and 128 (S 512-8192, causal and not, GQA), a point per sequence length
SWEEP = [(32, 16, 16, 512, 64, c) for c in (False, True)] + [(8, 16, 16, 2048, 64, c) for c in (False, True)] + \
    [(2, 32, 8, 8192, 64, c) for c in (False, True)] + [(16, 32, 8, 1024, 128, c) for c in (False, True)] + \
    [(4, 32, 8, 4096, 128, c) for c in (False, True)]

# Past SHORT_KEYS at head dim 64 (--shapes long): SDXL's 64x64 level (10 heads, 4096 tokens), longer encoders, causal;
# and the zoo LLaMA's attention (head dim 128, 2048 keys, causal: the short-key lead's last point)
LONG = [(4, 32, 8, 2048, 128, True), (2, 10, 10, 4096, 64, False), (4, 16, 16, 4096, 64, False),
        (4, 16, 16, 4096, 64, True), (2, 16, 16, 3072, 64, False), (2, 32, 8, 8192, 64, False),
        (1, 16, 16, 16384, 64, False), (1, 16, 16, 16384, 64, True)]

# BERT's attention with its padding mask (B, 1, 1, S) as the zoo builds it: batch 0 sees every key, the others a
# random prefix; --shapes masked (the ws schedule's default for it since 2026-12-05, bounded by the mask)
MASKED = [(32, 12, 12, 512, 64, False), (8, 16, 16, 2048, 64, False), (8, 16, 16, 2048, 64, True)]


def padding_mask(B: int, S: int, gen) -> torch.Tensor:
    """The zoo BERT's additive mask: 0 where seen, fp16's most negative value past each batch's random length."""
    lengths = torch.randint(1, S + 1, (B,), generator=gen, device="cuda")
    lengths[0] = S
    hidden = torch.arange(S, device="cuda")[None, :] >= lengths[:, None]
    return torch.zeros(B, S, device="cuda", dtype=torch.float16).masked_fill(hidden, torch.finfo(torch.float16).min
                                                                              ).view(B, 1, 1, S)


def variants(D: int, causal: bool = False) -> list[dict]:
    """The TileLang-scheduled template's leading tiles beside the hand-written warp-specialized, persistent schedule's
    seeds (``ws``, ``attention_ws``), each also with each of its schedule options alone and all of them: consumer warp
    groups taking turns (``pingpong``), O's store waited for late (``late_store``), two Q buffers (``double_q``) and,
    causal, each program's row
    tiles in heavy/light pairs (``pair_rows``). (Session 19's variants, ``fold_scale``/``stage_out`` off, are in its
    results.)"""
    tiles = [(128, 128, 2, 256), (192, 128, 2, 384)] if D <= 64 else [(128, 128, 2, 256)]
    out = [{"block_M": m, "block_N": n, "num_stages": st, "threads": t} for m, n, st, t in tiles]
    ws = attention_ws.seeds(D)  # (a wider ws sweep, 2026-12-03: 3 stages, 64-key tiles, all slower)
    options = ["pingpong", "late_store", "double_q"] + (["pair_rows"] if causal else [])
    extra = [{}] + [{o: True} for o in options] + [dict.fromkeys(options, True)]
    return out + [{"block_M": m, "block_N": n, "num_stages": st, "threads": t, "ws": True, **x}
                  for m, n, st, t in ws for x in extra]


def chain_variants(D: int, causal: bool = False, S: int | None = None) -> list[dict]:
    """The chained schedule (``chain``: each tile's first scores under the previous tile's last ``P V``) against the
    plain one, on the ws seeds and, at head dim 64, a 192-key tile and, for at most 224 keys, one key tile for them
    all (both lower without spills; not yet measured), with the causal default (``pair_rows``) on causal shapes:
    plain, and chained with the late store and nvcc's fast math (``fast_math``) on each tile; on the first seed also
    fast math alone, chained alone and chained with the late store. First, the TileLang-scheduled template's default
    pick (what a masked attention ran before 2026-12-05)."""
    tiles = attention_ws.seeds(D) + ([(128, 192, 2, 256)] if D <= 64 else [])
    if D <= 64 and S is not None and S <= 224:  # one key tile holds them all (ViT's 197 in 208: no spills either)
        tiles.append((128, -(-S // 16) * 16, 2, 256))
    base = {"ws": True, **({"pair_rows": True} if causal else {})}
    chained = {"chain": True, "late_store": True}  # (a tile's store is in the chained tail: its read waited late)
    fast = {**chained, "fast_math": True}  # (ex2.approx.ftz: one instruction an exponent)
    extra = [{}, {"fast_math": True}, {"chain": True}, chained, fast]
    template = attention.get_configs({"kind": "cuda", "arch": "sm_90a"}, D, causal=causal)[0]  # (TileLang's schedule)
    return [template] + [{"block_M": m, "block_N": n, "num_stages": st, "threads": t, **base, **x}
                         for i, (m, n, st, t) in enumerate(tiles) for x in (extra if i == 0 else [{}, fast])]


def ws_seeds(D: int, causal: bool = False, masked: bool = False, S: int | None = None, heads: int = 0) -> list[dict]:
    """The ws seeds as the default runs them (fast math; causal: paired rows; masked: keys bounded); with ``S`` keys
    (and ``heads``, batch times query heads), in the default's order for them (the short-key lead first, the 192-row
    lead past it: ``attention_configs.long_rows_lead``), else the plain seeds."""
    return [{**c, **({"bound_keys": True} if masked else {})}
            for c in attention.get_configs({"kind": "cuda", "arch": "sm_90a"}, D, ws=True, causal=causal, Skv=S, Sq=S,
                                           heads=0 if masked else heads)
            if c.get("ws")]


def poly_variants(D: int, causal: bool = False) -> list[dict]:
    """Each ws seed, and with every 8th and 4th 8-column block of a key tile's exponents on the FMA units
    (``exp_poly``; ``common.poly_exp2``)."""
    return [{**c, **x} for c in ws_seeds(D, causal) for x in ({}, {"exp_poly": 8}, {"exp_poly": 4})]


def pin_variants(D: int, causal: bool = False, masked: bool = False) -> list[dict]:
    """Each ws seed, and with the softmax's exponents pinned before the wait for the previous key tile's ``P V``
    (``pin_softmax``)."""
    return [{**c, **x} for c in ws_seeds(D, causal, masked) for x in ({}, {"pin_softmax": True})]


def recheck_variants(D: int, causal: bool = False) -> list[dict]:
    """The default ws pick (fast math since 2026-12-05; causal: paired rows) alone and with each schedule option last
    measured before fast math (2026-12-03: consumer groups taking turns, 3 stages, the late store, two Q buffers), and
    the pairs of them that FlashAttention-3 runs together."""
    extra = [{}, {"pingpong": True}, {"num_stages": 3}, {"pingpong": True, "num_stages": 3}, {"late_store": True},
             {"double_q": True}, {"late_store": True, "double_q": True}]
    return [{**ws_seeds(D, causal)[0], **x} for x in extra]


def short_variants(D: int, causal: bool = False, masked: bool = False) -> list[dict]:
    """Each ws seed, and with the options that lead up to ``SHORT_KEYS`` keys (``attention_configs.SHORT_OPTIONS``:
    the late store, two Q buffers)."""
    return [{**c, **x} for c in ws_seeds(D, causal, masked) for x in ({}, SHORT_OPTIONS)]


def lean_variants(D: int, causal: bool = False, masked: bool = False, S: int | None = None,
                  heads: int = 0) -> list[dict]:
    """The ws seeds as the default orders them for ``S`` keys (the short-key lead first), each with one producer warp
    (``lean_producer``) and without."""
    return [{**c, **x} for c in ws_seeds(D, causal, masked, S, heads) for x in ({}, {"lean_producer": True})]


# Wider key tiles for the 128-row ws seeds (--configs wide; FlashAttention-3's non-causal picks are 192 x 192 at D 64,
# with P through shared memory, and 128 x 176 at D 128): each lowers without spills for sm_90a (ptxas, 2026-12-06);
# 192 x 192 and 192 x 160 (P in registers) and 128 x 256 spill, and 128 x 176 at D 128 needs 240 KB of shared memory.
WIDE = {64: (160, 192), 128: (160,)}


def wide_variants(D: int, causal: bool = False, masked: bool = False, S: int | None = None,
                  heads: int = 0) -> list[dict]:
    """The ws seeds as the default orders them for ``S`` keys, then each 128-row seed with the key tiles of ``WIDE``."""
    seeds = ws_seeds(D, causal, masked, S, heads)
    return seeds + [{**c, "block_N": n} for c in seeds if c["block_M"] == 128 for n in WIDE[64 if D <= 64 else 128]]


BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def flops(B, H, S, D, causal) -> float:
    f = 4.0 * B * H * S * S * D
    return f / 2 if causal else f


def timed(fn, *args, reps: int, how: str) -> float:
    """Milliseconds per call: CUDA-graph replays (``graph``) or single calls between CUDA events."""
    return device_time(fn, args, "cuda") * 1e3 if how == "graph" else cuda_time_ms(fn, *args, reps=reps)


def bench_shape(B, Hq, Hkv, S, D, causal, reps, target, configs, how="graph", masked=False):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=gen)
    operands = (q, k, v) + ((padding_mask(B, S, gen),) if masked else ())
    row = {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal, "masked": masked, "sdpa": {},
           "tilefuse": []}
    want = None
    for name, backend in (BACKENDS | ({"efficient": SDPBackend.EFFICIENT_ATTENTION} if masked else {})).items():
        try:
            with sdpa_kernel(backend):
                # (the operands as arguments, so that the timing rotates copies of them as it does for ours: a
                # closure over q, k, v found them in L2 at the zoo's shapes)
                def fn(q, k, v, mask=None):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                          enable_gqa=Hkv != Hq)
                out = fn(*operands)
                want = out if want is None else want
                row["sdpa"][name] = timed(fn, *operands, reps=reps, how=how)
        except Exception as e:  # noqa: BLE001  (a backend may not take a shape: flash + GQA on some builds)
            row["sdpa"][name] = None
            print(f"  sdpa {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    mask_kw = {"mask_shape": (B, 1, 1, S), "mask_dtype": "float16"} if masked else {}
    funcs = []
    for c in configs:  # (tiles the target cannot hold are refused when built: recorded, the others still run)
        try:
            funcs.append(attention.flash_attention(B, Hq, S, S, D, Hkv=Hkv, is_causal=causal, target=target,
                                                   **mask_kw, **c))
        except ValueError as e:
            funcs.append(e)
    built = iter(compile_many([(f, [-1]) for f in funcs if not isinstance(f, Exception)], target,
                              return_exceptions=True))
    for cfg, func in zip(configs, funcs):
        entry = {"config": cfg}
        row["tilefuse"].append(entry)
        kern = func if isinstance(func, Exception) else next(built)
        if isinstance(kern, BaseException):
            entry["error"] = f"{type(kern).__name__}: {str(kern)[:200]}"
            continue
        try:
            got = kern(*operands)
        except Exception as e:  # noqa: BLE001  (a launch the device refuses: recorded, the others still run)
            entry["error"] = f"launch: {type(e).__name__}: {str(e)[:200]}"
            continue
        entry["max_rel_err"] = err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        if err > 2e-2:
            entry["error"] = f"wrong result (max rel err {err:.2e})"
            continue
        entry["ms"] = timed(kern, *operands, reps=reps, how=how)
        entry["tflops"] = flops(B, Hq, S, D, causal) / entry["ms"] / 1e9
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="all", choices=["issue", "llm", "zoo", "sweep", "d64", "masked", "long",
                                                            "d128", "all"])
    p.add_argument("--configs", default="all", choices=["all", "seeds", "variants", "chain", "poly", "pin",
                                                              "recheck", "short", "lean", "wide"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--timing", default="graph", choices=["graph", "events"])
    p.add_argument("--json")
    a = p.parse_args(argv)
    major, minor = torch.cuda.get_device_capability()
    target = {"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == 9 else "")}
    shapes = {"issue": ISSUE, "llm": LLM, "zoo": ZOO, "sweep": ZOO + SWEEP, "masked": MASKED, "long": LONG,
              "d64": ZOO + [s for s in SWEEP if s[4] == 64], "d128": [s for s in SWEEP if s[4] == 128],
              "all": ISSUE + ZOO + LLM}[a.shapes]
    masked = a.shapes == "masked"
    import tilelang

    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "tilelang": tilelang.__version__, "python": platform.python_version(),
              "cudnn": torch.backends.cudnn.version(), "timing": a.timing, "rows": []}
    print("| B | Hq/Hkv | S | D | causal | best config | tilefuse ms | TFLOP/s | cuDNN ms | x cuDNN | flash ms | x flash |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for B, Hq, Hkv, S, D, causal in shapes:
        ws = attention_ws.eligible(target, D=D)  # (fp16, no mask or a padding mask: the ws schedule applies)
        if a.configs == "seeds":
            configs = attention.get_configs(target, D, ws, causal)
        else:
            if a.configs == "chain":
                configs = chain_variants(D, causal, S)
                if masked:  # each ws config also bounded by the padding (bound_keys: no key tile past the last kept)
                    configs += [{**c, "bound_keys": True} for c in configs if c.get("ws")]
            elif a.configs == "variants":
                configs = variants(D, causal)
            elif a.configs == "poly":
                configs = poly_variants(D, causal)
            elif a.configs == "pin":
                configs = pin_variants(D, causal, masked)
            elif a.configs == "recheck":
                configs = recheck_variants(D, causal)
            elif a.configs == "short":
                configs = short_variants(D, causal, masked)
            elif a.configs == "lean":
                configs = lean_variants(D, causal, masked, S, B * Hq)
            elif a.configs == "wide":
                configs = wide_variants(D, causal, masked, S, B * Hq)
            else:
                configs = attention.config_space(target, D, ws=ws, causal=causal)
        row = bench_shape(B, Hq, Hkv, S, D, causal, a.reps, target, configs, a.timing, masked)
        result["rows"].append(row)
        ok = [e for e in row["tilefuse"] if "ms" in e]
        best = min(ok, key=lambda e: e["ms"]) if ok else None
        cudnn = row["sdpa"].get("cudnn")
        for e in row["tilefuse"]:
            if "error" in e:
                print(f"  config {e['config']}: {e['error']}", flush=True)
            elif a.configs in ("variants", "chain", "poly", "pin", "recheck", "short", "lean", "wide"):
                print(f"  config {e['config']}: {e['ms']:.4f} ms, x cuDNN {cudnn / e['ms'] if cudnn else float('nan'):.3f}",
                      flush=True)

        def cell(ms, best=best):
            return (f"{ms:.3f}", f"{ms / best['ms']:.2f}") if ms and best else ("-", "-")
        cu, fl = cell(row["sdpa"].get("cudnn")), cell(row["sdpa"].get("flash"))
        bc = "/".join(str(best["config"][k]) for k in ("block_M", "block_N", "num_stages", "threads")) if best else "-"
        bc += "/ws" if best and best["config"].get("ws") else ""
        bc += "".join(f"/{k}" for k in ("pingpong", "pair_rows", "late_store", "double_q", "chain")
                      if best and best["config"].get(k))
        bc += f"/exp_poly{best['config']['exp_poly']}" if best and best["config"].get("exp_poly") else ""
        bc += "/pin" if best and best["config"].get("pin_softmax") else ""
        bc += "/lean" if best and best["config"].get("lean_producer") else ""
        print(f"| {B} | {Hq}/{Hkv} | {S} | {D} | {causal} | {bc} | {best['ms'] if best else float('nan'):.3f} | "
              f"{best['tflops'] if best else float('nan'):.0f} | {cu[0]} | {cu[1]} | {fl[0]} | {fl[1]} |", flush=True)
        if a.json:  # (after every shape: a run cut off by its time limit keeps what it measured)
            Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

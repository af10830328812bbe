"""``bench/bench_attention.py``'s config lists for the device runs (``--configs chain``, ``--shapes masked``) build for
sm_90a as listed, and ``bench/summarize_attention.py`` reads a result row. Their numbers come from the device."""

from __future__ import annotations

import sys
from pathlib import Path

from tilefuse.lowering.compile import kernel_source
from tilefuse.lowering.templates import attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_attention
import summarize_attention

SM90 = {"kind": "cuda", "arch": "sm_90a"}


def test_chain_variants_lead_with_the_template_and_build_as_listed():
    causal = bench_attention.chain_variants(64, True, 197)
    assert not causal[0].get("ws")  # the TileLang-scheduled template: what a masked attention runs by default
    assert all(c["ws"] and c["pair_rows"] for c in causal[1:])  # (the causal default)
    assert {(c["block_M"], c["block_N"]) for c in causal[1:]} == {(128, 128), (192, 128), (128, 192), (128, 208)}
    assert sum(1 for c in causal if c.get("chain") and c.get("fast_math")) == 4  # one a tile
    assert [c for c in bench_attention.chain_variants(128, False) if c.get("ws")][0]["block_N"] == 128
    for B, Hq, Hkv, S, D, is_causal in bench_attention.MASKED[:1]:
        for c in bench_attention.chain_variants(D, is_causal, S):
            f = attention.flash_attention(B, Hq, S, S, D, Hkv=Hkv, is_causal=is_causal, target=SM90,
                                          mask_shape=(B, 1, 1, S), mask_dtype="float16", **c)
            src = kernel_source(f, SM90)
            assert "half_t* __restrict__ Mask" in src or "half_t* __restrict__ mask" in src, c  # (the template's)


def test_summary_line_gives_each_config_against_cudnn():
    row = {"B": 32, "Hq": 12, "Hkv": 12, "S": 512, "D": 64, "causal": False, "masked": True,
           "sdpa": {"cudnn": 0.1, "flash": None},
           "tilefuse": [{"config": {"block_M": 128, "block_N": 128, "num_stages": 2, "threads": 256}, "ms": 0.125},
                        {"config": {"block_M": 128, "block_N": 128, "ws": True, "chain": True, "bound_keys": True},
                         "ms": 0.08},
                        {"config": {"block_M": 128, "block_N": 192, "ws": True},
                         "error": "wrong result (max rel err 1)"}]}
    assert summarize_attention.line(row) == ("32 12/12 512 64 -m | 128x128/tl 0.800 128x128/chain+bound_keys 1.250 "
                                             "128x192 wrong result (max rel err 1)")

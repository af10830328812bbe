"""One attention shape's kernels for Nsight Compute: the ws seed config's and cuDNN's (#14's D-64 gap), one call each
between ``cudaProfilerStart`` and ``cudaProfilerStop``, after warm-up calls outside.

Run under ``ncu --profile-from-start off`` (``run_pending_h200.sh`` part 67 does, with ``--clock-control none``)::

    ncu --profile-from-start off --clock-control none --set full -o rep python3 bench/ncu_attention.py --shape bert

Shapes (B, Hq, Hkv, S, D, causal): ``bert`` 32x12x512x64 (0.92x cuDNN on the H100, 2026-12-06), ``long``
2x32/8x8192x64 (0.97x), ``gpt2`` 8x12x1024x64 causal (1.05x).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import attention

SHAPES = {"bert": (32, 12, 12, 512, 64, False), "long": (2, 32, 8, 8192, 64, False),
          "gpt2": (8, 12, 12, 1024, 64, True)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="bert", choices=sorted(SHAPES))
    p.add_argument("--config", type=int, default=0, help="index into attention.get_configs (0: the default pick)")
    a = p.parse_args(argv)
    B, Hq, Hkv, S, D, causal = SHAPES[a.shape]
    major, minor = torch.cuda.get_device_capability()
    target = {"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == 9 else "")}
    config = attention.get_configs(target, D, ws=True, causal=causal)[a.config]
    func = attention.flash_attention(B, Hq, S, S, D, Hkv=Hkv, is_causal=causal, target=target, **config)
    (kern,) = compile_many([(func, [-1])], target)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.float16, generator=gen) for h in (Hq, Hkv, Hkv))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != Hq)

    for _ in range(5):  # (warm-up: cuDNN's plan, TileLang's module, the clocks)
        got, want = kern(q, k, v), cudnn()
    torch.cuda.synchronize()
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    print(f"shape {a.shape} {SHAPES[a.shape]} config {config}: max rel err against cuDNN {err:.2e}", flush=True)
    torch.cuda.profiler.start()
    kern(q, k, v)
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0 if err < 2e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())

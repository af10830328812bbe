"""Depthwise convolution configs at ConvNeXt-T's and EfficientNet-B0's shapes (b64, fp16, channels last) against cuDNN
and Inductor: is the untuned pick (``depthwise.default_config``) the best, and where does it stand?

Usage (on the device machine):  python bench/sweep_depthwise.py [--json out.json] [--only convnext]

For each shape: every config of a grid (output tile, channels a program, threads) compiled in one parallel
batch, each checked against the fp32 reference (every element, fp16: 1e-2) and timed with cold caches
(``lowering.timing.device_time``); ``F.conv2d`` with ``groups = C`` on channels-last tensors (cuDNN) and Inductor
default's compile of it timed the same way. The epilogue is the bias (ConvNeXt's) or, for EfficientNet, the folded
batch norm and SiLU (``silu(acc * scale + shift)``), which the peers compute too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_norm import TARGET, meta, save, time_configs, unique  # noqa: E402

from tilefuse.lowering.compile import compile_many  # noqa: E402
from tilefuse.lowering.expr import Acc, Arg, call  # noqa: E402
from tilefuse.lowering.templates import depthwise  # noqa: E402
from tilefuse.lowering.timing import device_time  # noqa: E402

# (label, (N, H, W, C), kernel, stride): timm ConvNeXt-T (7x7, padding 3, bias) and EfficientNet-B0 (3x3 and 5x5,
# padding k // 2, batch norm + SiLU) at b64, 224x224.
SHAPES = [("convnext s1", (64, 56, 56, 96), 7, 1), ("convnext s2", (64, 28, 28, 192), 7, 1),
          ("convnext s3", (64, 14, 14, 384), 7, 1), ("convnext s4", (64, 7, 7, 768), 7, 1),
          ("effnet b1 3x3", (64, 112, 112, 32), 3, 1), ("effnet b2 3x3/2", (64, 112, 112, 96), 3, 2),
          ("effnet b2 3x3", (64, 56, 56, 144), 3, 1), ("effnet b3 5x5/2", (64, 56, 56, 144), 5, 2),
          ("effnet b3 5x5", (64, 28, 28, 240), 5, 1), ("effnet b5 5x5", (64, 14, 14, 672), 5, 1),
          ("effnet b7 3x3", (64, 7, 7, 1152), 3, 1)]


def grid(channels: int, stride: int) -> list[dict]:
    out = [depthwise.default_config(channels, (stride, stride), TARGET), *depthwise.get_configs(TARGET)]
    for th, tw in ((4, 4), (4, 8), (8, 8), (8, 16), (16, 8), (16, 16)):
        for bc in (16, 32, 64):
            for t in (128, 256):
                if bc <= max(16, channels) and th * tw * bc // t in (4, 8, 16, 32):
                    out.append({"tile_h": th, "tile_w": tw, "block_C": bc, "threads": t})
    return unique(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    shapes = [s for s in SHAPES if a.only in s[0]]
    items, configs, geo = [], {}, {}
    for label, xs, k, s in shapes:
        ws, pad, bias = (xs[3], 1, k, k), k // 2, label.startswith("convnext")
        epilogue = Acc() + Arg(0) if bias else call("silu", Acc() * Arg(0) + Arg(1))
        extras = [(xs[3],)] if bias else [(xs[3],), (xs[3],)]
        N, OH, OW, O = depthwise.output_shape(xs, ws, (s, s), (pad, pad))
        geo[label] = (ws, pad, epilogue, len(extras), N * OH * OW)
        configs[label] = grid(O, s)
        for c in configs[label]:
            items.append((depthwise.depthwise_conv2d(xs, ws, stride=(s, s), padding=(pad, pad), in_dtype="float16",
                                                     epilogue=epilogue, extra_shapes=extras,
                                                     extra_dtypes=["float16"] * len(extras), target=TARGET, **c),
                          [-1]))
    t0 = time.perf_counter()
    kernels = compile_many(items, TARGET, return_exceptions=True)
    print(f"{len(items)} kernels for {len(shapes)} shapes compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    results, info = [], meta()
    print(f"{'shape':26} {'cudnn':>8} {'inductor':>8} {'first':>8} {'pick':>8} {'best':>8}  pick x best peer  best "
          "config", flush=True)
    for label, xs, k, s in shapes:
        torch._dynamo.reset()
        ws, pad, epilogue, n_extra, pixels = geo[label]
        x = torch.randn(xs, device="cuda", dtype=torch.float16)
        w = torch.randn(ws, device="cuda", dtype=torch.float16) * 0.2
        extras = [torch.randn(xs[3], device="cuda", dtype=torch.float16) for _ in range(n_extra)]

        def peer(x, w, *e, s=s, pad=pad, n_extra=n_extra):
            y = F.conv2d(x.permute(0, 3, 1, 2), w, e[0] if n_extra == 1 else None, s, pad, groups=x.shape[-1])
            y = y if n_extra == 1 else F.silu(y * e[0].view(1, -1, 1, 1) + e[1].view(1, -1, 1, 1))
            return y.permute(0, 2, 3, 1)

        args = [x, w, *extras]
        want = depthwise.reference(x, w, stride=(s, s), padding=(pad, pad), epilogue=epilogue, extras=extras).float()
        peers = {"cudnn": device_time(peer, args, "cuda") * 1e3,
                 "inductor": device_time(torch.compile(peer), args, "cuda") * 1e3}
        done, kernels = kernels[:len(configs[label])], kernels[len(configs[label]):]
        row = time_configs(f"{label} {'x'.join(map(str, xs[1:]))}", configs[label], done, args, want, peers,
                           depthwise.default_config(xs[3], (s, s), TARGET), depthwise.get_configs(TARGET)[0])
        results.append({**row, "x_shape": xs, "kernel": k, "stride": s})
        save(a.json, info, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a compiled zoo model's time goes on the GPU: one profiled call, kernel by kernel.

Usage (on the device machine):  python bench/profile_model.py --model gpt2 [--tune fast] [--trace out.json]

Compiles the model with tilefuse, warms it up, then records ``--calls`` calls with torch.profiler and prints:
the wall time per call (CUDA events), the GPU's busy time per call (kernels and copies, summed) and the gap
between them (launch, host work, idle GPU), then the kernels and copies by total time. A gap much larger than
the sum says the time is lost outside the kernels; a kernel much slower here than in ``bench_models.py``'s
isolated kernel table says the isolated timing flattered it (e.g. operands warm in L2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import cuda_time_ms

import tilefuse
from tilefuse import models


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--tune", default="none", choices=["none", "fast", "max"])
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--trace", help="also write a Chrome trace here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("profile_model: needs a CUDA GPU", file=sys.stderr)
        return 2
    model, inputs = models.build(args.model, args.size, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        fn = tilefuse.compile(model, tune=args.tune)
        for _ in range(5):
            fn(*inputs)
        torch.cuda.synchronize()
        wall = cuda_time_ms(fn, *inputs, reps=20)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(args.calls):
                fn(*inputs)
            torch.cuda.synchronize()
    if args.trace:
        prof.export_chrome_trace(args.trace)
    per_name: dict[str, list[float]] = defaultdict(list)
    busy_us = 0.0
    for e in prof.events():
        dev_us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if e.device_type == torch.autograd.DeviceType.CUDA and dev_us > 0:
            per_name[e.name].append(dev_us)
            busy_us += dev_us
    busy = busy_us / args.calls / 1e3
    print(f"{args.model} ({args.size}, tune={args.tune}): wall {wall:.3f} ms per call (median of 20), GPU busy "
          f"{busy:.3f} ms per call, gap {wall - busy:.3f} ms")
    print(f"{'total ms/call':>13} {'count/call':>10} {'mean us':>9}  kernel or copy")
    rows = sorted(per_name.items(), key=lambda kv: -sum(kv[1]))
    for name, ts in rows[:args.top]:
        print(f"{sum(ts) / args.calls / 1e3:13.3f} {len(ts) / args.calls:10.1f} {statistics.mean(ts):9.1f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

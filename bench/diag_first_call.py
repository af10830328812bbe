"""Where a measured choice's seconds go: its timings' first calls (session 25 on the H200: ResNet-50's measured
choice took 24.6 s of a 47.7 s cold compile, 22.4 s of it in the first call of each way it timed; ViT 5.1 of 5.7 s).

Usage (device):  python bench/diag_first_call.py --models resnet,vit --out DIR

For each zoo model, in a fresh process with empty tilefuse caches, ``torch.compile(model, backend="tilefuse")`` and
its first call, with every way the measured choice times (the region's kernel, its ops through torch, its split)
called twice, synchronized, before the timing: the first call's seconds against the second's, by way and region
(template or ops), the slowest listed, and the first calls' cProfile statistics (what inside them is slow) in DIR.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time


def label(fn) -> str:
    """A way's kind and what it computes: the kernel's template, the torch ops, a split's head ops."""
    kind = type(fn).__name__
    if hasattr(fn, "spec"):
        return f"kernel {fn.spec.template} {fn.region.name}"
    if hasattr(fn, "steps"):
        return "torch " + ",".join(n.op for n, _, _ in fn.steps)[:80]
    if hasattr(fn, "head_fn"):
        return "split " + label(fn.head_fn)[6:] + " + " + fn.tail_fn.spec.template
    return kind


def child(model_name: str, out: str) -> None:
    import torch

    from tilefuse import models, pipeline

    rows, prof = [], cProfile.Profile()
    timed = pipeline.device_time

    def traced(fn, args, kind, sets=None):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prof.enable()
        fn(*args)
        torch.cuda.synchronize()
        prof.disable()
        t1 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        rows.append((label(fn), t1 - t0, time.perf_counter() - t1))
        return timed(fn, args, kind, sets)

    pipeline.device_time = traced
    model, inputs = models.build(model_name, "bench", dtype=torch.float16, device="cuda")
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.compile(model, backend="tilefuse")(*inputs)
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    by_way: dict[str, list[float]] = {}
    for name, first, second in rows:
        acc = by_way.setdefault(name.split()[0], [0.0, 0.0, 0])
        acc[0], acc[1], acc[2] = acc[0] + first, acc[1] + second, acc[2] + 1
    print(f"{model_name}: compile + first call {total:.2f} s; {len(rows)} ways timed")
    for way, (first, second, n) in by_way.items():
        print(f"  {way:7} {n:3} ways: first calls {first:7.3f} s, second calls {second:7.3f} s")
    print("  slowest first calls (s, first / second):")
    for name, first, second in sorted(rows, key=lambda r: -r[1])[:25]:
        print(f"    {first:7.3f} / {second:7.4f}  {name}")
    path = os.path.join(out, f"{model_name}_first_calls.prof")
    prof.dump_stats(path)
    with open(path + ".txt", "w") as f:
        stats = pstats.Stats(path, stream=f)
        stats.sort_stats("cumulative").print_stats(50)
        stats.sort_stats("tottime").print_stats(30)
    with open(os.path.join(out, f"{model_name}_first_calls.json"), "w") as f:
        json.dump({"model": model_name, "total_s": total, "rows": rows}, f, indent=1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet,vit")
    ap.add_argument("--out", default=".")
    ap.add_argument("--timeout", type=float, default=200)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        child(args.models, args.out)
        return 0
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TILEFUSE_QUIET="1", TILEFUSE_TUNING_DB=os.path.join(cache, "tuning.json"),
                       TILEFUSE_FUNC_CACHE_DIR=os.path.join(cache, "funcs"),
                       TILELANG_CACHE_DIR=os.path.join(cache, "tilelang"))
            try:
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--models", model,
                                       "--out", args.out], env=env, capture_output=True, text=True,
                                      timeout=args.timeout, check=False)
                print(done.stdout + (done.stderr[-2000:] if done.returncode else ""), flush=True)
            except subprocess.TimeoutExpired:
                print(f"{model}: timed out after {args.timeout:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

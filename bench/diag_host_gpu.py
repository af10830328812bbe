"""Where a compiled call's host time goes on the GPU machine, before and around its kernels.

Usage (device):  python bench/diag_host_gpu.py --model llama [--compilers tilefuse,inductor] [--calls 5]

Session 28 on the H200: the zoo LLaMA's call under tilefuse (no options) spent 1.93 ms on the host before returning,
and the whole call took 32.59 ms against 29.98 ms of kernels with 0.22 ms idle between them, so about 2 ms went before
the first kernel. ``bench/host_overhead.py``'s emulation of the same runner on the CPU spends 0.10 ms a call, so the
rest is what only the GPU path does (the graph's launch, the eager tail's launch, the outputs). For each compiler this
prints, per call (median of ``--calls``): the host time until the call returns, the time from the call's start to its
first kernel's start and from the last kernel's end to the call's end (CUDA events and the profiler's clocks), and the
host functions and CUDA runtime calls by self time (torch.profiler's CPU events, and a cProfile of the Python side).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout

import tilefuse


def host_times(fn, inputs, calls: int) -> tuple[float, float]:
    """Median host milliseconds until ``fn`` returns, and until its GPU work is done (synchronized before each)."""
    host, whole = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*inputs)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        whole.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(host), statistics.median(whole)


def profiled(fn, inputs, calls: int) -> None:
    """One profiler pass: per call, the lead before the first kernel and the CPU events by self time."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(calls):
            torch.cuda.synchronize()
            with torch.profiler.record_function(f"diag_host_call{i}"):
                fn(*inputs)
            torch.cuda.synchronize()
    events = prof.events()
    marks = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("diag_host_call"))
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    leads, tails = [], []
    for i, (s, e) in enumerate(marks):
        nxt = marks[i + 1][0] if i + 1 < len(marks) else float("inf")
        mine = [k for k in kernels if s <= k[0] < nxt]
        if mine:
            leads.append((mine[0][0] - s) / 1e3)
            tails.append((max(k[1] for k in mine) - e) / 1e3)
    if leads:
        print(f"    first kernel starts {statistics.median(leads):.3f} ms after the call starts; the last kernel ends "
              f"{statistics.median(tails):.3f} ms after the call returns (medians of {len(leads)})")
    cpu = [e for e in events
           if e.device_type == torch.autograd.DeviceType.CPU and not e.name.startswith("diag_host_call")]
    by: dict[str, list[float]] = {}
    for e in cpu:
        by.setdefault(e.name, []).append(e.self_cpu_time_total)
    rows = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:15]
    print(f"    {'self ms/call':>12} {'count/call':>10}  host event")
    for name, ts in rows:
        print(f"    {sum(ts) / calls / 1e3:12.3f} {len(ts) / calls:10.1f}  {name[:100]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--compilers", default="tilefuse,inductor")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("diag_host_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    model, inputs = heldout.build(args.model, args.size)
    with torch.no_grad():
        for who in args.compilers.split(","):
            torch._dynamo.reset()
            fn = tilefuse.compile(model) if who == "tilefuse" else torch.compile(model)
            for _ in range(8):
                fn(*inputs)
            host, whole = host_times(fn, inputs, max(args.calls, 5))
            print(f"{args.model} {who}: host {host:.3f} ms until the call returns, {whole:.3f} ms with its GPU work")
            profiled(fn, inputs, args.calls)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                fn(*inputs)
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)
            del fn
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One call of a model under tilefuse (no options) and under Inductor default, kernel by kernel in launch order.

Usage (on the device machine):  python bench/profile_sequence.py --model llama [--json out.json]

A category profile says *that* tilefuse's GEMMs take 0.9 ms longer than Inductor's; this says which. Each compiler's
call is profiled (torch.profiler, ``--calls`` calls, the first dropped), its kernels listed in the order they ran with
their durations, then the kernels are grouped by (name, duration bucket) so a layer's GEMMs line up across the two
compilers: the same GEMM shape shows up as a group of ``layers`` launches of about the same duration.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout
from profile_kernels import category

import tilefuse


def kernel_sequence(fn, inputs, calls: int, cpu_top: int = 0) -> list[list[tuple[str, float, float]]]:
    """Per call, the GPU kernels and copies in launch order as (name, microseconds, idle microseconds before it).

    With ``cpu_top``, also print where the host's time goes: each call's wall time on the host, the time from its
    start to its first kernel, and the ``cpu_top`` host ops with the most self time.
    """
    for _ in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            with torch.profiler.record_function("profiled_call"):
                fn(*inputs)
            torch.cuda.synchronize()
            torch.cuda._sleep(100_000)  # a spin kernel marks the boundary between calls
        torch.cuda.synchronize()
    events = []
    for e in prof.events():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if e.device_type == torch.autograd.DeviceType.CUDA and us > 0:
            events.append((e.time_range.start, e.name, us))
    events.sort()
    if cpu_top:
        host_report(prof, events, cpu_top, calls)
    per_call: list[list[tuple[str, float, float]]] = [[]]
    end = None
    for start, name, us in events:
        if "spin_kernel" in name or "sleep" in name.lower():  # the idle kernel between two calls
            per_call.append([])
        else:
            per_call[-1].append((name, us, 0.0 if not per_call[-1] or end is None else max(start - end, 0.0)))
        end = start + us
    return [c for c in per_call if c]


def host_report(prof, kernels: list[tuple[float, str, float]], top: int, calls: int) -> None:
    """Each call's host wall time and its start-to-first-kernel latency, then the host ops with the most self time."""
    for e in prof.events():
        if e.name == "profiled_call" and e.device_type == torch.autograd.DeviceType.CPU:
            start, end = e.time_range.start, e.time_range.end
            first = next((k[0] for k in kernels if k[0] >= start and "sleep" not in k[1].lower()), None)
            lat = f"{first - start:.1f}" if first is not None else "-"
            print(f"  host: call {(end - start) / 1e3:.3f} ms on the host, {lat} us from its start to its first kernel")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    print(f"  host ops by self time over {calls} calls:")
    print("\n".join("  " + line[:160] for line in table.splitlines()))


def groups(seq: list[tuple[str, float]]) -> list[dict]:
    """Kernels grouped by name and duration (buckets of 5%), largest total first."""
    buckets: dict[tuple[str, int], list[float]] = defaultdict(list)
    for name, us, _ in seq:
        b = int(round(math.log(max(us, 1.0)) / 0.05))
        buckets[(name, b)].append(us)
    rows = [{"kernel": n, "category": category(n), "count": len(v), "mean_us": statistics.mean(v),
             "total_ms": sum(v) / 1e3} for (n, _), v in buckets.items()]
    return sorted(rows, key=lambda r: -r["total_ms"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--cpu-top", type=int, default=0, help="also list this many host ops by self time")
    ap.add_argument("--only", choices=["tilefuse", "inductor"], help="profile one compiler")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("profile_sequence: needs a CUDA GPU", file=sys.stderr)
        return 2
    model, inputs = heldout.build(args.model, args.size)
    out: dict = {"model": args.model, "size": args.size}
    with torch.no_grad():
        for who in [args.only] if args.only else ["tilefuse", "inductor"]:
            torch._dynamo.reset()
            fn = tilefuse.compile(model) if who == "tilefuse" else torch.compile(model)
            calls = kernel_sequence(fn, inputs, args.calls, args.cpu_top)
            seq = calls[-1]
            out[who] = {"sequence": seq, "groups": groups(seq), "calls_seen": len(calls)}
            total, idle = sum(s[1] for s in seq) / 1e3, sum(s[2] for s in seq) / 1e3
            print(f"{args.model} {who}: {len(seq)} kernels, {total:.3f} ms busy and {idle:.3f} ms idle between them "
                  f"in one call ({len(calls)} calls separated); the longest idle gaps, us (before the kernel named):")
            for i in sorted(range(len(seq)), key=lambda i: -seq[i][2])[:8]:
                print(f"  {seq[i][2]:9.1f} before #{i} {seq[i][0][:60]} (after {seq[i - 1][0][:40] if i else '-'})")
            print(f"  {'total ms':>9} {'count':>5} {'mean us':>9}  category      kernel")
            for g in out[who]["groups"][:args.top]:
                print(f"  {g['total_ms']:9.3f} {g['count']:5d} {g['mean_us']:9.1f}  {g['category']:12s}  "
                      f"{g['kernel'][:100]}")
            del fn
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

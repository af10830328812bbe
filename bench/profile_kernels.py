"""Shared by the benchmarks: whole-call timing with cold caches, and a kernel profile by category.

``time_ms`` is triton's ``do_bench`` (it writes a 256 MB buffer before every call, so no call finds the last one's
operands in L2; median of the calls, warm-up excluded) where triton is installed, CUDA events otherwise.
``profile`` runs a callable under torch.profiler and sums the GPU time of its kernels per category, per call, so
a reader sees where a gap between two compilers lies (the GEMMs, attention, the norms, elementwise, copies).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

import torch

# First match wins. TileLang kernels are named after their template (``gemm_kernel_kernel``...), Inductor's after
# their kind (``triton_poi_`` pointwise, ``triton_per_``/``triton_red_`` reductions), cuBLAS's ``nvjet``/``sm90_xmma``
# GEMMs, cuDNN's and flash's attention kernels.
CATEGORIES = (
    ("attention", r"flash|fmha|attention|sdpa|mha|_attn"),
    ("conv", r"conv|fprop|dgrad|wgrad|implicit_gemm|pool2d"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|matmul|gemv|splitk|sm90_|sm80_"),
    ("norm/softmax", r"row_reduction|norm|softmax|triton_per|triton_red|reduce"),
    ("copy", r"copy|memcpy|memset|cat_|catarray|transpose|permute|clone|index"),
    ("elementwise", r"elementwise|triton_poi|vectorized|unrolled|pointwise"),
)


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "other"


def time_ms(fn, *args, reps: int = 50, warmup: int = 5) -> float:
    """Median milliseconds of ``fn(*args)`` with L2 flushed before each call (triton's ``do_bench``)."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        for _ in range(warmup):
            fn(*args)
        return float(do_bench(lambda: fn(*args), warmup=max(warmup, 1), rep=max(reps, 10), return_mode="median"))
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile(fn, *args, calls: int = 5, top: int = 25) -> dict:
    """One warm call's GPU time by category: ``busy_ms`` (kernels and copies), ``by_category_ms`` and the ``top``
    kernels (per-call ms and count), from ``calls`` profiled calls."""
    fn(*args)
    torch.cuda.synchronize()
    return profile_calls(lambda: fn(*args), calls, top)


def profile_calls(call, calls: int = 5, top: int = 25) -> dict:
    """``profile`` of ``calls`` calls of ``call()`` as they come (a decode step that feeds the next its token)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    per_name: dict[str, list[float]] = defaultdict(list)
    spans: list[tuple[float, float]] = []
    for e in prof.events():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if e.device_type == torch.autograd.DeviceType.CUDA and us > 0:
            per_name[e.name].append(us)
            spans.append((e.time_range.start, e.time_range.end))
    by_cat: dict[str, float] = defaultdict(float)
    for name, ts in per_name.items():
        by_cat[category(name)] += sum(ts) / calls / 1e3
    kernels = sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    summed = sum(by_cat.values())
    busy = covered_us(spans) / calls / 1e3 if spans else summed
    # busy: the time some kernel ran (their intervals' union); with programmatic dependent launch a kernel is placed
    # while the one before still runs and waits there, so the kernels' own times (the categories) add up to more
    return {"busy_ms": busy, "kernel_sum_ms": summed, "overlap_ms": summed - busy,
            "by_category_ms": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
            "top": [{"kernel": n[:160], "ms": sum(ts) / calls / 1e3, "count": len(ts) / calls, "category": category(n)}
                    for n, ts in kernels]}


def covered_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals (time some kernel ran, overlapping kernels once)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def category_line(p: dict) -> str:
    return ", ".join(f"{c} {ms:.2f}" for c, ms in p["by_category_ms"].items() if ms >= 0.005)

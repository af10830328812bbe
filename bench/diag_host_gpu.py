"""Where a compiled call's host time goes on the GPU machine, before and around its kernels.

Usage (device):  python bench/diag_host_gpu.py --model llama [--compilers tilefuse,inductor] [--calls 5]

Session 28 on the H200: the zoo LLaMA's call under tilefuse (no options) spent 1.93 ms on the host before returning,
and the whole call took 32.59 ms against 29.98 ms of kernels with 0.22 ms idle between them. Session 29
(bench/results/2026-12-04-h200-session29): the GPU waits 0.3-0.5 ms for the graph's launch; the replayed graph takes
31.2 ms of GPU time by CUDA events, back to back or alone, and 29.4 ms from its first kernel's start to its last one's
end under the profiler, so 1.8 ms of the gap is not in anything the profiler shows (not settled which measure is
right). Much of the host time was a cudaMalloc of the 500 MB logits each call: a reference cycle kept each call's
outputs alive until the garbage collector ran (fixed in ``frontends/fx.py``). For each compiler this
prints, per call (median of ``--calls``): the host time until the call returns; for tilefuse, the GPU's and the host's
time from the call's start to the CUDA graph's launch, in the graph, and after it (CUDA events); the cudaMalloc calls
a call makes and where from; the kernels' time and the host functions and CUDA runtime calls by self time
(torch.profiler's CPU events, and a cProfile of the Python side).
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


def timeline(fn, inputs, calls: int) -> None:
    """Per call (medians), where the GPU's time goes around the CUDA graph: CUDA events at the call's start, just
    before and after the graph's launch (``torch.cuda.CUDAGraph.replay`` wrapped) and at its end, and the host's clock
    at the same points. The GPU is idle from the call's start until the graph's launch reaches it."""
    marks: dict[str, list] = {}
    original = torch.cuda.CUDAGraph.replay

    def replay(graph):
        marks["pre"] = _mark()
        marks["graph"] = graph
        original(graph)
        marks["post"] = _mark()

    rows = []
    torch.cuda.CUDAGraph.replay = replay
    try:
        for _ in range(calls):
            marks.clear()
            torch.cuda.synchronize()
            begin = _mark()
            fn(*inputs)
            end = _mark()
            torch.cuda.synchronize()
            pts = [begin, marks.get("pre"), marks.get("post"), end]
            if None in pts:
                rows.append(None)
                continue
            rows.append([(b[0].elapsed_time(a[0]), (a[1] - b[1]) * 1e3) for b, a in zip(pts, pts[1:])])
    finally:
        torch.cuda.CUDAGraph.replay = original
    if not rows or None in rows:
        print("    (no CUDA graph replayed)")
        return
    names = ("call start -> graph launch", "the graph", "graph's end -> call's end")
    for j, name in enumerate(names):
        gpu = statistics.median(r[j][0] for r in rows)
        host = statistics.median(r[j][1] for r in rows)
        print(f"    {name:28s} GPU {gpu:8.3f} ms   host {host:7.3f} ms")
    graph_gaps(marks["graph"], calls)


def graph_gaps(graph, calls: int) -> None:
    """The captured graph alone: its GPU time a replay, back to back and one at a time (CUDA events), against its
    kernels' time and span in the profiler, and the widest gaps between its kernels, with the kernels around them."""
    for back_to_back in (True, False):
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls if back_to_back else 1):
                graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / (calls if back_to_back else 1))
        print(f"    graph replay {'back to back' if back_to_back else 'alone'}: {statistics.median(times):.3f} ms")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
    ks = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    half = len(ks) // 2
    ks = ks[half:]  # the second replay
    if not ks:
        return
    busy = sum(e - s for s, e, _ in ks) / 1e3
    span = (max(e for _, e, _ in ks) - ks[0][0]) / 1e3
    gaps = sorted(((ks[i + 1][0] - ks[i][1], i) for i in range(len(ks) - 1)), reverse=True)
    print(f"    profiled replay: {len(ks)} kernels, busy {busy:.3f} ms, span {span:.3f} ms, "
          f"idle {sum(max(g, 0) for g, _ in gaps) / 1e3:.3f} ms")
    for g, i in gaps[:8]:
        print(f"      gap {g:8.1f} us after {ks[i][2][:60]} ({(ks[i][1] - ks[i][0]):.0f} us), "
              f"before {ks[i + 1][2][:60]}")


def _mark():
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e, time.perf_counter()


def mallocs(fn, inputs, calls: int) -> None:
    """cudaMalloc/cudaFree per call (the allocator's counts) and, for each segment allocated during the calls, the
    Python frames that asked for it."""
    before = torch.cuda.memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=20000)
    for _ in range(calls):
        fn(*inputs)
    torch.cuda.synchronize()
    try:
        snap = torch.cuda.memory._snapshot()
    except RuntimeError as e:  # (torch 2.11 on the H200: "stoi", in one process of three)
        print(f"    (no allocator snapshot: {e})")
        snap = {}
    torch.cuda.memory._record_memory_history(enabled=None)
    after = torch.cuda.memory_stats()
    n = {k: (after.get(k, 0) - before.get(k, 0)) / calls for k in ("num_device_alloc", "num_device_free")}
    print(f"    cudaMalloc {n['num_device_alloc']:.1f} and cudaFree {n['num_device_free']:.1f} a call")
    seen = 0
    for trace in snap.get("device_traces", []):
        for ev in trace:
            if ev.get("action") not in ("segment_alloc", "segment_free") or seen >= 6:
                continue
            seen += 1
            frames = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in ev.get("frames", [])
                      if f.get("filename", "").endswith(".py")][:8]
            print(f"    {ev['action']} {ev.get('size', 0) / 2**20:.1f} MiB stream {ev.get('stream')}: "
                  + " <- ".join(frames))


def profiled(fn, inputs, calls: int) -> None:
    """One profiler pass: kernel time per call, and the CPU events by self time."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            torch.cuda.synchronize()
            fn(*inputs)
            torch.cuda.synchronize()
    events = prof.events()
    busy = sum(e.device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"    kernels {busy / calls / 1e3:.3f} ms a call (profiled)")
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
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
            if who == "tilefuse":
                timeline(fn, inputs, max(args.calls, 5))
            mallocs(fn, inputs, args.calls)
            profiled(fn, inputs, args.calls)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(4 * args.calls):
                fn(*inputs)
            prof.disable()
            torch.cuda.synchronize()
            stats = pstats.Stats(prof, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(10)
            stats.sort_stats("cumulative").print_stats(12)
            del fn
    return 0


if __name__ == "__main__":
    sys.exit(main())

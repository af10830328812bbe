"""Timing kernels and regions: the median of enough calls, with cold caches where the device has caches to warm.

Note: on CUDA a timing replays a CUDA graph of ``REPS`` calls (what the runtime replays: no Python launch cost,
which would favour one kernel over several torch ops), each call on its own copy of the operands so none finds
them in L2 (``rotations``); on the CPU calls are timed one by one with ``perf_counter`` and the median decides.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

WARMUP, REPS = {"c": 2, "cuda": 5}, {"c": 5, "cuda": 20}

# Host seconds that CUDA timings spent in this process, by step: "first_call" (each timed function's call outside a
# graph, lazy initialisation included), "copies" (``rotations``), "capture" and "replay" (``device_time``).
# bench/compile_time.py prints them beside a compile's phases: where a measured choice's seconds go.
SPENT: Counter = Counter()


@contextmanager
def spent(step: str) -> Iterator[None]:
    """Adds the seconds the block takes to ``SPENT[step]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        SPENT[step] += time.perf_counter() - t0


def measure(kernel, args, kind: str) -> float:
    """Seconds per call of ``kernel(*args)``: the median of ``REPS`` after ``WARMUP`` calls (on CUDA the mean)."""
    reps = REPS.get(kind, 3)
    for _ in range(WARMUP.get(kind, 1)):
        kernel(*args)
    if kind == "cuda":
        return events_time(lambda: kernel(*args), reps)
    return cpu_time(kernel, args, reps)


def events_time(fn, n: int) -> float:
    """Mean seconds of ``n`` calls of ``fn()`` back to back on the current CUDA stream (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


# A CUDA graph's replays are timed until they fill about this many seconds (at least two, at most REPS): a graph of
# milliseconds is timed to a fraction of a percent by a few. A fixed 5 + 20 replays of graphs of twenty 1.5 ms GEMMs
# took 0.75 s per timing: the zoo MLP's measured choice, three ways of two regions, was 4.9 s of its 10.9 s compile
# (2026-12-03, H200, profiled). With 50 ms it was 2.0 s, but ViT's, some 50 regions of 2-3 ms graphs, still 7.3 s;
# 10 ms is at least two replays of 20-32 calls each (unmeasured on the H200 yet: bench/run_pending_h200.sh 1).
CUDA_TIME_BUDGET_S = 0.01


# A timing's graph holds ``REPS`` calls, fewer where they would take longer than this, never fewer than the copies
# of the operands it cycles through or CUDA_GRAPH_MIN_CALLS: replayed a warm-up, a probe and at least two times,
# twenty 1 ms GEMMs took 80 ms a timing, the zoo MLP's measured choice 0.64 s of its 8.5 s cold compile (0.56 s in
# replays, 2026-12-05 on the H200; #13's compile bar). A graph of a few ms still times a millisecond kernel to well
# under the choice's 3% margin (``KEEP_KERNEL_MARGIN``); a call of microseconds keeps its twenty.
CUDA_GRAPH_S = 0.005
CUDA_GRAPH_MIN_CALLS = 4


def calls_per_graph(per_call_s: float, copies: int) -> int:
    """How many calls a timing's CUDA graph captures, given one warm call's seconds and the operand copies."""
    fit = math.ceil(CUDA_GRAPH_S / max(per_call_s, 1e-9))
    return max(copies, CUDA_GRAPH_MIN_CALLS, min(REPS["cuda"], fit))


def replay_time(replay, timer=events_time) -> float:
    """Seconds per ``replay()``: one warm-up, one probe, then as many as fill ``CUDA_TIME_BUDGET_S``."""
    replay()
    probe = timer(replay, 1)
    return timer(replay, max(2, min(REPS["cuda"], math.ceil(CUDA_TIME_BUDGET_S / max(probe, 1e-9)))))


# On the CPU a timing shares the cores with everything else running (on a loaded 2-core machine one call in
# several is slowed by a neighbour): calls are timed one by one, enough of them to fill CPU_TIME_BUDGET_S (at least
# the kind's REPS, at most CPU_MAX_REPS), and the median decides.
CPU_TIME_BUDGET_S = 0.02
CPU_MAX_REPS = 25


def cpu_time(fn, args, reps: int) -> float:
    """Median seconds of ``fn(*args)`` over at least ``reps`` calls, more for short ones (see CPU_TIME_BUDGET_S)."""
    times: list[float] = []
    want = reps
    while len(times) < want:
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
        if len(times) == reps:  # short calls: more of them, as many as the median so far fits in the budget
            want = max(reps, min(CPU_MAX_REPS, math.ceil(CPU_TIME_BUDGET_S / max(sorted(times)[reps // 2], 1e-7))))
    return sorted(times)[len(times) // 2]


# Timings that decide must see the operands where the model has them: in HBM, not in the 50 MB L2 that a kernel
# called again on the same inputs finds them in (a 25 MB layer norm "ran" at 3 TB/s so). Each timed call reads its
# own copy of the operands, enough copies to span this many bytes.
ROTATE_BYTES = 256 * 2**20
ROTATE_MAX_COPIES = 32


def _nbytes(args) -> int:

    if isinstance(args, torch.Tensor):
        return args.numel() * args.element_size()
    if isinstance(args, (list, tuple)):
        return sum(_nbytes(a) for a in args)
    return 0


def _copy(args):

    if isinstance(args, torch.Tensor):
        return args.clone()
    if isinstance(args, (list, tuple)):
        return type(args)(_copy(a) for a in args)
    return args


def rotations(args, span: int = ROTATE_BYTES, most: int = ROTATE_MAX_COPIES) -> list:
    """``args`` and enough copies of it that calls cycling through them read ``span`` bytes of distinct
    operands (at most ``most`` sets; one where the operands alone span it)."""
    size = _nbytes(args)
    n = 1 if size >= span or size == 0 else min(most, math.ceil(span / size))
    with spent("copies"):
        return [args] + [_copy(args) for _ in range(n - 1)]


def device_time(fn, args, kind: str, sets: list | None = None) -> float:
    """Seconds of device time per ``fn(*args)`` with cold caches: on CUDA, replays of a CUDA graph of up to ``REPS``
    calls (``calls_per_graph``; what the runtime replays, free of Python's launch cost, which would favour one kernel
    over several torch ops), each call on its own copy of the operands (``rotations``; ``sets`` where the caller has
    them, e.g. for several ways of computing the same thing) so that none finds them in L2; ``measure`` where
    capture fails (a region reading values on the host) or off CUDA."""
    if kind != "cuda":
        return measure(fn, args, kind)

    sets = sets if sets is not None else rotations(args)
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with spent("first_call"), torch.cuda.stream(stream):
            fn(*args)  # warm-up outside the graph (lazy initialisation must not be captured)
            reps = calls_per_graph(events_time(lambda: fn(*sets[-1]), 1), len(sets))
        # capture_begin/end rather than ``torch.cuda.graph``, whose entry empties the caching allocator: every
        # timing would hand all cached blocks back to the driver and allocate them anew
        graph = torch.cuda.CUDAGraph()
        with spent("capture"), torch.cuda.stream(stream):
            graph.capture_begin()
            try:
                for r in range(reps):
                    fn(*sets[r % len(sets)])
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        with spent("replay"):
            return replay_time(graph.replay) / reps
    except Exception:  # noqa: BLE001 -- not capturable: time it plainly
        torch.cuda.synchronize()
        return measure(lambda: [fn(*a) for a in sets], (), kind) / len(sets)

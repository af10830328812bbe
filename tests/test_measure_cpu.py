"""The measured choice on the CPU target ``c``: the first call times each region's kernel against its own ops
through torch, keeps the faster, remembers it in the tuning database and the plan says how many regions run as
kernels. Timings are injected (``pipeline.device_time`` or the clock): nothing here depends on this machine's speed."""

from __future__ import annotations

import json

import pytest
import torch

from tilefuse import pipeline
from tilefuse.api import compile_graph
from tilefuse.ir import TensorType
from tilefuse.lowering import timing, tuning_db
from tilefuse.ops import GraphBuilder

C = {"kind": "c"}


def two_region_graph(w: torch.Tensor):
    """One GEMM region (linear + relu) and one row reduction (softmax)."""
    b = GraphBuilder("measure_cpu")
    x = b.input("x", TensorType((16, 32), "float32"))
    z = b.input("z", TensorType((8, 64), "float32"))
    h = b.add1("relu", [b.add1("linear", [x, b.constant("w", w), ""])])
    s = b.add1("softmax", [z], dim=-1)
    return b.build([h, s])


@pytest.fixture
def timings(monkeypatch, tmp_path):
    """A fresh tuning database and a fake device clock: the GEMM region's kernel "takes" 2 ms, every other way
    1 ms; records what was timed."""
    monkeypatch.setenv(tuning_db.DB_ENV, str(tmp_path / "tuning.json"))
    timed = []

    def fake_time(fn, args, kind, sets=None):
        is_kernel = hasattr(fn, "spec")
        timed.append((is_kernel, kind))
        return 2e-3 if is_kernel and fn.spec.template == "gemm" else 1e-3

    monkeypatch.setattr(pipeline, "device_time", fake_time)
    return timed


def _inputs(rng):
    return torch.randn(24, 32, generator=rng), torch.randn(16, 32, generator=rng), torch.randn(8, 64, generator=rng)


def _check(outs, w, x, z):
    h, s = outs
    torch.testing.assert_close(h, torch.relu(x @ w.T), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, torch.softmax(z, dim=-1), rtol=1e-5, atol=1e-6)


def test_first_call_on_c_keeps_the_faster_way_and_remembers_it(timings, tmp_path, rng):
    w, x, z = _inputs(rng)
    compiled = compile_graph(two_region_graph(w), target="c", measure=True)
    assert "2 TileLang, 0 torch" in compiled.plan.summary()  # nothing measured before the first call
    _check(compiled(x, z), w, x, z)
    assert timings and all(kind == "c" for _, kind in timings)
    backends = {r.kind: r.backend for r in compiled.plan.regions if r.launches}
    assert backends["gemm"] == "torch" and [b for k, b in backends.items() if k != "gemm"] == ["tilelang"]
    assert "1 TileLang, 1 torch" in compiled.plan.summary()
    assert any("torch 1.000 ms < kernel 2.000 ms" in n for n in compiled.plan.notes)
    _check(compiled(x, z), w, x, z)  # later calls run the chosen ways, measuring nothing more
    n = len(timings)
    assert n == 4  # two regions, kernel and torch each, once
    choices = {k: v for k, v in json.loads((tmp_path / "tuning.json").read_text()).items() if k.endswith("|choice")}
    assert sorted(v["torch"] for v in choices.values()) == [False, True]
    again = compile_graph(two_region_graph(w), target="c", measure=True)  # the database answers: nothing timed
    _check(again(x, z), w, x, z)
    assert len(timings) == n and "1 TileLang, 1 torch" in again.plan.summary()


def test_measure_off_runs_every_region_as_its_kernel(timings, monkeypatch, rng):
    w, x, z = _inputs(rng)
    monkeypatch.setenv("TILEFUSE_MEASURE", "0")
    compiled = compile_graph(two_region_graph(w), target="c")
    _check(compiled(x, z), w, x, z)
    assert timings == [] and "2 TileLang, 0 torch" in compiled.plan.summary()
    assert compile_graph(two_region_graph(w), target="c", measure=False).runner.first_call is None


def test_measure_is_on_by_default_for_c(timings, monkeypatch, rng):
    """Options.measure unset (no TILEFUSE_MEASURE): the c target measures too."""
    w, x, z = _inputs(rng)
    monkeypatch.delenv("TILEFUSE_MEASURE", raising=False)
    compiled = compile_graph(two_region_graph(w), target="c")
    assert compiled.options.measure and compiled.runner.first_call is not None
    _check(compiled(x, z), w, x, z)
    assert "1 TileLang, 1 torch" in compiled.plan.summary()


def test_cpu_timing_is_the_median_of_enough_calls(monkeypatch):
    """One call in several slowed by a neighbour does not decide: the median does, over at least ``REPS`` calls and
    more for short ones (up to ``CPU_MAX_REPS``)."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    durations = iter([1e-3, 1e-3, 50e-3, 1e-3, 40e-3, 1e-3, 1e-3] + [1e-3] * 100)
    calls = []

    def fn():
        calls.append(1)
        clock[0] += next(durations)

    assert timing.measure(fn, (), "c") == pytest.approx(1e-3)
    warmup = timing.WARMUP["c"]
    want = max(timing.REPS["c"], min(timing.CPU_MAX_REPS, round(timing.CPU_TIME_BUDGET_S / 1e-3)))
    assert len(calls) == warmup + want
    slow = iter([1.0] * 100)
    calls.clear()

    def long_fn():
        calls.append(1)
        clock[0] += next(slow)

    assert timing.measure(long_fn, (), "c") == pytest.approx(1.0)
    assert len(calls) == warmup + timing.REPS["c"]  # long calls: REPS of them, no more


def test_a_cuda_graph_is_replayed_until_the_budget_is_filled():
    """A graph of milliseconds is timed by a few replays, a graph of microseconds by ``REPS``; never fewer than two
    (after a warm-up and a probe), whatever the probe says."""
    budget = timing.CUDA_TIME_BUDGET_S
    for per_replay, want in ((3 * budget, 2), (budget / 1000, timing.REPS["cuda"]), (budget / 5, 5), (5.0, 2)):
        calls, asked = [], []

        def timer(fn, n, per_replay=per_replay, asked=asked):
            asked.append(n)
            for _ in range(n):
                fn()
            return per_replay

        assert timing.replay_time(lambda calls=calls: calls.append(1), timer) == per_replay
        assert asked == [1, want] and len(calls) == 1 + 1 + want


def test_a_timings_graph_holds_fewer_calls_of_a_long_kernel_but_every_operand_copy():
    """Microsecond calls: ``REPS`` of them a graph. A millisecond GEMM: as many as fill ``CUDA_GRAPH_S`` (the zoo
    MLP's measured choice replayed twenty of them four times a timing), but never fewer than the operand copies the
    calls cycle through (each call must find its operands cold) or ``CUDA_GRAPH_MIN_CALLS``."""
    reps, floor = timing.REPS["cuda"], timing.CUDA_GRAPH_MIN_CALLS
    assert timing.calls_per_graph(10e-6, 1) == reps
    assert timing.calls_per_graph(timing.CUDA_GRAPH_S / 8, 1) == 8
    assert timing.calls_per_graph(1e-3, 1) == max(floor, 5)
    assert timing.calls_per_graph(1e-3, 12) == 12 and timing.calls_per_graph(10e-6, 32) == 32
    assert timing.calls_per_graph(5.0, 1) == floor and timing.calls_per_graph(0.0, 1) == reps


def test_demo_says_how_many_regions_run_as_kernels(timings, monkeypatch, capsys):
    """``tilefuse demo`` prints both timings, the speed relative to eager and the share of regions run as TileLang
    kernels: all of them with the measured choice off, fewer where the (injected) timings give regions to torch."""
    from tilefuse import cli

    monkeypatch.setenv("TILEFUSE_TARGET", "c")
    monkeypatch.setenv("TILEFUSE_MEASURE", "0")
    assert cli.main(["demo", "--model", "mlp", "--size", "tiny", "--quiet"]) == 0
    out = capsys.readouterr().out
    (share,) = [ln for ln in out.splitlines() if ln.startswith("TileLang kernels:")]
    n = int(share.split(" of ")[1].split()[0])
    assert n > 0 and share.startswith(f"TileLang kernels: {n} of {n} regions (100%)")
    assert "eager's speed" in out and "OK" in out
    monkeypatch.setenv("TILEFUSE_MEASURE", "1")
    monkeypatch.setattr(pipeline, "device_time", lambda fn, args, kind, sets=None: 2e-3 if hasattr(fn, "spec") else 1e-3)
    assert cli.main(["demo", "--model", "mlp", "--size", "tiny", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"TileLang kernels: 0 of {n} regions (0%); the others run through torch, measured faster there" in out


def test_the_runner_says_where_its_compile_time_went(timings, rng):
    """``PlanRunner.phases``: the pipeline's plan and lower, then the first call's splits, decide and the whole
    measured choice (what bench/compile_time.py and bench_models.py report beside a compile's seconds)."""
    w, x, z = _inputs(rng)
    compiled = compile_graph(two_region_graph(w), target="c", measure=True)
    phases = dict(compiled.runner.phases)
    assert set(phases) == {"plan", "lower"} and all(v >= 0 for v in phases.values())
    _check(compiled(x, z), w, x, z)
    after = compiled.runner.phases
    assert {"splits", "decide", "measured_choice"} <= set(after)
    assert after["measured_choice"] >= after["decide"] and after["plan"] == phases["plan"]
    _check(compiled(x, z), w, x, z)
    assert compiled.runner.phases == after  # later calls add nothing


def test_a_view_read_by_a_kernel_is_timed_with_the_copy_the_kernel_makes(monkeypatch, tmp_path, rng):
    """Through torch a strided slice is a view, free to make; the kernel reading it copies it first. So the measured
    choice times a region of views' torch way with its outputs made dense where a region with a kernel reads them
    (ResNet-50's input permute and shortcut slices ran as views, their copies uncounted), and not where none does (the
    graph's caller gets the view) nor where the region computes (its view may be one the next kernel reads in place:
    ViT's linears into heads)."""
    timed = []

    def fake_time(fn, args, kind, sets=None):
        if not hasattr(fn, "spec"):  # a torch way: what it hands on
            timed.append((type(fn).__name__, all(o.is_contiguous() for o in fn(*args))))
        return 1e-3

    monkeypatch.setattr(pipeline, "device_time", fake_time)
    w = torch.randn(24, 16, generator=rng)
    xv = torch.randn(32, 16, generator=rng)
    for case in ("slice into a GEMM", "slice out", "exp and slice into a GEMM"):
        monkeypatch.setenv(tuning_db.DB_ENV, str(tmp_path / f"tuning_{len(timed)}.json"))  # (nothing remembered)
        timed.append(case)
        b = GraphBuilder("view_then_gemm")
        x = b.input("x", TensorType((32, 16), "float32"))
        xe = b.add1("exp", [x]) if case.startswith("exp") else x
        t = b.add1("slice", [xe], dim=0, start=0, end=None, step=2)  # (ResNet's shortcut: every other pixel)
        into = case.endswith("GEMM")
        g = b.build([b.add1("relu", [b.add1("linear", [t, b.constant("w", w), ""])]) if into else t])
        compiled = compile_graph(g, target="c", measure=True)
        ops = ("exp", "slice") if case.startswith("exp") else ("slice",)
        assert ("elementwise", ops) in [(r.kind, r.ops) for r in compiled.plan.regions if r.launches]
        (got,) = compiled(xv)
        xs = (xv.exp() if case.startswith("exp") else xv)[::2]
        torch.testing.assert_close(got, torch.relu(xs @ w.T) if into else xs, rtol=1e-5, atol=1e-5)
    # the slice's torch way made dense, then the GEMM's; as the graph's output the slice's is left a view, and so is
    # the computing region's
    assert timed == ["slice into a GEMM", ("Dense", True), ("NodesFn", True), "slice out", ("NodesFn", False),
                     "exp and slice into a GEMM", ("NodesFn", False), ("NodesFn", True)]

"""Tuning on the ``c`` target: the database, candidates measured and stored, database hits measure nothing."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import torch

from tilefuse import pipeline
from tilefuse.api import compile_graph
from tilefuse.config import Options
from tilefuse.ir import TensorType
from tilefuse.lowering import timing, tune, tuning_db
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.lower import make_prim_func
from tilefuse.lowering.split import split
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import build_runner, plan, splits_step
from tilefuse.runtime.kernels import SplitRegion
from tilefuse.runtime.plan_runner import PlanRunner

C = {"kind": "c"}


def small_graph():
    """One GEMM region (linear + relu) and one row reduction (softmax)."""
    b = GraphBuilder("tune_small")
    x = b.input("x", TensorType((16, 32), "float32"))
    z = b.input("z", TensorType((8, 64), "float32"))
    h = b.add1("relu", [b.add1("linear", [x, b.constant("w", torch.randn(24, 32)), ""])])
    s = b.add1("softmax", [z], dim=-1)
    return b.build([h, s])


def specs_by_template(graph) -> dict[str, KernelSpec]:
    p = plan(graph, C)
    specs = [build(r, p.graph, C) for r in p.regions if r.backend == "tilelang"]
    return {s.template: s for s in specs if isinstance(s, KernelSpec)}


@pytest.fixture
def counted(monkeypatch):
    """Counts timed candidates."""
    calls = []
    real = timing.measure

    def measure(kernel, args, kind):
        calls.append(kind)
        return real(kernel, args, kind)

    monkeypatch.setattr(timing, "measure", measure)
    return calls


def test_db_round_trip_and_atomic_writes(tmp_path):
    spec = specs_by_template(small_graph())["gemm"]
    db = tuning_db.TuningDB(tmp_path / "sub" / "tuning.json")
    assert db.get(spec, C) is None
    db.put(spec, C, {"config": {"block_M": 32}, "seconds": 1e-3})
    again = tuning_db.TuningDB(db.path)
    assert again.get(spec, C)["config"] == {"block_M": 32}
    assert again.get(spec, {"kind": "cuda", "arch": "sm_90a"}) is None  # keyed by target
    key = tuning_db.db_key(spec, C)
    assert key.startswith("gemm|") and "tilelang-" in key
    # Concurrent writers of different entries: the file is always whole JSON and keeps every entry.
    other = [tuning_db.TuningDB(db.path) for _ in range(8)]
    threads = [threading.Thread(target=o.put, args=(spec, {"kind": "c", "n": i}, {"config": {"i": i}}))
               for i, o in enumerate(other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = json.loads(db.path.read_text())
    assert len(data) == 9
    assert not [p for p in db.path.parent.iterdir() if p.name.endswith(".tmp")]


def test_corrupt_db_is_reset_with_a_warning(tmp_path, caplog):
    spec = specs_by_template(small_graph())["row_reduction"]
    path = tmp_path / "tuning.json"
    path.write_text('{"half a file": ')
    with caplog.at_level(logging.WARNING, logger="tilefuse"):
        db = tuning_db.TuningDB(path)
        assert db.get(spec, C) is None
    assert "not valid" in caplog.text and (tmp_path / "tuning.json.corrupt").exists()
    db.put(spec, C, {"config": {"block_rows": 1}})
    assert tuning_db.TuningDB(path).get(spec, C)["config"] == {"block_rows": 1}


@pytest.mark.parametrize("template", ["gemm", "row_reduction"])
def test_tune_spec_measures_then_hits(tmp_path, counted, template):
    spec = specs_by_template(small_graph())[template]
    db = tuning_db.TuningDB(tmp_path / "tuning.json")
    configs = tune.candidates(spec, C, 3)
    assert 2 <= len(configs) <= 3
    first = tune.tune_spec(spec, C, 3, db)
    assert first.source == "measured" and first.measured == len(configs) == len(counted), first.failed
    assert first.config in configs and first.seconds > 0
    make_prim_func(spec, C, first.config)  # a config the template takes
    assert tuning_db.TuningDB(db.path).get(spec, C)["config"] == first.config
    second = tune.tune_spec(spec, C, 3, tuning_db.TuningDB(db.path))
    assert (second.source, second.config, second.measured) == ("db", first.config, 0)
    assert len(counted) == len(configs)  # the hit timed nothing


@pytest.mark.parametrize("faster,kept", [(0.97, True), (1.0 / (1 + tune.KEEP_PICK_MARGIN) - 0.01, False)])
def test_a_candidate_replaces_the_untuned_pick_only_when_faster_by_the_margin(monkeypatch, faster, kept):
    """The untuned pick (not necessarily the first candidate) stays unless another runs ``KEEP_PICK_MARGIN`` faster:
    a kernel timed alone is not the kernel in the model."""
    spec = specs_by_template(small_graph())["gemm"]
    pick = tune.default_config(spec, C)
    configs = [{"block_M": -1}, pick, {"block_M": -2}]
    job = tune._Job(spec, configs, idx=[0, 1, 2], funcs=[None] * 3)
    monkeypatch.setattr(tune, "time_candidates", lambda job, target, deadline: (
        [(2.0, 0), (1.0, 1), (faster, 2)], {}))
    got = tune._race(job, C, None)
    assert got.config == (pick if kept else configs[2]) and got.seconds == (1.0 if kept else faster)
    monkeypatch.setattr(tune, "time_candidates", lambda job, target, deadline: ([], {0: "run: failed"}))
    none_ran = tune._race(job, C, None)  # nothing ran: the untuned pick, not the first candidate
    assert (none_ran.config, none_ran.seconds, none_ran.failed) == (pick, None, {0: "run: failed"})


def test_configs_come_from_the_database_only_when_tuning(tmp_path):
    """The configs step: untuned compiles never read a database; tuned ones take its winners for their target."""
    graph = small_graph()
    planned = pipeline.plan_step(graph, Options(target=C))
    name, spec = next((r, s) for r, s in planned.specs.items() if s.template == "gemm")
    db = tuning_db.TuningDB(tmp_path / "tuning.json")
    db.put(spec, C, {"config": {"block_M": 64}})
    assert pipeline.configs_step(planned, Options(target=C, tune="none"), db) == ({}, db)
    assert tune.tuned_configs(planned.specs, C, db) == {name: {"block_M": 64}}
    assert tune.tuned_configs(planned.specs, {"kind": "cuda", "arch": "sm_90a"}, db) == {}


def test_second_compile_is_a_db_hit(tmp_path, monkeypatch, counted):
    monkeypatch.setenv(tuning_db.DB_ENV, str(tmp_path / "tuning.json"))
    graph = small_graph()
    args = [torch.randn(16, 32), torch.randn(8, 64)]
    first = compile_graph(graph, target="c", tune="fast")
    n = len(counted)
    assert n >= 2  # both kernels had several candidates
    entries = json.loads((tmp_path / "tuning.json").read_text())
    assert sorted(e["template"] for e in entries.values()) == ["gemm", "row_reduction"]
    second = compile_graph(graph, target="c", tune="fast")
    assert len(counted) == n
    for g, w in zip(second(*args), first(*args)):
        torch.testing.assert_close(g, w)


def test_unknown_tune_mode(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_db.DB_ENV, str(tmp_path / "tuning.json"))
    with pytest.raises(ValueError, match="unknown tune mode 'fastest'"):
        compile_graph(small_graph(), target="c", tune="fastest")


def test_choose_backends_gives_losing_kernels_back_to_torch(tmp_path, monkeypatch, rng):
    """The measured choice: a region whose kernel times slower than its own ops through torch runs through
    torch (said in the plan's notes, outputs unchanged); the choice is stored, so a second compile measures
    nothing."""
    graph = small_graph()
    runner = build_runner(graph, Options(target=C, cuda_graphs=False))
    gemm = next(r.name for r in runner.plan.regions if r.kind == "gemm")
    timed = []

    def fake_time(fn, args, kind, sets=None):  # the GEMM kernel "loses", everything else wins
        is_kernel = hasattr(fn, "spec")
        timed.append(is_kernel)
        slow = is_kernel and fn.region.name == gemm
        return 2e-3 if slow else 1e-3

    monkeypatch.setattr(pipeline, "device_time", fake_time)
    x, z = torch.randn(16, 32, generator=rng), torch.randn(8, 64, generator=rng)
    want = runner.run(x, z)
    db = tuning_db.TuningDB(tmp_path / "t.json")
    lines = pipeline.choose(runner, (x, z), db, C)
    assert len(lines) == 1 and lines[0].startswith(f"{gemm}: torch 1.000 ms < kernel 2.000 ms"), lines
    assert {r.name: r.backend for r in runner.plan.regions}[gemm] == "torch"
    assert any("measured" in n for n in runner.plan.notes)
    assert gemm not in runner.kernels and len(timed) == 4  # two regions, kernel and torch each
    for got, ref in zip(runner.run(x, z), want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    again = build_runner(graph, Options(target=C, cuda_graphs=False))
    assert pipeline.choose(again, (x, z), tuning_db.TuningDB(db.path), C) == lines[:1] and len(timed) == 4


# (After conftest's COUNT_COMPILES, through the ``child_script`` fixture.)
WARM_CHILD = r'''
import torch
import tilefuse
from tilefuse import models
from tilefuse.lowering import timing
measured = []
_measure = timing.measure
timing.measure = lambda *a, **k: measured.append(1) or _measure(*a, **k)
model, inputs = models.build("mlp", "tiny")
t = time.perf_counter()
with torch.no_grad():
    out = tilefuse.compile(model, target="c", tune="fast")(*inputs)
print(json.dumps({"compiles": len(compiles), "measured": len(measured), "seconds": time.perf_counter() - t,
                  "max_err": float((out - model(*inputs)).abs().max())}))
'''


def test_second_compile_in_a_fresh_process_tunes_and_compiles_nothing(tmp_path, child_script):
    """Tuning database, PrimFunc cache and TileLang's kernel cache on disk: a second process compiling the same
    model with ``tune="fast"`` measures no candidate and compiles no kernel (on ``c``: no gcc; on CUDA: no nvcc)."""
    import os
    import subprocess
    import sys

    script = child_script(WARM_CHILD)
    env = {**os.environ, "TILEFUSE_TUNING_DB": str(tmp_path / "tuning.json"), "TILEFUSE_FUNC_CACHE": "1",
           "TILEFUSE_FUNC_CACHE_DIR": str(tmp_path / "funcs"), "TILELANG_CACHE_DIR": str(tmp_path / "tl")}

    def child():
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert cold["compiles"] > 0 and cold["measured"] > 0, cold
    assert warm["compiles"] == 0 and warm["measured"] == 0, warm
    assert cold["max_err"] < 1e-4 and warm["max_err"] < 1e-4
    print(f"cold {cold['seconds']:.2f} s, warm {warm['seconds']:.2f} s")


def epilogue_graph(k: int = 32, n: int = 24):
    """One GEMM region with a two-op epilogue reading another input: silu(linear(x)) * g (LLaMA's gate)."""
    b = GraphBuilder("tune_split")
    x = b.input("x", TensorType((16, k), "float32"))
    g = b.input("g", TensorType((16, n), "float32"))
    y = b.add1("linear", [x, b.constant("w", torch.randn(n, k)), ""])
    return b.build([b.add1("mul", [b.add1("silu", [y]), g])])


def test_split_runs_the_gemm_through_torch_and_the_epilogue_as_one_kernel(rng):
    p = plan(epilogue_graph(), C)
    (gemm,) = [r for r in p.regions if r.kind == "gemm"]
    head, tail = split(p, gemm)
    assert [p.graph.nodes[[n.name for n in p.graph.nodes].index(m)].op for m in head.nodes] == ["linear"]
    assert tail.kind == "elementwise" and set(tail.ops) >= {"silu", "mul"} and tail.outputs == gemm.outputs
    (fn,) = splits_step(p, [gemm], C).values()
    x, g = torch.randn(16, 32, generator=rng), torch.randn(16, 24, generator=rng)
    want = PlanRunner(p).run(x, g)
    runner = PlanRunner(p)
    runner.fns[p.regions.index(gemm)] = fn
    torch.testing.assert_close(runner.run(x, g), want, rtol=1e-5, atol=1e-5)
    single = plan(small_graph(), C)  # relu alone after the GEMM: nothing to gain, no split
    assert split(single, next(r for r in single.regions if r.kind == "gemm")) is None


def test_choose_backends_takes_the_split_where_it_is_fastest(tmp_path, monkeypatch, rng):
    graph = epilogue_graph()
    runner = build_runner(graph, Options(target=C, cuda_graphs=False))
    gemm = next(r.name for r in runner.plan.regions if r.kind == "gemm")
    timed = []

    def fake_time(fn, args, kind, sets=None):  # fused kernel 2 ms, its ops through torch 1.5 ms, the split 1 ms
        timed.append(type(fn).__name__)
        return {"SplitRegion": 1e-3, "RegionKernel": 2e-3}.get(type(fn).__name__, 1.5e-3)

    monkeypatch.setattr(pipeline, "device_time", fake_time)
    x, g = torch.randn(16, 32, generator=rng), torch.randn(16, 24, generator=rng)
    want = runner.run(x, g)
    db = tuning_db.TuningDB(tmp_path / "t.json")
    lines = pipeline.choose(runner, (x, g), db, C)
    assert len(lines) == 1 and lines[0].startswith(f"{gemm}: split 1.000 ms"), lines
    k = [r.name for r in runner.plan.regions].index(gemm)
    assert isinstance(runner.fns[k], SplitRegion) and runner.kernels[gemm] is runner.fns[k]
    assert runner.plan.regions[k].backend == "split"
    assert any("epilogue as a TileLang kernel" in n for n in runner.plan.notes)
    torch.testing.assert_close(runner.run(x, g), want, rtol=1e-5, atol=1e-5)
    n = len(timed)
    again = build_runner(graph, Options(target=C, cuda_graphs=False))  # the stored choice: nothing timed
    assert pipeline.choose(again, (x, g), tuning_db.TuningDB(db.path), C) == lines and len(timed) == n
    assert isinstance(again.fns[k], SplitRegion)
    torch.testing.assert_close(again.run(x, g), want, rtol=1e-5, atol=1e-5)


def test_the_split_tails_compile_in_the_plans_batch_not_at_the_first_call(tmp_path, monkeypatch, rng):
    """``lower_step``'s ``prefetch``: where the measured choice will run, each split tail compiles in the plan's own
    batch, and the first call's choice compiles nothing more (its batch came after the plan's)."""
    from tilefuse.lowering import lower as lower_mod

    batches = []
    real = lower_mod.compile_many

    def counted(funcs, *a, **kw):
        funcs = list(funcs)
        batches.append(len(funcs))
        return real(funcs, *a, **kw)

    monkeypatch.setattr(lower_mod, "compile_many", counted)
    timings = {"SplitRegion": 1e-3, "RegionKernel": 2e-3}  # (torch's ops: 1.5 ms)
    monkeypatch.setattr(pipeline, "device_time", lambda fn, *a, **kw: timings.get(type(fn).__name__, 1.5e-3))
    graph = epilogue_graph(36, 20)  # (shapes no other test compiles: nothing from this process's cache)
    runner = build_runner(graph, Options(target=C, cuda_graphs=False, measure=True))
    assert batches == [2], batches  # the region's kernel and its split's tail
    x, g = torch.randn(16, 36, generator=rng), torch.randn(16, 20, generator=rng)
    want = runner.run(x, g)
    lines = pipeline.choose(runner, (x, g), tuning_db.TuningDB(tmp_path / "t.json"), C)
    assert batches == [2] and len(lines) == 1 and ": split 1.000 ms" in lines[0], (batches, lines)
    torch.testing.assert_close(runner.run(x, g), want, rtol=1e-5, atol=1e-5)
    batches.clear()
    build_runner(epilogue_graph(44, 28), Options(target=C, cuda_graphs=False, measure=False))
    assert batches == [1], batches  # no measured choice: no tail compiled


@pytest.mark.gpu
def test_split_on_the_gpu_matches_the_region(rng):
    """The split's epilogue kernel on the GPU: the region's outputs, fresh inputs, every element."""
    from tilefuse.config import default_target
    target = default_target()
    p = plan(epilogue_graph(), target)
    (gemm,) = [r for r in p.regions if r.kind == "gemm"]
    (fn,) = splits_step(p, [gemm], target).values()
    x, g = (torch.randn(s, generator=rng).cuda() for s in ((16, 32), (16, 24)))
    runner = PlanRunner(p)
    want = runner.run(x, g)
    runner.fns[p.regions.index(gemm)] = fn
    torch.testing.assert_close(runner.run(x, g), want, rtol=1e-5, atol=1e-5)


def test_a_split_region_is_saved_and_loads_split(tmp_path, monkeypatch, rng):
    """The plan says ``split``; an artifact keeps the epilogue's kernel and loads the region split again, without
    compiling, with the same outputs."""
    import tilefuse
    monkeypatch.setattr(pipeline, "device_time", lambda fn, args, kind, sets=None: {"SplitRegion": 1e-3}.get(type(fn).__name__, 2e-3))
    compiled = compile_graph(epilogue_graph(), target="c")
    x, g = torch.randn(16, 32, generator=rng), torch.randn(16, 24, generator=rng)
    want = compiled(x, g)
    pipeline.choose(compiled.runner, (x, g), tuning_db.TuningDB(tmp_path / "t.json"), C)
    (gemm,) = [r for r in compiled.plan.regions if r.kind == "gemm"]
    assert gemm.backend == "split" and "1 split" in compiled.plan.summary()
    loaded = tilefuse.load(tilefuse.save(compiled, tmp_path / "m.tfz"))
    assert loaded.load_report.compiled == 0
    (back,) = [r for r in loaded.plan.regions if r.kind == "gemm"]
    assert back.backend == "split" and isinstance(loaded.runner.fns[loaded.plan.regions.index(back)], SplitRegion)
    for got, ref in zip(loaded(x, g), want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)

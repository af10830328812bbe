"""bench/bench_models.py on the CPU: every contender timed again in turns (the GPU's clock follows its power cap, so
what ran one after the other is not compared fairly), and the GEMM bar's lines from the kernel profiles."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_models


def test_every_contender_is_timed_in_turns_in_reversed_orders_and_takes_its_median(monkeypatch):
    order, calls = [], {"a": 0, "b": 0, "c": 0}
    drift = iter(range(100))  # each later turn slower by 1 ms, whoever runs: a GPU warming up

    def fn(key):
        def call():
            calls[key] += 1
        call.key = key
        return call

    def timed(f, *args, reps):
        order.append(f.key)
        return {"a": 10.0, "b": 20.0, "c": 30.0}[f.key] + next(drift)
    monkeypatch.setattr(bench_models, "cuda_time_ms", timed)
    monkeypatch.setattr(bench_models, "profile", lambda f, *a: {"busy_ms": {"a": 1.0, "b": 2.0, "c": 3.0}[f.key],
                                                                 "by_category_ms": {"gemm": 0.5}})
    monkeypatch.setattr(bench_models.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_models, "ROUNDS", 3)
    row = {"model": "m", "tilefuse": {"none": {"ms": 1.0}, "fast": {"ms": 2.0}}, "peers": {"default": {"ms": 3.0}}}
    fns = {("tilefuse", "none"): fn("a"), ("tilefuse", "fast"): fn("b"), ("peers", "default"): fn("c")}
    bench_models.in_turns(row, fns, (), reps=5)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert calls == {"a": 1, "b": 1, "c": 1}  # each called once first (a recompile after a dynamo reset lands there)
    assert row["tilefuse"]["none"]["ms_turns"] == [10.0, 15.0, 16.0] and row["tilefuse"]["none"]["ms"] == 15.0
    assert row["peers"]["default"]["ms_turns"] == [32.0, 33.0, 38.0] and row["peers"]["default"]["ms"] == 33.0
    assert row["tilefuse"]["fast"]["ms_alone"] == 2.0  # the first, alone, measurement kept beside
    # profiled in turns too: tilefuse's plans and the best peer (the only one here)
    assert all("profile" in row[s][k] for s, k in fns)


def test_the_gemm_bar_compares_the_profiled_gemms_with_and_without_the_elementwise_kernels():
    def prof(**cats):
        return {"by_category_ms": cats}
    row = {"model": "bert", "tilefuse": {"none": {"profile": prof(gemm=4.8, elementwise=0.1)}},
           "peers": {"default": {"ms": 7.0, "profile": prof(gemm=4.0, elementwise=0.9)},
                     "eager": {"ms": 9.0, "profile": prof(gemm=1.0)}}}
    (line,) = bench_models.gemm_lines([row])
    assert "against default's 4.000: 1.200x (over 5%)" in line and "4.900 against 4.900: 1.000x" in line
    row["tilefuse"]["none"]["profile"] = prof(gemm=4.1)
    assert "(within 5%)" in bench_models.gemm_lines([row])[0]
    assert bench_models.gemm_lines([{**row, "peers": {"default": {"ms": 7.0}}}]) == []  # no peer profiled: no line

"""Regions the measured choice runs through the library get no kernel built (``pipeline.library_regions``): a stored
choice of torch or the split, or, with none stored, a template's profitability rule (``conv.library_first``); the
choice then weighs torch against the split alone, and the outputs are the region's."""

from __future__ import annotations

import pytest
import torch
from test_tune import C, epilogue_graph

from tilefuse import pipeline
from tilefuse.config import Options
from tilefuse.lowering import tuning_db
from tilefuse.lowering.templates import conv
from tilefuse.pipeline import build_runner
from tilefuse.runtime.kernels import SplitRegion

CUDA = {"kind": "cuda", "arch": "sm_90a"}


def conv_params(c: int = 64, k: int = 3, layout: str = "NHWC", dtype: str = "float16", **kw) -> dict:
    x = (8, 28, 28, c) if layout == "NHWC" else (8, c, 28, 28)
    return {"x_shape": x, "w_shape": (128, c, k, k), "stride": (1, 1), "padding": (k // 2,) * 2, "dilation": (1, 1),
            "in_dtype": dtype, "layout": layout, **({"weight_layout": "OIHW"} if layout == "NHWC" else {}), **kw}


def test_the_conv_rule_names_the_measured_losers_only():
    assert "0.15-0.37x cuDNN" in conv.library_first(conv_params(), CUDA)
    assert conv.library_first(conv_params(512, dtype="bfloat16"), CUDA)
    assert conv.library_first(conv_params(), C) is None  # the CPU: no library to lead
    assert conv.library_first(conv_params(3, 7), CUDA) is None  # the stem: left to the measurement
    assert conv.library_first(conv_params(64, 1), CUDA) is None
    assert conv.library_first(conv_params(layout="NCHW"), CUDA) is None  # not measured
    assert conv.library_first(conv_params(dtype="float32"), CUDA) is None
    assert conv.library_first(conv_params(groups=2), CUDA) is None
    assert conv.library_first(conv_params(transposed=True), CUDA) is None


@pytest.fixture
def batches(monkeypatch):
    """The regions whose kernels each ``lower`` call of the pipeline is asked for (compiled or from a cache)."""
    seen = []
    real = pipeline.lower

    def recorded(specs, *a, **kw):
        seen.append(sorted(specs))
        return real(specs, *a, **kw)

    monkeypatch.setattr(pipeline, "lower", recorded)
    return seen


@pytest.mark.parametrize("split_ms, runs", [(1e-3, "split"), (3e-3, "torch")])
def test_a_region_the_library_leads_is_not_built_and_takes_the_faster_of_torch_and_the_split(
        tmp_path, monkeypatch, rng, batches, split_ms, runs):
    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path / "t.json"))
    monkeypatch.setattr(pipeline, "library_first", lambda spec, target: "the library leads" if spec.template ==
                        "gemm" else None)
    timed = []

    def fake_time(fn, args, kind, sets=None):  # its ops through torch 1.5 ms
        timed.append(type(fn).__name__)
        return {"SplitRegion": split_ms}.get(type(fn).__name__, 1.5e-3)

    monkeypatch.setattr(pipeline, "device_time", fake_time)
    n = 14 if runs == "split" else 22  # (tails of shapes no other test compiles: test_tune's count theirs)
    graph = epilogue_graph(40, n)
    runner = build_runner(graph, Options(target=C, cuda_graphs=False, measure=True))
    (gemm,) = [r for r in runner.plan.regions if r.kind == "gemm"]
    assert gemm.name not in runner.kernels and gemm.backend == "torch"
    assert batches == [[f"{gemm.name} (split tail)"]], batches  # the plan's batch: the split's tail alone
    x, g = torch.randn(16, 40, generator=rng), torch.randn(16, n, generator=rng)
    with torch.no_grad():
        want = torch.nn.functional.silu(x @ graph.constants["w"].T) * g
    out = runner(x, g)[0]  # the first call makes the measured choice
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert sorted(timed) == ["NodesFn", "SplitRegion"]  # no kernel to time
    k = [r.name for r in runner.plan.regions].index(gemm.name)
    assert runner.plan.regions[k].backend == runs
    assert isinstance(runner.fns[k], SplitRegion) == (runs == "split")
    note = next(n for n in runner.plan.notes if n.startswith(gemm.name))
    assert "no kernel built" in note, note
    torch.testing.assert_close(runner(x, g)[0], want, rtol=1e-5, atol=1e-5)
    # a second compile reads the stored choice: nothing timed, the kernel still not built
    timed.clear()
    again = build_runner(graph, Options(target=C, cuda_graphs=False, measure=True))
    assert gemm.name not in again.kernels and gemm.name not in batches[-1]
    torch.testing.assert_close(again(x, g)[0], want, rtol=1e-5, atol=1e-5)
    assert timed == [] and again.plan.regions[k].backend == runs


def test_a_stored_choice_decides_what_is_built(tmp_path, monkeypatch, rng, batches):
    """No rule: a stored choice of torch or the split builds no kernel for the region, a stored kernel builds it."""
    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path / "t.json"))
    monkeypatch.setattr(pipeline, "device_time", lambda fn, *a, **kw: {"SplitRegion": 1e-3, "RegionKernel": 2e-3}.get(
        type(fn).__name__, 1.5e-3))
    graph = epilogue_graph(52, 30)
    first = build_runner(graph, Options(target=C, cuda_graphs=False, measure=True))
    (gemm,) = [r for r in first.plan.regions if r.kind == "gemm"]
    assert gemm.name in first.kernels
    spec = first.kernels[gemm.name].spec
    x, g = torch.randn(16, 52, generator=rng), torch.randn(16, 30, generator=rng)
    want = first(x, g)[0]
    db = tuning_db.TuningDB()
    assert db.get(spec, C, "choice")["split"] is True
    again = build_runner(graph, Options(target=C, cuda_graphs=False, measure=True))
    assert gemm.name not in again.kernels and gemm.name not in batches[-1]
    torch.testing.assert_close(again(x, g)[0], want, rtol=1e-5, atol=1e-5)
    k = [r.name for r in again.plan.regions].index(gemm.name)
    assert again.plan.regions[k].backend == "split" and isinstance(again.fns[k], SplitRegion)
    db.put(spec, C, {"torch": False, "split": False, "kernel_ms": 1.0, "torch_ms": 2.0, "split_ms": 2.0}, "choice")
    kept = build_runner(graph, Options(target=C, cuda_graphs=False, measure=True))
    assert gemm.name in kept.kernels and gemm.name in batches[-1]
    torch.testing.assert_close(kept(x, g)[0], want, rtol=1e-5, atol=1e-5)
    assert kept.plan.regions[k].backend == "tilelang"

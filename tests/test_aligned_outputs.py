"""planner.layout.aligned_gemm_outputs: a large linear whose output rows are not 16-byte aligned computes padded rows on
GPU targets, and its value is the first N columns: the same values, names and shapes, only the rows' stride differs.

Fresh random inputs each run; every output element compared (fp32: rtol 1e-5).
"""

from __future__ import annotations

import pytest
import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import run_graph
from tilefuse.pipeline import plan
from tilefuse.planner import FusionPlan, Region, layout
from tilefuse.planner.layout import ALIGN_MIN_ROWS, aligned_gemm_outputs
from tilefuse.runtime.plan_runner import MAX_EAGER_TAIL, eager_tail

CUDA = {"kind": "cuda", "arch": "sm_90a"}


def _head(rng, rows: int, n: int, dtype: str = "float32", bias: bool = True, k: int = 64):
    """x -> linear (a vocabulary head) -> relu, and the head's output itself."""
    b = GraphBuilder("head")
    x = b.input("x", TensorType((rows // 4, 4, k), dtype))
    w = b.input("w", TensorType((n, k), dtype))
    bb = b.input("b", TensorType((n,), dtype)) if bias else ""
    y = b.add1("linear", [x, w, bb])
    return b.build([y, b.add1("relu", [y])])


def _args(rng, g):
    return [torch.randn(*v.type.shape, generator=rng, dtype=getattr(torch, v.type.dtype)) for v in g.inputs]


@pytest.mark.parametrize("bias", [True, False])
def test_padded_head_keeps_values_names_and_shapes(rng, bias):
    g = _head(rng, ALIGN_MIN_ROWS, 37, bias=bias)  # 37 fp32 = 148 bytes a row
    g2 = aligned_gemm_outputs(g, CUDA)
    assert g2.outputs == g.outputs
    ops = [n.op for n in g2.nodes]
    assert ops.count("pad") == (2 if bias else 1) and "slice" in ops
    (lin,) = [n for n in g2.nodes if n.op == "linear"]
    assert lin.outputs[0].type.shape[-1] == 40  # rounded up to 16 bytes
    args = _args(rng, g)
    for want, got in zip(run_graph(g, *args), run_graph(g2, *args)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert run_graph(g2, *args)[0].stride() == (4 * 40, 40, 1)  # a view of the padded rows


@pytest.mark.parametrize("case", ["aligned", "few rows", "cpu", "odd k", "float64"])
def test_left_alone(rng, case):
    rows, n, target, k, dtype = ALIGN_MIN_ROWS, 37, CUDA, 64, "float32"
    if case == "aligned":
        n = 40
    elif case == "few rows":
        rows = 64  # a decode step: the weight's copy would cost as much as the product
    elif case == "cpu":
        target = {"kind": "c"}
    elif case == "odd k":
        k = 63  # the operands are not aligned either: padding N alone buys nothing
    elif case == "float64":
        dtype = "float64"  # no tensor-core GEMM to gain
    g = _head(rng, rows, n, dtype, k=k)
    assert aligned_gemm_outputs(g, target) is g


def test_half_head_planned_for_cuda(rng):
    """On a GPU target the plan runs the padded weight's copy, then the GEMM on aligned rows with the slice after it;
    fp16 rows of 50257 (GPT-2's vocabulary) round up to 50264."""
    g = _head(rng, ALIGN_MIN_ROWS, 50257, "float16", k=64)
    p = plan(g, CUDA)
    lin = next(n for n in p.graph.nodes if n.op == "linear")
    assert lin.outputs[0].type.shape[-1] == 50264
    gemm = next(r for r in p.regions if r.kind == "gemm")
    assert "linear" in gemm.ops
    assert any("pad" in r.ops for r in p.regions)
    assert p.graph.outputs == g.outputs
    assert {v.name: v.type for v in p.graph.inputs} == {v.name: v.type for v in g.inputs}


def test_compiled_head_runs_padded(monkeypatch, rng):
    """End to end through ``torch.compile`` (the pass let onto ``c`` here: the runner, the kernel and the torch path
    of a padded head are the same code on every target): eager's values; the head's own output is a view of the
    padded rows where the kernel made it."""
    monkeypatch.setattr(layout, "ALIGN_TARGETS", ("cuda", "hip", "c"))
    head = torch.nn.Linear(64, 37)
    x = torch.randn(4, ALIGN_MIN_ROWS // 4, 64, generator=rng)
    for measure in (False, True):
        torch._dynamo.reset()
        runners: list = []
        backend = make_backend(Options(target=parse_target("c"), quiet=True, measure=measure, observer=runners.append))
        with torch.no_grad():
            got = torch.compile(lambda v: (head(v), torch.relu(head(v)) * 2), backend=backend)(x)
            want = (head(x), torch.relu(head(x)) * 2)
        assert backend.failures == [] and runners
        lins = [n for r in runners for n in r.plan.graph.nodes if n.op == "linear"]
        assert lins and all(n.outputs[0].type.shape[-1] == 40 for n in lins)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        if not measure:
            assert got[0].stride() == (40 * ALIGN_MIN_ROWS // 4, 40, 1)


def _view_tail_plan(launching_after: int):
    """linear -> slice (a view region) -> the output, with ``launching_after`` elementwise regions writing outputs
    after it."""
    t = TensorType((8, 8), "float32")
    b = GraphBuilder("tail")
    x = b.input("x", t)
    h = b.add1("linear", [x, b.constant("weight", torch.randn(8, 8)), ""], name="h")
    s = b.add1("slice", [h], name="s", dim=1, start=0, end=5, step=1)
    outs, regions = [s], [Region("linear_0", "gemm", ("h",), ("linear",), (x, "weight"), (h,), "h", None, "tilelang"),
                          Region("slice_1", "view", ("s",), ("slice",), (h,), (s,), None, None, "torch")]
    for k in range(launching_after):
        y = b.add1("relu", [x], name=f"y{k}")
        outs.append(y)
        regions.append(Region(f"relu_{k + 2}", "elementwise", (f"y{k}",), ("relu",), (x,), (y,), None, None, "tilelang"))
    return FusionPlan(b.build(outs), tuple(regions))


def test_eager_tail_takes_a_views_producer_or_is_none():
    """A view region handed to the caller from the eager tail would alias the CUDA graph's memory, which the next
    replay overwrites: the region making its input joins the tail, and where the tail is full, there is none."""
    assert eager_tail(_view_tail_plan(0)) == 0  # the GEMM and its view both after the replay
    assert eager_tail(_view_tail_plan(1)) == 0
    p = _view_tail_plan(MAX_EAGER_TAIL)  # the tail is full before the GEMM: no tail (outputs copied out)
    assert eager_tail(p) == len(p.regions)


def test_training_step_through_a_padded_head(monkeypatch, rng):
    """A training step (forward and backward graphs) with the head padded: eager's loss and gradients, where the
    logits autograd saves and hands on are a view of padded rows."""
    monkeypatch.setattr(layout, "ALIGN_TARGETS", ("cuda", "hip", "c"))
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=rng)))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 37))
    twin = torch.nn.Sequential(*(torch.nn.Linear(m.in_features, m.out_features) if isinstance(m, torch.nn.Linear)
                                 else torch.nn.GELU() for m in model))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(ALIGN_MIN_ROWS + 24, 64, generator=rng)
    target = torch.randint(0, 37, (ALIGN_MIN_ROWS + 24,), generator=rng)
    torch._dynamo.reset()
    runners: list = []
    backend = make_backend(Options(target=parse_target("c"), quiet=True, measure=False, observer=runners.append))
    step = torch.compile(lambda m, v, t: torch.nn.functional.cross_entropy(m(v), t), backend=backend)
    got = step(model, x, target)
    got.backward()
    want = torch.nn.functional.cross_entropy(twin(x), target)
    want.backward()
    assert backend.failures == []
    assert any(n.op == "pad" for r in runners for n in r.plan.graph.nodes)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_a_constant_weight_is_padded_once_at_plan_time(rng):
    """An ONNX model's head: the weight and bias are constants, padded when the graph is planned (no copy per call),
    and the unpadded copies leave the graph."""
    b = GraphBuilder("onnx_head")
    x = b.input("x", TensorType((ALIGN_MIN_ROWS, 64), "float32"))
    w = b.constant("w", torch.randn(37, 64, generator=rng))
    bias = b.constant("b", torch.randn(37, generator=rng))
    g = b.build([b.add1("linear", [x, w, bias])])
    g2 = aligned_gemm_outputs(g, CUDA)
    assert [n.op for n in g2.nodes] == ["linear", "slice"]
    assert set(g2.constants) == {"w_padded", "b_padded"}
    assert g2.constants["w_padded"].shape == (40, 64) and (g2.constants["w_padded"][37:] == 0).all()
    args = _args(rng, g)
    torch.testing.assert_close(run_graph(g2, *args)[0], run_graph(g, *args)[0], rtol=1e-5, atol=1e-5)

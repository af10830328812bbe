"""Planner: patterns, legality, regions on small graphs (before -> expected), plans run correctly."""

import math

import pytest
import torch

from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan
from tilefuse.planner.legality import Facts, creates_cycle
from tilefuse.runtime.plan_runner import PlanRunner

F32 = "float32"


def regions(p):
    return [(r.kind, " ".join(r.ops)) for r in p.regions if r.kind != "view"]


def scalar(b, v, dtype=torch.float32):
    return b.constant("c", torch.tensor(v, dtype=dtype))


def check_runs(graph, p, *args):
    torch.testing.assert_close(PlanRunner(p)(*args), Executor(graph)(*args), rtol=1e-5, atol=1e-5)


def test_mlp_block_regions(rng):
    b = GraphBuilder("block")
    x = b.input("x", TensorType((6, 16), F32))
    w1, b1 = b.constant("w1", torch.randn(32, 16)), b.constant("b1", torch.randn(32))
    w2 = b.constant("w2", torch.randn(16, 32))
    ln_w, ln_b = b.constant("ln_w", torch.rand(16) + 0.5), b.constant("ln_b", torch.randn(16))
    h = b.add1("linear", [x, w1, b1])
    h = b.add1("gelu", [h], approximate="tanh")
    h = b.add1("linear", [h, w2, ""])
    r = b.add1("add", [h, x])
    y = b.add1("layer_norm", [r, ln_w, ln_b], eps=1e-5)
    g = b.build([y, r])
    p = plan(g)
    assert regions(p) == [("gemm", "linear gelu"), ("gemm", "linear"), ("reduction", "add layer_norm")]
    assert [r.name for r in p.regions] == ["fused_linear_gelu_0", "linear_1", "fused_add_layer_norm_2"]
    assert p.regions[2].outputs == ("add", "layer_norm")  # the residual stream is written once
    assert any("kept for its norm" in why for why in p.refusals)
    check_runs(g, p, torch.randn(6, 16, generator=rng))


def test_decomposed_rms_norm_and_attention_are_rewritten(rng):
    b = GraphBuilder("attn")
    q = b.input("q", TensorType((2, 4, 8, 16), F32))
    k = b.input("k", TensorType((2, 4, 8, 16), F32))
    v = b.input("v", TensorType((2, 4, 8, 16), F32))
    mask = b.input("mask", TensorType((2, 1, 1, 8), F32))
    kt = b.add1("transpose", [k], dim0=-2, dim1=-1)
    s = b.add1("matmul", [q, kt])
    s = b.add1("mul", [s, scalar(b, 0.25)])
    s = b.add1("add", [s, mask])
    p_ = b.add1("softmax", [s], dim=-1)
    o = b.add1("matmul", [p_, v])
    # rms norm written out, as HF LLaMA does
    sq = b.add1("pow", [o, scalar(b, 2.0)])
    var = b.add1("mean", [sq], dims=(-1,), keepdim=True)
    inv = b.add1("rsqrt", [b.add1("add", [var, scalar(b, 1e-6)])])
    y = b.add1("mul", [b.constant("w", torch.rand(16) + 0.5), b.add1("mul", [o, inv])])
    g = b.build([y])
    p = plan(g)
    assert [op for op in p.graph.op_counts()] == ["sdpa", "rms_norm"]
    assert regions(p) == [("attention", "sdpa"), ("reduction", "rms_norm")]
    assert sorted(w.split(":")[0] for w in p.rewrites) == ["attention.decomposed_scaled_masked", "norm.rms"]
    args = [torch.randn(2, 4, 8, 16, generator=rng) for _ in range(3)] + [torch.randn(2, 1, 1, 8, generator=rng)]
    check_runs(g, p, *args)


def test_rotary_and_gelu_tanh_patterns(rng):
    b = GraphBuilder("rot")
    x = b.input("x", TensorType((2, 3, 5, 8), F32))
    cos, sin = b.input("cos", TensorType((5, 8), F32)), b.input("sin", TensorType((5, 8), F32))
    hi = b.add1("slice", [x], dim=-1, start=4, end=2**63 - 1)
    lo = b.add1("slice", [x], dim=-1, start=0, end=4)
    rot = b.add1("concat", [b.add1("neg", [hi]), lo], dim=-1)
    y = b.add1("add", [b.add1("mul", [x, cos]), b.add1("mul", [rot, sin])])
    # 0.5 * y * (1 + tanh(sqrt(2/pi) * (y + 0.044715 * y^3)))
    cube = b.add1("mul", [b.add1("pow", [y, scalar(b, 3.0)]), scalar(b, 0.044715)])
    inner = b.add1("mul", [b.add1("add", [y, cube]), scalar(b, math.sqrt(2 / math.pi))])
    z = b.add1("mul", [b.add1("mul", [y, scalar(b, 0.5)]), b.add1("add", [b.add1("tanh", [inner]), scalar(b, 1.0)])])
    g = b.build([z])
    p = plan(g)
    assert list(p.graph.op_counts()) == ["rotary_embedding", "gelu"]
    assert regions(p) == [("elementwise", "rotary_embedding gelu")]
    check_runs(g, p, torch.randn(2, 3, 5, 8, generator=rng), torch.randn(5, 8, generator=rng),
               torch.randn(5, 8, generator=rng))


def test_pattern_check_refuses_with_reason():
    b = GraphBuilder("notrms")
    x = b.input("x", TensorType((4, 8), F32))
    sq = b.add1("pow", [x, scalar(b, 3.0)])  # not a square: no rms_norm
    var = b.add1("mean", [sq], dims=(-1,), keepdim=True)
    y = b.add1("mul", [x, b.add1("rsqrt", [b.add1("add", [var, scalar(b, 1e-6)])])])
    p = plan(b.build([y]))
    assert "rms_norm" not in p.graph.op_counts()
    assert any("power is not 2" in r for r in p.refusals)


def test_cycle_is_illegal():
    # a -> b -> c and a -> c: fusing {a, c} without b would need b both before and after.
    b = GraphBuilder("cyc")
    x = b.input("x", TensorType((4, 4), F32))
    a = b.add1("matmul", [x, x], name="a")
    m = b.add1("softmax", [a], dim=-1, name="b")
    c = b.add1("add", [a, m], name="c")
    f = Facts.of(b.build([c]))
    assert creates_cycle(f, {"a"}, {"c"})
    assert not creates_cycle(f, {"a"}, {"b"})


def test_cycle_check_agrees_with_reachability_on_random_dags():
    """The windowed search gives the definition's answer: some node outside the merged set is both reachable
    from it and reaches it (networkx descendants/ancestors), on random DAGs and random merges."""
    import random

    import networkx as nx

    rnd = random.Random(torch.randint(0, 2**31, ()).item())
    for _ in range(200):
        n = rnd.randint(2, 14)
        dag = nx.DiGraph()
        dag.add_nodes_from(str(k) for k in range(n))
        dag.add_edges_from((str(i), str(j)) for i in range(n) for j in range(i + 1, n) if rnd.random() < 0.3)
        names = list(rnd.sample(sorted(dag), n))  # the order must come from the DAG, not from the names
        order = {v: k for k, v in enumerate(nx.topological_sort(dag))}
        f = Facts(None, dag, {}, {}, {}, {}, frozenset(), order)
        members, new = set(names[:rnd.randint(1, 3)]), set(names[-rnd.randint(1, 2):])
        merged = members | new
        down = set().union(*(nx.descendants(dag, v) for v in merged)) - merged
        up = set().union(*(nx.ancestors(dag, v) for v in merged))
        assert creates_cycle(f, members, new) == bool(down & up), (sorted(dag.edges), members, new)


def test_multi_use_epilogue_is_refused_for_gemm(rng):
    b = GraphBuilder("two_users")
    x = b.input("x", TensorType((4, 8), F32))
    h = b.add1("linear", [x, b.constant("w", torch.randn(8, 8)), ""])
    r = b.add1("relu", [h])
    g = b.build([r, h])  # h is returned too: the gemm would write two outputs
    p = plan(g)
    assert regions(p) == [("gemm", "linear"), ("elementwise", "relu")]
    assert any("would write 2 outputs" in why for why in p.refusals)
    check_runs(g, p, torch.randn(4, 8, generator=rng))


@pytest.mark.parametrize("fuse", [True, False])
def test_unfused_plan_is_one_region_per_node(fuse):
    b = GraphBuilder("g")
    x = b.input("x", TensorType((4, 8), F32))
    y = b.add1("relu", [b.add1("exp", [x])])
    p = plan(b.build([y]), fuse=fuse)
    assert p.kernels == (1 if fuse else 2)


def test_small_input_only_elementwise_regions_run_as_one_kernel(rng):
    """A decode step's per-layer counters, positions and masks (HF LLaMA's static cache: one-element kernels each)
    read graph inputs only, or what such a region made: they merge into one region whatever their shapes, at most
    ``HORIZONTAL_MAX_OUTPUTS`` outputs a kernel. A large one, and one that reads a computed value, stay as they
    were. The merged kernels (``c`` target) give the reference's values, int64 and float alike."""
    from tilefuse.config import Options
    from tilefuse.pipeline import build_runner
    from tilefuse.planner.partition import HORIZONTAL_MAX_NUMEL, HORIZONTAL_MAX_OUTPUTS

    b = GraphBuilder("counters")
    outs = []
    for k in range(20):
        c = b.input(f"c{k}", TensorType((), "int64"))
        outs.append(b.add1("add", [c, b.constant(f"one{k}", torch.tensor(1))]))
        outs.append(b.add1("add", [b.constant(f"ar{k}", torch.arange(1)), c]))
    f = b.input("f", TensorType((3,), F32))
    scaled = b.add1("mul", [f, scalar(b, 2.0)])  # float, another shape: merged too
    outs += [scaled, b.add1("exp", [b.add1("concat", [scaled, scaled], dim=0)])]  # reads what a merged one made
    big = b.input("big", TensorType((HORIZONTAL_MAX_NUMEL + 1,), F32))
    outs.append(b.add1("add", [big, big]))  # too large to merge
    outs.append(b.add1("exp", [b.add1("matmul", [big, big])]))  # reads a computed value: not input-only
    g = b.build(outs)
    p = plan(g)
    merged = [r for r in p.regions if r.kind == "elementwise" and len(r.outputs) > 1]
    assert sorted(len(r.outputs) for r in merged) == [42 - HORIZONTAL_MAX_OUTPUTS, HORIZONTAL_MAX_OUTPUTS]
    shapes = {tuple(g.values()[o].type.shape) for r in merged for o in r.outputs}
    assert shapes == {(), (1,), (3,), (6,)}
    assert sum(r.kind == "elementwise" for r in p.regions) == 3  # the two merged and the large add
    assert [r.ops for r in p.regions if r.kind == "gemm"] == [("matmul", "exp")]  # (the exp: the GEMM's epilogue)
    args = [torch.randint(-5, 1000, (), generator=rng) for _ in range(20)] + [
        torch.tensor([1.5, float("nan"), -float("inf")]), torch.randn(HORIZONTAL_MAX_NUMEL + 1, generator=rng)]
    runner = build_runner(g, Options(target={"kind": "c"}, quiet=True, measure=False))
    assert all(r.name in runner.kernels for r in runner.plan.regions if r.kind == "elementwise")  # kernels, not torch
    got, want = runner(*args), Executor(g)(*args)
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype and x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_merged_input_only_regions_keep_each_outputs_dtype():
    """One kernel for 0-d int64, float32 (NaN), float16 and bool values of one shape, each output its own dtype."""
    from tilefuse.config import Options
    from tilefuse.pipeline import build_runner

    b = GraphBuilder("mixed")
    c, f = b.input("c", TensorType((), "int64")), b.input("f", TensorType((), F32))
    h, flag = b.input("h", TensorType((), "float16")), b.input("flag", TensorType((), "bool"))
    g = b.build([b.add1("add", [c, b.constant("one", torch.tensor(1))]), b.add1("mul", [f, scalar(b, 2.0)]),
                 b.add1("exp", [h]), b.add1("logical_not", [flag])])
    runner = build_runner(g, Options(target={"kind": "c"}, quiet=True, measure=False))
    assert [r.kind for r in runner.plan.regions] == ["elementwise"] and runner.plan.regions[0].name in runner.kernels
    args = [torch.tensor(41), torch.tensor(float("nan")), torch.tensor(1.5, dtype=torch.float16), torch.tensor(True)]
    for got, want in zip(runner(*args), Executor(g)(*args)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True)

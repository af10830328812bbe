"""Attention as torch's math SDPA spells it (issue 14), on hand-written graphs: what dynamo hands a backend on CUDA
when no fused SDPA kernel takes the call (``_scaled_dot_product_attention_math``): q, k, v (and the mask) upcast
from fp16 to fp32, sqrt(scale) multiplied into q and into k^T, 4-D products as reshape-bmm-reshape, the mask added,
``_safe_softmax`` decomposed (softmax, ``all(s == -inf)`` over the keys, ``where`` 0), the product with v, the
downcast. The planner must make one sdpa of it, on the model's dtype, and the plan must compute what the graph does."""

import math

import pytest
import torch

from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

B, H, S, D = 2, 3, 13, 16
C = {"kind": "c"}


def _math_sdpa(dtype: str, *, mask: bool, batched: bool, sides: str = "both", guard: str = "torch_fallback"):
    """The graph ATen's math SDPA decomposes into (fp32 internally), written node by node."""
    b = GraphBuilder("math_sdpa")
    q, k, v = (b.input(n, TensorType((B, H, S, D), dtype)) for n in "qkv")
    up = (lambda x: b.add1("cast", [x], dtype="float32")) if dtype != "float32" else (lambda x: x)
    qf, kf, vf = up(q), up(k), up(v)
    scale = 1 / math.sqrt(D)
    root = math.sqrt(scale)
    if sides == "both":
        qf = b.add1("mul", [qf, b.constant("sq", torch.tensor(root))])
    elif sides == "q":
        qf = b.add1("mul", [b.constant("sq", torch.tensor(scale)), qf])
    kt = b.add1("transpose", [kf], dim0=-2, dim1=-1)
    if sides == "both":
        kt = b.add1("mul", [kt, b.constant("sk", torch.tensor(root))])
    elif sides == "k":
        kt = b.add1("mul", [kt, b.constant("sk", torch.tensor(scale))])
    if batched:
        s = b.add1("matmul", [b.add1("reshape", [qf], shape=(B * H, S, D)), b.add1("reshape", [kt], shape=(B * H, D, S))])
        s = b.add1("reshape", [s], shape=(B, H, S, S))
    else:
        s = b.add1("matmul", [qf, kt])
    if mask:
        m = b.input("mask", TensorType((B, 1, S, S), dtype))
        s = b.add1("add", [s, up(m)])
    p = b.add1("softmax", [s], dim=-1)
    hidden = b.add1("eq", [s, b.constant("ninf", torch.tensor(float("-inf")))])
    if guard == "torch_fallback":  # aten::all.dim without a converter, as the fx frontend imports it today
        every = b.add1("torch_fallback", [hidden], target="aten::all.dim", args=(("tensor", 0), -1, True), kwargs=())
    else:
        every = b.add1(guard, [hidden], dims=(-1,), keepdim=True)
    p = b.add1("where", [every, b.constant("zeros", torch.zeros(B, H, S, S)), p])
    if batched:
        o = b.add1("reshape", [b.add1("matmul", [b.add1("reshape", [p], shape=(B * H, S, S)),
                                                 b.add1("reshape", [vf], shape=(B * H, S, D))])], shape=(B, H, S, D))
    else:
        o = b.add1("matmul", [p, vf])
    if dtype != "float32":
        o = b.add1("cast", [o], dtype=dtype)
    return b.build([o])


def _inputs(rng, dtype, mask: bool):
    dt = getattr(torch, dtype)
    args = [torch.randn(B, H, S, D, generator=rng).to(dt) for _ in range(3)]
    if mask:  # a random additive mask: keys hidden with -inf, one query row hidden entirely, finite biases elsewhere
        m = torch.randn(B, 1, S, S, generator=rng)
        m = m.masked_fill(torch.rand(B, 1, S, S, generator=rng) < 0.3, float("-inf"))
        m[0, 0, 4, :] = float("-inf")
        m[1, 0, :, 0] = 0.0  # every other row keeps a key
        m[0, 0, :4, 0] = 0.0
        m[0, 0, 5:, 0] = 0.0
        args.append(m.to(dt))
    return args


@pytest.mark.parametrize("sides", ["both", "q", "k"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_math_form_is_one_sdpa(rng, dtype, mask, batched, sides):
    g = _math_sdpa(dtype, mask=mask, batched=batched, sides=sides)
    p = plan(g, C)
    assert list(p.graph.op_counts()) == ["sdpa"], p.graph  # upcasts, guard, zeros and downcast all gone
    (sdpa,) = p.graph.nodes
    assert sdpa.inputs[:3] == ("q", "k", "v")  # the fp16 values the model made, not their fp32 copies
    assert sdpa.inputs[3:] == (("mask",) if mask else ("",))  # the mask's own dtype: its upcast went too
    assert math.isclose(sdpa.attr["scale"], 1 / math.sqrt(D), rel_tol=1e-6) and not sdpa.attr["is_causal"]
    assert [r.kind for r in p.regions] == ["attention"]
    assert p.regions[0].backend == ("tilelang" if dtype == "float32" else "torch")  # c runs fp32 attention only
    assert any("attention.decomposed" in w for w in p.rewrites), p.rewrites
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-2, "atol": 1e-2}
    for _ in range(2):
        args = _inputs(rng, dtype, mask)
        (want,) = Executor(g)(*args)
        (got,) = PlanRunner(p)(*args)
        assert torch.isfinite(want).all()  # _safe_softmax: the fully hidden row is 0, not NaN
        if mask:
            assert bool((want[0, :, 4] == 0).all())
        torch.testing.assert_close(got, want, **tol)


def _guard_forms() -> list[str]:
    """How the frontend may hand over ``aten.all.dim``: through the torch fallback, or as the ``all`` op once it
    is in the registry (both are matched; each form the registry has is tested)."""
    from tilefuse import ops

    forms = ["torch_fallback"]
    try:
        ops.get("all")
        forms.append("all")
    except ops.UnsupportedOpError:
        pass
    return forms


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_math_form_guard_forms(rng, dtype):
    for guard in _guard_forms():
        g = _math_sdpa(dtype, mask=True, batched=True, guard=guard)
        p = plan(g, C)
        assert list(p.graph.op_counts()) == ["sdpa"], (guard, p.refusals)
        args = _inputs(rng, dtype, True)
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-2, "atol": 1e-2}
        torch.testing.assert_close(PlanRunner(p)(*args), Executor(g)(*args), **tol)


def test_guard_over_another_axis_is_refused():
    """``all`` over the query axis is not _safe_softmax: no rewrite, and the refusal says why."""
    b = GraphBuilder("bad_guard")
    q, k, v = (b.input(n, TensorType((B, H, S, D), "float32")) for n in "qkv")
    sq = b.constant("sq", torch.tensor(D ** -0.25))
    s = b.add1("matmul", [b.add1("mul", [q, sq]), b.add1("mul", [b.add1("transpose", [k], dim0=-2, dim1=-1), sq])])
    hidden = b.add1("eq", [s, b.constant("ninf", torch.tensor(float("-inf")))])
    every = b.add1("torch_fallback", [hidden], target="aten::all.dim", args=(("tensor", 0), -2, True), kwargs=())
    p = b.add1("where", [every, b.constant("zeros", torch.zeros(B, H, S, S)), b.add1("softmax", [s], dim=-1)])
    g = b.build([b.add1("matmul", [p, v])])
    pl = plan(g, C)
    assert "sdpa" not in pl.graph.op_counts()
    assert any("does not reduce over the key axis" in r for r in pl.refusals), pl.refusals


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_round_trip(rng, dtype):
    """cast(cast(x, fp32), x.dtype) is x bit for bit and goes; a narrowing first cast stays; a graph output that
    would become a graph input's own tensor keeps its casts."""
    b = GraphBuilder("round_trip")
    x = b.input("x", TensorType((3, 7), dtype))
    y = b.add1("relu", [x])
    back = b.add1("cast", [b.add1("cast", [y], dtype="float32")], dtype=dtype)
    lossy = b.add1("cast", [b.add1("cast", [y], dtype="float16" if dtype == "bfloat16" else "bfloat16")], dtype=dtype)
    same = b.add1("cast", [b.add1("cast", [x], dtype="float32")], dtype=dtype)
    g = b.build([b.add1("add", [back, lossy]), same])
    p = plan(g, C)
    casts = [n for n in p.graph.nodes if n.op == "cast"]
    assert len(casts) == 4, p.graph  # the lossy pair and the pair that returns x; the pair after relu went
    assert any("would alias a graph input" in r for r in p.refusals), p.refusals
    t = (torch.randn(3, 7, generator=rng) * 1e3).to(getattr(torch, dtype))
    got, want = PlanRunner(p)(t), Executor(g)(t)
    for a, w in zip(got, want):
        assert torch.equal(a, w)
    assert got[1].data_ptr() != t.data_ptr()

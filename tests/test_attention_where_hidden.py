"""Scores hidden by ``where`` before the softmax (GPT-Neo's eager attention, ``planner.patterns_hidden``), on
hand-written graphs: ``where(cond, q @ k^T, finfo.min)``, then a padding mask added, softmax, the product with v.
A constant condition (causal, or a causal window) becomes the kernel's index tests; a runtime one (a buffer under
torch.compile) an additive operand. The plan must compute what the graph does, every element."""

import pytest
import torch

from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

B, H, S, D, W = 2, 3, 13, 16, 4
C = {"kind": "c"}
MIN = torch.finfo(torch.float32).min


def _visible(window: int | None) -> torch.Tensor:
    i, j = torch.arange(S).view(-1, 1), torch.arange(S).view(1, -1)
    return (j <= i) & (j > i - window) if window else j <= i


def _graph(cond: str, *, pad: bool, window: int | None = None, upcast: bool = False, reader: str = "softmax"):
    """``cond``: "const" (the triangle a graph constant), "arange" (built from aranges, as HF's masks are) or
    "input" (a runtime (1, 1, S, S) boolean, a buffer under torch.compile). ``upcast``: fp16 q, k, v with q and k upcast
    to fp32 before the product (GPT-Neo's ``_attn``). ``reader``: what reads the hidden scores."""
    b = GraphBuilder("neo")
    dt = "float16" if upcast else "float32"
    q, k, v = (b.input(n, TensorType((B, H, S, D), dt)) for n in "qkv")
    if upcast:
        q, k = (b.add1("cast", [x], dtype="float32") for x in (q, k))
    s = b.add1("matmul", [q, b.add1("transpose", [k], dim0=-2, dim1=-1)])
    if cond == "const":
        c = b.constant("bias", _visible(window).view(1, 1, S, S))
    elif cond == "arange":
        i = b.add1("unsqueeze", [b.constant("ar_i", torch.arange(S))], dims=(1,))
        j = b.add1("unsqueeze", [b.constant("ar_j", torch.arange(S))], dims=(0,))
        c = b.add1("le", [j, i])
        if window:
            c = b.add1("bitwise_and", [c, b.add1("gt", [j, b.add1("sub", [i, b.constant("w", torch.tensor(window))])])])
    else:
        c = b.input("bias", TensorType((1, 1, S, S), "bool"))
    s = b.add1("where", [c, s, b.constant("fill", torch.tensor(MIN))])
    if reader != "softmax":
        return b.build([s])
    if pad:  # HF's padding mask: where(pad[b, kv], 0, finfo.min), (B, 1, 1, S)
        keep = b.input("keep", TensorType((B, 1, 1, S), "bool"))
        s = b.add1("add", [s, b.add1("where", [keep, b.constant("zero", torch.tensor(0.0)),
                                               b.constant("fill2", torch.tensor(MIN))])])
    p = b.add1("softmax", [s], dim=-1)
    if upcast:
        p = b.add1("cast", [p], dtype="float16")
    return b.build([b.add1("matmul", [p, v])])


def _args(rng, g, upcast: bool = False):
    args = []
    for val in g.inputs:
        if val.name == "keep":
            keep = torch.rand(B, 1, 1, S, generator=rng) < 0.7
            keep[..., ::W - 1] = True  # every query row keeps a key in any window (fully hidden rows: attention_mask)
            args.append(keep)
        elif val.name == "bias":
            args.append(_visible(W).view(1, 1, S, S))
        else:
            args.append(torch.randn(*val.type.shape, generator=rng).to(getattr(torch, val.type.dtype)))
    return args


@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("window", [None, W])
@pytest.mark.parametrize("cond", ["const", "arange"])
def test_constant_condition_is_the_kernels_index_test(rng, cond, window, pad):
    g = _graph(cond, pad=pad, window=window)
    p = plan(g, C)
    assert list(p.graph.op_counts()) == (["where", "sdpa"] if pad else ["sdpa"]), p.graph
    sdpa = next(n for n in p.graph.nodes if n.op == "sdpa")
    assert sdpa.attr["is_causal"] and sdpa.attr.get("window") == window and sdpa.attr["scale"] == 1.0
    if pad:  # the padding vector only: nothing S x S
        assert p.graph.values()[sdpa.inputs[3]].type.shape == (B, 1, 1, S)
    else:
        assert sdpa.inputs[3:] in ((), ("",))
    assert "attention.where_hidden" in " ".join(p.rewrites)
    assert [r.backend for r in p.regions if r.kind == "attention"] == ["tilelang"]
    for _ in range(2):
        args = _args(rng, g)
        (want,) = Executor(g)(*args)
        (got,) = PlanRunner(p)(*args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_runtime_condition_stays_an_operand(rng):
    """A buffer's values may change between calls: the plan reads it each call, as an additive (1, 1, S, S) term
    beside the padding mask, and follows a changed buffer."""
    g = _graph("input", pad=True)
    p = plan(g, C)
    sdpa = next(n for n in p.graph.nodes if n.op == "sdpa")
    assert not sdpa.attr["is_causal"] and [r.kind for r in p.regions].count("attention") == 1
    assert p.graph.values()[sdpa.inputs[3]].type.shape == (B, 1, S, S)
    args = _args(rng, g)
    for bias in (args[3], ~torch.ones(1, 1, S, S, dtype=torch.bool).triu(1)):
        args[3] = bias
        (want,) = Executor(g)(*args)
        (got,) = PlanRunner(p)(*args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_upcast_q_and_k_run_in_the_models_dtype(rng):
    """GPT-Neo upcasts q and k to fp32 before the product and v's dtype is fp16: the sdpa takes the fp16 values."""
    g = _graph("const", pad=True, upcast=True)
    p = plan(g, C)
    sdpa = next(n for n in p.graph.nodes if n.op == "sdpa")
    assert sdpa.inputs[:3] == ("q", "k", "v") and sdpa.attr["is_causal"], p.graph
    args = _args(rng, g)
    (want,) = Executor(g)(*args)
    (got,) = PlanRunner(p)(*args)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_where_read_by_something_else_is_left_alone(rng):
    """The rewrite's ``s + fill`` differs from ``fill`` where hidden: only a softmax may read it."""
    g = _graph("const", pad=False, reader="output")
    p = plan(g, C)
    assert "attention.where_hidden" not in " ".join(p.rewrites)
    # outside the pattern's scope (no softmax reads it alone): passed over, no refusal for explain to show
    assert not any("attention.where_hidden" in r for r in p.refusals), p.refusals
    args = _args(rng, g)
    (want,) = Executor(g)(*args)
    (got,) = PlanRunner(p)(*args)
    assert torch.equal(got, want)


def _masked_fill_graph(hide: str, fill: float):
    """``masked_fill(q @ k^T / 4, hide, fill)``, softmax, ``@ v``. ``hide``: "buffer" (nanoGPT's ``bias == 0``, a
    runtime (1, 1, S, S) input), "mpt" (``bool(where(causal & pad, 0, finfo.min))``, MPT's ``attention_mask.bool()``)
    or "outer" (DeBERTa's ``~bool(pad_q * pad_k)``: padded query rows hidden entirely)."""
    b = GraphBuilder("masked_fill")
    q, k, v = (b.input(n, TensorType((B, H, S, D), "float32")) for n in "qkv")
    s = b.add1("mul", [b.add1("matmul", [q, b.add1("transpose", [k], dim0=-2, dim1=-1)]),
                       b.constant("quarter", torch.tensor(0.25))])
    if hide == "buffer":
        c = b.add1("eq", [b.input("bias", TensorType((1, 1, S, S), "float32")), b.constant("zero", torch.tensor(0.0))])
    elif hide == "mpt":
        keep = b.input("keep", TensorType((B, 1, 1, S), "bool"))
        i = b.add1("unsqueeze", [b.constant("ar_i", torch.arange(S))], dims=(1,))
        j = b.add1("unsqueeze", [b.constant("ar_j", torch.arange(S))], dims=(0,))
        visible = b.add1("bitwise_and", [b.add1("le", [j, i]), keep])
        zero, low = b.constant("zero", torch.tensor(0.0)), b.constant("min", torch.tensor(MIN))
        add_mask = b.add1("where", [visible, zero, low])
        c = b.add1("cast", [add_mask], dtype="bool")
    else:
        keep = b.input("keep", TensorType((B, 1, 1, S), "bool"))
        pad = b.add1("cast", [keep], dtype="float32")
        c = b.add1("logical_not", [b.add1("cast", [b.add1("mul", [b.add1("transpose", [pad], dim0=-2, dim1=-1), pad])],
                                          dtype="bool")])
    s = b.add1("masked_fill", [s, c], value=fill)
    return b.build([b.add1("matmul", [b.add1("softmax", [s], dim=-1), v])])


@pytest.mark.parametrize("hide,fill", [("buffer", float("-inf")), ("mpt", MIN), ("mpt", float("-inf"))])
def test_masked_fill_is_one_sdpa(rng, hide, fill):
    g = _masked_fill_graph(hide, fill)
    p = plan(g, C)
    sdpa = [n for n in p.graph.nodes if n.op == "sdpa"]
    assert len(sdpa) == 1 and "attention.masked_fill_hidden" in " ".join(p.rewrites), p.to_text()
    if hide == "mpt":  # read as the causal test and the padding vector
        assert sdpa[0].attr["is_causal"] and p.graph.values()[sdpa[0].inputs[3]].type.shape == (B, 1, 1, S)
    assert all(r.backend == "tilelang" for r in p.regions)
    for _ in range(2):
        args = _args(rng, g)
        if hide == "buffer":  # nanoGPT's tril of ones: 0 above the diagonal
            args[3] = torch.ones(1, 1, S, S).tril()
        (want,) = Executor(g)(*args)
        (got,) = PlanRunner(p)(*args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_masked_fill_that_may_hide_whole_rows_is_left_alone(rng):
    """DeBERTa's finite fill under the outer product of the padding mask hides padded query rows entirely (eager
    averages them; the kernel would give 0): refused, and the plan computes what the graph does."""
    g = _masked_fill_graph("outer", MIN)
    p = plan(g, C)
    assert "attention.masked_fill_hidden" not in " ".join(p.rewrites)
    assert any("attention.masked_fill_hidden" in r and "whole rows" in r for r in p.refusals), p.to_text()
    args = _args(rng, g)
    (want,) = Executor(g)(*args)
    (got,) = PlanRunner(p)(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

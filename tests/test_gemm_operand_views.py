"""A GEMM whose operand is a reshape of an outside value: the kernel reads the value as the operand's shape.

Session 53: ``_trace_operand`` passed through views to the outside value and took that value's own shape for the
GEMM's N and K: HF Funnel's ``einsum("td,dnh->tnh", pos, r_kernel)`` (a (64, 4, 16) weight read as (64, 64)) built a
kernel for the wrong shape once a pair of permutes around the reshape folded away. Every region runs as its kernel
(``measure=False``); every element is checked against torch (fp32 ~1e-5).
"""

from __future__ import annotations

import pytest
import torch

from tilefuse.api import compile_graph
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import run_graph

C = {"kind": "c"}


def _check(g, rng):
    args = [torch.randn(*v.type.shape, generator=rng) for v in g.inputs]
    compiled = compile_graph(g, target=C, quiet=True, measure=False)
    gemms = [r for r in compiled.plan.regions if r.kind == "gemm"]
    assert gemms and all(r.name in compiled.runner.kernels for r in gemms), compiled.plan.summary()
    for want, got in zip(run_graph(g, *args), compiled(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["weight", "input", "both"])
def test_a_reshaped_operand_is_read_as_the_gemm_sees_it(rng, side):
    b = GraphBuilder("views")
    x = b.input("x", TensorType((2, 11, 64), "float32"))
    w = b.input("w", TensorType((64, 4, 16), "float32"))
    a = b.add1("reshape", [x], shape=(22, 64)) if side in ("input", "both") else x
    wv = b.add1("reshape", [b.add1("unsqueeze", [w], dims=(0,))], shape=(64, 64)) if side in ("weight", "both") \
        else b.add1("reshape", [w], shape=(64, 64))
    g = b.build([b.add1("relu", [b.add1("matmul", [a, wv])])])
    _check(g, rng)


def test_a_reshape_that_splits_k_into_a_batch(rng):
    """A (2, 64) input read as (2, 4, 16) against a (16, 8) matrix: K is 16, not 64."""
    b = GraphBuilder("split_k")
    x = b.input("x", TensorType((2, 64), "float32"))
    w = b.input("w", TensorType((16, 8), "float32"))
    g = b.build([b.add1("matmul", [b.add1("reshape", [x], shape=(2, 4, 16)), w])])
    _check(g, rng)


def test_funnels_einsum_through_torch_compile(rng):
    pos, kernel = torch.randn(22, 64, generator=rng), torch.randn(64, 4, 16, generator=rng)

    def f(pos, kernel):
        return torch.einsum("td,dnh->tnh", pos, kernel) * 2

    out = torch.compile(f, backend="tilefuse", options={"target": "c", "measure": False})(pos, kernel)
    torch.testing.assert_close(out, f(pos, kernel), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prologue", [None, "cast", "scale"])
@pytest.mark.parametrize("side", ["a", "b"])
def test_a_transposed_operand_whose_batch_dims_are_merged(rng, side, prologue):
    """ATen's 4-D ``q @ k.transpose(-1, -2)`` (``side`` "b"; "a": ``q.transpose(-1, -2) @ k``): bmm of (B*H, ..)
    views, one of a transpose, with a cast or a scale before it as the prologue (session 54: the kernel read that
    operand with its own (B, H) batch against the other's (B*H,): a ValueError that became a torch fallback)."""
    B, H, S, D = 2, 3, 7, 16
    b = GraphBuilder("bmm_views")
    q = b.input("q", TensorType((B, H, S, D), "float32"))
    k = b.input("k", TensorType((B, H, S, D), "float32"))

    def operand(x, transposed):
        if prologue == "cast":
            x = b.add1("cast", [x], dtype="float32")
        elif prologue == "scale":
            x = b.add1("mul", [x, b.constant(f"s_{x}", torch.tensor(0.25))])
        if transposed:
            x = b.add1("transpose", [x], dim0=-1, dim1=-2)
        return b.add1("reshape", [x], shape=(B * H, D, S) if transposed else (B * H, S, D))

    prod = b.add1("matmul", [operand(q, side == "a"), operand(k, side == "b")])
    s = b.add1("reshape", [prod], shape=(B, H, D, D) if side == "a" else (B, H, S, S))
    g = b.build([b.add1("mul", [s, b.constant("half", torch.tensor(0.5))])])
    _check(g, rng)

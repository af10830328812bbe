"""Softmax written out as ``exp(x - amax(x)) / sum(exp(x - amax(x)))`` (issue 14: attention wherever a model spells
it): the planner makes one softmax of it, and then one attention region where it sits between the two products;
a spelling that is not a softmax (other dims, no max subtracted) is left as written; numerics match the graph."""

import math

import pytest
import torch

import tilefuse
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

C = {"kind": "c"}


def spelled(shape, dim=-1, sum_dim=None, subtract_max=True):
    b = GraphBuilder("softmax_spelled")
    x = b.input("x", TensorType(shape, "float32"))
    d = dim % len(shape)
    shifted = b.add1("sub", [x, b.add1("amax", [x], dims=(d,), keepdim=True)]) if subtract_max else x
    e = b.add1("exp", [shifted])
    s = b.add1("sum", [e], dims=((sum_dim if sum_dim is not None else d) % len(shape),), keepdim=True)
    return b.build([b.add1("div", [e, s])])


def ops_of(p):
    return [op for r in p.regions for op in r.ops]


@pytest.mark.parametrize("dim", [-1, 1])
def test_exp_sum_div_becomes_one_softmax_and_computes_the_same(dim, rng):
    g = spelled((3, 7, 11), dim)
    p = plan(g, C)
    assert "softmax" in ops_of(p) and "exp" not in ops_of(p) and "div" not in ops_of(p)
    x = torch.randn(3, 7, 11, generator=rng) * 4
    x[0, 0, 0] = 80.0  # exp overflows without the max subtracted: both spellings stay finite
    x[1, 2] = float("-inf")  # a row of -inf along dim -1 (NaN there in both)
    x[2, 3, 4] = float("nan")
    want = Executor(g)(x)[0]
    got = PlanRunner(p)(x)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_other_spellings_are_left_as_written():
    assert "softmax" not in ops_of(plan(spelled((4, 5), -1, sum_dim=0), C))  # max and sum over different dims
    assert "softmax" not in ops_of(plan(spelled((4, 5), -1, subtract_max=False), C))  # overflows differently


def test_attention_with_a_spelled_softmax_is_one_attention_region(rng):
    torch.manual_seed(0)

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            e = torch.exp(s - s.amax(-1, keepdim=True))
            return (e / e.sum(-1, keepdim=True)) @ v

    q, k, v = (torch.randn(2, 3, 9, 16, generator=rng) for _ in range(3))
    runners = []
    compiled = tilefuse.compile(Attn(), target="c", measure=False, quiet=True, observer=runners.append)
    with torch.no_grad():
        got, want = compiled(q, k, v), Attn()(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    regions = [r for r in runners[0].plan.regions if r.kind == "attention"]
    assert len(regions) == 1 and regions[0].backend == "tilelang"

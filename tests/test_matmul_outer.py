"""A matmul over a contracted dim of 1 (HF LLaMA's rotary frequencies in transformers 5.17:
``inv_freq[None, :, None] @ position[:, None, :]``, float32) is the broadcast product ``a * b``: the planner rewrites it
(pattern ``matmul.outer``), so it fuses with the elementwise chain around it instead of running as a torch GEMM between
two kernels; every element is the same single product, NaN and infinities included; other matmuls are left."""

import pytest
import torch

from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def rotary_freqs(batch, half, dtype="float32", k=1):
    """``cat((a @ b)^T, (a @ b)^T)`` then cos and sin, as HF's rotary module spells it."""
    b = GraphBuilder("outer")
    a = b.input("a", TensorType((batch, half, k), dtype))
    p = b.input("p", TensorType((batch, k, 1), dtype))
    freqs = b.add1("transpose", [b.add1("matmul", [a, p])], dim0=1, dim1=2)
    emb = b.add1("concat", [freqs, freqs], dim=-1)
    return b.build([b.add1("cos", [emb]), b.add1("sin", [emb])])


def ops_of(p):
    return [op for r in p.regions for op in r.ops]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_product_over_one_element_becomes_a_broadcast_mul_with_the_same_values(dtype, rng):
    g = rotary_freqs(2, 32, dtype)
    p = plan(g, C)
    assert "matmul" not in ops_of(p) and "mul" in ops_of(p)
    assert any(r.startswith("matmul.outer") for r in p.rewrites)
    a = (torch.randn(2, 32, 1, generator=rng) * 3).to(getattr(torch, dtype))
    pos = torch.tensor([[[7.0]], [[4095.0]]]).to(getattr(torch, dtype))
    a[0, 0, 0], a[0, 1, 0], a[1, 2, 0] = float("nan"), float("inf"), 0.0  # inf * 7 = inf (cos: NaN), 0 * 4095 = 0
    want = Executor(g)(a, pos)
    got = PlanRunner(p)(a, pos)
    for w, o in zip(want, got):
        torch.testing.assert_close(o, w, rtol=0, atol=0, equal_nan=True)  # one product each: the same rounding
    # and bit for bit what torch's matmul gives (the graph's reference above is torch's matmul)
    torch.testing.assert_close(a * pos, torch.matmul(a.float(), pos.float()).to(a.dtype), rtol=0, atol=0,
                                equal_nan=True)


def test_on_a_gpu_plan_the_product_joins_a_kernel_instead_of_a_torch_gemm():
    p = plan(rotary_freqs(1, 32), SM90)
    assert [r.kind for r in p.regions] == ["elementwise"] * len(p.regions)
    assert all(r.backend == "tilelang" for r in p.regions)


@pytest.mark.parametrize("k", [2, 8])
def test_a_real_contraction_is_left_a_matmul(k):
    assert "matmul" in ops_of(plan(rotary_freqs(2, 16, k=k), C))


def test_mixed_dtypes_and_vectors_are_left():
    b = GraphBuilder("mixed")
    a = b.input("a", TensorType((4, 1), "float32"))
    v = b.input("v", TensorType((1,), "float32"))
    g = b.build([b.add1("matmul", [a, v])])  # (4, 1) @ (1,): a matrix-vector product, 1-d result
    assert "matmul" in ops_of(plan(g, C))

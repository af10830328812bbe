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


def test_hf_llama_rotary_as_transformers_5_17_spells_it(monkeypatch):
    """HF LLaMA's rotary module as transformers 5.17 (the H200's) writes it, ``inv_freq @ position`` in float32: a
    decode step on ``c`` gives eager's logits, and its plan for the H200 has no GEMM region left to torch (on the H200
    that product was a torch sgemm between two kernels, bench/results/2026-12-02-h200-session17)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from tilefuse.backend import make_backend
    from tilefuse.config import Options
    from tilefuse.pipeline import plan_step

    def forward_5_17(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        pos = position_ids[:, None, :].float()
        freqs = (inv.float() @ pos.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", forward_5_17)
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    eager = transformers.LlamaForCausalLM(cfg).eval()
    backend = make_backend(Options(target=C, quiet=True))
    compiled = torch.compile(eager.forward, backend=backend)
    ids = torch.randint(1, 256, (1, 6))
    with torch.no_grad():
        want, got = eager(ids).logits, compiled(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert backend.failures == []
    planned = plan_step(backend.programs[-1].graph, Options(target=SM90, quiet=True))
    assert any(r.startswith("matmul.outer") for r in planned.plan.rewrites)
    assert not [r.name for r in planned.plan.regions if r.kind == "gemm" and r.backend == "torch"]

"""Hugging Face ``transformers`` models (tiny configs, random weights, no network) through torch.compile."""

from __future__ import annotations

import pytest
import torch

from tilefuse.config import Options, parse_target
from tilefuse.frontends.dynamo import make_backend

transformers = pytest.importorskip("transformers")

VOCAB = 256
SEQ = 11


def build(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A tiny model of the family ``name`` (2 layers, hidden 64) with random weights, in eval mode."""
    t = transformers
    common = {"vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    if name == "gpt2":
        cls, cfg = t.GPT2LMHeadModel, t.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, **common)
    elif name == "bert":
        cls, cfg = t.BertModel, t.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                             intermediate_size=128, max_position_embeddings=64, **common)
    else:
        cls, cfg = t.LlamaForCausalLM, t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=128,
                                                     max_position_embeddings=64, **common)
    torch.manual_seed(0)
    model = cls._from_config(cfg, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval()


def batch(rng: torch.Generator, device: str = "cpu"):
    """Fresh token ids and an attention mask with padding at the end of the second row."""
    ids = torch.randint(1, VOCAB, (2, SEQ), generator=rng)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, SEQ - 4:] = 0
    return ids.to(device), mask.to(device)


def main_output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def run(name: str, rng, options: Options, dtype: torch.dtype, device: str, tol: dict):
    torch._dynamo.reset()
    model = build(name, dtype, device)
    backend = make_backend(options)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            ids, mask = batch(rng, device)
            got = main_output(compiled(input_ids=ids, attention_mask=mask))
            want = main_output(model(input_ids=ids, attention_mask=mask))
            torch.testing.assert_close(got, want, **tol)
    torch._dynamo.reset()
    assert backend.failures == []
    assert backend.fallback_ops() == set()
    ops = {op for p in backend.programs for op in p.graph.op_counts()}
    assert "sdpa" in ops and ("linear" in ops or "matmul" in ops)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_model_matches_eager_cpu(name, rng):
    run(name, rng, Options(target=parse_target("c")), torch.float32, "cpu", {"rtol": 1e-4, "atol": 1e-5})


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_model_fp16_cuda_matches_eager(name, rng):
    run(name, rng, Options(), torch.float16, "cuda", {"rtol": 1e-2, "atol": 1e-2})

"""Hugging Face ``transformers`` models (tiny configs, random weights, no network) through torch.compile."""

from __future__ import annotations

import pytest
import torch

from tilefuse.config import Options, parse_target
from tilefuse.frontends.dynamo import make_backend
from tilefuse.models.hf import VOCAB
from tilefuse.models.hf import build_hf as build

transformers = pytest.importorskip("transformers")

SEQ = 11


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
    model = build(name, dtype=dtype, device=device)
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

"""Hugging Face ``transformers`` models (tiny configs, random weights, no network) through torch.compile."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse.models.hf import FAMILIES, IMAGE, VOCAB
from tilefuse.models.hf import build_hf as build

transformers = pytest.importorskip("transformers")

SEQ = 11


def batch(rng: torch.Generator, device: str = "cpu"):
    """Fresh token ids and an attention mask with padding at the end of the second row."""
    ids = torch.randint(1, VOCAB, (2, SEQ), generator=rng)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, SEQ - 4:] = 0
    return ids.to(device), mask.to(device)


def inputs(name: str, rng: torch.Generator, device: str, dtype: torch.dtype) -> dict:
    """The model's keyword inputs: token ids and a padded mask, or a ViT's fresh random images."""
    if name == "vit":
        return {"pixel_values": torch.randn(2, 3, IMAGE, IMAGE, generator=rng).to(device, dtype)}
    ids, mask = batch(rng, device)
    return {"input_ids": ids, "attention_mask": mask}


def main_output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def run(name: str, rng, options: Options, dtype: torch.dtype, device: str, tol: dict, caplog):
    caplog.set_level(logging.WARNING, logger="tilefuse")
    torch._dynamo.reset()
    model = build(name, dtype=dtype, device=device)
    runners = []
    backend = make_backend(dataclasses.replace(options, observer=runners.append))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            kw = inputs(name, rng, device, dtype)
            got = main_output(compiled(**kw))
            want = main_output(model(**kw))
            torch.testing.assert_close(got, want, **tol)
    torch._dynamo.reset()
    assert backend.failures == []
    assert backend.fallback_ops() == set()
    assert [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()] == []
    ops = {op for p in backend.programs for op in p.graph.op_counts()}
    assert "linear" in ops or "matmul" in ops
    # Every family's attention is one region of the plan: an SDPA op, or (ViT in fp16 on CUDA, whose graph carries
    # SDPA in the math backend's arithmetic form; T5: matmul, relative-position bias, softmax, matmul) the planner's
    # attention patterns matched it.
    assert "sdpa" in ops or "softmax" in ops
    assert any(r.kind == "attention" for runner in runners for r in runner.plan.regions), name
    return backend


@pytest.mark.parametrize("name", FAMILIES)
def test_hf_model_matches_eager_cpu(name, rng, caplog):
    """Every family the tests import, fp32 on ``c``, against eager at 1e-4."""
    run(name, rng, Options(target=parse_target("c")), torch.float32, "cpu", {"rtol": 1e-4, "atol": 1e-5}, caplog)


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILIES)
def test_hf_model_fp16_cuda_matches_eager(name, rng, caplog):
    run(name, rng, Options(), torch.float16, "cuda", {"rtol": 1e-2, "atol": 1e-2}, caplog)

"""Hugging Face transformers models exported with torch.onnx.export, imported by tilefuse, run through
their fusion plan, compared with onnxruntime and with the eager model (small configs, random weights, no network)."""

import logging

import pytest
import torch

import tilefuse

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from tilefuse.frontends.onnx import import_onnx
from tilefuse.models.hf import FAMILIES, IMAGE, VOCAB, MainOutput, build_hf
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_onnx_matches_onnxruntime(name, tmp_path, rng):
    torch.manual_seed(0)
    model = MainOutput(build_hf(name))
    ids = torch.randint(0, 100, (2, 13), generator=rng)
    mask = torch.ones(2, 13, dtype=torch.int64)
    mask[1, 9:] = 0  # a padded sequence
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, (ids, mask), str(path), input_names=["ids", "mask"], output_names=["out"], dynamo=True)
    graph = import_onnx(path)
    p = plan(graph)
    print(p.summary())
    assert [r.kind for r in p.regions].count("attention") == 2  # the decomposed export is one region again
    if name in ("gpt2", "llama"):
        assert 2 * p.kernels <= p.source_nodes
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fresh = torch.randint(0, 100, (2, 13), generator=rng)
    (want,) = sess.run(None, {"ids": fresh.numpy(), "mask": mask.numpy()})
    (got,) = PlanRunner(p)(fresh, mask)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-4, atol=1e-4)


def example(name: str, rng: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Fresh inputs: a ViT's images, or token ids with the second sequence padded."""
    if name == "vit":
        return (torch.randn(2, 3, IMAGE, IMAGE, generator=rng),)
    ids = torch.randint(1, VOCAB, (2, 13), generator=rng)
    mask = torch.ones(2, 13, dtype=torch.int64)
    mask[1, 9:] = 0
    return ids, mask


@pytest.mark.parametrize("name", FAMILIES)
def test_hf_compile_onnx_matches_eager(name, tmp_path, rng, caplog):
    """Every family the tests import: torch.onnx.export -> ``tilefuse.compile_onnx`` on ``c``, fp32, against the
    eager model at 1e-4, kernels lowered (nothing of the plan left to torch but views and opaque ops)."""
    model = MainOutput(build_hf(name))
    args = example(name, rng)
    names = ["pixels"] if name == "vit" else ["ids", "mask"]
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, args, str(path), input_names=names, output_names=["out"], dynamo=True)
    with caplog.at_level(logging.WARNING, logger="tilefuse"):
        compiled = tilefuse.compile_onnx(path, target="c", quiet=True)
    assert [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()] == []
    assert compiled.plan.kernels > 0
    with torch.no_grad():
        for _ in range(2):
            fresh = example(name, rng)
            (got,) = compiled(*fresh)
            torch.testing.assert_close(got, model(*fresh), rtol=1e-4, atol=1e-5)


def test_gpt_neo_onnx_reads_its_window_from_the_buffer(tmp_path, rng):
    """GPT-Neo's causal and local-window buffers are initializers in its ONNX export: constant, so each layer is one
    sdpa whose triangle (global) or window (local, 8 keys of 13) is the kernel's index test, with the padding vector its
    only mask (``planner.patterns_hidden``; the export's ``k^T`` is one permute, ``perm (0, 2, 3, 1)``); every element
    against eager."""
    t = transformers
    torch.manual_seed(0)
    cfg = t.GPTNeoConfig(num_layers=2, hidden_size=64, num_heads=4, max_position_embeddings=64, vocab_size=VOCAB,
                         attention_types=[[["global", "local"], 1]], window_size=8, bos_token_id=0, eos_token_id=0,
                         pad_token_id=0)
    model = MainOutput(t.GPTNeoForCausalLM._from_config(cfg, attn_implementation="eager").eval())
    path = tmp_path / "neo.onnx"
    torch.onnx.export(model, example("gpt_neo", rng), str(path), input_names=["ids", "mask"], output_names=["out"],
                      dynamo=True)
    sdpa = _global_and_local_layers(path, model, "gpt_neo", rng)
    assert all(n.attr["is_causal"] for n in sdpa)


def _global_and_local_layers(path, model, name: str, rng) -> list:
    """The export at ``path`` planned for ``c``: one sdpa a layer, causal, one global and one a window of 8 keys (the
    kernel's index test), the padding vector its only mask, all through TileLang; every element against eager on
    fresh inputs. Returns the sdpa nodes."""
    p = plan(import_onnx(path), {"kind": "c"})
    sdpa = [n for n in p.graph.nodes if n.op == "sdpa"]
    assert sorted((n.attr["is_causal"], n.attr.get("window") or 0) for n in sdpa) == [(True, 0), (True, 8)], \
        p.to_text()
    values = p.graph.values()
    assert all(tuple(values[n.inputs[3]].type.shape) == (2, 1, 1, 13) for n in sdpa)
    assert all(r.backend == "tilelang" for r in p.regions)
    with torch.no_grad():
        for _ in range(2):
            fresh = example(name, rng)
            (got,) = PlanRunner(p)(*fresh)
            torch.testing.assert_close(got, model(*fresh), rtol=1e-4, atol=1e-5)
    return sdpa


def test_gemma2_onnx_softcapped_attention_is_one_sdpa_a_layer(tmp_path, rng):
    """Gemma 2's export (eager only): ``cap * tanh(q @ k^T * s / cap)`` before its causal and sliding-window masks is
    one sdpa a layer with the softcap (``planner.patterns_softcap``), the window the kernel's index test, the padding
    vector the only mask; every element against eager, the cap small enough to bend the scores."""
    t = transformers
    torch.manual_seed(0)
    cfg = t.Gemma2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=128, max_position_embeddings=64, sliding_window=8, query_pre_attn_scalar=16,
                         attn_logit_softcapping=0.01, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = MainOutput(t.Gemma2ForCausalLM._from_config(cfg, attn_implementation="eager").eval())
    path = tmp_path / "gemma2.onnx"
    torch.onnx.export(model, example("gemma2", rng), str(path), input_names=["ids", "mask"], output_names=["out"],
                      dynamo=True)
    sdpa = _global_and_local_layers(path, model, "gemma2", rng)
    assert all(n.attr["softcap"] == pytest.approx(0.01) for n in sdpa)

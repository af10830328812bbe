"""Hugging Face architectures outside ``models.hf.FAMILIES`` (tiny configs, random weights, no network) through
torch.compile on the CPU, every output element against eager. Chosen for what the zoo lacks: a bilinear resize inside
a network (MobileViT: its fused gathers once hung TileLang's passes), shifted windows (Swin), depthwise convolutions
with channels-last norms (ConvNeXt), overlapping patches and reduced keys (SegFormer), relative-position attention
(DeBERTa-v2), cross attention (BART), parallel attention (Falcon), a bias table written by scatters (BEiT), pooled
queries (Funnel), sparse experts (Mixtral) and 1-D convolutions (Whisper, wav2vec2)."""

from __future__ import annotations

import logging

import pytest
import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target

t = pytest.importorskip("transformers")

V = 96
TEXT = {"vocab_size": V, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
LAYERS = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
          "max_position_embeddings": 64}


def build(name: str):
    """(model in eval mode, its keyword inputs' kind): ``"text"``, ``"image"`` (32x32) or ``"audio"``."""
    if name == "mobilevit":
        cfg = t.MobileViTConfig(image_size=32, neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48], hidden_sizes=[32, 48, 64])
        return t.MobileViTModel._from_config(cfg), "image"
    if name == "swin":
        cfg = t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
        return t.SwinModel._from_config(cfg), "image"
    if name == "convnext":
        cfg = t.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32)
        return t.ConvNextModel._from_config(cfg), "image"
    if name == "segformer":
        cfg = t.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])
        return t.SegformerModel._from_config(cfg), "image"
    if name == "deberta_v2":
        return t.DebertaV2Model._from_config(t.DebertaV2Config(**TEXT, **LAYERS), attn_implementation="eager"), "text"
    if name == "bart":
        cfg = t.BartConfig(**TEXT, encoder_layers=1, decoder_layers=1, d_model=64, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                           max_position_embeddings=64)
        return t.BartModel._from_config(cfg, attn_implementation="sdpa"), "text"
    if name == "falcon":
        cfg = t.FalconConfig(**TEXT, num_hidden_layers=2, hidden_size=64, num_attention_heads=4)
        return t.FalconForCausalLM._from_config(cfg, attn_implementation="sdpa"), "text"
    if name == "beit":  # a relative-position bias table written by slice and select scatters
        cfg = t.BeitConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, use_relative_position_bias=True)
        return t.BeitModel._from_config(cfg), "image"
    if name == "funnel":  # pooled queries, slice scatters
        cfg = t.FunnelConfig(vocab_size=V, block_sizes=[1, 1], d_model=64, n_head=4, d_head=16, d_inner=128)
        return t.FunnelModel._from_config(cfg), "text"
    if name == "mixtral":  # sparse experts: top-k routing, one-hot, an int32 cumsum, sort and histc (through torch)
        cfg = t.MixtralConfig(**TEXT, **LAYERS, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
        return t.MixtralModel._from_config(cfg, attn_implementation="sdpa"), "text"
    if name == "whisper":  # 1-D convolutions with GELU in front of the encoder
        cfg = t.WhisperConfig(**TEXT, num_mel_bins=16, encoder_layers=1, decoder_layers=1, d_model=64,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_source_positions=16, max_target_positions=32,
                              decoder_start_token_id=0)
        return t.WhisperModel._from_config(cfg, attn_implementation="sdpa"), "audio"
    if name == "wav2vec2":  # a strided 1-D convolution stack, a group norm, a grouped positional convolution
        cfg = t.Wav2Vec2Config(vocab_size=32, **LAYERS, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
                               conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        return t.Wav2Vec2Model._from_config(cfg), "audio"
    raise ValueError(name)


NAMES = ("mobilevit", "swin", "convnext", "segformer", "deberta_v2", "bart", "falcon", "beit", "funnel", "mixtral",
         "whisper", "wav2vec2")


def randomize(model: torch.nn.Module, rng: torch.Generator) -> None:
    """Weights and norm statistics of some size everywhere (MobileViT's own init gives an all-zero output)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=rng) * 0.2)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=rng) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=rng) + 0.5)


def tensors(out) -> list[torch.Tensor]:
    """Every tensor of a model output, in order."""
    found = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)
        elif hasattr(v, "to_tuple"):
            walk(v.to_tuple())

    walk(out)
    return found


@pytest.mark.parametrize("name", NAMES)
def test_heldout_architecture_matches_eager_cpu(name, rng, caplog):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, kind = build(name)
    model = model.eval()
    randomize(model, rng)
    if kind == "image":
        kw = {"pixel_values": torch.randn(2, 3, 32, 32, generator=rng), "output_hidden_states": True}
    elif name == "whisper":
        kw = {"input_features": torch.randn(2, 16, 32, generator=rng),
              "decoder_input_ids": torch.randint(1, V, (2, 5), generator=rng)}
    elif kind == "audio":
        kw = {"input_values": torch.randn(2, 800, generator=rng)}
    else:
        ids = torch.randint(1, V, (2, 11), generator=rng)
        mask = torch.ones(2, 11, dtype=torch.long)
        mask[1, 7:] = 0
        kw = {"input_ids": ids, "attention_mask": mask}
        if name == "bart":
            kw["decoder_input_ids"] = ids[:, :5]
        if name in ("falcon", "mixtral"):
            kw["use_cache"] = False
    backend = make_backend(Options(target=parse_target("c")))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tilefuse"):
        got, ref = torch.compile(model, backend=backend)(**kw), model(**kw)
    got, ref = tensors(got), tensors(ref)
    assert len(got) == len(ref) >= 1
    for g, r in zip(got, ref):
        assert r.abs().max() > 0  # (a check on something)
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5 * max(1.0, r.abs().max().item()))
    assert backend.failures == [] and backend.programs
    torch._dynamo.reset()

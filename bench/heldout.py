"""Real models that are not in the zoo, at realistic sizes, random weights: what users bring.

``bench_models.py --models hf-gpt2,hf-llama,hf-bert,hf-vit,timm-resnet50`` (and ``BUILDERS``' others) takes these by
name. Each builder
returns (module, inputs) in fp16 on the GPU; the module returns one tensor (logits or the last hidden state),
so every peer and tilefuse are compared on the same output. transformers and timm build from configs (no
network: weights are random).
"""

from __future__ import annotations

import torch


class _First(torch.nn.Module):
    """The model's first output as a tensor (Hugging Face models return ModelOutput objects)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        if isinstance(out, torch.Tensor):
            return out
        return out[0] if isinstance(out, (tuple, list)) else next(iter(out.values()))


def _hf(config, cls, inputs, dtype=torch.float16):
    torch.manual_seed(0)
    model = cls(config).to(dtype).cuda().eval().requires_grad_(False)
    return _First(model), inputs


def hf_gpt2(batch: int = 8, seq: int = 1024, attn: str = "sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_positions=max(seq, 1024), attn_implementation=attn)
    return _hf(cfg, GPT2LMHeadModel, (torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda"),))


def hf_llama(batch: int = 4, seq: int = 2048):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                      attn_implementation="sdpa")
    return _hf(cfg, LlamaForCausalLM, (torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda"),))


def hf_bert(batch: int = 32, seq: int = 512, attn: str = "sdpa"):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(attn_implementation=attn)
    return _hf(cfg, BertModel, (torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda"),))


def hf_bert_eager():
    """BERT with ``attn_implementation="eager"``: attention as matmul, softmax, matmul (#14's arithmetic form)."""
    return hf_bert(attn="eager")


def hf_gpt2_eager():
    """GPT-2 with ``attn_implementation="eager"``: the causal mask and attention as arithmetic (#14)."""
    return hf_gpt2(attn="eager")


def hf_gpt_neo(batch: int = 8, seq: int = 1024):
    """GPT-Neo-125M's shape (eager only: ``where(bias, q @ k^T, finfo.min)``, global and 256-key local layers in turn;
    session 54: planned as one sdpa a layer, not measured)."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    cfg = GPTNeoConfig(hidden_size=768, num_layers=12, num_heads=12, attention_types=[[["global", "local"], 6]],
                       max_position_embeddings=2048, attn_implementation="eager")
    return _hf(cfg, GPTNeoForCausalLM, (torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda"),))


def hf_gemma2(batch: int = 4, seq: int = 2048):
    """Gemma-2-2B's shape, 8 of its 26 layers, no LM head, in bf16 as Gemma 2 runs (its activations overflow fp16;
    eager only: its scores softcapped at 50 before the mask, sliding-window layers of 4096 keys and global ones in
    turn, head dim 256; session 58: planned as one sdpa a layer with the softcap, not measured)."""
    from transformers import Gemma2Config, Gemma2Model

    cfg = Gemma2Config(hidden_size=2304, intermediate_size=9216, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=256, sliding_window=4096, attn_logit_softcapping=50.0,
                       query_pre_attn_scalar=256, attn_implementation="eager")
    return _hf(cfg, Gemma2Model, (torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda"),), torch.bfloat16)


def hf_vit(batch: int = 64):
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(attn_implementation="sdpa")
    return _hf(cfg, ViTModel, (torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16),))


def timm_resnet50(batch: int = 64):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet50", pretrained=False).to(torch.float16).cuda().eval().requires_grad_(False)
    return model, (torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16),)


def _timm(name: str, batch: int):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).to(torch.float16).cuda().eval().requires_grad_(False)
    return model, (torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16),)


def timm_convnext(batch: int = 64):
    """ConvNeXt-T: 7x7 depthwise convolutions, channels-last layer norms, GELU MLPs (session 53: not measured)."""
    return _timm("convnext_tiny", batch)


def timm_efficientnet(batch: int = 64):
    """EfficientNet-B0: depthwise convolutions, SiLU, squeeze-and-excitation (session 53: not measured)."""
    return _timm("efficientnet_b0", batch)


def timm_swin(batch: int = 64):
    """Swin-T: windowed attention with a relative-position bias, rolls (session 53: not measured)."""
    return _timm("swin_tiny_patch4_window7_224", batch)


BUILDERS = {"hf-gpt2": hf_gpt2, "hf-llama": hf_llama, "hf-bert": hf_bert, "hf-vit": hf_vit,
            "timm-resnet50": timm_resnet50, "hf-bert-eager": hf_bert_eager, "hf-gpt2-eager": hf_gpt2_eager,
            "timm-convnext": timm_convnext, "timm-efficientnet": timm_efficientnet, "timm-swin": timm_swin,
            "hf-gpt-neo": hf_gpt_neo, "hf-gemma2": hf_gemma2}


def build(name: str, size: str = "bench"):
    """(module, inputs) in fp16 on the GPU: the held-out model ``name`` (``BUILDERS``), else the zoo's at ``size``."""
    if name in BUILDERS:
        return BUILDERS[name]()
    from tilefuse import models

    return models.build(name, size, dtype=torch.float16, device="cuda")

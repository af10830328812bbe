"""Hugging Face ``transformers`` models from tiny configs with random weights (no network): the
models written outside this project that tests and checks run next to the zoo."""

from __future__ import annotations

import torch

VOCAB = 256
FAMILIES = ("gpt2", "bert", "llama", "mistral", "qwen2", "t5", "vit")
IMAGE = 32  # ViT's image side (patches of 8: 16 patches and the cls token)
TEXT = frozenset(FAMILIES) - {"vit"}


def build_hf(name: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> torch.nn.Module:
    """A tiny ``name`` model (2 layers, hidden 64, SDPA attention where the family has it) with seeded random
    weights, in eval mode. ``t5`` is T5's encoder (``T5EncoderModel``); ``vit`` takes ``pixel_values`` of
    ``(batch, 3, IMAGE, IMAGE)``, the others ``input_ids`` below ``VOCAB`` and an ``attention_mask``."""
    try:
        import transformers as t
    except ImportError as e:
        raise ImportError("Hugging Face models need `transformers` (pip install -e '.[test]')") from e
    common = {"vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    if name == "gpt2":
        cls, cfg = t.GPT2LMHeadModel, t.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, **common)
    elif name == "bert":
        cls, cfg = t.BertModel, t.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                             intermediate_size=128, max_position_embeddings=64, **common)
    elif name == "llama":
        cls, cfg = t.LlamaForCausalLM, t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=128,
                                                     max_position_embeddings=64, **common)
    elif name == "mistral":
        cls, cfg = t.MistralForCausalLM, t.MistralConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                         num_key_value_heads=2, intermediate_size=128, head_dim=16,
                                                         max_position_embeddings=64, sliding_window=None, **common)
    elif name == "qwen2":
        cls, cfg = t.Qwen2ForCausalLM, t.Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=128,
                                                     max_position_embeddings=64, **common)
    elif name == "t5":  # no SDPA in T5: its attention is matmul, position bias, softmax, matmul
        cls, cfg = t.T5EncoderModel, t.T5Config(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                                                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                                **common)
    elif name == "vit":
        cls, cfg = t.ViTModel, t.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                           intermediate_size=128, image_size=IMAGE, patch_size=8)
    else:
        raise ValueError(f"unknown Hugging Face family {name!r}; known: {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    model = cls._from_config(cfg, attn_implementation="eager" if name == "t5" else "sdpa")
    return model.to(device=device, dtype=dtype).eval()


class MainOutput(torch.nn.Module):
    """``model(ids, mask)`` -> its main tensor (logits, or the encoder's last hidden state), no KV cache:
    a plain tensor-in, tensor-out module for torch.compile captures and ONNX export."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.decoder = model.__class__.__name__.endswith("ForCausalLM") or model.__class__.__name__.startswith("GPT2")
        self.vision = model.__class__.__name__.startswith("ViT")

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``ids``: token ids, or a ViT's ``pixel_values`` (then no ``mask``)."""
        if self.vision:
            return self.model(pixel_values=ids).last_hidden_state
        kw = {"use_cache": False} if self.decoder else {}
        out = self.model(input_ids=ids, attention_mask=mask, **kw)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state

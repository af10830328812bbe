"""Hugging Face ``transformers`` models from tiny configs with random weights (no network): the
models written outside this project that tests and checks run next to the zoo."""

from __future__ import annotations

import torch

VOCAB = 256
FAMILIES = ("gpt2", "bert", "llama")


def build_hf(name: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> torch.nn.Module:
    """A tiny ``name`` model (2 layers, hidden 64, SDPA attention) with seeded random weights, in eval mode."""
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
    else:
        raise ValueError(f"unknown Hugging Face family {name!r}; known: {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    model = cls._from_config(cfg, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval()


class MainOutput(torch.nn.Module):
    """``model(ids, mask)`` -> its main tensor (logits, or the encoder's last hidden state), no KV cache:
    a plain tensor-in, tensor-out module for torch.compile captures and ONNX export."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.decoder = not model.__class__.__name__.startswith("Bert")

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        kw = {"use_cache": False} if self.decoder else {}
        out = self.model(input_ids=ids, attention_mask=mask, **kw)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state

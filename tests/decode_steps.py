"""Teacher-forced decode steps over static caches, shared by the decoding tests (issue 16)."""

from __future__ import annotations

import inspect

import torch
import transformers


def cache_argument(model) -> str:
    """The forward's cache argument of ``model`` (or its class): transformers 5.17 names it past_key_values (an unknown
    ``cache=`` is ignored there), later versions cache."""
    cls = model if isinstance(model, type) else type(model)
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def teacher_forced(eager, compiled, ids: torch.Tensor, steps: int, tol: float, max_cache_len: int = 48) -> list:
    """``steps`` calls of each model on its own static cache, both fed eager's greedy tokens (a prompt ``ids`` first):
    every call's last logits (as float32) within ``tol`` of eager's, on the same device. Returns the two caches."""
    kw = cache_argument(eager)
    caches = [transformers.StaticCache(config=eager.config, max_cache_len=max_cache_len) for _ in range(2)]
    with torch.no_grad():
        for step in range(steps):
            want = eager(ids, **{kw: caches[0]}).logits[:, -1].float()
            got = compiled(ids, **{kw: caches[1]}).logits[:, -1].float()
            assert got.device == want.device
            torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m, step=step: f"step {step}: {m}")
            ids = want.argmax(-1, keepdim=True)
    return caches

"""Gemma 2's logit softcapping: ``cap * tanh(s / cap)`` on the scaled scores, before the mask and softmax.

Note: Hugging Face's Gemma 2 (eager, its only form: sdpa has no softcap) computes ``q @ k^T * scaling``, divides by
``attn_logit_softcapping``, takes tanh and multiplies back, then adds the causal (or sliding-window) mask. The
attention patterns (``patterns._attention(..., capped=True)``) match these three nodes between the scale and the mask
and give the sdpa a ``softcap``; the kernel caps each score in fp32 (``flash_attention``'s ``softcap``).
"""

from __future__ import annotations

from tilefuse.planner.pattern import Context, Op


def capped(scores) -> Op:
    """``cap * tanh(scores / cap)`` (or ``scores * (1 / cap)``), the multiply either way round."""
    inner = Op(("div", "mul"), (scores, "cap_in"), name="cap_in_op")
    return Op("mul", (Op("tanh", (inner,)), "cap_out"), name="cap_op", commutative=True)


def softcap(caps: dict, ctx: Context) -> float | str:
    """The positive constant ``cap`` both ends of the capping use, or why there is none."""
    c_in, c_out = ctx.scalar(caps["cap_in"]), ctx.scalar(caps["cap_out"])
    if c_in is None or c_out is None or c_in == 0:
        return "the softcap is not a constant"
    cap = c_in if caps["cap_in_op"].op == "div" else 1.0 / c_in
    if not (cap > 0 and abs(cap - c_out) <= 1e-3 * cap):
        return f"tanh's scores are not capped by one positive constant (s / {cap:g} against * {c_out:g})"
    return c_out


def check(caps: dict, ctx: Context) -> str | None:
    """None for no capping or a good one, else why the capping does not fit ``softcap``."""
    if "cap_op" not in caps:
        return None
    cap = softcap(caps, ctx)
    return cap if isinstance(cap, str) else None


def attrs(caps: dict, ctx: Context) -> dict:
    """The sdpa's ``softcap`` attribute where the scores are capped."""
    return {"softcap": float(softcap(caps, ctx))} if "cap_op" in caps else {}

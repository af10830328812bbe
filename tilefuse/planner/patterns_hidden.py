"""Scores hidden by ``where`` before a softmax: GPT-Neo's ``where(causal_or_local, q @ k^T, finfo.min)``.

Note: Hugging Face's GPT-Neo (eager, its only form besides flash-attn) hides keys with a ``where`` over a boolean
buffer (the causal triangle in global layers, a causal window of ``window_size`` keys in local ones), then adds the
model's causal-and-padding mask and takes the softmax. The attention patterns read additive masks, so this rewrites the
``where`` to ``s + where(c, 0, fill)``: one more additive term, which the ``_biased`` attention forms hand with the mask
to ``attention_mask.analyse``. Where the condition is constant (an ONNX initializer, or built from ``arange``), a key
any term hides is hidden: the kernel's causal window and padding vector. A buffer is a runtime input under torch.compile
(its values may change between calls), so there the term stays an additive (1, 1, Sq, Skv) operand beside the mask's.

Exact where ``c`` holds. Where it does not, eager's score is ``fill`` (plus the mask) and ours ``s + fill``: both are a
hidden key whose exponent underflows to 0, unless every key of the row is hidden (rows the mask's note already says
differ). A value other than a softmax's input would see the difference, so only a ``where`` that softmaxes read
(directly, or through adds that only softmaxes read) is rewritten.

``masked_fill(s, hide, fill)`` (MPT, nanoGPT) is the same with the condition negated: ``s + where(hide, fill, 0)``,
exact for a fill of -inf whatever hides. A finite fill is taken where ``hide`` is ``bool(where(v, 0, f))`` (MPT's
``attention_mask.bool()`` of the model's additive mask): the term is then ``where(v, 0, fill)``, which ``analyse`` reads
as the causal test and padding vector. Any other finite fill is left alone: a condition that may hide a query row
entirely (DeBERTa's outer product of the padding mask) would give that row 0 in the kernel, where eager averages it.
"""

from __future__ import annotations

import torch

from tilefuse.ir import torch_dtype
from tilefuse.planner.attention_mask import NEG_FILL, visible_of
from tilefuse.planner.pattern import Context, Emitter, Op, Pattern


def _softmax_only(value: str, ctx: Context, depth: int = 2) -> bool:
    users = ctx.users.get(value, [])
    if not users or value in ctx.graph.outputs:
        return False
    for u in users:
        rank = ctx.type(u.outputs[0].name).rank
        if u.op == "softmax" and rank and u.attr.get("dim", -1) % rank == rank - 1:
            continue
        if u.op == "add" and depth > 0 and _softmax_only(u.outputs[0].name, ctx, depth - 1):
            continue
        return False
    return True


def _read_by_softmax(caps: dict, ctx: Context) -> bool:
    """Both patterns' scope: the hidden scores reach only softmaxes (any other ``where`` or ``masked_fill`` is not
    theirs, and is passed over without a refusal)."""
    return _softmax_only(caps["w"].outputs[0].name, ctx)


def _kept_scores(caps: dict, ctx: Context) -> str | None:
    """The checks' common tail: the scores kept are the result's float type (nothing broadcasts them)."""
    s, out = caps["s"], caps["w"].outputs[0].name
    if ctx.type(s) != ctx.type(out) or not torch_dtype(ctx.type(s).dtype).is_floating_point:
        return f"the kept scores are not the {caps['w'].op}'s float type (no broadcast)"
    return None


def _check(caps: dict, ctx: Context) -> str | None:
    if ctx.type(caps["c"]).dtype != "bool":
        return "the condition is not boolean"
    fill = ctx.scalar(caps["fill"])
    if fill is None or fill > NEG_FILL:
        return "the fill is not one large negative constant"
    if ctx.type(caps["fill"]).dtype != ctx.type(caps["s"]).dtype:
        return "the fill's dtype is not the scores'"
    return _kept_scores(caps, ctx)


def _rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    zero = em.constant("hidden_zero", torch.zeros((), dtype=torch_dtype(ctx.type(caps["s"]).dtype)))
    term = em.add1("where", [caps["c"], zero, caps["fill"]])
    return [em.add1("add", [caps["s"], term])]


def _fill_check(caps: dict, ctx: Context) -> str | None:
    fill = caps["w"].attr.get("value")
    if fill is None or fill > NEG_FILL:
        return "the fill is not a large negative value"
    if fill != float("-inf") and visible_of(caps["c"], ctx) is None:
        return "a finite fill under a condition that is not bool(where(visible, 0, fill)) (it may hide whole rows)"
    return _kept_scores(caps, ctx)


def _fill_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    dt = torch_dtype(ctx.type(caps["s"]).dtype)
    zero = em.constant("hidden_zero", torch.zeros((), dtype=dt))
    fill = em.constant("hidden_fill", torch.full((), caps["w"].attr["value"], dtype=dt))
    visible = visible_of(caps["c"], ctx)
    term = em.add1("where", [visible, zero, fill] if visible else [caps["c"], fill, zero])
    return [em.add1("add", [caps["s"], term])]


MASKED_FILL_HIDDEN = Pattern("attention.masked_fill_hidden", Op("masked_fill", ("s", "c"), name="w"), _fill_rewrite,
                             _fill_check, "masked_fill(s, hide, -inf or finfo.min) read by a softmax -> s + mask",
                             _read_by_softmax)
WHERE_HIDDEN = Pattern("attention.where_hidden", Op("where", ("c", "s", "fill"), name="w"), _rewrite, _check,
                       "where(cond, s, finfo.min) read by a softmax -> s + where(cond, 0, finfo.min)", _read_by_softmax)

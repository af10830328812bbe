"""What an attention mask computes, read from the graph that builds it: causal, sliding window, key padding.

Note: Hugging Face models build their masks from ``arange``, comparisons, ``&`` and ``where`` (GPT-2:
``where(kv <= q & pad[b, kv] & same_packed_seq, 0, finfo.min)``; Mistral adds ``kv > q - window``;
BERT ``where(q >= 0 & pad[b, kv], 0, finfo.min)``) and hand the (B, 1, S, S) result to SDPA or add it
to the scores. A kernel needs none of that tensor: the causal triangle and the window are index tests
in its tile loop, and the only data is the key-padding vector. ``analyse`` splits the condition into the
factors of its ``&`` tree; the factors that depend only on constants are evaluated here with the ops'
torch references (the arange-derived ones are constants once shapes are static) and classified as a
(Sq, Skv) pattern: all visible, causal (top-left aligned, torch's convention) or causal within a
window of W keys (``q - W < kv <= q``). The factors that read runtime data must be per key
(``(B, 1, 1, Skv)``-shaped: a padding mask); they become the kernel's additive mask, ``where(pad, 0,
fill)`` with the model's own fill value, Skv floats per batch row. Anything else is not recognized and
the mask stays the tensor it was, with the reason.

A row whose every key is masked differs between the forms: eager softmax over ``finfo.min`` scores
gives a uniform average over all keys, the kernel averages the keys the causal test leaves (or gives 0
where nothing is left). Such rows are padding queries whose outputs models ignore.

Evaluating the constant factors materializes them at plan time: past ``MAX_ELEMENTS`` per tensor the
mask is left as it is (the refusal says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilefuse import ops
from tilefuse.ir import torch_dtype
from tilefuse.planner.pattern import Context, Emitter

MAX_ELEMENTS = 1 << 24
_AND = ("bitwise_and", "logical_and")
NEG_FILL = -1e4  # a fill at or below this hides a key (finfo.min of fp16 is -65504)


@dataclass(frozen=True)
class MaskParts:
    """A mask read as kernel arguments: ``keys`` is a runtime per-key factor (or None), with ``fill``
    the additive value of a hidden key (``None``: -inf, from a boolean mask)."""

    causal: bool = False
    window: int | None = None
    keys: str | None = None
    fill: str | None = None


def evaluate(value: str, ctx: Context, cache: dict | None = None) -> torch.Tensor | None:
    """The tensor ``value`` holds when it depends on constants only (computed with the ops' references),
    else None. Refuses (None) past ``MAX_ELEMENTS`` elements."""
    cache = {} if cache is None else cache
    if value in cache:
        return cache[value]
    t = ctx.values[value].type
    if not t.is_static or t.numel > MAX_ELEMENTS:
        return None
    if value in ctx.graph.constants:
        return ctx.graph.constants[value]
    node = ctx.producers.get(value)
    out = None
    if node is not None and node.inputs and all(i for i in node.inputs):
        args = [evaluate(i, ctx, cache) for i in node.inputs]
        if all(a is not None for a in args):
            try:
                res = ops.get(node.op).run(args, node.attr)
                out = res[[o.name for o in node.outputs].index(value)]
            except Exception:  # noqa: BLE001  (an op without a reference here: not a constant to us)
                out = None
    cache[value] = out
    return out


def _factors(value: str, ctx: Context) -> list[str]:
    node = ctx.producers.get(value)
    if node is not None and node.op in _AND and len(node.inputs) == 2 and all(node.inputs):
        return _factors(node.inputs[0], ctx) + _factors(node.inputs[1], ctx)
    return [value]


def _classify(visible: torch.Tensor) -> tuple[bool, int | None] | str:
    """(causal, window) of a boolean (Sq, Skv) pattern, or the reason it is neither."""
    sq, skv = visible.shape
    if bool(visible.all()):
        return False, None
    tril = torch.ones(sq, skv, dtype=torch.bool).tril()
    if torch.equal(visible, tril):
        return True, None
    w = int(visible[-1].sum())
    i, j = torch.arange(sq).view(-1, 1), torch.arange(skv).view(1, -1)
    if w >= 1 and torch.equal(visible, tril & (j > i - w)):
        return True, w
    return "the constant part of the mask is not all-visible, causal or a causal window"


def _term(mask: str, ctx: Context, cache: dict) -> tuple[list, list[str], str | None] | str:
    """One additive (or boolean) mask term: its constant factors (tensors, true where a key is visible), its runtime
    factors (value names) and its fill (None: -inf), or why it is not read."""
    mt = ctx.type(mask)
    if mt.rank is None or mt.rank < 2 or not mt.is_static:
        return "the mask's shape is not static (B, H, Sq, Skv)"
    node = ctx.producers.get(mask)
    if mt.dtype == "bool":
        cond, fill = mask, None
    elif node is not None and node.op == "where" and all(node.inputs[:3]):
        zero, neg = ctx.scalar(node.inputs[1]), ctx.scalar(node.inputs[2])
        if zero != 0.0 or neg is None or neg > NEG_FILL:
            return "the mask is a where() of other values than 0 and a large negative fill"
        cond, fill = node.inputs[0], node.inputs[2]
    else:
        m = evaluate(mask, ctx, cache)
        if m is None:
            return "the mask is runtime data that is not built by where(condition, 0, fill)"
        if not bool(((m == 0) | (m <= NEG_FILL)).all()):
            return "the constant mask holds other values than 0 and a large negative fill"
        return [m == 0], [], None
    const, runtime = [], []
    for f in _factors(cond, ctx):
        t = evaluate(f, ctx, cache)
        (runtime if t is None else const).append(t if t is not None else f)
    return const, runtime, fill


def analyse(mask: str, ctx: Context, *more: str) -> MaskParts | str:
    """The kernel arguments of the attention mask ``mask`` (additive or boolean), or why it is not read. ``more``:
    further additive terms of the same scores (GPT-Neo's ``where(causal_or_local, s, finfo.min)``, read as ``s +
    where(.., 0, finfo.min)``, then the padding mask): a key any term hides is hidden."""
    cache: dict = {}
    terms = [(term, _term(term, ctx, cache)) for term in (mask, *more)]
    for _, got in terms:
        if isinstance(got, str):
            return got
    try:
        sq, skv = torch.broadcast_shapes(*(tuple(ctx.type(t).shape[-2:]) for t, _ in terms))
    except RuntimeError:
        return "the mask's terms do not broadcast to one (.., Sq, Skv)"
    visible, runtime, fill = torch.ones(sq, skv, dtype=torch.bool), [], None
    for term, (const, run, term_fill) in terms:
        shape = ctx.type(term).shape
        for t in const:
            try:
                t = torch.broadcast_to(t.to(torch.bool), shape).reshape(-1, *shape[-2:])
            except RuntimeError:
                return "a constant mask factor does not broadcast to the mask"
            if not bool((t == t[:1]).all()):
                return "the constant mask differs between batch rows or heads"
            visible = visible & t[0]
        runtime += run
        fill = term_fill if run else fill
    got = _classify(visible)
    if isinstance(got, str):
        return got
    causal, window = got
    if len(runtime) > 1:
        return "more than one runtime factor in the mask"
    keys = None
    if runtime:
        kt = ctx.type(runtime[0])
        if kt.shape is None or len(kt.shape) < 2 or kt.shape[-2] != 1 or kt.dtype != "bool":
            return "the mask's runtime factor is not a per-key boolean (B, 1, 1, Skv)"
        keys = runtime[0]
    return MaskParts(causal, window, keys, fill)


def sdpa_mask_args(caps: dict, ctx: Context, em: Emitter) -> tuple[list[str], dict]:
    """The sdpa mask input and attributes: a mask the graph builds from indices (``attention_mask.analyse``)
    becomes ``is_causal``/``window`` and a per-key padding mask; any other mask stays an additive operand."""
    if "mask" not in caps:
        return [""], {"is_causal": False}
    parts = analyse(caps["mask"], ctx)
    if isinstance(parts, str):
        return [caps["mask"]], {"is_causal": False}
    return key_mask(parts, caps["mask"], ctx, em), mask_attrs(parts)


def mask_attrs(parts: MaskParts) -> dict:
    return {"is_causal": parts.causal, **({"window": parts.window} if parts.window else {})}


def key_mask(parts: MaskParts, mask: str, ctx: Context, em: Emitter) -> list[str]:
    """The additive (B, 1, 1, Skv) padding mask of ``parts`` ("" when there is none), in the mask's dtype."""
    if parts.keys is None:
        return [""]
    dtype = ctx.type(mask).dtype if ctx.type(mask).dtype != "bool" else "float32"
    zero = em.constant("key_mask_zero", torch.zeros((), dtype=torch_dtype(dtype)))
    fill = parts.fill or em.constant("key_mask_fill", torch.full((), float("-inf"), dtype=torch_dtype(dtype)))
    return [em.add1("where", [parts.keys, zero, fill])]


def visible_of(hide: str, ctx: Context) -> str | None:
    """``v`` where ``hide`` is ``bool(where(v, 0, f))`` with ``f`` a nonzero constant (true exactly where ``v`` is not:
    MPT's ``attention_mask.bool()`` of the model's additive mask), else None."""
    node = ctx.producers.get(hide)
    if node is None or node.op != "cast" or ctx.type(hide).dtype != "bool":
        return None
    inner = ctx.producers.get(node.inputs[0])
    if inner is None or inner.op != "where" or not all(inner.inputs[:3]) or ctx.type(inner.inputs[0]).dtype != "bool":
        return None
    f = ctx.scalar(inner.inputs[2])
    return inner.inputs[0] if ctx.scalar(inner.inputs[1]) == 0.0 and f is not None and f != 0.0 else None

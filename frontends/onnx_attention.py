"""ONNX ``Attention`` (opset 23 on; what torch.onnx.export writes for ``scaled_dot_product_attention`` at opset 23) as
one ``sdpa``.

Note: without this converter the importer expands the op into its ONNX function body (the scale split over q and
k^T, the products, the causal mask built as a (q, kv) tensor, a softmax, a guard for rows that see no key), which
the planner did not make one attention of again: every head's scores were written out. The op's semantics (the
ONNX reference, ``onnx.reference.ops.op_attention``) are ``ops.nn.sdpa``'s: the scale (default ``1/sqrt(head
size)``) on the scores, ``softcap`` (> 0) capping them before the mask, a boolean mask (True attends) or an additive
one broadcast from the right, a causal triangle aligned to the top left (no past cache), a row that sees no key 0,
grouped-query heads repeated. 3-D operands are ``(batch, seq, heads x size)`` with ``q_num_heads`` and
``kv_num_heads``. Whatever else the op may carry (a past cache, ``nonpad_kv_seqlen``, sliding windows, the
``qk_matmul_output`` output, a mask shorter than the keys, 3-D operands of unknown shape) declines the converter
(returns None): the function body computes those.
"""

from __future__ import annotations

from tilefuse.frontends.onnx_context import Ctx, OnnxNode


def _heads(ctx: Ctx, x: str, heads: int) -> str:
    """A 3-D ``(B, S, heads x size)`` operand as ``(B, heads, S, size)``."""
    B, S, width = ctx.static_shape(x, "Attention's 3-D operand")
    y = ctx.add1("reshape", [x], shape=(B, S, heads, width // heads))
    return ctx.add1("permute", [y], perm=(0, 2, 1, 3))


def attention(ctx: Ctx, n: OnnxNode) -> list[str] | None:
    q, k, v, mask = (ctx.inp(n, i) for i in range(4))
    rest = [i for i in range(4, len(n.inputs)) if n.has_input(i)]  # past_key, past_value, nonpad_kv_seqlen
    windows = n.attr("left_window_size", -1) != -1 or n.attr("right_window_size", -1) != -1
    if rest or windows or any(n.outputs[1:]):
        return None
    rank = ctx.rank(q)
    hq, hkv = n.attr("q_num_heads"), n.attr("kv_num_heads")
    if rank == 3 and (not (hq and hkv) or not all(ctx.type(x).is_static for x in (q, k, v))) or rank not in (3, 4):
        return None
    skv = ctx.shape(k)[1 if rank == 3 else 2]
    ms = ctx.shape(mask) if mask else ()
    if mask and (ms is None or ms[-1] != skv):  # (shorter: the function pads it with hidden keys)
        return None
    if rank == 3:
        q, k, v = _heads(ctx, q, hq), _heads(ctx, k, hkv), _heads(ctx, v, hkv)
    if mask:
        if ctx.dtype(mask) == "bool":  # an additive mask the kernel takes: 0 where it attends, -inf where not
            zero, hidden = ctx.scalar(0.0, ctx.dtype(q)), ctx.scalar(float("-inf"), ctx.dtype(q))
            mask = ctx.add1("where", [mask, zero, hidden])
    cap = float(n.attr("softcap", 0.0) or 0.0)
    attrs = {"is_causal": bool(n.attr("is_causal", 0)), "scale": n.attr("scale"),
             **({"softcap": cap} if cap > 0 else {})}
    y = ctx.add1("sdpa", [q, k, v, mask], **attrs)
    if rank == 3:
        B, H, S, Dv = ctx.static_shape(y)
        y = ctx.add1("reshape", [ctx.add1("permute", [y], perm=(0, 2, 1, 3))], shape=(B, S, H * Dv))
    return [y]


CONVERTERS = {"Attention": attention}
OLDEST = {"Attention": 23}

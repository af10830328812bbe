"""BLOOM's attention with its ALiBi bias: products over (batch x head) in 3-D around a 4-D mask and softmax.

Note: Hugging Face's BLOOM (eager, its only form) computes ``baddbmm(alibi, q, k^T, beta=1, alpha=1/sqrt(d))`` on
(B*H, S, D) operands, views the scores as (B, H, Sq, Skv) to add the causal-and-padding mask and take the softmax, and
views the probabilities back for ``bmm(p, v)``. ALiBi's bias is one value per (batch x head, key): a per-key additive
term, which the attention kernel reads as its mask beside the mask's padding vector, with the causal triangle an index
test (``attention_mask.analyse``). The rewrite is one ``sdpa`` on (B, H, S, D) views of q, k and v, its output viewed
back as (B*H, Sq, Dv).
"""

from __future__ import annotations

from tilefuse.planner.attention_mask import sdpa_mask_args
from tilefuse.planner.pattern import Context, Emitter, Op, Opt, Pattern

_CAST = ("cast",)


def _root() -> Op:
    qk = Op("matmul", ("q", Op("transpose", ("k",), name="kt")), name="qk")
    s = Op("add", (Op(("mul", "div"), (qk, "scale"), name="scale_op"), "bias"), name="bias_op", commutative=True)
    s = Op("add", (Op("reshape", (s,), name="s4"), "mask"), name="mask_op", commutative=True)
    p = Op("softmax", (Opt(_CAST, s),), name="softmax")
    return Op("matmul", (Op("reshape", (Opt(_CAST, p),), name="p3"), "v"), name="root")


def _check(caps: dict, ctx: Context) -> str | None:
    q, k, v = (ctx.type(caps[x]).shape for x in ("q", "k", "v"))
    s4 = ctx.type(caps["s4"].outputs[0].name).shape
    if any(t is None or len(t) != 3 for t in (q, k, v)) or s4 is None or len(s4) != 4:
        return "not 3-D products around 4-D scores"
    if s4[0] * s4[1] != q[0] or k[0] != q[0] or v[0] != q[0] or tuple(s4[2:]) != (q[1], k[1]) or v[1] != k[1]:
        return "the 4-D scores do not split the products' (batch x head) dim"
    kt = caps["kt"].attr
    if sorted(d % 3 for d in (kt["dim0"], kt["dim1"])) != [1, 2]:
        return "k is not transposed in its last two dims"
    if caps["softmax"].attr.get("dim", -1) % 4 != 3 or tuple(ctx.type(caps["p3"].outputs[0].name).shape) != \
            (q[0], q[1], k[1]):
        return "the softmax is not over the keys, or its view back is not (batch x head, Sq, Skv)"
    s = ctx.scalar(caps["scale"])
    if s is None or s == 0:
        return "the score scale is not a constant"
    bias = ctx.type(caps["bias"]).shape
    if bias is None or len(bias) != 3 or bias[0] not in (1, q[0]) or bias[1] not in (1, q[1]) or bias[2] != k[1]:
        return "the bias is not (batch x head or 1, Sq or 1, Skv)"
    if len({ctx.type(caps[x]).dtype for x in ("q", "k", "v", "bias")}) != 1:
        return "q, k, v and the bias have different dtypes"
    return None


def _rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    B, H, Sq, Skv = ctx.type(caps["s4"].outputs[0].name).shape
    scale = ctx.scalar(caps["scale"])
    scale = scale if caps["scale_op"].op == "mul" else 1.0 / scale

    def heads(x: str) -> str:
        t = ctx.type(x).shape
        return em.add1("reshape", [x], shape=(B, H, *t[1:]) if t[0] == B * H else (1, 1, *t[1:]))

    mask, attrs = sdpa_mask_args(caps, ctx, em)
    bias = heads(caps["bias"])
    mask = em.add1("add", [bias, mask[0]]) if mask[0] else bias
    out = em.add1("sdpa", [heads(caps["q"]), heads(caps["k"]), heads(caps["v"]), mask], scale=float(scale), **attrs)
    root_t = ctx.type(caps["root"].outputs[0].name)
    out = em.add1("reshape", [out], shape=tuple(root_t.shape))
    return [out if em.type(out).dtype == root_t.dtype else em.add1("cast", [out], dtype=root_t.dtype)]


ALIBI = Pattern("attention.alibi_3d", _root(), _rewrite, _check,
                "bmm(view(softmax(view(q @ k^T * s + alibi) + mask)), v) -> sdpa (BLOOM)")

"""The pattern table, in priority order: decomposed forms rewritten to the ops our templates take.

Each entry is data: a tree of ``Op`` with named captures, a check that says why a match is refused,
and a rewrite. Families: ``attention.*`` (decomposed and grouped-query attention), ``norm.*`` (RMS
norm written out with pow/mean/rsqrt; a group norm through an instance norm, ``patterns_norm``), ``act.*``
(GELU written out), ``rotary.*`` (rotate-half), ``matmul.outer`` (a product over a contracted dim of 1); BLOOM's
ALiBi attention is ``patterns_alibi``'s, GPT-Neo's keys hidden by ``where`` ``patterns_hidden``'s.
Region-level patterns (residual add + norm, SwiGLU/GeGLU) live in ``GROUPS`` at the bottom.
"""

from __future__ import annotations

import math

import torch

from tilefuse import ops
from tilefuse.ir import torch_dtype
from tilefuse.planner import patterns_softcap
from tilefuse.planner.attention_mask import analyse, key_mask, mask_attrs, sdpa_mask_args
from tilefuse.planner.pattern import Context, Emitter, Op, Opt, Pattern, Prod, Scalar
from tilefuse.planner.patterns_alibi import ALIBI
from tilefuse.planner.patterns_hidden import MASKED_FILL_HIDDEN, WHERE_HIDDEN
from tilefuse.planner.patterns_norm import GROUP_VIA_INSTANCE

_CAST = ("cast",)


def _close(a: float | None, b: float, tol: float = 1e-3) -> bool:
    return a is not None and abs(a - b) <= tol * max(1.0, abs(b))


# ---- attention ------------------------------------------------------------------------------

def _kv_repeat(name: str) -> Op:
    """HF repeat_kv: (B, Hkv, S, D) -> unsqueeze(2) -> expand(B, Hkv, n, S, D) -> reshape(B, Hkv*n, S, D)."""
    return Op("reshape", (Op("expand", (Op("unsqueeze", (name,), name=f"{name}_unsq"),), name=f"{name}_exp"),),
              name=f"{name}_rep")


def _gqa_check(caps: dict, ctx: Context) -> str | None:
    for kv in ("k", "v"):
        src, unsq = ctx.type(caps[kv]), caps[f"{kv}_unsq"]
        if src.rank != 4 or unsq.attr.get("dims") not in ((2,), (-3,)):
            return f"{kv} is not repeated along the head dim"
        exp = ctx.type(caps[f"{kv}_exp"].outputs[0].name).shape
        rep = ctx.type(caps[f"{kv}_rep"].outputs[0].name).shape
        if exp is None or rep is None or len(exp) != 5 or rep[:1] + rep[2:] != exp[:1] + exp[3:]:
            return f"{kv} repeat does not merge the repeated dim into heads"
    return None


def _gqa_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    sdpa = caps["attn"]
    rest = list(sdpa.inputs[3:])
    return [em.add1("sdpa", [caps["q"], caps["k"], caps["v"], *rest], **sdpa.attr)]


_KT = Op(("transpose", "permute"), ("k",), name="kt")


def _attn_check(caps: dict, ctx: Context) -> str | None:
    kt = caps["kt"]
    rank = ctx.type(caps["k"]).rank
    if rank is None or rank < 3:
        return "k has unknown or low rank"
    if kt.op == "transpose" and sorted(d % rank for d in (kt.attr["dim0"], kt.attr["dim1"])) != [rank - 2, rank - 1]:
        return "k is not transposed in its last two dims"
    if caps["softmax"].attr.get("dim", -1) % ctx.type(caps["softmax"].outputs[0].name).rank != rank - 1:
        return "softmax is not over the key axis"
    if "scale" in caps:
        s = ctx.scalar(caps["scale"])
        if s is None or s == 0:
            return "the score scale is not a constant"
    if "mask" in caps and ctx.const(caps["mask"]) is None and ctx.type(caps["mask"]).dtype == "bool":
        return "boolean runtime masks are left decomposed"
    if "mask" in caps and (ctx.type(caps["mask"]).rank or 0) < 2:
        return "the additive term is not a (q, k) mask"
    if len({ctx.type(x).dtype for x in _same_dtype_qkv(caps, ctx)}) != 1:
        return "q, k and v have different dtypes (sdpa takes one)"
    return None


def _untransposed(k: str, caps: dict, ctx: Context, em: Emitter) -> str:
    """The (.., Skv, D) keys whose transpose the scores read: ``k`` itself, or where ``k^T`` is one permute of another
    layout (ONNX folds the head split's permute and the transpose into ``perm (0, 2, 3, 1)``), ``k`` permuted by that
    perm with its last two dims swapped."""
    if caps["kt"].op != "permute":
        return k
    perm = [p % ctx.type(k).rank for p in caps["kt"].attr["perm"]]
    if perm == [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]:
        return k
    return em.add1("permute", [k], perm=(*perm[:-2], perm[-1], perm[-2]))


def _same_dtype_qkv(caps: dict, ctx: Context) -> list[str]:
    """q, k, v; where they differ in dtype, the fp32 upcasts of q and k (GPT-Neo's, before its products) dropped: the
    kernel's products of fp16 values accumulate in fp32, as the upcast product does."""
    qkv = [caps[x] for x in ("q", "k", "v")]
    if len({ctx.type(x).dtype for x in qkv}) == 1:
        return qkv

    def plain(x: str) -> str:
        node = ctx.producers.get(x)
        up = node is not None and node.op == "cast" and node.inputs[0] and \
            ctx.type(x).dtype in _WIDER.get(ctx.type(node.inputs[0]).dtype, ())
        return node.inputs[0] if up else x
    return [plain(x) for x in qkv[:2]] + qkv[2:]


def _attn_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    if "scale" in caps:
        s = ctx.scalar(caps["scale"])
        scale = s if caps["scale_op"].op == "mul" else 1.0 / s
    else:
        scale = 1.0
    hidden = analyse(caps["mask"], ctx, caps["bias"]) if "bias" in caps else "no bias"
    if not isinstance(hidden, str):  # the bias only hides keys (GPT-Neo's where(local, s, fill)): one more mask term
        mask, attrs = key_mask(hidden, caps["mask"], ctx, em), mask_attrs(hidden)
    else:
        mask, attrs = sdpa_mask_args(caps, ctx, em)
    if isinstance(hidden, str) and "bias" in caps:  # T5: position bias + padding mask, one operand (H x S x S anyway)
        mask = [em.add1("add", [caps["bias"], mask[0]]) if mask[0] else caps["bias"]]
    q, k, v = _same_dtype_qkv(caps, ctx)
    attrs = {**attrs, **patterns_softcap.attrs(caps, ctx)}
    out = em.add1("sdpa", [q, _untransposed(k, caps, ctx, em), v, *mask], scale=float(scale), **attrs)
    root_t = ctx.type(caps["root"].outputs[0].name)
    if em.type(out).dtype != root_t.dtype:
        out = em.add1("cast", [out], dtype=root_t.dtype)
    return [out]


def _product(a, b, name: str, batched: bool) -> Op:
    """``a @ b``; ``batched``: as ATen's matmul decomposes a 4-D product, reshape to 3-D, bmm, reshape back."""
    if not batched:
        return Op("matmul", (a, b), name=name)
    inner = Op("matmul", (Op("reshape", (a,), name=f"{name}_ra"), Op("reshape", (b,), name=f"{name}_rb")))
    return Op("reshape", (inner,), name=name)


def _batched_check(caps: dict, ctx: Context) -> str | None:
    """The reshapes around each bmm only merge the leading (batch, head) dims of 4-D operands and split them back."""
    def shape(v):
        return ctx.type(v).shape

    for prod in ("qk", "root"):
        ra, rb, out = caps[f"{prod}_ra"], caps[f"{prod}_rb"], caps[prod]
        a, b = shape(ra.inputs[0]), shape(rb.inputs[0])
        if a is None or b is None or len(a) != 4 or len(b) != 4 or a[:2] != b[:2]:
            return f"the {prod} product's operands are not 4-D with the same (batch, head) dims"
        lead = a[0] * a[1]
        if shape(ra.outputs[0].name) != (lead, *a[2:]) or shape(rb.outputs[0].name) != (lead, *b[2:]):
            return f"the {prod} product's reshapes do not merge (batch, head)"
        if shape(out.outputs[0].name) != (*a[:2], a[2], b[3]):
            return f"the {prod} product's result is not split back into (batch, head)"
    return None


def _attention(scale: str, masked: bool, batched: bool = False, biased: bool = False, capped: bool = False) -> Pattern:
    """``scale``: "none", "after" (scores * s or / s) or "before" (q * s or / s); ``biased``: a second additive
    term (T5 adds its position bias, then the padding mask); ``capped``: Gemma 2's softcap before the mask."""
    q = Op(("mul", "div"), ("q", "scale"), name="scale_op") if scale == "before" else "q"
    s = _product(q, _KT, "qk", batched)
    if scale == "after":
        s = Op(("mul", "div"), (s, "scale"), name="scale_op")
    s = patterns_softcap.capped(s) if capped else s
    if biased:
        s = Op("add", (s, "bias"), name="bias_op", commutative=True)
    if masked:
        s = Op("add", (s, "mask"), name="mask_op", commutative=True)
    p = Op("softmax", (Opt(_CAST, s),), name="softmax")
    prod = _product(Opt(_CAST, p), "v", "root", batched)
    root = Op(prod.op, prod.inputs, name="root")
    name = ("attention.decomposed" + ("_batched" if batched else "")
            + {"none": "", "after": "_scaled", "before": "_scaled_q"}[scale] + ("_masked" if masked else "")
            + ("_biased" if biased else "") + ("_softcap" if capped else ""))

    def check(caps, ctx):
        return ((_batched_check(caps, ctx) if batched else None) or _attn_check(caps, ctx)
                or patterns_softcap.check(caps, ctx))

    return Pattern(name, root, _attn_rewrite, check, "matmul(softmax(q @ k^T * scale + mask), v) -> sdpa")


def _sdpa_mask_check(caps: dict, ctx: Context) -> str | None:
    attn, mask = caps["attn"], caps["mask"]
    mt = ctx.type(mask)
    if mt.shape is not None and len(mt.shape) >= 2 and mt.shape[-2] == 1:
        return "the mask is already per key"
    if attn.attr.get("is_causal") or attn.attr.get("window"):
        return "sdpa is already causal"
    parts = analyse(mask, ctx)
    return parts if isinstance(parts, str) else None


def _sdpa_mask_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    attn = caps["attn"]
    parts = analyse(caps["mask"], ctx)
    mask = key_mask(parts, caps["mask"], ctx, em)
    attrs = {**attn.attr, **mask_attrs(parts)}
    out = em.add1("sdpa", [caps["q"], caps["k"], caps["v"], *mask], **attrs)
    return [out]


# ---- norms ----------------------------------------------------------------------------------

def _rms_core(form: str) -> Op:
    """The three spellings of x / sqrt(mean(x^2) + eps): rsqrt-mul, sqrt-div, sqrt-reciprocal-mul."""
    var = Op("add", (Op("mean", (Op("pow", ("x", "two"), name="pow"),), name="mean"), "eps"), commutative=True)
    if form == "div":
        return Op("div", ("x", Op("sqrt", (var,))), name="norm")
    inv = Op("rsqrt", (var,)) if form == "rsqrt" else Op("reciprocal", (Op("sqrt", (var,)),))
    return Op("mul", ("x", inv), name="norm", commutative=True)


def _rms_check(caps: dict, ctx: Context) -> str | None:
    if not _close(ctx.scalar(caps["two"]), 2.0, 0):
        return "power is not 2"
    eps = ctx.scalar(caps["eps"])
    if eps is None or eps < 0 or eps > 1e-1:
        return "epsilon is not a small constant"
    rank = ctx.type(caps["x"]).rank
    mean = caps["mean"].attr
    if not rank:  # unknown, or a 0-d x (its mean over dim -1 is itself; no row to normalize)
        return "x has no last axis"
    if not mean.get("keepdim") or [d % rank for d in mean.get("dims") or ()] != [rank - 1]:
        return "mean is not over the last axis with keepdim"
    if "w" in caps:
        wt, xt = ctx.type(caps["w"]), ctx.type(caps["x"])
        if wt.shape is None or len(wt.shape) != 1 or wt.shape[0] != xt.shape[-1]:
            return "the weight is not a vector over the last axis"
    return None


def _rms_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    x = caps["x"]
    root_t = ctx.type(caps["root"].outputs[0].name)
    # x.float() -> norm -> .to(fp16) -> * w: the op computes in fp32 itself, so read the fp16 input.
    prod = ctx.producers.get(x)
    if prod is not None and prod.op == "cast" and ctx.type(prod.inputs[0]).dtype == root_t.dtype:
        x = prod.inputs[0]
    eps = ctx.scalar(caps["eps"])
    w = caps.get("w")
    if w is not None and ctx.type(w).dtype != ctx.type(x).dtype:
        out = em.add1("rms_norm", [x, ""], eps=eps)
        out = em.add1("mul", [out if ctx.type(x).dtype == root_t.dtype else em.add1(
            "cast", [out], dtype=root_t.dtype), w])
    else:
        out = em.add1("rms_norm", [x, w or ""], eps=eps)
    if em.type(out).dtype != root_t.dtype:
        out = em.add1("cast", [out], dtype=root_t.dtype)
    return [out]


def _rms(form: str, weighted: bool) -> Pattern:
    core = _rms_core(form)
    if weighted:
        root = Op("mul", (Opt(_CAST, core), "w"), name="root", commutative=True)
    else:
        root = Op(core.op, core.inputs, name="root", commutative=core.commutative)
    caps_name = "norm.rms" + ("" if form == "rsqrt" else f"_{form}") + ("" if weighted else "_unweighted")
    return Pattern(caps_name, root, _rms_rewrite, _rms_check, "x * rsqrt(mean(x^2) + eps) * w -> rms_norm")


# ---- activations ----------------------------------------------------------------------------

def _gelu_tanh_check(caps: dict, ctx: Context) -> str | None:
    want = {"half": 0.5, "one": 1.0, "c": math.sqrt(2 / math.pi), "k": 0.044715, "three": 3.0}
    for name, val in want.items():
        if not _close(ctx.scalar(caps[name]), val, 1e-4):
            return f"constant {name} is not {val:.6g}"
    return None


_GELU_TANH = Prod(("x", "half", Op("add", (Op("tanh", (Prod((
    "c", Op("add", ("x", Prod(("k", Op("pow", ("x", "three"))))), commutative=True))),)), "one"), commutative=True)),
    name="root")


def _gelu_rewrite(approx: str):
    return lambda caps, ctx, em: [em.add1("gelu", [caps["x"]], approximate=approx)]


def _gelu_erf_check(caps: dict, ctx: Context) -> str | None:
    if not _close(ctx.scalar(caps["half"]), 0.5) or not _close(ctx.scalar(caps["one"]), 1.0):
        return "constants are not 0.5 and 1"
    s = ctx.scalar(caps["s"])
    ok = (caps["sdiv"].op == "div" and _close(s, math.sqrt(2))) or (
        caps["sdiv"].op == "mul" and _close(s, 1 / math.sqrt(2)))
    return None if ok else "erf argument is not x / sqrt(2)"


_GELU_ERF = Prod(("x", "half", Op("add", (Op("erf", (Op(("div", "mul"), ("x", "s"), name="sdiv"),)), "one"),
                                         commutative=True)), name="root")


_SILU = Op("mul", ("x", Op("sigmoid", ("x",))), name="root", commutative=True)


# ---- layout ---------------------------------------------------------------------------------

_T_VIA_RESHAPE = Op("reshape", (Op("permute", (Op("reshape", ("x",), name="flat"),), name="perm"),), name="root")


def _t_via_reshape_check(caps: dict, ctx: Context) -> str | None:
    """reshape(permute(reshape(x, (prod(lead), m, n)), (0, 2, 1)), lead + (n, m)) is x^T over the last two."""
    x, flat, out = ctx.type(caps["x"]).shape, ctx.type(caps["flat"].outputs[0].name).shape, \
        ctx.type(caps["root"].outputs[0].name).shape
    if x is None or flat is None or out is None or len(flat) != 3 or tuple(caps["perm"].attr["perm"]) != (0, 2, 1):
        return "not a batched transpose"
    if len(x) < 2 or tuple(x[-2:]) != tuple(flat[1:]) or tuple(out[-2:]) != (x[-1], x[-2]):
        return "the reshapes do not keep the last two dims"
    return None


def _t_via_reshape(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    out = ctx.type(caps["root"].outputs[0].name).shape
    x = caps["x"]
    lead = tuple(out[:-2])
    if tuple(ctx.type(x).shape[:-2]) != lead:
        x = em.add1("reshape", [x], shape=lead + tuple(ctx.type(x).shape[-2:]))
    return [em.add1("transpose", [x], dim0=-2, dim1=-1)]


_WIDER = {"float16": ("float32", "float64"), "bfloat16": ("float32", "float64"), "float32": ("float64",)}
_GUARDS = ("none", "safe", "nan")


def _widening(caps: dict, ctx: Context, name: str) -> bool:
    """The optional cast captured as ``{name}_cast`` is absent or a float upcast (fp16/bf16 -> fp32...)."""
    cast = caps.get(f"{name}_cast")
    return cast is None or cast.outputs[0].type.dtype in _WIDER.get(ctx.type(cast.inputs[0]).dtype, ())


def _row_all(node, scores_t) -> bool:
    """``node`` reduces its boolean input with ``all`` over the last dim, keeping it: ``(..., S) -> (..., 1)``
    (a converted ``all`` op or ATen's ``all.dim`` run through torch, whichever the frontend made of it)."""
    out = node.outputs[0].type.shape
    if scores_t.shape is None or out != (*scores_t.shape[:-1], 1):
        return False
    rank = len(scores_t.shape)
    if node.op == "torch_fallback":
        args = tuple(node.attr.get("args") or ())
        target = str(node.attr.get("target"))
        if target not in ("aten::all.dim", "aten::all.dims") or len(args) < 3 or not args[2]:
            return False
        dims = args[1] if isinstance(args[1], (tuple, list)) else (args[1],)
        return [d % rank for d in dims] == [rank - 1]
    dims = node.attr.get("dims", node.attr.get("dim", node.attr.get("axes")))
    dims = dims if isinstance(dims, (tuple, list)) else (dims,)
    return node.attr.get("keepdim", node.attr.get("keepdims", True)) and [
        d % rank for d in dims if d is not None] == [rank - 1]


def _guard_check(caps: dict, ctx: Context) -> str | None:
    """torch's ``_safe_softmax`` (``where(all(s == -inf, -1), 0, softmax(s))``) gives 0 to a row whose every
    score is -inf, as the flash kernel does; ONNX's ``where(isnan(p), 0, p)`` needs finite masks."""
    if "safe" in caps:
        if ctx.scalar(caps["ninf"]) != float("-inf") or ctx.scalar(caps["zero"]) != 0.0:
            return "the softmax guard does not test for -inf rows or fills another value than 0"
        if not _row_all(caps["row_all"], ctx.type(caps["softmax"].inputs[0])):
            return "the softmax guard does not reduce over the key axis"
    return _finite_mask_check(caps, ctx)


def _split_scale_check(caps: dict, ctx: Context) -> str | None:
    for s in ("s1", "s2"):
        if s in caps and ctx.scalar(caps[s]) is None:
            return f"score scale {s} is not a constant"
    for name in ("q", "k", "v", "mask"):
        if not _widening(caps, ctx, name):
            return f"the cast of {name} is not a float upcast"
    return _attn_check({**caps, "scale": caps.get("s1", caps.get("s2"))}, ctx)


def _qkv(caps: dict, ctx: Context) -> list[str]:
    """q, k, v in the dtype the model made them: the math path's fp32 upcasts are dropped when all three
    came from one dtype (the kernel accumulates in fp32 anyway), else the upcast values are kept."""
    pre = [caps[x] for x in ("q", "k", "v")]
    if len({ctx.type(x).dtype for x in pre}) == 1:
        return pre
    return [caps[f"{x}_cast"].outputs[0].name if f"{x}_cast" in caps else caps[x] for x in ("q", "k", "v")]


def _split_scale_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    """q*s1 @ (k^T*s2): the scale is s1*s2 (torch's math SDPA and its ONNX export split sqrt(scale) over both)."""
    scale = math.prod(ctx.scalar(caps[s]) for s in ("s1", "s2") if s in caps)
    mask, attrs = sdpa_mask_args(caps, ctx, em)
    q, k, v = _qkv(caps, ctx)
    out = em.add1("sdpa", [q, _untransposed(k, caps, ctx, em), v, *mask], scale=float(scale), **attrs)
    root_t = ctx.type(caps["root"].outputs[0].name)
    if em.type(out).dtype != root_t.dtype:
        out = em.add1("cast", [out], dtype=root_t.dtype)
    return [out]


def _nan_guarded(sm: Op) -> Op:
    """where(isnan(p), 0, p): torch's ONNX export guards rows that a mask hides entirely."""
    return Op("where", (Op("isnan", (sm,)), "nan_fill", sm), name="nan_guard")


def _safe_softmax(scores: Op) -> Op:
    """torch's ``_safe_softmax`` decomposed: ``where(all(s == -inf, dim=-1, keepdim), 0, softmax(s))``."""
    row_all = Op(("all", "reduce_all", "torch_fallback"), (Op("eq", (scores, Scalar("ninf")), commutative=True),),
                 name="row_all")
    return Op("where", (row_all, Scalar("zero"), Op("softmax", (scores,), name="softmax")), name="safe")


def _finite_mask_check(caps: dict, ctx: Context) -> str | None:
    """The NaN guard only matters when a row can be fully masked with -inf: accept finite masks."""
    if "nan_guard" not in caps:
        return None
    if ctx.scalar(caps["nan_fill"]) != 0.0:
        return "the NaN guard fills another value than 0"
    if "mask" not in caps:
        return None
    m = ctx.const(caps["mask"])
    if m is not None:
        return None if bool(torch.isfinite(m).all()) else "a constant mask with -inf rows"
    prod = ctx.producers.get(caps["mask"])
    if prod is not None and prod.op == "where":
        vals = [ctx.const(i) for i in prod.inputs[1:]]
        if all(v is not None and bool(torch.isfinite(v).all()) for v in vals):
            return None
    return "the mask may hide whole rows with -inf, where the NaN guard differs from sdpa"


def _attention_split_scale(masked: bool, guard: str = "none", batched: bool = False, sides: str = "both") -> Pattern:
    """Attention as torch's math SDPA writes it (``_scaled_dot_product_attention_math``, also what dynamo hands
    us on CUDA when no fused kernel takes the mask) and as its ONNX export does: fp16/bf16 q, k, v (and mask)
    upcast to fp32, sqrt(scale) multiplied into q and into k^T (``sides``: "both", or the whole scale on "q" or
    "k" alone), the mask added, softmax (``guard``: plain, ``_safe_softmax``'s -inf-row guard or ONNX's NaN
    guard), the product with v, cast back. ``batched``: 4-D products as ATen's reshape-bmm-reshape."""
    q = Opt(_CAST, "q", name="q_cast")
    kt = Op(("transpose", "permute"), (Opt(_CAST, "k", name="k_cast"),), name="kt")
    if sides in ("both", "q"):
        q = Op("mul", (q, Scalar("s1")), commutative=True)
    if sides in ("both", "k"):
        kt = Op("mul", (kt, Scalar("s2")), commutative=True)
    s = _product(q, kt, "qk", batched)
    if masked:
        s = Op("add", (s, Opt(_CAST, "mask", name="mask_cast")), name="mask_op", commutative=True)
    probs = {"none": lambda: Op("softmax", (s,), name="softmax"), "safe": lambda: _safe_softmax(s),
             "nan": lambda: _nan_guarded(Op("softmax", (s,), name="softmax"))}[guard]()
    prod = _product(probs, Opt(_CAST, "v", name="v_cast"), "root", batched)
    root = Op(prod.op, prod.inputs, name="root")
    name = ("attention.decomposed" + ("_batched" if batched else "")
            + {"both": "_split_scale", "q": "_math_scaled_q", "k": "_math_scaled_k"}[sides]
            + ("_masked" if masked else "") + {"none": "", "safe": "_safe", "nan": "_nanguard"}[guard])

    def check(caps, ctx):
        return ((_batched_check(caps, ctx) if batched else None) or _guard_check(caps, ctx)
                or _split_scale_check(caps, ctx))

    return Pattern(name, root, _split_scale_rewrite, check,
                   "matmul(softmax((q*s1) @ (k^T*s2) + mask), v), upcasts and softmax guards included -> sdpa")


_UPCAST_PAIRS = {("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"), ("bfloat16", "float64"),
                 ("float32", "float64")}
_ROUND_TRIP = Op("cast", (Op("cast", ("x",), name="up"),), name="root")


def _round_trip_check(caps: dict, ctx: Context) -> str | None:
    x, up, root = ctx.type(caps["x"]), caps["up"].outputs[0].type, caps["root"].outputs[0].type
    if (x.dtype, up.dtype) not in _UPCAST_PAIRS or root != x:
        return "not an exact float upcast and back"
    src = caps["x"]
    if caps["root"].outputs[0].name in ctx.graph.outputs and (
            src in ctx.graph.constants or any(v.name == src for v in ctx.graph.inputs)):
        return "the graph output would alias a graph input or constant"
    return None


# ---- rotary ---------------------------------------------------------------------------------

_ROTATE_HALF = Op("concat", (Op("neg", (Op("slice", ("x",), name="hi"),)), Op("slice", ("x",), name="lo")), name="cat")
_ROTARY = Op("add", (Op("mul", ("x", "cos"), commutative=True),
                     Op("mul", (_ROTATE_HALF, "sin"), commutative=True)), name="root", commutative=True)


def _rotary_check(caps: dict, ctx: Context) -> str | None:
    xt = ctx.type(caps["x"])
    if xt.shape is None or not isinstance(xt.shape[-1], int) or xt.shape[-1] % 2:
        return "the rotated dim is not static and even"
    d, half = len(xt.shape), xt.shape[-1] // 2
    hi, lo, cat = caps["hi"].attr, caps["lo"].attr, caps["cat"].attr
    last = lambda a: a.get("dim") % d == d - 1
    if not (last(hi) and last(lo) and cat.get("dim") % d == d - 1):
        return "slices/concat are not along the last dim"
    if hi.get("start") != half or hi.get("step", 1) != 1 or (hi.get("end") or xt.shape[-1]) < xt.shape[-1]:
        return "the high slice is not x[..., d/2:]"
    if lo.get("start") not in (0, None) or lo.get("end") != half or lo.get("step", 1) != 1:
        return "the low slice is not x[..., :d/2]"
    for name in ("cos", "sin"):
        if ctx.type(caps[name]).dtype != xt.dtype:
            return f"{name} has another dtype than x"
    return None


def _rotary_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    return [em.add1("rotary_embedding", [caps["x"], caps["cos"], caps["sin"]])]


# ---- softmax written out ----------------------------------------------------------------------

# exp(x - amax(x, d, keepdim)) / sum(that exp, d, keepdim): the numerator is the captured value "e", checked to be the
# exp the sum reads (a pattern tree cannot name one node twice)
_SOFTMAX_EXP = Op("div", ("e", Op("sum", (Op("exp", (Op("sub", ("x", Op("amax", ("x",), name="mx"))),), name="ex"),),
                                  name="sm")), name="div")


def _softmax_exp_check(caps: dict, ctx: Context) -> str | None:
    if caps["e"] != caps["ex"].outputs[0].name:
        return "the numerator is not the exp the sum reads"
    rank = ctx.type(caps["x"]).rank
    axes = []
    for red in (caps["mx"], caps["sm"]):
        dims = red.attr.get("dims")
        if not red.attr.get("keepdim") or dims is None or len(dims) != 1 or rank is None:
            return f"{red.op} is not over one kept dim"
        axes.append(dims[0] % rank)
    if axes[0] != axes[1]:
        return "the max and the sum are over different dims"
    if caps["sm"].attr.get("dtype") not in (None, ctx.type(caps["x"]).dtype):
        return "the sum changes the dtype"
    if ctx.type(caps["div"].outputs[0].name) != ctx.type(caps["x"]):
        return "the quotient's type is not the input's"
    return None


def _softmax_exp_rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    rank = ctx.type(caps["x"]).rank
    return [em.add1("softmax", [caps["x"]], dim=caps["mx"].attr["dims"][0] % rank)]


# ---- a product over one element ------------------------------------------------------------

_OUTER = Op("matmul", ("a", "b"), name="root")


def _outer_check(caps: dict, ctx: Context) -> str | None:
    """``a @ b`` whose contracted dim is 1 (``a (.., M, 1)``, ``b (.., 1, N)``): each output element is one product,
    which ``a * b`` (broadcast) computes with the same rounding (but where the user lets float32 matmuls run as TF32:
    the product is then the exact one, not the TF32 one). HF LLaMA's rotary frequencies
    (``inv_freq[:, None] @ position[None, :]``, float32) are one: as a GEMM it runs through torch and splits the
    elementwise chain around it."""
    ta, tb = ctx.type(caps["a"]), ctx.type(caps["b"])
    if ta.shape is None or tb.shape is None or len(ta.shape) < 2 or len(tb.shape) < 2:
        return "an operand is 1-d or of unknown rank"
    if ta.shape[-1] != 1 or tb.shape[-2] != 1:
        return "the contracted dim is not 1"
    if ta.dtype != tb.dtype or not torch_dtype(ta.dtype).is_floating_point:
        return "not two operands of one float dtype"
    try:
        mul = ops.infer_types("mul", [ta, tb], {})[0]
    except ops.InferenceError as e:  # batch dims a mul does not broadcast: leave the matmul
        return f"the broadcast product does not type: {e}"
    if mul != ctx.type(caps["root"].outputs[0].name):
        return "the broadcast product's type is not the matmul's"
    return None


# ---- the table, highest priority first ------------------------------------------------------

PATTERNS: list[Pattern] = [
    Pattern("act.softmax_exp", _SOFTMAX_EXP, _softmax_exp_rewrite, _softmax_exp_check,
            "exp(x - amax(x)) / sum(exp(x - amax(x))) over one dim -> softmax (then the attention patterns see it)"),
    Pattern("cast.round_trip", _ROUND_TRIP, lambda caps, ctx, em: [caps["x"]], _round_trip_check,
            "cast(cast(x, float32), x.dtype) -> x: exact (an sdpa rewritten from the math form on fp16 leaves one)"),
    Pattern("layout.transpose_via_reshape", _T_VIA_RESHAPE, _t_via_reshape, _t_via_reshape_check,
            "reshape/permute/reshape that swaps the last two dims -> transpose"),
    WHERE_HIDDEN,
    MASKED_FILL_HIDDEN,
    *[_attention_split_scale(masked, guard, batched, sides) for sides in ("both", "q", "k")
      for batched in (True, False) for guard in _GUARDS for masked in (True, False)],
    Pattern("attention.gqa_repeat", Op("sdpa", ("q", _kv_repeat("k"), _kv_repeat("v")), name="attn"),
            _gqa_rewrite, _gqa_check, "sdpa over repeat_kv(k), repeat_kv(v) -> grouped-query sdpa"),
    *[_attention(scale, True, batched, biased=True) for batched in (True, False) for scale in ("after", "none")],
    ALIBI,
    *[_attention("after", masked, batched, capped=True) for batched in (True, False) for masked in (True, False)],
    *[_attention(scale, masked, batched) for batched in (True, False) for scale in ("after", "before", "none")
      for masked in (True, False)],
    Pattern("attention.mask_from_indices", Op("sdpa", ("q", "k", "v", "mask"), name="attn"), _sdpa_mask_rewrite,
            _sdpa_mask_check, "sdpa(q, k, v, where(causal & window & pad, 0, fill)) -> causal sdpa + key mask"),
    *GROUP_VIA_INSTANCE,
    *[_rms(form, weighted=True) for form in ("rsqrt", "div", "reciprocal")],
    *[_rms(form, weighted=False) for form in ("rsqrt", "div", "reciprocal")],
    Pattern("act.gelu_tanh", _GELU_TANH, _gelu_rewrite("tanh"), _gelu_tanh_check, "GPT-2's gelu_new -> gelu(tanh)"),
    Pattern("act.gelu_erf", _GELU_ERF, _gelu_rewrite("none"), _gelu_erf_check, "0.5x(1+erf(x/sqrt2)) -> gelu"),
    Pattern("act.silu", _SILU, lambda caps, ctx, em: [em.add1("silu", [caps["x"]])], doc="x * sigmoid(x) -> silu"),
    Pattern("rotary.rotate_half", _ROTARY, _rotary_rewrite, _rotary_check, "x*cos + rotate_half(x)*sin -> rotary"),
    Pattern("matmul.outer", _OUTER, lambda caps, ctx, em: [em.add1("mul", [caps["a"], caps["b"]])], _outer_check,
            "a @ b over a contracted dim of 1 -> a * b (broadcast): elementwise, fused with its neighbours"),
]

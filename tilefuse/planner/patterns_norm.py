"""Group norms spelled through an instance norm (``norm.group_via_instance``), as torch's ONNX exporters write
``nn.GroupNorm``: ``reshape(x, (N, G, -1))``, ``InstanceNormalization`` with a scale of ones and a bias of zeros (one
per group), ``reshape`` back, then the per-channel ``Mul`` and ``Add``. Rewritten to one ``group_norm``, its affine map
inside, so the norm and what follows fuse into one kernel (``lowering/norm_builder.py``) where the spelled form runs
the per-channel map as a second pass. ONNX Runtime's optimizer fuses the same form. Entries of ``patterns.PATTERNS``.
"""

from __future__ import annotations

from tilefuse.planner.pattern import Context, Emitter, Op, Pattern


def _spelled(affine: bool) -> Op:
    flat = Op("reshape", ("x",), name="flat")
    back = Op("reshape", (Op("instance_norm", (flat, "ones", "zeros"), name="inorm"),), name="back")
    if not affine:
        return back
    return Op("add", (Op("mul", (back, "gamma"), name="scale", commutative=True), "beta"), name="root",
              commutative=True)


def _check(caps: dict, ctx: Context) -> str | None:
    x, flat = ctx.type(caps["x"]).shape, ctx.type(caps["flat"].outputs[0].name).shape
    back = ctx.type(caps["back"].outputs[0].name).shape
    if x is None or flat is None or back is None or len(x) < 3 or len(flat) != 3:
        return "not a (N, G, -1) view of a channels-first tensor"
    n, c, groups = x[0], x[1], flat[1]
    if flat[0] != n or groups < 1 or c % groups or back != x:
        return "the reshapes do not split the channels into groups and back"
    for name, value in (("ones", 1.0), ("zeros", 0.0)):
        t = ctx.const(caps[name])
        if t is None or t.numel() != groups or not bool((t == value).all()):
            return f"the instance norm's {'scale' if value else 'bias'} is not all {value:g}"
    for name in ("gamma", "beta"):
        if name in caps and _channels(ctx.type(caps[name]).shape, len(x)) != c:
            return f"{name} is not one value per channel"
    return None


def _channels(shape, rank: int) -> int | None:
    """The channel count of a per-channel operand of a rank-``rank`` NC... tensor: ``(C, 1, ...)`` right-aligned
    (with leading ones), else None."""
    if shape is None or len(shape) > rank:
        return None
    dims = (1,) * (rank - len(shape)) + tuple(shape)
    return dims[1] if dims[0] == 1 and all(d == 1 for d in dims[2:]) else None


def _rewrite(caps: dict, ctx: Context, em: Emitter) -> list[str]:
    c = ctx.type(caps["x"]).shape[1]
    vectors = [em.add1("reshape", [caps[k]], shape=(c,)) if k in caps else "" for k in ("gamma", "beta")]
    groups = ctx.type(caps["flat"].outputs[0].name).shape[1]
    return [em.add1("group_norm", [caps["x"], *vectors], groups=groups, eps=caps["inorm"].attr.get("eps", 1e-5))]


GROUP_VIA_INSTANCE = [
    Pattern(f"norm.group_via_instance{'' if affine else '_plain'}", _spelled(affine), _rewrite, _check,
            "reshape -> instance_norm (ones, zeros) -> reshape" + (" -> * gamma + beta" if affine else "")
            + " -> group_norm")
    for affine in (True, False)
]

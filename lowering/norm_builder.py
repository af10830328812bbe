"""The group norm region builder (``dispatch.build`` calls it for ``reduction`` regions anchored on a group or
instance norm): the norm, its producers and its consumers as one ``row_reduction`` kernel.

Note: on channels-first data a group's channels lie next to each other, so ``(N, C, *S)`` read as
``(N, G, C/G * prod(S))`` has one group a row, and the group norm is the row reduction's layer norm without its
affine map. The affine map is per channel, which no broadcast against that domain reads; it and every other operand
are ``Load``s at the index of the element's place in ``(N, C, *S)`` (``index.reshape`` of the domain's
coordinates). An instance norm is a group norm with a group per channel.
"""

from __future__ import annotations

from tilefuse.ir import Node
from tilefuse.lowering import index
from tilefuse.lowering.builders import (
    PASS_VIEWS,
    TEMPLATE_DTYPES,
    Builder,
    KernelSpec,
    check_dtypes,
    loaded_operand,
    numel,
    require,
)
from tilefuse.lowering.expr import Acc, Arg, Call, Coord, Expr, Load, substitute, walk
from tilefuse.ops.nn import norm_groups


def build_group_norm(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """A ``group_norm`` or ``instance_norm`` region's ``row_reduction`` spec (see the module note)."""
    x = anchor.inputs[0]
    xs = tuple(b.types[x].shape)
    require(len(xs) >= 2, f"a group norm of a {len(xs)}-d tensor")
    N, C, inner = xs[0], xs[1], numel(xs[2:])
    groups = norm_groups(anchor.op, anchor.attr, C)
    require(groups > 0 and C % groups == 0, f"{groups} groups of {C} channels")
    cg = C // groups
    domain = (N, groups, cg * inner)
    pos = b.members.index(anchor)
    before, after = b.members[:pos], b.members[pos + 1:]
    inside = {o.name for n in b.members for o in n.outputs}
    for n in (*before, *after):  # every operand broadcasts against X's shape (see _load)
        shape = tuple(n.outputs[0].type.shape)
        # after a view of the result, elementwise ops of another shape of the same size (a cast to another
        # norm's dtype) are the same per element, where they read no operand that would broadcast against it
        require(n.op in PASS_VIEWS or shape == xs or (
            n in after and numel(shape) == numel(xs)
            and all(i in inside or numel(b.types[i].shape) == 1 for i in n.inputs if i)),
                f"{n.op} ({n.name}) computes another shape than the norm's {xs}")
    loaded, env = loaded_operand(b, x, before, lambda t: numel(t.shape) == numel(xs),
                                 "the norm's input is not built from a full-size operand")
    producer = env.get(x) if x in b.produced else None
    pre_values = [o for o in b.region.outputs if o in env]
    for o in pre_values:
        require(env[o] == producer, "the region writes an intermediate other than the norm's input")
    affine: Expr = Acc()
    weight, bias = (anchor.inputs[k] if len(anchor.inputs) > k else "" for k in (1, 2))
    channel = [v for v in (weight, bias) if v]
    for v in channel:
        require(tuple(b.types[v].shape) == (C,), f"a group norm's weight or bias of shape {b.types[v].shape}")
    if weight:
        affine = Call("mul", (affine, b.leaf(weight)))
    if bias:
        affine = Call("add", (affine, b.leaf(bias)))
    cenv = b.pointwise(after, {anchor.outputs[0].name: affine})
    outs = [o for o in b.region.outputs if o not in pre_values]
    require(bool(outs) and all(o in cenv for o in outs) and len({cenv[o] for o in outs}) == 1,
            "the reduction region's outputs are not its result")
    extra = list(b.args)
    require(loaded not in extra and all(not any(v in n.inputs for n in b.members if n is not anchor)
                                        for v in channel),
            "the norm's input, weight or bias is also read by the fused expressions")
    # where element (n, g, j) of the domain lies in (N, C, *S), and its channel
    at = index.reshape(xs, domain, index.coords(domain))
    ch = index.add(index.mul(Coord(1), cg), index.floordiv(Coord(2), inner))
    loads: dict[Expr, Expr] = {Arg(i): _load(i, e, b, xs, at, ch, channel) for i, e in enumerate(extra)}
    producer = substitute(producer, loads) if producer not in (None, Acc()) else None
    consumer = substitute(cenv[outs[0]], loads) if cenv[outs[0]] != Acc() else None
    require(not any(isinstance(n, Arg) for e in (producer, consumer) if e is not None for n in walk(e)),
            "an operand the kernel cannot index")
    out_t = b.types[outs[0]]
    dtypes = (b.types[loaded].dtype, out_t.dtype, *(b.types[e].dtype for e in extra))
    require(b.types[x].dtype in TEMPLATE_DTYPES and b.types[loaded].dtype in TEMPLATE_DTYPES,
            f"input dtype {b.types[x].dtype}")
    check_dtypes(dtypes, target, "row_reduction")
    params = {"shape": domain, "kind": "layer_norm", "x_dtype": b.types[loaded].dtype, "out_dtype": out_t.dtype,
              "eps": float(anchor.attr.get("eps", 1e-5)), "correction": 1, "keepdim": True, "has_weight": False,
              "has_bias": False, "weight_dtype": None, "producer": producer, "consumer": consumer,
              "extra_shapes": tuple(tuple(b.types[e].shape) for e in extra),
              "extra_dtypes": tuple(b.types[e].dtype for e in extra), "write_pre": bool(pre_values),
              "pre_dtype": b.types[pre_values[0]].dtype if pre_values else None}
    inputs = [(loaded, domain), *((e, None) for e in extra)]
    mapping = [(1 if o in pre_values else 0, o, tuple(b.types[o].shape)) for o in b.region.outputs]
    return KernelSpec("row_reduction", tuple(params.items()), (-2, -1) if pre_values else (-1,), tuple(inputs),
                      tuple(mapping), tuple(b.pre))


def _load(i: int, value: str, b: Builder, xs: tuple, at: tuple, ch: Expr, channel: list[str]) -> Expr:
    """Extra ``i`` (``value``) read at the element's place: a weight or bias at its channel, any other operand
    broadcast against X's shape."""
    if value in channel:
        return Load(i, (ch,))
    shape = tuple(b.types[value].shape)
    require(len(shape) <= len(xs) and all(d in (1, x) for d, x in zip(shape[::-1], xs[::-1])),
            f"an operand of shape {shape} against the norm's {xs}")
    return Load(i, index.broadcast(shape, at))

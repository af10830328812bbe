"""Index maps: each output element of a region as an expression over its inputs read at computed places.

Note: the builder *pulls*. To produce value ``v`` at index ``idx`` (a tuple of integer expressions
in ``v``'s shape) it asks the node that made ``v`` which of its inputs it reads, and where: a
transpose swaps two entries of ``idx``, a slice scales and shifts one, a reshape re-groups dims, a
concat selects between its inputs by an index range, an embedding reads the id tensor first and
then the table at that id, an elementwise op reads each operand at ``idx`` broadcast. Outside
values become ``Arg(i)`` (read under numpy broadcasting against the output, as the templates
always did) or, when the read is anything else, ``Load(i, index)``. One ``RULES`` table holds one
function per op; returning an expression is the only thing a rule does, so a new injective op is
one small function. The result is plain data (``lowering.expr``): the elementwise template emits
it, ``expr.evaluate`` is its reference.

Note: a ``Load`` trusts its index, so rules keep every index inside its tensor even on the branch
of a ``where`` that is not taken (TIR's ``Select`` may evaluate both): concat pieces and pad
borders clamp their shifted index, and indices read from data (embedding ids, gather indices)
wrap negatives as the registry references do and clamp to the table (an out-of-range id reads the
nearest row instead of faulting). Index arithmetic folds constants as it is built, so the
expressions (and kernel cache keys) of plain layouts stay small.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tilefuse import ops
from tilefuse.ir import Node, TensorType
from tilefuse.lowering.expr import Call, Const, Coord, Expr
from tilefuse.lowering.templates.common import broadcast_shapes, numel

INDEX_DTYPE = "int32"
MAX_EXPR_NODES = 4096  # a region whose expressions unfold larger runs through torch


class NotLowerable(Exception):
    """Why a region cannot run as a TileLang kernel (``dispatch.build`` returns the message)."""


def require(cond: bool, why: str) -> None:
    if not cond:
        raise NotLowerable(why)


# ---- index arithmetic, folded as it is built -------------------------------------------------------

def lit(v: int) -> Const:
    return Const(int(v), INDEX_DTYPE)


def _int(e: Expr) -> int | None:
    if isinstance(e, Const) and not isinstance(e.value, (bool, float)) and e.dtype.startswith(("int", "uint")):
        return int(e.value)
    return None


def add(a: Expr, b: Expr) -> Expr:
    x, y = _int(a), _int(b)
    if x is not None and y is not None:
        return lit(x + y)
    if x == 0:
        return b
    if y == 0:
        return a
    if y is not None and isinstance(a, Call) and a.op == "add" and _int(a.args[1]) is not None:
        return add(a.args[0], lit(_int(a.args[1]) + y))
    return Call("add", (a, b))


def sub(a: Expr, b: Expr) -> Expr:
    y = _int(b)
    return add(a, lit(-y)) if y is not None else Call("sub", (a, b))


def mul(a: Expr, k: int) -> Expr:
    x = _int(a)
    if x is not None:
        return lit(x * k)
    return a if k == 1 else lit(0) if k == 0 else Call("mul", (a, lit(k)))


def floordiv(a: Expr, k: int) -> Expr:
    x = _int(a)
    return lit(x // k) if x is not None else a if k == 1 else Call("floor_divide", (a, lit(k)))


def mod(a: Expr, k: int) -> Expr:
    x = _int(a)
    return lit(x % k) if x is not None else lit(0) if k == 1 else Call("remainder", (a, lit(k)))


def clamp(a: Expr, lo: int | None, hi: int | None) -> Expr:
    """``a`` kept in ``[lo, hi]`` (either bound may be None)."""
    x = _int(a)
    if x is not None:
        return lit(min(max(x, lo if lo is not None else x), hi if hi is not None else x))
    if hi is not None:
        a = Call("minimum", (a, lit(hi)))
    if lo is not None:
        a = Call("maximum", (a, lit(lo)))
    return a


def where(cond: Expr, a: Expr, b: Expr) -> Expr:
    return Call("where", (cond, a, b))


def cmp(op: str, a: Expr, b: Expr | int) -> Expr:
    return Call(op, (a, lit(b) if isinstance(b, int) else b))


def wrap_clamp(i: Expr, n: int) -> Expr:
    """An index read from data: negatives count from the end (the references' rule), then clamped."""
    return clamp(where(cmp("lt", i, 0), add(i, lit(n)), i), 0, n - 1)


# ---- shapes ---------------------------------------------------------------------------------------

def coords(shape: Sequence[int]) -> tuple[Expr, ...]:
    """The identity index of ``shape``: its produced element's coordinates."""
    return tuple(Coord(d) for d in range(len(shape)))


def broadcast(in_shape: Sequence[int], idx: Sequence[Expr]) -> tuple[Expr, ...]:
    """Where an operand of ``in_shape`` is read at output ``idx`` under numpy broadcasting."""
    lead = len(idx) - len(in_shape)
    require(lead >= 0, f"an operand of rank {len(in_shape)} read at a rank-{len(idx)} index")
    return tuple(lit(0) if int(d) == 1 else idx[lead + k] for k, d in enumerate(in_shape))


def ravel(idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
    flat: Expr = lit(0)
    for c, d in zip(idx, shape):
        flat = add(mul(flat, int(d)), c)
    return flat


def unravel(flat: Expr, shape: Sequence[int]) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for k, d in enumerate(reversed(shape)):
        if k == len(shape) - 1:
            out.append(flat)
        else:
            out.append(mod(flat, int(d)))
            flat = floordiv(flat, int(d))
    return tuple(reversed(out))


def reshape(in_shape: Sequence[int], out_shape: Sequence[int], idx: Sequence[Expr]) -> tuple[Expr, ...]:
    """The index into ``in_shape`` of element ``idx`` of its row-major reshape to ``out_shape``.

    Dims are matched in groups of equal size products, so a dim that survives a reshape maps to
    itself and only merged or split dims cost a multiply or a division."""
    ins = [k for k, d in enumerate(in_shape) if d != 1]
    outs = [k for k, d in enumerate(out_shape) if d != 1]
    result: list[Expr] = [lit(0)] * len(in_shape)
    i = j = 0
    while i < len(ins):
        gi, gj = [ins[i]], [outs[j]]
        pi, pj = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(ins[i])
                pi, i = pi * in_shape[ins[i]], i + 1
            else:
                gj.append(outs[j])
                pj, j = pj * out_shape[outs[j]], j + 1
        flat = ravel([idx[k] for k in gj], [out_shape[k] for k in gj])
        for k, c in zip(gi, unravel(flat, [in_shape[k] for k in gi])):
            result[k] = c
    return tuple(result)


# ---- the builder ----------------------------------------------------------------------------------

At = Callable[[str, tuple], Expr]


class IndexBuilder:
    """Expressions for a region's values at given indices.

    ``producers`` maps each value the kernel computes to (node, output position); any other value
    is read through ``leaf(value, idx)``. ``at`` memoizes per (value, index) until ``reset``.
    """

    def __init__(self, producers: Mapping[str, tuple[Node, int]], types: Mapping[str, TensorType],
                 leaf: At, supported: frozenset[str], call: Callable[[Node, tuple], Expr] | None = None):
        self.producers, self.types, self.leaf, self.supported = producers, types, leaf, supported
        self.call = call or (lambda node, args: Call(node.op, args, node.attrs))  # a pointwise node's expression
        self.memo: dict[tuple, Expr] = {}

    def reset(self) -> None:
        self.memo.clear()

    def shape(self, value: str) -> tuple[int, ...]:
        return tuple(self.types[value].shape)

    def at(self, value: str, idx: tuple) -> Expr:
        key = (value, idx)
        if key not in self.memo:
            p = self.producers.get(value)
            self.memo[key] = self.leaf(value, idx) if p is None else self._node(p[0], p[1], tuple(idx))
        return self.memo[key]

    def _node(self, node: Node, out: int, idx: tuple) -> Expr:
        fn = RULES.get(node.op)
        if fn is not None:
            return fn(self, node, out, idx)
        kind = ops.get(node.op).kind
        require(kind in ops.FUSIBLE_POINTWISE and node.op in self.supported,
                f"the templates' expressions cannot compute {node.op} ({node.name})")
        args = tuple(self.at(i, broadcast(self.shape(i), idx)) for i in node.inputs if i)
        return self.call(node, args)


# ---- one rule per op: (builder, node, output position, index in that output) -> expression -------

Rule = Callable[[IndexBuilder, Node, int, tuple], Expr]
RULES: dict[str, Rule] = {}


def rule(*names: str):
    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return deco


def _replace(idx: tuple, dim: int, e: Expr) -> tuple:
    return idx[:dim] + (e,) + idx[dim + 1:]


# The *_dynamic forms take their shape/axes from a tensor; with a static output type the map is the same.
@rule("reshape", "flatten", "flatten2d", "squeeze", "unsqueeze", "identity", "dropout", "reshape_dynamic",
      "squeeze_dynamic", "unsqueeze_dynamic")
def _reshape(b: IndexBuilder, n: Node, out: int, idx: tuple) -> Expr:
    x = n.inputs[0]
    return b.at(x, reshape(b.shape(x), b.shape(n.outputs[0].name), idx))


@rule("expand", "expand_dynamic")
def _expand(b, n, out, idx):
    return b.at(n.inputs[0], broadcast(b.shape(n.inputs[0]), idx))


@rule("permute")
def _permute(b, n, out, idx):
    perm = [p % len(idx) for p in n.attr["perm"]]
    src: list = [None] * len(idx)
    for k, p in enumerate(perm):
        src[p] = idx[k]
    return b.at(n.inputs[0], tuple(src))


@rule("transpose")
def _transpose(b, n, out, idx):
    if not idx:  # a 0-d tensor's transpose(0, -1) is itself
        return b.at(n.inputs[0], ())
    d0, d1 = n.attr["dim0"] % len(idx), n.attr["dim1"] % len(idx)
    src = list(idx)
    src[d0], src[d1] = idx[d1], idx[d0]
    return b.at(n.inputs[0], tuple(src))


@rule("slice")
def _slice(b, n, out, idx):
    x, a = n.inputs[0], n.attr
    dim = a["dim"] % len(idx)
    start, _, step = slice(a.get("start"), a.get("end"), a.get("step", 1)).indices(b.shape(x)[dim])
    return b.at(x, _replace(idx, dim, add(mul(idx[dim], step), lit(start))))


@rule("flip")
def _flip(b, n, out, idx):
    x = n.inputs[0]
    src = list(idx)
    for d in {d % len(idx) for d in n.attr["dims"]} if idx else ():  # a 0-d tensor's flip is the tensor itself
        src[d] = sub(lit(b.shape(x)[d] - 1), idx[d])
    return b.at(x, tuple(src))


def _rolled(i: Expr, shift: int, size: int) -> Expr:
    """x[i - shift] along a dim of ``size``: i + size - s where i < s, else i - s (s = shift mod size). A select of
    indices, so no branch reads out of bounds. ((i + size - s) % size instead: TVM's simplifier merged two such dims'
    floormods into one of the flat index, (i + 3072) & 4095 for a (2, 8, 8, 64) rolled by (2, 2): wrong elements.)"""
    s = shift % size if size else 0
    return where(cmp("lt", i, s), add(i, lit(size - s)), sub(i, lit(s))) if s else i


@rule("roll")
def _roll(b, n, out, idx):
    x, shape = n.inputs[0], b.shape(n.inputs[0])
    if not n.attr["dims"]:  # the flattened tensor's roll
        flat = ravel(idx, shape)
        for shift in n.attr["shifts"]:
            flat = _rolled(flat, shift, numel(shape))
        return b.at(x, unravel(flat, shape))
    src = list(idx)
    for shift, d in zip(n.attr["shifts"], n.attr["dims"]):
        src[d % len(idx)] = _rolled(src[d % len(idx)], shift, shape[d % len(idx)])
    return b.at(x, tuple(src))


@rule("concat")
def _concat(b, n, out, idx):
    dim = n.attr["dim"] % len(idx)
    pieces, off = [], 0
    for x in n.inputs:
        s = b.shape(x)
        if len(s) == len(idx) and s[dim] > 0:  # torch.cat skips empty (and legacy 1-D empty) pieces
            pieces.append((x, off, s[dim]))
            off += s[dim]
    expr = None
    for k, (x, start, extent) in reversed(list(enumerate(pieces))):
        lo = 0 if k > 0 else None
        hi = extent - 1 if k < len(pieces) - 1 else None
        value = b.at(x, _replace(idx, dim, clamp(sub(idx[dim], lit(start)), lo, hi)))
        expr = value if expr is None else where(cmp("lt", idx[dim], start + extent), value, expr)
    require(expr is not None, f"{n.name} concatenates only empty tensors")
    return expr


@rule("stack")
def _stack(b, n, out, idx):
    dim = n.attr["dim"] % len(idx)
    rest = idx[:dim] + idx[dim + 1:]
    expr = b.at(n.inputs[-1], rest)
    for k in range(len(n.inputs) - 2, -1, -1):
        expr = where(cmp("eq", idx[dim], k), b.at(n.inputs[k], rest), expr)
    return expr


@rule("split")
def _split(b, n, out, idx):
    dim = n.attr["dim"] % len(idx)
    return b.at(n.inputs[0], _replace(idx, dim, add(idx[dim], lit(sum(n.attr["sizes"][:out])))))


@rule("index_select")
def _index_select(b, n, out, idx):
    x, index = n.inputs
    xs = b.shape(x)
    dim, r = n.attr["dim"] % len(xs), len(b.shape(index))
    i = wrap_clamp(b.at(index, tuple(idx[dim:dim + r])), xs[dim])
    return b.at(x, idx[:dim] + (i,) + idx[dim + r:])


@rule("embedding")
def _embedding(b, n, out, idx):
    weight, ids = n.inputs[:2]
    i = clamp(b.at(ids, tuple(idx[:-1])), 0, b.shape(weight)[0] - 1)
    return b.at(weight, (i, idx[-1]))


@rule("gather", "gather_elements")
def _gather(b, n, out, idx):
    x, index = n.inputs
    dim = n.attr["dim"] % len(idx)
    return b.at(x, _replace(idx, dim, wrap_clamp(b.at(index, idx), b.shape(x)[dim])))


@rule("onnx_slice")
def _onnx_slice(b, n, out, idx):
    """ONNX Slice on one axis: positive steps as ``slice``; negative ones walk back from a clamped start."""
    x, a = n.inputs[0], n.attr
    dim, step, size_d = a["dim"] % len(idx), a.get("step", 1), b.shape(x)[a["dim"] % len(idx)]
    if step > 0:
        start = slice(a["start"], a["end"], step).indices(size_d)[0]
    else:
        start = a["start"] + size_d if a["start"] < 0 else a["start"]
        start = min(max(start, 0), size_d - 1)
    return b.at(x, _replace(idx, dim, add(mul(idx[dim], step), lit(start))))


@rule("gather_nd")
def _gather_nd(b, n, out, idx):
    """ONNX GatherND: ``index``'s last dim addresses the dims after the batch dims."""
    x, index = n.inputs
    xs, ishape = b.shape(x), b.shape(index)
    bd, k = n.attr.get("batch_dims", 0), ishape[-1]
    mid = len(ishape) - 1 - bd
    lead = idx[:bd + mid]
    src = [wrap_clamp(b.at(index, (*lead, lit(j))), xs[bd + j]) for j in range(k)]
    return b.at(x, (*idx[:bd], *src, *idx[bd + mid:]))


@rule("index")
def _index(b, n, out, idx):
    """Advanced indexing ``x[i0, i1, ...]`` (numpy rules: the broadcast index dims replace the
    indexed dims in place when those are adjacent, else they come first)."""
    x, indices = n.inputs[0], n.inputs[1:]
    xs = b.shape(x)
    pos = [k for k, i in enumerate(indices) if i]
    require(bool(pos) and all(b.types[indices[k]].dtype not in ("bool", "uint8") for k in pos),
            f"{n.name} indexes with a mask (a data-dependent shape)")
    bshape = broadcast_shapes(*[b.shape(indices[k]) for k in pos])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    at_ = pos[0] if adjacent else 0
    rest = [k for k in range(len(xs)) if k not in pos]
    layout = (*xs[:pos[0]], *bshape, *xs[pos[-1] + 1:]) if adjacent else (*bshape, *[xs[k] for k in rest])
    require(layout == b.shape(n.outputs[0].name), f"{n.name}: unexpected advanced-indexing shape")
    bidx = idx[at_:at_ + len(bshape)]
    others = list(idx[:at_]) + list(idx[at_ + len(bshape):])
    src: list = [None] * len(xs)
    for k in range(len(xs)):
        if k in pos:
            src[k] = wrap_clamp(b.at(indices[k], broadcast(b.shape(indices[k]), bidx)), xs[k])
        else:
            src[k] = others.pop(0)
    return b.at(x, tuple(src))


@rule("pad")
def _pad(b, n, out, idx):
    x, a = n.inputs[0], n.attr
    xs, pads, mode = b.shape(x), a["pads"], a.get("mode", "constant")
    src, valid = list(idx), None
    for k in range(len(pads) // 2):
        d = len(xs) - 1 - k
        lo, size_d = pads[2 * k], xs[d]
        i = sub(idx[d], lit(lo))
        if mode == "constant":
            if lo > 0 or pads[2 * k + 1] > 0:
                inside = Call("logical_and", (cmp("ge", i, 0), cmp("lt", i, size_d)))
                valid = inside if valid is None else Call("logical_and", (valid, inside))
            i = clamp(i, 0, size_d - 1)
        elif mode in ("replicate", "edge"):
            i = clamp(i, 0, size_d - 1)
        elif mode == "reflect":
            i = Call("abs", (i,))
            i = where(cmp("gt", i, size_d - 1), sub(lit(2 * (size_d - 1)), i), i)
        elif mode == "circular":
            i = mod(i, size_d)
        else:
            raise NotLowerable(f"{n.name}: pad mode {mode!r}")
        src[d] = i
    value = b.at(x, tuple(src))
    if valid is None:
        return value
    dtype = b.types[x].dtype
    fill = a.get("value", 0.0)
    return where(valid, value, Const(bool(fill) if dtype == "bool" else fill if dtype.startswith(("float", "bfloat"))
                                     else int(fill), dtype))


@rule("tril", "triu")
def _tri(b, n, out, idx):
    x = n.inputs[0]
    above = sub(idx[-1], idx[-2])  # column - row
    keep = cmp("le" if n.op == "tril" else "ge", above, int(n.attr.get("diagonal", 0)))
    dtype = b.types[x].dtype
    zero = Const(False if dtype == "bool" else 0.0 if dtype.startswith(("float", "bfloat")) else 0, dtype)
    return where(keep, b.at(x, idx), zero)


@rule("repeat")
def _repeat(b, n, out, idx):
    xs = b.shape(n.inputs[0])
    lead = len(idx) - len(xs)
    return b.at(n.inputs[0], tuple(mod(idx[lead + k], d) for k, d in enumerate(xs)))


@rule("arange")
def _arange(b, n, out, idx):
    a = n.attr
    dtype = a.get("dtype", "int64")
    if dtype.startswith(("float", "bfloat")):
        v = Const(float(a.get("start", 0)), "float32") + Call("mul", (idx[0], Const(float(a.get("step", 1)))))
    else:
        v = add(mul(idx[0], int(a.get("step", 1))), lit(int(a.get("start", 0))))
    return Call("cast", (v,), {"dtype": dtype})


@rule("full")
def _full(b, n, out, idx):
    dtype, v = n.attr.get("dtype", "float32"), n.attr["value"]
    return Const(bool(v) if dtype == "bool" else float(v) if dtype.startswith(("float", "bfloat")) else int(v), dtype)


@rule("rotary_embedding")
def _rotary(b, n, out, idx):
    """``x * cos + rotate_half(x) * sin``: an element also reads x at its partner in the last dim."""
    x, cos, sin = n.inputs[:3]
    xs = b.shape(x)
    xi = broadcast(xs, idx)
    j, d = xi[-1], xs[-1]
    if n.attr.get("interleaved", False):
        first = cmp("eq", mod(j, 2), 0)  # (x0, x1) -> (-x1, x0)
        partner = add(sub(j, mul(mod(j, 2), 2)), lit(1))
    else:
        first = cmp("lt", j, d // 2)  # (x_lo, x_hi) -> (-x_hi, x_lo)
        partner = mod(add(j, lit(d // 2)), d)
    rot = b.at(x, xi[:-1] + (partner,)) * where(first, Const(-1.0), Const(1.0))
    return b.at(x, xi) * b.at(cos, broadcast(b.shape(cos), idx)) + rot * b.at(sin, broadcast(b.shape(sin), idx))


@rule("batch_norm")
def _batch_norm(b, n, out, idx):
    """Inference batch norm: per-channel vectors (channels on dim 1, or the last with ``channels_last``)."""
    x, w, bias, mean, var = n.inputs
    ch = (idx[-1] if n.attr.get("channels_last", False) else idx[1],)
    y = (b.at(x, idx) - b.at(mean, ch)) * Call("rsqrt", (b.at(var, ch) + Const(float(n.attr.get("eps", 1e-5))),))
    if w:
        y = y * b.at(w, ch)
    return y + b.at(bias, ch) if bias else y

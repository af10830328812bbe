"""Epilogue/prologue expressions as data: a tiny IR, its TileLang emission and its torch evaluator.

Note: a fused region carries small expression trees over the value a template produces (``Acc``:
a GEMM accumulator element, a loaded element, a reduction's result) and the region's extra inputs
(``Arg(i)``, read at the element's index under numpy broadcasting against the output shape). The
template calls ``emit`` inside its loop; tests call ``evaluate`` for the reference. Op names are
tilefuse's registry vocabulary, and ``evaluate`` runs the registry's own torch references, so an
op's semantics live in one place.

Numerics: every floating value is computed in fp32 (fp16/bf16 leaves are widened when read), the
way the templates compute; ``cast`` rounds to its dtype and the result is widened again, so a cast
in the middle of a chain behaves the same in the kernel and in ``evaluate``. float64 stays float64,
integers stay integers until an op needs a float, comparisons give bool.

Indexed reads: ``Coord(d)`` is coordinate ``d`` of the element being produced (in its output's
shape) and ``Load(i, index)`` reads input ``i`` at ``index`` (one integer expression per dim of the
input). Index arithmetic is ordinary ``Call`` nodes on integers (``add``, ``mul``,
``floor_divide``, ``remainder``, ``minimum``...), so an output element can read an input at a
computed place: a transpose, a slice, a gather by an index tensor. A ``Load`` trusts its index:
whoever builds one keeps it inside the input (``lowering.index`` clamps where a branch of a
``where`` may compute an index outside it).

The emitter of each op, and the NaN and constant-folding rules they keep, are in ``lowering.emitters``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tilefuse import ops
from tilefuse.lowering.emitters import EMITTERS, FAST_EMITTERS, ROUNDED_EMITTERS, as_float, constant, prim, widen

FLOAT_ONLY = ops.with_trait("float_only")  # ops whose integer/bool operands are widened to float32 first


# ---- the IR ------------------------------------------------------------------------------------

class Expr:
    """Base of the expression nodes; arithmetic operators build ``Call`` nodes."""

    def __add__(self, other):
        return Call("add", (self, _lift(other)))

    def __radd__(self, other):
        return Call("add", (_lift(other), self))

    def __sub__(self, other):
        return Call("sub", (self, _lift(other)))

    def __rsub__(self, other):
        return Call("sub", (_lift(other), self))

    def __mul__(self, other):
        return Call("mul", (self, _lift(other)))

    def __rmul__(self, other):
        return Call("mul", (_lift(other), self))

    def __truediv__(self, other):
        return Call("div", (self, _lift(other)))

    def __rtruediv__(self, other):
        return Call("div", (_lift(other), self))

    def __neg__(self):
        return Call("neg", (self,))


@dataclass(frozen=True)
class Acc(Expr):
    """The value being produced: GEMM accumulator element, loaded element, or reduction result."""

    def __str__(self) -> str:
        return "acc"


@dataclass(frozen=True)
class Arg(Expr):
    """The ``index``-th extra input tensor of the region, broadcast against the output shape."""

    index: int

    def __str__(self) -> str:
        return f"arg{self.index}"


@dataclass(frozen=True)
class Const(Expr):
    """A scalar constant of ``dtype`` (a torch dtype name)."""

    value: float | int | bool
    dtype: str = "float32"

    def __str__(self) -> str:
        return repr(self.value) if self.dtype == "float32" else f"{self.value!r}:{self.dtype}"


@dataclass(frozen=True)
class Coord(Expr):
    """Coordinate ``dim`` of the element being produced, in its output's shape (an integer)."""

    dim: int

    def __str__(self) -> str:
        return f"i{self.dim}"


@dataclass(frozen=True)
class Load(Expr):
    """Input ``arg`` read at ``index`` (one integer expression per dim; kept inside its bounds by the builder)."""

    arg: int
    index: tuple[Expr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", tuple(self.index))

    def __str__(self) -> str:
        return f"arg{self.arg}[{', '.join(str(i) for i in self.index)}]"


@dataclass(frozen=True)
class Call(Expr):
    """``op(*args, **attrs)`` with ``op`` a name of tilefuse's op registry; attrs kept sorted."""

    op: str
    args: tuple[Expr, ...]
    attrs: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        attrs = self.attrs.items() if isinstance(self.attrs, Mapping) else self.attrs
        object.__setattr__(self, "attrs", tuple(sorted((str(k), v) for k, v in attrs)))

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)

    def __str__(self) -> str:
        parts = [str(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.attrs]
        return f"{self.op}({', '.join(parts)})"


def call(op: str, *args: Expr | float, **attrs: Any) -> Call:
    """Build ``Call(op, args, attrs)``; Python numbers become fp32 ``Const`` nodes."""
    return Call(op, tuple(_lift(a) for a in args), attrs)


def _lift(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, (int, float)):
        return Const(float(x), "float32")
    raise TypeError(f"cannot use {x!r} ({type(x).__name__}) in an expression")


def walk(expr: Expr):
    """Every node of ``expr``, pre-order."""
    yield expr
    for k in _children(expr):
        yield from walk(k)


def substitute(expr: Expr, table: Mapping[Expr, Expr]) -> Expr:
    """``expr`` with every node equal to a key of ``table`` replaced by its value; a node shared stays shared."""
    memo: dict[int, Expr] = {}

    def go(e: Expr) -> Expr:
        if id(e) not in memo:
            if e in table:
                memo[id(e)] = table[e]
            elif isinstance(e, Call):
                memo[id(e)] = Call(e.op, tuple(go(a) for a in e.args), e.attrs)
            elif isinstance(e, Load):
                memo[id(e)] = Load(e.arg, tuple(go(i) for i in e.index))
            else:
                memo[id(e)] = e
        return memo[id(e)]

    return go(expr)


def _children(e: Expr) -> tuple[Expr, ...]:
    return e.args if isinstance(e, Call) else e.index if isinstance(e, Load) else ()


def tree_size(exprs: Sequence[Expr]) -> int:
    """Nodes of ``exprs`` unfolded as trees (what an emitter without ``Env.bind`` walks), counted without unfolding."""
    memo: dict[int, int] = {}

    def count(e: Expr) -> int:
        if id(e) not in memo:
            memo[id(e)] = 1 + sum(count(k) for k in _children(e))
        return memo[id(e)]

    return sum(count(e) for e in exprs)


def args_used(expr: Expr | None) -> frozenset[int]:
    """Indices of the extra inputs that ``expr`` reads."""
    if expr is None:
        return frozenset()
    return frozenset(n.index if isinstance(n, Arg) else n.arg for n in walk(expr) if isinstance(n, (Arg, Load)))


def ops_used(expr: Expr | None) -> frozenset[str]:
    return frozenset(n.op for n in walk(expr) if isinstance(n, Call)) if expr is not None else frozenset()


def ops_supported() -> frozenset[str]:
    """Op names that ``emit`` can lower (ask this before planning a fused region)."""
    return frozenset(EMITTERS)


def is_lowerable(expr: Expr | None) -> bool:
    """Whether every op of ``expr`` has an emitter."""
    return ops_used(expr) <= ops_supported()


# ---- emission to TileLang/TIR ---------------------------------------------------------------------

@dataclass(frozen=True)
class Env:
    """What ``emit`` binds the leaves to: ``acc`` a PrimExpr, ``arg(i)`` the i-th extra input's load,
    ``coord(d)`` the produced element's coordinate ``d``, ``load(i, index)`` input ``i`` at ``index``; ``fast``: the
    ops of ``FAST_EMITTERS`` in their fast forms (a CUDA template whose output is fp16/bf16)."""

    acc: Any = None
    arg: Callable[[int], Any] | None = None
    coord: Callable[[int], Any] | None = None
    load: Callable[[int, list], Any] | None = None
    fast: bool = False
    # A template may bind values to locals (``bind``: a PrimExpr computed once into a local, that local's read
    # returned), so that TileLang's passes see one op a statement: TVM's simplifier and the passes after it slow
    # down steeply on deep selects (a bilinear resize's fused gathers: 54 s in TileLang's passes, and a bicubic's
    # index, 17 kB of TIR from 100 nodes, never got through LegalizeNegativeIndex). With ``bind_all`` every ``Call``'s
    # value (bool ones aside) is bound; without it, those of an index read from data (a gather's). ``memo`` holds
    # what was bound, by node id: a node read by several parents is computed once.
    bind: Callable[[Any], Any] | None = None
    bind_all: bool = False
    memo: dict = field(default_factory=dict)


def indexed_by_data(load: Load) -> bool:
    """Whether ``load``'s index reads data (an input, an extra or the accumulator): an embedding's, a gather's."""
    return any(isinstance(n, (Load, Arg, Acc)) for i in load.index for n in walk(i))


def emit(expr: Expr, env: Env):
    """Lower ``expr`` to a TIR PrimExpr (fp32 compute for floating values, see the module note)."""
    from tilelang import language as T  # tilelang loads only where a kernel is built

    if isinstance(expr, Acc):
        if env.acc is None:
            raise ValueError("expression reads acc but the template binds no accumulator here")
        return widen(T, prim(env.acc))
    if isinstance(expr, Arg):
        if env.arg is None:
            raise ValueError(f"expression reads {expr} but the template binds no extra inputs here")
        return widen(T, prim(env.arg(expr.index)))
    if isinstance(expr, Const):
        return constant(T, expr.value, expr.dtype)
    if isinstance(expr, Coord):
        if env.coord is None:
            raise ValueError(f"expression reads {expr} but the template binds no coordinates here")
        return env.coord(expr.dim)
    if isinstance(expr, Load):
        if env.load is None:
            raise ValueError(f"expression reads {expr} but the template binds no indexed loads here")
        at = env
        if env.bind is not None and not env.bind_all and indexed_by_data(expr):
            at = dataclasses.replace(env, bind_all=True)  # (the same memo)
        return widen(T, prim(env.load(expr.arg, [emit(i, at) for i in expr.index])))
    if isinstance(expr, Call):
        if env.bind_all and id(expr) in env.memo:
            return env.memo[id(expr)]
        value = _call(T, expr, env, (env.fast and FAST_EMITTERS.get(expr.op)) or EMITTERS.get(expr.op))
        if env.bind_all:
            if str(value.dtype) != "bool" and not _leaf(value):
                value = env.bind(value)
            env.memo[id(expr)] = value
        return value
    raise TypeError(f"not an expression node: {expr!r}")


def _call(T, expr: Call, env: Env, fn):
    if fn is None:
        raise NotImplementedError(
            f"op {expr.op!r} has no TileLang emitter (supported: {sorted(EMITTERS)}); "
            "the planner should keep this op out of the fused region")
    args = [emit(a, env) for a in expr.args]
    if expr.op in FLOAT_ONLY:
        args = [as_float(T, a) for a in args]
    return prim(fn(T, args, dict(expr.attrs)))


def emit_rounded(expr: Expr, env: Env, dtype: str):
    """``emit(expr, env)`` for a value rounded straight to ``dtype`` (a GEMM epilogue's root, fast forms allowed): a
    root op with a form exact to that rounding only (``ROUNDED_EMITTERS``: GELU for fp16 and bf16) takes it."""
    fn = env.fast and isinstance(expr, Call) and ROUNDED_EMITTERS.get(dtype, {}).get(expr.op)
    if not fn:
        return emit(expr, env)
    from tilelang import language as T
    return _call(T, expr, env, fn)


def _leaf(value) -> bool:
    """A PrimExpr not worth a local: a constant, a variable or a load."""
    from tilelang import tvm

    tir = tvm.tirx
    return isinstance(value, (tir.IntImm, tir.FloatImm, tir.Var, tir.BufferLoad))


# ---- torch evaluation (the reference) ---------------------------------------------------------------

def evaluate(expr: Expr, acc: torch.Tensor | None, args: Sequence[torch.Tensor] = (),
             shape: Sequence[int] | None = None) -> torch.Tensor:
    """Evaluate ``expr`` with torch, through the op registry's references, computing as ``emit`` does.

    ``shape`` is the produced output's shape, which ``Coord`` nodes range over (an int64 arange
    along their dim, broadcast against the others)."""
    if isinstance(expr, Coord):
        if shape is None:
            raise ValueError(f"expression reads {expr} but no output shape was given")
        view = [1] * len(shape)
        view[expr.dim] = int(shape[expr.dim])
        device = args[0].device if args else None
        return torch.arange(int(shape[expr.dim]), device=device).reshape(view)
    if isinstance(expr, Load):
        index = tuple(evaluate(i, acc, args, shape).long() for i in expr.index)
        return _widen_t(args[expr.arg][index])
    if isinstance(expr, Acc):
        if acc is None:
            raise ValueError("expression reads acc but no accumulator was given")
        return _widen_t(acc)
    if isinstance(expr, Arg):
        return _widen_t(args[expr.index])
    if isinstance(expr, Const):
        return _widen_t(torch.tensor(expr.value, dtype=getattr(torch, expr.dtype)))
    if isinstance(expr, Call):
        vals = [evaluate(a, acc, args, shape) for a in expr.args]
        attrs = dict(expr.attrs)
        if expr.op in FLOAT_ONLY:
            vals = [v if v.is_floating_point() else v.float() for v in vals]
        (out,) = ops.get(expr.op).run(vals, attrs)
        return _widen_t(out)
    raise TypeError(f"not an expression node: {expr!r}")


def _widen_t(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t

"""Differential fuzzing: random graphs of registry ops through ``torch.compile(backend="tilefuse")`` on ``c``,
compared with eager torch on the same inputs.

Note: a kernel's compile on ``c`` (TileLang lowering, then g++ -O3 over TileLang's headers) costs about 1-2 s,
a cached one a few milliseconds, so kernel compiles decide what a fuzz run costs. Each test session therefore
draws a *pool* of random programs from a fresh seed (ops, wiring, shapes and dtype: what a kernel is built
from), and hypothesis draws each case's program from the pool together with what does not change the kernels:
the input values (NaN, +-Inf, -0.0, denormals, huge and tiny numbers mixed into normal ones) and the input
layouts (contiguous, transposed storage, strided slices, zero-stride expands, numpy-backed zero-size arrays).
Every case is a fresh dynamo compile (the plan, lowering and runner are rebuilt; kernels come from the
in-process cache). The pool is fresh each run (``TILEFUSE_FUZZ_SEED`` replays one); a failure prints the seed,
the program as Python and the inputs' layouts and values.

Outputs are compared bit for bit (NaN positions equal, -0.0 kept) where every op of the program is exact in
IEEE arithmetic (negation, min/max, comparisons, views, where, one rounding per add/mul/div...), within the
dtype's tolerance otherwise; where a reduction may leave float32's range, as the overflow note says (pinned
runs). A region whose kernel failed to compile (it then runs through torch with a warning) and a graph dynamo's
backend could not take count as failures: the fuzzer must see the kernels run.

``pytest tests/test_fuzz.py``: 1,000 cases (4 shards, for ``-n 2``); ``pytest -m slow tests/test_fuzz.py``:
10,000 (``TILEFUSE_SLOW=1`` runs it without ``-m slow``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target

# One seed per test run, shared by pytest-xdist's workers (their shards take disjoint parts of one pool).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
SEED = int(os.environ.get("TILEFUSE_FUZZ_SEED") or (int(_RUN[:8], 16) if _RUN else random.SystemRandom().randrange(2**32)))
POOL, POOL_LONG = 32, 200  # programs per run: each costs its kernels' compiles (1-2 s each) once

# ---------------------------------------------------------------------------------------------------------------
# The op vocabulary: name -> (expression over the operands {0}, {1}, {2} and parameters, exact). "exact": one
# correctly rounded IEEE result (or none: a selection, comparison or view), so compiled and eager must agree bit
# for bit. A program is straight-line Python source over these expressions.

UNARY = {
    "neg": ("torch.neg({0})", True), "abs": ("torch.abs({0})", True), "relu": ("torch.relu({0})", True),
    "floor": ("torch.floor({0})", True), "ceil": ("torch.ceil({0})", True), "round": ("torch.round({0})", True),
    "trunc": ("torch.trunc({0})", True), "sign": ("torch.sign({0})", True), "square": ("{0} * {0}", True),
    "sqrt": ("torch.sqrt({0})", False), "reciprocal": ("torch.reciprocal({0})", True),
    "sigmoid": ("torch.sigmoid({0})", False), "tanh": ("torch.tanh({0})", False), "exp": ("torch.exp({0})", False),
    "log": ("torch.log({0})", False), "rsqrt": ("torch.rsqrt({0})", False), "sin": ("torch.sin({0})", False),
    "cos": ("torch.cos({0})", False), "erf": ("torch.erf({0})", False), "gelu": ("F.gelu({0})", False),
    "gelu_tanh": ("F.gelu({0}, approximate='tanh')", False), "silu": ("F.silu({0})", False),
    "softplus": ("F.softplus({0})", False), "elu": ("F.elu({0})", False), "leaky_relu": ("F.leaky_relu({0})", False),
    "hardswish": ("F.hardswish({0})", False), "hardsigmoid": ("F.hardsigmoid({0})", False),
    "clamp": ("torch.clamp({0}, -0.5, 2.0)", True), "clamp_min": ("torch.clamp({0}, min=0.25)", True),
    "hardtanh": ("F.hardtanh({0})", True), "relu6": ("F.relu6({0})", True),
    "mul_scalar": ("{0} * 1.5", True), "add_scalar": ("{0} + 2.0", True), "div_scalar": ("{0} / 3.0", True),
    "rsub_scalar": ("1.0 - {0}", True),
}
BINARY = {
    "add": ("{0} + {1}", True), "sub": ("{0} - {1}", True), "mul": ("{0} * {1}", True), "div": ("{0} / {1}", True),
    "maximum": ("torch.maximum({0}, {1})", True), "minimum": ("torch.minimum({0}, {1})", True),
    "pow": ("torch.pow({0}, {1})", False), "atan2": ("torch.atan2({0}, {1})", False),
    "remainder": ("torch.remainder({0}, {1})", False), "fmod": ("torch.fmod({0}, {1})", False),
}
COMPARE = {k: (f"torch.{k}({{0}}, {{1}})", True) for k in ("eq", "ne", "lt", "le", "gt", "ge")}
REDUCE = {  # over dim {d}, keepdim {k}
    "sum": ("torch.sum({0}, {d}, keepdim={k})", False), "mean": ("torch.mean({0}, {d}, keepdim={k})", False),
    "amax": ("torch.amax({0}, {d}, keepdim={k})", True), "amin": ("torch.amin({0}, {d}, keepdim={k})", True),
    "max_values": ("torch.max({0}, {d}, keepdim={k}).values", True),
    "argmax": ("torch.argmax({0}, {d}, keepdim={k})", True), "argmin": ("torch.argmin({0}, {d}, keepdim={k})", True),
    "prod": ("torch.prod({0}, {d}, keepdim={k})", False),
    "logsumexp": ("torch.logsumexp({0}, {d}, keepdim={k})", False), "var": ("torch.var({0}, {d}, keepdim={k})", False),
}
ROW = {  # last-dim row ops keeping the shape ({n}: the last dim)
    "softmax": ("torch.softmax({0}, -1)", False), "log_softmax": ("torch.log_softmax({0}, -1)", False),
    "layer_norm": ("F.layer_norm({0}, ({n},))", False),
    "rms_norm": ("{0} * torch.rsqrt({0}.pow(2).mean(-1, keepdim=True) + 1e-6)", False),
}
VIEWS = {  # ({perm}: the dims reversed, {shape}: the operand's shape)
    "transpose": ("{0}.transpose(0, -1)", True), "permute": ("{0}.permute({perm})", True),
    "flatten": ("{0}.reshape(-1)", True), "unsqueeze": ("{0}.unsqueeze(0)", True), "slice": ("{0}[..., ::2]", True),
    "narrow": ("{0}[1:]", True), "expand": ("{0}.unsqueeze(0).expand(3, *{shape})", True),
    "flip": ("torch.flip({0}, (-1,))", True),
}
OTHER = {
    "where": ("torch.where({0}, {1}, {2})", True), "logical_and": ("torch.logical_and({0}, {1})", True),
    "logical_not": ("torch.logical_not({0})", True), "isnan": ("torch.isnan({0})", True),
    "cast": ("{0}.to(torch.{to})", True), "concat": ("torch.cat([{0}, {1}], {d})", True),
    "matmul": ("{0} @ {1}", False), "linear": ("F.linear({0}, {1}, {2})", False),
}
OPS = {**UNARY, **BINARY, **COMPARE, **REDUCE, **ROW, **VIEWS, **OTHER}


@dataclass(frozen=True)
class Step:
    """One op of a program: ``op`` applied to earlier values ``args`` (indices into the value list)."""

    op: str
    args: tuple[int, ...]
    params: tuple = ()

    def expr(self, shapes: list[tuple[int, ...]]) -> str:
        kw = dict(self.params)
        shape = shapes[self.args[0]]
        kw.update(n=shape[-1] if shape else 1, perm=tuple(reversed(range(len(shape)))), shape=tuple(shape))
        return OPS[self.op][0].format(*(f"v{i}" for i in self.args), **kw)


def _eval(expr: str, env: list[torch.Tensor]) -> torch.Tensor:
    return eval(expr, {"torch": torch, "F": F}, {f"v{i}": v for i, v in enumerate(env)})


# Ops whose result jumps for a tiny change of an operand: they take only values computed exactly, so that an
# inexact value (a sum, an exp) within tolerance of eager cannot turn into a different integer or bool.
DISCONTINUOUS = frozenset({"floor", "ceil", "round", "trunc", "sign", "remainder", "fmod", "argmax", "argmin",
                           "isnan", *COMPARE})
# A min/max reduction over a row holding both 0.0 and -0.0 may keep either (torch's own order decides): its value
# is exact but its zero's sign is not, so ops that tell -0.0 from 0.0 do not take it. maximum/minimum of 0.0 and
# -0.0 too: eager's vectorized body and its scalar tail return different operands (minimum(0.0, -0.0) gave 0.0
# in one place of a tensor of 24 and -0.0 in another).
ZERO_SIGN_FREE = frozenset({"amax", "amin", "max_values", "maximum", "minimum"})
SIGN_SENSITIVE = frozenset({"reciprocal", "div", "rsqrt", "atan2", "pow", "remainder", "fmod", "log"})
BITS, VALUE, CLOSE = 2, 1, 0  # how a value must match eager: bit for bit, equal values (either zero), in tolerance


@dataclass(frozen=True)
class Program:
    """A straight-line function of inputs of ``shapes`` (all of ``dtype``): ``lines`` compute ``v<k>`` for the
    values after the inputs, ``outputs`` are value indices; ``exact`` says per value how compiled must match
    eager (``BITS``, ``VALUE`` or ``CLOSE``)."""

    dtype: torch.dtype
    shapes: tuple[tuple[int, ...], ...]
    lines: tuple[str, ...]
    outputs: tuple[int, ...]
    exact: tuple[int, ...]
    steps: tuple[Step, ...] = ()  # the ops behind ``lines``

    @property
    def tol(self) -> dict:
        half = self.dtype == torch.float16 or any("float16" in line for line in self.lines)
        return TOL[torch.float16 if half else torch.float32]

    def source(self) -> str:
        n = len(self.shapes)
        args = ", ".join(f"v{i}" for i in range(n))
        body = [f"    v{n + k} = {line}" + {BITS: "", VALUE: "  # exact up to a zero's sign", CLOSE: "  # inexact"}[self.exact[n + k]]
                for k, line in enumerate(self.lines)]
        ret = ", ".join(f"v{i}" for i in self.outputs)
        return "\n".join([f"def program({args}):  # {self.dtype}, shapes {list(self.shapes)}", *body,
                          f"    return ({ret},)"])

    @functools.cached_property
    def fn(self):
        scope = {"torch": torch, "F": F}
        exec(compile(self.source(), "<fuzz program>", "exec"), scope)  # noqa: S102 -- our own generated source
        return scope["program"]

    def reference(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The program in float64 (its casts to float16 kept), outputs cast back to eager's dtypes: the yardstick
        for inexact outputs."""
        scope = {"torch": torch, "F": F}
        source = self.source().replace("torch.float32", "torch.float64")
        exec(compile(source, "<fuzz program>", "exec"), scope)  # noqa: S102 -- our own generated source
        outs = scope["program"](*(x.double() for x in inputs))
        return tuple(o.to(w.dtype) for o, w in zip(outs, self.fn(*inputs)))

    def wide_reference(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The program with its float16 arithmetic done in float32 (what a fusion compiler does inside a kernel, as
        Inductor does: values are rounded to float16 where they are stored, not after every op), outputs cast back
        to eager's dtypes; None for a program with no float16. An intermediate that overflows float16 in eager
        (``65504 ** 2``) does not overflow so, and that answer is as right as eager's."""
        source = self.source()
        if self.dtype != torch.float16 and "float16" not in source:
            return None
        scope = {"torch": torch, "F": F}
        exec(compile(source.replace("torch.float16", "torch.float32"), "<fuzz program>", "exec"), scope)  # noqa: S102
        outs = scope["program"](*(x.float() if x.dtype == torch.float16 else x for x in inputs))
        return tuple(o.to(w.dtype) for o, w in zip(outs, self.fn(*inputs)))



# Base shapes: size-0 and size-1 dims, odd sizes, rows that do not fill a tile.
SHAPES = [(4, 6), (3, 5), (1, 7), (5, 1), (0, 6), (2, 3, 4), (2, 1, 5), (3, 0, 2), (7,), (1, 1), (6, 9), (2, 5, 3)]


def _broadcast_variant(rnd: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: some dims set to 1, maybe leading dims dropped."""
    s = [1 if rnd.random() < 0.4 else d for d in shape]
    drop = rnd.randrange(len(s) + 1) if rnd.random() < 0.3 else 0
    return tuple(s[drop:])


def make_program(rnd: random.Random) -> Program:
    """A random well-typed program: each step is checked by running it on small zero tensors."""
    dtype = torch.float16 if rnd.random() < 0.2 else torch.float32
    base = rnd.choice(SHAPES)
    shapes = [base, _broadcast_variant(rnd, base)]
    if rnd.random() < 0.5:
        shapes.append(_broadcast_variant(rnd, base))
    if rnd.random() < 0.2:  # a weight for matmul/linear
        shapes.append((base[-1], rnd.choice([1, 3, 8])))
    env = [torch.zeros(s, dtype=dtype) for s in shapes]  # (meta tensors accept shapes the CPU refuses)
    lines: list[str] = []
    exact = [BITS] * len(env)
    depth = [0] * len(env)
    computed_half = [False] * len(env)
    steps: list[Step] = []
    want = rnd.randint(1, 6)
    tries = 0
    while len(steps) < want and tries < 200:
        tries += 1
        step = _random_step(rnd, env, exact, dtype)
        if step.op in DISCONTINUOUS and min(exact[i] for i in step.args) < VALUE:
            continue
        if step.op in SIGN_SENSITIVE and min(exact[i] for i in step.args) < BITS:
            continue
        expr = step.expr([tuple(v.shape) for v in env])
        try:
            out = _eval(expr, env)
        except (RuntimeError, ValueError, IndexError, TypeError):
            continue
        if out.numel() > 4096:
            continue
        d = 1 + max(depth[i] for i in step.args)
        # fp16: eager rounds after every op, a fused kernel may keep fp32 between ops: one op deep is exact
        level = min(exact[i] for i in step.args)
        # float16: eager rounds after every op, a fused kernel may keep float32 between ops, so an op reading a
        # float16 value computed by another op (not an input, a cast or a view of one) is not bit for bit
        half_chain = any(computed_half[i] for i in step.args)
        if not OPS[step.op][1] or half_chain:
            level = CLOSE
        elif step.op in ZERO_SIGN_FREE:
            level = min(level, VALUE)
        steps.append(step)
        lines.append(expr)
        env.append(out)
        exact.append(level)
        computed_half.append(out.dtype == torch.float16 and (half_chain or step.op not in (*VIEWS, "cast")))
        depth.append(d)
    n = len(shapes)
    used = {i for s in steps for i in s.args}
    sinks = [i for i in range(n, len(env)) if i not in used][-3:]
    return Program(dtype, tuple(shapes), tuple(lines), tuple(sinks or [0]), tuple(exact), tuple(steps))


def _random_step(rnd: random.Random, env: list[torch.Tensor], exact: list[int], dtype: torch.dtype) -> Step:
    floats = [i for i, v in enumerate(env) if v.dtype.is_floating_point]
    bools = [i for i, v in enumerate(env) if v.dtype == torch.bool]
    recent = floats[-3:] if rnd.random() < 0.7 else floats
    a = rnd.choice(recent)
    b = rnd.choice(floats)
    kind = rnd.choices(["unary", "binary", "compare", "where", "reduce", "row", "view", "cast", "concat",
                        "matmul", "bool"], [8, 8, 2, 3, 4, 3, 4, 2, 1, 2, 1])[0]
    if kind == "unary":
        return Step(rnd.choice(sorted(UNARY)), (a,))
    if kind == "binary":
        return Step(rnd.choice(sorted(BINARY)), (a, b))
    if kind == "compare":
        return Step(rnd.choice(sorted(COMPARE)), (a, b))
    if kind == "where":
        if bools:
            return Step("where", (rnd.choice(bools), a, b))
        return Step("gt", (a, b))
    if kind == "bool":
        if len(bools) >= 2 and rnd.random() < 0.5:
            return Step("logical_and", tuple(rnd.sample(bools, 2)))
        if bools and rnd.random() < 0.5:
            return Step("logical_not", (rnd.choice(bools),))
        return Step("isnan", (a,))
    if kind == "reduce":
        rank = env[a].dim()
        return Step(rnd.choice(sorted(REDUCE)), (a,), (("d", rnd.randrange(-rank, rank) if rank else 0),
                                                        ("k", rnd.random() < 0.4)))
    if kind == "row":
        return Step(rnd.choice(sorted(ROW)), (a,))
    if kind == "view":
        return Step(rnd.choice(sorted(VIEWS)), (a,))
    if kind == "cast":
        src = env[a].dtype
        if bools and rnd.random() < 0.3:
            return Step("cast", (rnd.choice(bools),), (("to", str(dtype).removeprefix("torch.")),))
        to = "float16" if src == torch.float32 else "float32"
        return Step("cast", (a,), (("to", to),))
    if kind == "concat":
        return Step("concat", (a, b), (("d", rnd.randrange(-1, env[a].dim()) if env[a].dim() else 0),))
    weights = [i for i, v in enumerate(env) if v.dim() == 2 and v.dtype.is_floating_point]
    w = rnd.choice(weights) if weights else b
    if rnd.random() < 0.5:
        return Step("matmul", (a, w))
    return Step("linear", (a, w, b))


# ---------------------------------------------------------------------------------------------------------------
# Inputs: values with IEEE edge cases, in every legal layout.

SPECIALS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, -1.0, 1e-40, -1e-42, 3e38, 1e-7, 65504.0, 6e-8, 0.5]


def make_value(shape, dtype, seed: int, special_rate: float, specials: list[float] = SPECIALS) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2
    if special_rate and x.numel():
        mask = torch.rand(shape, generator=g) < special_rate
        pick = torch.tensor(specials)[torch.randint(len(specials), shape, generator=g)]
        x = torch.where(mask, pick, x)
    return x.to(dtype)


def lay_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x``'s values in ``layout`` (same shape and values, other strides)."""
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "strided":
        big = torch.zeros(*x.shape[:-1], 2 * x.shape[-1] + 1, dtype=x.dtype) if x.dim() else None
        if big is not None:
            big[..., 1::2] = x
            return big[..., 1::2]
    if layout == "expanded" and x.dim() and x.numel():
        # zero strides: each size>1 dim that holds one repeated row is broadcast from size 1
        row = x.select(0, 0).unsqueeze(0)
        return row.expand(x.shape)
    if layout == "numpy" and x.numel() == 0 and x.dtype == torch.float32:
        return torch.from_numpy(np.zeros(tuple(x.shape), np.float32))  # strides (0, ...): numpy's empty arrays
    return x.contiguous()


LAYOUTS = ("contiguous", "transposed", "strided", "expanded", "numpy")


TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float16: {"rtol": 1e-2, "atol": 1e-2}}

# ---------------------------------------------------------------------------------------------------------------
# Overflow: what a program may give where a reduction leaves float32's range.
#
# Note: a sum, mean, prod, matmul or linear comes out as its order of operations makes it where a partial result
# may leave float32's range (the float64 sums of its operands' positive and negative finite parts, both signs
# present or near the boundary; a prod's partial products) or where an element of huge magnitude (2^64, reached
# through 3e38) cancels beyond the tolerance: torch's vector lanes and our tiles go in different orders (a row is
# -inf in eager, NaN here), and matching torch's order is not a goal (Inductor does not either). Such an element
# ("order-dependent") must be non-finite or within the error bound every order keeps to (float64's value +- n *
# 2^-23 * sum |x|); what is computed from it is not compared. var may give inf, NaN or its exact value where M2 * n
# overflows (the tile merge's intermediate). A layer_norm row follows our rule (lowering/templates/reduction.py):
# NaN where its M2 overflows float32, whatever torch's CPU kernel gives (NaN or 0 by its lanes); float64's answer
# where torch's lanes may square a mean past 1.8e19 (NaN) but M2 is finite; either where M2 * n overflows. The
# program is re-run op by op in eager and float64 (and float32 for a float16 program) with those elements pinned,
# decided from eager's operands (what the kernels see); an output element passes if it matches one pinned run as
# strictly as it must match eager. A case with no such element compares as before.

FMAX, SLACK, HUGE = torch.finfo(torch.float32).max, 1 + 2**-10, 2.0**64  # SLACK: rounding of up to 4096 terms
OVERFLOW_OPS = frozenset({"sum", "mean", "var", "prod", "matmul", "linear", "layer_norm"})


def _split(x: torch.Tensor) -> list[torch.Tensor]:
    """float64: x's positive and negative finite parts, where x is positive, negative (infinities too), |finite x|."""
    f = torch.where(torch.isfinite(x), x.double(), 0.0)
    return [f.clamp(min=0), (-f).clamp(min=0), (x > 0).double(), (x < 0).double(), f.abs()]


def order_dependent(step: Step, env: list[torch.Tensor]) -> tuple | None:
    """sum, mean, prod, matmul, linear: the order-dependent elements of the result (see the note), and any order's
    error bound: absolute, and relative to float64's value; None for other ops."""
    x, kw = env[step.args[0]], dict(step.params)
    d, k = kw.get("d"), kw.get("k")
    n = x.shape[d] if d is not None and x.dim() else 1
    if step.op == "prod":  # each partial product's rounding: 2^-24 of it, or 2^-150 made 2^over larger
        logs = _split(x)[4].log2()
        over, under = logs.clamp(min=0).sum(d, keepdim=k), logs.clamp(max=0).sum(d, keepdim=k)
        wild = (over + math.log2(SLACK) >= 128) | (under < -126) & (over + under > -17)  # 2^-17: the tolerance
        return wild & ~torch.isnan(x).any(d, keepdim=k), n * torch.exp2(over - 149), n * 2**-23
    if step.op in ("sum", "mean"):
        pos, neg, has_pos, has_neg, total = (t.sum(d, keepdim=k) for t in _split(x))
    elif step.op in ("matmul", "linear"):
        mm = (lambda a, b: a @ b) if step.op == "matmul" else F.linear
        (pa, na, sa, ta, fa), (pb, nb, sb, tb, fb) = _split(x), _split(env[step.args[1]])
        pos, neg, has_pos, has_neg = mm(pa, pb) + mm(na, nb), mm(pa, nb) + mm(na, pb), mm(sa, sb) + mm(ta, tb), \
            mm(sa, tb) + mm(ta, sb)
        total, n = mm(fa, fb), x.shape[-1] if x.dim() else 1
        if step.op == "linear":  # the bias: one more term
            pos, neg, has_pos, has_neg, total = (a + b for a, b in zip((pos, neg, has_pos, has_neg, total),
                                                                        _split(env[step.args[2]])))
            n += 1
    else:
        return None
    big, mixed = torch.maximum(pos, neg), (has_pos > 0) & (has_neg > 0)
    bound = n * 2**-23 * total / (n if step.op == "mean" else 1)
    over = (big * SLACK >= FMAX) & (mixed | (big <= FMAX * SLACK))
    ill = mixed & (bound > 1e-5 + 1e-5 * (pos - neg).abs()) & (total >= HUGE)
    if step.op in ("sum", "mean"):  # a NaN in the row: NaN in any order
        over, ill = over & ~torch.isnan(x).any(d, keepdim=k), ill & ~torch.isnan(x).any(d, keepdim=k)
    return over | ill, bound, 0.0


def var_overflows(step: Step, env: list[torch.Tensor]) -> torch.Tensor:
    """The elements of a var whose M2 * n may overflow float32, its variance not clearly past float32's range."""
    x, kw = env[step.args[0]].double(), dict(step.params)
    n = x.shape[kw["d"]] if x.dim() else 1
    m2 = ((x - x.mean(kw["d"], keepdim=True)) ** 2).sum(kw["d"], keepdim=kw["k"])  # NaN with an inf: NaN any order
    return (m2 * n * SLACK >= FMAX) & (m2 / max(n - 1, 0) <= FMAX * SLACK)


def layer_norm_rows(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of ``F.layer_norm(x)`` (masks of x's shape): ``nan`` (M2 overflows float32: the rule), ``either`` (M2 * n
    does: NaN or float64's answer), ``exact`` (torch's lanes may square a mean past 1.8e19: float64's answer)."""
    if x.numel() == 0:
        return {}
    x64 = x.double()
    m2 = ((x64 - x64.mean(-1, keepdim=True)) ** 2).sum(-1, keepdim=True)
    nan = ~(m2 < FMAX * SLACK)  # rows holding inf or NaN too: NaN in eager as well
    either = ~nan & (m2 * x.shape[-1] * SLACK >= FMAX)
    exact = ~nan & ~either & (x64.abs().amax(-1, keepdim=True) >= 2.0**62)
    return {key: m.expand(x.shape) for key, m in (("nan", nan), ("either", either), ("exact", exact)) if m.any()}


def _masks(step: Step, env: list[torch.Tensor], bounds: dict | None) -> dict[str, torch.Tensor]:
    """Kind -> the overflow-prone elements of ``step``'s result; an order-dependent one's bound goes to ``bounds``."""
    masks = layer_norm_rows(env[step.args[0]]) if step.op == "layer_norm" else {}
    wild = order_dependent(step, env)
    if wild is not None and wild[0].any():
        masks["wild"] = wild[0]
        if bounds is not None:
            bounds[len(env)] = wild
    if step.op == "var" and var_overflows(step, env).any():
        masks["var"] = var_overflows(step, env)
    return masks


PINS = {"inf": math.inf, "nan": math.nan}


def _pinned_run(program: Program, inputs: list[torch.Tensor], pins: dict[str, str | None], seen: dict) -> tuple:
    """The program op by op in eager, float64 and (with float16) float32, its overflow-prone elements pinned as
    ``pins`` says per kind ("exact": float64's value, "inf", "nan"; None: as computed; a layer_norm's ``nan`` and
    ``exact`` rows are always so), decided from eager's operands (for float64 too) or float32's. ``seen`` collects
    the kinds that occurred and, per order-dependent value, (mask, float64 value, error bound). Returns each run's
    outputs in eager's dtypes (None: no such run)."""
    half = program.dtype == torch.float16 or any("float16" in line for line in program.lines)
    runs = {"eager": (list(inputs), {}), "float64": ([x.double() for x in inputs], {"torch.float32": "torch.float64"})}
    if half:
        runs["wide"] = ([x.float() if x.dtype == torch.float16 else x for x in inputs], {"torch.float16": "torch.float32"})
    bounds = seen.setdefault("bounds", {})
    for step, line in zip(program.steps, program.lines):
        masks = {name: _masks(step, runs[name][0], bounds if name == "eager" else None)
                 for name in ("eager", "wide") if name in runs and step.op in OVERFLOW_OPS}
        for name, (env, subst) in runs.items():
            out = _eval(functools.reduce(lambda text, ab: text.replace(*ab), subst.items(), line), env)
            m = masks.get("eager" if name == "float64" else name, {})
            seen.update(dict.fromkeys(m, True))
            exact = _eval(line, [v.double() for v in env]) if m else None
            if name == "eager" and "wild" in m:  # the bound, with float64's value rounded to eager's dtype
                _, bound, rel = bounds[len(env)]
                rel = (rel + 2 * torch.finfo(out.dtype).eps) * torch.where(torch.isfinite(exact), exact.abs(), 0.0)
                bounds[len(env)] = (m["wild"], exact, bound + rel)
            for key, mask in m.items():
                pin = pins.get(key, key)
                if pin == "exact" and name != "float64":
                    out = torch.where(mask, exact.to(out.dtype), out)
                elif pin in PINS:
                    out = torch.where(mask, torch.tensor(PINS[pin], dtype=out.dtype), out)
            env.append(out)
    eager = [runs["eager"][0][i] for i in program.outputs]
    return tuple([runs[name][0][i].to(w.dtype) for i, w in zip(program.outputs, eager)] if name in runs else None
                 for name in ("eager", "float64", "wide"))


@dataclass
class Pinned:
    """A case's overflow-prone elements (see the note): ``runs``, every allowed pinning's (eager, float64,
    float32-or-None) outputs; per output, ``free`` (computed from an order-dependent element: not compared) and
    ``direct`` (an order-dependent element itself: its mask, float64 value and error bound), or None."""

    runs: list[tuple]
    free: list[torch.Tensor | None]
    direct: list[tuple | None]


def pinned_runs(program: Program, inputs: list[torch.Tensor]) -> Pinned | None:
    """The case's ``Pinned``, or None where it has no overflow-prone element."""
    if not OVERFLOW_OPS.intersection(s.op for s in program.steps):
        return None
    seen: dict = {}
    first = _pinned_run(program, inputs, {"either": "exact"}, seen)
    if set(seen) == {"bounds"}:
        return None
    options = [{"either": e, "var": v} for v in (None, "exact", "inf", "nan") if v is None or "var" in seen
               for e in ("exact", "nan") if e == "exact" or "either" in seen]
    runs = [first, *(_pinned_run(program, inputs, pins, {}) for pins in options[1:])]
    free, direct = [None] * len(program.outputs), [None] * len(program.outputs)
    if "wild" in seen:
        clean, poison = (_pinned_run(program, inputs, {"either": "exact", "wild": w}, {}) for w in ("exact", "nan"))
        runs.append(clean)
        free = [torch.isnan(p) & ~torch.isnan(c) for p, c in zip(poison[0], clean[0])]
        direct = [seen["bounds"].get(i) for i in program.outputs]
    return Pinned(runs, free, direct)


def compile_program(program: Program, inputs: list[torch.Tensor]):
    """``program`` through the tilefuse torch.compile backend (AOTAutograd -> ATen import -> plan -> lower ->
    runner), from its FX trace: what dynamo would hand the backend, without dynamo's own bytecode tracing and
    guards (two thirds of a case's time, and torch's code, not ours)."""
    backend = make_backend(Options(target=parse_target("c"), quiet=True))
    gm = torch.fx.symbolic_trace(program.fn)
    return backend, backend(gm, inputs)


def check_case(program: Program, inputs: list[torch.Tensor], caplog) -> None:
    """Compile ``program`` afresh for these inputs, run it, compare every output with eager."""
    want = program.fn(*inputs)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tilefuse"), torch.no_grad():
        backend, compiled = compile_program(program, inputs)
        got = compiled(*inputs)
    assert backend.failures == [], backend.failures
    assert len(backend.programs) == 1
    compile_failures = [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()]
    assert compile_failures == [], compile_failures
    assert len(got) == len(want)
    ref, pinned = None, pinned_runs(program, inputs)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {k}: {g.dtype}{tuple(g.shape)} vs eager " \
            f"{w.dtype}{tuple(w.shape)}"
        level = program.exact[program.outputs[k]]
        if pinned is not None:  # overflow-prone elements (see the note)
            bad, ref = ~accepted(g, k, level, program, pinned), ref or pinned.runs[0][1]
        elif level == BITS or not w.dtype.is_floating_point:
            bad = ~_same_bits(g, w)
            wide = program.wide_reference(*inputs) if bad.any() and level == CLOSE else None
            if wide is not None:  # a comparison of a float16 value the kernel kept in float32
                bad &= ~_same_bits(g, wide[k])
        elif level == VALUE:
            bad = ~((g == w) | (torch.isnan(g) & torch.isnan(w)))
        else:
            ref = ref or program.reference(*inputs)
            bad = ~_close(g, w, ref[k], **program.tol)
            if bad.any():
                wide = program.wide_reference(*inputs)
                if wide is not None:
                    bad &= ~_close(g, wide[k], ref[k], **program.tol)
        if bad.any():
            raise AssertionError(f"output {k} ({['in tolerance', 'equal values', 'bit for bit'][level]}): "
                                 f"{int(bad.sum())} of {w.numel()} elements differ from eager"
                                 + (f" and from {len(pinned.runs)} pinnings of its overflow-prone elements" if pinned else "")
                                 + "\n" + _show(bad, g, w, ref[k] if ref else None))


def accepted(got: torch.Tensor, k: int, level: int, program: Program, pinned: Pinned) -> torch.Tensor:
    """Elementwise: output ``k`` matches one of the pinned runs, is computed from an order-dependent element, or is
    one within its bound (or not finite)."""
    ok = functools.reduce(torch.logical_or, [_matches(got, e[k], level, program, r[k], wide and wide[k])
                                             for e, r, wide in pinned.runs])
    if pinned.free[k] is not None:
        ok |= pinned.free[k]
    if pinned.direct[k] is not None:
        mask, exact, bound = pinned.direct[k]
        ok = torch.where(mask, ~torch.isfinite(got) | ((got.double() - exact).abs() <= bound), ok)
    return ok


def _matches(got, want, level: int, program: Program, ref, wide) -> torch.Tensor:
    """Elementwise: ``got`` matches ``want`` as the output's level asks (check_case's comparison)."""
    if level == BITS or not want.dtype.is_floating_point:
        return _same_bits(got, want) | (_same_bits(got, wide) if level == CLOSE and wide is not None else False)
    if level == VALUE:
        return (got == want) | (torch.isnan(got) & torch.isnan(want))
    ok = _close(got, want, ref, **program.tol)
    return ok if wide is None else ok | _close(got, wide, ref, **program.tol)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bits (any NaN matches any NaN; -0.0 is not 0.0)."""
    if not want.dtype.is_floating_point:
        return got == want
    ints = {torch.float32: torch.int32, torch.float16: torch.int16}[want.dtype]
    nan = torch.isnan(want)
    return (got.contiguous().view(ints) == want.contiguous().view(ints)) & ~nan | (nan & torch.isnan(got))


def _close(got, want, ref, rtol: float, atol: float) -> torch.Tensor:
    """Elementwise: ``got`` within tolerance of eager, or equal to the float64 reference, or no farther from the
    reference than ten times eager's own error (eager's rounding sets the scale where a chain amplifies it)."""
    g, w, r = got.double(), want.double(), ref.double()
    same = (g == w) | (torch.isnan(g) & torch.isnan(w)) | (g == r) | (torch.isnan(g) & torch.isnan(r))
    finite = torch.isfinite(g) & torch.isfinite(w) & torch.isfinite(r)
    near = (g - w).abs() <= atol + rtol * w.abs()
    err, eager_err = (g - r).abs(), (w - r).abs()
    return same | finite & (near | (err <= 10 * eager_err + atol + rtol * r.abs()))


def _show(bad: torch.Tensor, got, want, ref) -> str:
    idx = bad.nonzero()[:6].tolist()
    rows = [f"  at {tuple(i)}: got {got[tuple(i)].item()!r}, eager {want[tuple(i)].item()!r}"
            + (f", float64 {ref[tuple(i)].item()!r}" if ref is not None else "") for i in idx]
    return "\n".join(rows)


def test_overflow_oracle():
    """The pinned runs themselves: a layer_norm row whose M2 overflows is expected NaN (the kernel's old 0 fails);
    a sum whose partial sums may overflow is any non-finite value or within its error bound, and what is computed
    from it is free; a sum that overflows in every order is inf; ordinary cases get no pins."""
    ln = Program(torch.float32, ((2, 7),), ("F.layer_norm(v0, (7,))",), (1,), (BITS, CLOSE), (Step("layer_norm", (0,)),))
    x = torch.randn(2, 7)
    assert pinned_runs(ln, [x]) is None
    x[0, 3] = 3e38
    want, pinned = F.layer_norm(x, (7,)), pinned_runs(ln, [x])
    assert accepted(torch.stack([torch.full((7,), math.nan), want[1]]), 0, CLOSE, ln, pinned).all()
    assert accepted(torch.stack([torch.zeros(7), want[1]]), 0, CLOSE, ln, pinned).tolist() == [[False] * 7, [True] * 7]
    sums = Program(torch.float32, ((4, 3),), ("torch.sum(v0, 1, keepdim=False)", "torch.tanh(v1)"), (1, 2),
                   (BITS, CLOSE, CLOSE), (Step("sum", (0,), (("d", 1), ("k", False))), Step("tanh", (1,))))
    x = torch.tensor([[-math.inf, 3e38, 3e38], [3e38, 3e38, 1.0], [3e38, -3e38, 1.5], [1.0, 2.0, 3.0]])
    pinned = pinned_runs(sums, [x])
    for got, ok in (([math.nan, math.inf, 0.0, 6.0], [True] * 4), ([-math.inf, math.inf, 1e30, 6.0], [True] * 4),
                    ([3e38, math.nan, 1e33, 7.0], [False] * 4)):
        assert accepted(torch.tensor(got), 0, CLOSE, sums, pinned).tolist() == ok, got
    assert accepted(torch.tensor([0.3, 0.5, 0.7, math.tanh(6)]), 1, CLOSE, sums, pinned).tolist() == [True, False,
                                                                                                    True, True]


def test_float16_comparison_kept_in_float32(caplog):
    """A comparison of a float16 sum the kernel keeps in float32 (65504 + -0.985: float16 rounds it to 65504,
    float32 keeps 65503.01, so ``le(65504, sum)`` is False here and True in eager) matches the float32 run (found by
    the 10,000-case run: bool outputs were compared with eager alone)."""
    x = torch.tensor([65504.0, 1.0, -2.0], dtype=torch.float16)
    y = torch.tensor([-0.985, 2.0, 0.5], dtype=torch.float16)
    program = Program(torch.float16, ((3,), (3,)), ("v0 + v1", "torch.le(v0, v2)"), (3,), (BITS, BITS, BITS, CLOSE),
                      (Step("add", (0, 1)), Step("le", (0, 2))))
    check_case(program, [x, y], caplog)


@functools.cache
def pool(size: int) -> list[Program]:
    """The run's random programs (fresh each run unless ``TILEFUSE_FUZZ_SEED`` is set)."""
    rnd = random.Random(SEED + size)
    return [make_program(rnd) for _ in range(size)]


@st.composite
def cases(draw, programs: list[Program]):
    program = draw(st.sampled_from(programs))
    seeds = [draw(st.integers(0, 2**31 - 1)) for _ in program.shapes]
    rate = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    layouts = [draw(st.sampled_from(LAYOUTS)) for _ in program.shapes]
    return program, seeds, rate, layouts


def run_fuzz(size: int, shard: int, shards: int, examples: int, caplog) -> None:
    """``examples`` cases over the programs ``shard::shards`` of the run's pool of ``size``."""
    programs = pool(size)[shard::shards]

    @settings(max_examples=examples, deadline=None, derandomize=False, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(cases(programs))
    def one(case):
        program, seeds, rate, layouts = case
        inputs = [lay_out(make_value(s, program.dtype, seed, rate), lay)
                  for s, seed, lay in zip(program.shapes, seeds, layouts)]
        try:
            check_case(program, inputs, caplog)
        except Exception as e:
            shown = "\n".join(f"  v{i}: {lay}, stride {tuple(x.stride())}\n{x}" for i, (x, lay)
                              in enumerate(zip(inputs, layouts)))
            raise AssertionError(f"TILEFUSE_FUZZ_SEED={SEED} (pool {size}, shard {shard}/{shards}); program:\n{program.source()}\n"
                                 f"inputs:\n{shown}\n{type(e).__name__}: {e}") from e

    one()


@pytest.mark.parametrize("shard", range(4))
def test_fuzz_graphs(shard, caplog):
    """1,000 random cases over the suite (4 shards of 250) against eager."""
    run_fuzz(POOL, shard, 4, 250, caplog)


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(8))
def test_fuzz_graphs_long(shard, caplog):
    """10,000 random cases (8 shards of 1,250) over a larger pool."""
    run_fuzz(POOL_LONG, shard, 8, 1250, caplog)

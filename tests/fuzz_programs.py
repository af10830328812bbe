"""The fuzzer's programs (tests/test_fuzz.py): the op vocabulary, random straight-line programs over it, and input
values with IEEE edge cases in every legal layout. Not a test module: test_fuzz.py imports it (tests/conftest.py
puts this folder on the path)."""

from __future__ import annotations

import contextlib
import functools
import math
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

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
    "roll": ("torch.roll({0}, (1, -2), (0, -1))", True), "roll_flat": ("torch.roll({0}, 3)", True),
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


class _CpuKernelF:
    """``torch.nn.functional`` as eager's CPU kernel computes a contiguous tensor of more than one element, where
    torch's own paths disagree (the rule the c target follows: ``lowering.builders.cpu_form``). gelu runs on a padded
    contiguous copy, so a single element or a strided view gets the kernel's answer at +-inf (float32: NaN; float16
    and bfloat16: what this machine's kernel gives), not the scalar path's (eager's answer for the same value depends
    on the tensor's size and layout, and on the CPU's vector width)."""

    OPS = frozenset({"gelu"})  # the ops computed here otherwise than ``F`` does (``torch_paths`` undoes it)

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or approximate != "none":
            return F.gelu(x, approximate=approximate)
        return F.gelu(torch.cat([x.reshape(-1), x.new_zeros(16)]))[: x.numel()].reshape(x.shape)


EAGER_F = _CpuKernelF()
_EVAL_F = [EAGER_F]  # what ``evaluate`` reads as ``F``: the kernel's rule, or torch's own paths (``torch_paths``)


def in_float64(text: str) -> str:
    """A program's text (or a line's) computed in float64: float32 is float64, and a cast to float16 keeps its
    rounding but goes on in float64 (left in float16, a matmul with a float64 operand is an error)."""
    return text.replace("torch.float32", "torch.float64").replace(".to(torch.float16)", ".to(torch.float16).double()")


def evaluate(expr: str, env: list[torch.Tensor]) -> torch.Tensor:
    return eval(expr, {"torch": torch, "F": _EVAL_F[0]}, {f"v{i}": v for i, v in enumerate(env)})


@contextlib.contextmanager
def torch_paths():
    """``evaluate`` as eager itself computes each tensor (``F``, not ``EAGER_F``): the answer of a region that runs
    through torch, where a template does not take it (a logsumexp over one column): gelu of a single element then
    takes torch's scalar path (the limit, no overflow) that ``EAGER_F`` replaces with the vector kernel's."""
    _EVAL_F[0] = F
    try:
        yield
    finally:
        _EVAL_F[0] = EAGER_F


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

    @functools.cached_property
    def eager(self):
        """``fn`` as eager computes it on any contiguous tensor (``EAGER_F``): what compiled outputs must match."""
        scope = {"torch": torch, "F": EAGER_F}
        exec(compile(self.source(), "<fuzz program>", "exec"), scope)  # noqa: S102 -- our own generated source
        return scope["program"]

    def reference(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The program in float64 (its casts to float16 kept), outputs cast back to eager's dtypes: the yardstick
        for inexact outputs."""
        scope = {"torch": torch, "F": F}
        source = in_float64(self.source())
        exec(compile(source, "<fuzz program>", "exec"), scope)  # noqa: S102 -- our own generated source
        outs = scope["program"](*(x.double() for x in inputs))
        return tuple(o.to(w.dtype) for o, w in zip(outs, self.fn(*inputs)))

    def wide_references(self, *inputs: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """The program with its float16 arithmetic done in float32 (what a fusion compiler does inside a kernel:
        values are rounded to float16 where they are stored, not after every op), outputs cast back to eager's
        dtypes; empty for a program with no float16. An intermediate that overflows float16 in eager (``65504 ** 2``)
        does not overflow so, and that answer is as right as eager's. Two readings of an explicit cast to float16
        inside a kernel, both as right: dropped (Inductor's, ``1 / 6e-8`` is 1.67e7) or rounded there and no later
        (``1 / fp16(6e-8)`` is 2**24, where eager's float16 reciprocal overflows)."""
        source = self.source()
        if self.dtype != torch.float16 and "float16" not in source:
            return []
        wide = [x.float() if x.dtype == torch.float16 else x for x in inputs]
        runs = []
        for text in (source, source.replace(".to(torch.float16)", ".half().float()")):
            scope = {"torch": torch, "F": F}
            exec(compile(text.replace("torch.float16", "torch.float32"), "<fuzz program>", "exec"), scope)  # noqa: S102
            outs = scope["program"](*wide)
            runs.append(tuple(o.to(w.dtype) for o, w in zip(outs, self.fn(*inputs))))
        return runs


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
            out = evaluate(expr, env)
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

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

The programs and their inputs are made in ``tests/fuzz_programs.py``; this module checks them (the overflow oracle,
the comparison) and runs the shards.

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
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from fuzz_programs import (
    BITS,
    CLOSE,
    EAGER_F,
    LAYOUTS,
    SPECIALS,
    VALUE,
    Program,
    Step,
    evaluate,
    in_float64,
    lay_out,
    make_program,
    make_value,
    torch_paths,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target

# One seed per test run, shared by pytest-xdist's workers (their shards take disjoint parts of one pool).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
SEED = int(os.environ.get("TILEFUSE_FUZZ_SEED") or (int(_RUN[:8], 16) if _RUN else random.SystemRandom().randrange(2**32)))
POOL, POOL_LONG = 32, 200  # programs per run: each costs its kernels' compiles (1-2 s each) once


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
    runs = {"eager": (list(inputs), str), "float64": ([x.double() for x in inputs], in_float64)}
    if half:
        runs["wide"] = ([x.float() if x.dtype == torch.float16 else x for x in inputs],
                        lambda text: text.replace("torch.float16", "torch.float32"))
    bounds = seen.setdefault("bounds", {})
    for step, line in zip(program.steps, program.lines):
        masks = {name: _masks(step, runs[name][0], bounds if name == "eager" else None)
                 for name in ("eager", "wide") if name in runs and step.op in OVERFLOW_OPS}
        for name, (env, spelled) in runs.items():
            out = evaluate(spelled(line), env)
            m = masks.get("eager" if name == "float64" else name, {})
            seen.update(dict.fromkeys(m, True))
            exact = evaluate(line, [v.double() for v in env]) if m else None
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
    want = program.eager(*inputs)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tilefuse"), torch.no_grad():
        backend, compiled = compile_program(program, inputs)
        got = compiled(*inputs)
    assert backend.failures == [], backend.failures
    assert len(backend.programs) == 1
    compile_failures = [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()]
    assert compile_failures == [], compile_failures
    try:
        compare(program, inputs, got, want)
    except AssertionError as e:
        # a region that no template takes runs through torch, and eager's own paths are its answer (``torch_paths``)
        if not EAGER_F.OPS.intersection(s.op for s in program.steps):
            raise AssertionError(f"{e}\n{second_look(program, inputs, compiled, got)}") from e
        with torch_paths():
            try:
                compare(program, inputs, got, program.fn(*inputs))
            except AssertionError as again:
                raise AssertionError(f"{again}\n{second_look(program, inputs, compiled, got)}") from again


def second_look(program: Program, inputs: list[torch.Tensor], compiled, got) -> str:
    """Where a wrong answer comes from (CI, seed 1897132889: an rms norm over 4 columns answered 4.93, which no rms
    norm of 4 values can, once in a loaded run and never again): the same compiled program called again, and the
    program compiled afresh with no kernel cache (this process's, the PrimFunc cache on disk, TileLang's), each
    compared with the first answer."""
    import tilelang

    from tilefuse.lowering import lower

    def same(a, b) -> str:
        equal = all(x.shape == y.shape and bool(((x == y) | (x != x) & (y != y)).all()) for x, y in zip(a, b))
        return "the same" if equal else "different"

    with torch.no_grad(), mock.patch.dict(os.environ, {"TILEFUSE_FUNC_CACHE": "0"}), \
            mock.patch.dict(lower._COMPILED, clear=True):
        again = compiled(*inputs)
        cached = tilelang.is_cache_enabled()
        tilelang.disable_cache()
        try:
            cold = compile_program(program, inputs)[1](*inputs)
        finally:
            if cached:
                tilelang.enable_cache()
    return (f"second look: called again, {same(got, again)} answer; compiled afresh without kernel caches, "
            f"{same(got, cold)} answer")


def compare(program: Program, inputs: list[torch.Tensor], got, want) -> None:
    """Every output element of ``got`` against ``want`` (eager's), as the output's level asks."""
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
            for wide in program.wide_references(*inputs) if bad.any() and level == CLOSE else ():
                bad &= ~_same_bits(g, wide[k])  # a comparison of a float16 value the kernel kept in float32
        elif level == VALUE:
            bad = ~((g == w) | (torch.isnan(g) & torch.isnan(w)))
        else:
            ref = ref or program.reference(*inputs)
            bad = ~_close(g, w, ref[k], **program.tol)
            for wide in program.wide_references(*inputs) if bad.any() else ():
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
    reference than ten times eager's own error (eager's rounding sets the scale where a chain amplifies it), or a
    domain edge crossed by rounding: one side NaN, the other within ``sqrt(atol)`` of a float64 reference that is
    itself that near 0 (``sqrt`` of a layer-normed row's sum, 0 in float64, is NaN or ~1e-3 in float32 by the
    summation order's sign; a seeded CI run met eager's NaN against a kernel's 9.1e-4)."""
    g, w, r = got.double(), want.double(), ref.double()
    same = (g == w) | (torch.isnan(g) & torch.isnan(w)) | (g == r) | (torch.isnan(g) & torch.isnan(r))
    finite = torch.isfinite(g) & torch.isfinite(w) & torch.isfinite(r)
    near = (g - w).abs() <= atol + rtol * w.abs()
    err, eager_err = (g - r).abs(), (w - r).abs()
    edge = (torch.isnan(g) ^ torch.isnan(w)) & (r.abs() <= math.sqrt(atol))
    crossed = edge & ((torch.where(torch.isnan(g), w, g) - r).abs() <= math.sqrt(atol))
    return same | crossed | finite & (near | (err <= 10 * eager_err + atol + rtol * r.abs()))


def _show(bad: torch.Tensor, got, want, ref) -> str:
    idx = bad.nonzero()[:6].tolist()
    rows = [f"  at {tuple(i)}: got {got[tuple(i)].item()!r}, eager {want[tuple(i)].item()!r}"
            + (f", float64 {ref[tuple(i)].item()!r}" if ref is not None else "") for i in idx]
    return "\n".join(rows)


def test_close_takes_a_domain_edge_crossed_by_rounding_and_nothing_wider():
    tol = {"rtol": 1e-5, "atol": 1e-5}
    nan = math.nan
    # (got, eager, float64): the CI case (sqrt of a sum that is 0 in float64), both ways round, then what stays wrong
    got, want, ref = (torch.tensor(v) for v in ((9.1e-4, nan, nan, 0.49, nan, 1.0),
                                                (nan, 9.1e-4, 0.5, nan, 0.02, 1.1),
                                                (0.0, 0.0, 0.5, 0.5, 0.02, 1.0)))
    assert _close(got, want, ref, **tol).tolist() == [True, True, False, False, False, True]


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


def test_a_float32_0d_tensor_against_float16_is_rounded_to_float16_first(caplog):
    """``x.to(float16) - s`` with ``s`` a 0-d float32 tensor: torch promotes to float16 and rounds ``s`` there before
    subtracting, so an element equal to ``s`` gives 0; the kernel subtracted ``s`` in float32 and gave 3.9e-5 (CI's
    random run under load, seed 3410120813). The same for the other binary ops and ``where``."""
    s = 3.0819921493530273
    x = torch.tensor([[s, -1.7133, -2.1424, 0.3641, 65504.0], [1e-7, -0.0, math.nan, math.inf, 2.5]])
    lines = ("v0.to(torch.float16)", "v2 - v1", "v2 + v1", "v2 * v1", "torch.maximum(v2, v1)", "v1 - v2",
             "torch.where(v2 > 0, v2, v1)")
    steps = (Step("cast", (0,), (("to", "float16"),)), Step("sub", (2, 1)), Step("add", (2, 1)), Step("mul", (2, 1)),
             Step("maximum", (2, 1)), Step("sub", (1, 2)), Step("where", (2, 2, 1)))
    program = Program(torch.float32, ((2, 5), ()), lines, (3, 4, 5, 6, 7, 8), (BITS,) * 9, steps)
    check_case(program, [x, torch.tensor(s)], caplog)
    assert program.eager(x, torch.tensor(s))[0][0, 0].item() == 0.0


def test_a_python_number_against_float16_rounds_as_torchs_cpu_kernels_do(caplog):
    """torch's CPU add/sub round a Python number to the float16 tensor's dtype first (``x - 3.0819921`` is 0 at x =
    3.08203125), its mul/div keep it in float32 (so does CUDA for all four): the c target computes each as CPU eager."""
    x = torch.tensor([[3.0819921493530273, -1.7133, 0.1, 65504.0, 7.7], [1e-7, -0.0, math.nan, math.inf, 2.5]])
    lines = ("v0.to(torch.float16)", "v1 - 3.0819921493530273", "v1 + 0.1", "0.1 - v1", "v1 * 0.1", "v1 / 7.77777")
    steps = (Step("cast", (0,), (("to", "float16"),)), Step("add_scalar", (1,)), Step("add_scalar", (1,)),
             Step("rsub_scalar", (1,)), Step("mul_scalar", (1,)), Step("div_scalar", (1,)))
    program = Program(torch.float32, ((2, 5),), lines, (2, 3, 4, 5, 6), (BITS,) * 7, steps)
    check_case(program, [x], caplog)
    assert program.eager(x)[0][0, 0].item() == 0.0


def test_a_matmul_of_a_cast_to_float16_is_checked_in_float64(caplog):
    """A float16 program whose cast to float16 feeds a matmul: the float64 yardstick (``reference``, the overflow
    oracle's pinned runs) kept the cast's result in float16 and its matmul with a float64 operand raised (CI's random
    run under load, seed 3211640100); the cast now keeps its rounding and goes on in float64."""
    x = torch.tensor([[3.082]], dtype=torch.float16)
    lines = ("torch.le(v1, v0)", "v3.to(torch.float16)", "v1 @ v4", "torch.logsumexp(v2, -2, keepdim=True)",
             "F.layer_norm(v4, (1,))")
    steps = (Step("le", (1, 0)), Step("cast", (3,), (("to", "float16"),)), Step("matmul", (1, 4)),
             Step("logsumexp", (2,), (("d", -2), ("k", True))), Step("layer_norm", (4,)))
    program = Program(torch.float16, ((1, 1),) * 3, lines, (5, 6, 7), (BITS,) * 5 + (CLOSE,) * 3, steps)
    check_case(program, [x, x.clone(), x.clone()], caplog)
    assert in_float64("v3.to(torch.float16) + v2.to(torch.float32)") == \
        "v3.to(torch.float16).double() + v2.to(torch.float64)"


def test_float16_reciprocal_after_an_explicit_cast(caplog):
    """``reciprocal(x.to(float16)).to(float32)`` of 6e-8: eager's float16 reciprocal overflows to inf; a kernel
    that rounds at the explicit cast and keeps float32 after it gives 2**24, Inductor (cast dropped) 1.67e7. Both
    kernel readings pass; a value that is neither fails (found by CI's random run, seed 2475630793)."""
    x = torch.tensor([6e-8, 1e-7, 1.0, 3e38, 65504.0, -0.0, math.nan, math.inf])
    program = Program(torch.float32, ((8,),), ("v0.to(torch.float16)", "torch.reciprocal(v1)", "v2.to(torch.float32)"),
                      (3,), (BITS, BITS, CLOSE, CLOSE),
                      (Step("cast", (0,), (("to", "float16"),)), Step("reciprocal", (1,)),
                       Step("cast", (2,), (("to", "float32"),))))
    check_case(program, [x], caplog)
    dropped, rounded = program.wide_references(x)
    assert dropped[0][0].item() == pytest.approx(1 / 6e-8) and rounded[0][0].item() == 2.0 ** 24
    assert program.eager(x)[0][0].item() == math.inf


def test_second_look():
    """A wrong answer's message says whether the same compiled program, called again, and the program compiled afresh
    without kernel caches answer the same (the right answer here, so a tampered one differs from both)."""
    program = Program(torch.float32, ((2, 3, 4),), ("torch.minimum(v0, v0)",
                                                    "v1 * torch.rsqrt(v1.pow(2).mean(-1, keepdim=True) + 1e-6)"),
                      (2,), (BITS, BITS, CLOSE), (Step("minimum", (0, 0)), Step("rms_norm", (1,))))
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        compiled = compile_program(program, [x])[1]
        got = compiled(x)
    compare(program, [x], got, program.eager(x))
    cached, setting = tilelang_cache_enabled(), os.environ.get("TILEFUSE_FUNC_CACHE")
    assert second_look(program, [x], compiled, got) == ("second look: called again, the same answer; compiled afresh "
                                                        "without kernel caches, the same answer")
    wrong = [got[0].clone()]
    wrong[0][0, 1, 2] = 4.93
    with pytest.raises(AssertionError, match="1 of 24 elements differ"):
        compare(program, [x], wrong, program.eager(x))
    assert second_look(program, [x], compiled, wrong) == ("second look: called again, different answer; compiled "
                                                          "afresh without kernel caches, different answer")
    assert tilelang_cache_enabled() == cached and os.environ.get("TILEFUSE_FUNC_CACHE") == setting


def tilelang_cache_enabled() -> bool:
    import tilelang

    return tilelang.is_cache_enabled()


def test_gelu_in_a_region_through_torch(caplog):
    """``layer_norm(logsumexp(gelu(x)))`` of a (1, 1) 3e38 (CI, seed 3324281354): no template takes a logsumexp over
    one column, so gelu and logsumexp run through torch, whose scalar path gives gelu's limit (3e38, then layer_norm
    0). ``EAGER_F``'s kernel rule overflows (inf, then NaN), and the case passes against eager's own paths. A value
    that is neither still fails."""
    program = Program(torch.float32, ((1, 1),), ("F.gelu(v0)", "torch.logsumexp(v1, 1, keepdim=True)",
                                                  "F.layer_norm(v2, (1,))"), (3,), (BITS, CLOSE, CLOSE, CLOSE),
                      (Step("gelu", (0,)), Step("logsumexp", (1,), (("d", 1), ("k", True))),
                       Step("layer_norm", (2,))))
    x = torch.tensor([[3e38]])
    assert program.eager(x)[0].isnan().all() and program.fn(x)[0].isnan().all()  # (torch's layer_norm of 3e38)
    check_case(program, [x], caplog)  # the compiled answer is 0
    with pytest.raises(AssertionError, match="differ from eager"):
        compare(program, [x], (torch.tensor([[0.0]]),), program.eager(x))
    with torch_paths():
        compare(program, [x], (torch.tensor([[0.0]]),), program.fn(x))
        assert not accepted(torch.tensor([[5.0]]), 0, CLOSE, program, pinned_runs(program, [x])).any()


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
        inputs = [lay_out(make_value(s, program.dtype, seed, rate, SPECIALS), lay)
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

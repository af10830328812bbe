"""Regressions the differential fuzzer (tests/test_fuzz.py) found, each reduced to the smallest graph that showed
it, compiled on ``c`` through torch.compile and compared with eager element by element."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target


def compiled(fn, caplog):
    """``fn`` through the tilefuse backend on ``c``; the test fails if a kernel did not compile (a region then runs
    through torch and would hide the kernel's answer)."""
    torch._dynamo.reset()
    backend = make_backend(Options(target=parse_target("c"), quiet=True))
    compiled_fn = torch.compile(fn, backend=backend)

    def run(*args):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tilefuse"):
            out = compiled_fn(*args)
        assert [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()] == []
        assert backend.failures == [] and len(backend.programs) >= 1
        return out
    return run


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal as IEEE values and in the sign of zero; NaN matches NaN."""
    nan = torch.isnan(want)
    return bool(torch.equal(nan, torch.isnan(got)) and torch.equal(got[~nan], want[~nan])
                and torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan])))


EDGES = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, -1.0, 1e-40, -1e-42, 3e38, -3e38, 1e-7, 0.5, 2.5, -2.5,
         7.0, -7.0, 100.0, 1e30, 6e-8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_abs_of_negative_zero_is_positive_zero(dtype, caplog, rng):
    """abs(-0.0) is +0.0 in torch; the kernel's ``x < 0 ? -x : x`` kept -0.0 (found by the fuzzer: a bit-exact
    chain returned -0.0)."""
    x = torch.cat([torch.tensor(EDGES), torch.randn(13, generator=rng)]).to(dtype)
    x = x[torch.randperm(len(x), generator=rng)]
    f = compiled(lambda a: torch.abs(a * 1.0), caplog)
    got, want = f(x), torch.abs(x * 1.0)
    assert same_bits(got, want), (x, got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_remainder_edge_divisors_match_torch(dtype, caplog, rng):
    """torch.remainder on every pair of edge values (infinite, zero, denormal and huge divisors) equals torch's own
    answer element by element. The kernel computed ``a - b * floor(a / b)``: remainder(1, inf) gave NaN (torch: 1),
    and large quotients lost their low digits. Reference: torch one element at a time (its exact fmod-based
    scalar path; the vectorized path of a long tensor itself gives NaN for some denormal divisors)."""
    edges = torch.tensor(EDGES, dtype=dtype)
    a = torch.cat([edges.repeat_interleave(len(edges)), (torch.randn(64, generator=rng) * 50).to(dtype)])
    b = torch.cat([edges.repeat(len(edges)), (torch.randn(64, generator=rng) * 3).to(dtype)])
    f = compiled(lambda x, y: torch.remainder(x, y + 0.0), caplog)
    got = f(a, b)
    want = torch.stack([torch.remainder(x.view(1), y.view(1))[0] for x, y in zip(a, b)])
    assert same_bits(got, want), [(x.item(), y.item(), g.item(), w.item()) for x, y, g, w in zip(a, b, got, want)
                                  if not same_bits(g.view(1), w.view(1))][:8]


@pytest.mark.parametrize("shape, dim, correction", [((5, 1), -1, 1), ((3, 2), -1, 2), ((3, 2), -1, 3), ((1, 4), 0, 1)])
def test_var_without_degrees_of_freedom(shape, dim, correction, caplog, rng):
    """var over fewer elements than its correction divides by zero: NaN (or inf), as torch. The reduction
    template divided by a literal 0 and TVM refused to compile it (``Divide by zero``), so the region ran through
    torch with a warning (found by the fuzzer: ``torch.var(v, -1)`` of a (1, 1) tensor)."""
    x = torch.randn(shape, generator=rng)
    x[0, 0] = 0.0
    if shape[-1] > 1:
        x[-1] = 2.0  # a constant row: sum of squares 0, 0 / 0
    f = compiled(lambda a: torch.var(a * 1.0, dim, correction=correction), caplog)
    with pytest.warns(UserWarning, match="degrees of freedom"):
        want = torch.var(x, dim, correction=correction)
    got = f(x)
    assert same_bits(got, want), (got, want)


@pytest.mark.parametrize("sa, sb", [((3, 0), (0, 4)), ((3, 4), (4, 0)), ((0, 3), (3, 4)), ((2, 3, 0), (0, 5))])
def test_matmul_with_an_empty_dim(sa, sb, caplog, rng):
    """A matmul with K = 0 (zeros, then the epilogue) or N = 0 runs. It crashed in TileLang's wrapper ('Static
    stride mismatch ... expected 0'): an empty input reached the kernel with torch's strides ((1, 1) for (3, 0))
    where TileLang compiled the products of the later dims ((0, 1)), and TileLang allocated an empty output
    with strides its own check refused (found by the fuzzer: ``v0 @ v1`` with a (3, 0) operand)."""
    x, w = torch.randn(sa, generator=rng), torch.randn(sb, generator=rng)
    f = compiled(lambda a, b: torch.relu(a @ b) + 1.0, caplog)
    got = f(x, w)
    assert got.shape == (x @ w).shape and torch.equal(got, torch.relu(x @ w) + 1.0)


@pytest.mark.parametrize("fn", [lambda x, w: F.linear(x, w, x), lambda x, w: x @ w + x, lambda x, w: (x @ w) * w],
                         ids=["linear_bias_is_input", "residual_of_a", "times_b"])
def test_gemm_epilogue_reads_an_operand(fn, caplog, rng):
    """A GEMM whose epilogue reads one of the GEMM's own operands (``x @ w + x``) compiles: the builder dropped
    the operand from the kernel's extra inputs while the epilogue still read it as ``arg0`` ('expression reads
    arg0 but the region has 0 extra inputs'), so the region ran through torch (found by the fuzzer:
    ``F.linear(v1, v0, v1)``)."""
    x, w = torch.randn(5, 5, generator=rng), torch.randn(5, 5, generator=rng)
    got = compiled(fn, caplog)(x, w)
    torch.testing.assert_close(got, fn(x, w), rtol=1e-5, atol=1e-5)


FOLDED = {  # float arithmetic TVM folds as if it were real numbers (lowering/expr.py, the module note)
    "x - x": lambda x, y: (x * 2) - (x * 2),
    "(x + y) - y": lambda x, y: (x + y) - y,
    "(x + y) - x": lambda x, y: (x + y) - x,
    "x - (x + y)": lambda x, y: x - (x + y),
    "where - its branch": lambda x, y: torch.where(x > 0, x, y) - y,
    "x * 0.0": lambda x, y: (x + y) * 0.0,
    "x * -0.0": lambda x, y: (x + y) * -0.0,
    "0.0 * x": lambda x, y: 0.0 * (x + y),
    "x + 0.0": lambda x, y: (x * y) + 0.0,
    "x - -0.0": lambda x, y: (x * y) - (-0.0),
    "0.0 - x": lambda x, y: 0.0 - (x * y),
    "0.0 / x": lambda x, y: 0.0 / (x + y),
    "-0.0 / x": lambda x, y: -0.0 / (x + y),
    "x / 0.0": lambda x, y: (x * y) / 0.0,
    "x / -0.0": lambda x, y: (x * y) / -0.0,
    "scale by 0": lambda x, y: torch.mul(x - y, 0),
    "leaky_relu slope 0": lambda x, y: F.leaky_relu(x * y, 0.0),
    "not x < y": lambda x, y: torch.logical_not(x < y),
    "not x >= y": lambda x, y: ~(x * 1.0 >= y),
}


@pytest.mark.parametrize("name", sorted(FOLDED))
def test_float_arithmetic_is_not_folded(name, caplog, rng):
    """``x - x``, ``x * 0.0``, ``x + 0.0``, ``0.0 / x`` and friends keep IEEE's NaN, Inf and signed zeros, as in
    eager: TVM folded ``x - x`` and ``x * 0`` to 0 (``[nan, inf]`` gave ``[0, 0]``), ``(x + y) - y`` to ``x``
    (wrong once ``x + y`` overflows), ``-0.0 + 0.0`` to ``-0.0``, ``0.0 / 0.0`` to 0, and ``not x < y`` to
    ``y <= x`` (false for NaN); ``x / 0.0`` did not compile (found by the fuzzer: ``v1 - v1`` gave 0 for NaN)."""
    fn = FOLDED[name]
    edges = torch.tensor(EDGES)
    x = torch.cat([edges.repeat_interleave(len(edges)), torch.randn(32, generator=rng)])
    y = torch.cat([edges.repeat(len(edges)), torch.randn(32, generator=rng)])
    got, want = compiled(fn, caplog)(x, y), fn(x, y)
    if want.dtype == torch.bool:
        assert torch.equal(got, want), [(a.item(), b.item()) for a, b, g, w in zip(x, y, got, want) if g != w][:8]
    else:
        assert same_bits(got, want), [(a.item(), b.item(), g.item(), w.item()) for a, b, g, w in zip(x, y, got, want)
                                      if not same_bits(g.view(1), w.view(1))][:8]


def test_rms_norm_of_a_0d_tensor(caplog):
    """The rms_norm pattern on a 0-d tensor (``x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, which torch
    allows) is left as plain ops: its check took the mean's dim modulo the rank, 0, and the planner failed with
    ``ZeroDivisionError`` (found by the fuzzer)."""
    fn = lambda x, y: y * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    x, y = torch.tensor(3.0), torch.tensor([[1.5, -2.0, math.inf]])
    got, want = compiled(fn, caplog)(x, y), fn(x, y)
    assert same_bits(got, want), (got, want)


@pytest.mark.parametrize("fn", [lambda x, y, z: x * y + z, lambda x, y, z: z - x * y, lambda x, y, z: (x + z) * y - z],
                         ids=["x*y+z", "z-x*y", "(x+z)*y-z"])
def test_products_are_rounded_before_the_sum(fn, caplog, rng):
    """A fused ``x * y + z`` rounds the product and then the sum, as eager (two ops, two roundings): gcc contracted
    it into one fma on ``c`` (``-march=native``), and a quarter of random elements differed from eager in the last
    bit; ``1e-40 * -1e-42 + 0.0`` gave -0.0 (found by the fuzzer's zero-sign checks)."""
    x, y, z = (torch.randn(4096, generator=rng) for _ in range(3))
    x[:3], y[:3], z[:3] = torch.tensor([1e-40, -1e-40, 3e38]), torch.tensor([-1e-42, -1e-42, 3e38]), 0.0
    got, want = compiled(fn, caplog)(x, y, z), fn(x, y, z)
    assert same_bits(got, want), (got != want).sum()


def test_transpose_of_a_0d_tensor(caplog):
    """``transpose(0, -1)`` of a 0-d tensor (torch allows it: the tensor itself) inside a fused region lowers: the
    index rule took the dims modulo the rank, 0, and planning failed with ``ZeroDivisionError`` (found by the
    fuzzer: ``v2.to(torch.float16).transpose(0, -1)``)."""
    fn = lambda x, y: (x.to(torch.float16).transpose(0, -1), torch.gt(x.to(torch.float16), y))
    x, y = torch.tensor(3.0), torch.tensor([[2.5, 3.0, math.nan]])
    got, want = compiled(fn, caplog)(x, y), fn(x, y)
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want)), (got, want)


def test_flip_of_a_0d_tensor(caplog):
    """``flip(x, (-1,))`` of a 0-d tensor (torch allows it: the tensor itself) plans and lowers: the index rule took
    the dims modulo the rank, 0, and planning failed with ``ZeroDivisionError`` (found by the fuzzer's long run)."""
    fn = lambda x, y: (torch.maximum(x, x), torch.flip(y, (-1,)) * 2)
    x, y = torch.randn(2, 3, 4), torch.tensor(3.0819921493530273)
    got, want = compiled(fn, caplog)(x, y), fn(x, y)
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want)), (got, want)


@pytest.mark.parametrize("cols", [7, 3000])  # one column tile, and several (the moments merged across tiles)
def test_layer_norm_whose_variance_overflows_is_nan(cols, caplog, rng):
    """A layer_norm row whose variance (or mean) overflows float32 comes out NaN, so the overflow shows (issue 15):
    the kernel gave 0 (``(x - mean) * rsqrt(inf)``), a silent wrong answer, where float64 gives e.g. -0.41, and
    torch's CPU kernel gives NaN or 0 by how its vector lanes merge the moments (fuzzer bug 7). A row whose mean
    is past 1.8e19 but whose variance is finite gets float64's answer: the multi-tile merge gave NaN
    (``(mean - 0)^2 * 0``), and torch's CPU kernel gives NaN for it where its lanes hold such a mean."""
    w, b = torch.randn(cols, generator=rng), torch.randn(cols, generator=rng)
    fn = lambda x: F.layer_norm(x * 1.0, (cols,), w, b)
    x = torch.randn(8, cols, generator=rng)
    x[0, :7] = torch.tensor([1.5165e-01, 6.1744e-02, -2.4845e00, 3.0e38, 2.6542e00, -3.8657e-01, 1.0002e00])
    x[1, [0, 5]] = torch.tensor([3e38, -3e38])  # x - mean overflows, and x - x[0]
    x[2, 1] = 3e19  # M2 = 9e38 (1 - 1/cols): past float32's 3.4e38, the variance itself is not
    x[3, :] = 3e38  # the sum overflows
    x[3, -1] = 1e38
    x[4] = 3e19 + x[4] * 1e17  # a mean past 1.8e19 (its square overflows), M2 about 1e34 * cols
    x[5] = 1e30  # a constant row: exactly 0 (then the bias)
    x[6, 4] = 1e19  # M2 = 1e38: finite
    over = torch.tensor([True, True, True, True, False, False, False, False])
    got = compiled(fn, caplog)(x)
    assert got[over].isnan().all(), got[over][:, :8]
    exact = F.layer_norm(x.double(), (cols,), w.double(), b.double())
    assert exact[over].isfinite().all()  # NaN is our rule, not float64's answer
    # Within 5e-4: float32 moments of rows whose mean is 300 times their spread (row 4), or whose one element is 1e19
    # among normal ones (row 6), over 3000 columns, are that far from float64's (about 5e-5 seen).
    torch.testing.assert_close(got[~over], exact[~over].float(), rtol=5e-4, atol=5e-4)
    torch.testing.assert_close(got[7], fn(x[7:])[0], rtol=1e-5, atol=1e-5)  # an ordinary row, as eager


@pytest.mark.parametrize("fn", [lambda x: F.layer_norm(x, (7,)), lambda x: torch.var(x, -1),
                                lambda x: F.layer_norm(x, (300,))], ids=["layer_norm", "var", "layer_norm_wide"])
def test_moments_of_a_constant_row_are_exact(fn, caplog):
    """A constant row (an expanded, stride-0 input) has mean exactly its value and variance exactly 0, as in torch:
    the kernel's tile mean was sum / n (seven 3.082s: not 3.082), and layer_norm gave 7.5e-5 where eager gives 0
    (found by the fuzzer)."""
    n = 300 if "300" in str(fn.__code__.co_consts) else 7
    for v in (3.082, -0.5869, 1e-3, 65504.0):
        x = torch.tensor([v], dtype=torch.float32).expand(n) if n == 300 else torch.full((7,), v)
        x = x.unsqueeze(0).expand(3, n)
        got, want = compiled(fn, caplog)(x), fn(x)
        assert same_bits(got, want), (v, got, want)


def test_elu_keeps_tiny_negative_values(caplog):
    """elu's exp(x) - 1 cancelled to 0 for |x| below float32's epsilon (elu(-1e-42) = 0, torch's expm1 gives -1e-42;
    a later 0 * inf was NaN where eager has an infinity): the emitter computes expm1 without the cancellation."""
    x = torch.tensor([-1e-42, -1e-30, -1e-8, -3e-4, -0.0, -1.0, -20.0, -math.inf, math.nan, 2.0])
    fn = lambda v: F.elu(v * 1.0)
    got, want = compiled(fn, caplog)(x), fn(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.signbit(got), torch.signbit(want))
    fin = ~torch.isnan(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=2e-6, atol=0)


def test_layer_norm_reference_follows_the_kernels_overflow_rule():
    """A layer_norm region run through torch (the registry's reference) gives what its kernel gives where the moments
    leave float32's range: NaN where the squared deviations overflow, float64's answer where only a mean past
    1.8e19 would be squared (torch's CPU kernel: NaN for a lone 3e38)."""
    from tilefuse import ops

    ln = ops.get("layer_norm")
    x = torch.tensor([[3e38, -3e38, 1.0], [1.0, 2.0, 3.0]])
    (got,) = ln.run([x], {"axis": -1})
    assert got[0].isnan().all() and torch.equal(got[1], F.layer_norm(x[1:], (3,))[0])
    lone = torch.tensor([[3e38], [2.5], [math.nan]])  # (the NaN row: found by the 10,000-case run)
    (got,) = ln.run([lone], {"axis": -1})
    assert torch.equal(got[:2], torch.zeros(2, 1)) and got[2].isnan()  # float64's answer; eager: NaN for 3e38


@pytest.mark.parametrize("op", [torch.eq, torch.ne, torch.lt, torch.ge])
def test_a_comparison_promotes_its_operands_as_eager_does(op, caplog):
    """eq(a 0-d float32 3e38, a float16 tensor): eager compares in float16, where 3e38 is inf; a kernel comparing in
    float32 said 3e38 != inf (seed 2725644612, shard 0/4). The frontend now casts to the promoted dtype first."""
    def fn(s, x):
        return op(s, (x * 1.5).to(torch.float16)), op((x * 1.5).to(torch.float16), s)

    s = torch.tensor(3e38)
    x = torch.tensor([[float("inf"), 65504.0, 1.0, float("-inf"), float("nan"), 3e38, -3e38, 0.0, 43690.0]])
    for got, want in zip(compiled(fn, caplog)(s, x), fn(s, x)):
        assert torch.equal(got, want), (got, want)


def test_gelu_of_inf_follows_torchs_cpu_kernel(caplog):
    """Found by CI (seed 1997447005): ``gelu(hardswish(3e38))`` was inf, eager NaN. torch's CPU gelu of float32 gives
    NaN at +-inf and overflows past 2^127 for any contiguous tensor of more than one element (its scalar path, for a
    single element or a strided view, gives the limit on AVX2). c follows the kernel (``lowering.builders.cpu_form``).
    float16 depends on the CPU: the limit with AVX2, NaN with AVX512 (torch widens it into the float32 kernel; found
    by CI on an AVX512 machine, where this test expected the limit); c asks this process's torch."""
    def fn(x):
        return F.gelu(F.hardswish(x)), F.gelu(x * 1), F.gelu(x.half() * 1)

    x = torch.tensor([[float("-inf"), 0.0, 3e38, 1.1369, -2.169, float("inf"), float("nan"), 2.0 ** 127, 1.7e38,
                       -0.0, -3e38, 1e-40]])
    for got, want in zip(compiled(fn, caplog)(x), fn(x)):
        assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), (got, want)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5 if got.dtype == torch.float32 else 1e-2,
                                   atol=1e-6)
        assert torch.equal(torch.signbit(got), torch.signbit(want)) or got.isnan().any()
    one = torch.tensor([float("inf")])  # eager's scalar path: the limit; the rule: the kernel's NaN
    assert torch.isnan(compiled(lambda v: F.gelu(v * 1), caplog)(one)).all()

"""NaN, +-inf and -0.0 through the min/max-like ops, as torch computes them (issue 15, item 1).

torch's rules, checked on the ``c`` target through ``torch.compile`` and through the ONNX path (in memory and
from a saved artifact): relu, clamp, hardtanh and relu6 keep NaN and keep ``x`` where it equals a bound
(``relu(-0.0)`` is ``-0.0``); ``maximum``/``minimum`` give NaN when either operand is NaN; ``amax``/``amin``
(and ``max``/``min`` over a dim) give NaN for a row holding one; softmax of such a row is NaN; max pooling over
a window holding one is NaN. Elementwise results are compared bit for bit (NaN against NaN), but for
``maximum``/``minimum``/``amax``/``amin`` between -0.0 and 0.0, where torch's own answer depends on its
vectorized path and only the value is checked. Every region must have run as a TileLang kernel. The CUDA
code for the same ops is compiled with nvcc for sm_90a, and its source checked for the NaN-propagating forms.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch.nn.attention import SDPBackend, sdpa_kernel

import tilefuse
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.templates import elementwise, gemm, pool, reduction

NAN, INF = math.nan, math.inf
SPECIALS = (NAN, INF, -INF, -0.0, 0.0, 1e-40, -1e-40)  # with fp32 denormals
TOL = {"rtol": 1e-5, "atol": 1e-6}  # ops computed through exp/division in another order than eager


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def special(rng: torch.Generator, *shape: int) -> torch.Tensor:
    """Random normal values, every special value at least once, and more of them at random places."""
    x = torch.randn(*shape, generator=rng)
    flat = x.view(-1)
    picks = torch.randint(0, len(SPECIALS), (flat.numel(),), generator=rng)
    hit = torch.rand(flat.numel(), generator=rng) < 0.2
    flat[hit] = torch.tensor(SPECIALS)[picks[hit]]
    flat[:len(SPECIALS)] = torch.tensor(SPECIALS)
    return x


def assert_same(got: torch.Tensor, want: torch.Tensor, exact: bool = True, what: str = "") -> None:
    """NaN exactly where ``want`` has NaN; the other elements bit for bit (``exact``), equal in value (``"value"``:
    -0.0 == 0.0) or within ``TOL`` (``False``)."""
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} != {want.shape}"
    nan = want.isnan()
    bad = (got.isnan() != nan).nonzero()
    assert bad.numel() == 0, f"{what}: NaN differs at {bad[:8].tolist()}: got {got[tuple(bad[:8].T)].tolist()}, " \
                             f"want {want[tuple(bad[:8].T)].tolist()}"
    g, w = got[~nan], want[~nan]
    if exact is True:
        diff = (g.view(torch.int32) != w.view(torch.int32)).nonzero().flatten()
        assert diff.numel() == 0, f"{what}: bits differ: got {g[diff[:8]].tolist()}, want {w[diff[:8]].tolist()}"
    else:
        torch.testing.assert_close(g, w, **({"rtol": 0, "atol": 0} if exact == "value" else TOL), msg=what)


def run_compiled(fn, *args):
    """``fn`` through ``torch.compile`` (tilefuse, ``c``); every region that launches a kernel is a TileLang one."""
    runners = []
    out = tilefuse.compile(fn, target="c", observer=runners.append)(*args)
    regions = [r for runner in runners for r in runner.plan.regions if r.kind != "view"]
    assert regions, "tilefuse compiled nothing"
    assert all(r.backend == "tilelang" for r in regions), [(r.name, r.kind, r.backend) for r in regions]
    return out


# ---- elementwise, through torch.compile -------------------------------------------------------------

UNARY = {  # name -> (fn, exact)
    "relu": (torch.relu, True),
    "F.relu": (F.relu, True),
    "clamp": (lambda x: torch.clamp(x, -0.5, 1.0), True),
    "clamp_min": (lambda x: torch.clamp_min(x, 0.25), True),
    "clamp_max": (lambda x: torch.clamp_max(x, -0.25), True),
    "clamp_signed_zero_bounds": (lambda x: torch.clamp(x, -0.0, 0.0), True),
    "clamp_empty_range": (lambda x: torch.clamp(x, 1.0, -1.0), True),
    "clamp_infinite_bounds": (lambda x: torch.clamp(x, -INF, INF), True),
    "clamp_nan_bound": (lambda x: torch.clamp(x, NAN, 1.0), True),
    "hardtanh": (F.hardtanh, True),
    "hardtanh_bounds": (lambda x: F.hardtanh(x, -2.0, 0.5), True),
    "relu6": (F.relu6, True),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), True),
    "where_relu": (lambda x: torch.where(x > 0, x, torch.zeros_like(x)), True),
    "hardsigmoid": (F.hardsigmoid, False),
    "hardswish": (F.hardswish, False),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_min_max_like_ops_keep_nan_and_signed_zero(name, rng):
    fn, exact = UNARY[name]
    f = lambda x: fn(x * 2)  # a producer fused in front, as in a model
    x = special(rng, 4, 37)
    assert_same(run_compiled(f, x), f(x), exact, name)


def test_issue_examples():
    x = torch.tensor([NAN, -1.0, 1.0])
    assert_same(run_compiled(lambda x: torch.relu(x * 2), x), torch.tensor([NAN, 0.0, 2.0]))
    torch._dynamo.reset()
    assert_same(run_compiled(lambda x: torch.clamp(x * 2, 0, 1), x), torch.tensor([NAN, 0.0, 1.0]))
    torch._dynamo.reset()
    r = torch.tensor([[1.0, NAN, 3.0], [1.0, 2.0, 3.0]])
    assert_same(run_compiled(lambda x: torch.amax(x * 1, -1), r), torch.tensor([NAN, 3.0]))


def test_round_is_half_to_even_as_torch_has_it(rng):
    """torch.round rounds halves to even (C's round() would take 2.5 to 3 and -0.5 to -1); NaN, the infinities, -0.0
    and numbers past 2^23 (already whole) come through."""
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.0, NAN, INF, -INF, 2.0**23 + 1, 1e30])
    x = torch.cat([halves, special(rng, 64)])
    got = run_compiled(lambda v: torch.round(v * 1.0), x)
    assert_same(got, torch.round(x), True, "round")
    assert got[:6].tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0]


BINARY = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "max_binary": torch.max,
    "min_binary": torch.min,
    "maximum_scalar_tensor": lambda a, b: torch.maximum(a, torch.tensor(0.0)),
    "minimum_chain": lambda a, b: torch.minimum(torch.maximum(a, b), torch.tensor(0.5)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_maximum_minimum_propagate_nan(name, rng):
    fn = BINARY[name]
    f = lambda a, b: fn(a * 2, b)
    a, b = special(rng, 5, 29), special(rng, 5, 29)
    # Every pairing of the special values, in both orders (NaN against NaN, inf, -0.0 against 0.0...).
    s = torch.tensor(SPECIALS)
    a.view(-1)[:len(s) ** 2], b.view(-1)[:len(s) ** 2] = s.repeat_interleave(len(s)), s.repeat(len(s))
    assert_same(run_compiled(f, a, b), f(a, b), "value", name)


NAN_TESTS = {  # NaN checks written with comparisons: TVM's simplifier folds x == x and x != x for floats too
    "x != x": lambda x: x != x,  # noqa: PLR0124
    "x == x": lambda x: x == x,  # noqa: PLR0124
    "nan_to_zero": lambda x: torch.where(x == x, x, torch.zeros_like(x)),  # noqa: PLR0124
    "nan_mask_fill": lambda x: x.masked_fill(x != x, -1.0),  # noqa: PLR0124
}


@pytest.mark.parametrize("name", sorted(NAN_TESTS))
def test_self_comparisons_see_nan(name, rng):
    fn = NAN_TESTS[name]
    f = lambda x: fn(x * 2)
    x = special(rng, 3, 31)
    got, want = run_compiled(f, x), f(x)
    assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), name


# ---- reductions, through torch.compile --------------------------------------------------------------

def rows_with_specials(rng: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """Rows of random values; row 0 holds one NaN, row 1 +inf, row 2 -inf, row 3 NaN and inf, row 4 only NaN,
    row 5 only -inf, row 6 -0.0 and 0.0 only, row 7 a NaN in its last element, the others random."""
    x = torch.randn(rows, cols, generator=rng)
    at = lambda: int(torch.randint(0, cols, (), generator=rng))
    x[0, at()] = NAN
    x[1, at()] = INF
    x[2, at()] = -INF
    x[3, at()], x[3, at()] = INF, NAN
    x[4] = NAN
    x[5] = -INF
    x[6] = torch.where(torch.rand(cols, generator=rng) < 0.5, -0.0, 0.0)
    x[7, -1] = NAN
    return x


REDUCTIONS = {  # name -> (fn, comparison)
    "amax": (lambda x: torch.amax(x, -1), "value"),
    "amin": (lambda x: torch.amin(x, -1), "value"),
    "amax_keepdim": (lambda x: torch.amax(x, -1, keepdim=True), "value"),
    "max_all": (lambda x: torch.max(x), "value"),
    "min_all": (lambda x: torch.min(x), "value"),
    "max_dim_values": (lambda x: torch.max(x, -1).values, "value"),
    "min_dim_values": (lambda x: torch.min(x, -1).values, "value"),
    "relu_then_amax": (lambda x: torch.amax(torch.relu(x), -1), "value"),
    "softmax": (lambda x: torch.softmax(x, -1), False),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), False),
}


@pytest.mark.parametrize("cols", [37, 1500])  # one column tile, and several (the row max merged across tiles)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_row_reductions_propagate_nan(name, cols, rng):
    fn, how = REDUCTIONS[name]
    f = lambda x: fn(x * 2)
    x = rows_with_specials(rng, 10, cols)
    assert_same(run_compiled(f, x), f(x), how, f"{name} cols={cols}")


@pytest.mark.parametrize("pos", [0, 200, 369])  # the first, a middle and the last element reduced
def test_whole_tensor_max_min_with_one_nan(pos, rng):
    f = lambda x: (torch.max(x * 2), torch.amin(x * 2, -1), torch.amax(x * 2, -1))
    x = torch.randn(10, 37, generator=rng)
    x.view(-1)[pos] = NAN
    for i, (g, w) in enumerate(zip(run_compiled(f, x), f(x))):
        assert_same(g, w, "value", f"output {i}, NaN at {pos}")


def test_max_pool_window_with_nan_is_nan(rng):
    f = lambda x: F.max_pool2d(x * 2, 3, stride=2, padding=1)
    x = special(rng, 2, 3, 9, 11)
    assert_same(run_compiled(f, x), f(x), "value", "max_pool2d")


def test_linear_relu_epilogue_keeps_nan(rng):
    w, b = torch.randn(24, 40, generator=rng), torch.randn(24, generator=rng)
    f = lambda x: torch.relu(F.linear(x, w, b))
    x = torch.randn(33, 40, generator=rng)
    x[3, 5], x[7, 0], x[8, 1] = NAN, INF, -INF
    got, want = run_compiled(f, x), f(x)
    assert want.isnan().any()
    # (a 41-term float32 dot product in another order: up to ~2e-6 apart near 0, past TOL's atol on one seed)
    fin = ~want.isnan()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-5, atol=1e-5, msg="linear + relu")


def test_attention_row_with_nan_is_nan(rng):
    """A NaN score makes its row NaN, as the math definition (torch's MATH backend); torch's CPU flash kernel
    returns 0 for a query row holding a NaN, so the math backend is the reference here."""
    q, k, v = (torch.randn(1, 2, 9, 16, generator=rng) for _ in range(3))
    q[0, 0, 1, 3], k[0, 1, 4, 0], v[0, 1, 6, 2] = NAN, NAN, NAN
    f = lambda q, k, v: F.scaled_dot_product_attention(q * 1, k * 1, v * 1)
    with sdpa_kernel(SDPBackend.MATH):
        want = f(q, k, v)
    assert want.isnan().any() and not want.isnan().all()
    assert_same(run_compiled(f, q, k, v), want, False, "sdpa")


# ---- the ONNX path, in memory and through a saved artifact ------------------------------------------

def onnx_case(nodes, inputs: dict[str, torch.Tensor], want: torch.Tensor, how, ort_agrees: bool, inits=()):
    """(model, inputs, want, how, ort_agrees): a model of ``nodes`` from the fp32 ``inputs`` to ``y``."""
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t.shape))
                                             for n, t in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(want.shape))],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(m)
    return m, list(inputs.values()), want, how, ort_agrees


def _onnx_cases(rng):
    """name -> (model, inputs, torch reference of the output, comparison, onnxruntime agrees with torch)."""
    x, y, z = special(rng, 3, 41), special(rng, 3, 41), special(rng, 3, 41)
    w, b = torch.randn(41, 19, generator=rng), torch.randn(19, generator=rng)
    rows = rows_with_specials(rng, 9, 23)
    img = special(rng, 2, 3, 8, 10)
    n, f32 = helper.make_node, np.float32
    return {
        "Relu": onnx_case([n("Relu", ["x"], ["y"])], {"x": x}, torch.relu(x), True, True),
        "Clip": onnx_case([n("Clip", ["x", "lo", "hi"], ["y"])], {"x": x}, torch.clamp(x, -0.5, 0.75), True, True,
                          [("lo", f32(-0.5)), ("hi", f32(0.75))]),
        # onnxruntime's Clip without a max clamps +inf to the largest float; torch (and the ONNX spec) keep inf.
        "Clip_min_only": onnx_case([n("Clip", ["x", "lo"], ["y"])], {"x": x}, torch.clamp(x, 0.0), True, False,
                                   [("lo", f32(0))]),
        "Max": onnx_case([n("Max", ["x", "y0", "z"], ["y"])], {"x": x, "y0": y, "z": z},
                         torch.maximum(torch.maximum(x, y), z), "value", True),
        "Min": onnx_case([n("Min", ["x", "y0"], ["y"])], {"x": x, "y0": y}, torch.minimum(x, y), "value", True),
        "LeakyRelu": onnx_case([n("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": x}, F.leaky_relu(x, 0.2), True,
                               True),
        "HardSigmoid": onnx_case([n("HardSigmoid", ["x"], ["y"], alpha=0.25, beta=0.4)], {"x": x},
                                 torch.clamp(0.25 * x + 0.4, 0, 1), False, True),
        "MatMul_Add_Relu": onnx_case([n("MatMul", ["x", "w"], ["h"]), n("Add", ["h", "b"], ["hb"]),
                                      n("Relu", ["hb"], ["y"])], {"x": x}, torch.relu(x @ w + b), False, True,
                                     [("w", w.numpy()), ("b", b.numpy())]),
        # onnxruntime drops NaN in ReduceMax/ReduceMin/MaxPool (order-dependent); tilefuse follows torch.
        "ReduceMax": onnx_case([n("ReduceMax", ["x", "axes"], ["y"], keepdims=0)], {"x": rows}, rows.amax(1),
                               "value", False, [("axes", np.array([1], np.int64))]),
        "ReduceMin": onnx_case([n("ReduceMin", ["x", "axes"], ["y"], keepdims=1)], {"x": rows},
                               rows.amin(1, keepdim=True), "value", False, [("axes", np.array([-1], np.int64))]),
        "Softmax": onnx_case([n("Softmax", ["x"], ["y"], axis=-1)], {"x": rows}, torch.softmax(rows, -1), False,
                             True),
        "MaxPool": onnx_case([n("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                             {"x": img}, F.max_pool2d(img, 3, 2, 1), "value", False),
    }


ONNX_CASES = ("Relu", "Clip", "Clip_min_only", "Max", "Min", "LeakyRelu", "HardSigmoid", "MatMul_Add_Relu",
              "ReduceMax", "ReduceMin", "Softmax", "MaxPool")


@pytest.mark.parametrize("name", ONNX_CASES)
def test_onnx_ops_propagate_nan(name, rng, tmp_path):
    m, inputs, want, how, ort_agrees = _onnx_cases(rng)[name]
    compiled = tilefuse.compile_onnx(m, target="c", save=tmp_path / "m.tfz")
    regions = [r for r in compiled.plan.regions if r.kind != "view"]
    assert regions and all(r.backend == "tilelang" for r in regions), compiled.plan.to_text(reasons=False)
    assert_same(compiled(*inputs)[0], want, how, f"{name} (compiled)")
    assert_same(tilefuse.load(tmp_path / "m.tfz")(*inputs)[0], want, how, f"{name} (artifact)")
    if ort_agrees:
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {i.name: t.numpy() for i, t in zip(m.graph.input, inputs)}
        # Within TOL: onnxruntime flushes fp32 denormals to zero.
        assert_same(torch.from_numpy(sess.run(None, feeds)[0]), want, False, f"{name} (onnxruntime)")


# ---- the CUDA code: compiles for sm_90a, in its NaN-propagating form --------------------------------

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_nan_propagating_cuda_kernels_compile_for_sm_90a():
    target = {"kind": "cuda", "arch": "sm_90a"}
    ops = [call("relu", Acc()), call("clamp", Acc(), min=-1.0, max=1.0), call("maximum", Acc(), Arg(1)),
           call("minimum", Acc(), Arg(1)), call("hardsigmoid", Acc()), call("round", Acc())]
    kernels = {
        "elementwise": (elementwise.elementwise([(8, 1000), (1000,)], ["float16", "float32"], ops,
                                                ["float16"] * len(ops), target=target), [-6, -5, -4, -3, -2, -1]),
        "amax_multi_tile": (reduction.row_reduction((64, 5000), "amax", x_dtype="bfloat16", block_N=2048,
                                                    threads=256, target=target), [-1]),
        "amin_rows4": (reduction.row_reduction((33, 37), "amin", block_rows=4, block_N=16, threads=128,
                                               target=target), [-1]),
        "max_pool": (pool.pool2d((4, 64, 56, 56), "max", kernel=(3, 3), stride=(2, 2), padding=(1, 1),
                                 x_dtype="float16", producer=call("relu", Acc()), target=target), [-1]),
        "gemm_relu": (gemm.gemm(256, 256, 128, trans_B=True, A_dtype="float16", epilogue=call("relu", Acc()),
                                block_M=128, block_N=128, block_K=64, num_stages=3, threads=256, target=target),
                      [-1]),
    }
    built = compile_many(list(kernels.values()), target, return_exceptions=True)
    failures = [f"{name}: {type(k).__name__}: {str(k).strip().splitlines()[-1][:300]}"
                for name, k in zip(kernels, built) if isinstance(k, BaseException)]
    assert not failures, "\n".join(failures)
    src = {name: k.get_kernel_source() for name, k in zip(kernels, built)}
    # CUDA's max()/min() on floats are fmaxf/fminf, which return the other operand for a NaN: no value may
    # pass through them (integer index clamps may).
    for name in ("elementwise", "gemm_relu"):
        stores = [ln for ln in src[name].splitlines() if ("out" in ln or "C_f" in ln) and "=" in ln]
        assert stores and not [ln for ln in stores if "max(" in ln or "min(" in ln], (name, stores)
    assert src["elementwise"].count("!=") >= 2  # maximum/minimum test their operand for NaN (x != x)
    for name in ("amax_multi_tile", "amin_rows4"):  # the row's NaN flag picks a NaN result
        assert "CUDART_NAN_F" in src[name], name
    assert "!=" in src["max_pool"]  # a NaN tap wins the window (isnan prints as x != x)
    assert "nearbyint" in src["elementwise"] and "roundf(" not in src["elementwise"]  # halves to even, as torch.round


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_layer_norm_overflow_is_nan_in_cuda_kernels():
    """A layer_norm row whose M2 (or mean) overflows float32 comes out NaN on CUDA as on ``c`` (issue 15; the ``c``
    case is tests/test_fuzz_found.py): the row's 1 / std is a select between ``rsqrtf`` and NaN, computed once per
    row (before: ``rsqrtf(inf) = 0`` per element, a silent 0)."""
    target = {"kind": "cuda", "arch": "sm_90a"}
    kernels = {
        "one_tile_rows4": (reduction.row_reduction((33, 37), "layer_norm", has_weight=True, has_bias=True, block_rows=4,
                                                   block_N=64, threads=128, target=target), [-1]),
        "multi_tile": (reduction.row_reduction((64, 5000), "layer_norm", x_dtype="float16", block_N=2048, threads=256,
                                               target=target), [-1]),
    }
    built = compile_many(list(kernels.values()), target, return_exceptions=True)
    failures = [f"{name}: {type(k).__name__}: {str(k).strip().splitlines()[-1][:300]}"
                for name, k in zip(kernels, built) if isinstance(k, BaseException)]
    assert not failures, "\n".join(failures)
    for name, k in zip(kernels, built):
        src = k.get_kernel_source()
        assert "< CUDART_INF_F" in src and "CUDART_NAN_F" in src, name  # M2 < inf (false for NaN) or NaN
        assert src.count("rsqrtf(") == 1, name  # once per row, not per element


def test_integer_division_by_a_tensor_raises_as_torch_does(rng):
    """Integer floor/trunc division and remainder by a tensor run through torch: a zero divisor raises torch's
    ZeroDivisionError (a kernel's C division trapped: SIGFPE killed the process). A constant divisor without zeros
    stays in the kernel."""
    from tilefuse.backend import make_backend
    from tilefuse.config import Options, parse_target

    x = torch.randint(-50, 50, (64,), generator=rng, dtype=torch.int32)
    y = torch.randint(1, 4, (64,), generator=rng, dtype=torch.int32) * (1 - 2 * (torch.arange(64) % 2)).int()
    for fn in (lambda a, b: a // b + 1, lambda a, b: torch.remainder(a, b) * 2, lambda a, b: torch.fmod(a, b) - 1,
               lambda a, b: torch.div(a, b, rounding_mode="trunc") + a):
        torch._dynamo.reset()
        backend = make_backend(Options(target=parse_target("c")))
        compiled = torch.compile(fn, backend=backend)
        assert torch.equal(compiled(x, y), fn(x, y))
        zeros = y.clone()
        zeros[5] = 0
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(x, zeros)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            compiled(x, zeros)
    torch._dynamo.reset()
    runners = []
    backend = make_backend(Options(target=parse_target("c"), observer=runners.append))
    out = torch.compile(lambda a: a // 3 + 1, backend=backend)(x)
    assert torch.equal(out, x // 3 + 1)
    assert [r.backend for r in runners[0].plan.regions] == ["tilelang"]
    torch._dynamo.reset()

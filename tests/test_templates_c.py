"""Kernel templates on the ``c`` target (CPU) against their torch references, every element checked.

The C target stores fp32 and fp16 (bf16 is refused: TileLang's C codegen has no bfloat16 type);
everything computes in fp32. Shapes are small and odd so that every tail path runs.
"""

import pytest
import torch

from tilefuse.lowering import expr as E
from tilefuse.lowering import index as ix
from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.expr import Acc, Arg, Coord, Load, call
from tilefuse.lowering.templates import conv, elementwise, gemm, pool, reduction

C = {"kind": "c"}
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float16: {"rtol": 1e-2, "atol": 1e-2}}


def randn(rng, shape, dtype=torch.float32):
    return torch.randn(shape, generator=rng).to(dtype)


def dt(name):
    return getattr(torch, name)


# ---- expressions -----------------------------------------------------------------------------

def test_expr_is_data_with_stable_text():
    e = call("gelu", Acc() + Arg(0), approximate="tanh")
    assert str(e) == "gelu(add(acc, arg0), approximate='tanh')"
    assert e == call("gelu", Acc() + Arg(0), approximate="tanh") and hash(e) == hash(call("gelu", Acc() + Arg(0),
                                                                                           approximate="tanh"))
    assert str(call("clamp", Acc(), max=1.0, min=-1.0)) == "clamp(acc, max=1.0, min=-1.0)"
    assert str(E.Const(2, "float16") * Acc()) == "mul(2:float16, acc)"
    assert E.args_used(e) == {0} and E.ops_used(e) == {"add", "gelu"}
    required = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "neg", "abs", "reciprocal", "relu", "gelu",
                "silu", "sigmoid", "tanh", "erf", "exp", "log", "sqrt", "rsqrt", "clamp", "where", "eq", "ne", "lt",
                "le", "gt", "ge", "cast", "leaky_relu", "softplus", "sin", "cos"}
    assert required <= E.ops_supported()
    assert E.is_lowerable(e) and not E.is_lowerable(call("asin", Acc()))


# One expression per supported op, over inputs in its domain: x ~ N(0, 1) (acc), y ~ N(0, 1) (arg1).
_X, _Y, _POS = Acc(), Arg(1), call("abs", Acc()) + 0.25
OP_CASES = {
    "add": _X + _Y, "sub": _X - _Y, "mul": _X * _Y, "div": _X / (call("abs", _Y) + 0.5), "pow": call("pow", _POS, _Y),
    "maximum": call("maximum", _X, _Y), "minimum": call("minimum", _X, _Y), "neg": -_X, "abs": call("abs", _X),
    "reciprocal": call("reciprocal", _POS), "relu": call("relu", _X), "gelu": call("gelu", _X),
    "silu": call("silu", _X), "sigmoid": call("sigmoid", _X), "tanh": call("tanh", _X), "erf": call("erf", _X),
    "erfinv": call("erfinv", call("tanh", _X)),
    "exp": call("exp", _X), "log": call("log", _POS), "sqrt": call("sqrt", _POS), "rsqrt": call("rsqrt", _POS),
    "clamp": call("clamp", _X, min=-0.5, max=0.7), "where": call("where", call("gt", _X, _Y), _X, _Y * 2.0),
    "eq": call("eq", call("floor", _X * 2.0), call("floor", _Y * 2.0)), "ne": call("ne", call("floor", _X), 0.0),
    "lt": call("lt", _X, _Y), "le": call("le", _X, 0.0), "gt": call("gt", _X, _Y), "ge": call("ge", _Y, 0.0),
    "cast": call("cast", _X * 3.0, dtype="float16") - _X * 3.0, "leaky_relu": call("leaky_relu", _X, alpha=0.2),
    "softplus": call("softplus", _X * 15.0), "sin": call("sin", _X), "cos": call("cos", _X),
    "identity": call("identity", _X), "scale": call("scale", _X, factor=0.125), "elu": call("elu", _X, alpha=0.5),
    "hardsigmoid": call("hardsigmoid", _X * 4.0), "hardswish": call("hardswish", _X * 4.0),
    "mish": call("mish", _X), "softsign": call("softsign", _X), "tan": call("tan", _X * 0.5),
    "floor": call("floor", _X * 3.0), "ceil": call("ceil", _X * 3.0), "sign": call("sign", _X),
    "round": call("round", _X * 2.0 + 0.5),
    "isnan": call("isnan", call("log", _X)), "logical_not": call("logical_not", call("gt", _X, 0.0)),
    "logical_and": call("logical_and", call("gt", _X, 0.0), call("gt", _Y, 0.0)),
    "logical_or": call("logical_or", call("gt", _X, 0.0), call("gt", _Y, 0.0)),
    "logical_xor": call("logical_xor", call("gt", _X, 0.0), call("gt", _Y, 0.0)),
    "bitwise_and": call("bitwise_and", call("gt", _X, 0.0), call("gt", _Y, 0.0)),
    "bitwise_or": call("bitwise_or", call("gt", _X, 0.0), call("gt", _Y, 0.0)),
    "bitwise_xor": call("bitwise_xor", call("gt", _X, 0.0), call("gt", _Y, 0.0)),
    "bitwise_not": call("bitwise_not", call("gt", _X, 0.0)),
    "floor_divide": call("floor_divide", _X * 4.0, call("abs", _Y) + 0.5),
    "remainder": call("remainder", _X * 4.0, _Y + call("sign", _Y) * 0.5),
    "masked_fill": call("masked_fill", _X, call("gt", _Y, 0.0), value=-2.5),
}


def test_every_supported_op_in_one_elementwise_kernel(rng):
    assert set(OP_CASES) == set(E.ops_supported()), "add a case for each new emitter"
    names = sorted(OP_CASES)
    exprs = [OP_CASES[n] for n in names]
    shape = (3, 67)
    f = elementwise.elementwise([shape, shape], ["float32", "float32"], exprs, ["float32"] * len(exprs), target=C)
    kernel = compile_kernel(f, C, out_idx=list(range(2, 2 + len(exprs))))
    x, y = randn(rng, shape), randn(rng, shape)
    outs = kernel(x, y)
    refs = elementwise.reference([x, y], exprs, ["float32"] * len(exprs))
    for name, out, ref in zip(names, outs, refs):
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=2e-6, msg=lambda m, name=name: f"op {name}: {m}")


# ---- elementwise ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_elementwise_broadcast_several_outputs(rng, dtype):
    shapes = [(3, 1, 37), (5, 1), (37,)]
    exprs = [call("gelu", Acc() + Arg(2), approximate="tanh") * Arg(1),
             call("where", call("gt", Acc(), Arg(1)), Acc(), Arg(2)),
             call("cast", Acc(), dtype="float16") + Arg(1)]
    out_dtypes = [dtype, "float32", dtype]
    f = elementwise.elementwise(shapes, [dtype, "float32", dtype], exprs, out_dtypes, block=64, target=C)
    kernel = compile_kernel(f, C, out_idx=[-3, -2, -1])
    ins = [randn(rng, s, dt(d)) for s, d in zip(shapes, [dtype, "float32", dtype])]
    for out, ref in zip(kernel(*ins), elementwise.reference(ins, exprs, out_dtypes)):
        assert out.shape == (3, 5, 37) and out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, **TOL[ref.dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_elementwise_indexed_loads_and_shapes(rng, dtype):
    """Outputs of different shapes, each reading inputs at computed indices; bools travel as int8."""
    i0, i1, i2 = Coord(0), Coord(1), Coord(2)
    shapes, dtypes = [(3, 5), (5,), (2, 4), (7, 4)], [dtype, dtype, "int64", dtype]
    ids = ix.wrap_clamp(Load(2, (i0, i1)), 7)
    exprs = [Load(0, (i1, i0)),  # (5, 3): a transpose
             Arg(0) + Arg(1),  # (3, 5): plain broadcast, read flat
             Load(3, (ids, i2)) * Load(1, (ix.mod(i2, 5),)),  # (2, 4, 4): rows gathered by signed ids
             call("gt", Load(0, (i0, ix.sub(ix.lit(4), i1))), 0.0)]  # (3, 5): flipped, compared: bool
    out_shapes, out_dtypes = [(5, 3), (3, 5), (2, 4, 4), (3, 5)], [dtype, "float32", dtype, "bool"]
    f = elementwise.elementwise(shapes, dtypes, exprs, out_dtypes, out_shapes=out_shapes, block=8, target=C)
    kernel = compile_kernel(f, C, out_idx=[-4, -3, -2, -1])
    ins = [randn(rng, (3, 5), dt(dtype)), randn(rng, (5,), dt(dtype)),
           torch.randint(-7, 7, (2, 4), generator=rng), randn(rng, (7, 4), dt(dtype))]
    outs = kernel(*[elementwise.as_storage(t) for t in ins])
    for out, ref, d in zip(outs, elementwise.reference(ins, exprs, out_dtypes, out_shapes=out_shapes), out_dtypes):
        out = elementwise.from_storage(out, d)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, **TOL.get(ref.dtype, {"rtol": 0, "atol": 0}))


def test_elementwise_bool_inputs_travel_as_int8(rng):
    m, x = torch.rand(4, 9, generator=rng) > 0.5, randn(rng, (4, 9))
    exprs = [call("where", Acc(), Arg(1), -Arg(1)), call("logical_not", Acc())]
    f = elementwise.elementwise([(4, 9), (4, 9)], ["bool", "float32"], exprs, ["float32", "bool"], target=C)
    got = compile_kernel(f, C, out_idx=[-2, -1])(elementwise.as_storage(m), x)
    want = elementwise.reference([m, x], exprs, ["float32", "bool"])
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(elementwise.from_storage(got[1], "bool"), want[1])


def test_zero_dim_operands_and_outputs(rng):
    x, s, t = randn(rng, (5, 3)), randn(rng, ()), randn(rng, ())
    f = elementwise.elementwise([(5, 3), ()], ["float32"] * 2, [Acc() * Arg(1)], ["float32"], target=C)
    torch.testing.assert_close(compile_kernel(f, C, out_idx=[-1])(x, s), x * s)
    f = elementwise.elementwise([(), ()], ["float32"] * 2, [call("maximum", Acc(), Arg(1))], ["float32"], target=C)
    out = compile_kernel(f, C, out_idx=[-1])(s, t)  # TileLang allocates no 0-d outputs: shape (1,)
    assert out.shape == (1,) and out[0] == torch.maximum(s, t)
    v = randn(rng, (37,))
    out = compile_kernel(reduction.row_reduction((37,), "sum", block_N=16, target=C), C, out_idx=[-1])(v)
    torch.testing.assert_close(out, v.sum().reshape(1))


def test_bfloat16_is_refused_on_c_with_advice():
    with pytest.raises(NotImplementedError, match="bfloat16"):
        elementwise.elementwise([(4,)], ["bfloat16"], [Acc()], ["bfloat16"], target=C)


# ---- GEMM ---------------------------------------------------------------------------------------

GEMM_CASES = {
    "odd_relu": {"M": 37, "N": 45, "K": 29, "epilogue": call("relu", Acc())},
    "linear_bias_gelu": {"M": 37, "N": 45, "K": 29, "trans_B": True, "extras": [(45,)],
                         "epilogue": call("gelu", Acc() + Arg(0), approximate="tanh")},
    "transA_residual": {"M": 40, "N": 33, "K": 70, "trans_A": True, "epilogue": Acc() + Arg(0), "extras": [(40, 33)]},
    "batched_broadcast": {"M": 19, "N": 21, "K": 23, "batch_A": (2, 3), "batch_B": (3,),
                          "epilogue": Acc() * Arg(0) + Arg(1), "extras": [(3, 1, 21), (19, 21)]},
    "prologue_scale": {"M": 33, "N": 17, "K": 50, "batch_B": (2,), "prologue": call("scale", Acc(), factor=0.5),
                       "epilogue": call("silu", Acc())},
    # A cast to fp16 in the epilogue may round the other way than the reference: fp16 tolerance.
    "fp16_cast_out": {"M": 37, "N": 45, "K": 29, "A_dtype": "float16", "out_dtype": "float32", "trans_B": True,
                      "epilogue": call("cast", Acc(), dtype="float16") + Arg(0), "extras": [(45,)], "tol": 1e-2},
    # fp16 output (B's dtype): rounding may differ from the float64 reference's by one fp16 ulp.
    "fp32_A_fp16_B": {"M": 21, "N": 30, "K": 40, "A_dtype": "float32", "B_dtype": "float16", "tol": 1e-2},
}


@pytest.mark.parametrize("blocks", [(32, 32, 32), (16, 64, 8)])
@pytest.mark.parametrize("name", sorted(GEMM_CASES))
def test_gemm(rng, name, blocks):
    case = dict(GEMM_CASES[name])
    M, N, K, tol = case.pop("M"), case.pop("N"), case.pop("K"), case.pop("tol", 1e-4)
    extras = [randn(rng, s) for s in case.pop("extras", [])]
    a_dt = case.setdefault("A_dtype", "float32")
    b_dt = case.get("B_dtype") or a_dt
    ta, tb = case.get("trans_A", False), case.get("trans_B", False)
    A = randn(rng, (*case.get("batch_A", ()), *((K, M) if ta else (M, K))), dt(a_dt))
    B = randn(rng, (*case.get("batch_B", ()), *((N, K) if tb else (K, N))), dt(b_dt))
    bm, bn, bk = blocks
    f = gemm.gemm(M, N, K, **case, extra_shapes=[e.shape for e in extras], extra_dtypes=["float32"] * len(extras),
                  block_M=bm, block_N=bn, block_K=bk, target=C)
    out = compile_kernel(f, C, out_idx=[-1])(A, B, *extras)
    ref = gemm.reference(A, B, extras, trans_A=ta, trans_B=tb, prologue=case.get("prologue"),
                         epilogue=case.get("epilogue"), out_dtype=case.get("out_dtype"))
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


def test_gemm_configs_have_exactly_the_factory_tunables():
    import inspect

    params = set(inspect.signature(gemm.gemm).parameters)
    for target in (C, {"kind": "cuda", "arch": "sm_90a"}, {"kind": "cuda", "arch": "sm_80"}):
        for cfg in gemm.get_configs(target):
            assert set(cfg) <= params


# ---- row reductions ------------------------------------------------------------------------------

@pytest.mark.parametrize("block_N", [64, 16])  # one column tile, and several tiles with a tail
@pytest.mark.parametrize("kind", reduction.KINDS)
def test_row_reduction_kinds(rng, kind, block_N):
    shape = (3, 5, 37)
    weight = kind in ("layer_norm", "rms_norm")
    f = reduction.row_reduction(shape, kind, has_weight=weight, has_bias=kind == "layer_norm", block_rows=2,
                                block_N=block_N, target=C)
    x = randn(rng, shape) + 3.0  # an offset mean exercises the variance merge
    w, b = (randn(rng, (37,)), randn(rng, (37,))) if weight else (None, None)
    out = compile_kernel(f, C, out_idx=[-1])(x, *([w] if weight else []), *([b] if kind == "layer_norm" else []))
    ref, _ = reduction.reference(x, kind, weight=w, bias=b if kind == "layer_norm" else None)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_residual_layer_norm_writes_pre_norm_sum(rng, dtype):
    shape, cols = (2, 7, 45), 45
    producer, consumer = Acc() + Arg(0), call("relu", Acc()) * Arg(1)
    f = reduction.row_reduction(shape, "layer_norm", x_dtype=dtype, has_weight=True, has_bias=True,
                                producer=producer, consumer=consumer, extra_shapes=[shape, (cols,)],
                                extra_dtypes=[dtype, "float32"], write_pre=True, block_rows=4, block_N=32, target=C)
    x, res, scale = randn(rng, shape, dt(dtype)), randn(rng, shape, dt(dtype)), randn(rng, (cols,))
    w, b = randn(rng, (cols,), dt(dtype)), randn(rng, (cols,), dt(dtype))
    out, pre = compile_kernel(f, C, out_idx=[-2, -1])(x, w, b, res, scale)
    ref, ref_pre = reduction.reference(x, "layer_norm", weight=w, bias=b, extras=[res, scale], producer=producer,
                                       consumer=consumer)
    torch.testing.assert_close(pre, ref_pre, **TOL[dt(dtype)])
    torch.testing.assert_close(out, ref, **TOL[dt(dtype)])


@pytest.mark.parametrize("kind,keepdim", [("mean", True), ("sum", False), ("var", False)])
def test_row_reduction_consumer_and_keepdim(rng, kind, keepdim):
    shape = (4, 3, 50)
    consumer = call("sqrt", call("abs", Acc())) + Arg(0)
    out_shape = reduction.output_shape(shape, kind, keepdim)
    f = reduction.row_reduction(shape, kind, keepdim=keepdim, consumer=consumer, extra_shapes=[out_shape[-1:]],
                                extra_dtypes=["float32"], correction=0 if kind == "var" else 1, block_N=32, target=C)
    x, e = randn(rng, shape), randn(rng, out_shape[-1:])
    out = compile_kernel(f, C, out_idx=[-1])(x, e)
    ref, _ = reduction.reference(x, kind, extras=[e], consumer=consumer, keepdim=keepdim,
                                 correction=0 if kind == "var" else 1)
    assert out.shape == ref.shape == out_shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rms_norm_fp16_weight(rng):
    shape = (9, 130)
    f = reduction.row_reduction(shape, "rms_norm", x_dtype="float16", has_weight=True, eps=1e-6, block_N=64, target=C)
    x, w = randn(rng, shape, torch.float16), randn(rng, (130,), torch.float16)
    out = compile_kernel(f, C, out_idx=[-1])(x, w)
    torch.testing.assert_close(out, reduction.reference(x, "rms_norm", weight=w, eps=1e-6)[0], rtol=1e-2, atol=1e-2)


# ---- pooling --------------------------------------------------------------------------------------

POOL_CASES = {
    "max_pad_stride": ("max", {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
    "max_dilated_ceil": ("max", {"kernel": (3, 2), "stride": (2, 3), "padding": (1, 1), "dilation": (2, 1),
                                 "ceil_mode": True}),
    "avg_ceil_exclude_pad": ("avg", {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1), "ceil_mode": True,
                                     "count_include_pad": False}),
    "avg_include_pad": ("avg", {"kernel": (2, 4), "stride": (2, 2), "padding": (1, 2)}),
    "adaptive": ("adaptive_avg", {"output_size": (3, 4)}),
    "global": ("adaptive_avg", {"output_size": (1, 1)}),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("name", sorted(POOL_CASES))
def test_pool2d(rng, name, channels_last):
    kind, geometry = POOL_CASES[name]
    shape, vec = ((2, 10, 11, 3), (3,)) if channels_last else ((2, 3, 10, 11), (3, 1, 1))
    producer, consumer = call("relu", Acc() + Arg(0)), Acc() * Arg(1)
    f = pool.pool2d(shape, kind, **geometry, producer=producer, consumer=consumer, extra_shapes=[vec, ()],
                    extra_dtypes=["float32", "float32"], write_pre=True, channels_last=channels_last, block=16,
                    target=C)
    x, b, s = randn(rng, shape), randn(rng, vec), randn(rng, ())
    out, pre = compile_kernel(f, C, out_idx=[-2, -1])(x, b, s)
    ref = pool.reference(x, kind, **geometry, extras=[b, s], producer=producer, consumer=consumer,
                         channels_last=channels_last)
    assert out.shape == pool.output_shape(shape, kind, channels_last=channels_last,
                                          **{k: v for k, v in geometry.items() if k != "count_include_pad"})
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pre, torch.relu(x + b))


# ---- conv2d ---------------------------------------------------------------------------------------

CONV_CASES = {
    "3x3_pad1_bias_relu": {"x": (2, 3, 9, 11), "w": (5, 3, 3, 3), "stride": (1, 1), "padding": (1, 1),
                           "dilation": (1, 1), "epilogue": call("relu", Acc() + Arg(0)), "extras": [(5, 1, 1)]},
    "stride2_dilation2": {"x": (1, 4, 13, 10), "w": (6, 4, 3, 2), "stride": (2, 2), "padding": (2, 1),
                          "dilation": (2, 2)},
    "nhwc_bias": {"x": (2, 7, 6, 5), "w": (4, 3, 2, 5), "stride": (1, 2), "padding": (1, 0), "dilation": (1, 1),
                  "layout": "NHWC", "epilogue": Acc() + Arg(0), "extras": [(4,)]},
    "1x1": {"x": (2, 16, 5, 5), "w": (8, 16, 1, 1), "stride": (1, 1), "padding": (0, 0), "dilation": (1, 1),
            "epilogue": Acc() + Arg(0), "extras": [(2, 8, 5, 5)]},
    # channels-last activations with the model's OIHW weight (planner.layout's convolutions)
    "nhwc_oihw": {"x": (2, 9, 7, 6), "w": (5, 6, 3, 2), "stride": (2, 1), "padding": (1, 1), "dilation": (1, 2),
                  "layout": "NHWC", "weight_layout": "OIHW", "epilogue": call("relu", Acc() + Arg(0)),
                  "extras": [(5,)]},
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv2d(rng, name):
    case = dict(CONV_CASES[name])
    xs, ws = case.pop("x"), case.pop("w")
    extras = [randn(rng, s) for s in case.pop("extras", [])]
    f = conv.conv2d(xs, ws, **case, in_dtype="float32", extra_shapes=[e.shape for e in extras],
                    extra_dtypes=["float32"] * len(extras), block_M=32, block_N=16, block_K=16, target=C)
    x, w = randn(rng, xs), randn(rng, ws)
    out = compile_kernel(f, C, out_idx=[-1])(x, w, *extras)
    ref = conv.reference(x, w, extras, stride=case["stride"], padding=case["padding"], dilation=case["dilation"],
                         layout=case.get("layout", "NCHW"), weight_layout=case.get("weight_layout"),
                         epilogue=case.get("epilogue"))
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


# ---- source-only targets ----------------------------------------------------------------------------

@pytest.mark.parametrize("target,marker", [({"kind": "hip", "mcpu": "gfx942"}, "__global__"),
                                           ({"kind": "metal"}, "kernel")])
def test_source_only_targets(target, marker):
    f = elementwise.elementwise([(100,), (100,)], ["float16", "float16"], [call("silu", Acc()) * Arg(1)], ["float16"],
                                block=64, threads=64, target=target)
    assert marker in kernel_source(f, target)
    with pytest.raises(NotImplementedError, match="kernel_source"):
        compile_kernel(f, target, out_idx=[-1])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_floor_divide_is_torchs_at_the_edges(dtype):
    """torch's floor division: exact where a / b rounds up to an integer (1 // 0.1 is 9), NaN for an infinite
    dividend, -1 for a negative finite one over +inf, a zero divisor's IEEE quotient, signed zeros."""
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([1.0, inf, -inf, -2.0, -2.0, 2.0, 0.0, -0.0, 5.0, -5.0, 0.0, nan, 7.0, 1e30, -7.5, 3.0, 0.3])
    b = torch.tensor([0.1, 2.0, 3.0, inf, -inf, -inf, 0.0, 1.0, 0.0, 0.0, -3.0, 1.0, nan, 3.0, 2.0, -0.0, -0.1])
    a, b = a.to(dt(dtype)), b.to(dt(dtype))
    f = elementwise.elementwise([(17,), (17,)], [dtype, dtype], [call("floor_divide", Acc(), Arg(1))], [dtype],
                                target=C)
    out, ref = compile_kernel(f, C, out_idx=[-1])(a, b), torch.floor_divide(a, b)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    real = ~ref.isnan()
    assert torch.equal(torch.signbit(out[real]), torch.signbit(ref[real]))

"""fx frontend: ATen-level fx graphs (make_fx) -> registry ops, numerics against the traced function."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tilefuse
from tilefuse import ops
from tilefuse.frontends import fx as fxf
from tilefuse.frontends.aten_table import CONVERTERS, GENERATORS
from tilefuse.frontends.fx import FxImportError, import_fx, import_fx_program
from tilefuse.frontends.fx_context import scalar_dtype
from tilefuse.ir import TensorType
from tilefuse.ops.fallback import decode_arg, encode_arg, flatten_outputs, resolve_op
from tilefuse.ops.reference import run_graph

aten = torch.ops.aten


def randn(g, *shape, dtype=torch.float32):
    return torch.randn(shape, generator=g).to(dtype)


# Half-precision outputs may differ from eager by one rounding (2**-10 relative for fp16, 2**-7 for bf16): a Python
# scalar meeting a 0-d fp16 tensor becomes an fp16 constant in the graph (it must not promote the result), where
# eager keeps it in float for the multiply; ``z * 0.3 + 1`` then lands one ulp apart for some z.
HALF_RTOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def imported(f, *args, mode="fake", rtol=1e-5, atol=1e-5):
    """Trace ``f`` to ATen, import it, run the graph and check every output element against ``f``."""
    gm = make_fx(f, tracing_mode=mode)(*args)
    program = import_fx_program(gm, args)
    results = run_graph(program.graph, *program.graph_inputs(args))
    got, want = program.fx_outputs(args, results), f(*args)
    got, want = (got, want) if isinstance(want, (tuple, list)) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        r = max(rtol, HALF_RTOL.get(w.dtype, 0.0)) if isinstance(w, torch.Tensor) else rtol
        torch.testing.assert_close(g, w, rtol=r, atol=atol)
    return program


def ops_of(program) -> set[str]:
    return set(program.graph.op_counts())


# ---- the acceptance examples ---------------------------------------------------------------------

def test_linear_gelu_becomes_linear_and_gelu(rng):
    x, w, b = randn(rng, 4, 7, 16), randn(rng, 32, 16), randn(rng, 32)
    p = imported(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)
    assert ops_of(p) <= {"linear", "gelu", "reshape"} and "linear" in ops_of(p) and "gelu" in ops_of(p)
    assert p.fallback_ops == ()


def test_import_fx_returns_graph_with_tensor_inputs(rng):
    x, w = randn(rng, 3, 8), randn(rng, 5, 8)
    g = import_fx(make_fx(lambda x, w: torch.tanh(x @ w.t()))(x, w), (x, w))
    assert [v.type for v in g.inputs] == [TensorType((3, 8), "float32"), TensorType((5, 8), "float32")]
    assert g.op_counts() == {"linear": 1, "tanh": 1}


def test_unknown_op_becomes_torch_fallback_logged_once(rng, caplog):
    fxf._WARNED.discard("aten::logcumsumexp.default")
    x = randn(rng, 4, 6)
    with caplog.at_level(logging.WARNING, logger="tilefuse"):
        p = imported(lambda x: torch.logcumsumexp(x, 0) + torch.logcumsumexp(x * 2, 1), x)
        imported(lambda x: torch.logcumsumexp(x, 1), x)
    assert p.graph.op_counts()["torch_fallback"] == 2
    assert p.fallback_ops == ("aten::logcumsumexp.default",)
    assert [r.getMessage() for r in caplog.records].count(next(r.getMessage() for r in caplog.records)) == 1
    assert sum("aten::logcumsumexp.default" in r.getMessage() for r in caplog.records) == 1
    (node,) = [n for n in p.graph.nodes if n.op == "torch_fallback"][:1]
    assert node.attr["target"] == "aten::logcumsumexp.default"
    hash(node.attrs)  # attributes stay hashable


def test_multi_output_fallback(rng):
    x = randn(rng, 3, 9)
    p = imported(lambda x: (torch.sort(x, -1)[0] * 2, torch.sort(x, -1)[1], torch.cummax(x, 1)), x)
    assert set(p.fallback_ops) == {"aten::sort.default", "aten::cummax.default"}


def test_fallback_type_inference_by_meta_through_the_registry():
    attrs = {"target": "aten::sort.default", "args": (("tensor", 0), -1), "kwargs": ()}
    out = ops.infer_types("torch_fallback", [TensorType((3, 9), "float16")], attrs)
    assert out == [TensorType((3, 9), "float16"), TensorType((3, 9), "int64")]


def test_fallback_argument_encoding_round_trips():
    t = torch.ones(2)
    args = [t, [t, None], 3, 2.5, True, "tanh", torch.float16, torch.device("cpu"), torch.strided,
            torch.contiguous_format, None]
    enc = [encode_arg(a, lambda x: 0 if x is t else None) for a in args]
    hash(tuple(enc))
    dec = [decode_arg(e, [t], None) for e in enc]
    assert dec[0] is t and dec[1][0] is t and dec[1][1] is None and dec[2:] == [3, 2.5, True, "tanh", torch.float16,
                                                                             torch.device("cpu"), torch.strided,
                                                                             torch.contiguous_format, None]
    assert resolve_op("aten::add.Tensor") is aten.add.Tensor and resolve_op("aten::relu") is aten.relu.default
    assert [x.shape for x in flatten_outputs((t, [t, t], None, 3))] == [(2,), (2,), (2,), (0,), ()]


def test_failing_converter_falls_back_to_torch(rng, monkeypatch):
    monkeypatch.setitem(CONVERTERS, aten.tanh.default, lambda cx, a: cx.op("sum", a["self"]))  # wrong shape
    x = randn(rng, 4, 5)
    p = imported(lambda x: torch.tanh(x) + 1, x)
    assert p.fallback_ops == ("aten::tanh.default",)


# ---- scalars and type promotion ------------------------------------------------------------------

def test_python_scalars_keep_torch_type_promotion(rng):
    x, h = randn(rng, 4, 4), randn(rng, 4, 4, dtype=torch.float16)
    i = torch.randint(-5, 5, (6,), generator=rng)
    zero_d = randn(rng, dtype=torch.float16)

    def f(x, h, i, z):
        return x * 0.5 + 1, 2 - x, h * 0.1 + 3, h / 7, i * 0.5, i + 1, i // 2, (i > 0) & (i < 3), z * 0.3 + 1, \
            x ** 2, 2 ** x, torch.where(x > 0, x, 0.0), torch.where(h > 0, 1.0, -1.0)

    p = imported(f, x, h, i, zero_d)
    assert p.fallback_ops == ()
    out = p.fx_outputs((x, h, i, zero_d), run_graph(p.graph, x, h, i, zero_d))
    assert [o.dtype for o in out] == [o.dtype for o in f(x, h, i, zero_d)]


def test_scalar_dtype_rule():
    assert scalar_dtype(0.5, TensorType((3,), "float16")) == torch.float32  # loses to a tensor with dims
    assert scalar_dtype(0.5, TensorType((), "float16")) == torch.float16  # a 0-d tensor: must match it
    assert scalar_dtype(0.5, TensorType((3,), "int64")) == torch.float32
    assert scalar_dtype(2, TensorType((), "int32")) == torch.int32
    assert scalar_dtype(True, None) == torch.bool


# ---- coverage of the table -----------------------------------------------------------------------

def test_views_and_data_movement(rng):
    x = randn(rng, 2, 3, 8, 6)

    def f(x):
        a = x.view(6, 48).t().reshape(8, 36)
        b = x.permute(0, 2, 1, 3).unsqueeze(1).squeeze(1)
        c = x[:, 1:, ::2, -3:]
        d = x.select(2, -1) + x[:, :, 0]
        e = torch.cat([x, x * 2], dim=-1).split([4, 8], dim=-1)
        return a, b, c, d, e[0], e[1], torch.unbind(x, 1)[2], x[:, None].expand(2, 4, 3, 8, 6), x.flip(1), \
            x.repeat(1, 2, 1, 1), torch.stack([x, x], 2), x.tril(1), F.pad(x, (1, 2, 0, 1), value=0.5), x.chunk(3, 3)

    assert imported(f, x).fallback_ops == ()


def test_roll_is_an_op_and_compiles(rng):
    """``torch.roll`` (Swin's shifted windows): along dims, shifts negative, past the size, 0 and repeated; and of the
    flattened tensor. Imported as ``roll`` (no fallback), then compiled for the c target, every element checked."""
    x, y = randn(rng, 2, 7, 5, 3), randn(rng, 2, 8, 8, 64)

    def f(x, y):
        return torch.roll(x, (-3, 2, 9), (1, 2, 1)) * 2, torch.roll(x, 0, 3), torch.roll(x, -40), \
            torch.roll(x, (1, -1), (-1, -2)).relu(), torch.roll(y, (2, 2), (1, 2)).reshape(2, 64, 64) - 1

    p = imported(f, x, y)
    assert p.fallback_ops == () and "roll" in ops_of(p)
    # every region as its kernel (the measured choice may run small ones through torch): (2, 8, 8, 64) rolled by (2, 2)
    # as floormods was miscompiled by TVM's simplifier into one floormod of the flat index
    compiled = torch.compile(f, backend="tilefuse", options={"target": "c", "measure": False})
    for got, want in zip(compiled(x, y), f(x, y)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_indexing(rng):
    x, i = randn(rng, 4, 3, 8, 6), torch.tensor([1, -1, 2])

    def f(x, i):
        j = i.abs()
        return x[i], x[:, i], x[i, :, i[:, None]], torch.gather(x, 1, (j % 3)[None, :, None, None].expand(4, 3, 8, 6)), \
            x.index_select(2, j), F.embedding(j, x[0, 0])

    assert imported(f, x, i).fallback_ops == ()


def test_reductions_and_norms(rng):
    x, w, b = randn(rng, 2, 3, 8, 6), randn(rng, 6), randn(rng, 6)

    def f(x, w, b):
        return x.sum(), x.sum((1, 2), keepdim=True), x.mean(-1), x.amax(1), x.max(1), x.argmax(), \
            x.argmax(2, keepdim=True), x.var(1), x.std(2, correction=0), torch.var_mean(x, 3), x.softmax(-1), \
            x.log_softmax(1), x.cumsum(2), x.topk(2, -1), x.logsumexp(1), x.prod(1), x.min(), \
            F.layer_norm(x, (6,), w, b), F.layer_norm(x, (8, 6))

    p = imported(f, x, w, b, atol=1e-5, rtol=1e-4)
    assert p.fallback_ops == () and "layer_norm" in ops_of(p)


def test_cumsum_in_the_dtype_asked_for(rng):
    """``cumsum(dtype=)`` sums in that dtype (Mixtral's expert counts: int32 of a bool mask); without it integers
    sum in int64. Overflow wraps as torch's does."""
    x = torch.randint(-3, 4, (4, 9), generator=rng, dtype=torch.int32)
    big = torch.full((3, 5), 2**30, dtype=torch.int32)
    m = x > 0

    def f(x, big, m):
        return x.cumsum(1), x.cumsum(0, dtype=torch.int32), big.cumsum(1, dtype=torch.int32), \
            m.cumsum(1, dtype=torch.int32), m.cumsum(0), x.cumsum(1, dtype=torch.float64)

    p = imported(f, x, big, m)
    assert p.fallback_ops == ()


def test_slice_and_select_scatters_and_fill_with_a_tensor(rng):
    """BEiT's relative-position index and Funnel's pooling write slices of a tensor (``slice_scatter``,
    ``select_scatter``, ``fill.Tensor`` under functionalization): concatenations of the parts, no fallback."""
    x, s1, s2, s3, v = randn(rng, 5, 7, 3), randn(rng, 5, 2, 3), randn(rng, 5, 3), randn(rng, 5, 7, 3), randn(rng)

    def f(x, s1, s2, s3, v):
        return aten.slice_scatter(x, s1, 1, 2, 4), aten.slice_scatter(x, s1, -2, -2), \
            aten.slice_scatter(x, s1, 1, 0, 2), aten.slice_scatter(x, s3, 1), \
            aten.slice_scatter(x, s1[:, :0], 1, 3, 3), \
            aten.select_scatter(x, s2, 1, 0), aten.select_scatter(x, s2, 1, -1), aten.select_scatter(x, s2, 1, 3), \
            aten.fill(x, v), aten.fill(x.to(torch.int64), v)

    p = imported(f, x, s1, s2, s3, v)
    assert p.fallback_ops == () and "concat" in ops_of(p)
    strided = imported(lambda x, s: aten.slice_scatter(x, s, 1, 0, 7, 3), x, s3[:, ::3])
    assert strided.fallback_ops != ()  # (a step: through torch)


def test_reflection_and_replication_pads_are_pads(rng):
    """``F.pad``'s reflect and replicate modes (``Conv1d(padding_mode="reflect")``, HiFi-GAN's vocoder) in 1, 2 and 3
    dims: the ``pad`` op with its mode, each output against torch (the import checks it), no fallback."""
    x1, x2, x3 = randn(rng, 2, 3, 7), randn(rng, 2, 3, 5, 6), randn(rng, 1, 2, 4, 5, 3)

    def f(x1, x2, x3):
        return F.pad(x1, (3, 6), mode="reflect"), F.pad(x2, (1, 2, 4, 0), mode="reflect"), \
            F.pad(x3, (2, 1, 0, 3, 1, 1), mode="reflect"), F.pad(x1, (0, 9), mode="replicate"), \
            F.pad(x2, (3, 1, 2, 2), mode="replicate"), F.pad(x3, (1, 1, 1, 1, 1, 1), mode="replicate")

    p = imported(f, x1, x2, x3)
    assert p.fallback_ops == () and "pad" in ops_of(p)
    torch._dynamo.reset()  # and as kernels (lowering.index's pad rule reads the reflected or clamped place)
    runners = []
    got = tilefuse.compile(f, target="c", measure=False, observer=runners.append)(x1, x2, x3)
    for g, w in zip(got, f(x1, x2, x3)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert all(r.backend == "tilelang" for r in runners[0].plan.regions if r.kind != "view")
    torch._dynamo.reset()


def test_slice_and_select_backward_are_pads(rng):
    g1, g2, g3 = randn(rng, 5, 5, 3), randn(rng, 5, 7, 2), randn(rng, 5, 3)

    def f(g1, g2, g3):
        return aten.slice_backward(g1, [5, 7, 3], 1, 2, 2**63 - 1, 1), aten.slice_backward(g2, [5, 7, 3], -1, -2, 3, 1), \
            aten.select_backward(g3, [5, 7, 3], 1, -2), aten.slice_backward(g1, [5, 9, 3], 1, 1, 6, 1)

    p = imported(f, g1, g2, g3)
    assert p.fallback_ops == () and "pad" in ops_of(p)


def test_weight_norm(rng):
    """``torch.nn.utils.weight_norm``'s op (wav2vec2's positional convolution): the weight and the norms, along the
    first dim and the last (torch's fused op takes no other)."""
    v, g0, g2 = randn(rng, 6, 4, 5), randn(rng, 6, 1, 1), randn(rng, 1, 1, 5)

    def f(v, g0, g2):
        return aten._weight_norm_interface(v, g0, 0) + aten._weight_norm_interface(v, g2, 2)

    assert imported(f, v, g0, g2).fallback_ops == ()
    # half weights, squares past fp16's range (300**2 summed): computed in float32 (the weights compared; torch's
    # CPU kernel returns the norm in float32 where its trace says float16)
    def weights(v, g0, g2):
        return aten._weight_norm_interface(v, g0, 0)[0], aten._weight_norm_interface(v, g2, 2)[0]

    half = imported(weights, (v * 300).half(), g0.half(), g2.half())
    assert half.fallback_ops == ()


def test_layer_norm_statistics_when_used(rng):
    x, w, b = randn(rng, 3, 5, 16), randn(rng, 16), randn(rng, 16)
    p = imported(lambda x, w, b: aten.native_layer_norm(x, [16], w, b, 1e-5), x, w, b, rtol=1e-4)
    assert p.fallback_ops == () and {"layer_norm", "mean", "rsqrt"} <= ops_of(p)


def test_pointwise_activations(rng):
    x, y = randn(rng, 8, 6), randn(rng, 8, 6)

    def f(x, y):
        return torch.div(x, y, rounding_mode="trunc"), torch.div(x, y, rounding_mode="floor"), x.abs() ** y, \
            x.masked_fill(x < 0, -1e9), x.clamp(-0.5, 0.5), x.clamp(min=y), F.relu6(x), F.leaky_relu(x, 0.2), \
            F.elu(x), F.silu(x), F.gelu(x, approximate="tanh"), F.hardswish(x), F.hardsigmoid(x), F.softplus(x), \
            F.mish(x), x.sigmoid(), x.exp(), x.abs().rsqrt(), x.erf(), x.round(), x.sign(), torch.atan2(x, y), \
            torch.maximum(x, y), x.to(torch.float16), (x > 0).float()

    assert imported(f, x, y).fallback_ops == ()


def test_generators_become_constants(rng):
    x = randn(rng, 2, 6)
    p = imported(lambda x: x + torch.arange(6) * 0.5 + torch.full((2, 6), 7.0) + x.new_ones(6) + torch.zeros_like(x)
                 + torch.tensor(3.0), x)
    assert p.fallback_ops == ()
    assert not ops_of(p) & {"arange", "full"} and p.graph.constants
    assert all(t.device.type == "cpu" for t in p.graph.constants.values())


def test_large_uniform_generators_are_expands_not_constants(rng):
    # HF BERT's SDPA on CUDA made each layer's float mask from zeros_like of a (32, 12, 512, 512) boolean one: as
    # constants, 4.8 GB. A large generator that holds one value becomes an expand of a 0-d constant; the output of
    # one is a fresh tensor (not a view of the constant), and a large arange stays a constant (its elements differ).
    n = fxf.FOLD_NUMEL + 7
    x, mask = randn(rng, 4, n), torch.rand(4, n, generator=rng) > 0.3
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])

    def f(x, mask):
        bias = torch.zeros_like(mask, dtype=x.dtype).masked_fill(mask.logical_not(), float("-inf"))
        return (x + bias + torch.full((4, n), -2.5) * x.new_ones(n), torch.full_like(x, 1.5) * x,
                torch.ones(4, n, dtype=torch.float16), torch.arange(n) * x, torch.full((4, n), True))

    p = import_fx_program(make_fx(f, tracing_mode="fake")(x, mask), (x, mask))
    assert p.fallback_ops == () and "expand" in ops_of(p)
    assert {n: tuple(t.shape) for n, t in p.graph.constants.items() if t.numel() > fxf.FOLD_NUMEL} == {"arange": (n,)}
    out = p.fx_outputs((x, mask), run_graph(p.graph, *p.graph_inputs((x, mask))))
    for got, want in zip(out, f(x, mask), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert out[2].is_contiguous() and out[2].dtype == torch.float16 and out[4].dtype == torch.bool
    out[2].add_(1)  # a returned tensor is the caller's: writing it changes nothing the graph keeps
    again = p.fx_outputs((x, mask), run_graph(p.graph, *p.graph_inputs((x, mask))))
    assert bool((again[2] == 1).all())


def test_gemm_conv_pool(rng):
    a, w, b, c = randn(rng, 3, 5, 8), randn(rng, 6, 8), randn(rng, 6), randn(rng, 2, 6, 6)
    p = imported(lambda a, w, b, c: (F.linear(a, w, b), a @ w.t(), torch.bmm(c, c.transpose(1, 2)),
                                     torch.addmm(b, a[0], w.t(), beta=0.5, alpha=2), torch.baddbmm(c, c, c)),
                 a, w, b, c, rtol=1e-4)
    assert p.fallback_ops == () and {"linear", "matmul"} <= ops_of(p)
    x, cw, cb, rm, rv = randn(rng, 2, 3, 8, 8), randn(rng, 4, 3, 3, 3), randn(rng, 4), randn(rng, 4), \
        torch.rand(4, generator=rng) + 0.5

    def net(x, w, b, rm, rv):
        y = F.conv2d(x, w, b, stride=2, padding=1)
        y = F.batch_norm(y, rm, rv, w[:, 0, 0, 0], b, False, 0.1, 1e-5)
        return F.max_pool2d(y, 3, 2, 1), F.avg_pool2d(y, 2), F.adaptive_avg_pool2d(y, 1), F.conv_transpose2d(y, w), \
            F.group_norm(y, 2), F.conv1d(x[:, :, 0], w[:, :, 0])

    p = imported(net, x, cw, cb, rm, rv, rtol=1e-4, atol=1e-5)
    assert p.fallback_ops == () and {"conv", "batch_norm", "max_pool", "avg_pool", "conv_transpose"} <= ops_of(p)


def test_attention(rng):
    q, k, v, m = randn(rng, 2, 4, 5, 8), randn(rng, 2, 4, 7, 8), randn(rng, 2, 4, 7, 8), randn(rng, 5, 7)
    p = imported(lambda q, k, v, m: (F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                     F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0),
                                     F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)), q, k, v, m)
    assert p.graph.op_counts().get("sdpa") == 3 and p.fallback_ops == ()


def test_attention_logsumexp_comes_from_a_fallback(rng):
    q, k, v = randn(rng, 2, 4, 5, 8), randn(rng, 2, 4, 7, 8), randn(rng, 2, 4, 7, 8)
    p = imported(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v), q, k, v)
    assert "sdpa" in ops_of(p) and p.fallback_ops == ("aten::_scaled_dot_product_flash_attention_for_cpu.default",)


# ---- calling convention, errors ------------------------------------------------------------------

def test_outputs_passthrough_copies_and_nested_structure(rng):
    x = randn(rng, 3, 4)
    gm = make_fx(lambda x: (x, x.clone(), [x * 2, None]))(x)
    p = import_fx_program(gm, (x,))
    out = p.fx_outputs((x,), run_graph(p.graph, x))
    assert out[0] is x and out[1] is not x and out[1].data_ptr() != x.data_ptr()
    assert isinstance(out[2], list) and out[2][1] is None
    torch.testing.assert_close(out[1], x)
    torch.testing.assert_close(out[2][0], x * 2)


def test_real_mode_graph_without_metadata(rng):
    x = randn(rng, 3, 4)
    p = imported(lambda x: F.softmax(x @ x.t(), -1), x, mode="real")
    assert ops_of(p) == {"matmul", "softmax", "transpose"} or ops_of(p) == {"linear", "softmax"}


def test_non_aten_graph_is_refused():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    with pytest.raises(FxImportError, match="not ATen-level"):
        import_fx(gm, (torch.randn(2, 3),))


def test_table_keys_are_aten_ops():
    for key in list(CONVERTERS) + list(GENERATORS):
        assert isinstance(key, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)), key

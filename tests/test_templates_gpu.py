"""Kernel templates on the CUDA GPU (the H200 device machine): fp16, bf16 and fp32 vs the torch references.

Run there with ``pytest -m gpu tests/test_templates_gpu.py -n 8`` (compiles are the slow part).
fp32 GEMM/conv run an exact FMA loop by default; with ``allow_tf32`` they use TF32 tensor cores
(10-bit mantissa), checked with a looser tolerance.
"""

import pytest
import torch

from tilefuse.config import default_target
from tilefuse.lowering import index as ix
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.expr import Acc, Arg, Coord, Load, call
from tilefuse.lowering.templates import conv, elementwise, gemm, pool, reduction

pytestmark = pytest.mark.gpu

DTYPES = ["float16", "bfloat16", "float32"]
TOL = {"float16": {"rtol": 1e-2, "atol": 1e-2}, "bfloat16": {"rtol": 2e-2, "atol": 2e-2},
       "float32": {"rtol": 1e-5, "atol": 1e-5}}
# fp32 products summed in another order than the float64 reference.
MMA_TOL = {**TOL, "float32": {"rtol": 1e-4, "atol": 1e-4}}


@pytest.fixture(scope="module")
def target():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return default_target()  # this GPU


def randn(rng, shape, dtype="float32"):
    return torch.randn(shape, generator=rng).to(getattr(torch, dtype)).cuda()


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise(rng, target, dtype):
    shapes = [(4, 1, 1000), (3, 1), (1000,)]
    exprs = [call("gelu", Acc() + Arg(2)) * Arg(1), call("gelu", Acc(), approximate="tanh"),
             call("where", call("gt", Acc(), Arg(1)), call("silu", Acc()), call("sigmoid", Arg(2)))]
    f = elementwise.elementwise(shapes, [dtype, "float32", dtype], exprs, [dtype] * 3, target=target)
    ins = [randn(rng, s, d) for s, d in zip(shapes, [dtype, "float32", dtype])]
    outs = compile_kernel(f, target, out_idx=[-3, -2, -1])(*ins)
    for out, ref in zip(outs, elementwise.reference(ins, exprs, [dtype] * 3)):
        torch.testing.assert_close(out, ref, **TOL[dtype])


def _cfg(block_M, block_N, block_K, num_stages, threads, enable_rasterization=False):
    return {"block_M": block_M, "block_N": block_N, "block_K": block_K, "num_stages": num_stages, "threads": threads,
            "enable_rasterization": enable_rasterization}


GEMM_CASES = {
    "linear_bias_gelu": {"M": 512, "N": 768, "K": 256, "trans_B": True, "extras": [(768,)],
                         "epilogue": call("gelu", Acc() + Arg(0), approximate="tanh"),
                         "cfg": _cfg(128, 256, 64, 3, 256, enable_rasterization=True)},  # the H200 seed
    "odd_relu": {"M": 37, "N": 45, "K": 29, "epilogue": call("relu", Acc()), "cfg": _cfg(64, 64, 32, 2, 128)},
    "stage_C_tails": {"M": 1000, "N": 776, "K": 768, "trans_B": True, "epilogue": Acc() + Arg(0), "extras": [(776,)],
                      "cfg": {**_cfg(128, 256, 64, 3, 256, enable_rasterization=True), "stage_C": True}},
    "transA_residual": {"M": 200, "N": 136, "K": 72, "trans_A": True, "epilogue": Acc() + Arg(0),
                        "extras": [(200, 136)], "cfg": _cfg(128, 128, 32, 3, 128)},
    "batched_broadcast": {"M": 70, "N": 96, "K": 64, "batch_A": (2, 3), "batch_B": (3,), "epilogue": Acc() * Arg(0),
                          "extras": [(3, 1, 96)], "cfg": _cfg(64, 64, 32, 2, 128)},
    "prologue_scale": {"M": 128, "N": 128, "K": 128, "prologue": call("scale", Acc(), factor=0.5),
                       "cfg": _cfg(64, 128, 32, 2, 128)},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(GEMM_CASES))
def test_gemm(rng, target, name, dtype):
    case = dict(GEMM_CASES[name])
    M, N, K, cfg = case.pop("M"), case.pop("N"), case.pop("K"), case.pop("cfg")
    extras = [randn(rng, s, dtype) for s in case.pop("extras", [])]
    ta, tb = case.get("trans_A", False), case.get("trans_B", False)
    A = randn(rng, (*case.get("batch_A", ()), *((K, M) if ta else (M, K))), dtype)
    B = randn(rng, (*case.get("batch_B", ()), *((N, K) if tb else (K, N))), dtype)
    if dtype == "float32":  # the exact fp32 FMA loop: small tiles (big ones unroll into slow nvcc runs)
        cfg = _cfg(64, 64, 32, 2, 128)
    f = gemm.gemm(M, N, K, **case, A_dtype=dtype, extra_shapes=[e.shape for e in extras],
                  extra_dtypes=[dtype] * len(extras), **cfg, target=target)
    out = compile_kernel(f, target, out_idx=[-1])(A, B, *extras)
    ref = gemm.reference(A.cpu(), B.cpu(), [e.cpu() for e in extras], trans_A=ta, trans_B=tb,
                         prologue=case.get("prologue"), epilogue=case.get("epilogue"))
    torch.testing.assert_close(out.cpu(), ref, **MMA_TOL[dtype])


@pytest.mark.parametrize("trans", [(False, False), (True, True)])
def test_gemm_fp32_tf32(rng, target, trans):
    M, N, K = 200, 136, 96
    ta, tb = trans
    A, B = randn(rng, (K, M) if ta else (M, K)), randn(rng, (N, K) if tb else (K, N))
    f = gemm.gemm(M, N, K, A_dtype="float32", trans_A=ta, trans_B=tb, allow_tf32=True, epilogue=call("relu", Acc()),
                  block_M=128, block_N=128, block_K=32, num_stages=2, threads=128, target=target)
    out = compile_kernel(f, target, out_idx=[-1])(A, B)
    ref = gemm.reference(A.cpu(), B.cpu(), trans_A=ta, trans_B=tb, epilogue=call("relu", Acc()))
    # TF32 keeps 10 mantissa bits: the error grows like sqrt(K) * 2^-11 * |a||b|.
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-2, atol=5e-2)


def test_gemm_fp32_A_cast_to_bf16(rng, target):
    M, N, K = 96, 80, 72
    A, B = randn(rng, (M, K)), randn(rng, (N, K), "bfloat16")
    f = gemm.gemm(M, N, K, A_dtype="float32", B_dtype="bfloat16", out_dtype="float32", trans_B=True,
                  block_M=64, block_N=64, block_K=32, num_stages=2, threads=128, target=target)
    out = compile_kernel(f, target, out_idx=[-1])(A, B)
    torch.testing.assert_close(out.cpu(), gemm.reference(A.cpu(), B.cpu(), trans_B=True, out_dtype="float32"),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", reduction.KINDS)
def test_row_reduction(rng, target, kind, dtype):
    shape, cols = (3, 11, 1000), 1000  # one 1024-wide tile with a tail
    weight = kind in ("layer_norm", "rms_norm")
    f = reduction.row_reduction(shape, kind, x_dtype=dtype, has_weight=weight, has_bias=kind == "layer_norm",
                                block_N=1024, threads=128, target=target)
    x = randn(rng, shape, dtype) + 2.0
    w, b = (randn(rng, (cols,), dtype), randn(rng, (cols,), dtype)) if weight else (None, None)
    args = [x] + ([w] if weight else []) + ([b] if kind == "layer_norm" else [])
    out = compile_kernel(f, target, out_idx=[-1])(*args)
    ref, _ = reduction.reference(x.cpu(), kind, weight=None if w is None else w.cpu(),
                                 bias=None if kind != "layer_norm" else b.cpu())
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "softmax", "amax", "var"])
@pytest.mark.parametrize("rows,cols", [(4099, 96), (2051, 192), (777, 49), (300, 17), (5000, 384)])
def test_row_reduction_default_config_short_rows(rng, target, kind, dtype, rows, cols):
    """The untuned pick for short rows (several a program, reduction.default_config) with a fused residual, its pre-norm
    output, NaN/inf rows, and a last program only partly filled."""
    config = reduction.default_config(rows, cols, target)
    weight, normalizing = kind in ("layer_norm", "rms_norm"), kind in reduction.NORMALIZING
    producer = Acc() + Arg(0)
    f = reduction.row_reduction((rows, cols), kind, x_dtype=dtype, has_weight=weight, has_bias=kind == "layer_norm",
                                producer=producer, extra_shapes=[(rows, cols)], extra_dtypes=[dtype],
                                write_pre=normalizing, target=target, **config)
    x, res = randn(rng, (rows, cols), dtype), randn(rng, (rows, cols), dtype)
    x[5, 3], x[rows - 1, cols - 1], x[7, 0] = float("nan"), float("inf"), -float("inf")
    w, b = (randn(rng, (cols,), dtype), randn(rng, (cols,), dtype)) if weight else (None, None)
    args = [x] + ([w] if weight else []) + ([b] if kind == "layer_norm" else []) + [res]
    got = compile_kernel(f, target, out_idx=[-2, -1] if normalizing else [-1])(*args)
    ref, ref_pre = reduction.reference(x.cpu(), kind, weight=None if w is None else w.cpu(),
                                       bias=None if b is None else b.cpu(), extras=[res.cpu()], producer=producer)
    out = got[0] if normalizing else got
    torch.testing.assert_close(out.cpu(), ref, equal_nan=True, **TOL[dtype])
    if normalizing:
        torch.testing.assert_close(got[1].cpu(), ref_pre, equal_nan=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,block_rows,block_N", [("layer_norm", 1, 1024), ("rms_norm", 4, 256),
                                                     ("softmax", 1, 512)])
def test_fused_residual_norm_multi_tile(rng, target, dtype, kind, block_rows, block_N):
    shape, cols = (5, 9, 3000), 3000
    producer, consumer = Acc() + Arg(0), call("silu", Acc())
    weight = kind != "softmax"
    f = reduction.row_reduction(shape, kind, x_dtype=dtype, has_weight=weight, producer=producer, consumer=consumer,
                                extra_shapes=[shape], extra_dtypes=[dtype], write_pre=True, block_rows=block_rows,
                                block_N=block_N, threads=128, target=target)
    x, res = randn(rng, shape, dtype), randn(rng, shape, dtype)
    w = randn(rng, (cols,), dtype) if weight else None
    out, pre = compile_kernel(f, target, out_idx=[-2, -1])(x, *([w] if weight else []), res)
    ref, ref_pre = reduction.reference(x.cpu(), kind, weight=None if w is None else w.cpu(), extras=[res.cpu()],
                                       producer=producer, consumer=consumer)
    torch.testing.assert_close(pre.cpu(), ref_pre, **TOL[dtype])
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NHWC/OIHW"])
@pytest.mark.parametrize("config", ["small", "default"])
def test_conv2d(rng, target, dtype, layout, config):
    """Each layout at a small config and at the default (the first seed: 128 x 64 x 32 in 3 stages on CUDA)."""
    layout, _, weight_layout = layout.partition("/")
    tiles = ({"block_M": 64, "block_N": 64, "block_K": 32, "num_stages": 2, "threads": 128} if config == "small"
             else conv.get_configs(target, dtype)[0])
    xs = (2, 32, 17, 19) if layout == "NCHW" else (2, 17, 19, 32)
    ws = (64, 3, 3, 32) if layout == "NHWC" and not weight_layout else (64, 32, 3, 3)
    bias_shape = (64, 1, 1) if layout == "NCHW" else (64,)
    epi = call("relu", Acc() + Arg(0))
    f = conv.conv2d(xs, ws, stride=(2, 1), padding=(1, 1), dilation=(1, 2), layout=layout,
                    weight_layout=weight_layout or None, in_dtype=dtype, epilogue=epi, extra_shapes=[bias_shape],
                    extra_dtypes=[dtype], **tiles, target=target)
    x, w, bias = randn(rng, xs, dtype), randn(rng, ws, dtype), randn(rng, bias_shape, dtype)
    out = compile_kernel(f, target, out_idx=[-1])(x, w, bias)
    ref = conv.reference(x.cpu(), w.cpu(), [bias.cpu()], stride=(2, 1), padding=(1, 1), dilation=(1, 2),
                         layout=layout, weight_layout=weight_layout or None, epilogue=epi)
    torch.testing.assert_close(out.cpu(), ref, **MMA_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_indexed_reads(rng, target, dtype):
    """Loads at computed indices (a transpose, an embedding gather, a rotate-half partner), outputs of
    different shapes, a bool output stored as int8."""
    shapes, dtypes = [(64, 200), (300, 48), (4, 37), (200,)], [dtype, dtype, "int64", dtype]
    i0, i1, i2 = Coord(0), Coord(1), Coord(2)
    partner = ix.mod(ix.add(i1, ix.lit(100)), 200)
    exprs = [Load(0, (i1, i0)) * Load(3, (i0,)),  # (200, 64): x transposed, scaled per row
             Load(1, (ix.clamp(Load(2, (i0, i1)), 0, 299), i2)),  # (4, 37, 48): embedding rows
             Arg(0) + call("where", call("lt", i1, ix.lit(100)), -Load(0, (i0, partner)), Load(0, (i0, partner))),
             call("gt", Arg(0), 0.0)]
    out_shapes = [(200, 64), (4, 37, 48), (64, 200), (64, 200)]
    out_dtypes = [dtype, dtype, "float32", "bool"]
    f = elementwise.elementwise(shapes, dtypes, exprs, out_dtypes, out_shapes=out_shapes, target=target)
    ins = [randn(rng, shapes[0], dtype), randn(rng, shapes[1], dtype),
           torch.randint(0, 300, shapes[2], generator=rng).cuda(), randn(rng, shapes[3], dtype)]
    outs = compile_kernel(f, target, out_idx=[-4, -3, -2, -1])(*ins)
    refs = elementwise.reference([t.cpu() for t in ins], exprs, out_dtypes, out_shapes=out_shapes)
    for out, ref, dt in zip(outs, refs, out_dtypes):
        torch.testing.assert_close(elementwise.from_storage(out, dt).cpu(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", pool.KINDS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhwc_pixels"])
def test_pool2d(rng, target, kind, dtype, layout):
    """``nhwc_pixels``: ``pixel_tiles`` with 16 pixels a program, so the last program has a tail of 8."""
    if dtype == "bfloat16":  # the registry refuses these regions with the same reason
        pytest.skip("bf16 pooling on CUDA: TileLang 0.1.15 emits an undefined __pack_bfloat162 (seen on the H200)")
    channels_last = layout != "nchw"
    tiles = {"pixel_tiles": True, "block": 1024, "threads": 128} if layout == "nhwc_pixels" else {}
    shape = (4, 28, 30, 64) if channels_last else (4, 64, 28, 30)
    geometry = {"output_size": (5, 7)} if kind == "adaptive_avg" else {
        "kernel": (3, 3), "stride": (2, 2), "padding": (1, 1), "ceil_mode": True}
    if kind == "avg":
        geometry["count_include_pad"] = False
    producer, consumer = call("relu", Acc() + Arg(0)), Acc() * Arg(1)
    extra_shapes = [(64,), (64,)] if channels_last else [(64, 1, 1), (64, 1, 1)]
    f = pool.pool2d(shape, kind, **geometry, x_dtype=dtype, producer=producer, consumer=consumer,
                    extra_shapes=extra_shapes, extra_dtypes=[dtype, dtype], write_pre=True,
                    channels_last=channels_last, target=target, **tiles)
    x, b, s = randn(rng, shape, dtype), randn(rng, extra_shapes[0], dtype), randn(rng, extra_shapes[1], dtype)
    out, pre = compile_kernel(f, target, out_idx=[-2, -1])(x, b, s)
    ref = pool.reference(x.cpu(), kind, **geometry, extras=[b.cpu(), s.cpu()], producer=producer, consumer=consumer,
                         channels_last=channels_last)
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])
    torch.testing.assert_close(pre.cpu(), torch.relu(x + b).cpu(), **TOL[dtype])


@pytest.mark.parametrize("config", [(256, 128), (1024, 128), (2048, 256)])
def test_pool2d_pixel_tiles_nan_and_inf_as_torch(rng, target, config):
    """ResNet's stem pool, channels last with ``pixel_tiles``: NaN, +-inf and edge rows as torch's ``max_pool2d``
    (a NaN in a window wins), every output element compared (an odd pixel count: the last program's tail)."""
    shape = (3, 17, 15, 64)
    x = randn(rng, shape, "float16")
    x[0, 0, 0, :8], x[1, 5, 7, 8:16], x[2, 16, 14, 3] = float("nan"), float("inf"), float("nan")
    x[0, 3, :, 20:30] = float("-inf")
    block, threads = config
    f = pool.pool2d(shape, "max", kernel=(3, 3), stride=(2, 2), padding=(1, 1), x_dtype="float16",
                    channels_last=True, pixel_tiles=True, block=block, threads=threads, target=target)
    out = compile_kernel(f, target, out_idx=-1)(x)
    want = torch.nn.functional.max_pool2d(x.permute(0, 3, 1, 2), 3, 2, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("K", [64, 128, 256])
def test_fp32_gemm_with_fewer_rows_than_a_tile(rng, target, M, K):
    """The exact fp32 FMA loop at a few rows (a 1x1 convolution on a 1x1 image, batch 2: ResNet's last shortcut at
    the tiny size): through the TMA, M = 2 and 4 with K past two tiles read wrong A tiles (0.14-0.46 relative error
    on the H100, session 52); such a tile is read element by element. Every output element against float64."""
    f = gemm.gemm(M, 256, K, trans_B=True, A_dtype="float32", epilogue=Acc() + Arg(0), extra_shapes=[(256,)],
                  extra_dtypes=["float32"], block_M=64, block_N=64, block_K=32, num_stages=2, threads=128,
                  target=target)
    a, b, bias = randn(rng, (M, K)), randn(rng, (256, K)), randn(rng, (256,))
    got = compile_kernel(f, target, out_idx=-1)(a, b, bias)
    want = (a.double() @ b.double().T + bias.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))

"""A representative set of template instances per kernel family, for source-level checks on any target.

``cases(target)`` maps a stable name to a thunk building the ``T.prim_func`` (built lazily: lowering costs
seconds). It covers each template kind with fp16/fp32 (bf16 where the target stores it), epilogues, producers and
consumers, masks, causal attention, grouped-query heads, tails and several tiles. Used by
``scripts/source_identity.py`` (CUDA and C sources must not change when a Metal branch is added) and by
``tests/test_vendor_metal.py`` (every kind passes the Metal syntax check).
"""

from __future__ import annotations

from collections.abc import Callable

from tilefuse.lowering import index as ix
from tilefuse.lowering.expr import Acc, Arg, Coord, Load, call
from tilefuse.lowering.templates import attention, conv, elementwise, gemm, pool, reduction
from tilefuse.lowering.templates.common import target_kind

GEMM_SMALL = {"block_M": 64, "block_N": 64, "block_K": 32, "num_stages": 2, "threads": 128}
REDUCTION_KINDS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "sum", "mean", "amax", "amin", "var", "any",
                   "all")


def cases(target: dict | str) -> dict[str, Callable]:
    """name -> thunk returning the PrimFunc, for the template instances ``target`` can take."""
    kind = target_kind(target)
    cpu = kind == "c"
    half = "float16"
    dtypes = ("float32", "float16") if cpu else ("float32", "float16", "bfloat16")
    if kind == "metal":
        dtypes = ("float32", "float16")  # Metal has bfloat only from MSL 3.1; the stand-in headers do not
    out: dict[str, Callable] = {}
    t = target

    # ---- elementwise ---------------------------------------------------------------------------------
    for dt in dtypes:
        out[f"elementwise_broadcast_{dt}"] = lambda dt=dt: elementwise.elementwise(
            [(3, 1, 37), (5, 1), (37,)], [dt, "float32", dt],
            [call("gelu", Acc() + Arg(2), approximate="tanh") * Arg(1),
             call("where", call("gt", Acc(), Arg(1)), Acc(), Arg(2))], [dt, "float32"], block=64, threads=64,
            target=t)
    i0, i1 = Coord(0), Coord(1)
    out["elementwise_gather_bool"] = lambda: elementwise.elementwise(
        [(3, 5), (5,), (2, 4), (7, 4)], [half, half, "int64", half],
        [Load(0, (i1, i0)), Arg(0) + Arg(1), Load(3, (ix.wrap_clamp(Load(2, (i0, i1)), 7), Coord(2))),
         call("gt", Load(0, (i0, ix.sub(ix.lit(4), i1))), 0.0)],
        [half, "float32", half, "bool"], out_shapes=[(5, 3), (3, 5), (2, 4, 4), (3, 5)], block=8, threads=32,
        target=t)
    out["elementwise_silu_mul_exp_erf"] = lambda: elementwise.elementwise(
        [(4, 100), (4, 100)], ["float32", "float32"],
        [call("silu", Acc()) * Arg(1), call("erf", Acc()) + call("exp", Arg(1)), call("rsqrt", call("abs", Acc()))],
        ["float32"] * 3, block=128, threads=128, target=t)

    # ---- gemm ------------------------------------------------------------------------------------------
    for dt in dtypes:
        out[f"gemm_plain_{dt}"] = lambda dt=dt: gemm.gemm(128, 64, 96, A_dtype=dt, **GEMM_SMALL, target=t)
        out[f"gemm_linear_bias_gelu_{dt}"] = lambda dt=dt: gemm.gemm(
            100, 70, 40, trans_B=True, A_dtype=dt, epilogue=call("gelu", Acc() + Arg(0), approximate="tanh"),
            extra_shapes=[(70,)], extra_dtypes=[dt], **GEMM_SMALL, target=t)
    out["gemm_batched_transA_residual"] = lambda: gemm.gemm(
        37, 45, 29, batch_A=(2, 3), batch_B=(3,), trans_A=True, A_dtype=dtypes[-1], epilogue=Acc() + Arg(0),
        extra_shapes=[(37, 45)], extra_dtypes=["float32"], out_dtype="float32", **GEMM_SMALL, target=t)
    out["gemm_prologue_cast_relu"] = lambda: gemm.gemm(
        64, 64, 64, A_dtype="float32", B_dtype=half, prologue=call("scale", Acc(), factor=0.5),
        epilogue=call("relu", Acc()), **GEMM_SMALL, target=t)
    if not cpu:
        out["gemm_stage_C"] = lambda: gemm.gemm(
            100, 64, 64, trans_B=True, A_dtype=half, epilogue=Acc() + Arg(0), extra_shapes=[(64,)],
            extra_dtypes=[half], **GEMM_SMALL, stage_C=True, target=t)

    # ---- row reductions ----------------------------------------------------------------------------------
    for rk in REDUCTION_KINDS:
        out[f"reduction_{rk}"] = lambda rk=rk: reduction.row_reduction((6, 37), rk, block_N=16, target=t,
                                                                       threads=1 if cpu else 128)
    for dt in dtypes:
        out[f"layer_norm_residual_{dt}"] = lambda dt=dt: reduction.row_reduction(
            (2, 5, 96), "layer_norm", x_dtype=dt, has_weight=True, has_bias=True, producer=Acc() + Arg(0),
            extra_shapes=[(2, 5, 96)], extra_dtypes=[dt], write_pre=True, block_N=128,
            threads=1 if cpu else 128, target=t)
    out["rms_norm_weight_rows4"] = lambda: reduction.row_reduction(
        (9, 200), "rms_norm", x_dtype=half, has_weight=True, block_rows=4, block_N=64, threads=1 if cpu else 128,
        target=t)
    out["softmax_scaled_consumer"] = lambda: reduction.row_reduction(
        (3, 300), "softmax", producer=Acc() * 0.125, consumer=Acc() * Arg(0), extra_shapes=[(3, 300)],
        extra_dtypes=["float32"], block_N=128, threads=1 if cpu else 128, target=t)
    out["var_keepdim_rows4"] = lambda: reduction.row_reduction(
        (33, 37), "var", keepdim=True, block_rows=4, block_N=16, threads=1 if cpu else 128, target=t)

    # ---- conv2d ------------------------------------------------------------------------------------------
    conv_small = {"block_M": 32, "block_N": 16, "block_K": 16, "num_stages": 2, "threads": 128}
    for dt in dtypes:
        out[f"conv_nchw_bias_relu_{dt}"] = lambda dt=dt: conv.conv2d(
            (2, 8, 9, 9), (16, 8, 3, 3), padding=(1, 1), in_dtype=dt, epilogue=call("relu", Acc() + Arg(0)),
            extra_shapes=[(16, 1, 1)], extra_dtypes=[dt], **conv_small, target=t)
    out["conv_nhwc_stride2"] = lambda: conv.conv2d(
        (2, 9, 9, 8), (16, 3, 3, 8), stride=(2, 2), padding=(1, 1), layout="NHWC", in_dtype=half, **conv_small,
        target=t)
    out["conv_nhwc_oihw_dilated"] = lambda: conv.conv2d(
        (1, 11, 11, 8), (16, 8, 3, 3), dilation=(2, 2), layout="NHWC", weight_layout="OIHW", in_dtype=half,
        **conv_small, target=t)

    # ---- pool2d ------------------------------------------------------------------------------------------
    threads = 1 if cpu else 128
    out["max_pool_producer_pre"] = lambda: pool.pool2d(
        (2, 8, 17, 19), "max", kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(2, 1), ceil_mode=True,
        x_dtype=half, producer=call("relu", Acc() + Arg(0)), extra_shapes=[(8, 1, 1)], extra_dtypes=[half],
        write_pre=True, block=128, threads=threads, target=t)
    out["avg_pool_nhwc"] = lambda: pool.pool2d(
        (2, 9, 9, 16), "avg", kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True, count_include_pad=False,
        channels_last=True, block=128, threads=threads, target=t)
    out["max_pool_nhwc_pixel_tiles"] = lambda: pool.pool2d(  # (on the CPU the flat path: pixel_tiles is GPU-only)
        (2, 9, 11, 64), "max", kernel=(3, 3), stride=(2, 2), padding=(1, 1), x_dtype=half,
        producer=call("relu", Acc() + Arg(0)), extra_shapes=[(64,)], extra_dtypes=[half], channels_last=True,
        pixel_tiles=True, block=1024, threads=threads, target=t)
    out["adaptive_avg_consumer"] = lambda: pool.pool2d(
        (2, 8, 13, 13), "adaptive_avg", output_size=(3, 5), consumer=Acc() * 2.0, block=128, threads=threads,
        target=t)

    # ---- flash attention ---------------------------------------------------------------------------------
    adt = "float32" if cpu else half
    fa = {"block_M": 32, "block_N": 32, "num_stages": 0, "threads": 1} if cpu else \
        {"block_M": 64, "block_N": 64, "num_stages": 1, "threads": 128}
    if kind == "metal":
        fa = attention.get_configs(t, 64)[0]
    out["attention_plain"] = lambda: attention.flash_attention(2, 4, 128, 128, 64, dtype=adt, **fa, target=t)
    out["attention_causal_gqa_tail"] = lambda: attention.flash_attention(
        1, 4, 100, 100, 64, Hkv=2, is_causal=True, dtype=adt, **fa, target=t)
    out["attention_mask_tokenrows"] = lambda: attention.flash_attention(
        2, 2, 70, 70, 32, mask_shape=(2, 1, 1, 70), mask_dtype=adt, dtype=adt, q_layout=(192, 0), k_layout=(192, 64),
        v_layout=(192, 128), o_layout=(64, 0), **fa, target=t)
    out["attention_window"] = lambda: attention.flash_attention(
        1, 2, 128, 128, 64, is_causal=True, window=40, dtype=adt, **fa, target=t)
    if not cpu and kind != "metal":
        out["attention_bf16"] = lambda: attention.flash_attention(1, 2, 64, 64, 64, dtype="bfloat16", **fa, target=t)
    return out

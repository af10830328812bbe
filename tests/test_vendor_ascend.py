"""Ascend: the templates of ``lowering/templates/ascend`` lower to AscendC source (no CANN here, so nothing runs).

Each test builds a kernel in TileLang's Ascend dialect and checks the source for the constructs that make it an
Ascend kernel of its kind: SIMT vector functions (``__simt_vf__``) for elementwise chains and row reductions, a
mixed Cube/vector kernel (``__mix__(1, 2)``, ``ascend_gemm_l1``, the L0C -> UB copy) for GEMMs. The zoo's MLP and
GPT-2 (tiny) are planned for Ascend source: every elementwise, reduction and GEMM region gets an Ascend kernel, every
other region a reason it runs through torch.
"""

from __future__ import annotations

import re

import pytest
import torch

from tilefuse import models
from tilefuse.capture import capture_graphs
from tilefuse.lowering import index as ix
from tilefuse.lowering import vendor
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import kernel_source
from tilefuse.lowering.expr import Acc, Arg, Coord, Load, call, ops_supported
from tilefuse.lowering.templates import ascend
from tilefuse.lowering.templates.ascend import elementwise, gemm, reduction

ASCEND = {"kind": "ascend"}
VECTOR_KERNEL = re.compile(r'extern "C" __global__ __vector__ void \w+\(')
MIX_KERNEL = re.compile(r'extern "C" __global__ __mix__\(1, 2\) void \w+\(')
ATTRS = {"cast": {"dtype": "float16"}, "scale": {"factor": 0.5}, "masked_fill": {"value": -1.0}}
INT_OPS = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"}


def source(func) -> str:
    return kernel_source(func, ASCEND)


def assert_vector_kernel(src: str) -> None:
    assert VECTOR_KERNEL.search(src), src[-2000:]
    assert "__simt_vf__" in src and "asc_vf_call<" in src


# ---- elementwise ---------------------------------------------------------------------------------------

def _op_expr(op: str) -> tuple:
    """``op`` over as many of the inputs as it takes (tried 1, 2, 3): the expression and its output dtype."""
    base = 3 if op in INT_OPS else 0  # inputs 3, 4, 5 are int32
    last = None
    for n in (1, 2, 3):
        e = call(op, *(Arg(base + i) for i in range(n)), **ATTRS.get(op, {}))
        try:
            elementwise.elementwise([(64,)] * 6, ["float32"] * 3 + ["int32"] * 3, [e], ["float32"], target=ASCEND)
            return e, "int32" if op in INT_OPS else "float32"
        except Exception as err:  # noqa: BLE001 -- a wrong arity is found by trying
            last = err
    raise AssertionError(f"{op}: no arity from 1 to 3 builds: {last}")


def test_every_expression_op_lowers_to_ascendc():
    """Every op ``lowering.expr`` emits, one output each, in one Ascend kernel."""
    ops = sorted(ops_supported())
    built = [_op_expr(op) for op in ops]
    func = elementwise.elementwise([(64,)] * 6, ["float32"] * 3 + ["int32"] * 3, [e for e, _ in built],
                                   [dt for _, dt in built], target=ASCEND)
    src = source(func)
    assert_vector_kernel(src)
    assert src.count("__gm__ float* out") + src.count("__gm__ int* out") >= 1
    for fn in ("expf", "erff", "tanhf", "rsqrtf", "logf", "sinf", "cosf"):
        assert fn + "(" in src, fn
    assert len(re.findall(r"\bout(_\d+)?\[", src)) >= len(ops), "every output stored"


def test_elementwise_broadcast_gather_and_guard():
    """Broadcast operands, an embedding-style gather by int64 ids and a guarded tail, in fp16 and bf16."""
    i0, i1 = Coord(0), Coord(1)
    for dt, ctype in (("float16", "half"), ("bfloat16", "bfloat16_t")):
        func = elementwise.elementwise(
            [(3, 5, 8), (8,), (3, 5), (11, 8)], [dt, "float32", "int64", dt],
            [call("gelu", Acc() + Arg(1), approximate="tanh"),
             Load(3, (ix.wrap_clamp(Load(2, (i0, i1)), 11), Coord(2))) * Arg(1)],
            [dt, "float32"], out_shapes=[(3, 5, 8), (3, 5, 8)], block=64, threads=64, target=ASCEND)
        src = source(func)
        assert_vector_kernel(src)
        assert f"__gm__ {ctype}* in0" in src and "__gm__ int64_t* in2" in src
        assert "tanhf(" in src
        assert re.search(r"if \(.*< 120\)|< 15\)", src), "the last block is guarded (120 elements, blocks of 64)"


def test_elementwise_refuses_float64():
    with pytest.raises(NotImplementedError, match="not float64"):
        elementwise.elementwise([(8,)], ["float64"], [Acc()], ["float64"], target=ASCEND)


# ---- row reductions ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", reduction.KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_row_reduction_lowers(kind, dtype):
    """Each kind with a producer (x + residual written as Pre), norms with weight (and bias), and a consumer."""
    norm = kind in ("layer_norm", "rms_norm")
    normalizing = kind in ("softmax", "log_softmax") or norm
    func = reduction.row_reduction(
        (4, 6, 96), kind, x_dtype=dtype, producer=Acc() + Arg(0), consumer=Acc() * Arg(1) if normalizing else None,
        extra_shapes=[(96,), (96,)] if normalizing else [(96,)], extra_dtypes=[dtype] * (2 if normalizing else 1),
        has_weight=norm, has_bias=kind == "layer_norm", write_pre=normalizing, keepdim=True, target=ASCEND)
    src = source(func)
    assert_vector_kernel(src)
    assert "tl::AscendAllReduce<tl::SumOp" in src
    expect = {"softmax": ["tl::MaxOp", "expf("], "log_softmax": ["tl::MaxOp", "logf("],
              "layer_norm": ["rsqrtf(", "__gm__ {t}* Bias", "__gm__ {t}* W"], "rms_norm": ["rsqrtf(", "__gm__ {t}* W"],
              "var": ["9.500000e+01"], "mean": ["9.600000e+01"], "sum": []}[kind]
    t = "half" if dtype == "float16" else "float"
    for s in expect:
        assert s.format(t=t) in src, s
    assert ("__gm__ " + t + "* Pre") in src if normalizing else "Pre" not in src


def test_row_reduction_refuses_what_it_lacks():
    with pytest.raises(NotImplementedError, match="amax"):
        reduction.row_reduction((4, 32), "amax", target=ASCEND)
    with pytest.raises(NotImplementedError, match="float64"):
        reduction.row_reduction((4, 32), "sum", x_dtype="float64", target=ASCEND)


# ---- GEMM ----------------------------------------------------------------------------------------------

def assert_gemm_kernel(src: str, ctype: str, b_copy: str = "nd2nz") -> None:
    assert MIX_KERNEL.search(src), src[-2000:]
    assert re.search(rf"ascend_gemm_l1<\d+, \d+, \d+, \d+, true, {ctype}>", src)
    assert "asc_copy_gm2l1_nd2nz(" in src and f"asc_copy_gm2l1_{b_copy}(" in src
    assert "asc_copy_l0c2ub(" in src and "asc_copy_ub2gm_align(" in src
    assert "if ASC_IS_AIC" in src and "if ASC_IS_AIV" in src and "__simt_vf__" in src


@pytest.mark.parametrize("dtype,ctype", [("float16", "half"), ("bfloat16", "bfloat16_t"), ("float32", "float")])
def test_gemm_linear_bias_gelu_residual(dtype, ctype):
    """A linear (B as (N, K)) with bias, gelu and a residual, M and N tails; every config of the space lowers."""
    M, N, K = 100, 72, 64
    ep = call("gelu", Acc() + Arg(0)) + Arg(1) * Arg(2)
    for config in gemm.get_configs()[:3]:
        func = gemm.gemm(M, N, K, trans_B=True, A_dtype=dtype, epilogue=ep, extra_shapes=[(N,), (M, N), ()],
                         extra_dtypes=[dtype, dtype, "float32"], **config, target=ASCEND)
        src = source(func)
        assert_gemm_kernel(src, ctype)
        assert "erff(" in src
        assert "min(" in src, "tails clamped"


def test_gemm_matmul_and_batched():
    """B as (K, N) is transposed on its way into L1 (dn2nz); a batched GEMM keeps row tiles inside a batch."""
    src = source(gemm.gemm(64, 80, 96, A_dtype="float16", **gemm.get_configs()[0], target=ASCEND))
    assert_gemm_kernel(src, "half", "dn2nz")
    src = source(gemm.gemm(48, 32, 32, batch_A=(3,), batch_B=(3,), A_dtype="float16", epilogue=call("relu", Acc()),
                           block_M=128, target=ASCEND))
    assert_gemm_kernel(src, "half", "dn2nz")
    assert "ascend_gemm_l1<48," in src, "block_M shrunk to a divisor of M"


@pytest.mark.parametrize("kw,match", [
    ({"trans_A": True}, "transposed"), ({"prologue": call("relu", Acc())}, "prologue"), ({"K": 40}, "multiple of 16"),
    ({"A_dtype": "float16", "B_dtype": "float32"}, "pairs"),
    ({"extra_shapes": [(7, 1)], "extra_dtypes": ["float32"], "epilogue": Acc() + Arg(0)}, "epilogue operand")])
def test_gemm_refusals(kw, match):
    args = {"M": 7, "N": 32, "K": 32, "A_dtype": "float32", **kw}
    assert match in gemm.why_not(**args)
    with pytest.raises(NotImplementedError, match=match):
        gemm.gemm(**args, target=ASCEND)


# ---- the zoo ---------------------------------------------------------------------------------------------

def _planned(name: str, dtype: torch.dtype):
    model, inputs = models.build(name, "tiny", dtype=dtype)
    graph = max(capture_graphs(model, inputs, lower=False), key=lambda g: len(g.nodes))
    return vendor.source_plan(graph, ASCEND)


@pytest.mark.parametrize("name,dtype,kinds", [
    ("mlp", torch.float32, {"reduction", "gemm"}), ("mlp", torch.float16, {"reduction", "gemm"}),
    ("gpt2", torch.float32, {"elementwise", "reduction", "gemm"}),
    ("gpt2", torch.float16, {"elementwise", "reduction", "gemm"})])
def test_zoo_regions_get_ascend_source(name, dtype, kinds):
    plan, specs = _planned(name, dtype)
    made, fallback = {}, {}
    for r in plan.regions:
        s = ascend.ascend_spec(specs[r.name]) if r.backend == "tilelang" else None
        if isinstance(s, KernelSpec):
            made[r.name] = (r.kind, source(ascend.make_prim_func(s)))
        else:  # the reason: Ascend's (no template for the kind), or the plan's own refusal of the region
            fallback[r.name] = (r.kind, s or next((w for w in plan.refusals if w.startswith(r.name + " ")), None))
    assert {k for k, _ in made.values()} == kinds
    for region, (kind, src) in made.items():
        if kind == "gemm":
            assert MIX_KERNEL.search(src) and "ascend_gemm_l1<" in src, region
        else:
            assert_vector_kernel(src)
            if kind == "reduction":
                assert "tl::AscendAllReduce<" in src and "rsqrtf(" in src, region  # the zoo's norms
    for region, (kind, why) in fallback.items():
        assert kind not in ascend.ASCEND_KINDS and why and "torch" in why, (region, kind, why)
    if name == "gpt2":
        assert {k for k, _ in fallback.values()} == {"attention"}
        emb = [src for k, src in made.values() if k == "elementwise"]
        assert emb and "__gm__ int64_t*" in emb[0], "the token ids are gathered in the kernel"


def test_ascend_spec_names_the_missing_template():
    spec = KernelSpec("flash_attention", (("B", 1),), (-1,), (), ())
    assert "no Ascend template for flash_attention" in ascend.ascend_spec(spec)
    spec = KernelSpec("row_reduction", (("shape", (4, 8)), ("kind", "amax"), ("x_dtype", "float32")), (-1,), (), ())
    assert "no Ascend row-reduction template for amax" in ascend.ascend_spec(spec)
    spec = KernelSpec("elementwise", (("in_shapes", ((4,),)), ("in_dtypes", ("float32",)), ("exprs", (Acc(),)),
                                      ("out_dtypes", ("float32",)), ("out_shapes", ((4,),))), (-1,), (), ())
    assert ascend.ascend_spec(spec).template == "ascend_elementwise"

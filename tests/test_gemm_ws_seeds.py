"""Which ``gemm(ws=True)`` config leads where (``gemm_ws.seeds``, the default pick through ``lower.default_config``),
as the H200's and an H100's sweeps ranked them, and how ``Options.experimental`` adds the unmeasured schedules to the
config space. Profitability only: what the schedule builds and refuses, and its numerics, are ``test_gemm_ws.py``'s."""

from __future__ import annotations

import inspect

import pytest

from tilefuse.config import EXPERIMENTAL, Options
from tilefuse.lowering import lower
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.templates import attention, gemm_ws

SM90 = {"kind": "cuda", "arch": "sm_90a"}


@pytest.mark.parametrize(("M", "N", "K", "block_N"), [
    # the H200's sweeps (bench/results/2026-12-03-h200-session22, 2026-12-04-h200-session27): the fastest of 128 x 192
    # x 4, 128 x 256 x 3 and 128 x 128 x 5 at each shape
    (8192, 3072, 768, 192), (8192, 768, 768, 192), (16384, 768, 768, 192), (12608, 768, 768, 192),
    (8192, 2304, 768, 192), (8192, 768, 3072, 192),
    (8192, 50264, 768, 192), (8192, 5632, 2048, 256), (8192, 8192, 8192, 256), (8192, 16384, 4096, 256),
    (8192, 4096, 16384, 256), (8192, 2048, 2048, 128), (8192, 512, 2048, 128), (8192, 8192, 2048, 256),
    (8192, 2048, 8192, 256), (8192, 32000, 2048, 256), (16384, 768, 3072, 192)])
def test_the_ws_seeds_rank_as_the_h200_measured(M, N, K, block_N):
    ranked = gemm_ws.seeds("float16", M, N, K, 132)
    first = ranked[0]
    assert first == gemm_ws.seed(block_N=block_N, stages=5 if block_N == 128 else 4) and len(ranked) == 3
    assert {c["block_N"]: c["num_stages"] for c in ranked} == {128: 5, 192: 4, 256: 3}
    spec = KernelSpec("gemm", tuple(sorted(dict(M=M, N=N, K=K, trans_B=True, A_dtype="float16").items())), (-1,),
                      (), ())
    assert lower.default_config(spec, SM90) == first


@pytest.mark.parametrize(("M", "N", "K", "residual", "lead"), [
    # an H100's sweeps at ResNet-50's 1x1 convolutions, b64 (bench/results/2026-12-07-h100-session51): memory-bound
    # (K or N <= 512), 128 x 64 x 6 where N <= 128, else 128 x 128 x 5; a residual's tiles taking turns
    (200704, 64, 64, False, (64, 6, 1)), (200704, 64, 256, False, (64, 6, 1)), (50176, 128, 512, False, (64, 6, 1)),
    (200704, 256, 64, False, (128, 5, 1)), (12544, 256, 1024, False, (128, 5, 1)),
    (3136, 512, 2048, False, (128, 5, 1)), (12544, 1024, 512, False, (128, 5, 1)),
    (3136, 2048, 1024, False, (256, 3, 1)),  # (neither dim short: as fitted)
    (200704, 256, 64, True, (64, 6, 2)), (50176, 512, 128, True, (128, 5, 2)), (12544, 1024, 256, True, (128, 5, 2)),
    (3136, 2048, 512, True, (128, 5, 2))])
def test_memory_bound_shapes_lead_with_narrow_tiles_and_turns_for_a_residual(M, N, K, residual, lead):
    ranked = gemm_ws.seeds("float16", M, N, K, 132, frozenset({"relu"}), residual)
    assert [(c["block_N"], c["num_stages"], c.get("extra_buffers", 1)) for c in ranked][0] == lead
    assert len(ranked) == len({str(c) for c in ranked}) >= 3  # (the others stay for tuning, once each)
    # the default pick, as a conv's BN, residual and ReLU epilogue asks for it
    bn = Acc() * Arg(0) + Arg(1)
    epilogue = call("relu", bn + Arg(2) if residual else bn)
    extras = ((N,), (N,), *([(M, N)] if residual else []))
    kw = dict(M=M, N=N, K=K, trans_B=True, A_dtype="float16", epilogue=epilogue, extra_shapes=extras,
              extra_dtypes=("float16",) * len(extras))
    spec = KernelSpec("gemm", tuple(sorted(kw.items())), (-1,), (), ())
    assert lower.default_config(spec, SM90) == ranked[0]
    if residual:  # (built: two output tiles fit beside the stages)
        assert gemm_ws.smem_bytes(128, lead[0], 64, lead[1], "float16", False, None, 2) <= gemm_ws.SMEM_MAX


@pytest.mark.parametrize(("M", "N", "K", "ops", "staged", "sliced"), [
    # the H200's sweeps (bench/results/2026-12-04-h200-session30): under the exact GELU at K <= 1024, 128 x 256 x 4 with
    # the epilogue in 64-column slices (BERT's, GPT-2's and ViT's fc1; 8192 x 4096 x 1024)
    (16384, 3072, 768, {"gelu"}, False, True), (8192, 3072, 768, {"gelu"}, False, True),
    (12608, 3072, 768, {"erf"}, False, True), (8192, 4096, 1024, {"gelu"}, False, True),
    (8192, 3072, 768, set(), False, False),  # a bias alone: 1.5-2.5% slower
    (8192, 16384, 4096, {"gelu"}, False, False),  # long K: 256 x 3
    (8192, 8192, 768, {"silu"}, True, False),  # a staged extra would be gathered (LLaMA's silu * up: 20% slower)
    (8192, 768, 768, {"gelu"}, False, False),  # more padded waves than 192
])
def test_the_sliced_seed_leads_at_short_k_under_a_special_function(M, N, K, ops, staged, sliced):
    first = gemm_ws.seeds("float16", M, N, K, 132, frozenset(ops), staged)[0]
    assert (first == gemm_ws.seed(block_N=256, slice_N=64)) is sliced
    assert gemm_ws.seed(block_N=256, slice_N=64)["num_stages"] == 4 and gemm_ws.seed(block_N=256)["num_stages"] == 3
    epilogue = {"gelu": call("gelu", Acc() + Arg(0)), "erf": Acc() * call("erf", Acc() + Arg(0)),
                "silu": call("silu", Acc()) * Arg(0)}.get(next(iter(ops), ""), Acc() + Arg(0))
    extra = (M, N) if staged else (N,)
    kw = dict(M=M, N=N, K=K, trans_B=True, A_dtype="float16", epilogue=epilogue, extra_shapes=(extra,),
              extra_dtypes=("float16",))
    spec = KernelSpec("gemm", tuple(sorted(kw.items())), (-1,), (), ())
    assert lower.default_config(spec, SM90) == first


def test_the_ws_gemm_leads_where_it_applies_and_the_experimental_options_add_theirs():

    def spec(template, **kw):
        return KernelSpec(template, tuple(sorted(kw.items())), (-1,), (), ())
    linear = spec("gemm", M=8192, N=3072, K=768, trans_B=True, A_dtype="float16")  # (GPT-2 b8x1024: 192 leads)
    few = spec("gemm", M=gemm_ws.MIN_M - 8, N=3072, K=768, trans_B=True, A_dtype="float16")
    odd = spec("gemm", M=4096, N=3072, K=100, trans_B=True, A_dtype="float16")  # rows TMA cannot address
    attn = spec("flash_attention", B=2, Hq=4, Sq=256, Skv=256, D=64, dtype="float16", is_causal=True)
    plain = Options(target=SM90)
    both = Options(target=SM90, experimental="gemm_ws_pingpong,attention_double_q, attention_late_store")
    assert "experimental" not in plain.target
    assert both.target["experimental"] == ["attention_double_q", "attention_late_store", "gemm_ws_pingpong"]
    assert lower.config_space(linear, plain.target)[0] == lower.default_config(linear, plain.target) == gemm_ws.seed()
    first, wide, short, second = lower.config_space(linear, both.target)[:4]
    assert first == gemm_ws.seed() and second == gemm_ws.seed(pingpong=True)
    assert wide == gemm_ws.seed(block_N=256) == {**first, "block_N": 256, "num_stages": 3}  # (tuning tries all)
    assert short == {**first, "block_N": 128, "num_stages": 5}
    assert lower.default_config(linear, both.target) == first
    assert not any(c.get("ws") for c in lower.config_space(few, plain.target))  # the template's pick by waves
    assert lower.default_config(few, both.target) == gemm_ws.seed(pingpong=True)  # (asked for)
    assert not any(c.get("ws") for c in lower.config_space(odd, both.target))
    assert lower.default_config(attn, plain.target)["pair_rows"] is True  # causal: the measured default
    assert lower.default_config(attn, both.target) == {**lower.default_config(attn, plain.target),
                                                       "double_q": True, "late_store": True}
    chained = Options(target=SM90, experimental="attention_chain")
    assert lower.default_config(attn, chained.target) == {**lower.default_config(attn, plain.target), "chain": True}
    pinned = Options(target=SM90, experimental="attention_pin_softmax")
    assert lower.default_config(attn, pinned.target) == {**lower.default_config(attn, plain.target),
                                                         "pin_softmax": True}
    lean = Options(target=SM90, experimental="attention_lean_producer")
    assert lower.default_config(attn, lean.target) == {**lower.default_config(attn, plain.target),
                                                       "lean_producer": True}
    # (config_space passes each "attention_<option>" on as flash_attention's option of that name)
    names = inspect.signature(attention.flash_attention).parameters
    assert all(n.removeprefix("attention_") in names for n in EXPERIMENTAL if n.startswith("attention_"))
    with pytest.raises(ValueError, match="attention_exp_poly"):  # (measured slower everywhere: no option offers it)
        Options(target=SM90, experimental="attention_exp_poly")
    assert gemm_ws.seed()["block_N"] == 192 and gemm_ws.seed()["num_stages"] == 4
    assert gemm_ws.seeds("float32", 4096, 3072, 768, 132) == [gemm_ws.seed("float32")]  # (256 wide: 2 stages)
    assert gemm_ws.seed("float32")["num_stages"] == 3 and gemm_ws.seed("float32", True)["num_stages"] == 3
    assert lower.func_key(linear, both.target, first) != lower.func_key(linear, SM90, first)  # cached apart
    assert "experimental" not in Options(target={"kind": "c"}, experimental="gemm_ws_pingpong").target
    for gone in ("gemm_ws", "attention_pair_rows", "attention_masked", "attention_fast_math", "gemm_wsx"):
        with pytest.raises(ValueError, match=f"unknown experimental schedule.*{gone}.*known: attention_chain, "):
            Options(target=SM90, experimental=gone)

"""Gemma 2's logit softcapping (issue 14): ``cap * tanh(s / cap)`` on the scaled scores, before the mask. The planner
makes one sdpa with a ``softcap`` of it (``planner.patterns_softcap``), ``ops.nn.sdpa`` computes what the graph does,
the flash-attention template caps each score in fp32 (every element on ``c``; a CUDA compile for sm_90a; GPU numerics
marked ``gpu``), and the warp-specialized schedule, which has no softcap, refuses it. The caps here are small against
the scores, so tanh bends every score it touches (a kernel that skipped the cap would be far off)."""

import shutil

import pytest
import torch

from tilefuse.ir import TensorType
from tilefuse.lowering.compile import compile_kernel, compile_many, kernel_source
from tilefuse.lowering.templates import attention, attention_ws
from tilefuse.ops import GraphBuilder, nn
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

B, H, S, D = 2, 3, 13, 16
C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}
CAP = 0.5


def _capped_graph(dtype: str, *, mask: bool, batched: bool, form: str = "div", cap_out: float = CAP):
    """Gemma 2's eager attention: ``q @ k^T * scaling``, ``/ cap`` (or ``* (1 / cap)``), tanh, ``* cap``, the mask
    added, a float32 softmax, the product with v; ``batched``: both products as ATen decomposes a 4-D matmul."""
    b = GraphBuilder("capped")
    q, k, v = (b.input(n, TensorType((B, H, S, D), dtype)) for n in "qkv")
    kt = b.add1("transpose", [k], dim0=2, dim1=3)
    if batched:
        s = b.add1("matmul", [b.add1("reshape", [q], shape=(B * H, S, D)),
                              b.add1("reshape", [kt], shape=(B * H, D, S))])
        s = b.add1("reshape", [s], shape=(B, H, S, S))
    else:
        s = b.add1("matmul", [q, kt])
    s = b.add1("mul", [s, b.constant("scaling", torch.tensor(D ** -0.5))])
    if form == "div":
        s = b.add1("div", [s, b.constant("cap_in", torch.tensor(CAP))])
    else:
        s = b.add1("mul", [s, b.constant("cap_in", torch.tensor(1 / CAP))])
    s = b.add1("mul", [b.constant("cap_out", torch.tensor(cap_out)), b.add1("tanh", [s])])
    if mask:
        s = b.add1("add", [s, b.input("mask", TensorType((B, 1, S, S), dtype))])
    if dtype != "float32":
        s = b.add1("cast", [s], dtype="float32")
    p = b.add1("softmax", [s], dim=-1)
    if dtype != "float32":
        p = b.add1("cast", [p], dtype=dtype)
    if not batched:
        return b.build([b.add1("matmul", [p, v])])
    o = b.add1("matmul", [b.add1("reshape", [p], shape=(B * H, S, S)), b.add1("reshape", [v], shape=(B * H, S, D))])
    return b.build([b.add1("reshape", [o], shape=(B, H, S, D))])


def _inputs(rng, dtype: str, mask: bool):
    """q and k 4x a unit normal (scores far past the cap), a NaN in one query row and an inf in one key; a random
    additive mask hides keys with -inf."""
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(B, H, S, D, generator=rng) for _ in range(3))
    q, k = 4 * q, 4 * k
    q[0, 1, 3, 5] = float("nan")
    k[1, 2, 7, 0] = float("inf")
    args = [q.to(dt), k.to(dt), v.to(dt)]
    if mask:
        m = torch.randn(B, 1, S, S, generator=rng).masked_fill(torch.rand(B, 1, S, S, generator=rng) < 0.3,
                                                               float("-inf"))
        m[:, :, :, 0] = 0.0  # every row keeps a key (a softmax over -inf alone is NaN, where sdpa gives 0)
        args.append(m.to(dt))
    return args


@pytest.mark.parametrize("form", ["div", "mul"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_capped_attention_is_one_sdpa_with_its_softcap(rng, dtype, mask, batched, form):
    g = _capped_graph(dtype, mask=mask, batched=batched, form=form)
    p = plan(g, C)
    assert list(p.graph.op_counts()) == ["sdpa"], (p.graph, p.refusals)
    (sdpa,) = p.graph.nodes
    assert sdpa.attr["softcap"] == pytest.approx(CAP) and sdpa.attr["scale"] == pytest.approx(D ** -0.5)
    assert [r.kind for r in p.regions] == ["attention"] and "softcap" in p.regions[0].pattern
    assert p.regions[0].backend == ("tilelang" if dtype == "float32" else "torch")  # c runs fp32 attention only
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-2, "atol": 1e-2}
    for _ in range(2):  # fresh inputs each call
        args = _inputs(rng, dtype, mask)
        (want,) = Executor(g)(*args)
        (got,) = PlanRunner(p)(*args)
        assert want[0, 1, 3].isnan().all() and want[1].isfinite().all()  # NaN stays in its row; inf is capped
        torch.testing.assert_close(got, want, equal_nan=True, **tol)


def test_unequal_caps_are_refused_with_the_reason(rng):
    """``tanh(s / 0.5) * 0.7`` is no softcap: the graph stays decomposed, says why, and computes what it says."""
    g = _capped_graph("float32", mask=False, batched=False, cap_out=0.7)
    p = plan(g, C)
    assert "sdpa" not in p.graph.op_counts()
    assert any("not capped by one positive constant" in r for r in p.refusals), p.refusals
    args = _inputs(rng, "float32", False)
    torch.testing.assert_close(PlanRunner(p)(*args)[0], Executor(g)(*args)[0], equal_nan=True, rtol=1e-5, atol=1e-5)


def test_sdpa_op_caps_scores_before_the_mask():
    """``ops.nn.sdpa``'s softcap against the formula, with a boolean and an additive mask, causal, a window and
    grouped-query heads; a row that sees no key is 0 as in torch's sdpa; a cap that is not positive is an error."""
    g = torch.Generator().manual_seed(0)
    q, k = 3 * torch.randn(2, 4, 9, 8, generator=g), 3 * torch.randn(2, 2, 9, 8, generator=g)
    v = torch.randn(2, 2, 9, 8, generator=g)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = torch.tanh(q @ kr.transpose(-1, -2) * 0.3 / 0.7) * 0.7
    keep = torch.rand(2, 1, 9, 9, generator=g) > 0.3
    keep[..., 0] = True
    keep[1, 0, 4] = False
    got = nn.sdpa(q, k, v, keep, scale=0.3, softcap=0.7)
    want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0) @ vr
    torch.testing.assert_close(got, want)
    assert (got[1, :, 4] == 0).all()
    add = torch.randn(2, 1, 9, 9, generator=g)
    torch.testing.assert_close(nn.sdpa(q, k, v, add, scale=0.3, softcap=0.7), torch.softmax(s + add, -1) @ vr)
    i, j = torch.arange(9).view(-1, 1), torch.arange(9).view(1, -1)
    for window, seen in ((None, j <= i), (3, (j <= i) & (j > i - 3))):
        want = torch.softmax(s.masked_fill(~seen, float("-inf")), -1) @ vr
        torch.testing.assert_close(nn.sdpa(q, k, v, is_causal=True, scale=0.3, window=window, softcap=0.7), want)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="softcap must be positive"):
            nn.sdpa(q, k, v, softcap=bad)


CASES = {  # name: (B, Hq, Hkv, Sq, Skv, D, kwargs)
    "plain": (2, 3, 3, 20, 29, 16, {}),
    "causal_tail": (2, 2, 2, 37, 37, 16, {"is_causal": True}),
    "gqa_scale": (2, 4, 2, 33, 33, 16, {"scale": 0.3}),
    "key_mask": (2, 2, 2, 21, 37, 16, {"mask_shape": (2, 1, 1, 37)}),
    "full_mask_causal": (1, 2, 1, 37, 37, 16, {"mask_shape": (1, 2, 37, 37), "is_causal": True}),
    "sliding_window": (1, 2, 1, 37, 37, 16, {"is_causal": True, "window": 5}),
    "decode_packed": (2, 8, 2, 1, 37, 16, {"mask_shape": (2, 1, 1, 37), "pack": True, "block_M": 8}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attention_softcap_c_matches_the_reference(name, rng):
    Bn, Hq, Hkv, Sq, Skv, Dn, kw = CASES[name]
    kw = {"block_M": 16, "block_N": 16, **kw}
    f = attention.flash_attention(Bn, Hq, Sq, Skv, Dn, Hkv=Hkv, softcap=CAP, target=C, dtype="float32",
                                  mask_dtype="float32", **kw)
    kernel = compile_kernel(f, C, [-1])
    for _ in range(2):
        q, k, v = (4 * torch.randn(Bn, h, s, Dn, generator=rng) for h, s in ((Hq, Sq), (Hkv, Skv), (Hkv, Skv)))
        q[0, 0, 0, 1] = float("nan")
        k[-1, -1, 2, 3] = float("-inf")
        m = torch.randn(kw["mask_shape"], generator=rng) if "mask_shape" in kw else None
        got = kernel(q, k, v, *([m] if m is not None else []))
        want = attention.reference(q, k, v, m, is_causal=kw.get("is_causal", False), scale=kw.get("scale"),
                                   window=kw.get("window"), softcap=CAP)
        uncapped = attention.reference(q, k, v, m, is_causal=kw.get("is_causal", False), scale=kw.get("scale"),
                                       window=kw.get("window"))
        assert (want - uncapped).abs().nan_to_num(0.0).max() > 0.1  # the cap bends these scores
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)


def test_softcap_refusals():
    assert attention_ws.eligible(SM90, D=64) and not attention_ws.eligible(SM90, D=64, softcap=CAP)
    with pytest.raises(ValueError, match="no softcap"):
        attention.flash_attention(1, 2, 128, 128, 64, softcap=CAP, ws=True, target=SM90)
    with pytest.raises(ValueError, match="softcap must be positive"):
        attention.flash_attention(1, 2, 16, 16, 16, softcap=0.0, dtype="float32", target=C)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_softcap_compiles_for_sm90a():
    """fp16 and bf16, head dims 64 and Gemma 2's 256, causal with a window and plain: the non-ws template's default
    pick, each score through tanh."""
    funcs = []
    for dtype, Dn, kw in (("float16", 64, {"is_causal": True, "window": 64}), ("bfloat16", 256, {}),
                          ("float16", 256, {"is_causal": True})):
        cfg = attention.get_configs(SM90, Dn)[0]
        funcs.append(attention.flash_attention(2, 4, 200, 200, Dn, Hkv=2, softcap=CAP, dtype=dtype, target=SM90,
                                               **kw, **cfg))
    assert all("tanh" in kernel_source(f, SM90) for f in funcs)
    for got in compile_many([(f, [-1]) for f in funcs], SM90, return_exceptions=True):
        assert not isinstance(got, BaseException), got


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("Dn", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_softcap_gpu_matches_the_reference(dtype, Dn, is_causal, rng):
    Bn, Hq, Hkv, Sq = 2, 4, 2, 333
    target = {"kind": "cuda", "arch": "sm_90a"} if torch.cuda.get_device_capability() >= (9, 0) else "cuda"
    cfg = attention.get_configs(target, Dn)[0]
    f = attention.flash_attention(Bn, Hq, Sq, Sq, Dn, Hkv=Hkv, is_causal=is_causal, softcap=CAP,
                                  dtype=str(dtype).split(".")[1], target=target, **cfg)
    kernel = compile_kernel(f, target, [-1])
    q, k, v = (3 * torch.randn(Bn, h, Sq, Dn, generator=rng) for h in (Hq, Hkv, Hkv))
    q[0, 0, 5, 0] = float("nan")
    q, k, v = (x.to(dtype).cuda() for x in (q, k, v))
    got = kernel(q, k, v)
    want = attention.reference(q, k, v, is_causal=is_causal, softcap=CAP)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-2, atol=1e-2)

"""A decode step's rotary embedding and KV-cache store inside its q/k/v ``gemv_group`` (issue 16,
``planner.rotary_fold``): the template's rotated and scattered outputs against torch on the c target (every element,
NaN included, fp32 and fp16), its refusals, a bad cache index, the planner's fold of HF LLaMA's layers, and whole decode
steps against eager with the fold's kernels run on the c target."""

import pytest
import torch

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import gemv
from tilefuse.ops.nn import rotary_embedding

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def _qkv_case(rng, M, H, Hkv, D, K, L, dtype, cos_rows):
    A = torch.randn(M, K, generator=rng).to(dtype)
    Bq, Bk, Bv = ((torch.randn(n * D, K, generator=rng) * 0.1).to(dtype) for n in (H, Hkv, Hkv))
    cos, sin = (torch.randn(cos_rows, D, generator=rng).to(dtype) for _ in range(2))
    kc, vc = (torch.randn(M, Hkv, L, D, generator=rng).to(dtype) for _ in range(2))
    return A, (Bq, Bk, Bv), cos, sin, kc, vc


def _want(A, Bs, cos, sin, kc, vc, pos, D):
    """Eager's decode step: each linear rounded to the dtype, q and k rotated (``rotary_embedding`` on (M, heads, 1,
    D) with cos/sin (rows, 1, 1, D)), k and v stored into the caches at ``pos``."""
    M = A.shape[0]
    q, k, v = ((A.double() @ B.double().T).to(A.dtype).reshape(M, -1, 1, D) for B in Bs)
    c, s = (t.reshape(t.shape[0], 1, 1, D) for t in (cos, sin))
    q, k = (rotary_embedding(x.float(), c.float(), s.float()).to(A.dtype) for x in (q, k))
    kc, vc = kc.clone(), vc.clone()
    kc[:, :, pos] = k[:, :, 0]
    vc[:, :, pos] = v[:, :, 0]
    return q.reshape(M, -1), kc, vc


def _kernel(M, H, Hkv, D, K, dtype, cos_rows, L, target, **cfg):
    dt = str(dtype)[6:]
    f = gemv.gemv_group(M, (H * D, Hkv * D, Hkv * D), K, A_dtype=dt, extra_shapes=[(cos_rows, D)] * 2 +
                        [(M, Hkv, L, D)] * 2 + [(1,)], extra_dtypes=[dt] * 4 + ["int64"], stored=(True, False, False),
                        head_dim=D, rotary_of=[(0, 1), (0, 1), None], scatter_of=[None, (2, 4), (3, 4)],
                        target=target, **(cfg or gemv.get_configs(target)[0]))
    (kernel,) = compile_many([(f, [-1])], target)
    return kernel


@pytest.mark.parametrize("M, H, Hkv, D, K, cos_rows", [(1, 4, 2, 16, 64, 1), (3, 2, 1, 8, 40, 3), (2, 2, 2, 32, 24, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotated_and_stored_as_eager_on_c(rng, M, H, Hkv, D, K, cos_rows, dtype):
    """q rotated into its output, k rotated and v as it is into their caches at the position, the rest of the caches
    untouched: every element as eager's (fp32 1e-5; fp16 one rounding of the rotation apart, 1e-2)."""
    L, pos = 7, 5
    A, Bs, cos, sin, kc, vc = _qkv_case(rng, M, H, Hkv, D, K, L, dtype, cos_rows)
    A[M - 1, K // 3] = float("nan")  # NaN reaches exactly the last row's outputs
    want_q, want_k, want_v = _want(A, Bs, cos, sin, kc, vc, pos, D)
    kernel = _kernel(M, H, Hkv, D, K, dtype, cos_rows, L, C)
    got_k, got_v = kc.clone(), vc.clone()
    got_q = kernel(A, *Bs, cos, sin, got_k, got_v, torch.tensor([pos]))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for got, want in ((got_q, want_q), (got_k, want_k), (got_v, want_v)):
        torch.testing.assert_close(got, want, equal_nan=True, **tol)
    assert torch.isnan(got_q[M - 1]).all() and not torch.isnan(got_q[: M - 1]).any()
    assert torch.isnan(got_k[M - 1, :, pos]).all() and not torch.isnan(got_k[:, :, :pos]).any()
    assert torch.equal(got_k[:, :, :pos], kc[:, :, :pos]) and torch.equal(got_v[:, :, pos + 1:], vc[:, :, pos + 1:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rotated_and_stored_as_eager_gpu(rng, dtype):
    """Every paired config on the GPU at HF LLaMA's decode shape (32/8 heads of 64, K 2048) and a batch of 4 with
    128-wide heads: every element of q and of both caches as eager's (one rounding of the rotation apart)."""
    from tilefuse.config import default_target

    target = default_target()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    for M, H, Hkv, D, K, cos_rows in ((1, 32, 8, 64, 2048, 1), (4, 8, 2, 128, 1024, 4)):
        L, pos = 300, 257
        A, Bs, cos, sin, kc, vc = (t.cuda() if isinstance(t, torch.Tensor) else tuple(b.cuda() for b in t)
                                   for t in _qkv_case(rng, M, H, Hkv, D, K, L, dtype, cos_rows))
        want = _want(A, Bs, cos, sin, kc, vc, pos, D)
        dt = str(dtype)[6:]
        items = [(gemv.gemv_group(M, (H * D, Hkv * D, Hkv * D), K, A_dtype=dt, extra_shapes=[(cos_rows, D)] * 2 +
                                  [(M, Hkv, L, D)] * 2 + [(1,)], extra_dtypes=[dt] * 4 + ["int64"],
                                  stored=(True, False, False), head_dim=D, rotary_of=[(0, 1), (0, 1), None],
                                  scatter_of=[None, (2, 4), (3, 4)], target=target, **cfg), [-1])
                 for cfg in gemv.get_configs(target, dt, paired=True)]
        for kernel in compile_many(items, target):
            got_k, got_v = kc.clone(), vc.clone()
            got_q = kernel(A, *Bs, cos, sin, got_k, got_v, torch.tensor([pos], device="cuda"))
            for got, w in zip((got_q, got_k, got_v), want):
                torch.testing.assert_close(got, w, **tol)


def test_the_pairs_cover_every_row_once_at_every_config_shape():
    """The rotary weights' row order (pairs ``n``, ``n + D/2`` in a warp) maps the programs' rows onto every weight
    row exactly once, for the GPU configs' warp shapes."""
    for D, N in ((64, 2048), (128, 1024), (16, 64)):
        for cfg in gemv.get_configs(SM90):
            warps, block_N = cfg["threads"] // 32, cfg["block_N"]
            R = block_N // warps
            if R % 2 or N % block_N:
                continue
            half, pairs = D // 2, R // 2
            rows = []
            for bx in range(N // block_N):
                for w in range(warps):
                    for r in range(R):
                        p = (bx * warps + w) * pairs + r % pairs
                        rows.append(p // half * D + p % half + r // pairs * half)
            assert sorted(rows) == list(range(N)), (D, N, cfg)


def test_refusals_name_the_problem():
    kw = {"extra_shapes": [(1, 16)] * 2 + [(1, 2, 8, 16)] + [(1,)], "extra_dtypes": ["float16"] * 3 + ["int64"],
          "head_dim": 16, "target": SM90}
    with pytest.raises(ValueError, match="heads of head_dim"):  # 40 rows are not heads of 16
        gemv.gemv_group(1, (40, 32), 64, rotary_of=[(0, 1), None], scatter_of=[None, (2, 3)], stored=(True, False),
                        **kw)
    with pytest.raises(ValueError, match="no output of its own"):  # a cache store and a C of its own
        gemv.gemv_group(1, (32, 32), 64, rotary_of=[(0, 1), None], scatter_of=[None, (2, 3)], **kw)
    with pytest.raises(ValueError, match="rotary table"):
        gemv.gemv_group(1, (32, 32), 64, rotary_of=[(2, 1), None], scatter_of=[None, (2, 3)], stored=(True, False),
                        **kw)
    with pytest.raises(ValueError, match="whole pairs"):  # one row a warp has no partner
        gemv.gemv_group(1, (32, 32), 64, rotary_of=[(0, 1), None], scatter_of=[None, (2, 3)], stored=(True, False),
                        block_N=4, threads=128, **kw)
    with pytest.raises(ValueError, match="among its"):
        gemv.gemv_group(1, (32, 32), 64, rotary_of=[(0, 9), None], stored=(True, True), **kw)


def test_an_index_outside_the_cache_is_torchs_error_and_stores_nothing(rng):
    """On the c target the runner checks the index on the host first (``runtime.kernels.check_scatters``) with
    torch's message; the kernel itself stores nothing outside the cache."""
    from tilefuse.runtime.kernels import check_scatters

    M, H, Hkv, D, K, L = 1, 2, 1, 8, 16, 4
    A, Bs, cos, sin, kc, vc = _qkv_case(rng, M, H, Hkv, D, K, L, torch.float32, 1)
    kernel = _kernel(M, H, Hkv, D, K, torch.float32, 1, L, C)
    for bad in (L, -1):
        got_k, got_v = kc.clone(), vc.clone()
        kernel(A, *Bs, cos, sin, got_k, got_v, torch.tensor([bad]))
        assert torch.equal(got_k, kc) and torch.equal(got_v, vc)
        with pytest.raises(IndexError, match="out of bounds for dimension 2 with size 4"):
            check_scatters(((1, 2, 2),), [torch.empty(0), kc, torch.tensor([bad])])


def _tiny_llama(layers=3, bias=False):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   attention_bias=bias)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("fold, bias, batch", [(True, False, 1), (False, False, 1), (True, True, 1), (True, False, 3)],
                         ids=["folded", "apart", "qkv_bias", "batch3"])
def test_folded_decode_steps_match_eager_on_c(monkeypatch, fold, bias, batch):
    """HF LLaMA (and its q/k/v-bias form, as Qwen2 has) decoding over a static cache with the gemv kernels run on the
    c target: every layer rotates and stores inside its q/k/v group (the first layer's store kernel also computed the
    step's cos and sin: they move into the step's first elementwise kernel), the caches are the caller's, written in
    place, and the logits of every step are eager's
    (fp32, 1e-4), at one sequence and at three (cos and sin a row each); with ``fold_rotary`` off the stores stay
    kernels of their own and give the same logits."""

    from decode_steps import teacher_forced

    from tilefuse.backend import make_backend
    from tilefuse.config import Options
    from tilefuse.lowering import builders

    monkeypatch.setattr(builders, "GEMV_TARGETS", ("c",))
    torch._dynamo.reset()
    torch.manual_seed(1)
    eager = _tiny_llama(bias=bias)
    compiled = type(eager)(eager.config).eval()
    compiled.load_state_dict(eager.state_dict())
    runners = []
    backend = make_backend(Options(target=C, quiet=True, measure=False, fold_rotary=fold, observer=runners.append))
    compiled.forward = torch.compile(compiled.forward, backend=backend)
    caches = teacher_forced(eager, compiled, torch.randint(1, 256, (batch, 5)), 6, 1e-4, max_cache_len=32)
    assert backend.failures == []
    layers = eager.config.num_hidden_layers
    decode = runners[-1]
    groups = [r for r in decode.plan.regions if r.kind == "gemv_group" and "index_copy" in r.ops]
    stores = [r for r in decode.plan.regions if r.kind == "elementwise" and "index_copy" in r.ops]
    assert (len(groups), len(stores)) == ((layers, 0) if fold else (0, layers))
    assert all(r.backend == "tilelang" and r.ops.count("rotary_embedding") == 2 for r in groups + stores)
    if fold:
        spec = decode.kernels[groups[0].name].spec
        assert dict(spec.params)["rotary_of"][2] is None and len(spec.aliases) == 2
        first = decode.plan.regions[0]  # the step's input-only kernel, now with the cos and sin
        assert first.kind == "elementwise" and {"cos", "sin"} <= set(first.ops) and first.backend == "tilelang"
    for (k0, v0), (k1, v1) in zip(*(((lay.keys, lay.values) for lay in c.layers) for c in caches)):
        torch.testing.assert_close(k1, k0, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v1, v0, rtol=1e-4, atol=1e-4)


def test_a_cache_read_between_the_group_and_its_store_keeps_the_store_apart():
    """The fold moves the cache stores up to the group: where a region between them reads a cache (its old rows),
    the store stays where it was."""
    from types import SimpleNamespace as NS

    from tilefuse.planner.plan import Region
    from tilefuse.planner.rotary_fold import fold_rotary

    def node(name, op, inputs):
        return NS(name=name, op=op, inputs=inputs, outputs=[NS(name=name)])
    graph = NS(inputs=[NS(name=v) for v in ("x", "i", "cache")], constants={}, outputs=(),
               nodes=[node("q", "linear", ("x",)), node("peek", "cast", ("cache",)), node("t", "transpose", ("q",)),
                      node("ic", "index_copy", ("cache", "i", "t"))])
    group = Region("g", "gemv_group", ("q",), ("linear",), ("x",), ("q",))
    peek = Region("p", "elementwise", ("peek",), ("cast",), ("cache",), ("peek",))
    store = Region("s", "elementwise", ("t", "ic"), ("transpose", "index_copy"), ("q", "cache", "i"), ("ic",))
    asked = []

    def why_not(r, g):
        asked.append(r.name)
    regions = [group, peek, store]
    assert fold_rotary(graph, regions, SM90, why_not) == regions and asked == []
    folded = fold_rotary(graph, [group, store, peek], SM90, why_not)
    assert [r.name for r in folded] == ["g", "p"] and folded[0].ops == ("linear", "transpose", "index_copy")
    assert folded[0].outputs == ("ic",) and set(folded[0].inputs) == {"x", "cache", "i"}

"""The flash-attention template against torch's SDPA: every element on ``c`` (fp32), a CUDA compile for
sm_90a (fp16/bf16, no GPU needed), and GPU numerics (marked ``gpu``). Sequence lengths are odd so
every tail path runs. Each operand layout (``TokenRows``: a fused QKV projection read in place, BSHD
tensors, the output written as (B, S, H*D)) is checked the same way."""

import shutil

import pytest
import torch

from tilefuse.config import default_target
from tilefuse.lowering.compile import compile_kernel, compile_many, kernel_source
from tilefuse.lowering.templates import attention

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}
SMALL_C = {"block_M": 16, "block_N": 16}  # several tiles and a tail at these sizes


def inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype=torch.float32, mask_shape=None, device="cpu"):
    def r(*s):
        return torch.randn(s, generator=rng).to(dtype).to(device)
    return r(B, Hq, Sq, D), r(B, Hkv, Skv, D), r(B, Hkv, Skv, D), (r(*mask_shape) if mask_shape else None)


def check(rng, target, B, Hq, Hkv, Sq, Skv, D, *, is_causal=False, scale=None, mask_shape=None, dtype=torch.float32,
          device="cpu", tol=None, window=None, **config):
    f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, is_causal=is_causal, scale=scale, mask_shape=mask_shape,
                                  mask_dtype=str(dtype).split(".")[1], dtype=str(dtype).split(".")[1], target=target,
                                  window=window, **config)
    kernel = compile_kernel(f, target, [-1])
    for _ in range(2):  # fresh inputs each call
        q, k, v, m = inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype, mask_shape, device)
        got = kernel(q, k, v, *([m] if m is not None else []))
        want = attention.reference(q, k, v, m, is_causal=is_causal, scale=scale, window=window)
        torch.testing.assert_close(got, want, **(tol or {"rtol": 1e-5, "atol": 1e-5}))


CASES = {  # name: (B, Hq, Hkv, Sq, Skv, D, kwargs)
    "plain_d16": (2, 3, 3, 20, 29, 16, {}),
    "causal_tail_37": (2, 2, 2, 37, 37, 16, {"is_causal": True}),
    "causal_sq_lt_skv": (1, 2, 2, 19, 40, 16, {"is_causal": True}),
    "gqa_4_2": (2, 4, 2, 33, 33, 16, {}),
    "gqa_causal_d64": (1, 4, 2, 37, 37, 64, {"is_causal": True}),
    "mask_b11s": (2, 2, 2, 21, 37, 16, {"mask_shape": (2, 1, 1, 37)}),
    "mask_full_causal": (1, 2, 1, 37, 37, 16, {"mask_shape": (1, 2, 37, 37), "is_causal": True}),
    "scale_d64": (1, 2, 2, 17, 17, 64, {"scale": 0.3}),
    "sliding_window": (1, 2, 1, 37, 37, 16, {"is_causal": True, "window": 5}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attention_c_matches_sdpa(name, rng):
    *shape, kw = CASES[name]
    check(rng, C, *shape, **kw, **SMALL_C)


PACKED = {  # decode-shaped: a few queries per sequence, the group's heads packed into a program's rows
    "decode_gqa_mask": (2, 8, 2, 1, 37, 16, {"mask_shape": (2, 1, 1, 37)}),
    "decode_3q_full_mask": (2, 8, 2, 3, 40, 16, {"mask_shape": (2, 1, 3, 40)}),
    "decode_mha": (1, 4, 4, 1, 29, 16, {}),
    "decode_causal_tail_rows": (2, 6, 2, 5, 33, 16, {"is_causal": True}),  # 15 rows: a partial second tile of 8
    "decode_mqa_per_head_mask": (1, 8, 1, 2, 50, 64, {"mask_shape": (1, 8, 2, 50)}),
    "decode_sliding_window": (2, 4, 2, 6, 41, 16, {"is_causal": True, "window": 3}),
}


@pytest.mark.parametrize("block_M", [16, 8])
@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_rows_c_match_sdpa(name, block_M, rng):
    *shape, kw = PACKED[name]
    check(rng, C, *shape, **kw, block_M=block_M, block_N=16, pack=True)


def _cache_mask(B, Skv, spans, fill):
    """A (B, 1, 1, Skv) mask that keeps keys ``spans[b] = (first, last)`` of sequence b and hides the rest with
    ``fill``: a static cache's filled part (first 0), a window (first > 0)."""
    m = torch.full((B, 1, 1, Skv), fill)
    for b, (lo, hi) in enumerate(spans):
        m[b, ..., lo:hi + 1] = 0
    return m


def _bounded(B, Hq, Hkv, Sq, Skv, D, bound_keys=True):
    f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, mask_shape=(B, 1, 1, Skv), mask_dtype="float32",
                                  dtype="float32", target=C, block_M=8, block_N=16, pack=True, bound_keys=bound_keys)
    return compile_kernel(f, C, [-1])


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min, -65504.0, -1e4])
def test_bound_keys_read_only_the_kept_keys(fill, rng):
    """A decode step over a static cache: the key tiles (16 keys here) the mask hides entirely are never read (garbage
    there, NaN and inf included, does not reach the output), and the rest give SDPA's answer on the clean cache."""
    B, Hq, Hkv, Sq, Skv, D = 4, 8, 2, 1, 70, 16
    kernel = _bounded(B, Hq, Hkv, Sq, Skv, D)
    spans = [(0, 0), (0, 16), (0, 69), (20, 40)]  # one key; a tile and one key; the whole cache; a window
    for _ in range(2):
        q, k, v, _m = inputs(rng, B, Hq, Hkv, Sq, Skv, D)
        m = _cache_mask(B, Skv, spans, fill)
        want = attention.reference(q, k, v, m)
        dirty_k, dirty_v = k.clone(), v.clone()
        for b, (lo, hi) in enumerate(spans):
            for t in [*range(lo // 16 * 16), *range((hi // 16 + 1) * 16, Skv)]:
                dirty_k[b, :, t] = float("nan") if t % 2 else float("inf")
                dirty_v[b, :, t] = float("-inf") if t % 3 else float("nan")
        torch.testing.assert_close(kernel(q, dirty_k, dirty_v, m), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kernel(q, k, v, m), want, rtol=1e-5, atol=1e-5)


def test_bound_keys_keep_what_the_mask_leaves_in_play(rng):
    """Masks that hide nothing by the bound's rule give the unbounded kernel's answer, bit for bit: additive biases,
    a whole row at one finite fill (softmax then weighs every key), all -inf (0, as the fused kernels give), a NaN
    past the kept keys (NaN, as SDPA gives)."""
    B, Hq, Hkv, Sq, Skv, D = 4, 4, 2, 1, 45, 16
    kernel, plain = _bounded(B, Hq, Hkv, Sq, Skv, D), _bounded(B, Hq, Hkv, Sq, Skv, D, bound_keys=False)
    q, k, v, _m = inputs(rng, B, Hq, Hkv, Sq, Skv, D)
    m = torch.randn(B, 1, 1, Skv, generator=rng) * 30  # ALiBi-like biases, far inside the gap
    m[1] = -65504.0  # every key at the same finite fill
    m[2] = float("-inf")  # every key hidden: 0
    m[3] = float("-inf")
    m[3, ..., :3] = 0
    m[3, ..., 40] = float("nan")  # a NaN past the other keys: NaN, as SDPA gives
    got = kernel(q, k, v, m)
    assert torch.equal(got.nan_to_num(7.0), plain(q, k, v, m).nan_to_num(7.0))
    torch.testing.assert_close(got[0], attention.reference(q, k, v, m)[0], rtol=1e-5, atol=1e-5)
    assert (got[2] == 0).all()
    assert got[3].isnan().all() and attention.reference(q, k, v, m)[3].isnan().all()


def test_bound_keys_on_left_padded_graded_and_nan_masks(rng):
    """The bound on masks whose largest value comes late (40 hidden keys, then kept ones: left padding), that climb in
    steps inside the gap (-15000, -8000, 0: the -15000 keys are hidden beside 0), and with a NaN: SDPA's answer, and
    the keys hidden before a kept run are never read (NaN there does not reach the output)."""
    B, Hq, Hkv, Sq, Skv, D = 3, 4, 2, 1, 64, 16
    kernel = _bounded(B, Hq, Hkv, Sq, Skv, D)
    q, k, v, _m = inputs(rng, B, Hq, Hkv, Sq, Skv, D)
    m = torch.full((B, 1, 1, Skv), -65504.0)
    m[0, ..., 40:50] = 0  # left padding: 40 hidden keys first
    m[1, ..., :10], m[1, ..., 10:20], m[1, ..., 20:30] = -15000.0, -8000.0, 0.0  # climbing inside the gap
    m[2, ..., 5] = float("nan")
    m[2, ..., 33:35] = 3.0
    want = attention.reference(q, k, v, m)
    torch.testing.assert_close(kernel(q, k, v, m)[:2], want[:2], rtol=1e-5, atol=1e-5)
    assert kernel(q, k, v, m)[2].isnan().all() and want[2].isnan().all()  # NaN in the mask: NaN, as SDPA gives
    dirty_k = k.clone()
    dirty_k[0, :, :32] = float("nan")  # tiles 0-1 of row 0: hidden by a full gap before its kept run
    torch.testing.assert_close(kernel(q, dirty_k, v, m)[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fill", [float("-inf"), -65504.0])
def test_bound_keys_scan_past_one_round_of_loads(fill, rng):
    """A mask longer than one round of the bound's scan (``SCAN_UNROLL`` steps a round; on the CPU a step is one lane's
    ``SCAN_RUN`` keys, so 300 keys are three rounds, the last partial): the kept span found in any round, the largest
    value in a later round than the kept keys it hides, and hidden tiles never read."""
    B, Hq, Hkv, Sq, Skv, D = 5, 4, 2, 1, 300, 16
    assert Skv > 2 * attention.SCAN_UNROLL * attention.SCAN_RUN
    kernel = _bounded(B, Hq, Hkv, Sq, Skv, D)
    spans = [(0, 0), (0, 299), (130, 140), (250, 299), (0, 260)]
    q, k, v, _m = inputs(rng, B, Hq, Hkv, Sq, Skv, D)
    m = _cache_mask(B, Skv, spans, fill)
    m[4, ..., :200] = -15000.0  # kept keys of row 4 climb from -15000 to 0 at key 200 (a third round): only the 0s kept
    want = attention.reference(q, k, v, m)
    dirty_k = k.clone()
    for b, (lo, hi) in enumerate(spans):
        first = 200 if b == 4 else lo
        for t in [*range(first // 16 * 16), *range((hi // 16 + 1) * 16, Skv)]:
            dirty_k[b, :, t] = float("nan")
    torch.testing.assert_close(kernel(q, dirty_k, v, m), want, rtol=1e-5, atol=1e-5)


def test_bound_keys_need_a_mask_per_key():
    for kw in ({"mask_shape": (1, 1, 4, 8)}, {"mask_shape": (1, 4, 1, 8)}, {"mask_shape": (1, 1, 1, 8), "is_causal": True},
               {}):
        with pytest.raises(ValueError, match="per key"):
            attention.flash_attention(1, 4, 4, 8, 16, dtype="float32", target=C, pack=True, bound_keys=True, **kw)
    assert attention.per_key_mask((2, 1, 1, 8)) and attention.per_key_mask((8,)) and not attention.per_key_mask(None)
    bounded = attention.decode_configs(SM90, 1, 4, keys_masked=True)
    assert all(c["bound_keys"] for c in bounded) and any(c["threads"] == 32 for c in bounded)
    assert not any(c.get("bound_keys") for c in attention.decode_configs(SM90, 1, 4))


@pytest.mark.parametrize("bound", [True, False])
@pytest.mark.parametrize("splits", [2, 3, 5])
def test_split_keys_combine_to_sdpa(splits, bound, rng):
    """Keys split into parts (a decode step of few sequences over a long cache), each part's normalized output and
    log-sum-exp combined by the second kernel: SDPA's answer, including a sequence whose mask leaves some parts
    nothing (their LSE is -inf, weight 0), one that sees a single key, one fully hidden (0), and the TokenRows
    output layout."""
    B, Hq, Hkv, Sq, Skv, D = 4, 8, 2, 1, 90, 16
    for o_layout in (None, attention.TokenRows(Hq * D, 0)):
        f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, mask_shape=(B, 1, 1, Skv), mask_dtype="float32",
                                      dtype="float32", target=C, block_M=8, block_N=16, pack=True, bound_keys=bound,
                                      splits=splits, split_max=5, o_layout=o_layout)
        kernel = compile_kernel(f, C, [-3, -2, -1])
        q, k, v, _m = inputs(rng, B, Hq, Hkv, Sq, Skv, D)
        m = _cache_mask(B, Skv, [(0, 89), (0, 20), (50, 50), (0, 89)], float("-inf"))
        m[0] += torch.randn(Skv, generator=rng)  # a bias on the whole cache
        m[3] = float("-inf")
        _o_part, lse, got = kernel(q, k, v, m)
        want = attention.reference(q, k, v, m)
        if o_layout is not None:
            got = got.view(B, Sq, Hq, D).transpose(1, 2)
        torch.testing.assert_close(got[:3], want[:3], rtol=1e-5, atol=1e-5)
        assert (got[3] == 0).all() and (lse[:splits, 3] == float("-inf")).all()
        if not (bound and splits == 2):  # 21 keys, 2 tiles: some parts see nothing (bounded, 2 parts take a tile each)
            assert (lse[:splits, 1] == float("-inf")).any()


def test_split_keys_refusals_and_configs():
    with pytest.raises(ValueError, match="split_max"):
        attention.flash_attention(1, 4, 1, 64, 16, dtype="float32", target=C, pack=True, splits=4)
    with pytest.raises(ValueError, match="packed"):
        attention.flash_attention(1, 4, 1, 64, 16, dtype="float32", target=C, splits=2, split_max=4)
    # one sequence, 8 kv heads, 4096 keys: 8 programs would use 8 of 132 SMs; the keys split 16 ways
    first = attention.decode_configs(SM90, 1, 4, True, B=1, Hkv=8, Skv=4096)[0]
    assert first["splits"] == attention.SPLIT_MAX and first["bound_keys"]
    assert "splits" not in attention.decode_configs(SM90, 1, 4, True, B=64, Hkv=8, Skv=4096)[0]  # 512 programs
    assert "splits" not in attention.decode_configs(SM90, 1, 4, True, B=8, Hkv=8, Skv=4096)[0]  # 64: measured a loss
    assert attention.decode_configs(SM90, 1, 4, True, B=2, Hkv=8, Skv=4096)[0]["splits"] == 8
    assert "splits" not in attention.decode_configs(SM90, 1, 4, True, B=1, Hkv=8, Skv=512)[0]  # a short cache
    assert attention.decodes(SM90, 1, 4) and not attention.decodes(C, 1, 4) and not attention.decodes(SM90, 64, 1)


def test_decode_configs_only_for_few_rows_on_gpus():
    assert attention.decode_configs(SM90, 1, 4)[0]["pack"] is True
    assert attention.decode_configs(SM90, 1, 4) == [c for c in attention.config_space(SM90, 64, Sq=1, groups=4)
                                                      if c.get("pack")]
    assert attention.decode_configs(SM90, 17, 1) == [] and attention.decode_configs(SM90, 8, 16) == []
    assert attention.decode_configs(C, 1, 4) == [] and attention.decode_configs({"kind": "metal"}, 1, 4) == []
    with pytest.raises(NotImplementedError, match="Metal"):
        attention.flash_attention(1, 4, 1, 8, 16, dtype="float16", target={"kind": "metal"}, pack=True)


def test_flash_attention_c_default_config(rng):
    check(rng, C, 1, 2, 2, 70, 70, 64, is_causal=True, **attention.get_configs(C)[0])


def test_a_fully_masked_row_is_zero_like_torch(rng):
    f = attention.flash_attention(1, 1, 5, 5, 16, mask_shape=(1, 1, 5, 5), mask_dtype="float32", dtype="float32",
                                  target=C, **SMALL_C)
    q, k, v, _ = inputs(rng, 1, 1, 1, 5, 5, 16)
    m = torch.zeros(1, 1, 5, 5)
    m[0, 0, 2] = float("-inf")
    m[0, 0, 3, :4] = float("-inf")  # only the last key visible: the first tile sees nothing
    got = compile_kernel(f, C, [-1])(q, k, v, m)
    torch.testing.assert_close(got, attention.reference(q, k, v, m), rtol=1e-5, atol=1e-5)
    assert (got[0, 0, 2] == 0).all()  # torch's fused CPU/CUDA SDPA kernels give 0 there (its math path: NaN)


def test_refusals():
    with pytest.raises(ValueError, match="multiple"):
        attention.flash_attention(1, 3, 8, 8, 16, Hkv=2, dtype="float32", target=C)
    with pytest.raises(NotImplementedError, match="TF32"):
        attention.flash_attention(1, 2, 8, 8, 16, dtype="float32", target=SM90)
    with pytest.raises(ValueError, match="broadcast"):
        attention.flash_attention(1, 2, 8, 8, 16, mask_shape=(1, 3, 1, 8), dtype="float32", target=C)


def test_configs_are_the_factory_arguments():
    import inspect

    args = set(inspect.signature(attention.flash_attention).parameters)
    for target in (C, SM90, {"kind": "cuda", "arch": "sm_80"}):
        for cfg in attention.get_configs(target):
            assert set(cfg) <= args


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_flash_attention_compiles_for_sm90a():
    items, names = [], []
    for dtype in ("float16", "bfloat16"):
        for D in (64, 128):
            for causal in (False, True):
                cfg = attention.get_configs(SM90, D)[0]
                items.append((attention.flash_attention(2, 8, 300, 300, D, Hkv=2, is_causal=causal, dtype=dtype,
                                                        target=SM90, **cfg), [-1]))
                names.append((dtype, D, causal))
    items.append((attention.flash_attention(1, 4, 37, 50, 64, is_causal=True, mask_shape=(1, 1, 1, 50),
                                            mask_dtype="float32", dtype="float16", target=SM90,
                                            **attention.get_configs(SM90, 64)[-1]), [-1]))
    names.append("mask")
    # decode: packed rows, a mask over the cache, the keys split in parts for one sequence over a long cache
    for cfg in attention.decode_configs(SM90, 1, 4, True, B=1, Hkv=8, Skv=4096):
        items.append((attention.flash_attention(1, 32, 1, 4096, 64, Hkv=8, mask_shape=(1, 1, 1, 4096),
                                                mask_dtype="float16", dtype="float16", target=SM90,
                                                split_max=attention.SPLIT_MAX, **cfg), [-3, -2, -1]))
        names.append(("packed", cfg["block_M"], cfg["block_N"], cfg.get("splits", 1)))
    for name, k in zip(names, compile_many(items, SM90, return_exceptions=True)):
        assert not isinstance(k, BaseException), f"{name}: {k}"
        assert ("wgmma" if name[0] != "packed" or name[1] == 64 else "mma") in k.get_kernel_source(), name


@pytest.mark.parametrize("name", ["plain_d16", "causal_tail_37", "causal_sq_lt_skv", "scale_d64", "sliding_window"])
def test_scores_scaled_first_match_sdpa(name, rng):
    # the older form (fold_scale=False: scores scaled before the softmax, every tile tested) stays exact for A/B runs
    B, Hq, Hkv, Sq, Skv, D, kw = CASES[name]
    check(rng, C, B, Hq, Hkv, Sq, Skv, D, fold_scale=False, **kw, **attention.cpu_config(Sq, Skv))


@pytest.mark.parametrize("is_causal", [False, True])
def test_negative_scale_keeps_scores_scaled_first(is_causal, rng):
    # the fold takes the row's largest raw score, which a negative scale would turn into the smallest. (The reference
    # is written out: torch's math SDPA scales q and k by sqrt(scale), NaN for a negative one.)
    f = attention.flash_attention(1, 2, 19, 23, 16, is_causal=is_causal, scale=-0.25, dtype="float32", target=C,
                                  **attention.cpu_config(19, 23))
    q, k, v, _ = inputs(rng, 1, 2, 2, 19, 23, 16)
    s = (q @ k.transpose(-1, -2)) * -0.25
    if is_causal:
        s = s.masked_fill(torch.ones(19, 23, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(compile_kernel(f, C, [-1])(q, k, v), s.softmax(-1) @ v, rtol=1e-5, atol=1e-5)


def test_output_staged_through_shared_memory_only_for_whole_row_tiles():
    cfg = attention.get_configs(SM90, 64)[0]
    src = {}
    for name, Sq, kw in (("whole", 384, {}), ("tail", 333, {}), ("off", 384, {"stage_out": False}),
                         ("rows", 384, {"o_layout": attention.TokenRows(8 * 64, 0)})):
        f = attention.flash_attention(2, 8, Sq, Sq, 64, Hkv=2, is_causal=True, dtype="float16", target=SM90,
                                      **{**cfg, **kw})
        src[name] = compile_kernel(f, SM90, [-1]).get_kernel_source()
    assert "tma_store" in src["whole"] and "tma_store" in src["rows"]
    assert "tma_store" not in src["tail"] and "tma_store" not in src["off"]
    gfx942 = {"kind": "hip", "mcpu": "gfx942"}
    hip = attention.flash_attention(2, 8, 384, 384, 64, dtype="float16", target=gfx942,
                                    **attention.get_configs(SM90, 64)[0])
    assert "tma_store" not in kernel_source(hip, gfx942)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_gpu_matches_sdpa(dtype, D, is_causal, rng):
    target = default_target()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    check(rng, target, 2, 8, 2, 333, 333, D, is_causal=is_causal, dtype=dtype, device="cuda", tol=tol,
          **attention.get_configs(target, D)[0])
    check(rng, target, 1, 4, 4, 100, 257, D, mask_shape=(1, 1, 1, 257), dtype=dtype, device="cuda", tol=tol,
          **attention.get_configs(target, D)[-1])
    # multi-query (one kv head) with a per-sequence padding mask, every seed config
    for cfg in attention.get_configs(target, D):
        check(rng, target, 2, 4, 1, 150, 150, D, is_causal=is_causal, mask_shape=(2, 1, 1, 150), dtype=dtype,
              device="cuda", tol=tol, **cfg)
    # rows a multiple of every seed's block_M: the output goes out through shared memory (stage_out), in both layouts
    for cfg in attention.get_configs(target, D):
        check(rng, target, 2, 4, 2, 384, 384, D, is_causal=is_causal, dtype=dtype, device="cuda", tol=tol, **cfg)
    check_layout(rng, target, "qkv", 2, 4, 4, 384, 384, D, is_causal=is_causal, dtype=dtype, device="cuda", tol=tol,
                 **attention.get_configs(target, D)[0])


# ---- operand layouts: q/k/v read in place from token rows, o written as (B, S, H*D) ----------------

def layouts(kind, Hq, Hkv, D) -> dict:
    """Per operand the buffer it lives in, that buffer's row width and the operand's column offset
    (None: a contiguous (B, H, S, D) tensor)."""
    q, kv = Hq * D, Hkv * D
    return {
        "qkv": {"q": ("qkv", q + 2 * kv, 0), "k": ("qkv", q + 2 * kv, q), "v": ("qkv", q + 2 * kv, q + kv),
                "o": ("o", q, 0)},  # GPT-2/ViT: one fused projection
        "bshd": {"q": ("q", q, 0), "k": ("k", kv, 0), "v": ("v", kv, 0), "o": ("o", q, 0)},  # BERT
        "v_rows": {"q": None, "k": None, "v": ("v", kv, 0), "o": ("o", q, 0)},  # LLaMA: rotary q/k are BHSD
        "kv_fused": {"q": None, "k": ("kv", 2 * kv, 0), "v": ("kv", 2 * kv, kv), "o": None},  # cross-attention
        "padded": {"q": ("q", q + 24, 8), "k": ("kv", 2 * kv + 16, 16 + kv), "v": ("kv", 2 * kv + 16, 0),
                   "o": ("o", q, 0)},  # odd offsets, v before k, columns nobody reads
    }[kind]


def check_layout(rng, target, kind, B, Hq, Hkv, Sq, Skv, D, *, is_causal=False, mask_shape=None, dtype=torch.float32,
                 device="cpu", tol=None, **config):
    lay = layouts(kind, Hq, Hkv, D)
    dt = str(dtype).split(".")[1]
    kw = {f"{n}_layout": attention.TokenRows(w, off) for n, spec in lay.items() if spec for _, w, off in [spec]}
    f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, is_causal=is_causal, mask_shape=mask_shape,
                                  mask_dtype=dt, dtype=dt, target=target, **kw, **config)
    kernel = compile_kernel(f, target, [-1])

    def r(*shape):
        return torch.randn(shape, generator=rng).to(dtype).to(device)

    for _ in range(2):  # fresh inputs each call; every buffer column random, read or not
        bufs, args, views = {}, [], []
        for n, H, S in (("q", Hq, Sq), ("k", Hkv, Skv), ("v", Hkv, Skv)):
            if lay[n] is None:
                args.append(r(B, H, S, D))
                views.append(args[-1])
                continue
            name, width, off = lay[n]
            buf = bufs.setdefault(name, r(B, S, width))
            args.append(buf)
            views.append(buf[:, :, off:off + H * D].unflatten(2, (H, D)).transpose(1, 2))
        m = r(*mask_shape) if mask_shape else None
        got = kernel(*args, *([m] if m is not None else []))
        if lay["o"] is not None:
            assert got.shape == (B, Sq, Hq * D)
            got = got.unflatten(2, (Hq, D)).transpose(1, 2)
        want = attention.reference(*views, m, is_causal=is_causal)
        torch.testing.assert_close(got, want, **(tol or {"rtol": 1e-5, "atol": 1e-5}))


LAYOUT_CASES = {  # name: (layout kind, B, Hq, Hkv, Sq, Skv, D, kwargs)
    "qkv_causal_tail_37": ("qkv", 2, 3, 3, 37, 37, 16, {"is_causal": True}),
    "qkv_gqa_causal": ("qkv", 2, 4, 2, 37, 37, 16, {"is_causal": True}),
    "qkv_mask_d64": ("qkv", 1, 2, 2, 33, 33, 64, {"mask_shape": (1, 1, 33, 33)}),
    "bshd_mask_sq_lt_skv": ("bshd", 2, 2, 2, 21, 37, 16, {"mask_shape": (2, 1, 1, 37)}),
    "bshd_gqa_causal_d64": ("bshd", 1, 4, 2, 37, 37, 64, {"is_causal": True}),
    "v_rows_gqa_causal_mask": ("v_rows", 2, 4, 2, 37, 37, 16, {"is_causal": True, "mask_shape": (2, 1, 37, 37)}),
    "kv_fused_causal_sq_lt_skv": ("kv_fused", 2, 2, 1, 19, 40, 16, {"is_causal": True}),
    "padded_offsets": ("padded", 2, 3, 3, 29, 29, 16, {}),
}


@pytest.mark.parametrize("name", sorted(LAYOUT_CASES))
def test_flash_attention_layouts_c_match_sdpa(name, rng):
    kind, *shape, kw = LAYOUT_CASES[name]
    check_layout(rng, C, kind, *shape, **kw, **SMALL_C)


def test_flash_attention_layouts_c_default_config(rng):
    check_layout(rng, C, "qkv", 1, 2, 2, 70, 70, 64, is_causal=True, **attention.get_configs(C)[0])


def test_output_rows_land_in_place_in_a_wider_buffer(rng):
    """With O passed in (no ``out_idx``), the heads land at their columns and nothing else is written."""
    B, H, S, D = 2, 2, 21, 16
    f = attention.flash_attention(B, H, S, S, D, dtype="float32", target=C, o_layout=attention.TokenRows(H * D + 16, 8),
                                  **SMALL_C)
    kernel = compile_kernel(f, C, None)
    q, k, v, _ = inputs(rng, B, H, H, S, S, D)
    out = torch.full((B, S, H * D + 16), 7.0)
    kernel(q, k, v, out)
    want = attention.reference(q, k, v).transpose(1, 2).reshape(B, S, H * D)
    torch.testing.assert_close(out[:, :, 8:8 + H * D], want, rtol=1e-5, atol=1e-5)
    assert (out[:, :, :8] == 7).all() and (out[:, :, 8 + H * D:] == 7).all()


def test_layout_refusals():
    with pytest.raises(ValueError, match="do not fit"):
        attention.flash_attention(1, 2, 8, 8, 16, dtype="float32", target=C, k_layout=attention.TokenRows(48, 24))
    with pytest.raises(ValueError, match="do not fit"):
        attention.flash_attention(1, 2, 8, 8, 16, dtype="float32", target=C, q_layout=attention.TokenRows(32, -1))


def _layout_funcs(target, dtype):
    """(name, prim_func) for each layout kind at GPU shapes: tails, GQA, causal, masks, D 64 and 128."""
    out = []
    for name, (kind, B, Hq, Hkv, Sq, Skv, D, kw) in {
        "qkv": ("qkv", 2, 8, 2, 300, 300, 64, {"is_causal": True}),
        "qkv_d128": ("qkv", 2, 4, 4, 333, 333, 128, {}),
        "qkv_tiny": ("qkv", 2, 4, 4, 17, 17, 16, {"is_causal": True}),  # the zoo models' tiny size
        "bshd_mask": ("bshd", 1, 4, 4, 37, 50, 64, {"mask_shape": (1, 1, 1, 50), "mask_dtype": dtype}),
        "v_rows": ("v_rows", 2, 8, 2, 300, 300, 128, {"is_causal": True}),
        "kv_fused": ("kv_fused", 1, 4, 2, 100, 257, 64, {}),
        "padded": ("padded", 2, 3, 3, 129, 129, 64, {}),
    }.items():
        lay = {f"{n}_layout": attention.TokenRows(w, off) for n, spec in layouts(kind, Hq, Hkv, D).items() if spec
               for _, w, off in [spec]}
        cfg = attention.get_configs(target, D)[0]
        out.append((name, attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, dtype=dtype, target=target, **kw,
                                                    **lay, **cfg)))
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_flash_attention_layouts_compile_for_sm90a():
    funcs = _layout_funcs(SM90, "float16") + [(f"bf16 {n}", f) for n, f in _layout_funcs(SM90, "bfloat16")[:2]]
    kernels = compile_many([(f, [-1]) for _, f in funcs], SM90, return_exceptions=True)
    for (name, _), k in zip(funcs, kernels):
        assert not isinstance(k, BaseException), f"{name}: {k}"
        src = k.get_kernel_source()
        assert "wgmma" in src, name
        if name == "qkv":  # the fused projection is still loaded by TMA (row pitch 16-byte aligned)
            assert "tma_load" in src, name


GPU_LAYOUT_CASES = {  # name: (layout kind, B, Hq, Hkv, Sq, Skv, kwargs)
    "qkv_gqa_causal": ("qkv", 2, 8, 2, 333, 333, {"is_causal": True}),
    "bshd_mask": ("bshd", 1, 4, 4, 100, 257, {"mask_shape": (1, 1, 1, 257)}),
    "v_rows_causal": ("v_rows", 2, 8, 2, 333, 333, {"is_causal": True}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", sorted(GPU_LAYOUT_CASES))
def test_flash_attention_layouts_gpu_match_sdpa(name, D, rng):
    target = default_target()
    kind, B, Hq, Hkv, Sq, Skv, kw = GPU_LAYOUT_CASES[name]
    check_layout(rng, target, kind, B, Hq, Hkv, Sq, Skv, D, dtype=torch.float16, device="cuda",
                 tol={"rtol": 1e-2, "atol": 1e-2}, **kw, **attention.get_configs(target, D)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_packed_rows_gpu_match_sdpa(dtype, rng):
    """Every decode config on the GPU: one and three queries per sequence, a padding mask over the cache, GQA."""
    target = default_target()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    for cfg in attention.decode_configs(target, 3, 4):
        check(rng, target, 3, 16, 4, 1, 300, 64, mask_shape=(3, 1, 1, 300), dtype=dtype, device="cuda", tol=tol, **cfg)
        check(rng, target, 2, 8, 2, 3, 257, 128, mask_shape=(2, 1, 3, 257), dtype=dtype, device="cuda", tol=tol, **cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bounded_decode_configs_gpu_read_only_the_filled_cache(dtype, rng):
    """Every bounded decode config on the GPU, as a static cache decodes: sequences filled to different lengths
    (one key, part of a tile, the whole cache, a window), the unfilled tiles full of NaN and inf, which the kernel
    must never read; HF's fp16 fill (finfo.min) and -inf."""
    target = default_target()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    B, Hq, Hkv, Skv, D = 4, 32, 8, 1000, 64
    spans = [(0, 0), (0, 150), (0, Skv - 1), (300, 700)]
    configs = [c for c in attention.decode_configs(target, 1, Hq // Hkv, keys_masked=True) if c.get("bound_keys")]
    assert configs
    kernels = compile_many([(attention.flash_attention(B, Hq, 1, Skv, D, Hkv=Hkv, mask_shape=(B, 1, 1, Skv),
                                                       mask_dtype=str(dtype)[6:], dtype=str(dtype)[6:], target=target,
                                                       **cfg), [-1]) for cfg in configs], target)
    for cfg, kernel in zip(configs, kernels):
        bn = cfg["block_N"]
        for fill in (torch.finfo(dtype).min, float("-inf")):
            q, k, v, _m = inputs(rng, B, Hq, Hkv, 1, Skv, D, dtype, device="cuda")
            m = _cache_mask(B, Skv, spans, fill).to(dtype).cuda()
            want = attention.reference(q, k, v, m)
            for b, (lo, hi) in enumerate(spans):
                for sl in (slice(0, lo // bn * bn), slice((hi // bn + 1) * bn, Skv)):
                    k[b, :, sl], v[b, :, sl] = float("nan"), float("inf")
            torch.testing.assert_close(kernel(q, k, v, m), want, **tol)


@pytest.mark.gpu
def test_split_decode_configs_gpu_match_sdpa(rng):
    """The split configs on the GPU: one and two sequences over 4096 keys, filled to different lengths (some parts
    see nothing), and one over 10000 (the bound's scan in three rounds of loads, the last partial), GQA 32/8, fp16,
    against SDPA."""
    target = default_target()
    for B, Skv, spans in ((1, 4096, [(0, 4095)]), (2, 4096, [(0, 300), (0, 3000)]), (1, 10000, [(0, 9001)])):
        configs = [c for c in attention.decode_configs(target, 1, 4, True, B=B, Hkv=8, Skv=Skv) if c.get("splits")]
        assert configs, "no split config for a long cache"
        kernels = compile_many([(attention.flash_attention(B, 32, 1, Skv, 64, Hkv=8, mask_shape=(B, 1, 1, Skv),
                                                           mask_dtype="float16", dtype="float16", target=target,
                                                           split_max=attention.SPLIT_MAX, **cfg), [-3, -2, -1])
                                for cfg in configs], target)
        for cfg, kernel in zip(configs, kernels):
            q, k, v, _m = inputs(rng, B, 32, 8, 1, Skv, 64, torch.float16, device="cuda")
            m = _cache_mask(B, Skv, spans, torch.finfo(torch.float16).min).half().cuda()
            torch.testing.assert_close(kernel(q, k, v, m)[-1], attention.reference(q, k, v, m),
                                       rtol=1e-2, atol=1e-2)

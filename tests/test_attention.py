"""The flash-attention template against torch's SDPA: every element on ``c`` (fp32), a CUDA compile for
sm_90a (fp16/bf16, no GPU needed), and GPU numerics (marked ``gpu``). Sequence lengths are odd so
every tail path runs."""

import shutil

import pytest
import torch

from tilefuse.lowering.compile import compile_kernel, compile_many
from tilefuse.lowering.templates import attention

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}
SMALL_C = {"block_M": 16, "block_N": 16}  # several tiles and a tail at these sizes


def inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype=torch.float32, mask_shape=None, device="cpu"):
    def r(*s):
        return torch.randn(s, generator=rng).to(dtype).to(device)
    return r(B, Hq, Sq, D), r(B, Hkv, Skv, D), r(B, Hkv, Skv, D), (r(*mask_shape) if mask_shape else None)


def check(rng, target, B, Hq, Hkv, Sq, Skv, D, *, is_causal=False, scale=None, mask_shape=None, dtype=torch.float32,
          device="cpu", tol=None, **config):
    f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, is_causal=is_causal, scale=scale, mask_shape=mask_shape,
                                  mask_dtype=str(dtype).split(".")[1], dtype=str(dtype).split(".")[1], target=target,
                                  **config)
    kernel = compile_kernel(f, target, [-1])
    for _ in range(2):  # fresh inputs each call
        q, k, v, m = inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype, mask_shape, device)
        got = kernel(q, k, v, *([m] if m is not None else []))
        want = attention.reference(q, k, v, m, is_causal=is_causal, scale=scale)
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
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attention_c_matches_sdpa(name, rng):
    *shape, kw = CASES[name]
    check(rng, C, *shape, **kw, **SMALL_C)


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
    for name, k in zip(names, compile_many(items, SM90, return_exceptions=True)):
        assert not isinstance(k, BaseException), f"{name}: {k}"
        assert "wgmma" in k.get_kernel_source(), name


def _cuda_target() -> dict:
    major, minor = torch.cuda.get_device_capability()
    return {"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == 9 else "")}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_gpu_matches_sdpa(dtype, D, is_causal, rng):
    target = _cuda_target()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    check(rng, target, 2, 8, 2, 333, 333, D, is_causal=is_causal, dtype=dtype, device="cuda", tol=tol,
          **attention.get_configs(target, D)[0])
    check(rng, target, 1, 4, 4, 100, 257, D, mask_shape=(1, 1, 1, 257), dtype=dtype, device="cuda", tol=tol,
          **attention.get_configs(target, D)[-1])


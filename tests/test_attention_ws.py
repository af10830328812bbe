"""The warp-specialized, persistent flash-attention schedule (``flash_attention(ws=True)``, ``attention_ws``): where
it applies, that the configs offer it only there, that it lowers for sm_90a with its overlap and without a barrier
between producer and consumers, and (GPU) its numerics against SDPA over tails, GQA, layouts, many tiles per program
and NaN inputs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from tilefuse.config import Options, default_target
from tilefuse.lowering import lower
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import asks_fast_math, compile_kernel, compile_many, kernel_source
from tilefuse.lowering.templates import attention, attention_ws
from tilefuse.lowering.templates.attention_configs import SHORT_OPTIONS

SM90 = {"kind": "cuda", "arch": "sm_90a"}
SM80 = {"kind": "cuda", "arch": "sm_80"}
C = {"kind": "c"}


@pytest.mark.parametrize("target,kw,ok", [
    (SM90, {}, True),
    (SM90, {"dtype": "bfloat16"}, True),
    (SM90, {"D": 128}, True),
    (SM90, {"scale": 0.1}, True),
    (SM90, {"mask_shape": (1, 1, 1, 64)}, True),  # a padding mask: one value per key (and batch)
    (SM90, {"mask_shape": (4, 1, 1, 64), "mask_dtype": "float32"}, True),
    (SM90, {"mask_shape": (64,), "mask_dtype": "bfloat16"}, True),
    (SM90, {"mask_shape": (4, 1, 64, 64)}, False),  # one per query too
    (SM90, {"mask_shape": (4, 2, 1, 64)}, False),  # one per head
    (SM90, {"mask_shape": (4, 1, 1, 64), "mask_dtype": "bool"}, False),  # (additive masks only)
    (SM90, {"mask_shape": (4, 1, 1, 64), "bound_keys": True}, True),
    (SM90, {"scale": -0.1}, False),
    (SM90, {"window": 8}, False),
    (SM90, {"pack": True}, False),
    (SM90, {"splits": 4}, False),
    (SM90, {"bound_keys": True}, False),
    (SM90, {"D": 256}, False),
    (SM90, {"D": 72}, False),
    (SM90, {"dtype": "float32"}, False),
    (SM90, {"q_layout": (3 * 64 * 3, 0), "k_layout": (3 * 64 * 3, 192), "v_layout": (3 * 64 * 3, 384)}, True),
    (SM90, {"q_layout": (3 * 64 + 4, 2)}, False),  # rows of 4-byte multiples: no TMA descriptor
    (SM90, {"k_layout": (3 * 64 + 8, 4)}, False),
    (SM90, {"out_dtype": "float16"}, True),
    (SM90, {"out_dtype": "float32"}, False),
    (SM80, {}, False),
    (C, {}, False),
    ({"kind": "hip", "mcpu": "gfx942"}, {}, False),
])
def test_eligible(target, kw, ok):
    assert attention_ws.eligible(target, **{"D": 64, **kw}) is ok


def test_flash_attention_ws_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="ws=True needs"):
        attention.flash_attention(1, 2, 64, 64, 64, mask_shape=(1, 1, 64, 64), dtype="float16", target=SM90,
                                  block_M=128, block_N=128, num_stages=2, threads=256, ws=True)
    with pytest.raises(ValueError, match="ws=True needs"):
        attention.flash_attention(1, 2, 64, 64, 64, dtype="float16", target=SM80, ws=True)
    with pytest.raises(ValueError, match="nothing to compute"):
        attention.flash_attention(0, 2, 64, 64, 64, dtype="float16", target=SM90, **_ws_configs(64)[0])
    with pytest.raises(ValueError, match="64 rows each"):
        attention.flash_attention(1, 2, 64, 64, 64, dtype="float16", target=SM90, block_M=128, block_N=128,
                                  num_stages=2, threads=384, ws=True)


def _spec(**kw) -> KernelSpec:
    params = {"B": 2, "Hq": 4, "Sq": 256, "Skv": 256, "D": 64, "dtype": "float16", **kw}
    return KernelSpec("flash_attention", tuple(sorted(params.items())), (-1,), (), ())


def test_configs_offer_ws_only_where_it_applies():
    ws = [c for c in attention.get_configs(SM90, 64, ws=True) if c.get("ws")]
    assert ws and attention.get_configs(SM90, 64, ws=True)[0] == ws[0]  # the default pick
    assert not any(c.get("ws") for c in attention.get_configs(SM90, 64))
    assert [c for c in attention.get_configs(SM90, 128, ws=True) if c.get("ws")]
    assert lower.default_config(_spec(), SM90).get("ws")
    assert lower.default_config(_spec(is_causal=True, Hkv=2), SM90).get("ws")
    odd_rows = {"q_layout": attention.TokenRows(4 * 64 + 4, 2)}
    for kw in ({"mask_shape": (2, 1, 256, 256)}, {"scale": -1.0},
               {"is_causal": True, "window": 16}, odd_rows):
        assert not any(c.get("ws") for c in lower.config_space(_spec(**kw), SM90)), kw
    for target in (SM80, C):
        assert not any(c.get("ws") for c in lower.config_space(_spec(), target))
    # a padding mask takes the ws schedule (measured on the H200, 2026-12-05), bounded by it, never for a decode step
    default = lower.default_config(_spec(), SM90)
    assert default["fast_math"] is True  # (the measured default of the ws seeds)
    assert lower.default_config(_spec(mask_shape=(2, 1, 1, 256)), SM90) == {**default, "bound_keys": True}
    assert not lower.default_config(_spec(mask_shape=(2, 1, 256, 256)), SM90).get("ws")
    decode = _spec(Sq=1, Skv=512, Hkv=1, mask_shape=(2, 1, 1, 512))
    assert not any(c.get("ws") for c in lower.config_space(decode, SM90))


# (B, Hq, Hkv, Sq, Skv, D, kwargs): tails in rows and keys, GQA, causal with Sq != Skv, fused-QKV token rows, and
# more tiles than SMs (each program walks several, the stage ring carried across them)
CASES = {
    "tails_gqa_causal": (2, 8, 2, 333, 333, 64, {"is_causal": True}),
    "whole_tiles": (2, 4, 2, 384, 384, 64, {}),
    "sq_lt_skv": (1, 4, 4, 100, 257, 64, {}),
    "causal_sq_gt_skv": (1, 4, 1, 300, 100, 64, {"is_causal": True}),
    "d128_causal_tail": (2, 4, 2, 200, 200, 128, {"is_causal": True}),
    "many_tiles_causal": (4, 16, 4, 1024, 1024, 64, {"is_causal": True}),
    "many_tiles_d128": (4, 16, 16, 768, 768, 128, {"scale": 0.05}),
    "vit_tokens": (4, 12, 12, 197, 197, 64, {}),
}


def _qkv_rows(Hq, Hkv, D) -> dict:
    q, kv = Hq * D, Hkv * D
    w = q + 2 * kv
    return {"q_layout": attention.TokenRows(w, 0), "k_layout": attention.TokenRows(w, q),
            "v_layout": attention.TokenRows(w, q + kv), "o_layout": attention.TokenRows(q, 0)}


def _ws_configs(D, **variant):
    """The ws seeds, each with ``variant``'s schedule options (``pingpong``, ``pair_rows``, ``late_store``)."""
    return [{**c, **variant} for c in attention.get_configs(SM90, D, ws=True) if c.get("ws")]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_ws_lowers_for_sm90a_with_the_overlap():
    funcs = []
    for name, (B, Hq, Hkv, Sq, Skv, D, kw) in CASES.items():
        for cfg in _ws_configs(D):
            funcs.append((name if Skv > cfg["block_N"] else f"{name} (one key tile)", attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, dtype="float16", target=SM90,
                                                          **kw, **cfg)))
    funcs.append(("qkv", attention.flash_attention(2, 8, 384, 384, 64, Hkv=2, is_causal=True, dtype="bfloat16",
                                                   target=SM90, **_qkv_rows(8, 2, 64), **_ws_configs(64)[0])))
    kernels = compile_many([(f, [-1]) for _, f in funcs], SM90, return_exceptions=True)
    for (name, _), k in zip(funcs, kernels):
        assert not isinstance(k, BaseException), f"{name}: {k}"
        src = k.get_kernel_source()
        assert "tma_load" in src and "warpgroup_reg_alloc" in src, name
        # the overlap: a tile's scores waited for while the previous tile's P V still runs (no key tile before the
        # first: a single tile has none)
        assert ("wait_wgmma<1>" in src) != name.endswith("(one key tile)"), name
        # one block-wide barrier, after the mbarriers' init: one between the warp groups' branches would hang
        assert src.count("__syncthreads()") == 1, name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("variant", [{}, {"pingpong": True}, {"pair_rows": True}, {"late_store": True},
                                     {"double_q": True}, {"chain": True}, {"chain": True, "pair_rows": True,
                                                                           "double_q": True},
                                     {"chain": True, "late_store": True, "mask_shape": (2, 1, 1, 1024),
                                      "mask_dtype": "float16", "bound_keys": True},
                                     {"chain": True, "late_store": True, "fast_math": True},
                                     {"fast_math": True, "exp_poly": 4}, {"fast_math": True, "pin_softmax": True},
                                     {"fast_math": True, **SHORT_OPTIONS},
                                     {"fast_math": True, **SHORT_OPTIONS, "lean_producer": True},
                                     {"pin_softmax": True, "pair_rows": True, "mask_shape": (2, 1, 1, 1024),
                                      "mask_dtype": "float16", "bound_keys": True}])
@pytest.mark.parametrize("D,is_causal,cfg", [(64, True, 0), (64, False, 1), (128, True, 0)])
def test_ws_wgmmas_are_not_serialized_by_ptxas(D, is_causal, cfg, variant, tmp_path):
    """ptxas keeps the two products' WGMMAs asynchronous: it serializes them (warnings C7513/C7514, "wgmma.mma_async
    instructions are serialized") when it cannot prove the registers a WGMMA reads or writes untouched until its wait,
    as a branch on the key tile around the waits once made it do (18% slower at 8192 tokens)."""
    import tilelang.contrib.nvcc as tl_nvcc

    f = attention.flash_attention(2, 8, 1024, 1024, D, is_causal=is_causal, dtype="float16", target=SM90,
                                  **_ws_configs(D, **variant)[cfg])
    src = tmp_path / "k.cu"
    src.write_text(kernel_source(f, SM90))
    cmd = [tl_nvcc.get_nvcc_compiler(), "-std=c++17", "-O3", "-arch=sm_90a", "-cubin", "-Xptxas", "-v",
           f"-I{tl_nvcc.TILELANG_TEMPLATE_PATH}", f"-I{tl_nvcc.CUTLASS_INCLUDE_DIR}", "-DENABLE_BF16", str(src), "-o",
           str(tmp_path / "k.cubin")] + (["--use_fast_math"] if asks_fast_math(f) else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "Used" in log and "registers" in log  # (ptxas reported on the kernel)
    assert "serialized" not in log and "C7513" not in log and "C7514" not in log, log[-3000:]
    assert "0 bytes spill stores" in log, log[-3000:]


def test_ws_tiles_past_shared_memory_are_a_clear_error():
    """Tiles whose buffers overflow an SM's shared memory (D 128, 160 keys, two Q buffers: 256 KB) are refused when
    the kernel is built, not left to a launch the driver refuses (as a sweep of wider key tiles met on the H100)."""
    with pytest.raises(ValueError, match="need 256 KB of shared memory; the target has 227 KB"):
        attention.flash_attention(2, 8, 1024, 1024, 128, dtype="float16", target=SM90,
                                  **{**_ws_configs(128)[0], "block_N": 160, "double_q": True})


def test_lean_producer_loads_from_one_warp():
    """``lean_producer``: only the producer warp group's first warp walks the loads (the others leave after giving up
    their registers), so the "full" barriers count 32 arrivals, not 128; the consumers' "empty" ones are unchanged."""
    def source(**kw):
        return kernel_source(attention.flash_attention(2, 8, 1024, 1024, 64, dtype="float16", target=SM90,
                                                       **_ws_configs(64, **kw)[0]), SM90)
    plain, lean = source(), source(lean_producer=True)
    threads = _ws_configs(64)[0]["threads"]
    assert f"if (((int)threadIdx.x) < {threads + 32}) {{" in lean and "tl_shuffle_elect<32>" in lean
    assert f"< {threads + 32})" not in plain and "tl_shuffle_elect<32>" not in plain
    for name in ("q_full", "k_full", "v_full"):
        assert f"{name}[0].init(32);" in lean and f"{name}[0].init(128);" in plain, name
    for name in ("q_empty", "k_empty", "v_empty"):
        assert f"{name}[0].init({threads});" in lean and f"{name}[0].init({threads});" in plain, name
    assert lean.count("warpgroup_reg_dealloc") == plain.count("warpgroup_reg_dealloc") == 1


@pytest.mark.parametrize("cfg", [0, 1])
def test_pingpong_takes_turns_through_named_barriers(cfg):
    """``pingpong``: each consumer warp group waits for its turn (``bar.sync`` on barrier 12 + its index, with the
    previous group's 128 arrivals) before issuing its products and passes the turn on after (``bar.arrive``), the
    last group opening the first turn; the products are issued in the same places. Without it, no turn barrier."""
    def source(pp):
        return kernel_source(attention.flash_attention(2, 8, 1024, 1024, 64, is_causal=True, dtype="float16",
                                                       target=SM90, **_ws_configs(64, **pp)[cfg]), SM90)
    plain, pp = source({}), source({"pingpong": True})
    groups = _ws_configs(64)[cfg]["threads"] // 128
    turn = "tl::__sync_thread_partial(((((int)threadIdx.x) >> 7) + 12), 256);"
    passes = "(((((int)threadIdx.x) >> 7) + 1) & 1) + 12" if groups == 2 else "(((((int)threadIdx.x) >> 7) + 1) % 3) + 12"
    assert turn not in plain and "__named_barrier_arrive" not in plain
    # three issue points per key-tile walk: the first tile, the loop, the last P V
    assert pp.count(turn) == 3 and pp.count(f"tl::__named_barrier_arrive(({passes}), 256);") == 3
    assert f"if ((((int)threadIdx.x) >> 7) == {groups - 1}) {{\n      tl::__named_barrier_arrive(12, 256);" in pp
    assert pp.count("wgmma_ss") == plain.count("wgmma_ss") and pp.count("wgmma_rs") == plain.count("wgmma_rs")
    with pytest.raises(ValueError, match="exp_poly, pin_softmax and lean_producer are options of ws=True"):
        attention.flash_attention(1, 2, 64, 64, 64, dtype="float16", target=SM90, pingpong=True)


def _work(order: attention_ws.TileOrder, block_M=128, block_N=128, Sq=None):
    """Every program's key tiles walked, from ``order.at`` evaluated on ints; checks each tile is computed once."""
    Sq = Sq or order.nbx * block_M
    seen, load = [], []
    for pid in range(order.grid):
        load.append(0)
        for t in range(order.steps):
            live, bx, h, b = order.at(pid, t, select=lambda c, a, z: a if c else z, both=lambda a, z: a and z)
            if live:
                seen.append((bx, h, b))
                m0 = bx * block_M
                load[-1] += -(-min(Sq, m0 + block_M) // block_N) if order.is_causal else -(-Sq // block_N)
    every = [(i, h, b) for b in range(order.B) for h in range(order.Hq) for i in range(order.nbx)]
    assert sorted(seen) == sorted(every), order
    return max(load) / (sum(load) / len(load))


@pytest.mark.parametrize("nbx,Hq,B,sms", [(4, 16, 32, 132), (8, 12, 8, 132), (5, 3, 2, 132), (5, 7, 3, 4), (1, 4, 2, 132),
                                          (2, 1, 1, 132), (16, 16, 8, 132), (64, 32, 2, 132), (3, 5, 7, 8), (3, 4, 2, 8),
                                          (7, 1, 1, 132)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tile_order_computes_every_tile_once_and_pairs_balance_causal_work(nbx, Hq, B, sms, is_causal):
    plain = attention_ws.TileOrder.make(nbx, Hq, B, is_causal, sms, pair=False)
    paired = attention_ws.TileOrder.make(nbx, Hq, B, is_causal, sms, pair=True)
    assert paired.pair == (is_causal and nbx > 1) and plain.grid <= sms and paired.grid <= sms
    before, after = _work(plain), _work(paired)
    if paired.pair and (nbx % 2 == 0 or Hq * B % 2 == 0):  # equal pairs: only the last round's count differs
        rounds = paired.steps // 2
        assert after <= rounds / (paired.slots / paired.grid) + 1e-9, (before, after)
    if (nbx, Hq, B, is_causal) == (4, 16, 32, True):  # 512 tokens, BERT-large-like heads: 1.65x -> 1.03x
        assert round(before, 2) == 1.65 and after < 1.04
    for order in (plain, paired):  # the chained schedule walks the first live_steps(pid) steps: no gaps before them
        assert order.gaps == (order.pair and nbx % 2 == 1 and Hq * B % 2 == 1)
        if order.gaps:
            continue
        for pid in range(order.grid):
            lives = [order.at(pid, t, select=lambda c, a, z: a if c else z, both=lambda a, z: a and z)[0]
                     for t in range(order.steps)]
            n = order.live_steps(pid)
            assert n >= 1 and lives == [True] * n + [False] * (order.steps - n), (pid, lives)


def test_chain_issues_each_next_tiles_first_scores_under_the_last_p_v():
    def source(S=512, causal=False, **kw):
        return kernel_source(attention.flash_attention(32, 16, S, S, 64, is_causal=causal, dtype="float16",
                                                       target=SM90, **_ws_configs(64, **kw)[0]), SM90)
    chain, plain = source(chain=True), source()
    body, plain_body = (k[k.index("tl::warpgroup_reg_alloc"):] for k in (chain, plain))
    # one overlapped wait per key-tile loop (the tile loop's and the last tile's) and one in the tail between tiles;
    # the plain schedule's only one is its key-tile loop's
    assert body.count("tl::wait_wgmma<1>();") == 3 and plain_body.count("tl::wait_wgmma<1>();") == 1
    # the tile loop runs over the program's live steps but the last (512 rows: 4 row tiles x 16 heads x 32 = 2048
    # tiles over 132 programs), and stores each tile's O once the next tile's first scores are in
    assert "< (((2179 - ((int)blockIdx.x)) / 132) - 1); ++t" in body
    tail = body[body.index("q_full[0].wait(((t_1 + 1) & 1));"):]
    assert tail.index("tl::wait_wgmma<1>();") < tail.index("tl::wait_wgmma<0>();") < tail.index("tl::tma_store(")
    # paired steps of an odd head count over odd row tiles have gaps: the chained schedule takes them unpaired
    odd = dict(block_M=128, block_N=128, num_stages=2, threads=256, ws=True, chain=True, is_causal=True,
               dtype="float16", target=SM90)
    assert (kernel_source(attention.flash_attention(1, 3, 640, 640, 64, pair_rows=True, **odd), SM90)
            == kernel_source(attention.flash_attention(1, 3, 640, 640, 64, **odd), SM90))
    assert source(640, True, chain=True, pair_rows=True) != source(640, True, chain=True)  # (even heads: paired)


def test_pair_rows_counts_q_loads_and_leaves_other_kernels_alone():
    def source(S, causal, **kw):
        return kernel_source(attention.flash_attention(2, 8, S, S, 64, is_causal=causal, dtype="float16",
                                                       target=SM90, **_ws_configs(64, **kw)[0]), SM90)
    paired = source(640, True, pair_rows=True)  # 5 row tiles: the middle one has no second step
    # (the consumers' wait, in the tile's macro: its count argument)
    assert "qn = (qn + 1);" in paired and "int count = qn;" in paired and "q_full[0].wait((count & 1));" in paired
    assert "qn" not in source(640, True)
    assert source(640, False, pair_rows=True) == source(640, False)  # (no causal work to balance)


def test_ws_stages_the_output_only_for_whole_row_tiles():
    cfg = _ws_configs(64)[1]  # 128 rows
    whole = kernel_source(attention.flash_attention(2, 4, 384, 384, 64, dtype="float16", target=SM90, **cfg), SM90)
    tail = kernel_source(attention.flash_attention(2, 4, 333, 333, 64, dtype="float16", target=SM90, **cfg), SM90)
    assert "tma_store" in whole and "tma_store" not in tail


def _func(B, Hq, Hkv, Sq, Skv, D, dtype, cfg, *, is_causal=False, scale=None, layout=False, **_):
    lay = _qkv_rows(Hq, Hkv, D) if layout else {}
    return attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, is_causal=is_causal, scale=scale,
                                     dtype=str(dtype).split(".")[1], target=SM90, **lay, **cfg)


def _check(rng, B, Hq, Hkv, Sq, Skv, D, dtype, cfg, *, is_causal=False, scale=None, layout=False, nan=False,
           kernel=None):
    if kernel is None:
        f = _func(B, Hq, Hkv, Sq, Skv, D, dtype, cfg, is_causal=is_causal, scale=scale, layout=layout)
        kernel = compile_kernel(f, default_target(), [-1])
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    for _ in range(2):  # fresh inputs each call
        def r(*s):
            return torch.randn(s, generator=rng).to(dtype).cuda()
        q, k, v = r(B, Hq, Sq, D), r(B, Hkv, Skv, D), r(B, Hkv, Skv, D)
        if nan:  # a NaN query row (that row NaN) and a NaN key (its whole head NaN), as SDPA gives
            q[0, 0, Sq // 2, 3] = float("nan")
            k[-1, -1, Skv - 1, 0] = float("nan")
        want = attention.reference(q, k, v, is_causal=is_causal, scale=scale)
        if layout:
            qkv = torch.cat([t.transpose(1, 2).reshape(B, -1, t.shape[1] * D) for t in (q, k, v)], dim=-1)
            got = kernel(qkv, qkv, qkv).view(B, Sq, Hq, D).transpose(1, 2)
        else:
            got = kernel(q, k, v)
        torch.testing.assert_close(got, want, equal_nan=nan, **tol)
        if nan:  # (causal: only the last row sees the last key)
            assert got[0, 0, Sq // 2].isnan().all() and got[-1, -1, -1].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_ws_gpu_matches_sdpa(name, dtype, rng):
    B, Hq, Hkv, Sq, Skv, D, kw = CASES[name]
    for cfg in _ws_configs(D):
        _check(rng, B, Hq, Hkv, Sq, Skv, D, dtype, cfg, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_ws_gpu_fused_qkv_rows_and_nan(D, rng):
    cfg = _ws_configs(D)[0]
    _check(rng, 2, 8, 2, 384, 384, D, torch.float16, cfg, is_causal=True, layout=True)
    _check(rng, 2, 4, 4, 300, 300, D, torch.float16, cfg, nan=True)
    _check(rng, 2, 4, 4, 300, 300, D, torch.float16, cfg, is_causal=True, nan=True)


VARIANTS = {"pingpong": {"pingpong": True}, "pair_rows": {"pair_rows": True}, "late_store": {"late_store": True},
            "double_q": {"double_q": True}, "chain": {"chain": True},
            "chain_pairs": {"chain": True, "pair_rows": True, "double_q": True}, "fast_math": {"fast_math": True},
            "exp_poly": {"fast_math": True, "exp_poly": 4}, "exp_poly_half": {"fast_math": True, "exp_poly": 2},
            "pin_softmax": {"fast_math": True, "pin_softmax": True},
            "short_keys": {"fast_math": True, **SHORT_OPTIONS},  # (the default lead up to SHORT_KEYS keys)
            "lean_producer": {"fast_math": True, "lean_producer": True},
            "short_keys_lean": {"fast_math": True, **SHORT_OPTIONS, "lean_producer": True},
            "all": {"pingpong": True, "pair_rows": True, "late_store": True, "double_q": True, "chain": True,
                    "fast_math": True}}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_schedule_variants_gpu_match_sdpa(variant, rng):
    """The ping-pong schedule and the paired row tiles over every case (fp16, each ws seed; bf16 and the fused-QKV
    rows and NaN inputs on the first; pair_rows on the causal cases, more rounds than one in some), all compiled in
    parallel first. A turn or a Q buffer that never comes would hang here: run it under a timeout."""
    runs = []
    for name, (B, Hq, Hkv, Sq, Skv, D, kw) in sorted(CASES.items()):
        if variant in ("pair_rows", "chain_pairs") and not kw.get("is_causal"):
            continue
        for i, cfg in enumerate(_ws_configs(D, **VARIANTS[variant])):
            runs.append(((B, Hq, Hkv, Sq, Skv, D, torch.float16, cfg), kw))
            if i == 0:
                runs.append(((B, Hq, Hkv, Sq, Skv, D, torch.bfloat16, cfg), kw))
    runs.append(((8, 16, 16, 640, 640, 64, torch.float16, _ws_configs(64, **VARIANTS[variant])[0]),
                 {"is_causal": True}))  # 5 row tiles (a middle one), 640 tiles over 132 programs
    for D in (64, 128):
        cfg = _ws_configs(D, **VARIANTS[variant])[0]
        runs.append(((2, 8, 2, 384, 384, D, torch.float16, cfg), {"is_causal": True, "layout": True}))
        runs.append(((2, 4, 4, 300, 300, D, torch.float16, cfg), {"is_causal": True, "nan": True}))
    kernels = compile_many([(_func(*a, **kw), [-1]) for a, kw in runs], default_target(), return_exceptions=True)
    for (a, kw), k in zip(runs, kernels):
        assert not isinstance(k, BaseException), f"{a[:6]} {kw}: {k}"
        _check(rng, *a, **kw, kernel=k)


def _padding_mask(rng, B, Skv, dtype, shape=None, fill=None, empty=None):
    """An additive padding mask, ``(B, 1, 1, Skv)`` unless ``shape``: batch 0 sees every key, the others a random
    prefix of at least one (BERT's); ``fill`` for the hidden keys (the dtype's most negative value by default);
    ``empty``: a batch that sees no key."""
    keep = torch.ones(B, Skv, dtype=torch.bool)
    for b in range(1, B):
        keep[b, int(torch.randint(1, Skv + 1, (1,), generator=rng)):] = False
    if empty is not None:
        keep[empty] = False
    mask = torch.zeros(B, Skv, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min if fill is None else fill)
    return mask.reshape(shape or (B, 1, 1, Skv)).cuda()


# (B, Hq, Hkv, Sq, Skv, D, q/k/v dtype, mask dtype, mask shape (None: (B, 1, 1, Skv)), fill, empty batch, kwargs)
MASKED = {
    "bert": (4, 12, 12, 512, 512, 64, torch.float16, torch.float16, None, None, None, {}),
    "tails_gqa_causal": (2, 8, 2, 333, 333, 64, torch.float16, torch.float16, None, None, None, {"is_causal": True}),
    "d128_inf_empty_batch": (3, 4, 4, 200, 200, 128, torch.float16, torch.float32, None, float("-inf"), 1, {}),
    "one_row_bf16": (1, 4, 4, 100, 257, 64, torch.bfloat16, torch.bfloat16, (257,), None, None, {"scale": 0.3}),
    # every key of batch 2 hidden by a finite fill: its rows weigh the keys evenly, as SDPA does (no bound there)
    "finite_empty_batch": (3, 4, 2, 300, 300, 64, torch.float16, torch.float16, None, None, 2, {"is_causal": True}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [{}, {"chain": True}, {"bound_keys": True},
                                     {"chain": True, "bound_keys": True, "fast_math": True},
                                     {"bound_keys": True, "fast_math": True, "pin_softmax": True},
                                     {"bound_keys": True, "fast_math": True, "exp_poly": 4},
                                     {"bound_keys": True, "fast_math": True, **SHORT_OPTIONS},
                                     {"bound_keys": True, "fast_math": True, **SHORT_OPTIONS, "lean_producer": True}])
def test_ws_gpu_padding_mask_matches_sdpa(variant, rng):
    """A padding mask added to every key tile's scores, in each layout of the mask, with the chained schedule and the
    key bound too; a batch whose keys are all -inf gives 0 (the template's and torch's fused kernels' convention),
    the others match SDPA (a batch hidden by a finite fill weighs its keys evenly)."""
    runs = []
    for name, (B, Hq, Hkv, Sq, Skv, D, dt, mdt, shape, fill, empty, kw) in sorted(MASKED.items()):
        mask = _padding_mask(rng, B, Skv, mdt, shape, fill, empty)
        f = attention.flash_attention(B, Hq, Sq, Skv, D, Hkv=Hkv, dtype=str(dt).split(".")[1], target=SM90,
                                      mask_shape=tuple(mask.shape), mask_dtype=str(mdt).split(".")[1], **kw,
                                      **_ws_configs(D, **variant)[0])
        runs.append((name, f, (B, Hq, Hkv, Sq, Skv, D, dt), mask, fill, empty, kw))
    kernels = compile_many([(f, [-1]) for _, f, *_ in runs], default_target(), return_exceptions=True)
    for (name, _, (B, Hq, Hkv, Sq, Skv, D, dt), mask, fill, empty, kw), kernel in zip(runs, kernels):
        assert not isinstance(kernel, BaseException), f"{name}: {kernel}"
        assert "Mask" in kernel.get_kernel_source(), name
        q, k, v = (torch.randn(B, h, s, D, generator=rng).to(dt).cuda() for h, s in ((Hq, Sq), (Hkv, Skv), (Hkv, Skv)))
        got = kernel(q, k, v, mask)
        want = attention.reference(q, k, v, mask, **kw)
        if empty is not None and fill == float("-inf"):  # (SDPA's math form gives NaN there)
            assert (got[empty] == 0).all(), name
            keep = [b for b in range(B) if b != empty]
            got, want = got[keep], want[keep]
        tol = {"rtol": 2e-2, "atol": 2e-2} if dt == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
        torch.testing.assert_close(got, want, **tol, msg=lambda m, name=name: f"{name}: {m}")


def test_a_padding_mask_is_added_to_every_key_tile():
    def source(**kw):
        return kernel_source(attention.flash_attention(4, 12, 512, 512, 64, dtype="float16", target=SM90,
                                                       **_ws_configs(64)[0], **kw), SM90)
    masked, plain = source(mask_shape=(4, 1, 1, 512), mask_dtype="float16"), source()
    body = masked[masked.index("tl::warpgroup_reg_alloc<240>"):]
    loop = body[body.index("for (int k_1 = 1; k_1 < 4; ++k_1)"):]
    # read in the key-tile loop (not only at the edges: 512 keys fill four tiles), the scores then in the log2 domain
    assert "Mask" in loop[:loop.index("tl::wait_wgmma<0>();")]
    assert "const half_t* __restrict__ Mask" in masked and "Mask" not in plain
    # a row that sees nothing: 0 stands in for its max and its output is 0, not 0 / 0
    assert re.search(r"if \(\(m_cur\[i_\d+\] == -CUDART_INF_F\)\)", body)
    assert re.search(r"if \(\(l_sum\[[^]]+\] == 0x0p\+0f", body)


def test_fast_math_marks_the_kernel_for_nvccs_fast_math(monkeypatch):
    """``fast_math``: the PrimFunc carries the mark (through the function cache's JSON too), and ``compile_kernel``
    asks TileLang for ``--use_fast_math`` (``tl.enable_fast_math``) for it alone."""
    import tilelang
    import tvm

    from tilefuse.lowering import compile as compile_mod
    from tilefuse.lowering import func_cache

    def func(**kw):
        return attention.flash_attention(2, 4, 256, 256, 64, dtype="float16", target=SM90,
                                         **{**_ws_configs(64)[0], **kw})
    fast, plain = func(fast_math=True), func(fast_math=False)
    assert compile_mod.asks_fast_math(fast) and not compile_mod.asks_fast_math(plain)
    assert compile_mod.asks_fast_math(func_cache.load_func(tvm.ir.save_json(fast)))
    assert kernel_source(fast, SM90) == kernel_source(plain, SM90)  # (the source is the same; nvcc's flags differ)
    seen = []
    monkeypatch.setattr(tilelang, "compile", lambda f, **kw: seen.append(kw.get("pass_configs")) or object())
    monkeypatch.setattr(compile_mod, "link_now", lambda kernel: None)
    compile_kernel(fast, SM90, [-1])
    compile_kernel(plain, SM90, [-1])
    assert seen[0] == {"tl.enable_fast_math": True} and not seen[1]
    with pytest.raises(ValueError, match="options of ws=True"):
        attention.flash_attention(2, 4, 256, 256, 64, dtype="float16", target=SM90, fast_math=True)


def test_bound_keys_scans_each_batchs_mask_before_the_warp_groups_part():
    def source(**kw):
        return kernel_source(attention.flash_attention(32, 12, 512, 512, 64, dtype="float16", target=SM90,
                                                       mask_shape=(32, 1, 1, 512), mask_dtype="float16",
                                                       **_ws_configs(64)[0], **kw), SM90)
    bounded, plain = source(bound_keys=True), source()
    split = bounded.index("tl::warpgroup_reg_dealloc")
    head, body = bounded[:split], bounded[split:]
    # the scan (the largest value, then the last key above it minus the gap), a bound per batch, then one more
    # block-wide barrier before the warp groups part (and none after)
    assert "__shfl_xor_sync" in head and "0x1.388p+13f" in head and "bound_s" in head
    assert head.count("__syncthreads()") == 2 and "__syncthreads()" not in body and plain.count("__syncthreads()") == 1
    # producer and consumers walk the same bounded count: the batch's bound read into a register first
    assert body.count("kn[0] = min(4, ((int*)bound_s)[") == 2 and "bound_s" not in plain
    with pytest.raises(ValueError, match="bound_keys reads a padding mask"):
        attention_ws.flash_attention_ws(2, 4, 256, 256, 64, Hkv=4, is_causal=False, scale=0.125, dtype="float16",
                                        out_dtype="float16", block_M=128, block_N=128, num_stages=2, threads=256,
                                        target=SM90, shapes=((2, 4, 256, 64),) * 4, layouts=(None,) * 4,
                                        bound_keys=True)


def test_the_zoo_berts_padding_mask_takes_the_ws_schedule():
    """The zoo BERT's attention, planned for sm_90a: a (B, 1, 1, S) fp16 mask and token-row operands; its default
    config is the ws schedule bounded by the mask, which lowers with the mask as a parameter."""
    from tilefuse import models
    from tilefuse.capture import capture_graphs
    from tilefuse.lowering.dispatch import build
    from tilefuse.pipeline import plan

    (graph,) = capture_graphs(*models.build("bert", "tiny", dtype=torch.float16))
    p = plan(graph, SM90)
    specs = [build(r, p.graph, SM90) for r in p.regions if r.kind == "attention"]
    assert specs
    for spec in specs:
        kw = spec.factory_kwargs()
        assert attention_ws.key_mask(kw["mask_shape"]) and kw["mask_dtype"] == "float16"
        cfg = lower.default_config(spec, SM90)
        assert cfg.get("ws") and cfg.get("bound_keys"), cfg
    src = kernel_source(attention.flash_attention(**kw, **cfg, target=SM90), SM90)
    assert "const half_t* __restrict__ Mask" in src and "tma_load" in src


@pytest.mark.gpu
@pytest.mark.parametrize("experimental", ["", "attention_chain", "attention_pin_softmax"])
def test_zoo_bert_with_the_masked_ws_schedule_matches_eager_gpu(experimental):
    """The zoo BERT (batch 4 x 100 tokens, D 32, random padding past row 0) through torch.compile with the masked ws
    schedule (the default; chained where asked), every region its kernel (no measured choice): against eager, fp16
    tolerances."""
    from tilefuse import models
    from tilefuse.backend import make_backend

    torch._dynamo.reset()
    model, inputs = models.build("bert", "small", dtype=torch.float16, device="cuda")
    runners = []
    backend = make_backend(Options(measure=False, experimental=experimental,
                                   observer=runners.append))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for seed in (1, 2):  # fresh inputs each call
            inputs = models.example_inputs("bert", "small", device="cuda", seed=seed)
            torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-2, atol=1e-2)
    torch._dynamo.reset()
    assert backend.failures == []
    assert any(r.kind == "attention" for runner in runners for r in runner.plan.regions)


def test_late_store_waits_for_the_store_before_the_next_tile_writes_o():
    def source(S, **kw):
        return kernel_source(attention.flash_attention(32, 16, S, S, 64, dtype="float16", target=SM90,
                                                       **_ws_configs(64, **kw)[0]), SM90)
    late, plain = source(512, late_store=True), source(512)
    body = late[late.index("tl::warpgroup_reg_alloc"):]
    wait, store = body.index("tl::tma_store_wait<0, true>();"), body.index("tl::tma_store(")
    # in the loop: wait (then a barrier) before O_sh is written; once more after the loop, before the program ends
    assert wait < body.index("ptx_stmatrix") < store and body.count("tl::tma_store_wait<0, true>();") == 2
    assert body.index("tl::__sync_thread_partial", wait) < body.index("ptx_stmatrix")
    assert plain.count("tma_store_wait") == 1 and plain.index("tma_store_arrive") < plain.index("tma_store_wait")
    assert source(500, late_store=True) == source(500)  # a row tail: no staged store to defer


def test_double_q_alternates_two_q_buffers():
    def source(**kw):
        return kernel_source(attention.flash_attention(32, 16, 512, 512, 64, is_causal=True, dtype="float16",
                                                       target=SM90, **_ws_configs(64, **kw)[0]), SM90)
    two, one = source(double_q=True, pair_rows=True), source()
    assert "q_full[1].init(128);" in two and "q_empty[1].init(256);" in two and "q_full[1]" not in one
    # each tile's Q in buffer count % 2, waited for at phase (count // 2) % 2 (the pair order's count: qn)
    assert "q_empty[((int64_t)qi)].wait((((qn & 3) >> 1) ^ 1));" in two
    assert two.count("increase_descriptor_offset<int>(desc_a") == 2  # both Q K^T issues read buffer qi

"""The warp-specialized, persistent GEMM (``gemm(ws=True)``, ``gemm_ws``): where it applies, what it refuses before
compiling, that it lowers for sm_90a with its overlap (ptxas: no spills, no serialized WGMMAs) and, with ``pingpong``,
its warp groups' turns; (GPU) its numerics against the float64 reference over tails, epilogues that read a bias and a
full-size residual, a plain B, bf16, an fp32 output, one tile, several rounds per program, and NaN/Inf inputs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from tilefuse.config import Options, default_target
from tilefuse.lowering import emitters, lower
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import compile_many, kernel_source
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.templates import gemm, gemm_sp, gemm_sp_ws, gemm_ws
from tilefuse.ops.sparse_layout import compress_2_4, prune_2_4

SM90 = {"kind": "cuda", "arch": "sm_90a"}
COOP = {"block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 3}
PP = {"block_M": 128, "block_N": 128, "block_K": 64, "num_stages": 4, "pingpong": True}
NARROW = {**COOP, "block_N": 192, "num_stages": 4}  # (the other cooperative seeds)
SHORT = {**COOP, "block_N": 128, "num_stages": 5}
TALL = {**COOP, "block_M": 256, "block_N": 128, "num_stages": 3}  # (each group 128 rows; no seed: session 39)
THIN = {**COOP, "block_N": 64, "num_stages": 6}  # (memory-bound shapes' seed: N <= 128, or K 64 with a residual)


@pytest.mark.parametrize("target,kw,ok", [
    (SM90, {}, True),
    (SM90, {"trans_B": True}, True),
    (SM90, {"A_dtype": "bfloat16"}, True),
    (SM90, {"out_dtype": "float32"}, True),
    (SM90, {"A_dtype": "float32"}, False),
    (SM90, {"A_dtype": "float32", "B_dtype": "float16"}, False),  # (A cast: a prologue)
    (SM90, {"prologue": Acc() * 2.0}, False),
    (SM90, {"trans_A": True}, False),
    (SM90, {"batch_A": (2,)}, False),
    (SM90, {"K": 100}, False),  # A's rows of 200 bytes: no TMA box
    (SM90, {"N": 100}, False),  # C's rows
    (SM90, {"N": 102, "trans_B": True, "out_dtype": "float32"}, False),
    (SM90, {"N": 100, "trans_B": True, "out_dtype": "float32"}, True),
    (SM90, {"N": 104, "trans_B": True}, True),
    ({"kind": "cuda", "arch": "sm_80"}, {}, False),
    ({"kind": "c"}, {}, False),
])
def test_eligible(target, kw, ok):
    assert gemm_ws.eligible(target, **{"N": 256, "K": 128, **kw}) is ok


def test_gemm_ws_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="ws=True needs"):
        gemm.gemm(256, 256, 128, prologue=Acc() * 2.0, target=SM90, ws=True, **COOP)
    with pytest.raises(ValueError, match="ws=True needs"):
        gemm.gemm(256, 256, 128, target={"kind": "cuda", "arch": "sm_80"}, ws=True, **COOP)
    with pytest.raises(ValueError, match="pingpong=True, cluster=2, slice_N and extra_buffers are options of ws=True"):
        gemm.gemm(256, 256, 128, target=SM90, pingpong=True)
    with pytest.raises(ValueError, match="shared memory"):
        gemm.gemm(256, 256, 128, target=SM90, ws=True, **{**COOP, "num_stages": 4})
    with pytest.raises(ValueError, match="at least 2"):
        gemm.gemm(256, 256, 128, target=SM90, ws=True, **{**PP, "num_stages": 1})
    with pytest.raises(ValueError, match="at most 128 x 128"):
        gemm.gemm(256, 256, 128, target=SM90, ws=True, **{**PP, "block_N": 256, "num_stages": 2})
    for tile in ({"block_M": 64}, {"block_M": 256, "block_N": 192, "num_stages": 2}):
        with pytest.raises(ValueError, match="64 or 128 rows each"):
            gemm.gemm(256, 256, 128, target=SM90, ws=True, **{**COOP, **tile})


# name -> (M, N, K, gemm kwargs, extras' shapes)
CASES = {
    "bias_gelu_tails": (1000, 3072, 776, {"trans_B": True, "epilogue": call("gelu", Acc() + Arg(0))}, [(3072,)]),
    # (the epilogue's fast forms, lowering.emitters.FAST_EMITTERS: GPT-2's fc1; LLaMA's gate under silu_mul below)
    "bias_gelu_tanh": (1000, 3072, 776, {"trans_B": True, "epilogue": call("gelu", Acc() + Arg(0), approximate="tanh")},
                       [(3072,)]),
    "bias_residual": (1000, 768, 3072, {"trans_B": True, "epilogue": Acc() + Arg(0) + Arg(1)}, [(768,), (1000, 768)]),
    "plain_B": (2048, 1000, 512, {}, []),
    "out_fp32": (512, 520, 512, {"trans_B": True, "out_dtype": "float32"}, []),
    "one_tile": (100, 64, 64, {"trans_B": True}, []),
    "rounds": (4096, 4096, 256, {"trans_B": True, "epilogue": call("relu", Acc())}, []),  # 256-512 tiles, 132 SMs
    # a full-size extra (LLaMA's up under silu(gate) * up): loaded into the output tile by the producer (the default),
    # copied there by the consumers (prefetch_extra=False), or read at the accumulator's layout (stage_extra=False);
    # loaded over several rounds of tiles a program (the barriers' phases), with one k-block or several
    "silu_mul_staged": (1000, 1024, 776, {"trans_B": True, "epilogue": call("silu", Acc()) * Arg(0)}, [(1000, 1024)]),
    "silu_mul_copied": (1000, 1024, 776, {"trans_B": True, "epilogue": call("silu", Acc()) * Arg(0),
                                          "prefetch_extra": False}, [(1000, 1024)]),
    "residual_rounds": (4000, 4096, 320, {"trans_B": True, "epilogue": Acc() + Arg(0)}, [(4000, 4096)]),
    "residual_rounds_one_k_block": (4000, 2048, 64, {"trans_B": True, "epilogue": Acc() * Arg(0)}, [(4000, 2048)]),
    "residual_fp32_out": (1000, 520, 512, {"trans_B": True, "epilogue": Acc() + Arg(0), "out_dtype": "float32"},
                          [(1000, 520)]),
    "residual_gathered": (1000, 768, 512, {"trans_B": True, "epilogue": Acc() + Arg(0), "stage_extra": False},
                          [(1000, 768)]),
}


def _fit(cfg, out_dtype="float16"):
    """``cfg`` with as many stages as fit shared memory (its output tiles, slices or turns counted)."""
    while gemm_ws.smem_bytes(cfg["block_M"], cfg["block_N"], cfg["block_K"], cfg["num_stages"], out_dtype,
                             cfg.get("pingpong", False), cfg.get("slice_N"), cfg.get("extra_buffers", 1)) \
            > gemm_ws.SMEM_MAX:
        cfg = {**cfg, "num_stages": cfg["num_stages"] - 1}
    return cfg


def _configs(N, out_dtype="float16"):
    """Both schedules (and a 64 x 256 ping-pong tile where N allows; cooperative, all four seeds: 128 x 256, 192,
    128 x 5 stages and 64 x 6, and the 256 x 128 tile), each with as many stages as fit."""
    return [_fit(cfg, out_dtype) for cfg in [COOP, NARROW, SHORT, THIN, TALL, PP]
            + ([{**PP, "block_M": 64, "block_N": 256, "num_stages": 3}] if N >= 256 else [])]


def _extra_dtypes(M, N, kw, extras, dtype):
    """The operands' dtype, but the output's for a full-size extra (a residual of an fp32 output: staged, copied)."""
    return [kw.get("out_dtype", dtype) if tuple(s) == (M, N) else dtype for s in extras]


def _funcs(dtype="float16"):
    for name, (M, N, K, kw, extras) in sorted(CASES.items()):
        for cfg in _configs(N, kw.get("out_dtype", dtype)):
            f = gemm.gemm(M, N, K, A_dtype=dtype, extra_shapes=extras,
                          extra_dtypes=_extra_dtypes(M, N, kw, extras, dtype), ws=True, target=SM90, **kw, **cfg)
            yield f"{name} {cfg}", (M, N, K, kw, extras), f


def test_a_full_size_extra_is_read_from_a_coalesced_copy_in_the_output_tile(tmp_path):
    """``silu(acc) * up`` with ``up`` of the output's shape: by default the producer loads its tile into the output
    tile by TMA during the main loop (behind barriers: loaded, and handed back once the store has read the tile);
    with ``prefetch_extra=False`` the consumers copy it there, vectorized, after the main loop. Either way the epilogue
    reads it there, into the accumulator, then the cast: a few barriers a tile (not one per element step); the default
    with no spills with the 128 x 256 tile. ``stage_extra=False`` reads it at the accumulator's layout."""
    def source(**kw):
        f = gemm.gemm(1000, 8192, 2048, trans_B=True, epilogue=call("silu", Acc()) * Arg(0),
                      extra_shapes=[(1000, 8192)], extra_dtypes=["float16"], ws=True, target=SM90, **COOP, **kw)
        return kernel_source(f, SM90)
    loaded, copied, gathered = source(), source(prefetch_extra=False), source(stage_extra=False)
    assert "tma_load(extra0_desc, xfull[0]" in loaded and "xfree[0].wait(" in loaded and "xfree[0].arrive()" in loaded
    assert "*(uint4*)(extra0 +" not in loaded and "extra0_desc" not in copied + gathered
    assert "*(uint4*)(extra0 +" in copied and "*(uint4*)(extra0 +" not in gathered
    for src in (loaded, copied):
        assert src.count("__sync_thread_partial") <= 4
    if shutil.which("nvcc"):  # (the copied path's loop, not vectorized with the fast silu's opaque calls, spills
        log = _ptxas_log(loaded, tmp_path)  # some 50 bytes: it is no default, only ping-pong's)
        assert "0 bytes spill stores" in log, log[-3000:]


def test_gemm_ws_lowers_with_the_overlap_and_the_turns():
    for name, (M, N, K, kw, extras), f in _funcs():
        src = kernel_source(f, SM90)
        assert "tma_load" in src and "tma_store" in src, name
        assert ("wait_wgmma<1>" in src) == (K > 64), name  # one k-block: no product to overlap
        assert "warpgroup_reg_alloc" in src and src.count("__syncthreads()") == 1, name
        turns = src.count("__named_barrier_arrive(")  # group 1 opens the first turn; a group with tiles passes them
        assert (turns >= 2) if "pingpong" in name else turns == 0, name


def _ptxas_log(src: str, tmp_path) -> str:
    import tilelang.contrib.nvcc as tl_nvcc

    path = tmp_path / "k.cu"
    path.write_text(src)
    cmd = [tl_nvcc.get_nvcc_compiler(), "-std=c++17", "-O3", "-arch=sm_90a", "-cubin", "-Xptxas", "-v",
           f"-I{tl_nvcc.TILELANG_TEMPLATE_PATH}", f"-I{tl_nvcc.CUTLASS_INCLUDE_DIR}", "-DENABLE_BF16", str(path), "-o",
           str(tmp_path / "k.cubin")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("cfg", [COOP, PP, NARROW, THIN, TALL, {**TALL, "num_stages": 4, "slice_N": 32}])
def test_gemm_ws_wgmmas_are_not_serialized_by_ptxas(cfg, tmp_path):
    f = gemm.gemm(1000, 3072, 768, trans_B=True, epilogue=call("gelu", Acc() + Arg(0)), extra_shapes=[(3072,)],
                  extra_dtypes=["float16"], ws=True, target=SM90, **cfg)
    log = _ptxas_log(kernel_source(f, SM90), tmp_path)
    assert "Used" in log and "registers" in log and "0 bytes spill stores" in log, log[-3000:]
    assert "serialized" not in log and "C7513" not in log and "C7514" not in log, log[-3000:]


def test_gemm_ws_in_2_cta_clusters_multicasts_b_and_frees_each_stage_in_both(tmp_path):
    """``cluster=2``: the first CTA's TMA multicasts each B stage to both (each CTA expects its bytes), every consumer
    frees each stage in both CTAs (a barrier of 512 arrivals), the cluster synchronized before and after; cooperative
    only, and the plain schedule (cluster 1) unchanged."""
    f = gemm.gemm(1000, 4096, 1024, trans_B=True, epilogue=Acc() + Arg(0), extra_shapes=[(1000, 4096)],
                  extra_dtypes=["float16"], ws=True, target=SM90, cluster=2, **COOP)
    src = kernel_source(f, SM90)
    assert src.count("tma_load_multicast(B_desc") == 1 and "tma_load(A_desc" in src
    assert src.count(".init(512)") == COOP["num_stages"] and src.count(".arrive(r") == 2
    assert src.count("cluster_sync()") >= 2
    plain = kernel_source(gemm.gemm(1000, 4096, 1024, trans_B=True, ws=True, target=SM90, **COOP), SM90)
    assert "multicast" not in plain and "cluster" not in plain
    with pytest.raises(ValueError, match="cooperative"):
        gemm.gemm(1000, 4096, 1024, trans_B=True, ws=True, target=SM90, cluster=2, **PP)
    with pytest.raises(ValueError, match="cluster=2, slice_N and extra_buffers are options of ws=True"):
        gemm.gemm(1000, 4096, 1024, trans_B=True, target=SM90, cluster=2)
    if shutil.which("nvcc"):
        log = _ptxas_log(src, tmp_path)
        assert "0 bytes spill stores" in log, log[-3000:]


def test_gemm_ws_sliced_epilogue_stores_through_two_buffers_taking_turns(tmp_path):
    """``slice_N``: the epilogue in column slices, each stored by TMA from one of two buffers once the store two slices
    back has read it; the 128 x 256 tile's fourth stage fits (it does not with the whole output tile); a full-size
    extra is read where it lies; refused where it cannot apply."""
    f = gemm.gemm(1000, 4096, 1024, trans_B=True, epilogue=Acc() + Arg(0), extra_shapes=[(1000, 4096)],
                  extra_dtypes=["float16"], ws=True, target=SM90, **SLICED)
    src = kernel_source(f, SM90)
    assert "tma_store_wait<1, true>()" in src and src.count("tl::tma_store(C_desc") == 1
    assert "for (int c = 0; c < 4; ++c)" in src and "extra0_desc" not in src and "xfull" not in src
    assert gemm_ws.smem_bytes(128, 256, 64, 4, "float16", False, 64) <= gemm_ws.SMEM_MAX \
        < gemm_ws.smem_bytes(128, 256, 64, 4, "float16", False)
    for bad in ({**SLICED, "slice_N": 96}, {**PP, "slice_N": 64}, {**SLICED, "slice_N": 4}):
        with pytest.raises(ValueError, match="slice_N"):
            gemm.gemm(1000, 4096, 1024, trans_B=True, ws=True, target=SM90, **bad)
    with pytest.raises(ValueError, match="options of ws=True"):
        gemm.gemm(1000, 4096, 1024, trans_B=True, target=SM90, slice_N=64)
    if shutil.which("nvcc"):
        log = _ptxas_log(src, tmp_path)
        assert "0 bytes spill stores" in log and "C7513" not in log and "C7514" not in log, log[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemm_ws_gpu_matches_the_reference(dtype, rng):
    """Every case and schedule, compiled in parallel first; fresh inputs, every element checked, with a NaN and an
    Inf in A (their rows NaN/Inf or NaN, as torch gives). A turn or a stage that never comes would hang: run it under
    a timeout."""
    _check_on_the_gpu(list(_funcs(dtype)), dtype, rng)


# the schedule's options' cases: a lone row tile (a cluster's peer wholly past M), rounds of tiles a program, both
# epilogue-operand paths (the producer's load, and an fp32 output's copy; sliced: read where they lie), tails in M, N
VARIANT_CASES = ("one_tile", "rounds", "bias_gelu_tails", "silu_mul_staged", "residual_rounds", "residual_fp32_out")
SLICED = {**COOP, "num_stages": 4, "slice_N": 64}  # (a fourth stage where the whole output tile left room for three)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [{"cluster": 2}, {"slice_N": 64}, {"slice_N": 32}])
def test_gemm_ws_options_gpu_match_the_reference(variant, rng):
    """``cluster=2``: B's stages multicast to both CTAs of a cluster, each stage freed by both CTAs' consumers (a stage
    freed too early would give wrong numbers; one never freed, a hang: run it under a timeout). ``slice_N``: the
    epilogue's slices through two buffers taking turns (a buffer rewritten before its store read it: wrong numbers)."""
    runs = []
    for name in VARIANT_CASES:
        M, N, K, kw, extras = CASES[name]
        cfg = next(c for c in _configs(N, kw.get("out_dtype", "float16")) if not c.get("pingpong"))
        if "slice_N" in variant:
            cfg = _fit({**SLICED, **variant}, kw.get("out_dtype", "float16"))
        else:
            cfg = {**cfg, **variant}
        f = gemm.gemm(M, N, K, A_dtype="float16", extra_shapes=extras, ws=True, target=SM90,
                      extra_dtypes=_extra_dtypes(M, N, kw, extras, "float16"), **kw, **cfg)
        runs.append((f"{name} {cfg}", (M, N, K, kw, extras), f))
    _check_on_the_gpu(runs, "float16", rng)


# the staged extras' cases (one k-block and several, rounds of tiles a program, tails in M and N, a bias beside)
TURNED_CASES = ("silu_mul_staged", "residual_rounds", "residual_rounds_one_k_block", "bias_residual")


def _turned_funcs(dtype="float16"):
    """The staged extras' cases, every cooperative tile, with two output tiles taking turns (``extra_buffers=2``), as
    many stages as then fit."""
    for name in TURNED_CASES:
        M, N, K, kw, extras = CASES[name]
        for cfg in (COOP, NARROW, SHORT, THIN, TALL):
            cfg = _fit({**cfg, "extra_buffers": 2})
            f = gemm.gemm(M, N, K, A_dtype=dtype, extra_shapes=extras, ws=True, target=SM90,
                          extra_dtypes=_extra_dtypes(M, N, kw, extras, dtype), **kw, **cfg)
            yield f"{name} {cfg}", (M, N, K, kw, extras), f


def test_two_output_tiles_take_turns_for_a_staged_extra(tmp_path):
    """``extra_buffers=2``: the producer loads tile t's extra into output tile t % 2 behind that tile's barriers, and
    the consumers hand the other back once the previous tile's store has read it, before this tile's epilogue (so the
    next tile's extra loads under it); every cooperative tile keeps two stages or more. Where no staged extra is
    loaded by the producer it is refused, not ignored."""
    runs = list(_turned_funcs())
    assert len(runs) == len(TURNED_CASES) * 5 and all("'num_stages': 1" not in name for name, _, _ in runs)
    for name, _, f in runs:
        src = kernel_source(f, SM90)
        assert "xfull[1].init(128);" in src and "xfree[1].init(256);" in src, name
        if "rounds" in name:  # (one round a program: a single tile, its turn resolved when built)
            assert re.search(r"tma_load\(extra0_desc, xfull\[(t|\(t & 1\))\]", src), name
            assert re.search(r"xfree\[(t|\(t & 1\))\]\.wait\(", src), name
            handed_back = r"if \(0 < t_1\) \{\s*tl::tma_store_wait<0, true>\(\);\s*xfree\[[^]]+\]\.arrive\(\);"
            assert re.search(handed_back, src), name
    if shutil.which("nvcc"):
        log = _ptxas_log(kernel_source(runs[0][2], SM90), tmp_path)
        assert "0 bytes spill stores" in log and "serialized" not in log, log[-3000:]
    M, N, K, kw, extras = CASES["residual_rounds"]
    for bad in ({"extra_buffers": 3}, {"extra_buffers": 2, "prefetch_extra": False},
                {"extra_buffers": 2, "stage_extra": False}, {"extra_buffers": 2, **PP}):
        with pytest.raises(ValueError, match="extra_buffers"):
            gemm.gemm(M, N, K, extra_shapes=extras, extra_dtypes=["float16"], ws=True, target=SM90,
                      **kw, **{**COOP, **bad})
    with pytest.raises(ValueError, match="extra_buffers"):  # (a bias is no staged extra)
        gemm.gemm(1000, 3072, 776, extra_shapes=[(3072,)], extra_dtypes=["float16"], ws=True, target=SM90,
                  trans_B=True, epilogue=Acc() + Arg(0), **COOP, extra_buffers=2)
    with pytest.raises(ValueError, match="options of ws=True"):
        gemm.gemm(M, N, K, extra_shapes=extras, extra_dtypes=["float16"], target=SM90, **kw, extra_buffers=2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_two_output_tiles_taking_turns_gpu_match_the_reference(dtype, rng):
    """``extra_buffers=2`` on the GPU: an output tile rewritten before its store read it, or an extra loaded into a
    tile still being stored, gives wrong numbers; a hand-back that never comes, a hang (run under a timeout)."""
    _check_on_the_gpu(list(_turned_funcs(dtype)), dtype, rng)


def _bf16_logpoly_gelu_funcs():
    """The GELU cases' bf16 kernels, every schedule, with ``LOGPHI_BF16``'s GELU (the default since 2026-12-06)."""
    return [run for run in _funcs("bfloat16") if run[0].startswith("bias_gelu")]


def test_the_bf16_logpoly_gelu_takes_the_place_of_erff():
    runs = _bf16_logpoly_gelu_funcs()
    exact = [run for run in runs if "tanh" not in run[0]]
    assert exact and all("erff(" not in kernel_source(f, SM90) for _, _, f in exact[:1])
    src = kernel_source(exact[0][2], SM90)
    assert src.count("__expf(") == 1 and all(_printed(k) in src for k in emitters.LOGPHI_BF16)


def _printed(v: float) -> str:
    """``v`` as the CUDA source prints a float32 constant: its hex literal (``-0x1.52e1fcp-20f``)."""
    mantissa, exponent = torch.tensor(v, dtype=torch.float32).item().hex().split("p")
    return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}f"


@pytest.mark.gpu
def test_gemm_ws_gpu_bf16_logpoly_gelu_matches_the_reference(rng):
    """``LOGPHI_BF16`` in a bf16 output's GELU epilogue (bench/run_pending_h200.sh part 47; passed on the H100 before
    it was made the default): every schedule, tails, NaN and Inf rows, against the float64 reference."""
    _check_on_the_gpu(_bf16_logpoly_gelu_funcs(), "bfloat16", rng)


def _check_on_the_gpu(runs, dtype, rng):
    """Each of ``runs`` (name, case, prim_func), compiled in parallel first, against the reference."""
    kernels = compile_many([(f, [-1]) for _, _, f in runs], default_target(), return_exceptions=True)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == "bfloat16" else {"rtol": 1e-2, "atol": 1e-2}
    tdt = getattr(torch, dtype)
    for (name, (M, N, K, kw, extras), _), k in zip(runs, kernels):
        assert not isinstance(k, BaseException), f"{name}: {k}"
        A = torch.randn(M, K, generator=rng).to(tdt)
        B = torch.randn(*((N, K) if kw.get("trans_B") else (K, N)), generator=rng).to(tdt) / K ** 0.5
        ex = [torch.randn(s, generator=rng).to(getattr(torch, d)) for s, d in
              zip(extras, _extra_dtypes(M, N, kw, extras, dtype))]
        A[M // 2, 3], A[M - 1, 0] = float("nan"), float("inf")
        got = k(A.cuda(), B.cuda(), *[e.cuda() for e in ex]).cpu()
        # (on the GPU, as the model's torch would run it: torch's CPU float32 gelu gives NaN for +inf, CUDA's +inf)
        want = gemm.reference(A.cuda(), B.cuda(), [e.cuda() for e in ex], trans_B=kw.get("trans_B", False),
                              epilogue=kw.get("epilogue"), out_dtype=kw.get("out_dtype")).cpu()
        assert got.shape == want.shape and got.dtype == want.dtype, name
        finite = torch.ones(M, dtype=torch.bool)
        finite[[M // 2, M - 1]] = False  # the finite rows first: a tile's wrong numbers, apart from NaN/Inf's
        torch.testing.assert_close(got[finite], want[finite], **tol, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(got, want, equal_nan=True, **tol, msg=lambda m, name=name: f"{name} NaN/Inf: {m}")


# ---- 2:4 sparse: gemm_sp(ws=True) ---------------------------------------------------------------------------------

SPARSE_CASES = {  # name -> (M, N, K, gemm_sp kwargs, extras' shapes)
    "bias": (2048, 1024, 1024, {"epilogue": Acc() + Arg(0)}, [(1024,)]),
    "silu_up_tails": (1000, 1024, 776, {"epilogue": call("silu", Acc()) * Arg(0)}, [(1000, 1024)]),  # staged
    "plain_rounds": (4096, 2048, 512, {}, []),  # 256 tiles of 256 x 128 on 132 SMs
}


@pytest.mark.parametrize("target,kw,ok", [
    (SM90, {"meta_k_major": True}, True),
    (SM90, {"meta_k_major": True, "dtype": "bfloat16", "out_dtype": "float32"}, True),
    (SM90, {}, False),  # row-major metadata: the sm_90 planner stores it K-major
    (SM90, {"meta_k_major": True, "K": 100}, False),
    (SM90, {"meta_k_major": True, "N": 100}, False),
    ({"kind": "cuda", "arch": "sm_80"}, {"meta_k_major": True}, False),
])
def test_sparse_eligible(target, kw, ok):
    assert gemm_sp_ws.eligible(target, **{"N": 256, "K": 128, **kw}) is ok


def _sparse_funcs(dtype="float16"):
    for name, (M, N, K, kw, extras) in sorted(SPARSE_CASES.items()):
        cfg = gemm_sp_ws.seed(K, dtype, [dtype] * len(gemm_sp.staged_extras(M, N, kw.get("epilogue"), extras)))
        cfg = {k: v for k, v in cfg.items() if k != "ws"}
        f = gemm_sp.gemm_sp(M, N, K, dtype=dtype, extra_shapes=extras, extra_dtypes=[dtype] * len(extras),
                            meta_k_major=True, ws=True, target=SM90, **kw, **cfg)
        yield name, (M, N, K, kw, extras), f


def test_gemm_sp_ws_lowers_with_the_overlap_and_refuses_what_it_cannot_build():
    for name, _, f in _sparse_funcs():
        src = kernel_source(f, SM90)
        assert "wgmma_sp_ss<" in src and "tma_load" in src and "tma_store" in src, name
        # each product waited for before the next k-block's metadata loads (one in flight was wrong on the H200)
        assert "wait_wgmma<0>" in src and "wait_wgmma<1>" not in src, name
        assert "warpgroup_reg_alloc" in src and src.count("__syncthreads()") == 1, name
    with pytest.raises(ValueError, match="ws=True needs a CUDA sm_90 target, K-major metadata"):
        gemm_sp.gemm_sp(256, 256, 128, target=SM90, ws=True)
    with pytest.raises(ValueError, match="at least 2"):
        gemm_sp.gemm_sp(256, 256, 128, meta_k_major=True, target=SM90, ws=True, block_M=256, num_stages=1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_gemm_sp_ws_wgmmas_are_not_serialized_by_ptxas(tmp_path):
    _, _, f = next(c for c in _sparse_funcs() if c[0] == "silu_up_tails")
    log = _ptxas_log(kernel_source(f, SM90), tmp_path)
    assert "Used" in log and "registers" in log and "0 bytes spill stores" in log, log[-3000:]
    assert "serialized" not in log and "C7513" not in log and "C7514" not in log, log[-3000:]


def test_no_config_space_offers_gemm_sp_ws():

    k_major = KernelSpec("gemm_sp", tuple(sorted({"M": 4096, "N": 4096, "K": 4096, "dtype": "float16",
                                                      "meta_k_major": True}.items())), (-1,), (), ())
    assert not any(c.get("ws") for c in lower.config_space(k_major, SM90))
    with pytest.raises(ValueError, match="unknown experimental schedule.*gemm_sp_ws"):
        Options(target=SM90, experimental="gemm_sp_ws")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["plain_rounds", "bias", "silu_up_tails"])  # plain_rounds: wrong with a product in
# flight (gemm_sp_ws.py's note); right with none in session 24's probe of the same shape (the default since)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemm_sp_ws_gpu_matches_the_reference(dtype, case, rng):
    """A 2:4-pruned random weight, fresh inputs, every element checked, a NaN token row."""
    runs = [r for r in _sparse_funcs(dtype) if r[0] == case]
    kernels = compile_many([(f, [-1]) for _, _, f in runs], default_target(), return_exceptions=True)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == "bfloat16" else {"rtol": 1e-2, "atol": 1e-2}
    tdt = getattr(torch, dtype)
    for (name, (M, N, K, kw, extras), _), k in zip(runs, kernels):
        assert not isinstance(k, BaseException), f"{name}: {k}"
        x = torch.randn(M, K, generator=rng).to(tdt)
        w = prune_2_4(torch.randn(N, K, generator=rng).to(tdt) / K ** 0.5)
        values, meta = compress_2_4(w, k_major=True)
        ex = [torch.randn(s, generator=rng).to(tdt) for s in extras]
        want = gemm_sp.reference(x, values, meta, ex, K=K, epilogue=kw.get("epilogue"), meta_k_major=True)
        # A NaN meets only the kept weights: the 2:4 tensor cores skip the pruned ones' products (torch's dense
        # matmul of the pruned weight would spread it over the row through 0 x NaN)
        x[M // 3, 5] = float("nan")
        want[M // 3, w[:, 5] != 0] = float("nan")
        got = k(x.cuda(), values.cuda(), meta.cuda(), *[e.cuda() for e in ex]).cpu()
        finite = torch.arange(M) != M // 3
        torch.testing.assert_close(got[finite], want[finite], **tol, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(got, want, equal_nan=True, **tol, msg=lambda m, name=name: f"{name} NaN: {m}")


@pytest.mark.parametrize("ws", [True, False])
def test_the_epilogues_sigmoid_is_fast_only_where_the_output_rounds_to_half_precision_on_cuda(ws):
    """``lowering.emitters.FAST_EMITTERS``: silu and GELU's tanh form by ``ex2.approx``/``__fdividef`` where the output
    is fp16/bf16 on CUDA (the H200's GPU tests check their numerics, NaN/Inf rows included; ``test_fast_emitters.py``
    their arithmetic); an fp32 output keeps ``expf`` and the IEEE division. The exact GELU keeps ``erff`` but at the
    root of an fp16 or bf16 output's epilogue (``ROUNDED_EMITTERS``: exp of a polynomial, exact to that rounding
    only)."""
    cfg = {"block_M": 128, "block_N": 128, "block_K": 64, "num_stages": 2 if ws else 3, "ws": ws}

    def source(epilogue, out_dtype="float16"):
        f = gemm.gemm(1024, 1024, 512, trans_B=True, epilogue=epilogue, extra_shapes=[(1024,)],
                      extra_dtypes=["float16"], out_dtype=out_dtype, target=SM90, **cfg)
        return kernel_source(f, SM90)
    silu = call("silu", Acc() + Arg(0))
    fast, exact = source(silu), source(silu, "float32")
    assert "__fdividef(" in fast and "__expf(" in fast and "expf(" not in fast.replace("__expf(", "")
    assert "__fdividef(" not in exact and "expf(" in exact
    tanh = source(call("gelu", Acc() + Arg(0), approximate="tanh"))
    assert "__fdividef(" in tanh and "tanhf(" not in tanh
    gelu = call("gelu", Acc() + Arg(0))
    for erf in (source(gelu, "float32"), source(gelu * Arg(0))):
        assert "erff(" in erf and "__fdividef(" not in erf and "__expf(" not in erf
    assert "fast_rcp" not in fast + tanh  # (an asm volatile: issued at every use, in order)
    logpoly = source(gelu)  # (ROUNDED_EMITTERS: the exact GELU of a value rounded straight to fp16, LOGPHI's)
    assert "erff(" not in logpoly and logpoly.count("__expf(") == 1
    assert all(_printed(k) in logpoly for k in emitters.LOGPHI)  # (Horner's rule, every coefficient)
    bf16 = source(gelu, "bfloat16")  # (LOGPHI_BF16's, fitted out to bf16's reach of GELU's tail)
    assert "erff(" not in bf16 and bf16.count("__expf(") == 1 and all(_printed(k) in bf16 for k in emitters.LOGPHI_BF16)


@pytest.mark.parametrize("ws", [False, True])
def test_the_sparse_epilogues_sigmoid_is_fast_as_the_dense_ones(ws):
    """``gemm_sp`` (both schedules) takes the dense template's rule: silu by ``__fdividef`` where the output is fp16 on
    CUDA, ``expf`` and the IEEE division for an fp32 output."""
    cfg = {"block_M": 128, "block_N": 128, "block_K": 64, "num_stages": 2, "meta_k_major": True} if ws else {}

    def source(out_dtype):
        f = gemm_sp.gemm_sp(1024, 1024, 512, epilogue=call("silu", Acc()) * Arg(0), extra_shapes=[(1024, 1024)],
                            extra_dtypes=[out_dtype], out_dtype=out_dtype, target=SM90, ws=ws, **cfg)
        return kernel_source(f, SM90)
    fast, exact = source("float16"), source("float32")
    assert "__fdividef(" in fast and "expf(" not in fast.replace("__expf(", "") and "fast_rcp" not in fast
    assert "__fdividef(" not in exact and "expf(" in exact


def test_the_c_target_keeps_the_exact_sigmoid():
    f = gemm.gemm(64, 64, 64, trans_B=True, epilogue=call("silu", Acc()), target={"kind": "c"})
    src = kernel_source(f, {"kind": "c"})
    assert "fast_rcp" not in src and "__fdividef" not in src and "exp" in src


def test_an_fp32_outputs_full_size_extra_is_copied_not_loaded_by_the_producer():
    """The producer's TMA load of the staged extra is for fp16/bf16 outputs (measured and checked on the H200); an fp32
    output's residual is copied into the output tile by the consumers (its GPU numerics: ``residual_fp32_out``)."""
    def source(dt):
        f = gemm.gemm(1000, 520, 512, trans_B=True, epilogue=Acc() + Arg(0), extra_shapes=[(1000, 520)],
                      extra_dtypes=[dt], out_dtype=dt, ws=True, target=SM90, **SHORT)
        return kernel_source(f, SM90)
    assert "tma_load(extra0_desc" in source("float16") and "tma_load(extra0_desc" not in source("float32")

"""The hand-written warp-specialized GEMM prototypes in ``bench/`` (``proto_gemm_ws``, dense, and
``proto_gemm_sp_ws``, 2:4 sparse) lower for sm_90a with their producer/consumer split and the one-WGMMA-in-flight
overlap (the dense ones; the 2:4 one waits for each product), and refuse configs they cannot run (shared memory past the H200's 227 KB, a single stage) before compiling.
Their numbers come from the device (``python bench/proto_gemm_*.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tilefuse.lowering.compile import kernel_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import proto_gemm_sp_ws
import proto_gemm_ws

SM90 = {"kind": "cuda", "arch": "sm_90a"}


# The 2:4 one waits for each wgmma.sp (one left in flight read overwritten metadata registers on the H200:
# gemm_sp_ws.py's note); its overlap is the producer's loads ahead of the consumers.
@pytest.mark.parametrize("configs,build,mma,wait", [
    (proto_gemm_ws.CONFIGS, proto_gemm_ws.gemm_ws, "wgmma_ss<", "wait_wgmma<1>"),
    (proto_gemm_ws.PINGPONG_CONFIGS, proto_gemm_ws.gemm_ws_pingpong, "wgmma_ss<", "wait_wgmma<1>"),
    (proto_gemm_sp_ws.CONFIGS, proto_gemm_sp_ws.gemm_sp_ws, "wgmma_sp_ss<", "wait_wgmma<0>")])
def test_prototypes_lower_with_the_overlap(configs, build, mma, wait):
    for c in configs:  # (1000 rows: a partial last tile)
        src = kernel_source(build(1000, 2304, 768, **c), SM90)
        assert mma in src and wait in src and "tma_load" in src and "tma_store" in src, c
        assert "warpgroup_reg_alloc" in src and src.count("__syncthreads()") == 1, c


def test_prototypes_refuse_what_they_cannot_run():
    with pytest.raises(ValueError, match="shared memory"):
        proto_gemm_ws.gemm_ws(4096, 4096, 4096, block_M=128, block_N=256, block_K=64, stages=4)
    with pytest.raises(ValueError, match="shared memory"):
        proto_gemm_sp_ws.gemm_sp_ws(4096, 4096, 4096, block_M=256, block_N=128, block_K=128, stages=2)
    with pytest.raises(ValueError, match="at least 2"):
        proto_gemm_sp_ws.gemm_sp_ws(4096, 4096, 4096, block_M=256, block_N=128, block_K=64, stages=1)
    with pytest.raises(ValueError, match="64 weight rows per consumer"):
        proto_gemm_sp_ws.gemm_sp_ws(4096, 4096, 4096, block_N=192, stages=2)


def test_pingpong_gemm_groups_take_turns_on_their_own_tiles():
    src = kernel_source(proto_gemm_ws.gemm_ws_pingpong(4096, 3072, 768), SM90)
    wg0 = src.index("if (((int)threadIdx.x) < 128)")
    wg1 = src.index("} else {", src.index("__named_barrier_arrive(13, 256)", wg0))  # group 1's branch
    first, second = src[wg0:wg1], src[wg1:]
    # group 0 waits on barrier 12 and passes 13; group 1 opens 12 first, then waits on 13 and passes 12
    assert first.count("__sync_thread_partial(12, 256)") == 1 and first.count("__named_barrier_arrive(13, 256)") == 1
    assert second.index("__named_barrier_arrive(12, 256)") < second.index("__sync_thread_partial(13, 256)")
    assert second.count("__named_barrier_arrive(12, 256)") == 2
    for part, out in ((first, "C_s0"), (second, "C_s1")):  # each group its own output tile and store
        assert part.index("__named_barrier_arrive") < part.index("tma_store(") and out in part
        assert part.index("wait_wgmma<0>") < part.index("tma_store(")
    with pytest.raises(ValueError, match="at most 128 x 128"):
        proto_gemm_ws.gemm_ws_pingpong(4096, 4096, 4096, block_M=128, block_N=256, stages=2)


@pytest.mark.parametrize("form", ["gelu=erfc", "gelu=logpoly", *proto_gemm_ws.PROBES])
def test_each_gelu_probe_replaces_the_gelu_in_the_epilogue(form, monkeypatch):
    """--gelu-probes (the cost of a GELU epilogue: FMAs, MUFU ops): each form takes the GELU's place, nothing else;
    "gelu=erff" is the exact form, the default (an fp16 output's: ROUNDED_EMITTERS) logpoly's."""
    monkeypatch.setattr(proto_gemm_ws, "EPILOGUE", proto_gemm_ws.EPILOGUES["gelu"])
    exact = kernel_source(proto_gemm_ws.with_form("gelu=erff", proto_gemm_ws.gemm_ws)(
        4096, 3072, 768, block_N=192, stages=4), SM90)
    src = kernel_source(proto_gemm_ws.with_form(form, proto_gemm_ws.gemm_ws)(4096, 3072, 768, block_N=192, stages=4),
                        SM90)
    assert "erff" in exact and "__expf" not in exact and "erff" not in src and "wgmma_ss<" in src
    assert ("__expf" in src) == (form in ("gelu=erfc", "gelu=logpoly", "probe=ex2", "probe=ex2_rcp"))
    assert ("__fdividef" in src) == (form in ("gelu=erfc", "probe=ex2_rcp"))
    if form.startswith("probe=fma"):  # Horner's rule, every step there: its last constant, 1 / (n + 1), printed
        n = int(form.removeprefix("probe=fma"))
        assert (1.0 / (n + 1)).hex() + "f" in src and (1.0 / (n + 2)).hex() + "f" not in src
    default = kernel_source(proto_gemm_ws.gemm_ws(4096, 3072, 768, block_N=192, stages=4), SM90)  # restored
    assert "erff" not in default and (default == src) == (form == "gelu=logpoly")

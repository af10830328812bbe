"""The hand-written warp-specialized GEMM prototypes in ``bench/`` (``proto_gemm_ws``, dense, and
``proto_gemm_sp_ws``, 2:4 sparse) lower for sm_90a with their producer/consumer split and the one-WGMMA-in-flight
overlap, and refuse configs they cannot run (shared memory past the H200's 227 KB, a single stage) before compiling.
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


@pytest.mark.parametrize("proto,build,mma", [(proto_gemm_ws, proto_gemm_ws.gemm_ws, "wgmma_ss<"),
                                             (proto_gemm_sp_ws, proto_gemm_sp_ws.gemm_sp_ws, "wgmma_sp_ss<")])
def test_prototypes_lower_with_the_overlap(proto, build, mma):
    for c in proto.CONFIGS:  # (1000 rows: a partial last tile)
        src = kernel_source(build(1000, 2304, 768, **c), SM90)
        assert mma in src and "wait_wgmma<1>" in src and "tma_load" in src and "tma_store" in src, c
        assert "warpgroup_reg_alloc" in src and src.count("__syncthreads()") == 1, c


def test_prototypes_refuse_what_they_cannot_run():
    with pytest.raises(ValueError, match="shared memory"):
        proto_gemm_ws.gemm_ws(4096, 4096, 4096, block_M=128, block_N=256, block_K=64, stages=4)
    with pytest.raises(ValueError, match="shared memory"):
        proto_gemm_sp_ws.gemm_sp_ws(4096, 4096, 4096, block_M=256, block_N=128, block_K=128, stages=2)
    with pytest.raises(ValueError, match="at least 2"):
        proto_gemm_sp_ws.gemm_sp_ws(4096, 4096, 4096, block_M=256, block_N=128, block_K=64, stages=1)
    with pytest.raises(ValueError, match="64 weight rows per consumer"):
        proto_gemm_sp_ws.gemm_sp_ws(4096, 4096, 4096, block_N=192)

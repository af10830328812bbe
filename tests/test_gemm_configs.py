"""The GEMM config space as data: what is offered is valid, and the untuned pick is what the H200 measured best."""

import pytest

from tilefuse.lowering.templates.gemm_configs import (
    SMEM_LIMIT,
    default_config,
    get_configs,
    shared_memory_bytes,
    warp_partition_ok,
)

SM90 = {"kind": "cuda", "arch": "sm_90a"}


def _t(c):
    return (c["block_M"], c["block_N"], c["num_stages"], c["threads"], c.get("panel_size", 0) if
            c["enable_rasterization"] else 0)


@pytest.mark.parametrize("target", [SM90, {"kind": "cuda", "arch": "sm_80"}])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_offered_config_is_valid(target, dtype):
    configs = get_configs(target, dtype)
    assert configs
    fam = target["arch"].rstrip("a")[:5]
    for c in configs:
        assert shared_memory_bytes(c["block_M"], c["block_N"], c["block_K"], c["num_stages"], dtype) <= SMEM_LIMIT[fam]
        assert warp_partition_ok(c["block_M"], c["block_N"], c["threads"], fam == "sm_90" and dtype != "float32")
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)


def test_invalid_combinations_are_filtered_before_compiling():
    # WGMMA cannot split 128x256 or 256x128 over 12 warps ("No valid warp partition"); 256x192 it can
    assert not warp_partition_ok(128, 256, 384, wgmma=True) and not warp_partition_ok(256, 128, 384, wgmma=True)
    assert warp_partition_ok(256, 192, 384, wgmma=True)
    offered = {_t(c) for c in get_configs(SM90, "float16")}
    assert not any(bm in (128, 256) and bn in (128, 256) and thr == 384 for bm, bn, _, thr, _ in offered)
    # 256x256x64 with 4 stages needs 256 KiB of shared memory: more than sm_90 has
    assert not any((bm, bn, st) == (256, 256, 4) for bm, bn, st, _, _ in offered)


@pytest.mark.parametrize("M, N, want", [
    (8192, 768, (256, 192, 4, 256, 0)),     # GPT-2 attention output projection: 0.945x cuBLAS
    (8192, 3072, (256, 192, 4, 256, 0)),    # GPT-2 MLP up (512 tiles: no swizzle)
    (8192, 2048, (128, 256, 4, 256, 8)),    # LLaMA q/o projections: 1.02x cuBLAS
    (8192, 5632, (128, 256, 4, 256, 8)),    # LLaMA MLP: 192 does not divide N, 128x256 led (1.04x)
    (8192, 16384, (256, 192, 4, 256, 8)),   # many waves: swizzled (2.05 -> 1.88 ms)
])
def test_untuned_pick_is_the_measured_winner(M, N, want):
    pick = default_config(get_configs(SM90, "float16"), M, N, 1, SM90)
    assert _t(pick) == want and pick.get("stage_C")


def test_small_m_takes_small_tiles_and_cpu_takes_the_first():
    pick = default_config(get_configs(SM90, "float16"), 1, 2048, 1, SM90)
    assert pick["block_M"] == 64
    cpu = get_configs({"kind": "c"}, "float32")
    assert default_config(cpu, 512, 512, 1, {"kind": "c"}) == cpu[0]

"""AMD code objects on every commit (#17 items 1, 2, 6): every template kind and dtype, and every kernel of every zoo
model, compiled to gfx942 ``.hsaco`` with clang-19 (``lowering/vendor_hip.py``), each an AMD GPU ELF with 0 spills;
``tilefuse compile --target hip|metal|ascend`` with ``--emit-dir`` and ``-o``; a vendor artifact refused on load.

The toolchain comes from ``scripts/install_rocm_toolchain.sh``, which ``.ci/run`` runs first. Where it is missing these
tests fail (saying how to install it) rather than skip: a CI run that skipped them would check nothing.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import zipfile

import pytest
import torch
from template_cases import cases

import tilefuse
from tilefuse import cli, models
from tilefuse.api import compile_graph
from tilefuse.cli import _load_graph
from tilefuse.ir import torch_dtype
from tilefuse.lowering import vendor, vendor_hip
from tilefuse.lowering.compile import lower_source
from tilefuse.runtime.artifact import ArtifactMismatchError, ArtifactWarning

GFX942 = {"kind": "hip", "mcpu": "gfx942"}
WORKERS = 4  # clang is a subprocess and TileLang's lowering releases the GIL: threads overlap on 2 cores


@pytest.fixture(scope="module")
def toolchain():
    """The unpacked toolchain. CI installs it (.ci/run runs scripts/install_rocm_toolchain.sh) and fails without it;
    elsewhere (the README's test command on a fresh machine) these tests are skipped, saying how to get it."""
    tc = vendor_hip.find_toolchain()
    if tc is None and not os.environ.get("CI"):
        pytest.skip(vendor_hip.missing_message())
    assert tc is not None, vendor_hip.missing_message()
    return tc


def check_code_object(co: vendor_hip.CodeObject, what: str) -> None:
    """An AMD GPU ELF for gfx942 (e_machine EM_AMDGPU, mach 0x4c), every kernel reported, none spilling."""
    assert co.hsaco[:4] == b"\x7fELF" and int.from_bytes(co.hsaco[18:20], "little") == vendor_hip.EM_AMDGPU, what
    assert int.from_bytes(co.hsaco[48:52], "little") & 0xFF == 0x4C, what
    assert co.resources, f"{what}: clang reported no kernel resources"
    for r in co.resources:
        assert r.spills == 0 and r.scratch == 0, f"{what}: {r}"
        assert 0 < r.vgprs <= 512 and r.occupancy >= 1 and r.lds <= vendor_hip.LDS_BYTES, f"{what}: {r}"


def test_every_template_kind_and_dtype_compiles_to_gfx942(toolchain):
    built = cases(GFX942)
    for kind in ("elementwise", "gemm", "reduction", "layer_norm", "conv", "pool", "attention"):
        assert any(kind in n for n in built), kind
    for dt in ("float32", "float16", "bfloat16"):
        assert any(n.endswith(dt) for n in built), dt

    funcs = {name: make() for name, make in built.items()}  # (TileLang's PrimFunc builder: one thread at a time)

    def one(name):
        src, shared = lower_source(funcs[name], GFX942)
        return name, vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared)

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, built))
    for name, co in results:
        check_code_object(co, name)
    mfma = next(co for name, co in results if name == "gemm_plain_float16")
    assert mfma.resources[0].agprs > 0  # the GEMM accumulates in MFMA registers


def test_every_zoo_kernel_compiles_to_gfx942(toolchain):
    """Each distinct kernel of every zoo model (tiny, fp16) compiled once; every region got a kernel."""
    specs, plans = {}, {}
    for name in models.ZOO:
        plan, found = vendor.source_plan(_load_graph(name, "tiny", None, "float16"), GFX942)
        assert found and all(r.backend == "tilelang" for r in plan.regions if r.launches), plan.to_text()
        specs.update({f"{name}.{r}": s for r, s in found.items()})
        plans[name] = plan
    b = vendor.emit(plans["mlp"], specs, GFX942, workers=WORKERS)
    failed = [r for r in b.plan.refusals if "no hip kernel" in r]
    assert not failed, failed
    assert len(b.kernels) == len(specs)
    distinct = {k.key: k for k in b.kernels}
    print(f"[hip zoo] {len(specs)} kernels, {len(distinct)} distinct, max VGPRs "
          f"{max(r.vgprs for k in distinct.values() for r in k.resources)}")
    for k in distinct.values():
        check_code_object(vendor_hip.CodeObject("gfx942", k.product, k.resources), k.region)


def test_resource_remarks_are_parsed():
    remarks = "\n".join(f"/tmp/k.hip:10:1: remark: {line} [-Rpass-analysis=kernel-resource-usage]" for line in (
        "Function Name: gemm_kernel", "    SGPRs: 28", "    VGPRs: 103", "    AGPRs: 48",
        "    ScratchSize [bytes/lane]: 16", "    Dynamic Stack: False", "    Occupancy [waves/SIMD]: 3",
        "    SGPRs Spill: 2", "    VGPRs Spill: 5", "    LDS Size [bytes/block]: 8192", "Function Name: other",
        "    VGPRs: 7"))
    a, b = vendor_hip.parse_resources(remarks)
    assert (a.name, a.sgprs, a.vgprs, a.agprs, a.scratch, a.occupancy, a.sgpr_spill, a.vgpr_spill, a.lds) == \
        ("gemm_kernel", 28, 103, 48, 16, 3, 2, 5, 8192) and a.spills == 7
    assert (b.name, b.vgprs, b.spills) == ("other", 7, 0)


def test_spill_and_compile_errors_raise(toolchain):
    # 200 live floats per lane under a 64-VGPR cap: the register allocator must spill
    src = ("#include <hip/hip_runtime.h>\nextern \"C\" __global__ void __launch_bounds__(1024) __attribute__(("
           "amdgpu_num_vgpr(32))) k(float *x) {\n  float v[200];\n#pragma unroll\n  for (int i = 0; i < 200; ++i) "
           "v[i] = x[threadIdx.x * 200 + i] * x[i];\n  float s = 0;\n#pragma unroll\n  for (int i = 0; i < 200; ++i) "
           "s += v[i] * v[199 - i];\n  x[threadIdx.x] = s;\n}\n")
    with pytest.raises(vendor_hip.HipSpillError, match="spills"):
        vendor_hip.compile_hip(src, "gfx942", toolchain)
    co = vendor_hip.compile_hip(src, "gfx942", toolchain, allow_spills=True)
    assert co.resources[0].spills > 0
    with pytest.raises(vendor_hip.HipCompileError, match="65537 bytes of dynamic shared memory, past gfx942's 65536"):
        vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=65537)
    with pytest.raises(vendor_hip.HipCompileError, match="clang-19 failed for gfx942"):
        vendor_hip.compile_hip("__global__ void k() { undeclared(); }", "gfx942", toolchain)


def test_unknown_arch_lists_the_known_ones(capsys):
    with pytest.raises(ValueError, match=r"unknown AMD arch 'gfx1234'.*known: gfx908, gfx90a, gfx940, gfx941, gfx942"):
        vendor_hip.arch_of("hip:gfx1234")
    assert vendor_hip.arch_of("hip") == "gfx942" and vendor_hip.arch_of({"kind": "hip", "mcpu": "gfx90a"}) == "gfx90a"
    assert cli.main(["compile", "mlp", "--target", "hip:gfx1234"]) == 2
    assert "known: gfx908, gfx90a" in capsys.readouterr().err


def mlp_kernels() -> int:
    """The MLP's regions that take a template on hip."""
    return len(vendor.source_plan(_load_graph("mlp", "tiny", None, "float16"), GFX942)[1])


def test_compile_hip_emit_dir_and_artifact(toolchain, tmp_path, capsys):
    out, tfz = tmp_path / "k", tmp_path / "mlp.tfz"
    assert cli.main(["compile", "mlp", "--target", "hip:gfx90a", "--emit-dir", str(out), "-o", str(tfz), "-q"]) == 0
    text = capsys.readouterr().out
    hips = sorted(out.glob("*.hip"))
    assert len(hips) == mlp_kernels() >= 2 and all(h.with_suffix(".hsaco").is_file() for h in hips), text
    for h in hips:  # gfx90a's mach id in the ELF flags
        assert int.from_bytes(h.with_suffix(".hsaco").read_bytes()[48:52], "little") & 0xFF == 0x3F
        assert "__global__" in h.read_text() and f"{h.stem} " in text
    assert "VGPR" in (out / "summary.txt").read_text() and "occupancy" in text and "0 spills" in text
    with zipfile.ZipFile(tfz) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        assert manifest["target"] == {"kind": "hip", "mcpu": "gfx90a"}
        names = zf.namelist()
    assert sum(n.endswith(".hsaco") for n in names) == sum(n.endswith(".hip") for n in names) == \
        len(manifest["vendor"]["kernels"]) > 0
    with pytest.raises(ArtifactMismatchError, match=r"target \{'kind': 'hip', 'mcpu': 'gfx90a'\}.*need an AMD GPU "
                                                   r"with ROCm.*target='c' \(this CPU\)"):
        tilefuse.load(tfz)
    with pytest.warns(ArtifactWarning, match="recompiling it from its graph"):
        model = tilefuse.load(tfz, target="c")
    xs = [torch.randn(v.type.shape, dtype=torch_dtype(v.type.dtype)) for v in model.graph.inputs]
    ref = compile_graph(model.graph, target="c", lower=False)(*xs)  # every region through torch
    got = model(*xs)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        # fp16 outputs in two summation orders. The weights are graph inputs drawn from N(0, 1), so outputs reach
        # ~500 (an fp16 step of 0.25-0.5) and an element that cancels to ~0 can differ by that step: the absolute
        # tolerance scales with the output, as in test_sparse. A fixed atol=1e-2 failed in CI (2026-12-03) and in
        # 37 of 200 seeded draws of the kernels against torch; scaled, the worst of those 200 used 5% of it.
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2 * float(b.abs().max()))


def test_without_the_toolchain_source_is_written_and_the_script_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILEFUSE_ROCM_DIR", str(tmp_path / "absent"))
    assert vendor_hip.find_toolchain() is None
    assert cli.main(["compile", "mlp", "--target", "hip", "--emit-dir", str(tmp_path / "k"), "-q"]) == 0
    text = capsys.readouterr().out
    assert len(list((tmp_path / "k").glob("*.hip"))) == mlp_kernels(), text
    assert not list((tmp_path / "k").glob("*.hsaco")) and "scripts/install_rocm_toolchain.sh" in text
    with pytest.raises(FileNotFoundError, match="install_rocm_toolchain.sh"):
        vendor_hip.compile_hip("", "gfx942")


@pytest.mark.parametrize(("target", "ext", "need"), [("metal", "metal", "an Apple GPU"),
                                                     ("ascend", "cpp", "an Ascend NPU")])
def test_source_targets_emit_and_their_artifacts_are_refused(target, ext, need, tmp_path, capsys):
    out, tfz = tmp_path / "k", tmp_path / "m.tfz"
    assert cli.main(["compile", "gpt2", "--target", target, "--emit-dir", str(out), "-o", str(tfz), "-q"]) == 0
    text = capsys.readouterr().out
    plan, specs = vendor.source_plan(_load_graph("gpt2", "tiny", None, "float16"), {"kind": target})
    emitted = {p.stem for p in out.glob(f"*.{ext}")}
    assert emitted <= set(specs) and "summary.txt" in {p.name for p in out.iterdir()}
    for r in plan.regions:  # each launching region: its kernel's source, or torch with the reason
        if r.launches:
            assert (r.name in emitted) != (f"  {r.name} runs through torch: " in text), (r.name, text)
    with pytest.raises(ArtifactMismatchError, match=f"target {{'kind': '{target}'}}.*need {need}"):
        tilefuse.load(tfz)
    assert cli.main(["explain", "gpt2", "--target", target]) == 0
    assert "kernels" in capsys.readouterr().out


def test_decode_attention_with_bound_and_split_compiles_to_gfx942(toolchain):
    """A decode step's attention as the planner builds it for an AMD GPU: the bound's mask scan (lanes from
    threadIdx.x there: HIP has no tl::get_lane_idx) and the keys split in parts with the combining kernel."""
    from tilefuse.lowering.templates import attention

    configs = attention.decode_configs(GFX942, 1, 4, True, B=1, Hkv=8, Skv=4096)[:2]
    assert configs[0].get("splits", 1) > 1 and all(c["bound_keys"] for c in configs)
    for cfg in configs:
        f = attention.flash_attention(1, 32, 1, 4096, 64, Hkv=8, mask_shape=(1, 1, 1, 4096), mask_dtype="float16",
                                      dtype="float16", target=GFX942, split_max=attention.SPLIT_MAX, **cfg)
        src, shared = lower_source(f, GFX942)
        co = vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared)
        check_code_object(co, str(cfg))
        assert len(co.resources) == (2 if cfg.get("splits", 1) > 1 else 1), co.resources


def test_decode_linear_layers_compile_to_gfx942_as_gemv(toolchain):
    """A decode step's linear layer planned for an AMD GPU is a ``gemv`` spec (not a 64-row GEMM tile of padding), and
    every gemv config compiles to a gfx942 code object (the shuffles span 32 lanes, half a wavefront), a norm of the
    input among them."""
    from tilefuse.config import Options
    from tilefuse.ir import TensorType
    from tilefuse.lowering.dispatch import build
    from tilefuse.lowering.expr import Acc, Arg, Call
    from tilefuse.lowering.templates import gemv
    from tilefuse.ops import GraphBuilder
    from tilefuse.pipeline import plan_step

    b = GraphBuilder("decode_linear")
    x, w = b.input("x", TensorType((1, 1, 2048), "float16")), b.input("w", TensorType((512, 2048), "float16"))
    plan = plan_step(b.build([b.add("linear", [x, w])[0]]), Options(target=GFX942, quiet=True)).plan
    specs = [build(r, plan.graph, GFX942, source=True) for r in plan.regions if r.kind == "gemm"]
    assert [s.template for s in specs] == ["gemv"], specs  # (as `tilefuse compile --target hip` plans for source)
    for cfg in gemv.get_configs(GFX942):
        for M, N, K in ((1, 512, 2048), (3, 100, 13)):
            f = gemv.gemv(M, N, K, epilogue=Call("add", (Acc(), Arg(0))), extra_shapes=[(N,)], extra_dtypes=["float16"],
                          target=GFX942, **cfg)
            src, shared = lower_source(f, GFX942)
            check_code_object(vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared), f"{cfg} {M}")
        f = gemv.gemv_group(1, (2048, 512, 512), 2048, target=GFX942, **cfg)  # q/k/v in one launch
        src, shared = lower_source(f, GFX942)
        check_code_object(vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared), f"{cfg} group")
        f = gemv.gemv_group(1, (2048, 512, 512), 2048, norm_eps=1e-5, norm_weight="float16", target=GFX942,
                            **cfg)  # the same, its input RMS-normalized in the pass (planner.norm_fold)
        src, shared = lower_source(f, GFX942)
        check_code_object(vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared), f"{cfg} norm")
        f = gemv.gemv_group(1, (5632, 5632), 2048, epilogues=[Call("silu", (Acc(),)), Call("mul", (Arg(0), Acc()))],
                            extras_of=[(), (-1,)], stored=(False, True), target=GFX942, **cfg)  # gate and up joined
        src, shared = lower_source(f, GFX942)
        check_code_object(vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared), f"{cfg} gated")


def test_a_cache_store_compiles_to_gfx942_with_a_trap(toolchain):
    """An in-place ``index_copy`` store (a static cache's update) for AMD: ``__builtin_trap`` where CUDA has
    ``__trap`` (an index out of range, torch's device-side assert)."""
    from tilefuse.lowering.expr import Arg, Coord, Load
    from tilefuse.lowering.templates import elementwise

    f = elementwise.elementwise([(2, 8, 64, 64), (1,), (2, 8, 1, 64)], ["float16", "int64", "float16"], [Arg(2)],
                                ["float16"], out_shapes=[(2, 8, 1, 64)], scatters=[(0, 2, Load(1, (Coord(2),)))],
                                target=GFX942)
    src, shared = lower_source(f, GFX942)
    assert "__builtin_trap()" in src
    check_code_object(vendor_hip.compile_hip(src, "gfx942", toolchain, dynamic_lds=shared), "cache store")

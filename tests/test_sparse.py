"""2:4 sparsity: the compressor, the graph pass, planning, the gemm_sp template (compiled for sm_90a/sm_80 with
nvcc here, numerics on the GPU with ``-m gpu``) and sparse compiles end to end on ``c`` against the pruned
model in eager.
"""

import shutil

import pytest
import torch

import tilefuse
from tilefuse import models, ops
from tilefuse.api import compile_graph
from tilefuse.config import default_target
from tilefuse.ir import TensorType
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import compile_kernel, compile_many, lower_source
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.lower import make_prim_func
from tilefuse.lowering.templates import gemm_sp
from tilefuse.ops import GraphBuilder
from tilefuse.ops.sparse_layout import compress_2_4, decompress_2_4, is_2_4, padded_k, prune_2_4
from tilefuse.pipeline import plan
from tilefuse.planner.sparsity import meta_k_major, prune_module, sparsify

C = {"kind": "c"}
H200 = {"kind": "cuda", "arch": "sm_90a"}
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def randn(rng, shape, dtype=torch.float32):
    return torch.randn(shape, generator=rng).to(dtype)


# ---- the compressor ------------------------------------------------------------------------------------------

def naive_compress(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One group at a time, as TileLang's example compressor lays it out: the two kept positions ascending
    (nonzeros first), code ``i0 | i1 << 2``, four codes per int16 from the low bits, K padded to 32."""
    n, k = w.shape
    kp = padded_k(k)
    w = torch.nn.functional.pad(w, (0, kp - k))
    values = torch.zeros(n, kp // 2, dtype=w.dtype)
    meta = [[0] * (kp // 16) for _ in range(n)]
    for r in range(n):
        for g in range(kp // 4):
            nz = [i for i in range(4) if w[r, 4 * g + i] != 0]
            i0, i1 = sorted((nz + [i for i in range(4) if i not in nz])[:2])
            values[r, 2 * g], values[r, 2 * g + 1] = w[r, 4 * g + i0], w[r, 4 * g + i1]
            meta[r][g // 4] |= (i0 | i1 << 2) << (4 * (g % 4))
    m = torch.tensor(meta, dtype=torch.int32)
    return values, torch.where(m >= 1 << 15, m - (1 << 16), m).to(torch.int16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [64, 70, 96])
def test_compress_layout_and_round_trip(rng, dtype, k):
    w = prune_2_4(randn(rng, (24, k), dtype))
    w[3, :8] = 0  # groups with fewer than two nonzeros
    w[5, 1] = w[5, 2] = 0
    w[5, 3] = 1.5
    values, meta = compress_2_4(w)
    assert values.shape == (24, padded_k(k) // 2) and values.dtype == dtype
    assert meta.shape == (24, padded_k(k) // 16) and meta.dtype == torch.int16
    want_v, want_m = naive_compress(w)
    assert torch.equal(values, want_v) and torch.equal(meta, want_m)
    codes = torch.stack([(meta.int() >> (4 * j)) & 0xF for j in range(4)], -1)
    assert bool(((codes & 3) < (codes >> 2)).all()), "every group names two ascending positions"
    assert torch.equal(decompress_2_4(values, meta, k), w)
    assert decompress_2_4(values, meta).shape == (24, padded_k(k))


def test_prune_keeps_the_two_largest_and_breaks_ties_low(rng):
    w = torch.tensor([[1.0, -3.0, 2.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 7.0, -2.0, 2.0, 1.0, -2.0]])
    w = torch.cat([w, torch.zeros(1, 48)], 1)
    p = prune_2_4(w)
    assert p[0, :16].tolist() == [0.0, -3.0, 2.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, -2.0, 2.0, 0.0, 0.0]
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = randn(rng, (32, 100), dtype)
        p = prune_2_4(x)
        assert p.dtype == dtype and p.shape == x.shape and is_2_4(p) and torch.equal(prune_2_4(p), p)
        g = torch.nn.functional.pad(x.float(), (0, 28)).reshape(32, -1, 4).abs()
        kept = torch.nn.functional.pad(p.float(), (0, 28)).reshape(32, -1, 4) != 0
        # every kept |value| is at least every dropped one in its group
        assert bool((torch.where(kept, g, torch.inf).amin(-1) >= torch.where(kept, -torch.inf, g).amax(-1)).all())


def test_is_2_4_detection(rng):
    w = prune_2_4(randn(rng, (64, 128)))
    assert is_2_4(w) and is_2_4(torch.zeros(16, 64)) and not is_2_4(randn(rng, (64, 128)))
    w[40, 4:7] = 1.0  # three nonzeros in one group, past the rows looked at first
    assert not is_2_4(w)
    assert not is_2_4(torch.ones(4))
    with pytest.raises(ValueError, match="not 2:4 sparse"):
        compress_2_4(w)


def test_sparse_linear_op_is_linear_on_the_decompressed_weight(rng):
    w = prune_2_4(randn(rng, (48, 80)))
    x, b = randn(rng, (3, 5, 80)), randn(rng, (48,))
    values, meta = compress_2_4(w)
    spec = ops.get("sparse_linear")
    (y,) = spec.run([x, values, meta, b], {"in_features": 80})
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b))
    # K-major metadata; the dense form, when given, is what the reference multiplies
    vk, mk = compress_2_4(w, k_major=True)
    assert torch.equal(vk, values) and torch.equal(mk, meta.t())
    (yk,) = spec.run([x, vk, mk, b], {"in_features": 80, "meta_k_major": True})
    torch.testing.assert_close(yk, y, rtol=0, atol=0)
    (yd,) = spec.run([x, vk, mk, b, w], {"in_features": 80, "meta_k_major": True})
    torch.testing.assert_close(yd, y, rtol=0, atol=0)
    types = ops.infer_types("sparse_linear", [TensorType(("b", 5, 80), "float16"), TensorType.of(values),
                                              TensorType.of(meta), None], {"in_features": 80})
    assert types == [TensorType(("b", 5, 48), "float16")]


# ---- the graph pass and planning --------------------------------------------------------------------------

def _mlp_graph(rng, dtype=torch.float32, tied=False):
    """x -> linear(W1, b1) -> gelu -> matmul(., permute(W2)) + b2 (ONNX style) -> matmul(., W3 (K, N)) [+ tied use]."""
    dt = str(dtype).removeprefix("torch.")

    def randn(rng, shape, dtype):  # weights scaled so that activations stay O(1)
        return (torch.randn(shape, generator=rng) / shape[-1] ** 0.5).to(dtype)

    b = GraphBuilder("sparse_mlp")
    x = b.input("x", TensorType((37, 64), dt))
    w1, b1 = b.constant("w1", randn(rng, (128, 64), dtype)), b.constant("b1", randn(rng, (128,), dtype))
    w2, b2 = b.constant("w2", randn(rng, (96, 128), dtype)), b.constant("b2", randn(rng, (96,), dtype))
    w3 = b.constant("w3", randn(rng, (96, 80), dtype))
    small = b.constant("small", randn(rng, (16, 80), dtype))  # N=16, K=80: eligible; w4 (K=16) is not
    w4 = b.constant("w4", randn(rng, (32, 16), dtype))
    h = b.add1("gelu", [b.add1("linear", [x, w1, b1])])
    h = b.add1("add", [b.add1("matmul", [h, b.add1("permute", [w2], perm=(1, 0))]), b2])
    y = b.add1("matmul", [h, w3])
    z = b.add1("linear", [b.add1("linear", [y, small]), w4])
    outs = [y, z]
    if tied:
        outs.append(b.add1("embedding", [w1, b.input("ids", TensorType((4,), "int64"))]))
    return b.build(outs)


def test_sparsify_prunes_every_eligible_weight_the_same_on_every_target(rng):
    g = _mlp_graph(rng)
    on_c, rep_c = sparsify(g, C, "2:4")
    assert {p.name for p in rep_c.pruned} == {"w1", "w2", "w3", "small"}
    assert dict(rep_c.skipped) == {"w4": "shape (N=32, K=16): needs K >= 64, K % 8 == 0 and N % 16 == 0"}
    assert all(abs(p.zeroed - 0.5) < 0.01 and 0 < p.rel_change < 1 for p in rep_c.pruned)
    w1, w3 = on_c.constants["w1.pruned_2_4"], on_c.constants["w3.pruned_2_4"]
    assert is_2_4(w1) and is_2_4(w3.T) and not is_2_4(on_c.constants["w4"]) and "w1" not in on_c.constants
    assert [n.op for n in on_c.nodes] == [n.op for n in g.nodes]  # c: dense GEMMs on the pruned weights
    assert on_c.nodes[0].inputs == ("x", "w1.pruned_2_4", "b1")
    assert {w for w, _ in rep_c.dense} == {"w1", "w2", "w3", "small"} and not rep_c.sparse_kernel
    on_cuda, rep = sparsify(g, H200, "2:4")  # fp32 weights: pruned, but gemm_sp multiplies fp16/bf16
    assert not rep.sparse_kernel and all("fp16/bf16" in why for _, why in rep.dense)
    for k in ("w1", "w2", "w3", "small"):
        torch.testing.assert_close(on_cuda.constants[f"{k}.pruned_2_4"], on_c.constants[f"{k}.pruned_2_4"], rtol=0,
                                   atol=0)
    assert sparsify(g, C, None)[0] is g  # no option: nothing to do on c


def test_sparsify_on_cuda_compresses_and_rewrites(rng):
    g = _mlp_graph(rng, torch.float16)
    sg, rep = sparsify(g, H200, "2:4")
    assert set(rep.sparse_kernel) == {"w1", "w2", "w3", "small"}
    assert sg.op_counts()["sparse_linear"] == 4 and "permute" not in sg.op_counts() and "w2" not in sg.constants
    compressed = sum(sg.constants[f"{w}.{k}_2_4"].nbytes for w in ("w1", "w2", "w3", "small")
                     for k in ("values", "meta"))
    assert rep.compressed_bytes == compressed and "MiB kept beside the dense 2:4 weights" in rep.summary()
    node = next(n for n in sg.nodes if n.name == "linear")
    assert node.inputs[1:] == ("w1.values_2_4", "w1.meta_2_4", "b1", "w1.pruned_2_4")
    assert node.attr == {"in_features": 64, "meta_k_major": True}  # sm_90: TMA reads K-major metadata at any depth
    dense = sg.constants["w1.pruned_2_4"]
    values, meta = sg.constants["w1.values_2_4"], sg.constants["w1.meta_2_4"]
    assert meta.shape == (64 // 16, 128) and meta.is_contiguous()
    assert torch.equal(decompress_2_4(values, meta, 64, k_major=True), dense) and is_2_4(dense)
    # a transposed weight (ONNX's matmul(x, W^T)) keeps its dense form as (N, K), the (K, N) constant goes
    w3 = next(n for n in sg.nodes if n.op == "sparse_linear" and n.inputs[1] == "w3.values_2_4")
    assert w3.inputs[4] == "w3.dense_2_4" and sg.constants["w3.dense_2_4"].shape == (80, 96)
    assert "w3.pruned_2_4" not in sg.constants and "w3" not in sg.constants
    a100, _ = sparsify(g, {"kind": "cuda", "arch": "sm_80"}, "2:4")  # mma.sp kernels read it row-major
    assert next(n for n in a100.nodes if n.name == "linear").attr["meta_k_major"] is False
    x = randn(rng, (37, 64), torch.float16)
    from tilefuse.ops.reference import run_graph

    pruned, _ = sparsify(g, C, "2:4")
    for a, b in zip(run_graph(sg, x), run_graph(pruned, x)):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    # already 2:4 weights take the sparse kernel without the option, on CUDA only
    _, rep = sparsify(pruned, H200, None)
    assert set(rep.already_2_4) == set(rep.sparse_kernel) == {f"{w}.pruned_2_4" for w in ("w1", "w2", "w3", "small")}
    assert not rep.pruned
    assert sparsify(pruned, C, None)[0] is pruned


def test_tied_and_input_weights_are_not_pruned(rng):
    g = _mlp_graph(rng, tied=True)
    sg, rep = sparsify(g, C, "2:4")
    assert "w1" in dict(rep.skipped) and "tied" in dict(rep.skipped)["w1"]
    assert torch.equal(sg.constants["w1"], g.constants["w1"])
    with pytest.raises(ValueError, match="unknown sparsity '1:4'"):
        sparsify(g, C, "1:4")


def test_plan_marks_sparse_regions_and_builds_gemm_sp_specs(rng):
    g = _mlp_graph(rng, torch.float16)
    p = plan(g, H200, sparsity="2:4")
    kinds = {r.name: (r.kind, r.pattern, r.backend) for r in p.regions if r.kind != "view"}
    sparse = [r for r in p.regions if r.kind == "gemm_sp"]
    assert len(sparse) == 4 and all(r.pattern == "gemm.sparse_2_4" and r.backend == "tilelang" for r in sparse), kinds
    first = build(sparse[0], p.graph, H200)
    assert isinstance(first, KernelSpec) and first.template == "gemm_sp"
    kw = first.factory_kwargs()
    assert (kw["M"], kw["N"], kw["K"]) == (37, 128, 64) and str(kw["epilogue"]) == "gelu(add(acc, arg0))"
    assert p.sparsity.sparse_kernel and "gemm_sp" in p.to_text()
    pc = plan(g, C, sparsity="2:4")
    assert not any(r.kind == "gemm_sp" for r in pc.regions)
    assert sum(r.pattern == "gemm.dense_2_4" for r in pc.regions) == 4
    assert len(pc.notes) == 4 and all("no gemm_sp" in n for n in pc.notes) and "notes:" in pc.to_text()


def test_sparse_linear_on_c_runs_through_torch(rng):
    g = _mlp_graph(rng, torch.float16)
    sg, _ = sparsify(g, H200, "2:4")  # a graph compiled for CUDA, run on c: sparse_linear has no c template
    m = compile_graph(sg, target="c")
    regions = [r for r in m.plan.regions if r.kind == "gemm_sp"]
    assert regions and all(r.backend == "torch" for r in regions)
    assert any("no gemm_sp" in why for why in m.plan.refusals)
    x = randn(rng, (37, 64), torch.float16)
    from tilefuse.ops.reference import run_graph

    for a, b in zip(m(x), run_graph(sg, x)):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


# ---- end to end on c ------------------------------------------------------------------------------------------

def test_compile_mlp_with_sparsity_matches_the_pruned_model_in_eager():
    model, inputs = models.build("mlp", "tiny")
    torch._dynamo.reset()
    compiled = tilefuse.compile(model, target="c", sparsity="2:4")
    with torch.no_grad():
        out = compiled(*inputs)
        ref = prune_module(model)(*inputs)
        dense = model(*inputs)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    report = compiled.sparsity_report
    assert {(p.name, p.shape) for p in report.pruned} == {("mlp.fc1.weight", (256, 64)), ("mlp.fc2.weight", (64, 256))}
    change = float((ref - dense).abs().max() / dense.abs().max())
    assert report.max_rel_change == pytest.approx(change, rel=1e-3) and change > 1e-3
    assert "2 weights pruned" in report.summary() and not report.sparse_kernel
    assert not torch.equal(model.mlp.fc1.weight, prune_module(model).mlp.fc1.weight)  # the user's model is untouched


def test_compile_graph_with_sparsity_reports_random_input_change(rng, caplog):
    g = _mlp_graph(rng)
    with caplog.at_level("WARNING", logger="tilefuse"):
        m = compile_graph(g, target="c", sparsity="2:4")
    assert "outputs changed by up to" in caplog.text
    rep = m.sparsity_report
    assert len(rep.pruned) == 4 and rep.measured_on.startswith("random") and rep.max_rel_change > 0
    x = randn(rng, (37, 64))
    from tilefuse.ops.reference import run_graph

    pruned, _ = sparsify(g, C, "2:4")
    for a, b in zip(m(x), run_graph(pruned, x)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert compile_graph(g, target="c").sparsity_report is None


def test_sparse_compile_saves_and_loads(rng, tmp_path):
    g = _mlp_graph(rng)
    m = compile_graph(g, target="c", sparsity="2:4")
    tilefuse.save(m, tmp_path / "sparse.tfz")
    loaded = tilefuse.load(tmp_path / "sparse.tfz", strict=True)
    assert loaded.options.sparsity == "2:4"
    x = randn(rng, (37, 64))
    for a, b in zip(loaded(x), m(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cli_explain_with_sparsity(capsys):
    from tilefuse import cli

    assert cli.main(["explain", "mlp", "--target", "c", "--sparsity", "2:4", "--json"]) == 0
    import json

    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{"):])
    assert len(doc["sparsity"]["pruned"]) == 2 and len(doc["notes"]) == 2


# ---- the template: CUDA compile here, numerics on the GPU ------------------------------------------------------

@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_gemm_sp_compiles_for_cuda(arch):
    target = {"kind": "cuda", "arch": arch}
    epi = call("gelu", Acc() + Arg(0))
    funcs = [gemm_sp.gemm_sp(512, 768, 256, **gemm_sp.get_configs(target, 256)[0], target=target),
             gemm_sp.gemm_sp(37, 48, 200, dtype="bfloat16", epilogue=epi, extra_shapes=[(48,)],
                             extra_dtypes=["bfloat16"], **gemm_sp.get_configs(target, 200)[-1], target=target),
             gemm_sp.gemm_sp(200, 256, 768, epilogue=Acc() + Arg(0), extra_shapes=[(200, 256)], extra_dtypes=["float32"],
                             out_dtype="float32", **gemm_sp.get_configs(target, 768, "float32")[0], target=target)]
    built = compile_many([(f, [-1]) for f in funcs], target, return_exceptions=True)
    inst = "wgmma_sp" if arch.startswith("sm_90") else "mma_sp"
    for k in built:
        assert not isinstance(k, BaseException), str(k)[-2000:]
        assert inst in k.get_kernel_source()


def test_gemm_sp_refuses_what_it_cannot_compute():
    with pytest.raises(NotImplementedError, match="c target"):
        gemm_sp.gemm_sp(64, 64, 64, target=C)
    with pytest.raises(NotImplementedError, match="float32"):
        gemm_sp.gemm_sp(64, 64, 64, dtype="float32", target=H200)
    with pytest.raises(ValueError, match="multiples of 16"):
        gemm_sp.gemm_sp(64, 64, 64, block_M=72, block_K=64, target=H200)
    with pytest.raises(ValueError, match="block_K"):
        gemm_sp.gemm_sp(64, 64, 200, block_K=64, target=H200)  # padded K 224 is not a multiple of 64
    assert gemm_sp.get_configs(C) == []
    for k in (64, 200, 768, 4096):
        cfgs = gemm_sp.get_configs(H200, k)
        assert cfgs and all(padded_k(k) % c["block_K"] == 0 and c["block_N"] % 16 == 0 for c in cfgs)


@needs_nvcc
def test_sparse_regions_compile_for_sm_90a(rng):
    g = _mlp_graph(rng, torch.float16)
    p = plan(g, H200, sparsity="2:4")
    specs = [build(r, p.graph, H200) for r in p.regions if r.kind == "gemm_sp"]
    built = compile_many([(make_prim_func(s, H200), list(s.out_idx)) for s in specs], H200, return_exceptions=True)
    assert not [k for k in built if isinstance(k, BaseException)], [str(k)[-500:] for k in built]


def test_full_shape_epilogue_inputs_are_staged_through_shared_memory():
    """silu(acc) * up with ``up`` of the output's shape: read as one coalesced tile (vector loads), not gathered at
    the transposed accumulator's layout; the shared-memory estimate counts the tile."""
    epi = call("mul", call("silu", Acc()), Arg(0))
    M, N, K = 512, 256, 128
    assert gemm_sp.staged_extras(M, N, epi, [(M, N)]) == (0,) and gemm_sp.staged_extras(M, N, epi, [(N,)]) == ()
    cfg = gemm_sp.get_configs(H200, K, meta_k_major=True, staged_tiles=1)[0]
    f = gemm_sp.gemm_sp(M, N, K, **cfg, meta_k_major=True, epilogue=epi, extra_shapes=[(M, N)],
                        extra_dtypes=["float16"], target=H200)
    src, smem = lower_source(f, H200)
    assert "*(uint4*)(extra0" in src.replace(" ", ""), src
    assert smem <= gemm_sp.shared_memory_bytes(cfg["block_M"], cfg["block_N"], cfg["block_K"], cfg["num_stages"],
                                               staged_tiles=1)


GPU_CASES = {
    "aligned": (512, 768, 256, None, []),
    "tails_bias_gelu": (37, 48, 200, call("gelu", Acc() + Arg(0)), [(48,)]),
    "residual": (200, 256, 768, Acc() + Arg(0), [(200, 256)]),
}


@pytest.fixture(scope="module")
def gpu_target():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return default_target()  # this GPU


def _check_gemm_sp(rng, target, M, N, K, epilogue, extra_shapes, dtype, config, k_major=False):
    dt = getattr(torch, dtype)
    w = prune_2_4(randn(rng, (N, K), dt))
    values, meta = compress_2_4(w, k_major=k_major)
    x = randn(rng, (M, K), dt)
    extras = [randn(rng, s, dt) for s in extra_shapes]
    f = gemm_sp.gemm_sp(M, N, K, dtype=dtype, epilogue=epilogue, extra_shapes=extra_shapes,
                        extra_dtypes=[dtype] * len(extras), meta_k_major=k_major, **config, target=target)
    y = compile_kernel(f, target, out_idx=[-1])(x.cuda(), values.cuda(), meta.cuda(), *(e.cuda() for e in extras))
    ref = gemm_sp.reference(x, values, meta, extras, K=K, epilogue=epilogue, meta_k_major=k_major)
    scale = float(ref.float().abs().max())
    torch.testing.assert_close(y.cpu().float(), ref.float(), rtol=1e-2, atol=1e-2 * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gemm_sp_numerics_gpu(rng, gpu_target, case, dtype):
    M, N, K, epi, shapes = GPU_CASES[case]
    k_major = meta_k_major(gpu_target)  # the planner's layout on this GPU
    config = gemm_sp.get_configs(gpu_target, K, meta_k_major=k_major)[0]
    _check_gemm_sp(rng, gpu_target, M, N, K, epi, shapes, dtype, config, k_major)


@pytest.mark.gpu
def test_gemm_sp_every_seed_config_gpu(rng, gpu_target):
    """Every config of the space (compiled in parallel) on one shape: wrong code in any of them shows here."""
    M, N, K = 384, 512, 512
    k_major = meta_k_major(gpu_target)
    configs = gemm_sp.get_configs(gpu_target, K, meta_k_major=k_major)
    funcs = [(gemm_sp.gemm_sp(M, N, K, **c, meta_k_major=k_major, target=gpu_target), [-1]) for c in configs]
    kernels = compile_many(funcs, gpu_target)
    w = prune_2_4(randn(rng, (N, K), torch.float16))
    values, meta = compress_2_4(w, k_major=k_major)
    x = randn(rng, (M, K), torch.float16)
    ref = gemm_sp.reference(x, values, meta, K=K, meta_k_major=k_major).float()
    for c, k in zip(configs, kernels):
        y = k(x.cuda(), values.cuda(), meta.cuda()).cpu().float()
        torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2 * float(ref.abs().max()), msg=lambda m, c=c: f"{c}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 512, 512), (200, 136, 200)], ids=["aligned", "tails"])
def test_gemm_sp_wide_space_gpu(rng, gpu_target, shape):
    """Every config of the wide space, either metadata layout (K-major configs read ``meta.T``), with a bias and
    GELU epilogue, on an aligned shape and one with tails in M, N and K (K padded to 224)."""
    M, N, K = shape
    epi = call("gelu", Acc() + Arg(0))
    configs = [(c, k) for k in (True, False) for c in gemm_sp.config_space(gpu_target, K, meta_k_major=k)]
    assert any(c["policy"] == "full_row" for c, _ in configs)
    funcs = [(gemm_sp.gemm_sp(M, N, K, **c, meta_k_major=k, epilogue=epi, extra_shapes=[(N,)],
                              extra_dtypes=["float16"], target=gpu_target), [-1]) for c, k in configs]
    kernels = compile_many(funcs, gpu_target)
    w = prune_2_4(randn(rng, (N, K), torch.float16))
    values, meta = compress_2_4(w)
    x, bias = randn(rng, (M, K), torch.float16), randn(rng, (N,), torch.float16)
    ref = gemm_sp.reference(x, values, meta, [bias], K=K, epilogue=epi).float()
    for (c, k_major), k in zip(configs, kernels):
        m = meta.t().contiguous() if k_major else meta
        y = k(x.cuda(), values.cuda(), m.cuda(), bias.cuda()).cpu().float()
        torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2 * float(ref.abs().max()), msg=lambda m, c=c: f"{c}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mlp", "gpt2", "llama"])
def test_zoo_models_with_sparsity_on_gpu(gpu_target, name):
    """Zoo models end to end on the GPU with ``sparsity="2:4"``: their linears run as gemm_sp kernels (the MLP's
    two exactly), attention (GPT-2 and LLaMA) as the flash-attention kernel, and the outputs match the pruned
    model in eager."""
    model, inputs = models.build(name, "small", dtype=torch.float16, device="cuda")
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(model, target=gpu_target, sparsity="2:4", observer=runners.append)
    with torch.no_grad():
        out = compiled(*inputs)
        ref = prune_module(model)(*inputs)
    regions = [r for run in runners for r in run.plan.regions]
    kinds = {k: [r for r in regions if r.kind == k] for k in ("gemm_sp", "attention")}
    assert kinds["gemm_sp"] and all(r.backend == "tilelang" for r in kinds["gemm_sp"]), regions
    assert all(r.backend == "tilelang" for r in kinds["attention"]), regions
    assert len(kinds["gemm_sp"]) == 2 if name == "mlp" else kinds["attention"], regions
    out, ref = (out[0] if isinstance(out, (tuple, list)) else out), (ref[0] if isinstance(ref, (tuple, list)) else ref)
    scale = float(ref.float().abs().max())
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * scale)
    report = compiled.sparsity_report
    assert report.sparse_kernel and report.max_rel_change > 0
    print(f"[sparse {name}] {len(kinds['gemm_sp'])} gemm_sp and {len(kinds['attention'])} attention regions; "
          f"{report.summary()}")


@pytest.mark.gpu
def test_measured_choice_weighs_gemm_sp_against_dense_on_gpu(gpu_target):
    """With the measured choice on, each 2:4 region runs as gemm_sp or as a dense GEMM on its dense 2:4 weight,
    whichever measured faster, the plan's notes say which with both times, and the outputs match the pruned
    model either way; LLaMA's gate/up regions carry silu(gate) * up, an epilogue reading a full (M, N) input."""
    model, inputs = models.build("llama", "small", dtype=torch.float16, device="cuda")
    torch._dynamo.reset()
    runners = []
    compiled = tilefuse.compile(model, target=gpu_target, sparsity="2:4", measure=True, observer=runners.append)
    with torch.no_grad():
        out, ref = compiled(*inputs), prune_module(model)(*inputs)
    out, ref = (out[0] if isinstance(out, (tuple, list)) else out), (ref[0] if isinstance(ref, (tuple, list)) else ref)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * float(ref.float().abs().max()))
    regions = [r for run in runners for r in run.plan.regions if r.kind == "gemm_sp"]
    notes = [n for run in runners for n in run.plan.notes]
    assert regions and any("silu" in r.name for r in regions), regions
    for r in regions:
        said = [n for n in notes if n.startswith(f"{r.name}: ") and "gemm_sp" in n]
        assert len(said) == 1 and " ms" in said[0], (r.name, notes)
        assert ("runs the 2:4 sparse kernel" in said[0]) == (r.backend == "tilelang"), (said, r.backend)
        assert r.backend in ("tilelang", "torch", "split"), r
    print(f"[sparse choice] {sum(r.backend == 'tilelang' for r in regions)} of {len(regions)} regions on gemm_sp")


def test_untuned_pick_and_tuning_candidates_for_2_4_regions(rng):
    """The untuned pick keeps the first measured seed unless its padded waves cost 10% more than another seed's
    (the MLP's first linear, 8192 x 16384: 256x128, not 128x128 for 1.6% fewer waves); a few tokens take the
    narrow-token tiles. Tuning measures the pick first, then the whole space in its measured order."""
    from tilefuse.lowering.lower import default_config
    from tilefuse.lowering.tune import candidates

    seeds = gemm_sp.get_configs(H200, 4096, meta_k_major=True, M=8192)
    pick = gemm_sp.default_config(seeds, 8192, 16384, 132)
    assert pick == seeds[0] and (pick["block_M"], pick["block_N"]) == (256, 128)
    small = gemm_sp.default_config(seeds, 8192, 768, 132)  # 192 tiles of 256x128: 2 waves; 128x128: 25% fewer
    assert (small["block_M"], small["block_N"]) == (128, 128)
    few = gemm_sp.get_configs(H200, 4096, meta_k_major=True, M=1)
    assert all(c["block_M"] <= 64 for c in few[:4])
    assert gemm_sp.default_config(few, 1, 6144, 132)["block_M"] == 16
    g = _mlp_graph(rng, torch.float16)
    p = plan(g, H200, sparsity="2:4")
    spec = build(next(r for r in p.regions if r.kind == "gemm_sp"), p.graph, H200)
    cands = candidates(spec, H200)
    assert cands[0] == default_config(spec, H200) and len(cands) > gemm_sp.SEEDS
    assert len({tuple(sorted(c.items())) for c in cands}) == len(cands)
    assert cands[1]["block_M"] <= 64  # M = 37: the narrow-token tiles first

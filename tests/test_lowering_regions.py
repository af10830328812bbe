"""Every region that launches a kernel runs as a TileLang kernel on the ``c`` target.

Zoo models through ``torch.compile`` and through ONNX, the Hugging Face models of
``test_hf_plans.py``, and small graphs for each injective op, pooling form and reduction shape,
against eager / the reference executor, fresh random inputs, every element checked. The plan each
run used must show backend ``tilelang`` for every region except view regions (metadata only, no
kernel), attention included (the head split and merge around it are the flash-attention kernel's
operand layouts, checked to run no torch node); ops no template computes are listed in
``TORCH_BY_DESIGN`` with the reason, never skipped silently.
"""

from __future__ import annotations

import pytest
import torch

import tilefuse
from tilefuse import models
from tilefuse.api import compile_graph
from tilefuse.capture import capture_graphs
from tilefuse.config import default_target
from tilefuse.ir import TensorType
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.dispatch import build
from tilefuse.models.hf import MainOutput, build_hf
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor
from tilefuse.pipeline import plan

C = {"kind": "c"}
FP32 = {"rtol": 1e-4, "atol": 1e-5}  # whole models: fused GEMMs and norms sum in another order than eager
EXACT = {"rtol": 1e-5, "atol": 1e-5}
NO_KERNEL = ("view",)
TORCH_BY_DESIGN = {
    "cumsum": "a sequential scan (HF builds position ids from the attention mask with it); no scan template yet",
}


def torch_regions(p) -> list[str]:
    """Regions that launch a kernel yet run through torch, but for the ops TORCH_BY_DESIGN explains."""
    return [f"{r.name} ({r.kind}: {' '.join(r.ops)})" for r in p.regions
            if r.kind not in NO_KERNEL and r.backend != "tilelang" and not set(r.ops) <= set(TORCH_BY_DESIGN)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---- whole models -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_model_every_region_is_a_kernel(name):
    model, _ = models.build(name, "tiny")
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append)
    with torch.no_grad():
        for _ in range(2):
            inputs = models.example_inputs(name, "tiny")  # fresh random values each call
            torch.testing.assert_close(compiled(*inputs), model(*inputs), **FP32)
    assert runners, "tilefuse compiled nothing"
    for r in runners:
        assert torch_regions(r.plan) == [], r.plan.to_text(reasons=False)


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_onnx_every_region_is_a_kernel(name, tmp_path):
    path = models.export_onnx(name, tmp_path / f"{name}.onnx")
    model, _ = models.build(name, "tiny")
    compiled = tilefuse.compile_onnx(path, target="c")
    with torch.no_grad():
        inputs = models.example_inputs(name, "tiny")
        got, want = compiled(*inputs), model(*inputs)
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, **FP32)
    assert torch_regions(compiled.plan) == [], compiled.plan.to_text(reasons=False)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_model_every_region_is_a_kernel_but_the_scan(name, rng):
    torch.manual_seed(0)
    pytest.importorskip("transformers")
    model = MainOutput(build_hf(name))
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append)
    with torch.no_grad():
        for _ in range(2):
            ids = torch.randint(0, 100, (2, 17), generator=rng)
            torch.testing.assert_close(compiled(ids), model(ids), **FP32)
    for r in runners:
        assert torch_regions(r.plan) == [], r.plan.to_text(reasons=False)
    by_design = {op for r in runners for reg in r.plan.regions if reg.backend != "tilelang"
                 and reg.kind not in NO_KERNEL for op in reg.ops}
    # the packed-sequence cumsum of the HF mask is gone: the planner reads that mask as causal (attention_mask)
    assert by_design == set()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_onnx_every_region_is_a_kernel(name, tmp_path, rng):
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = MainOutput(build_hf(name))
    ids, mask = torch.randint(0, 100, (2, 13), generator=rng), torch.ones(2, 13, dtype=torch.int64)
    mask[1, 9:] = 0  # a padded sequence
    path = str(tmp_path / f"{name}.onnx")
    torch.onnx.export(model, (ids, mask), path, input_names=["ids", "mask"], output_names=["out"], dynamo=True)
    compiled = tilefuse.compile_onnx(path, target="c")
    fresh = torch.randint(0, 100, (2, 13), generator=rng)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"ids": fresh.numpy(),
                                                                                    "mask": mask.numpy()})[0]
    torch.testing.assert_close(compiled(fresh, mask)[0], torch.from_numpy(want), rtol=1e-4, atol=1e-4)
    assert torch_regions(compiled.plan) == [], compiled.plan.to_text(reasons=False)  # ONNX builds no cumsum


# ---- small graphs: one family of ops each ------------------------------------------------------

def _f32(rng, *shape):
    return torch.randn(shape, generator=rng)


def _ints(rng, lo, hi, *shape):
    return torch.randint(lo, hi, shape, generator=rng)


def layouts(b, rng):
    x = b.input("x", TensorType((3, 8, 5), "float32"))
    bias = b.input("bias", TensorType((5,), "float32"))
    p = b.add1("permute", [x], perm=(2, 0, 1))  # (5, 3, 8)
    t = b.add1("transpose", [p], dim0=0, dim1=2)  # (8, 3, 5)
    s = b.add1("slice", [t], dim=0, start=1, end=8, step=3)  # (3, 3, 5)
    f = b.add1("flip", [s], dims=(1,))
    y = b.add1("add", [f, bias])
    m = b.add1("reshape", [p], shape=(15, 8))  # merges two dims of a permuted value
    m = b.add1("mul", [m, b.constant("two", torch.tensor(2.0))])
    back = b.add1("onnx_slice", [b.add1("exp", [x])], dim=1, start=-1, end=-100, step=-2)  # (3, 4, 5): 7, 5, 3, 1
    flat = b.add1("flatten2d", [b.add1("neg", [p])], axis=2,  # its own inference leaves the dims to ONNX's
                  out_types=[TensorType((15, 8), "float32")])
    return [y, m, back, flat], [_f32(rng, 3, 8, 5), _f32(rng, 5)]


def joins(b, rng):
    a = b.input("a", TensorType((2, 3, 4), "float32"))
    c = b.input("c", TensorType((2, 5, 4), "float32"))
    v = b.input("v", TensorType((3, 1), "float32"))
    cat = b.add1("concat", [a, b.add1("relu", [c])], dim=1)  # (2, 8, 4)
    lo, hi = b.add("split", [cat], dim=2, sizes=(1, 3))
    st = b.add1("stack", [a, b.add1("neg", [a])], dim=1)  # (2, 2, 3, 4)
    e = b.add1("add", [b.add1("expand", [v], shape=(2, 3, 4)), a])
    rp = b.add1("repeat", [v], repeats=(2, 1, 3))  # (2, 3, 3)
    return [b.add1("exp", [lo]), hi, st, e, rp], [_f32(rng, 2, 3, 4), _f32(rng, 2, 5, 4), _f32(rng, 3, 1)]


def gathers(b, rng):
    w = b.input("w", TensorType((10, 6), "float32"))
    x3 = b.input("x3", TensorType((4, 5, 6), "float32"))
    names = [("ids", (2, 3)), ("sel", (4,)), ("gidx", (10, 3)), ("i0", (3, 1)), ("i1", (1, 4)), ("j0", (2,)),
             ("j2", (2,)), ("nd", (2, 2))]
    ids, sel, gidx, i0, i1, j0, j2, nd = (b.input(n, TensorType(s, "int64")) for n, s in names)
    outs = [b.add1("embedding", [w, ids]),
            b.add1("index_select", [w, sel], dim=0),  # negative indices wrap
            b.add1("gather", [w, gidx], dim=1),
            b.add1("index", [w, i0, i1]),  # adjacent advanced indices: (3, 4)
            b.add1("index", [x3, j0, "", j2]),  # separated by a slice: the index dims come first, (2, 5)
            b.add1("gather_nd", [x3, nd])]  # (2, 6)
    args = [_f32(rng, 10, 6), _f32(rng, 4, 5, 6), _ints(rng, 0, 10, 2, 3), _ints(rng, -10, 10, 4),
            _ints(rng, 0, 6, 10, 3), _ints(rng, -10, 10, 3, 1), _ints(rng, -6, 6, 1, 4), _ints(rng, -4, 4, 2),
            _ints(rng, 0, 6, 2), _ints(rng, 0, 4, 2, 2)]
    return outs, args


def pads_and_masks(b, rng):
    x = b.input("x", TensorType((2, 3, 5, 6), "float32"))
    outs = [b.add1("pad", [x], pads=(1, 2, 0, 1), mode="constant", value=0.5),
            b.add1("pad", [x], pads=(2, 1, 1, 2), mode="reflect"),
            b.add1("pad", [x], pads=(1, 1, 2, 0), mode="replicate"),
            b.add1("pad", [x], pads=(1, 2, 2, 1), mode="circular"),
            b.add1("pad", [x], pads=(-1, 2), mode="constant", value=0.0),  # a negative pad crops
            b.add1("tril", [x], diagonal=1),
            b.add1("triu", [x], diagonal=-1)]
    return outs, [_f32(rng, 2, 3, 5, 6)]


def ints_and_bools(b, rng):
    xi = b.input("xi", TensorType((5, 7), "int64"))
    yi = b.input("yi", TensorType((5, 7), "int64"))
    xf = b.input("xf", TensorType((5, 7), "float32"))
    mask = b.input("mask", TensorType((5, 7), "bool"))
    three = b.constant("three", torch.tensor(3))
    lt = b.add1("lt", [xi, yi])
    both = b.add1("bitwise_and", [lt, b.add1("ge", [xi, b.constant("zero", torch.tensor(0))])])
    outs = [b.add1("where", [lt, xi, yi]),
            b.add1("floor_divide", [xi, three]),
            b.add1("remainder", [xi, three]),
            both,  # a bool output
            b.add1("masked_fill", [xf, both], value=-1.5),
            b.add1("cast", [b.add1("logical_not", [both])], dtype="int32"),
            b.add1("where", [mask, xf, b.constant("z", torch.tensor(0.25))]),  # a bool input
            b.add1("tril", [xi])]
    args = [_ints(rng, -5, 5, 5, 7), _ints(rng, -5, 5, 5, 7), _f32(rng, 5, 7), torch.rand(5, 7, generator=rng) > 0.5]
    return outs, args


def rotary(b, rng):
    x = b.input("x", TensorType((2, 6, 4, 8), "float32"))
    cos = b.input("cos", TensorType((6, 8), "float32"))
    sin = b.input("sin", TensorType((6, 8), "float32"))
    xt = b.add1("transpose", [x], dim0=1, dim1=2)  # (2, 4, 6, 8): heads before the sequence
    return ([b.add1("rotary_embedding", [xt, cos, sin]),
             b.add1("rotary_embedding", [xt, cos, sin], interleaved=True)],
            [_f32(rng, 2, 6, 4, 8), _f32(rng, 6, 8), _f32(rng, 6, 8)])


def generators_and_batch_norm(b, rng):
    xi = b.input("xi", TensorType((3, 6), "int64"))
    x = b.input("x", TensorType((2, 3, 4, 5), "float32"))
    ar = b.add1("arange", [], start=1, end=13, step=2, dtype="int64")
    vec = [b.constant(n, torch.randn(3, generator=rng)) for n in ("w", "bb", "mean")]
    var = b.constant("var", torch.rand(3, generator=rng) + 0.5)
    bn = b.add1("batch_norm", [x, vec[0], vec[1], vec[2], var], eps=1e-5)
    return [b.add1("mul", [xi, ar]), b.add1("relu", [bn])], [_ints(rng, -9, 9, 3, 6), _f32(rng, 2, 3, 4, 5)]


def pools(b, rng):
    x = b.input("x", TensorType((2, 3, 9, 11), "float32"))
    bias = b.input("bias", TensorType((3, 1, 1), "float32"))
    r = b.add1("relu", [b.add1("add", [x, bias])])
    outs = [b.add1("mul", [b.add1("max_pool", [r], kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
                           b.constant("half", torch.tensor(0.5))]),
            b.add1("max_pool", [x], kernel=(3, 2), stride=(2, 3), padding=(1, 1), dilation=(2, 1), ceil_mode=True),
            b.add1("avg_pool", [x], kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True,
                   count_include_pad=False),
            b.add1("avg_pool", [x], kernel=(2, 4), stride=(2, 2), padding=(1, 2)),
            b.add1("adaptive_avg_pool", [x], output_size=(3, 4)),
            b.add1("flatten", [b.add1("adaptive_avg_pool", [r], output_size=(1, 1))], start_dim=1)]
    return outs, [_f32(rng, 2, 3, 9, 11), _f32(rng, 3, 1, 1)]


def reductions(b, rng):
    x = b.input("x", TensorType((2, 3, 4, 5), "float32"))
    pos = b.input("pos", TensorType((1, 3, 4, 5), "float32"))
    lw = b.input("lw", TensorType((4, 5), "float32"))
    lb = b.input("lb", TensorType((4, 5), "float32"))
    two = b.constant("two", torch.tensor(2.0))
    outs = [b.add1("mul", [b.add1("mean", [x], dims=(2, 3)), two]),  # global average: rows (2*3) x cols (4*5)
            b.add1("sum", [x], dims=(1, 2, 3), keepdim=True),
            b.add1("var", [x], dims=(-2, -1), correction=1),
            b.add1("layer_norm", [x, lw, lb], axis=2, eps=1e-5),  # over the last two dims
            b.add1("layer_norm", [b.add1("add", [x, pos]), "", ""], axis=-1, eps=1e-5),  # a broadcast producer operand
            b.add1("rms_norm", [x], eps=1e-6)]
    return outs, [_f32(rng, 2, 3, 4, 5), _f32(rng, 1, 3, 4, 5), _f32(rng, 4, 5) + 1.0, _f32(rng, 4, 5)]


GRAPHS = {f.__name__: f for f in (layouts, joins, gathers, pads_and_masks, ints_and_bools, rotary,
                                  generators_and_batch_norm, pools, reductions)}


def check_family(name, rng, target, device="cpu"):
    b = GraphBuilder(name)
    outs, args = GRAPHS[name](b, rng)
    graph = b.build(outs)
    args = [a.to(device) for a in args]
    compiled = compile_graph(graph, target=target, measure=False)  # every region as its kernel, not as measured
    got, want = compiled(*args), Executor(graph, device)(*args)
    assert len(got) == len(want)
    for o, g, w in zip(outs, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, o
        torch.testing.assert_close(g, w, **EXACT, msg=lambda m, o=o: f"{o}: {m}")
    assert torch_regions(compiled.plan) == [], compiled.plan.to_text(reasons=False)
    assert any(r.backend == "tilelang" for r in compiled.plan.regions)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_region_family_runs_as_kernels(name, rng):
    check_family(name, rng, "c")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_region_family_runs_as_kernels_on_cuda(name, rng):
    check_family(name, rng, default_target(), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_model_every_region_is_a_kernel_on_cuda(name):
    model, _ = models.build(name, "tiny", dtype=torch.float16, device="cuda")
    runners = []
    compiled = tilefuse.compile(model, target=default_target(), observer=runners.append, measure=False)
    with torch.no_grad():
        for _ in range(2):
            inputs = models.example_inputs(name, "tiny", dtype=torch.float16, device="cuda")
            torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-2, atol=1e-2)
    for r in runners:
        assert torch_regions(r.plan) == [], r.plan.to_text(reasons=False)


# ---- attention reads the head split and writes the head merge itself ---------------------------------

# Per zoo model, the operands the attention kernel reads or writes in place (TokenRows layouts): GPT-2 and
# ViT split a fused QKV projection, BERT views three projections as (B, S, H, D), LLaMA's rotary
# embedding hands q and k over as (B, H, S, D) already (read as they are) and v as (B, S, Hkv, D).
IN_PLACE = {"gpt2": "qkvo", "vit": "qkvo", "bert": "qkvo", "llama": "vo"}


def attention_specs(p) -> list[KernelSpec]:
    specs = [build(r, p.graph, C) for r in p.regions if r.kind == "attention"]
    assert specs and all(isinstance(s, KernelSpec) for s in specs), specs
    return specs


def in_place(spec: KernelSpec) -> str:
    return "".join(n for n in "qkvo" if f"{n}_layout" in spec.factory_kwargs())


@pytest.mark.parametrize("source", ["torch.compile", "onnx"])
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_attention_layouts_run_in_the_kernel(name, source, tmp_path):
    """No layout node around the zoo models' attention runs through torch: pre and post are empty."""
    if source == "onnx":
        from tilefuse.frontends.onnx import import_onnx

        graph = import_onnx(models.export_onnx(name, tmp_path / f"{name}.onnx", "tiny"))
    else:
        (graph,) = capture_graphs(*models.build(name, "tiny"))
    for spec in attention_specs(plan(graph, C)):
        assert (spec.pre, spec.post) == ((), ()), spec
        assert in_place(spec) == IN_PLACE[name]
        if "q" in IN_PLACE[name] and name != "bert":  # one fused projection, read three times, never copied
            assert len({v for v, _ in spec.inputs[:3]}) == 1


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_attention_layouts_run_in_the_kernel(name):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    graphs = capture_graphs(MainOutput(build_hf(name)), (torch.randint(0, 100, (2, 17)),))
    for spec in attention_specs(plan(max(graphs, key=lambda g: len(g.nodes)), C)):
        assert (spec.pre, spec.post) == ((), ()), spec
        assert in_place(spec) == IN_PLACE[name]


def test_gpt2_attention_without_torch_layouts_matches_eager(rng):
    model, _ = models.build("gpt2", "tiny")
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append)
    with torch.no_grad():
        for _ in range(2):
            inputs = models.example_inputs("gpt2", "tiny")
            torch.testing.assert_close(compiled(*inputs), model(*inputs), **FP32)
    (runner,) = runners
    kernels = [runner.kernels[r.name] for r in runner.plan.regions if r.kind == "attention"]
    assert len(kernels) == 2
    for k in kernels:
        assert k.pre == [] and k.post == [] and in_place(k.spec) == "qkvo"


B_, S_, H_, D_ = 2, 5, 2, 16  # batch != sequence: a layout that mixed them up would show


def _heads(b, t, shape=(B_, S_, H_, D_), perm=False):
    t = b.add1("reshape", [t], shape=shape)
    return b.add1("permute", [t], perm=(0, 2, 1, 3)) if perm else b.add1("transpose", [t], dim0=1, dim1=2)


def qkv_slices(b, rng):
    """A fused projection cut with slices (not split), permuted heads: all in place."""
    C_ = H_ * D_
    x = b.input("x", TensorType((B_ * S_, 3 * C_), "float32"))
    rows = b.add1("reshape", [x], shape=(B_, S_, 3 * C_))
    q, k, v = (_heads(b, b.add1("slice", [rows], dim=-1, start=i * C_, end=(i + 1) * C_), perm=True)
               for i in range(3))
    o = b.add1("sdpa", [q, k, v], is_causal=True)
    return [b.add1("reshape", [b.add1("transpose", [o], dim0=1, dim1=2)], shape=(B_ * S_, C_))], \
        [_f32(rng, B_ * S_, 3 * C_)]


def regrouped(b, rng):
    """q and k reshaped across the (B, S) split: no layout reads that, torch runs their split; v is in place."""
    C_ = H_ * D_
    x = b.input("x", TensorType((B_, S_, 2 * C_), "float32"))
    v = b.input("v", TensorType((S_, B_, H_, D_), "float32"))
    q, k = (_heads(b, t, (S_, B_, H_, D_)) for t in b.add("split", [x], dim=-1, sizes=(C_, C_)))
    o = b.add1("sdpa", [q, k, b.add1("transpose", [v], dim0=1, dim1=2)])
    return [b.add1("reshape", [b.add1("transpose", [o], dim0=1, dim1=2)], shape=(S_, B_, C_))], \
        [_f32(rng, B_, S_, 2 * C_), _f32(rng, S_, B_, H_, D_)]


def unmerged(b, rng):
    """The output's layout is not a head merge: torch runs it after the kernel; the inputs are in place."""
    C_ = H_ * D_
    x = b.input("x", TensorType((B_, S_, 3 * C_), "float32"))
    q, k, v = (_heads(b, t) for t in b.add("split", [x], dim=2, sizes=(C_, C_, C_)))
    o = b.add1("sdpa", [q, k, v])
    return [b.add1("reshape", [b.add1("permute", [o], perm=(0, 2, 3, 1))], shape=(B_, S_, C_))], \
        [_f32(rng, B_, S_, 3 * C_)]


# name: (graph, operands in place, torch nodes before the kernel, after it)
ATTENTION_GRAPHS = {"qkv_slices": (qkv_slices, "qkvo", 0, 0), "regrouped": (regrouped, "vo", 5, 0),
                    "unmerged": (unmerged, "qkv", 0, 2)}


@pytest.mark.parametrize("name", sorted(ATTENTION_GRAPHS))
def test_attention_layouts_match_or_fall_back(name, rng):
    fn, want_in_place, n_pre, n_post = ATTENTION_GRAPHS[name]
    b = GraphBuilder(name)
    outs, args = fn(b, rng)
    graph = b.build(outs)
    (spec,) = attention_specs(plan(graph, C))
    assert (in_place(spec), len(spec.pre), len(spec.post)) == (want_in_place, n_pre, n_post), spec
    compiled = compile_graph(graph, target="c")
    assert torch_regions(compiled.plan) == [], compiled.plan.to_text(reasons=False)
    for g, w in zip(compiled(*args), Executor(graph, "cpu")(*args)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, **EXACT)


# ---- the index maps are data ---------------------------------------------------------------------

def test_index_maps_print_as_expressions():
    b = GraphBuilder("maps")
    x = b.input("x", TensorType((4, 6), "float32"))
    y = b.add1("slice", [b.add1("transpose", [x], dim0=0, dim1=1)], dim=0, start=1, end=None, step=2)
    c = b.add1("concat", [x, b.add1("neg", [x])], dim=1)
    g = b.build([y, c])
    p = plan(g, C)
    specs = [build(r, p.graph, C) for r in p.regions if r.kind == "elementwise"]
    assert all(isinstance(s, KernelSpec) for s in specs)
    exprs = [str(e) for s in specs for e in s.factory_kwargs()["exprs"]]
    assert "arg0[i1, add(mul(i0, 2:int32), 1:int32)]" in exprs
    concat = ("where(lt(i1, 6:int32), arg0[i0, minimum(i1, 5:int32)], "
              "neg(arg0[i0, maximum(add(i1, -6:int32), 0:int32)]))")
    assert concat in exprs  # the second piece reads its own index, clamped for the branch not taken


def test_refusals_name_the_op():
    b = GraphBuilder("refused")
    x = b.input("x", TensorType((4, 6), "float32"))
    y = b.add1("cumsum", [b.add1("exp", [x])], dim=1)
    p = plan(b.build([y]), C)
    why = [build(r, p.graph, C) for r in p.regions if r.kind == "opaque"]
    assert why == ["opaque region (cumsum): no template takes opaque ops; it runs through torch"]
    assert any("cumsum" in line and "runs through torch" in line for line in p.refusals)


# ---- 1x1 convolutions run as batched GEMMs ----------------------------------------------------------

@pytest.mark.parametrize("side", [(6, 1, 1), (1, 6, 1, 1), (2, 6, 5, 7), (1, 1, 5, 1)])
def test_pointwise_conv_is_a_batched_gemm(side, rng):
    """conv 1x1 + bias, then ``* side``, ``+ residual``, relu: a GEMM over (N, O, H*W), its epilogue operands
    read there (a ``side`` broadcast along H alone is left out of the region by the planner; were one in it,
    the builder would keep the convolution template). Every case matches torch."""
    b = GraphBuilder("pointwise_conv")
    x = b.input("x", TensorType((2, 8, 5, 7), "float32"))
    r = b.input("r", TensorType((2, 6, 5, 7), "float32"))
    s = b.input("s", TensorType(side, "float32"))
    w, bias = b.constant("w", torch.randn(6, 8, 1, 1, generator=rng)), b.constant("b", torch.randn(6, generator=rng))
    y = b.add1("conv", [x, w, bias], stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    y = b.add1("relu", [b.add1("add", [b.add1("mul", [y, s]), r])])
    graph = b.build([y])
    p = plan(graph, C)
    (spec,) = [build(reg, p.graph, C) for reg in p.regions if "conv" in reg.ops]
    assert spec.template == "gemm", spec
    compiled = compile_graph(graph, target="c")
    assert torch_regions(compiled.plan) == []
    args = [torch.randn(t, generator=rng) for t in ((2, 8, 5, 7), (2, 6, 5, 7), side)]
    (got,), (want,) = compiled(*args), Executor(graph, "cpu")(*args)
    torch.testing.assert_close(got, want, **EXACT)


class OneValueConvs(torch.nn.Module):
    """Convolutions whose ATen op holds one value for every spatial dim (``padding="valid"``: SigLIP's patches,
    ``padding=[0]``)."""

    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4, padding="valid")
        self.same = torch.nn.Conv2d(8, 8, kernel_size=3, padding="same")

    def forward(self, x):
        return torch.relu(self.same(self.patch(x)))


def test_convolutions_with_one_value_for_every_dim_are_kernels(rng):
    model = OneValueConvs().eval()
    runners = []
    compiled = tilefuse.compile(model, target="c", observer=runners.append, measure=False)
    x = torch.randn(2, 3, 16, 12, generator=rng)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **FP32)
    assert runners and all(torch_regions(r.plan) == [] for r in runners), runners[0].plan.to_text(reasons=False)
    assert any("conv" in r.ops for r in runners[0].plan.regions)

"""End to end through ``torch.compile``: every zoo model vs eager, training, dynamic shapes, the entry point."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tilefuse
from tilefuse import models
from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse import backend as dynamo

CPU = Options(target=parse_target("c"))
# Whole models: fp32 with room for reordered reductions (fused GEMMs, norms) once kernels are lowered.
FP32 = {"rtol": 1e-4, "atol": 1e-5}
FP16 = {"rtol": 1e-2, "atol": 1e-2}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_fallbacks(backend) -> set[str]:
    """ATen ops left as torch_fallback nodes in the graphs the backend compiled."""
    nodes = [n for p in backend.programs for n in p.graph.nodes if n.op == "torch_fallback"]
    return {n.attr["target"] for n in nodes} | backend.fallback_ops()


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_model_matches_eager(name):
    model, example = models.build(name, "tiny")
    backend = make_backend(CPU)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for inputs in (example, models.example_inputs(name, "tiny")):
            torch.testing.assert_close(compiled(*inputs), model(*inputs), **FP32)
    assert backend.failures == []
    assert backend.programs, "nothing was compiled by tilefuse"
    # Inference graphs of the zoo (gpt2, llama, bert included) must convert entirely onto registry ops.
    assert compiled_fallbacks(backend) == set()


def test_transformer_graphs_keep_attention_and_norms_whole():
    seen = {}
    for name in ("gpt2", "llama", "bert"):
        torch._dynamo.reset()
        model, inputs = models.build(name, "tiny")
        backend = make_backend(CPU)
        with torch.no_grad():
            torch.compile(model, backend=backend)(*inputs)
        seen[name] = {op for p in backend.programs for op in p.graph.op_counts()}
        assert "sdpa" in seen[name] and "linear" in seen[name], (name, seen[name])
    assert "layer_norm" in seen["gpt2"] and "layer_norm" in seen["bert"] and "silu" in seen["llama"]


def test_training_mlp_gradients_match_eager(rng):
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=rng)))
    net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(),
                        nn.Linear(32, 8))
    backend = make_backend(CPU)
    compiled = torch.compile(net, backend=backend)
    for _ in range(2):
        x = torch.randn(6, 16, generator=rng, requires_grad=True)
        target = torch.randn(6, 8, generator=rng)
        loss = F.mse_loss(compiled(x), target)
        grads = torch.autograd.grad(loss, [x, *net.parameters()])
        loss_ref = F.mse_loss(net(x), target)
        grads_ref = torch.autograd.grad(loss_ref, [x, *net.parameters()])
        torch.testing.assert_close(loss, loss_ref, **FP32)
        torch.testing.assert_close(grads, grads_ref, rtol=1e-4, atol=1e-6)
    kinds = {p.graph.name.rsplit("_", 1)[-1] for p in backend.programs}
    assert {"forward", "backward"} <= kinds and backend.failures == []
    assert compiled_fallbacks(backend) == set()  # the backward ops decompose onto registry ops


def test_training_gpt2_through_fallbacks(rng):
    """Backward of SDPA and embedding run as torch fallbacks; gradients still match."""
    model, _ = models.build("gpt2", "tiny")
    model.train().requires_grad_(True)
    ids = models.example_inputs("gpt2", "tiny")[0]
    backend = make_backend(CPU)
    compiled = torch.compile(model, backend=backend)
    loss = compiled(ids).logsumexp(-1).mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(ids).logsumexp(-1).mean().backward()
    torch.testing.assert_close(grads, [p.grad for p in model.parameters()], rtol=1e-4, atol=1e-6)
    assert backend.failures == []


@pytest.fixture
def specializations(monkeypatch) -> list:
    """The ``_Specializing`` graphs the backend makes, as it makes them."""
    made = []
    init = dynamo._Specializing.__init__

    def spy(self, *a, **k):
        made.append(self)
        init(self, *a, **k)
    monkeypatch.setattr(dynamo._Specializing, "__init__", spy)
    return made


def test_dynamic_shapes_are_specialized(specializations):
    made = specializations
    model, _ = models.build("gpt2", "tiny")
    backend = make_backend(CPU)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for seq in (9, 13, 17, 13):
            ids = torch.randint(0, 128, (2, seq))
            torch.testing.assert_close(compiled(ids), model(ids), **FP32)
    assert backend.failures == [] and compiled_fallbacks(backend) == set()
    assert sum("static" in p.graph.name for p in backend.programs) >= 2
    # keyed by the inputs that vary (the sequence length, the ids), not by every weight: one compile per length
    (spec,) = made
    placeholders = [n for n in spec.gm.graph.nodes if n.op == "placeholder"]
    assert spec.varying is not None and 0 < len(spec.varying) < len(placeholders) / 4, (spec.varying, len(placeholders))
    assert len(spec.cache) == 2  # 13 and 17 (9 was the first, static graph)


class _Stepping(nn.Module):
    """A position the caller advances each call and the module hands back advanced (as Hugging Face's sliding-window
    cache does its length): dynamo makes the int a symbolic input of the graph after the first change. ``scaled``:
    the int also scales the output, so the computation depends on its value."""

    def __init__(self, scaled: bool):
        super().__init__()
        self.lin, self.scaled = nn.Linear(8, 8), scaled

    def forward(self, x, n: int):
        y = F.gelu(self.lin(x)) * 2
        return (y * n if self.scaled else y), n + 1, n


@pytest.mark.parametrize("scaled", [False, True])
def test_an_int_that_only_counts_is_no_part_of_a_specialization(scaled, specializations):
    """The int feeds only int arithmetic the graph returns: one specialization serves every value, the returned int
    computed from the call's own (a decode step of Gemma 2 was planned and compiled anew for each token). Where it
    also feeds the tensors, each value is its own specialization; either way every call matches eager."""
    made = specializations
    torch._dynamo.reset()
    model = _Stepping(scaled)
    backend = make_backend(CPU)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    n = m = 3
    with torch.no_grad():
        for _ in range(6):
            (got, n, was), (want, m, _) = compiled(x, n), model(x, m)
            assert n == m and was == n - 1  # (the int itself, handed back as it came)
            torch.testing.assert_close(got, want, **FP32)
    assert backend.failures == []
    (spec,) = made
    assert bool(spec.int_only) != scaled
    assert len(spec.cache) == (1 if not scaled else 5), len(spec.cache)  # (the first call ran a static graph)


def test_unimportable_graph_runs_through_torch_with_a_warning(monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(dynamo, "import_fx_program", broken)
    model, inputs = models.build("mlp", "tiny")
    backend = make_backend(CPU)
    with caplog.at_level(logging.WARNING, logger="tilefuse"), torch.no_grad():
        out = torch.compile(model, backend=backend)(*inputs)
    torch.testing.assert_close(out, model(*inputs))
    assert backend.failures and "boom" in backend.failures[0]
    assert any("boom" in r.getMessage() for r in caplog.records)


def test_rare_ops_decompose_and_kept_ops_do_not():
    table = dynamo.decompositions()
    kept = {op for packet in dynamo.KEPT_WHOLE for op in (getattr(packet, o) for o in packet.overloads())}
    assert not kept & set(table)

    def f(x, y):
        return torch.addcmul(x, x, y, value=0.5) + torch.lerp(x, y, 0.3) + F.rms_norm(x, (8,), eps=1e-6)

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    backend = make_backend(CPU)
    torch.testing.assert_close(torch.compile(f, backend=backend)(x, y), f(x, y), **FP32)
    assert compiled_fallbacks(backend) == set() and backend.failures == []


def entry_point_installed() -> bool:
    """Whether the project is pip-installed here (its ``torch_dynamo_backends`` entry point is visible)."""
    from importlib.metadata import entry_points

    return any(e.name == "tilefuse" for e in entry_points(group="torch_dynamo_backends"))


needs_entry_point = pytest.mark.skipif(not entry_point_installed(),
                                       reason="tilefuse is not pip-installed here: no entry-point metadata")


def test_public_compile():
    model, inputs = models.build("mlp", "tiny")
    with torch.no_grad():
        torch.testing.assert_close(tilefuse.compile(model, target="c")(*inputs), model(*inputs), **FP32)


def test_a_calls_results_are_freed_when_the_caller_drops_them():
    """Nothing in the call path keeps a call's outputs alive (a reference cycle did: each call's 500 MB of LLaMA logits
    outlived it until the garbage collector ran, and the allocator took fresh GPU memory for every call)."""
    model, inputs = models.build("mlp", "tiny")
    fn = tilefuse.compile(model, target="c")
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.no_grad():
            for _ in range(2):
                out = fn(*inputs)
                torch.testing.assert_close(out, model(*inputs), **FP32)
                ref = weakref.ref(out)
                del out
                assert ref() is None
    finally:
        if enabled:
            gc.enable()


@needs_entry_point
def test_backend_by_name_with_options():
    model, inputs = models.build("mlp", "tiny")
    with torch.no_grad():
        out = torch.compile(model, backend="tilefuse", options={"target": "c", "fuse": False})(*inputs)
    torch.testing.assert_close(out, model(*inputs), **FP32)


@needs_entry_point
def test_backend_entry_point_works_without_importing_tilefuse():
    code = (
        "import sys, torch\n"
        "assert 'tilefuse' not in sys.modules\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))\n"
        "x = torch.randn(3, 8)\n"
        "torch.testing.assert_close(torch.compile(m, backend='tilefuse')(x), m(x), rtol=1e-5, atol=1e-6)\n"
        "assert 'tilefuse.backend' in sys.modules\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/",
                       check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_model_fp16_cuda_matches_eager(name):
    from tilefuse.config import Options

    model, _ = models.build(name, "tiny", dtype=torch.float16, device="cuda")
    runners = []
    backend = make_backend(Options(observer=runners.append))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            inputs = models.example_inputs(name, "tiny", dtype=torch.float16, device="cuda")
            torch.testing.assert_close(compiled(*inputs), model(*inputs), **FP16)
    assert backend.failures == [] and compiled_fallbacks(backend) == set()
    for r in runners:  # the record of what ran as TileLang kernels on the GPU
        print(f"[{name}] {r.plan.summary()}")
    assert any(reg.backend == "tilelang" for r in runners for reg in r.plan.regions)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_model_onnx_runs_on_cuda(name, tmp_path):
    """The ONNX path on the GPU: each zoo model exported (fp32) and compiled for CUDA matches the eager model
    there on fresh inputs; every region lowers except fp32 attention (the MMAs take fp16/bf16; it runs
    through torch and the plan says why)."""
    path = models.export_onnx(name, tmp_path / f"{name}.onnx")
    # measure=False: every region that lowers runs as its kernel (the measured choice would give some to torch)
    compiled = tilefuse.compile_onnx(path, measure=False)  # the local target: this GPU
    assert compiled.options.target["kind"] == "cuda"
    model, _ = models.build(name, "tiny", device="cuda")
    # the reference in true fp32: torch's cuDNN convolutions default to TF32 (10-bit mantissa), which put eager
    # ResNet 1.6e-3 (relative) off the exact fp32 kernels on the H200
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for _ in range(2):
            inputs = models.example_inputs(name, "tiny", device="cuda")
            got, want = compiled(*inputs), model(*inputs)
            want = want if isinstance(want, (tuple, list)) else (want,)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))
    plan = compiled.plan
    torch_regions = [r for r in plan.regions if r.launches and r.backend == "torch"]
    assert all(r.kind == "attention" for r in torch_regions), [(r.name, r.kind) for r in torch_regions]
    print(f"[onnx {name}] {plan.summary()}")


def _param_model():
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.BatchNorm1d(32).eval(), nn.Linear(32, 8))


def test_parameters_and_buffers_are_marked_static_inputs():
    """AOTAutograd's static inputs (parameters, buffers) reach the runner by position, the user's input not: CUDA
    graph replays read those in place instead of copying them in (runtime/graphs.py)."""
    model, runners = _param_model(), []
    compiled = torch.compile(model, backend=make_backend(Options(target=parse_target("c"), observer=runners.append)))
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x), **FP32)
    (runner,) = runners
    inputs = runner.plan.graph.inputs
    dynamic = [k for k in range(len(inputs)) if k not in runner.static_inputs]
    assert len(dynamic) == 1 and tuple(inputs[dynamic[0]].type.shape) == (4, 16)
    n_state = sum(1 for _ in model.parameters()) + sum(1 for b in model.buffers() if b.is_floating_point())
    assert len(runner.static_inputs) == len(inputs) - 1 and len(inputs) - 1 <= n_state
    assert not runner.check  # dynamo's guards have checked the inputs before the call


@pytest.mark.gpu
def test_cuda_graphs_read_parameters_in_place():
    """Replays read parameters where they live: no copy-in, an in-place update is seen at the next call, and a
    parameter replaced by a new tensor gets a graph of its own; user inputs are still copied in each call."""
    model, runners = _param_model().cuda().half(), []
    compiled = torch.compile(model, backend=make_backend(Options(observer=runners.append)))
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(64, 16, device="cuda", dtype=torch.float16)
            if step == 2:
                model[0].weight.mul_(-0.5)  # in place: same address
            if step == 3:
                model[3].weight = nn.Parameter(torch.randn_like(model[3].weight))  # a new address
            torch.testing.assert_close(compiled(x), model(x), **FP16)
    graphs = [g for r in runners if r._graphed is not None for g in r._graphed.graphs]
    assert runners and graphs, "no CUDA graph was captured"
    state = {t.data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    for g in graphs:  # one graph per parameter address: the latest reads today's
        assert len(g.copied) == 1 and len(g.inputs) > 1, (g.copied, len(g.inputs))
    latest = graphs[-1]
    assert all(t.data_ptr() in state for k, t in enumerate(latest.inputs) if k not in latest.copied)


@pytest.mark.gpu
@pytest.mark.parametrize("tail", [False, True], ids=["whole_graph", "eager_tail"])
def test_an_input_buffer_refilled_each_call_is_read_in_place_and_every_result_is_right(tail, monkeypatch):
    """A caller that refills one input buffer call after call gets a twin graph reading it in place (no copy in,
    ``runtime.graphs.PIN_AFTER``); each result is eager's on what the buffer holds then, results kept across calls
    stay right, and another buffer is copied in again (whole plan in the graph, or GPT-2's LM head as the eager tail)."""
    from tilefuse.runtime import plan_runner

    monkeypatch.setattr(plan_runner, "TAIL_MIN_BYTES", 0)
    model, _ = models.build("gpt2", "tiny", dtype=torch.float16, device="cuda")
    runners = []
    compiled = tilefuse.compile(model, eager_tail=tail, observer=runners.append)
    buf = models.example_inputs("gpt2", "tiny", device="cuda")[0].clone()
    kept = []
    with torch.no_grad():
        for step in range(12):
            fresh = models.example_inputs("gpt2", "tiny", device="cuda")[0]
            x = fresh if step == 8 else buf.copy_(fresh)
            kept.append((compiled(x), model(x)))
            if step == 7:  # pinned at the 5th call: the twin reads the buffer itself
                (runner,) = runners
                (_, _, twin), = runner._graphed._pins.values()
                assert twin.copied == () and buf.data_ptr() in {t.data_ptr() for t in twin.inputs}
    for got, want in kept:
        torch.testing.assert_close(got, want, **FP16)
    assert (runner.tail_start < len(runner.plan.regions)) == tail
    assert [t for _, _, t in runner._graphed._pins.values()] == ["never"]  # another buffer at the 9th call


def test_eager_tail_runs_the_output_regions_after_the_graph(rng):
    """The regions that write the plan's outputs (GPT-2's LM head) are the eager tail; run as head (the part a CUDA
    graph captures) then tail, on the CPU here, the plan gives what running it whole gives."""
    from tilefuse.runtime.plan_runner import eager_tail

    model, inputs = models.build("gpt2", "tiny")
    runners = []
    with torch.no_grad():
        tilefuse.compile(model, target="c", observer=runners.append)(*inputs)
    (runner,) = runners
    regions = runner.plan.regions
    start = eager_tail(runner.plan)
    assert 0 < start < len(regions) and set(regions[-1].outputs) <= set(runner.plan.graph.outputs)
    assert "linear" in regions[start].ops  # the LM head
    runner.enable_cuda_graphs(tail=True, tail_min_bytes=0)  # (tiny logits: the tail whatever their size)
    assert runner.tail_start == start  # on CPU tensors the graph runner calls head and tail directly
    args = [torch.randint(0, 128, v.type.shape, generator=rng) if v.type.dtype == "int64"
            else torch.randn(v.type.shape, generator=rng) for v in runner.plan.graph.inputs]
    whole, split = runner.run(*args), runner._graphed(*args)
    assert len(whole) == len(split)
    for w, o in zip(whole, split):
        torch.testing.assert_close(o, w, rtol=0, atol=0)


@pytest.mark.gpu
def test_eager_tail_outputs_survive_the_next_call(monkeypatch):
    """GPT-2's logits come from the eager tail, a fresh tensor each call: a result kept across calls stays right. (The
    tiny model's logits are below ``TAIL_MIN_BYTES``: the threshold is lifted so that the tail runs.)"""
    from tilefuse.runtime import plan_runner

    monkeypatch.setattr(plan_runner, "TAIL_MIN_BYTES", 0)
    model, _ = models.build("gpt2", "tiny", dtype=torch.float16, device="cuda")
    runners = []
    compiled = tilefuse.compile(model, eager_tail=True, observer=runners.append)
    with torch.no_grad():
        a, b = (models.example_inputs("gpt2", "tiny", device="cuda")[0] for _ in range(2))
        out_a = compiled(a)
        out_b = compiled(b)
        torch.testing.assert_close(out_a, model(a), **FP16)
        torch.testing.assert_close(out_b, model(b), **FP16)
        assert out_a.data_ptr() != out_b.data_ptr()
    (runner,) = runners
    assert runner.tail_start < len(runner.plan.regions)  # the tail ran after the replay

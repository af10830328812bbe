"""Decoding with a static KV cache through ``torch.compile(backend="tilefuse")`` (issue 16): the recipe of the
transformers docs (``generate(..., cache_implementation="static")`` with ``model.forward`` compiled) gives eager's
tokens, compiles a fixed number of graphs whatever the number of tokens, updates the cache where it lives, and runs
a plan on one device whatever the host tensors it is handed."""

import dataclasses

import pytest
import torch

from tilefuse.backend import make_backend
from tilefuse.config import Options
from tilefuse.frontends.fx import FxProgram
from tilefuse.ir import Graph, TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import build_runner, plan_step
from tilefuse.pipeline import plan as make_plan
from tilefuse.runtime.plan_runner import PlanRunner

transformers = pytest.importorskip("transformers")
from decode_steps import cache_argument, teacher_forced  # (after the skip: it needs transformers)

VOCAB = 256
# The cache argument's name: transformers 5.17 (the H200's) calls it past_key_values and ignores an unknown ``cache=``
# (the model then decodes without the static cache, silently); later versions call it cache.
CACHE = cache_argument(transformers.LlamaForCausalLM)


def tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


def tiny_gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _twin(model):
    twin = type(model)(model.config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def _generate(model, ids, n):
    """``n`` greedy tokens. ``min_new_tokens``: a random model can reach its EOS token (LLaMA's 2) in every row, and
    generate then stops early, eager and compiled alike (seed 6: 22 of 32 tokens; a CI run hit it at 3 of 8)."""
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, cache_implementation="static", pad_token_id=0)


class _Counting:
    """A tilefuse backend (on ``c`` unless ``options`` say) that counts the graphs it compiles and the input
    write-backs that copied."""

    def __init__(self, monkeypatch, options: Options | None = None):
        self.runners = []
        options = options or Options(target={"kind": "c"}, quiet=True)
        self.backend = make_backend(dataclasses.replace(options, observer=self.runners.append))
        self.copied: list[torch.Size] = []
        write_back = FxProgram.write_back

        def spy(program, args, results):
            done = write_back(program, args, results)
            self.copied += [args[i].shape for i in done]
            return done

        monkeypatch.setattr(FxProgram, "write_back", spy)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_static_cache_generate_matches_eager_and_compiles_once(make, monkeypatch):
    torch.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    model = make()
    ids = torch.randint(1, VOCAB, (2, 7))
    compiles = {}
    for n in (8, 32):
        torch._dynamo.reset()
        ref = _generate(_twin(model), ids, n)
        compiled = _twin(model)
        counting = _Counting(monkeypatch)
        compiled.forward = torch.compile(compiled.forward, backend=counting.backend)
        out = _generate(compiled, ids, n)
        assert out.shape == (2, 7 + n)
        assert torch.equal(out, ref), f"{n} new tokens: tilefuse {out.tolist()} != eager {ref.tolist()}"
        assert counting.backend.failures == []
        compiles[n] = len(counting.runners)
        # the caches are updated where they live: only the 0-d position counters are ever copied back
        assert counting.copied and all(s.numel() == 1 for s in counting.copied), counting.copied
        decode = counting.backend.programs[-1]
        in_place = [n for n in decode.graph.nodes if n.op == "index_copy"]
        assert len(in_place) == 2 * 2  # k and v of each layer
        assert {n.inputs[0] for n in in_place} <= {v.name for v in decode.graph.inputs}
        # each layer's k and v stores are one TileLang kernel with their rows' rotary and transpose
        plan = counting.runners[-1].plan
        stores = [r for r in plan.regions if "index_copy" in r.ops]
        assert len(stores) == 2 and all(r.ops.count("index_copy") == 2 and r.backend == "tilelang" for r in stores)
    assert compiles[8] == compiles[32] == 2, compiles  # prefill and decode, whatever the number of tokens


def test_gemma2_sliding_cache_decodes_with_one_plan_a_graph(monkeypatch):
    """Gemma 2 (eager only: softcapped scores, sliding-window layers of 8 keys, fewer than the tokens decoded): its
    static cache hands back its length, a symbolic int of the decode graph; the graph is planned once for every
    length (not once a token), and the tokens are eager's."""
    torch.manual_seed(3)
    cfg = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=256, sliding_window=8, query_pre_attn_scalar=16,
                                    attn_logit_softcapping=0.5, final_logit_softcapping=1.0,
                                    attn_implementation="eager")
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    ids = torch.randint(1, VOCAB, (2, 7))
    torch._dynamo.reset()
    ref = _generate(_twin(model), ids, 10)
    compiled = _twin(model)
    counting = _Counting(monkeypatch)
    compiled.forward = torch.compile(compiled.forward, backend=counting.backend)
    out = _generate(compiled, ids, 10)
    assert torch.equal(out, ref), f"tilefuse {out.tolist()} != eager {ref.tolist()}"
    assert counting.backend.failures == []
    assert len(counting.runners) <= 3, [r.plan.graph.name for r in counting.runners]  # (dynamo's graphs: 3)
    plan = counting.runners[-1].plan
    assert [r.backend for r in plan.regions if r.kind == "attention"] == ["tilelang"] * 2
    assert all("softcap" in r.pattern for r in plan.regions if r.kind == "attention")


class _Step(torch.nn.Module):
    """One decode step over a static cache of ``L`` positions: the cache and the position are buffers updated in
    place (``index_copy_``, ``add_``), as Hugging Face's StaticLayer does."""

    def __init__(self, L=16, D=8):
        super().__init__()
        self.register_buffer("k", torch.zeros(2, L, D))
        self.register_buffer("pos", torch.tensor(0))
        self.q = torch.nn.Linear(D, D)

    def forward(self, x):
        idx = torch.arange(x.shape[1]) + self.pos
        self.pos.add_(x.shape[1])
        self.k.index_copy_(1, idx, self.q(x))
        return torch.softmax(x @ self.k.transpose(1, 2), -1) @ self.k


def test_in_place_cache_update_writes_the_callers_buffer(monkeypatch, rng):
    model = _Step()
    with torch.no_grad():
        model.q.weight.copy_(torch.randn(8, 8, generator=rng))
    eager = _Step()
    eager.load_state_dict(model.state_dict())
    counting = _Counting(monkeypatch)
    compiled = torch.compile(model, backend=counting.backend)
    address = model.k.data_ptr()
    with torch.no_grad():
        for step in range(6):
            x = torch.randn(2, 1, 8, generator=rng)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.k, eager.k, rtol=1e-5, atol=1e-5)
            assert model.pos.item() == eager.pos.item() == step + 1
    assert model.k.data_ptr() == address
    assert len(counting.runners) == 1 and counting.backend.failures == []
    assert all(s == () for s in counting.copied)  # the counter; the cache is never copied back
    (program,) = counting.backend.programs
    assert len(program.mutations) == 2
    ops = [n.attr.get("target", n.op) for n in program.graph.nodes]
    assert "index_copy" in ops and "aten::index_copy.default" not in ops  # the registry's in-place op
    (store,) = [r for r in counting.runners[0].plan.regions if "index_copy" in r.ops]
    assert store.backend == "tilelang" and "linear" not in store.ops  # the linear's epilogue is not the store


def test_a_scatter_whose_input_is_read_again_is_not_done_in_place(rng):
    """``k`` read after its update (and before, through ``old``): the scatter must not overwrite it early."""

    class ReadsOld(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k", torch.zeros(4, 3))

        def forward(self, x, i):
            old = self.k * 1
            self.k.index_copy_(0, i, x)
            return old + self.k

    m, e = ReadsOld(), ReadsOld()
    backend = make_backend(Options(target={"kind": "c"}, quiet=True))
    c = torch.compile(m, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            x, i = torch.randn(2, 3, generator=rng), torch.randperm(4, generator=rng)[:2]
            torch.testing.assert_close(c(x, i), e(x, i), rtol=0, atol=0)
            assert torch.equal(m.k, e.k)
    ops = [n.attr.get("target") for n in backend.programs[-1].graph.nodes]
    assert "aten::index_copy_.default" not in ops


# ---- one device per plan ---------------------------------------------------------------------------------


def _counter_graph() -> Graph:
    """positions = arange(4) + counter (a 0-d int64 that lives on the host); y = x * 2 + positions."""
    b = GraphBuilder("counter")
    x = b.input("x", TensorType((4,), "float32"))
    c = b.input("counter", TensorType((), "int64"))
    ar = b.constant("arange", torch.arange(4))
    pos = b.add("add", [ar, c])[0]
    posf = b.add("cast", [pos], dtype="float32")[0]
    two = b.constant("two", torch.tensor(2.0))
    y = b.add("add", [b.add("mul", [x, two])[0], posf])[0]
    return b.build([y, pos])


def test_host_inputs_are_staged_onto_the_plans_device():
    """A plan for a GPU target handed a CPU 0-d tensor (HF's cache position counter) runs every region on the
    GPU: here the meta device stands for it, and each region checks where its inputs are."""
    graph = _counter_graph()
    p = make_plan(graph, {"kind": "cuda", "arch": "sm_90a"})
    seen = []

    def region_fn(region, ref):
        def run(args):
            seen.append((region.name, {a.device.type for a in args}))
            return ref(args)
        return run

    from tilefuse.runtime.plan_runner import reference_region

    kernels = {r.name: region_fn(r, reference_region(p, r)) for r in p.regions}
    for check in (True, False):
        seen.clear()
        runner = PlanRunner(p, kernels, check=check, device_type="meta")
        for _ in range(2):  # the second call reuses the staging buffer
            x, counter = torch.empty(4, device="meta"), torch.tensor(3)
            y, pos = runner(x, counter)
            assert y.device.type == "meta" and pos.device.type == "meta"
        assert seen and all(devices == {"meta"} for _, devices in seen), seen
        assert list(runner._staged) == [1] and runner._staged[1].device.type == "meta"


def test_host_inputs_stay_where_they_are_on_a_cpu_target_and_compute_right():
    graph = _counter_graph()
    runner = build_runner(graph, Options(target={"kind": "c"}, quiet=True))
    assert runner.device_type == "cpu"
    x = torch.randn(4)
    y, pos = runner(x, torch.tensor(5))
    assert torch.equal(pos, torch.arange(4) + 5) and torch.equal(y, x * 2 + (torch.arange(4) + 5).float())
    assert build_runner(graph, Options(target={"kind": "cuda", "arch": "sm_90a"}, lower=False,
                                       quiet=True)).device_type == "cuda"


# ---- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tilefuse"])
def test_a_prompt_longer_than_the_static_cache_names_the_limit(compiled):
    torch._dynamo.reset()
    model = tiny_llama()
    if compiled:
        model.forward = torch.compile(model.forward, backend=make_backend(Options(target={"kind": "c"}, quiet=True)))
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad(), pytest.raises(Exception, match="out of bounds for dimension 2 with size 16"):
        model(torch.randint(0, VOCAB, (1, 20)), **{CACHE: cache})
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 10)), **{CACHE: cache})  # fits; the next 10 do not
        with pytest.raises(Exception, match="out of bounds for dimension 2 with size 16"):
            model(torch.randint(0, VOCAB, (1, 10)), **{CACHE: cache})


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tilefuse"])
def test_a_batch_larger_than_the_static_cache_names_the_shapes(compiled):
    torch._dynamo.reset()
    model = tiny_llama()
    if compiled:
        model.forward = torch.compile(model.forward, backend=make_backend(Options(target={"kind": "c"}, quiet=True)))
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 4)), **{CACHE: cache})  # the cache takes batch 1 here
        # eager: "... shape: 1 2 16 at dimension 2 ..."; dynamo, tracing: "... shape: torch.Size([1, 2, 16]) at ..."
        with pytest.raises(Exception, match=r"must have same slice shapes\. Destination slice shape: \S*1,? 2,? 16"):
            model(torch.randint(0, VOCAB, (3, 1)), **{CACHE: cache})


# ---- per-step logits, teacher-forced (the H200 check of issue 16 runs the gpu case) ------------------------


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_static_cache_steps_match_eager_logits(device, monkeypatch):
    """On CUDA as a user runs it (the test session turns the measured choice off: on here): the first call measured
    region by region, then CUDA graphs (a decode step's logits are small: no eager tail). The graphs write the cache's
    0-d counters into the caller's tensors themselves: nothing is copied back on CUDA (on the CPU, without graphs, the
    counters are); the cache itself never. (The same path emulated on the CPU: tests/test_cuda_graph_runner.py.)"""
    torch._dynamo.reset()
    dtype, tol = (torch.float32, 1e-4) if device == "cpu" else (torch.float16, 2e-2)
    target = {"kind": "c"} if device == "cpu" else {"kind": "cuda", "arch": "sm_90a"}
    eager = tiny_llama().to(device, dtype)
    compiled = _twin(eager).to(device, dtype)
    counting = _Counting(monkeypatch, Options(target=target, quiet=True, measure=device == "cuda"))
    compiled.forward = torch.compile(compiled.forward, backend=counting.backend)
    caches = teacher_forced(eager, compiled, torch.randint(1, VOCAB, (2, 7), device=device), 12, tol)
    assert counting.backend.failures == [] and len(counting.runners) == 2
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert a.cumulative_length.device.type == device and int(a.cumulative_length) == 7 + 11  # eager used it
        assert b.cumulative_length.device == a.cumulative_length.device and int(b.cumulative_length) == 7 + 11
        torch.testing.assert_close(b.keys.float(), a.keys.float(), rtol=tol, atol=tol)
        torch.testing.assert_close(b.values.float(), a.values.float(), rtol=tol, atol=tol)
    if device == "cuda":
        assert counting.copied == [], counting.copied
    else:
        assert counting.copied and all(s.numel() == 1 for s in counting.copied), counting.copied
    if device == "cuda":  # the decode steps replayed a captured graph (capture did not fail into plain runs)
        decode = counting.runners[1]
        assert decode._graphed is not None and decode._graphed.graphs, "no CUDA graph was captured for decode"


def _decode_attention_graph(B: int, L: int) -> Graph:
    """One decode step's attention as a Hugging Face LLaMA hands it over: 32 query heads, 8 kv heads, head dim 64,
    fp16, an additive (B, 1, 1, L) mask over a static cache of L positions."""
    b = GraphBuilder("decode_attention")
    q = b.input("q", TensorType((B, 32, 1, 64), "float16"))
    k = b.input("k", TensorType((B, 8, L, 64), "float16"))
    v = b.input("v", TensorType((B, 8, L, 64), "float16"))
    m = b.input("mask", TensorType((B, 1, 1, L), "float16"))
    return b.build([b.add("sdpa", [q, k, v, m])[0]])


@pytest.mark.parametrize("B, L, splits", [(1, 4096, 16), (64, 4096, 1), (1, 512, 1)])
def test_decode_attention_plans_bounded_and_split_on_a_gpu(B, L, splits):
    """The plan of a decode step for the H200 (planned here, nothing compiled): the attention kernel reads only the
    filled cache (``bound_keys``) and, for one sequence over a long cache, splits the keys so the programs fill the
    GPU; only then has its spec room for the parts (``split_max``), which come out before the output."""
    from tilefuse.lowering.lower import default_config

    target = {"kind": "cuda", "arch": "sm_90a"}
    planned = plan_step(_decode_attention_graph(B, L), Options(target=target, quiet=True))
    (spec,) = [s for s in planned.specs.values() if s.template == "flash_attention"]
    kw = spec.factory_kwargs()
    if splits > 1:  # room for exactly the default's parts
        assert kw["split_max"] == splits and spec.out_idx == (-3, -2, -1)
        assert [k for k, _, _ in spec.outputs] == [2]
    else:  # no parts: the kernel as before
        assert "split_max" not in kw and spec.out_idx == (-1,) and [k for k, _, _ in spec.outputs] == [0]
    cfg = default_config(spec, target)
    assert cfg["pack"] and cfg["bound_keys"] and cfg.get("splits", 1) == splits, cfg


# ---- a decode step's q/k/v as one launch (planner.grouping), here on the c target ------------------------------


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_grouped_linears_of_a_decode_step_match_eager(make, monkeypatch):
    """The grouping a CUDA plan makes (q, k and v of one normalized input as one ``gemv_group`` kernel), made on the c
    target here so that it runs: teacher-forced decode steps give eager's logits (fp32), and every layer's decode plan
    holds a group of TileLang's. (GPT-2's q/k/v are one linear already: no group, the same logits.)"""
    from tilefuse.lowering import builders

    monkeypatch.setattr(builders, "GEMV_TARGETS", ("c",))  # (the single linears too: gemv kernels on c)
    torch._dynamo.reset()
    eager = make()
    compiled = _twin(eager)
    counting = _Counting(monkeypatch, Options(target={"kind": "c"}, quiet=True, measure=False))
    compiled.forward = torch.compile(compiled.forward, backend=counting.backend)
    teacher_forced(eager, compiled, torch.randint(1, VOCAB, (1, 5)), 6, 1e-4, max_cache_len=32)
    assert counting.backend.failures == []
    decode = counting.runners[-1]
    groups = [r for r in decode.plan.regions if r.kind == "gemv_group"]
    if make is tiny_llama:  # per layer: q/k/v, and gate/up with the up's silu(gate) * up (the gate never stored)
        layers = eager.config.num_hidden_layers
        assert len(groups) == 2 * layers and all(r.backend == "tilelang" for r in groups)
        assert sum(r.ops.count("linear") == 3 for r in groups) == layers
        mlps = [r for r in groups if r.ops.count("linear") == 2]
        assert len(mlps) == layers and all({"silu", "mul"} <= set(r.ops) and len(r.outputs) == 1 for r in mlps)
        kernels = [decode.kernels[r.name] for r in mlps]
        assert all(dict(k.spec.params)["stored"] == (False, True) for k in kernels)
    else:
        assert groups == []
    assert not any(r.kind == "gemv_group" for r in counting.runners[0].plan.regions)  # the prefill's 5 rows: apart


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not on PATH")
def test_every_kernel_of_a_decode_step_compiles_for_sm90a(monkeypatch):
    """The H200's plans of a float16 LLaMA's prefill and decode step, every kernel through nvcc for sm_90a (no GPU
    needed): the decode step's q/k/v and gate/up groups (the up reading silu(gate) in registers) and its cache stores
    (a layer's q and k rotary and k and v stores, inside its q/k/v group: ``planner.rotary_fold``) among them."""
    from tilefuse.pipeline import lower_step

    torch._dynamo.reset()
    eager = tiny_llama().half()
    compiled = _twin(eager).half()
    counting = _Counting(monkeypatch)
    compiled.forward = torch.compile(compiled.forward, backend=counting.backend)
    cache = transformers.StaticCache(config=eager.config, max_cache_len=32)
    ids = torch.randint(1, VOCAB, (1, 5))
    with torch.no_grad():
        for _ in range(2):
            ids = compiled(ids, **{CACHE: cache}).logits[:, -1].argmax(-1, keepdim=True)
    sm90 = {"kind": "cuda", "arch": "sm_90a"}
    prefill, decode = counting.backend.programs
    for program in (prefill, decode):
        planned = plan_step(program.graph, Options(target=sm90, quiet=True))
        plan, kernels = lower_step(planned, {}, sm90)
        assert planned.specs and set(kernels) == set(planned.specs), set(planned.specs) - set(kernels)
        if program is prefill:
            planned_prefill = plan
    regions = plan.regions  # the decode step's
    layers = eager.config.num_hidden_layers
    assert sum(r.kind == "gemv_group" for r in regions) == 2 * layers
    stores = [r for r in regions if "index_copy" in r.ops]
    assert len(stores) == layers and all(r.ops.count("index_copy") == 2 and r.backend == "tilelang" for r in stores)
    assert all(r.kind == "gemv_group" and r.ops.count("rotary_embedding") == 2 for r in stores)
    # the norms: the prefill's kernels of their own; the decode step's folded into its linears (planner.norm_fold)
    norms = [[r for r in p.regions if r.kind == "reduction"] for p in (planned_prefill, plan)]
    assert len(norms[0]) == 2 * layers + 1 and norms[1] == []
    assert sum("rms_norm" in r.ops for r in regions if r.kind in ("gemm", "gemv_group")) == 2 * layers + 1

"""The CUDA-graph runner's copy-in and hand-back (runtime/graphs.py) and the plan's eager tail around it, exercised
on the CPU: a recorder that stands in for ``torch.cuda.graph`` (a replay re-runs the captured function on the
graph's input buffers and writes its results into the outputs captured, the graph's memory) with ``"cpu"`` as the
graph device. What is checked is what a real replay must give: inputs updated in place (a static KV cache) handed
back as the caller's tensors, never cloned and copied back (a whole cache per step), the position counter written
back into the caller's tensor, and eager's numbers through the measured first call, the graph and the tail."""

from __future__ import annotations

import pytest
import torch

from tilefuse import pipeline
from tilefuse.backend import make_backend
from tilefuse.config import Options
from tilefuse.frontends.fx import FxProgram
from tilefuse.lowering import tuning_db
from tilefuse.runtime import graphs
from tilefuse.runtime.graphs import CudaGraphRunner
from tilefuse.runtime.plan_runner import eager_tail

C = {"kind": "c"}


class ReplayingGraph:
    """A captured graph on the CPU: ``replay`` runs ``fn`` on the graph's inputs and writes the results into the
    captured outputs (an output that is an input, updated in place, is left as it is)."""

    def __init__(self, fn, inputs, outputs):
        self.fn, self.inputs, self.outputs = fn, inputs, outputs
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for o, new in zip(self.outputs, self.fn(*self.inputs)):
            if new is not o:
                o.copy_(new)


def record_on_cpu(fn, inputs, warmup):
    """``runtime.graphs.record_cuda_graph``'s stand-in: warm-up calls, then the "capture" (one call whose outputs
    are the graph's memory from then on; as a capture runs nothing, the inputs are then put back as they were)."""
    for _ in range(warmup):
        fn(*inputs)
    before = [t.clone() for t in inputs]
    outputs = tuple(fn(*inputs))
    for t, b in zip(inputs, before):
        t.copy_(b)
    return ReplayingGraph(fn, inputs, outputs), outputs


def emulate_cuda_graphs(runner, tail: bool = True, tail_min_bytes: int | None = 0) -> None:
    """Give a ``c`` plan's runner what ``build_runner`` gives a CUDA plan's: graphs (emulated) and the eager tail
    (here for outputs of any size, unless ``tail_min_bytes``)."""
    runner.enable_cuda_graphs(tail, tail_min_bytes)
    runner._graphed.record, runner._graphed.device_type = record_on_cpu, "cpu"


class WriteBacks:
    """Spies on ``FxProgram.write_back``: the shapes of the caller's tensors that an input mutation copied into."""

    def __init__(self, monkeypatch):
        self.copied: list[torch.Size] = []
        write_back = FxProgram.write_back

        def spy(program, args, results):
            done = write_back(program, args, results)
            self.copied += [args[i].shape for i in done]
            return done

        monkeypatch.setattr(FxProgram, "write_back", spy)


# ---- the graph runner on its own ---------------------------------------------------------------------------


def _update(x, cache, idx):
    """Writes ``x`` into rows ``idx`` of ``cache`` in place; returns (a new value, the cache itself)."""
    cache.index_copy_(0, idx, x)
    return cache.sum(0) * 2, cache


@pytest.mark.parametrize("finish", [False, True], ids=["clone_outputs", "finish"])
def test_an_input_updated_in_place_comes_back_as_the_callers_tensor(finish, rng):
    seen = []

    def keep(args, outs):
        seen.append((args, outs))
        return tuple(outs)

    runner = CudaGraphRunner(_update, static_inputs=[1], finish=keep if finish else None, record=record_on_cpu,
                             device_type="cpu")
    cache, eager = torch.zeros(6, 3), torch.zeros(6, 3)
    results = []
    for step in range(3):
        x, idx = torch.randn(2, 3, generator=rng), torch.tensor([2 * step, 2 * step + 1])
        want = _update(x, eager, idx)[0]
        total, same = runner(x, cache, idx)
        assert same is cache and torch.equal(cache, eager)
        torch.testing.assert_close(total, want, rtol=1e-6, atol=1e-6)
        results.append((total, want))
    (graph,) = runner.graphs  # one signature: the cache at one address, x and idx copied in before each replay
    assert graph.copied == (0, 2) and graph.aliases == ((1, 1),) and graph.inputs[1] is cache
    assert graph.graph.replays == 3
    if finish:  # the finish step is handed the caller's cache and the graph's own memory for the rest
        assert all(outs[1] is args[1] and outs[0] is graph.outputs[0] for args, outs in seen)
    else:  # what was handed back is a copy: the next replays did not change it
        assert all(torch.allclose(t, w, rtol=1e-6, atol=1e-6) for t, w in results)


@pytest.mark.parametrize("guarded", [False, True], ids=["full_key", "guarded_key"])
def test_a_new_address_of_a_static_input_is_a_new_graph(guarded, rng):
    """Keyed on everything, or (``guarded``: dynamo's guards fix shapes and dtypes) on the static inputs' addresses
    and the copied inputs' shapes: either way another cache is another graph, the same one the same graph."""
    runner = CudaGraphRunner(_update, static_inputs=[1], record=record_on_cpu, device_type="cpu", guarded=guarded)
    idx = torch.tensor([0, 1])
    a, b = torch.zeros(4, 3), torch.zeros(4, 3)
    for cache in (a, b, a):
        x = torch.randn(2, 3, generator=rng)
        assert runner(x, cache, idx)[1] is cache and torch.equal(cache[:2], x)
    assert [g.inputs[1] for g in runner.graphs] == [a, b] and [g.graph.replays for g in runner.graphs] == [2, 1]


def _count(x, counter, cache):
    """A step that also advances a counter (its new value an output the caller would copy back: an update) and writes
    a cache in place (the output is the cache itself)."""
    cache[counter.long() % cache.shape[0]] = x.sum()
    return x * counter, counter + 1, cache


@pytest.mark.parametrize("warmup", [0, 2])
def test_the_graph_writes_an_update_into_its_input_once_a_call(warmup, monkeypatch, rng):
    """An update (output 1 into static input 1) is written by the graph: the warm-up calls before the capture leave
    the counter as it was, each replay advances it by one, and the output handed back is the caller's counter. The
    cache, updated in place, is never copied onto itself."""
    copies = []
    foreach_copy = torch._foreach_copy_

    def spy(dst, src):
        copies.append(len(dst))
        return foreach_copy(dst, src)

    monkeypatch.setattr(torch, "_foreach_copy_", spy)
    runner = CudaGraphRunner(_count, static_inputs=[1, 2], record=record_on_cpu, device_type="cpu", warmup=warmup,
                             updates=[(1, 1), (0, 0), (1, 1), (2, 2)])  # (0, 0): not a static input, the caller's
    assert runner.updates == ((1, 1), (2, 2))
    counter, cache = torch.tensor(3.0), torch.zeros(16)
    for step in range(4):
        x = torch.randn(5, generator=rng)
        y, c, kv = runner(x, counter, cache)
        torch.testing.assert_close(y, x * (3 + step))
        assert c is counter and counter.item() == 4 + step and kv is cache
        torch.testing.assert_close(cache[3 + step], x.sum())
    (graph,) = runner.graphs
    assert graph.aliases == ((1, 1), (2, 2)) and graph.graph.replays == 4
    assert copies and set(copies) == {1}  # the counter alone, each time


def test_arguments_off_the_graph_device_run_the_function_directly(rng):
    runner = CudaGraphRunner(_update, static_inputs=[1])  # a CUDA runner handed CPU tensors
    cache, x = torch.zeros(4, 3), torch.randn(2, 3, generator=rng)
    total, same = runner(x, cache, torch.tensor([1, 3]))
    assert same is cache and torch.equal(cache[1], x[0]) and torch.equal(cache[3], x[1]) and not runner.graphs
    torch.testing.assert_close(total, x.sum(0) * 2, rtol=1e-6, atol=1e-6)


def test_a_captured_runner_handed_another_device_or_a_non_tensor_runs_directly(rng):
    """After a capture, a call whose tensors sit elsewhere (here on the meta device) or that carries a non-tensor
    misses the graphs and runs the function itself: a hit is only ever on the devices a graph was captured on."""
    seen = []

    def fn(*args):
        seen.append(tuple(a.device.type if isinstance(a, torch.Tensor) else a for a in args))
        return (args[0] * 2,)

    runner = CudaGraphRunner(fn, record=record_on_cpu, device_type="cpu")
    x = torch.randn(3, generator=rng)
    torch.testing.assert_close(runner(x)[0], x * 2)
    assert len(runner.graphs) == 1
    seen.clear()
    assert runner(torch.empty(3, device="meta"))[0].device.type == "meta"
    assert runner(x, None)[0].shape == (3,)
    assert seen == [("meta",), ("cpu", None)] and len(runner.graphs) == 1  # both direct, nothing captured
    torch.testing.assert_close(runner(x)[0], x * 2)
    assert runner.graphs[0].graph.replays == 2


# ---- through torch.compile: the plan's head in the graph, its tail after --------------------------------------


class _Step(torch.nn.Module):
    """A decode step over a static cache: the cache and its position are buffers updated in place (as Hugging
    Face's StaticLayer does), the output goes through a linear (the plan's tail)."""

    def __init__(self, L=16, D=8):
        super().__init__()
        self.register_buffer("k", torch.zeros(2, L, D))
        self.register_buffer("pos", torch.tensor(0))
        self.q = torch.nn.Linear(D, D)
        self.head = torch.nn.Linear(D, 5)

    def forward(self, x):
        idx = torch.arange(x.shape[1]) + self.pos
        self.pos.add_(x.shape[1])
        self.k.index_copy_(1, idx, self.q(x))
        return self.head(torch.softmax(x @ self.k.transpose(1, 2), -1) @ self.k)


@pytest.mark.parametrize("tail_min_bytes", [0, None], ids=["tail", "small_outputs_no_tail"])
def test_graph_and_tail_update_the_callers_cache_in_place(tail_min_bytes, monkeypatch, rng):
    """The cache is updated where it lives, and the position counter (an input mutation: an output the caller would
    copy back) is written by the graph itself: nothing is copied back, and the values are eager's. With the default
    ``TAIL_MIN_BYTES`` the small output has no tail: the whole plan is one graph."""
    model, eager = _Step(), _Step()
    with torch.no_grad():
        for p in model.parameters():
            # (scaled as an initialization would be: with unit weights the head's output cancels down from terms of
            # ~10, and a last-bit difference in the attention's sums, 1.5e-5, failed the fp32 tolerance on one seed)
            p.copy_(torch.randn(p.shape, generator=rng) * p.shape[-1] ** -0.5)
    eager.load_state_dict(model.state_dict())
    spy, runners = WriteBacks(monkeypatch), []
    backend = make_backend(Options(target=C, quiet=True, observer=lambda r: (
        runners.append(r), emulate_cuda_graphs(r, tail_min_bytes=tail_min_bytes))))
    compiled = torch.compile(model, backend=backend)
    address = model.k.data_ptr()
    with torch.no_grad():
        for step in range(6):
            x = torch.randn(2, 1, 8, generator=rng)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.k, eager.k, rtol=1e-5, atol=1e-5)
            assert model.pos.item() == eager.pos.item() == step + 1
    assert model.k.data_ptr() == address and backend.failures == []
    (runner,) = runners
    assert 0 < eager_tail(runner.plan) < len(runner.plan.regions)  # a head captured, a tail run after it
    assert runner.tail_start == (eager_tail(runner.plan) if tail_min_bytes == 0 else len(runner.plan.regions))
    (graph,) = runner._graphed.graphs
    assert graph.graph.replays == 6 and len(graph.aliases) == 2  # the cache and the position: handed back as they are
    assert spy.copied == []  # neither copied back: the graph wrote both
    phases = runner.compile_phases()  # where the compile went, the (emulated) capture included
    assert {"import", "plan", "lower", "graph_capture"} <= set(phases) and phases["graph_capture"] > 0


def test_static_cache_decode_through_measure_graph_and_tail_matches_eager(monkeypatch, tmp_path):
    """Hugging Face LLaMA decoding with a static cache, as on CUDA by default: the first call of each graph measured
    region by region (timings injected: GEMM kernels lose to torch), then captured and replayed, the LM head after
    the replay. Teacher-forced, every step's logits are eager's; the cache's counter and contents are eager's, and
    nothing is ever copied back (the graphs write the counters)."""
    transformers = pytest.importorskip("transformers")
    from decode_steps import teacher_forced

    monkeypatch.setenv(tuning_db.DB_ENV, str(tmp_path / "tuning.json"))
    monkeypatch.setattr(pipeline, "device_time", lambda fn, args, kind, sets=None: 2e-3 if getattr(
        getattr(fn, "spec", None), "template", None) == "gemm" else 1e-3)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    eager = transformers.LlamaForCausalLM(cfg).eval()
    compiled = type(eager)(cfg).eval()
    compiled.load_state_dict(eager.state_dict())
    spy, runners = WriteBacks(monkeypatch), []
    options = Options(target=C, quiet=True, measure=True,
                      observer=lambda r: (runners.append(r), emulate_cuda_graphs(r)))
    compiled.forward = torch.compile(compiled.forward, backend=make_backend(options))
    caches = teacher_forced(eager, compiled, torch.randint(1, 256, (2, 7)), 12, 1e-4)
    assert len(runners) == 2  # prefill and decode
    decode = runners[1]
    assert any("measured" in n for n in decode.plan.notes), decode.plan.notes  # some regions went to torch
    assert sum(g.graph.replays for g in decode._graphed.graphs) == 11 and decode._graphed.graphs[0].aliases
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert int(a.cumulative_length) == int(b.cumulative_length) == 7 + 11
        torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.values, a.values, rtol=1e-5, atol=1e-5)
    # the counters (right, above) were written by the graphs themselves: none copied back (before: a clone of each
    # and a copy back, per layer and step)
    assert spy.copied == [], spy.copied


def test_capture_time_is_counted_per_capture_not_per_replay(monkeypatch, rng):
    """``capture_seconds`` (what ``PlanRunner.compile_phases`` reports as ``graph_capture``) grows when a signature is
    captured, and replays leave it alone: the replay path does no timing."""
    clock = iter(range(100))
    monkeypatch.setattr(graphs, "clock", lambda: float(next(clock)))
    runner = CudaGraphRunner(_update, static_inputs=[1], record=record_on_cpu, device_type="cpu")
    idx, cache = torch.tensor([0, 1]), torch.zeros(4, 3)
    runner(torch.randn(2, 3, generator=rng), cache, idx)
    assert runner.capture_seconds == 1.0  # one capture: two clock reads
    for _ in range(3):
        runner(torch.randn(2, 3, generator=rng), cache, idx)
    assert runner.capture_seconds == 1.0
    runner(torch.randn(2, 3, generator=rng), torch.zeros(4, 3), idx)  # another address: another capture
    assert runner.capture_seconds == 2.0


def test_inputs_passed_at_the_same_addresses_are_read_in_place_after_a_few_replays(monkeypatch, rng):
    """A caller that refills one input buffer call after call (a serving loop's preallocated batch; a benchmark) gets,
    after ``pin_after`` replays, a twin graph that reads it in place (no copy in): each result still the eager one of
    what the buffer holds now. Another buffer replays the copying graph, and that signature is never pinned again."""
    clock = iter(range(1000))
    monkeypatch.setattr(graphs, "clock", lambda: float(next(clock)))
    runner = CudaGraphRunner(_update, static_inputs=[1], record=record_on_cpu, device_type="cpu")
    cache, eager = torch.zeros(8, 3), torch.zeros(8, 3)
    x, idx = torch.empty(2, 3), torch.empty(2, dtype=torch.long)

    def step(x, idx, rows):
        x.copy_(torch.randn(2, 3, generator=rng))
        idx.copy_(torch.tensor(rows))
        total, same = runner(x, cache, idx)
        _update(x, eager, idx)
        assert same is cache and torch.equal(cache, eager)
        torch.testing.assert_close(total, eager.sum(0) * 2, rtol=1e-6, atol=1e-6)

    for s in range(runner.pin_after + 4):  # pin_after replays copying in (the capture's first), then the twin's
        step(x, idx, [s % 8, (s + 3) % 8])
    (graph,) = runner.graphs
    assert graph.graph.replays == runner.pin_after and runner.capture_seconds == 2.0  # two captures
    (_, _, twin), = runner._pins.values()
    assert twin.copied == () and twin.inputs[0] is x and twin.inputs[2] is idx and twin.graph.replays == 4
    other = torch.empty(2, 3)
    for s in range(2 * runner.pin_after):  # another buffer, then the first again: copied in, never pinned again
        step(other if s == 0 else x, idx, [s % 8, 7 - s % 8])
    assert graph.graph.replays == 3 * runner.pin_after and twin.graph.replays == 4
    assert runner.capture_seconds == 2.0 and list(runner._pins.values()) == [((), 0, graphs.NEVER)]


def test_an_output_that_is_a_copied_input_keeps_the_copying_graph(rng):
    """A plan that hands an input back as an output would hand the caller's own tensor back from a twin that reads it
    in place, where the copying graph gives a copy: such a signature is not pinned."""
    def passthrough(x, w):
        return x, x @ w
    runner = CudaGraphRunner(passthrough, static_inputs=[1], record=record_on_cpu, device_type="cpu")
    x, w = torch.randn(4, 3, generator=rng), torch.randn(3, 2, generator=rng)
    for _ in range(2 * runner.pin_after):
        x.copy_(torch.randn(4, 3, generator=rng))
        same, y = runner(x, w)
        assert same is not x and torch.equal(same, x) and torch.allclose(y, x @ w)
    assert list(runner._pins.values())[0][2] is graphs.NEVER and runner.graphs[0].graph.replays == 2 * runner.pin_after


def test_a_view_of_other_strides_at_the_same_address_is_not_read_by_the_twin(rng):
    """A square input passed as itself, then transposed (the same address, other strides): the twin reads memory with
    the strides it was captured with, so the transposed view is copied in, and the result is still right."""
    def matmul(x, w):
        return (x @ w,)
    runner = CudaGraphRunner(matmul, static_inputs=[1], record=record_on_cpu, device_type="cpu")
    x, w = torch.randn(4, 4, generator=rng), torch.randn(4, 2, generator=rng)
    for _ in range(runner.pin_after + 2):
        torch.testing.assert_close(runner(x, w)[0], x @ w, rtol=1e-6, atol=1e-6)
    assert not isinstance(list(runner._pins.values())[0][2], (str, type(None)))  # pinned
    (y,) = runner(x.t(), w)
    torch.testing.assert_close(y, x.t() @ w, rtol=1e-6, atol=1e-6)

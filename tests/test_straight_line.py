"""The decided plan runs as straight-line Python (``runtime/straight.py``): the same values as the region-by-region
interpreter, values dropped where it drops them, a failing node named, rebuilt when a region's function changes; and
the CPU's whole-graph measured choice (``backend._WholeGraphChoice``) keeps the faster of the plan and dynamo's graph."""

from __future__ import annotations

import time

import pytest
import torch

import tilefuse
from tilefuse import backend as backend_mod
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import ExecutionError
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner
from tilefuse.runtime.straight import straight_line

C = {"kind": "c"}


def graph(w: torch.Tensor):
    """linear -> relu -> softmax, an add of the input, a reshape and two outputs (one read again after)."""
    b = GraphBuilder("straight")
    x = b.input("x", TensorType((6, 8), "float32"))
    h = b.add1("relu", [b.add1("linear", [x, b.constant("w", w), ""])])
    s = b.add1("softmax", [h], dim=-1)
    r = b.add1("reshape", [b.add1("add", [s, h])], shape=(3, 2, 8))
    return b.build([s, r])


def test_straight_line_matches_the_interpreter_and_drops_values_as_it_does(rng):
    g = graph(torch.randn(8, 8, generator=rng))
    runner = PlanRunner(plan(g, C))  # no kernels: every region through its torch nodes
    x = torch.randn(6, 8, generator=rng)
    slow = runner.run(x, before_region=lambda *a: None)  # the interpreter (a hook forces it)
    fast = runner.run(x)
    assert len(runner._straight) == 1
    for a, b in zip(slow, fast):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    env = runner._env((x,))
    runner._run_regions(env, 0, len(runner.plan.regions))
    env_slow = runner._env((x,))
    for k in range(len(runner.plan.regions)):
        runner._run_regions(env_slow, k, k + 1, before_region=lambda *a: None)
    assert set(env) == set(env_slow)  # the same values live afterwards (dropped ones gone from both)


def test_straight_line_is_rebuilt_when_a_region_function_changes(rng):
    g = graph(torch.randn(8, 8, generator=rng))
    runner = PlanRunner(plan(g, C))
    x = torch.randn(6, 8, generator=rng)
    want = runner.run(x)
    k = len(runner.plan.regions) - 1
    old = runner.fns[k]
    calls = []

    def wrapped(args):
        calls.append(1)
        return old(args)

    runner.fns[k] = wrapped
    got = runner.run(x)
    assert calls == [1]
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_failing_node_is_named(rng):
    g = graph(torch.randn(8, 8, generator=rng))
    p = plan(g, C)
    runner = PlanRunner(p, check=False)
    with pytest.raises(ExecutionError, match=r"node '.*' \(linear\) failed on inputs \[.*float32\[6, 5\]"):
        runner.run(torch.randn(6, 5))


def test_generated_source_reads_calls_and_deletes(rng):
    g = graph(torch.randn(8, 8, generator=rng))
    runner = PlanRunner(plan(g, C))
    fn = straight_line(runner.plan.regions, runner.fns, runner.frees, 0, len(runner.plan.regions))
    assert "env.pop('x')" in fn.source or "env.__getitem__('x')" in fn.source
    assert "del " in fn.source  # values dropped after their last reader


class _Slow:
    def __init__(self, fn, delay):
        self.fn, self.delay = fn, delay

    def __call__(self, *args):
        time.sleep(self.delay)
        return self.fn(*args)


@pytest.mark.parametrize("slow", ["tilefuse", "torch"])
def test_whole_graph_choice_keeps_the_faster(slow):
    class Runner:
        graph_backend = "tilefuse"

    class GM:
        forward = _Slow(lambda x: x + 1, 0.004 if slow == "torch" else 0)

    compiled = _Slow(lambda x: x + 1, 0.004 if slow == "tilefuse" else 0)
    choices, runner = {}, Runner()
    choice = backend_mod._WholeGraphChoice(compiled, GM(), "graph0", runner, choices)
    x = torch.randn(3)
    torch.testing.assert_close(choice(x), x + 1)
    fast = "torch" if slow == "tilefuse" else "tilefuse"
    assert runner.graph_backend == fast and choices["graph0"].startswith(fast)
    assert choice.fn is (GM.forward if fast == "torch" else compiled)


@pytest.mark.parametrize("rank0_stored", [True, False])
def test_whole_graph_choice_of_a_plan_with_collectives_is_rank0s(rank0_stored, monkeypatch, tmp_path):
    """Several ranks: whether the timing calls run (each exchanges tensors with the other ranks) and which way wins
    are rank 0's, whatever this rank's own tuning database holds; a rank that skipped the calls its peers made would
    leave them waiting in collectives (a 2-rank CI run timed out so once)."""
    from tilefuse.lowering.tuning_db import TuningDB
    from tilefuse.runtime import distributed

    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path / "db.json"))
    key = backend_mod._GraphKey("graph", (("digest", "collective-test"),))
    monkeypatch.setattr(backend_mod, "_graph_key", lambda plan: key)
    target = {"kind": "c"}
    own = {"runs": "tilefuse", "tilefuse_ms": 1.0, "torch_ms": 2.0}
    if not rank0_stored:  # this rank has a stored choice that rank 0 has not
        TuningDB().put(key, target, own, "whole")
    rank0 = [{"runs": "torch", "tilefuse_ms": 2.0, "torch_ms": 1.0} if rank0_stored else None, "torch"]
    sent = []

    def broadcast(box):  # rank 0's answers, in the order the ranks ask
        sent.append(box[0])
        box[0] = rank0[len(sent) - 1]
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "_broadcast_object", broadcast)

    class Region:
        kind = "collective"

    class Runner:
        graph_backend = "tilefuse"
        plan = type("Plan", (), {"regions": [Region()]})()

    calls = []

    class GM:
        @staticmethod
        def forward(x):
            calls.append("torch")
            return x + 1

    def compiled(x):
        calls.append("tilefuse")
        return x + 1
    choices, runner = {}, Runner()
    choice = backend_mod._WholeGraphChoice(compiled, GM(), "graph0", runner, choices, target)
    x = torch.randn(3)
    torch.testing.assert_close(choice(x), x + 1)
    timed = 2 * backend_mod.WHOLE_GRAPH_ROUNDS
    assert len(calls) == 1 + (0 if rank0_stored else timed)  # the first call, then rank 0's timing or none
    assert sent[0] == (None if rank0_stored else own)  # what this rank's database held
    assert runner.graph_backend == "torch" and choice.fn is GM.forward  # rank 0's way, not this rank's


def test_whole_graph_choice_under_torch_compile_matches_eager(monkeypatch, rng):
    monkeypatch.setenv("TILEFUSE_MEASURE", "1")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(5, 16, generator=rng)
    runners = []
    compiled = tilefuse.compile(model, target="c", quiet=True, observer=runners.append)
    with torch.no_grad():
        want = model(x)
        for _ in range(3):  # the first call chooses; the later ones run the choice
            torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-6)
    assert [r.graph_backend in ("tilefuse", "torch") for r in runners] == [True]


def test_training_graphs_keep_the_plan(monkeypatch, rng):
    monkeypatch.setenv("TILEFUSE_MEASURE", "1")
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh())
    x = torch.randn(5, 16, generator=rng)
    backend = backend_mod.make_backend(tilefuse.config.Options(target={"kind": "c"}))
    compiled = torch.compile(model, backend=backend)
    out = compiled(x)
    out.sum().backward()
    assert backend.graph_choices == {}  # forward and backward graphs: never the whole-graph choice
    ref = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh())
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-6)


def test_a_cpu_linear_weight_is_packed_once_per_version(monkeypatch, rng):
    """On c a linear's (N, K) weight reaches the GEMM kernel as (K, N), transposed once and again only after an
    in-place change; results match eager before and after the change, and under inference_mode."""
    monkeypatch.setenv("TILEFUSE_MEASURE", "0")
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU()).eval()
    x = torch.randn(7, 24, generator=rng)
    runners = []
    compiled = tilefuse.compile(model, target="c", quiet=True, observer=runners.append)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        kernels = [f for f in runners[0].fns if getattr(f, "spec", None) is not None and f.spec.template == "gemm"]
        assert len(kernels) == 1 and kernels[0].spec.packed == (1,)
        assert dict(kernels[0].spec.params)["trans_B"] is False
        first = kernels[0].packs[1].made
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        assert kernels[0].packs[1].made is first  # reused
        model[0].weight.mul_(-0.5)  # in place: a new version
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        assert kernels[0].packs[1].made is not first
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_whole_graph_choice_is_remembered_in_the_tuning_database(monkeypatch, tmp_path, rng):
    """A second process (a fresh backend) takes the stored choice without timing: the same line, the same numbers."""
    monkeypatch.setenv("TILEFUSE_MEASURE", "1")
    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path / "db.json"))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU()).eval()
    x = torch.randn(5, 16, generator=rng)
    lines = []
    torch._dynamo.reset()  # (other tests' compiles of Sequential.forward count against dynamo's recompile limit)
    for _ in range(2):
        backend = backend_mod.make_backend(tilefuse.config.Options(target={"kind": "c"}, quiet=True))
        compiled = torch.compile(model, backend=backend)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        lines.append(backend.graph_choices)
        torch._dynamo.reset()
    assert lines[0] and lines[0] == lines[1]
    assert '"runs"' in (tmp_path / "db.json").read_text()

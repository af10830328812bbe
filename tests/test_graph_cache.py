"""The graph cache (``tilefuse/graph_cache.py``): a warm compile plans dynamo's graph from its cached ATen import,
without AOTAutograd, and computes what the cold compile computed; what may not be cached is not, and a damaged entry
is compiled anew."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from tilefuse import graph_cache, models
from tilefuse.backend import make_backend
from tilefuse.config import Options, parse_target
from tilefuse.frontends import fx as fxf

CPU = Options(target=parse_target("c"))
FP32 = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The cache on (the test session turns it off: tests that patch the importer must reach it), in a folder of
    this test's own; dynamo's caches reset around the test."""
    monkeypatch.setenv("TILEFUSE_GRAPH_CACHE", "1")
    monkeypatch.setenv("TILEFUSE_GRAPH_CACHE_DIR", str(tmp_path / "graphs"))
    torch._dynamo.reset()
    yield tmp_path / "graphs"
    torch._dynamo.reset()


def entries(folder) -> list:
    return sorted(folder.glob("*.json")) if folder.exists() else []


def compile_twice(model, inputs, grad: bool = False):
    """The model compiled cold and (dynamo reset) again: the two backends, the outputs of each and AOTAutograd's
    count of graphs in the second compile."""
    outs, backends = [], []
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        backend = make_backend(CPU)
        with torch.set_grad_enabled(grad):
            outs.append(torch.compile(model, backend=backend)(*inputs))
        backends.append(backend)
    return backends, outs, counters["aot_autograd"]["total"]


class Block(nn.Module):
    """Attention, a norm, an MLP with GELU, a softmax over a constant's scale and a residual: the ops the zoo's
    transformers are made of, and a tensor dynamo holds as a constant."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm, self.fc = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc(x), torch.softmax(x * torch.arange(d, dtype=x.dtype), -1)


def test_a_warm_compile_skips_aotautograd_and_computes_the_same(cache, rng):
    model = Block().eval()
    x = torch.randn(2, 16, 32, generator=rng)
    (cold, warm), (a, b), aot = compile_twice(model, (x,))
    assert cold.cached == [] and warm.cached == ["graph0"] and aot == 0
    assert len(entries(cache)) == 1 and warm.failures == []
    for got, ref in zip(b, a):
        assert torch.equal(got, ref)  # the same plan and kernels
    with torch.no_grad():
        for got, ref in zip(b, model(x)):
            torch.testing.assert_close(got, ref, **FP32)
    # the cached graph's runner is called like AOTAutograd's inference graphs: autograd off for the call
    torch._dynamo.reset()
    backend = make_backend(CPU)
    model.requires_grad_(False)
    with torch.enable_grad():
        out = torch.compile(model, backend=backend)(x)
    model.requires_grad_(True)
    assert not out[0].requires_grad


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_zoo_models_warm_from_the_cache(cache, name):
    model, inputs = models.build(name, "tiny")
    (cold, warm), (a, b), aot = compile_twice(model, inputs)
    assert warm.failures == [] and cold.failures == []
    # every dynamo graph whose inference graph AOTAutograd passes through unchanged came from the cache
    assert len(warm.cached) == len(entries(cache)) >= 1 and aot == len(cold.programs) - len(warm.cached)
    torch.testing.assert_close(b, a, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(b, model(*inputs), **FP32)


def test_training_graphs_and_updated_inputs_and_aliased_outputs_are_not_kept(cache, rng):
    x = torch.randn(4, 8, generator=rng)
    # autograd records: AOTAutograd makes a forward and a backward graph
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    (_, warm), (a, b), _ = compile_twice(model, (x,), grad=True)
    assert warm.cached == [] and entries(cache) == [] and b.requires_grad
    torch.testing.assert_close(b, model(x), **FP32)

    class Counting(nn.Module):  # a buffer updated in place
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            self.seen.add_(1)
            return x * 2

    counting = Counting()
    (_, warm), _, _ = compile_twice(counting, (x,))
    assert warm.cached == [] and entries(cache) == [] and counting.seen.item() == 2

    def views(x):  # outputs that are views of the input, or the input itself
        return x.t(), x, x + 1

    (_, warm), (a, b), _ = compile_twice(views, (x,))
    assert warm.cached == [] and entries(cache) == []
    assert b[0]._base is x and b[1] is x and torch.equal(b[2], x + 1)


def test_an_import_with_large_constants_is_not_kept(cache, rng, monkeypatch):
    def f(x):
        return x + torch.arange(4096, dtype=x.dtype)  # a constant of 16 KB (fp32)

    x = torch.randn(2, 4096, generator=rng)
    monkeypatch.setattr(graph_cache, "MAX_CONSTANT_BYTES", 8 << 10)
    (_, warm), (a, b), _ = compile_twice(f, (x,))
    assert warm.cached == [] and entries(cache) == []
    torch.testing.assert_close(b, f(x), **FP32)
    monkeypatch.setattr(graph_cache, "MAX_CONSTANT_BYTES", 32 << 10)
    (_, warm), (a, b), _ = compile_twice(f, (x,))
    assert warm.cached == ["graph0"] and len(entries(cache)) == 1
    torch.testing.assert_close(b, f(x), **FP32)


def test_the_key_follows_inputs_state_and_held_tensors(rng):
    keys = []

    def capture(gm, example_inputs):
        keys.append(graph_cache.key(gm, example_inputs))
        return gm.forward

    def key_of(fn, *inputs, **state):
        torch._dynamo.reset()
        keys.clear()
        with torch.no_grad():
            if state.get("autocast"):
                with torch.autocast("cpu"):
                    torch.compile(fn, backend=capture)(*inputs)
            else:
                torch.compile(fn, backend=capture)(*inputs)
        return keys[0]

    x = torch.randn(4, 8, generator=rng)
    base = key_of(lambda x: x.relu() + 1, x)
    assert base is not None and base == key_of(lambda x: x.relu() + 1, x.clone())
    assert base != key_of(lambda x: x.relu() + 1, torch.randn(4, 9))
    assert base != key_of(lambda x: x.relu() + 1, x.double())
    assert base != key_of(lambda x: x.relu() + 1, x.t().contiguous().t())  # strides
    assert base != key_of(lambda x: x.relu() + 2, x)
    assert key_of(lambda x: x.relu() + 1, x, autocast=True) is None
    # a tensor dynamo makes an input (a module's attribute, a global) is keyed by its type, as every input
    assert key_of(lambda x, c: x * c, x, x) != key_of(lambda x, c: x * c, x, x.clone()) != base
    assert key_of(lambda a, b: a + b, x, x) != key_of(lambda a, b: a + b, x, x.clone())  # shared storage
    torch._dynamo.reset()
    keys.clear()
    torch.compile(lambda x: x + 1, backend=capture, dynamic=True)(x)
    assert keys[0] is None  # symbolic sizes


def test_tensors_a_graph_holds_are_keyed_by_value_and_submodules_are_not_kept():
    class Held(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.register_buffer("c", c)

        def forward(self, x):
            return x * self.c

    c, x = torch.tensor([1.0, 2.0]), torch.randn(4, 2)
    held = [torch.fx.symbolic_trace(Held(t)) for t in (c, c.clone(), c + 1)]
    assert any(n.op == "get_attr" for n in held[0].graph.nodes)
    keys = [graph_cache.key(gm, [x]) for gm in held]
    assert keys[0] == keys[1] != keys[2] and None not in keys
    assert graph_cache.key(torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2))), [x]) is None


def test_the_source_digest_is_in_the_key(monkeypatch, rng):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    x = torch.randn(3)
    before = graph_cache.key(gm, [x])
    monkeypatch.setattr(graph_cache, "source_digest", lambda: "edited")
    assert graph_cache.key(gm, [x]) != before
    monkeypatch.setenv("TILEFUSE_GRAPH_CACHE", "0")
    assert graph_cache.key(gm, [x]) is None


def test_a_damaged_entry_is_compiled_anew_and_rewritten(cache, rng, caplog):
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    x = torch.randn(4, 8, generator=rng)
    (cold, _), _, _ = compile_twice(model, (x,))
    (entry,) = entries(cache)
    good = json.loads(entry.read_text())
    for damage in ("{not json", json.dumps({**good, "input_indices": [0]}),
                   json.dumps({**good, "outputs": {"kind": "elsewhere", "index": 0}})):
        entry.write_text(damage)
        torch._dynamo.reset()
        backend = make_backend(CPU)
        with caplog.at_level(logging.WARNING, logger="tilefuse"), torch.no_grad():
            out = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(out, model(x), **FP32)
        assert backend.cached == [] and any("unreadable" in r.getMessage() for r in caplog.records)
        assert json.loads(entry.read_text()) == good
        caplog.clear()


def test_a_cached_graphs_fallback_ops_are_still_reported(cache, rng, caplog):
    x = torch.randn(4, 6, generator=rng)
    fn = lambda x: torch.logcumsumexp(x, 0) * 2  # noqa: E731  (no converter: a torch_fallback node)
    compile_twice(fn, (x,))
    fxf._WARNED.discard("aten::logcumsumexp.default")
    torch._dynamo.reset()
    backend = make_backend(CPU)
    with caplog.at_level(logging.WARNING, logger="tilefuse"), torch.no_grad():
        out = torch.compile(fn, backend=backend)(x)
    assert backend.cached == ["graph0"] and torch.equal(out, fn(x))
    assert any("aten::logcumsumexp.default" in r.getMessage() for r in caplog.records)


def test_a_fresh_process_takes_the_graph_from_the_cache(cache):
    script = textwrap.dedent("""
        import json, torch
        from torch._dynamo.utils import counters
        from tilefuse import models
        from tilefuse.backend import make_backend
        from tilefuse.config import Options, parse_target
        model, inputs = models.build("mlp", "tiny")
        backend = make_backend(Options(target=parse_target("c")))
        with torch.no_grad():
            out = torch.compile(model, backend=backend)(*inputs)
            ok = torch.allclose(out, model(*inputs), rtol=1e-4, atol=1e-5)
        print(json.dumps({"cached": backend.cached, "aot": counters["aot_autograd"]["total"], "ok": ok}))
    """)
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      timeout=300).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0] == {"cached": [], "aot": 1, "ok": True}
    assert runs[1] == {"cached": ["graph0"], "aot": 0, "ok": True}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["resnet", "gpt2"])
def test_zoo_models_warm_from_the_cache_on_the_gpu(cache, name):
    """fp16 on CUDA (static inputs read in place by CUDA graphs, the measured choice on): the cached graph computes
    what the cold one did."""
    model, inputs = models.build(name, "tiny", dtype=torch.float16, device="cuda")
    outs, cached = [], []
    for _ in range(2):
        torch._dynamo.reset()
        backend = make_backend(Options(measure=True))
        with torch.no_grad():
            outs.append(torch.compile(model, backend=backend)(*inputs))
        cached.append(backend.cached)
    assert cached == [[], ["graph0"]]
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(outs[1], model(*inputs), rtol=1e-2, atol=1e-2)

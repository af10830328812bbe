"""The PrimFunc disk cache: a warm build loads the stored function (same TVM script, same TileLang cache key),
keys follow everything the function is built from, and a damaged entry is rebuilt."""

import pytest
import torch

from tilefuse.config import Options
from tilefuse.ir import TensorType
from tilefuse.lowering import func_cache, lower
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.dispatch import build
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import lower_step, plan, plan_step

C = {"kind": "c"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_FUNC_CACHE", "1")
    monkeypatch.setenv("TILEFUSE_FUNC_CACHE_DIR", str(tmp_path / "funcs"))
    return tmp_path / "funcs"


def gemm_spec():
    b = GraphBuilder("fc")
    x = b.input("x", TensorType((16, 32), "float32"))
    y = b.add1("relu", [b.add1("linear", [x, b.constant("w", torch.randn(24, 32)), ""])])
    p = plan(b.build([y]), C)
    (spec,) = [s for r in p.regions for s in [build(r, p.graph, C)] if isinstance(s, KernelSpec)]
    return spec


def test_second_build_loads_the_stored_function(cache, monkeypatch):
    spec = gemm_spec()
    first = lower.make_prim_func(spec, C)
    assert len(list(cache.glob("*.json"))) == 1
    built = []
    module, factory = lower.TEMPLATES["gemm"]
    monkeypatch.setitem(lower.TEMPLATES, "gemm", (module, lambda **kw: built.append(kw) or factory(**kw)))
    # loaded by TVM's reader directly: not through its upgrader for older versions' files (a json round trip of the
    # whole function, most of a warm compile's own time)
    monkeypatch.setattr("tvm.ir.json_compact.upgrade_json", lambda text: pytest.fail("upgraded a current file"))
    again = lower.make_prim_func(spec, C)
    assert not built  # loaded, not rebuilt
    assert again.script(show_meta=True) == first.script(show_meta=True)
    lower.make_prim_func(spec, C, {"block_M": 16, "block_N": 16, "block_K": 16, "num_stages": 0,
                                   "threads": 1, "enable_rasterization": False})
    assert built and len(list(cache.glob("*.json"))) == 2  # another config is another entry


def test_keys_cover_params_config_target_and_source(cache, monkeypatch):
    k = func_cache.key("gemm", (("M", 16),), (-1,), {"block_M": 32}, C)
    assert k != func_cache.key("gemm", (("M", 17),), (-1,), {"block_M": 32}, C)
    assert k != func_cache.key("gemm", (("M", 16),), (-1,), {"block_M": 64}, C)
    assert k != func_cache.key("gemm", (("M", 16),), (-1,), {"block_M": 32}, {"kind": "cuda", "arch": "sm_90a"})
    monkeypatch.setattr(func_cache, "source_digest", lambda: "edited")
    assert k != func_cache.key("gemm", (("M", 16),), (-1,), {"block_M": 32}, C)


def test_a_damaged_entry_is_rebuilt(cache, caplog):
    spec = gemm_spec()
    first = lower.make_prim_func(spec, C)
    (entry,) = cache.glob("*.json")
    entry.write_text("{ not json")
    again = lower.make_prim_func(spec, C)
    assert again.script(show_meta=True) == first.script(show_meta=True)
    assert "unreadable" in caplog.text
    lower.make_prim_func(spec, C)  # rewritten: loads cleanly now
    assert entry.read_text().startswith("{")


def test_off_switch(cache, monkeypatch):
    monkeypatch.setenv("TILEFUSE_FUNC_CACHE", "0")
    lower.make_prim_func(gemm_spec(), C)
    assert not cache.exists() or not list(cache.glob("*.json"))


def test_a_recompile_in_the_same_process_reuses_its_kernels(cache, monkeypatch):
    """The lower step keeps what it compiled by kernel key: planning the same graph again builds no function and
    compiles nothing, and the kernel is the same object."""
    spec = gemm_spec()
    b = GraphBuilder("fc")
    x = b.input("x", TensorType((16, 32), "float32"))
    y = b.add1("relu", [b.add1("linear", [x, b.constant("w", torch.randn(24, 32)), ""])])
    g = b.build([y])
    first = lower_step(plan_step(g, Options(target=C)), {}, C)[1]
    calls = []
    monkeypatch.setattr(lower, "make_prim_func", lambda *a, **k: calls.append(a))
    again = lower_step(plan_step(g, Options(target=C)), {}, C)[1]
    assert not calls and [k.kernel for k in again.values()] == [k.kernel for k in first.values()]
    assert [k.spec for k in again.values()] == [spec]

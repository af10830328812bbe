"""Shared test setup: GPU tests are skipped visibly where there is no CUDA device; ``slow`` tests are skipped
visibly unless selected (``-m slow``, or any ``-m`` expression naming ``slow``) or ``TILEFUSE_SLOW=1``; the measured
choice and the graph cache are off unless ``TILEFUSE_MEASURE`` / ``TILEFUSE_GRAPH_CACHE`` is set; each test has a tuning
database of its own."""

import os
import sys

import pytest
import torch

# Helper modules of the tests (not test modules: tests/fuzz_programs.py) import by name: under --import-mode=importlib
# pytest puts no test folder on the path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The measured choice (Options.measure) times each region's kernel against its torch ops on the first call and may
# give a region to torch: a test that checks every region runs as its kernel must not depend on timings. It is off
# for the session unless TILEFUSE_MEASURE is set; tests of the choice opt in (measure=True or monkeypatch the env)
# and inject the timing (tests/test_measure_cpu.py).
os.environ.setdefault("TILEFUSE_MEASURE", "0")
# The graph cache (tilefuse/graph_cache.py) plans a graph compiled before from its cached ATen import: a test that
# patches the importer or AOTAutograd's compilers would not reach them. It is off for the session unless
# TILEFUSE_GRAPH_CACHE is set; tests/test_graph_cache.py turns it on, each test with a folder of its own.
os.environ.setdefault("TILEFUSE_GRAPH_CACHE", "0")


def pytest_collection_modifyitems(config, items):
    if "slow" not in (config.getoption("-m") or "") and os.environ.get("TILEFUSE_SLOW", "0") == "0":
        skip_slow = pytest.mark.skip(reason="slow: run with `-m slow` or TILEFUSE_SLOW=1")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: no CUDA device here (these run on the H200 device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _own_tuning_db(tmp_path_factory, monkeypatch):
    """Each test its own, empty tuning database (``TILEFUSE_TUNING_DB``, inherited by the processes it starts): never
    the user's ``~/.cache/tilefuse/tuning.json``, and no choice or config one test stored decides another's plan (tests
    run in any order, several at once). A test that sets the variable itself overrides it."""
    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path_factory.mktemp("tuning") / "tuning.json"))


@pytest.fixture
def rng():
    """A fresh generator per test: fresh random inputs every run (the seed is printed on failure)."""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def with_norm_statistics(rng):
    """``fn(module)``: the module in eval mode, every batch norm's running mean N(0, 1) and variance in [0.5, 1.5)
    (the defaults, 0 and 1, would hide an affine map read at the wrong channel)."""
    def fn(m: torch.nn.Module) -> torch.nn.Module:
        with torch.no_grad():
            for bn in m.modules():
                if isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
                    bn.running_mean.copy_(torch.randn(bn.running_mean.shape, generator=rng))
                    bn.running_var.copy_(torch.rand(bn.running_var.shape, generator=rng) + 0.5)
        return m.eval()
    return fn


# The first lines of a script run in a fresh interpreter that must count real kernel compilations (TileLang
# cache misses): imports TileLang first, times that import (``tilelang_import_s``) and appends to ``compiles``
# on every compile. The artifact and tuning tests start their child scripts with it.
COUNT_COMPILES = r'''
import json, sys, time
t0 = time.perf_counter()
from tilelang.jit.kernel import JITKernel
tilelang_import_s = time.perf_counter() - t0
compiles = []
_compile = JITKernel._compile_and_create_adapter
def _counted(self, *args, **kwargs):
    compiles.append(1)
    return _compile(self, *args, **kwargs)
JITKernel._compile_and_create_adapter = _counted
'''


@pytest.fixture
def child_script(tmp_path):
    """``child_script(body)`` -> the path of a script: ``COUNT_COMPILES`` then ``body``."""
    def write(body: str, name: str = "child.py"):
        path = tmp_path / name
        path.write_text(COUNT_COMPILES + body)
        return path
    return write

"""Shared test setup: GPU tests are skipped visibly where there is no CUDA device. The PrimFunc disk cache
(``lowering/func_cache.py``) is off, so tests that patch templates see their patches; ``test_func_cache``
turns it on for itself."""

import os

import pytest
import torch

os.environ.setdefault("TILEFUSE_FUNC_CACHE", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: no CUDA device here (these run on the H200 device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh generator per test: fresh random inputs every run (the seed is printed on failure)."""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)

"""Shared test setup: GPU tests are skipped visibly where there is no CUDA device."""

import pytest
import torch


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

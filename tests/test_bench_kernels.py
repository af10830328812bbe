"""bench/profile_kernels.py's profile arithmetic: the GPU's busy time is the union of its kernels' intervals. With programmatic
dependent launch (a decode step's kernels) a kernel is placed while the one before still runs, and its own time counts
that wait: summed, a step's kernels "ran" 0.59 ms of a 0.38 ms step (bench/results/2026-12-02-h200-session17)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from profile_kernels import covered_us


def test_overlapping_kernels_count_once_and_gaps_not_at_all():
    assert covered_us([]) == 0
    assert covered_us([(0, 10), (20, 25)]) == 15  # apart: the sum, not the gap
    assert covered_us([(0, 10), (5, 12), (11, 13)]) == 13  # a chain of early launches
    assert covered_us([(30, 40), (0, 100), (10, 20)]) == 100  # contained, in any order
    assert covered_us([(0, 5), (5, 9)]) == 9  # touching


def test_no_bench_module_shadows_an_installed_or_standard_module():
    """The tests put bench/ first on sys.path, so a bench script named like an installed package hides it from every
    library in the run: bench/kernels.py hid the ``kernels`` package transformers 5.25 imports, and 79 Hugging Face
    tests failed in CI with 'cannot import name CUDAProperties from kernels (bench/kernels.py)'."""
    import importlib.metadata

    taken = set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
    bench = Path(__file__).resolve().parent.parent / "bench"
    clashes = sorted(p.stem for p in bench.glob("*.py") if p.stem in taken)
    assert not clashes, f"bench modules named like installed or standard modules (rename them): {clashes}"

"""Moved to ``tilefuse.ops.sparse_layout``: the 2:4 weight layout is data the op references and the planner use.

Kept only while tests/test_sparse.py, lowering/sparse_builder.py and bench/bench_sparse.py import it from here;
delete it once they import ``tilefuse.ops.sparse_layout``.
"""

from tilefuse.ops.sparse_layout import (  # noqa: F401
    E_FACTOR,
    GROUP,
    K_ALIGN,
    KEEP,
    META_DTYPE,
    SPARSE_DTYPES,
    compress_2_4,
    decompress_2_4,
    is_2_4,
    padded_k,
    prune_2_4,
)

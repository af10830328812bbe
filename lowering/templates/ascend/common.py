"""What the Ascend templates share: the supported subset of the expressions and dtypes, and element reads.

Every op ``lowering.expr`` emits, indexed reads (``Load``: gathers, slices, transposes) included, lowers to AscendC
(tests/test_vendor_ascend.py lowers them all); what the templates refuse is a dtype (``refusal``).

Note: the Ascend dialect (``tilelang.ascend.language``, Ascend 950, arch ``dav-3510``) runs scalar code only inside a
vector function: ``T.SimtVF(threads=...)`` (SIMT threads sharing a ``T.Parallel`` loop) or ``T.SimdVF()``; a
``T.Parallel`` loop outside one is refused, which is why the CUDA/C templates cannot serve Ascend. The templates here
compute in SIMT vector functions that read global memory directly (the lowering vectorizes contiguous reads), and
the GEMM runs on the Cube core with its epilogue on the two vector cores. Everything computes in fp32 as the
other templates do. Without CANN nothing here compiles or runs: the checks are that TileLang lowers each kernel to
AscendC source.
"""

from __future__ import annotations

from collections.abc import Iterable

import tilelang.ascend.language as T

# Storage dtypes the templates take: float64 is refused (the vector units compute no float64); int64 is read as
# SIMT scalars (token ids, gather indices).
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")


def refusal(dtypes: Iterable[str | None], what: str) -> str | None:
    """Why an Ascend template cannot take these dtypes, or None when it can."""
    bad = sorted({dt for dt in dtypes if dt is not None and dt not in DTYPES})
    if bad:
        return f"the Ascend {what} template takes {', '.join(DTYPES)}, not {', '.join(bad)}"
    return None


def read(value, dtype: str):
    """An element as the expressions take it (bool is stored as int8)."""
    return value != T.int8(0) if dtype == "bool" else value


def store(value, dtype: str):
    """``value`` cast to the stored ``dtype`` (bool as int8)."""
    if dtype == "bool":
        return T.Cast("int8", value if str(value.dtype) == "bool" else value != T.Cast(str(value.dtype), 0))
    if dtype in ("float16", "bfloat16") and not str(value.dtype).startswith("float"):
        value = T.Cast("float32", value)
    return T.Cast(dtype, value)

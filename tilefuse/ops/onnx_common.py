"""What the ONNX-only ops share: the infer of a data-dependent op, and the integer dtypes torch computes little in.

Note: the ops only the ONNX frontend needs (ONNX semantics torch has no single function for, and the runtime-tensor
forms of ops whose shape/axes/sizes inputs are not constants) live by meaning in ``onnx_math`` (elementwise ops and
reductions), ``onnx_quant``, ``onnx_shape`` (shapes known at run time), ``onnx_index`` (gathers, scatters,
selections), ``onnx_layers`` (pooling, recurrent networks, deformable convolution), ``onnx_image`` (resizing and
sampling) and ``onnx_signal``. An op whose output shape depends on input *values* (``nonzero``, ``slice_dynamic``,
...) declares ``infer`` returning dims named ``"?"``; the ONNX importer renames each to a fresh symbol. Integer
dtypes torch cannot compute in (uint16/32/64) are widened to int64 inside a reference and narrowed back, which
wraps exactly like C.
"""

from __future__ import annotations

import math

import torch

from tilefuse.ir import TensorType

WIDE_DTYPES = (torch.uint16, torch.uint32, torch.uint64)  # torch computes little in these: widened to int64


def dynamic_infer(rank_of=None, rank: int | None = None, dtype_of: int = 0, dtype: str | None = None,
                  len_of: int | None = None):
    """``infer`` for a data-dependent op: unknown dims; the rank is ``rank``, the rank of input
    ``rank_of``, the length of the 1-D input ``len_of``, or the larger of the last two."""

    def infer(in_types, attrs):
        ranks = []
        if rank is not None:
            ranks.append(rank)
        if rank_of is not None:
            ranks.append(in_types[rank_of].rank)
        if len_of is not None:
            s = in_types[len_of].shape
            ranks.append(s[0] if s and isinstance(s[0], int) else None)
        r = None if None in ranks else max(ranks)
        d = dtype or attrs.get("dtype") or in_types[dtype_of].dtype
        return [TensorType(None if r is None else ("?",) * r, d)]

    return infer


def same_type(in_types, attrs):
    """``infer`` of an op whose output has its first input's type."""
    return [in_types[0]]


def extreme(dtype: torch.dtype, high: bool):
    """The largest (``high``) or smallest value of ``dtype``: the identity of min / max."""
    if dtype == torch.bool:
        return high
    if dtype.is_floating_point:
        return math.inf if high else -math.inf
    return torch.iinfo(dtype).max if high else torch.iinfo(dtype).min


def widen(x: torch.Tensor) -> torch.Tensor:
    """``x`` as int64 when torch computes little in its dtype (``WIDE_DTYPES``), else ``x``."""
    return x.to(torch.int64) if x.dtype in WIDE_DTYPES else x

"""Elementwise and broadcast chains on Ascend: the ``elementwise`` template's expressions in a SIMT vector function.

Note: the parameters are the ``elementwise`` template's (``lowering.templates.elementwise``): inputs, then one output
per expression, each output computed over its own shape with inputs read under numpy broadcasting (``Arg``/``Acc``).
``Coord``/``Load`` read inputs at computed coordinates (transposes, slices, concats, gathers such as an embedding's,
int64 ids included): SIMT threads read global memory element by element, so a gather needs no special path. The
index space is the largest output flattened; each block of the launch takes ``block`` elements, shared by
``threads`` SIMT threads; smaller outputs are guarded.
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.ascend.language as T

from tilefuse.lowering.expr import Expr, emit
from tilefuse.lowering.templates.ascend.common import read, refusal, store
from tilefuse.lowering.templates.common import (
    broadcast_shapes,
    normalize_shapes,
    numel,
    param,
    view,
)
from tilefuse.lowering.templates.elementwise import element_env, storage_dtype


def elementwise(
    in_shapes: Sequence[Sequence[int]],
    in_dtypes: Sequence[str],
    exprs: Sequence[Expr],
    out_dtypes: Sequence[str],
    out_shape: Sequence[int] | None = None,
    *,
    out_shapes: Sequence[Sequence[int]] | None = None,
    block: int = 2048,
    threads: int = 256,
    target: dict | str = "ascend",
):
    """A ``T.prim_func`` (Ascend dialect) computing ``out_k = exprs[k](inputs)`` for every element of output ``k``.

    Same parameters and layout as ``lowering.templates.elementwise.elementwise``; raises ``NotImplementedError``
    for what ``refusal`` names."""
    in_shapes = normalize_shapes(in_shapes)
    if out_shapes is None:
        shape = tuple(int(d) for d in out_shape) if out_shape is not None else broadcast_shapes(*in_shapes)
        out_shapes = (shape,) * len(exprs)
    out_shapes = normalize_shapes(out_shapes)
    if len(in_dtypes) != len(in_shapes) or len(out_dtypes) != len(exprs) or len(out_shapes) != len(exprs):
        raise ValueError("elementwise: one dtype per input, one dtype and shape per output expression")
    why = refusal((*in_dtypes, *out_dtypes), "elementwise")
    if why:
        raise NotImplementedError(why)
    sizes = [numel(s) for s in out_shapes]
    total = max(sizes, default=1)
    block = max(1, min(block, total))
    out_params = [(s or (1,), storage_dtype(dt)) for s, dt in zip(out_shapes, out_dtypes)]

    def store_one(ins, flats, out, k, idx):
        env = element_env(exprs[k], ins, flats, in_shapes, in_dtypes, out_shapes[k], idx, read)
        T.buffer_store(out, store(emit(exprs[k], env), out_dtypes[k]), [idx])

    @T.prim_func
    def elementwise_kernel():
        ins = [param(f"in{i}", s, storage_dtype(dt)) for i, (s, dt) in enumerate(zip(in_shapes, in_dtypes))]
        outs = [param(f"out{k}", s, dt) for k, (s, dt) in enumerate(out_params)]
        flats = [view(b, (numel(s),)) for b, s in zip(ins, in_shapes)]
        flat_outs = [view(b, (n,)) for b, n in zip(outs, sizes)]
        with T.Kernel(T.ceildiv(total, block)) as bx, T.SimtVF(threads=threads):
            for i in T.Parallel(block):
                idx = bx * block + i
                for k, out in enumerate(flat_outs):
                    if idx < sizes[k]:
                        store_one(ins, flats, out, k, idx)

    return elementwise_kernel


def get_configs(target: dict | str = "ascend") -> list[dict]:
    """Tunables: elements per block and SIMT threads per vector function."""
    return [{"block": b, "threads": t} for b in (2048, 4096, 1024) for t in (256, 128)]

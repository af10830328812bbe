"""Elementwise/broadcast chains as one kernel: N inputs, several outputs, one flat index space.

Note: every output has the same shape (the broadcast of the inputs, or a given ``out_shape``) and is
computed by its own expression over the inputs (``Arg(i)`` is input ``i``; ``Acc()`` means input 0,
so a single-input chain reads naturally). The index space is the output flattened to 1-D; an input
of the output's shape is read at the flat index, any other through its broadcast coordinates
(constant strides, so the divisions are by constants). Each program handles ``block`` elements; on
GPUs ``threads`` threads share them (TileLang vectorizes the parallel loop), on CPU a serial loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.language as T
import torch

from tilefuse.lowering.expr import Env, Expr, emit, evaluate
from tilefuse.lowering.templates.common import (
    broadcast_index,
    broadcast_shapes,
    check_dtype,
    dialect,
    normalize_shapes,
    numel,
    param,
    unravel,
    view,
)


def elementwise(
    in_shapes: Sequence[Sequence[int]],
    in_dtypes: Sequence[str],
    exprs: Sequence[Expr],
    out_dtypes: Sequence[str],
    out_shape: Sequence[int] | None = None,
    *,
    block: int = 1024,
    threads: int = 256,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` computing ``out_k = exprs[k](inputs)`` elementwise.

    Parameters are the inputs in order, then the outputs (``out_idx`` = the last ``len(exprs)``); a
    0-d output is declared ``(1,)`` since TileLang cannot allocate 0-d outputs (0-d inputs are fine).
    ``in_shapes`` broadcast (numpy rules) to ``out_shape`` (default: their broadcast). Floating
    values compute in fp32 and are cast to ``out_dtypes[k]`` on store. ``block`` elements per program.
    """
    in_shapes = normalize_shapes(in_shapes)
    if len(in_dtypes) != len(in_shapes) or len(out_dtypes) != len(exprs):
        raise ValueError("elementwise: one dtype per input and one per output expression")
    out_shape = tuple(int(d) for d in out_shape) if out_shape is not None else broadcast_shapes(*in_shapes)
    if broadcast_shapes(out_shape, *in_shapes) != out_shape:
        raise ValueError(f"elementwise: inputs {in_shapes} do not broadcast to the output shape {out_shape}")
    for dt in (*in_dtypes, *out_dtypes):
        check_dtype(dt, target, "elementwise")
    d = dialect(target)
    total = numel(out_shape)
    block = max(1, min(block, total))
    n_in = len(in_shapes)
    out_param_shape = out_shape or (1,)  # outside the kernel body, where `or` would become a TIR bool op

    def store_all(ins, outs, idx):
        """Every output at flat index idx; operands of the output's shape are read flat."""
        coords = unravel(idx, out_shape)

        def arg(i):
            return ins[i][idx] if in_shapes[i] == out_shape else ins[i][broadcast_index(in_shapes[i], coords)]

        env = Env(acc=arg(0) if n_in else None, arg=arg)
        for out, e, dt in zip(outs, exprs, out_dtypes):
            T.buffer_store(out, T.Cast(dt, emit(e, env)), [idx])

    @T.prim_func
    def elementwise_kernel():
        ins = [param(f"in{i}", s, dt) for i, (s, dt) in enumerate(zip(in_shapes, in_dtypes))]
        outs = [param(f"out{k}", out_param_shape, dt) for k, dt in enumerate(out_dtypes)]
        flat_ins = [view(b, (total,)) if s == out_shape else b for b, s in zip(ins, in_shapes)]
        flat_outs = [view(b, (total,)) for b in outs]
        with d.kernel(T.ceildiv(total, block), threads=threads) as bx:
            for i in d.tile_loop(block):
                idx = bx * block + i
                if idx < total:
                    store_all(flat_ins, flat_outs, idx)

    return elementwise_kernel


def reference(inputs: Sequence[torch.Tensor], exprs: Sequence[Expr], out_dtypes: Sequence[str],
              out_shape: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Torch reference of ``elementwise``: the same expressions through ``evaluate`` (0-d as ``(1,)``)."""
    shape = tuple(out_shape) if out_shape is not None else tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    outs = []
    for e, dt in zip(exprs, out_dtypes):
        v = evaluate(e, inputs[0] if inputs else None, inputs)
        outs.append(v.to(getattr(torch, dt)).expand(shape).reshape(shape or (1,)).contiguous())
    return outs


def get_configs(target: dict | str) -> list[dict]:
    """Tunables to try: elements per program and threads (threads is ignored on CPU)."""
    if dialect(target).cpu:
        return [{"block": 4096}, {"block": 1024}]
    return [{"block": b, "threads": t} for b in (1024, 2048, 4096) for t in (128, 256)]

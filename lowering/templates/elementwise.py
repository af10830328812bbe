"""Elementwise, broadcast and injective chains as one kernel: N inputs, several outputs, one flat index space.

Note: output ``k`` has shape ``out_shapes[k]`` (by default every output has the broadcast of the
inputs, or a given ``out_shape``) and is computed by its own expression over the inputs: ``Arg(i)``
is input ``i`` read under numpy broadcasting against that output (``Acc()`` means input 0, so a
single-input chain reads naturally); ``Coord(d)`` is the output element's coordinate ``d`` and
``Load(i, index)`` reads input ``i`` at computed coordinates, which is how transposes, slices,
concats, gathers and rotary embeddings read their inputs (``lowering.index`` builds them). The index
space is the largest output flattened to 1-D; smaller outputs are guarded. An input of the output's
shape read by ``Arg`` uses the flat index, any other read goes through coordinates (constant
strides, so the divisions are by constants). Each program handles ``block`` elements; on GPUs
``threads`` threads share them (TileLang vectorizes the parallel loop), on CPU a serial loop.

Note: bool tensors are stored as int8 (0/1) at the kernel boundary — TileLang's C codegen types a
bool buffer ``int8_t`` in the kernel and ``bool`` in its host wrapper, which does not compile — so
callers pass ``as_storage(t)`` and view bool outputs back (``from_storage``); inside, reads compare
with 0 and stores cast the bool to int8, on every target alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tilelang.language as T
import torch

from tilefuse.lowering.expr import Acc, Arg, Env, Expr, Load, emit, evaluate, indexed_by_data, tree_size, walk
from tilefuse.lowering.templates.common import (
    PDL_MAX_ELEMENTS,
    broadcast_index,
    broadcast_shapes,
    check_dtype,
    dialect,
    int32_index,
    normalize_shapes,
    numel,
    param,
    unravel,
    view,
)


def element_env(expr: Expr, ins, flats, in_shapes, in_dtypes, shape, idx, read) -> Env:
    """What ``expr`` reads at flat index ``idx`` of an output of ``shape``: input ``i`` flat where its shape is the
    output's, else broadcast at the output's coordinates; gathers at int32 indices; each value through ``read``
    (bool storage to bool). Shared by the elementwise templates of every dialect (``templates/ascend``)."""
    c = unravel(idx, shape)

    def arg(i):
        if in_shapes[i] == shape:
            return read(flats[i][idx], in_dtypes[i])
        return read(ins[i][broadcast_index(in_shapes[i], c)], in_dtypes[i])

    def load(i, index):
        return read(ins[i][int32_index(index)], in_dtypes[i])

    uses_acc = bool(in_shapes) and any(isinstance(n, Acc) for n in walk(expr))
    return Env(acc=arg(0) if uses_acc else None, arg=arg, coord=lambda dim: c[dim], load=load)


def storage_dtype(dtype: str) -> str:
    """The dtype a tensor of ``dtype`` has at the kernel boundary (bool travels as int8)."""
    return "int8" if dtype == "bool" else dtype


def as_storage(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernel takes it (a bool tensor viewed as int8, no copy)."""
    return t.view(torch.int8) if t.dtype == torch.bool else t


def from_storage(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """A kernel output of logical ``dtype`` back in that dtype (int8 viewed as bool)."""
    return t.view(torch.bool) if dtype == "bool" and t.dtype != torch.bool else t


def elementwise(
    in_shapes: Sequence[Sequence[int]],
    in_dtypes: Sequence[str],
    exprs: Sequence[Expr],
    out_dtypes: Sequence[str],
    out_shape: Sequence[int] | None = None,
    *,
    out_shapes: Sequence[Sequence[int]] | None = None,
    scatters: Sequence[tuple[int, int, Expr] | None] = (),
    block: int = 1024,
    threads: int = 256,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` computing ``out_k = exprs[k](inputs)`` for every element of output ``k``.

    Parameters are the inputs in order, then the outputs (``out_idx`` = the last ones, one per output that is
    not a scatter); a 0-d output is declared ``(1,)`` since TileLang cannot allocate 0-d outputs (0-d inputs are
    fine). ``out_shapes`` gives each output its shape; without it every output has ``out_shape`` (default: the
    broadcast of ``in_shapes``). Inputs read by ``Arg`` must broadcast (numpy rules) to their output's shape.
    Floating values compute in fp32 and are cast to ``out_dtypes[k]`` on store. ``block`` elements per program.

    ``scatters[k] = (dest, dim, index)`` makes output ``k`` an in-place ``index_copy`` (a static cache's update):
    its element at coordinates ``c`` is stored into input ``dest`` at ``c`` with ``c[dim]`` replaced by
    ``index`` (an expression evaluated at ``c``), not into an output of its own. An index outside ``dest``'s
    dim stores nothing: GPUs trap there, as torch's device-side assert (the c target's caller checks on the
    host first, ``runtime.kernels``).
    """
    scatters = tuple(scatters) or (None,) * len(exprs)
    if len(scatters) != len(exprs):
        raise ValueError("elementwise: one scatter entry (or None) per output expression")
    in_shapes = normalize_shapes(in_shapes)
    if len(in_dtypes) != len(in_shapes) or len(out_dtypes) != len(exprs):
        raise ValueError("elementwise: one dtype per input and one per output expression")
    if out_shapes is None:
        shape = tuple(int(d) for d in out_shape) if out_shape is not None else broadcast_shapes(*in_shapes)
        if broadcast_shapes(shape, *in_shapes) != shape:
            raise ValueError(f"elementwise: inputs {in_shapes} do not broadcast to the output shape {shape}")
        out_shapes = (shape,) * len(exprs)
    out_shapes = normalize_shapes(out_shapes)
    if len(out_shapes) != len(exprs):
        raise ValueError("elementwise: one shape per output expression")
    for e, s in zip(exprs, out_shapes):
        read = {n.index for n in walk(e) if isinstance(n, Arg)} | ({0} if any(isinstance(n, Acc) for n in walk(e))
                                                                   else set())
        if any(i >= len(in_shapes) or broadcast_shapes(s, in_shapes[i]) != s for i in read):
            raise ValueError(f"elementwise: {e} reads inputs that do not broadcast to its output shape {s}")
    for dt in (*in_dtypes, *out_dtypes):
        check_dtype(dt, target, "elementwise")
    d = dialect(target)
    sizes = [numel(s) for s in out_shapes]
    total = max(sizes, default=1)
    block = max(1, min(block, total))
    flat_in = [s in out_shapes for s in in_shapes]  # read flat where an output has the same shape
    # Outside the kernel body, where `or` would become a TIR bool op.
    out_params = [(s or (1,), storage_dtype(dt)) for s, dt, sc in zip(out_shapes, out_dtypes, scatters) if sc is None]
    for sc, s, dt in zip(scatters, out_shapes, out_dtypes):
        if sc is not None and (not 0 <= sc[0] < len(in_shapes) or len(in_shapes[sc[0]]) != len(s) or
                               not 0 <= sc[1] < len(s) or in_dtypes[sc[0]] != dt or
                               any(a != b for d, (a, b) in enumerate(zip(in_shapes[sc[0]], s)) if d != sc[1])):
            raise ValueError(f"elementwise: scatter {sc[:2]} of a {dt}{list(s)} output into input {sc[0]} "
                             f"({in_dtypes[sc[0]] if 0 <= sc[0] < len(in_dtypes) else '?'}"
                             f"{list(in_shapes[sc[0]]) if 0 <= sc[0] < len(in_shapes) else ''}): the input must "
                             "have the output's dtype, rank and dims but the scattered one")
    # A gather (an index read from data) broadcasts its index load across TileLang's vector lanes,
    # and int64 vectors have no CUDA type: such kernels walk their block SIMT-style instead
    # (thread t takes elements t, t + threads, ...: still coalesced, never vectorized).
    # Large expressions compute every op once, into a local of its own; gathers their indices (``Env.bind``). On GPUs
    # those kernels walk their block SIMT-style too.
    bound, gathers = tree_size(exprs) > BIND_LARGER_THAN, any(_gathers(e) for e in exprs)
    simt = not d.cpu and (bound or gathers or any(dt in _WIDE_INTS for dt in (*in_dtypes, *out_dtypes)))
    steps = -(-block // threads)

    def read(buf, dtype):
        return buf != T.int8(0) if dtype == "bool" else buf

    def store_one(ins, flats, out, k, idx):
        """Output k at flat index idx."""
        env = element_env(exprs[k], ins, flats, in_shapes, in_dtypes, out_shapes[k], idx, read)
        if bound or gathers:
            env = dataclasses.replace(env, bind=_local, bind_all=bound)
        v = emit(exprs[k], env)
        if out_dtypes[k] == "bool":  # a select, not a cast: CUDA has no cast of TileLang's boolx8 vector to int8x8
            v = T.if_then_else(v if str(v.dtype) == "bool" else v != T.Cast(str(v.dtype), 0), T.int8(1), T.int8(0))
        else:
            if out_dtypes[k] in ("float16", "bfloat16") and not str(v.dtype).startswith("float"):
                v = T.Cast("float32", v)  # cutlass's half_t has no unambiguous int64 constructor
            v = T.Cast(out_dtypes[k], v)
        if scatters[k] is None:
            T.buffer_store(out, v, [idx])
            return
        dest, dim, index = scatters[k]
        c = list(unravel(idx, out_shapes[k]))
        at = emit(index, env)  # bounds in the index's own dtype (an int64 past 2**31 must not wrap into range)
        inside = T.And(at >= T.Cast(str(at.dtype), 0), at < T.Cast(str(at.dtype), in_shapes[dest][dim]))
        with T.If(inside), T.Then():
            c[dim] = T.Cast("int32", at)
            T.buffer_store(ins[dest], v, c)
        if not d.cpu:
            with T.If(T.Not(inside)), T.Then():
                T.evaluate(T.call_extern("int32", d.trap))

    def store_all(ins, flats, outs, idx):
        outs = iter(outs)
        outs = [None if sc is not None else next(outs) for sc in scatters]
        for k, out in enumerate(outs):
            if sizes[k] == total:
                store_one(ins, flats, out, k, idx)
            else:
                with T.If(idx < sizes[k]), T.Then():
                    store_one(ins, flats, out, k, idx)

    @T.prim_func
    def elementwise_kernel():
        ins = [param(f"in{i}", s, storage_dtype(dt)) for i, (s, dt) in enumerate(zip(in_shapes, in_dtypes))]
        outs = [param(f"out{k}", s, dt) for k, (s, dt) in enumerate(out_params)]
        flats = [view(b, (numel(s),)) if f else None for b, s, f in zip(ins, in_shapes, flat_in)]
        flat_outs = [view(b, (n,)) for b, n in zip(outs, [n for n, sc in zip(sizes, scatters) if sc is None])]
        with d.kernel(T.ceildiv(total, block), threads=threads) as bx:
            d.wait_inputs(total <= PDL_MAX_ELEMENTS)
            if simt:
                tx = T.get_thread_binding()
                for j in T.serial(steps):
                    if T.And(j * threads + tx < block, bx * block + j * threads + tx < total):
                        store_all(ins, flats, flat_outs, bx * block + j * threads + tx)
            else:
                for i in d.tile_loop(block):
                    idx = bx * block + i
                    if idx < total:
                        store_all(ins, flats, flat_outs, idx)

    return elementwise_kernel


_WIDE_INTS = ("int64", "uint64")
# Expressions larger than this (nodes, unfolded as trees) bind every op to a local (``expr.Env.bind_all``). The zoo's
# largest is 66 nodes (2026-12-05): their kernels are emitted as before.
BIND_LARGER_THAN = 256


def _local(value):
    """``value`` computed into a local of its own dtype; the local's read."""
    v = T.alloc_local((1,), str(value.dtype))
    T.buffer_store(v, value, [0])
    return v[0]


def _gathers(e: Expr) -> bool:
    """Whether ``e`` reads an input at an index computed from data (an embedding, a gather)."""
    return any(isinstance(n, Load) and indexed_by_data(n) for n in walk(e))


def reference(inputs: Sequence[torch.Tensor], exprs: Sequence[Expr], out_dtypes: Sequence[str],
              out_shape: Sequence[int] | None = None, *,
              out_shapes: Sequence[Sequence[int]] | None = None) -> list[torch.Tensor]:
    """Torch reference of ``elementwise``: the same expressions through ``evaluate`` (0-d as ``(1,)``).

    Takes and returns tensors in their logical dtypes (bool as bool)."""
    if out_shapes is None:
        shape = tuple(out_shape) if out_shape is not None else tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
        out_shapes = [shape] * len(exprs)
    outs = []
    for e, dt, shape in zip(exprs, out_dtypes, out_shapes):
        shape = tuple(shape)
        v = evaluate(e, inputs[0] if inputs else None, inputs, shape=shape)
        outs.append(v.to(getattr(torch, dt)).expand(shape).reshape(shape or (1,)).contiguous())
    return outs


def get_configs(target: dict | str) -> list[dict]:
    """Tunables to try: elements per program and threads (threads is ignored on CPU)."""
    if dialect(target).cpu:
        return [{"block": 4096}, {"block": 1024}]
    return [{"block": b, "threads": t} for b in (1024, 2048, 4096) for t in (128, 256)]

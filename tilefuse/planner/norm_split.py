"""Group and instance norms of few, long groups split into chunks for GPUs (``split_long_norms``), a pure graph pass.

Note: a group norm is a row reduction with one group a row (``lowering/norm_builder.py``), one program a row. A VAE
decoder's norms have 32 rows of 262,144 to a million elements (1 x 512 x 128 x 128 in 32 groups): 32 programs on a
GPU of 132 SMs, each walking its row twice. On the H100 (2026-12-05, ``bench_group_norm.py``) that ran at 0.05x
Inductor, which splits such reductions. Where the rows are fewer than ``MAX_ROWS`` and longer than ``MIN_ROW``, the
norm becomes ops the planner already has kernels for:

- each group read as ``S`` chunks of whole rows of the input (``chunk_length``), ``(N, G, S, L/S)``, and each
  chunk's mean and population variance taken (two row reductions of ``N * G * S`` rows, in float32 whatever the
  input's dtype);
- the group's moments merged from its chunks' (equal sizes, so ``mean = mean(m_i)`` and
  ``var = mean(v_i) + mean((m_i - mean)^2)``: Chan's merge, no sum of squares to cancel), and ``rsqrt(var + eps)``;
- ``(x - mean) * rstd * weight + bias`` as one elementwise kernel over ``(N, G, C/G, *spatial)``, with what follows
  the norm (SiLU, a residual) fused into it, cast back to the input's dtype once, as torch's kernels do.

The input is read three times (twice for the statistics) where the fused norm reads it twice, but by every SM. NaN
and infinities follow torch: a chunk holding one has a NaN or infinite moment, and so the whole group is NaN.
"""

from __future__ import annotations

import math

import torch

from tilefuse.ir import Graph, Node, TensorType
from tilefuse.ops.nn import norm_groups
from tilefuse.planner.layout import GraphEdit
from tilefuse.planner.pattern import RewriteLog

SPLIT_TARGETS = ("cuda", "hip")
MAX_ROWS = 256  # fewer groups than about two waves of a GPU's SMs
MIN_ROW = 16384  # and each group longer than this many elements
MIN_CHUNK = 256  # a chunk's row reduction is at least this long
WANT_ROWS = 512  # chunks enough for this many rows in all


def chunk_length(rows: int, group: int, spatial: tuple[int, ...], *, min_chunk: int = MIN_CHUNK,
                 want_rows: int = WANT_ROWS) -> int:
    """How long a chunk of each of ``rows`` groups of ``group`` elements over ``spatial`` dims is: the longest
    product of trailing spatial dims (a chunk is whole rows of the input, as the row reduction loads it) that makes
    ``want_rows`` rows in all and is at least ``min_chunk`` long; where none makes that many, the shortest that is
    at least ``min_chunk`` long (the most rows there are: 1 x 256 x 128 x 128 in 32 groups, 256 rows of 16,384
    rather than 32 of 131,072); ``group`` (no split) where no product is."""
    fits = [n for n in (math.prod(spatial[j:]) for j in range(len(spatial))) if n >= min_chunk]
    for length in fits:
        if rows * (group // length) >= want_rows:
            return length
    return fits[-1] if fits else group


def split_long_norms(graph: Graph, target: dict | None, log: RewriteLog | None = None, *, max_rows: int = MAX_ROWS,
                     min_row: int = MIN_ROW, min_chunk: int = MIN_CHUNK, want_rows: int = WANT_ROWS) -> Graph:
    """``graph`` with each group or instance norm of fewer than ``max_rows`` groups (a row each) of at least
    ``min_row`` elements computed in chunks (``chunk_length``, the module note); unchanged off ``SPLIT_TARGETS`` or
    where no norm is such. The values are the same, to float32 rounding. Each split is logged as ``norm.split_rows``."""
    if target is None or target.get("kind") not in SPLIT_TARGETS:
        return graph
    types = {k: v.type for k, v in graph.values().items()}
    todo = {}
    for n in graph.nodes:
        length = _chunk_of(n, types, max_rows, min_row, min_chunk, want_rows)
        if length:
            todo[n.name] = length
            if log is not None:
                log.applied.append(("norm.split_rows", n.name))
    if not todo:
        return graph
    edit, constants = GraphEdit(graph, types), dict(graph.constants)
    for n in graph.nodes:
        if n.name in todo:
            _split(edit, constants, n, todo[n.name])
        else:
            edit.nodes.append(n)
    return graph.replace(nodes=tuple(edit.nodes), constants=constants).verify()


def _chunk_of(n: Node, types: dict[str, TensorType], max_rows: int, min_row: int, min_chunk: int,
              want_rows: int) -> int:
    """The length of a chunk of norm ``n``'s groups (``chunk_length``), or 0 where it stays one kernel."""
    if n.op not in ("group_norm", "instance_norm") or len(n.outputs) != 1:
        return 0
    shape = types[n.inputs[0]].shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape):
        return 0
    if types[n.inputs[0]].dtype not in ("float32", "float16", "bfloat16"):
        return 0
    c = shape[1]
    groups = norm_groups(n.op, n.attr, c)
    if groups < 1 or c % groups:
        return 0
    rows, length = shape[0] * groups, c // groups * math.prod(shape[2:])
    if rows >= max_rows or length < min_row:
        return 0
    chunk = chunk_length(rows, length, tuple(shape[2:]), min_chunk=min_chunk, want_rows=want_rows)
    return chunk if chunk < length else 0


def _split(edit: GraphEdit, constants: dict, n: Node, chunk: int) -> None:
    """Norm ``n``'s nodes in chunks of ``chunk`` elements, writing its output value (see the module note)."""
    x = n.inputs[0]
    shape, dtype = tuple(edit.types[x].shape), edit.types[x].dtype
    c, spatial = shape[1], shape[2:]
    groups = norm_groups(n.op, n.attr, c)
    cg, length = c // groups, c // groups * math.prod(spatial)
    base, f32 = n.name, "float32"

    def emit(op: str, inputs: tuple[str, ...], **attrs) -> str:
        return edit.emit(op, inputs, attrs, base=f"{base}_{op}")

    def as_f32(v: str) -> str:
        return v if edit.types[v].dtype == f32 else emit("cast", (v,), dtype=f32)

    def scalar(value: float) -> str:
        name = edit.fresh(f"{base}_eps")
        constants[name] = torch.tensor(value, dtype=torch.float32)
        edit.types[name] = TensorType((), f32)
        return name

    def chunked() -> str:  # one view and cast for each reduction: each its prologue, nothing written between
        return as_f32(emit("reshape", (x,), shape=(shape[0], groups, length // chunk, chunk)))

    mean_c = emit("mean", (chunked(),), dims=(3,), keepdim=True)
    var_c = emit("var", (chunked(),), dims=(3,), correction=0, keepdim=True)
    mean = emit("mean", (mean_c,), dims=(2,), keepdim=True)
    d = emit("sub", (mean_c, mean))
    spread = emit("mean", (emit("mul", (d, d)),), dims=(2,), keepdim=True)
    var = emit("add", (emit("mean", (var_c,), dims=(2,), keepdim=True), spread))
    rstd = emit("rsqrt", (emit("add", (var, scalar(float(n.attr.get("eps", 1e-5))))),))
    lead = (shape[0], groups, cg)
    stats = (shape[0], groups) + (1,) * (1 + len(spatial))
    xg = as_f32(emit("reshape", (x,), shape=lead + spatial))
    y = emit("mul", (emit("sub", (xg, emit("reshape", (mean,), shape=stats))), emit("reshape", (rstd,), shape=stats)))
    per_channel = (1, groups, cg) + (1,) * len(spatial)
    for op, v in zip(("mul", "add"), n.inputs[1:3]):
        if v:
            y = emit(op, (y, as_f32(emit("reshape", (v,), shape=per_channel))))
    if dtype != f32:
        y = emit("cast", (y,), dtype=dtype)
    out = n.outputs[0]
    edit.emit("reshape", (y,), {"shape": shape}, out=out.name, node=n.name)

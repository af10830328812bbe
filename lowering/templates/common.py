"""What the templates share: target dispatch, kernel parameters, broadcast indexing.

Note: the CPU dialect (``c``) differs from the GPU one: ``T.Kernel`` takes no ``threads``, tiles live
in ``T.alloc_local`` buffers and are walked with ``T.grid`` (a ``T.Parallel`` loop over a local
buffer is rejected), and ``T.Pipelined`` has nothing to overlap. Templates write one body and take
these differences from a ``Dialect`` object, so a kernel family has one factory for every target.

Note: Metal (``metal``, source only) takes the GPU dialect with two differences the templates branch on, marked
``d.metal``: TileLang 0.1.15 registers no reduction for it ("tl.reduce requires a target-specific
implementation"), so ``Dialect.reduce`` writes one with shared memory and plain loops; and a ``T.gemm``
accumulator becomes an array of opaque ``simdgroup_float8x8`` matrices, whose elements no code can read, so a
GEMM-family template copies it to threadgroup memory (``simdgroup_store``) before any elementwise epilogue or
store. Nothing in these branches runs for ``cuda`` or ``c``.

Note: on CUDA sm_90+ a decode step's kernels launch as programmatic dependents (PDL): every gemv, packed attention
and its combine, and elementwise and row-reduction kernels of at most ``PDL_MAX_ELEMENTS``. TileLang 0.1.15 marks a
function that calls ``T.pdl_sync``/``T.pdl_trigger``, and its runtime launches it with
``cudaLaunchAttributeProgrammaticStreamSerialization`` (CUDA-graph capture keeps it as a programmatic edge,
``tests/test_pdl.py``). Such a kernel's programs are placed while the kernel before it in the stream finishes; each
waits for it (``griddepcontrol.wait``, ``Dialect.wait_inputs``: no global memory is read or written before it) and
then lets the next kernel launch. An HF LLaMA decode step (8 layers, d2048) on the H200, its CUDA graph replayed
alone, took 0.4197 -> 0.4065 ms at cache 512 and 0.4615 -> 0.4379 ms at 4096 (bench/results/2026-12-02-h200-session15).
Prefetching a gemv's weight into L2 before the wait made the same step slower (0.4759 and 0.4993 ms) and was dropped.
A target ``{"pdl": False}`` (``Options.pdl``, ``TILEFUSE_PDL=0``) builds plain launches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tilelang.language as T
from tvm.tirx.script.builder import ir as _tir_builder

from tilefuse.config import CPU_KINDS, cuda_arch

Shape = tuple[int, ...]

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
# A PrimFunc attribute by which a template asks nvcc's fast math for its kernel (``compile.compile_kernel``):
# ``ex2.approx.ftz`` for ``T.exp2`` (one MUFU instruction where the IEEE form adds a subnormal fix-up) and approximate
# division. Set by ``fast_math`` (``attention_ws``).
FAST_MATH_ATTR = "tilefuse_fast_math"


def fast_math(prim_func):
    """``prim_func`` compiled with nvcc's ``--use_fast_math`` on CUDA targets (``FAST_MATH_ATTR``)."""
    return prim_func.with_attr(FAST_MATH_ATTR, True)


def target_kind(target: dict | str) -> str:
    """``{"kind": "cuda", "arch": "sm_90a"}`` or ``"cuda"`` -> ``"cuda"``."""
    kind = target.get("kind") if isinstance(target, dict) else str(target).split()[0]
    if not kind:
        raise ValueError(f"target {target!r} has no kind; use e.g. {{'kind': 'cuda', 'arch': 'sm_90a'}}")
    return kind


@dataclass(frozen=True)
class Dialect:
    """The target-dependent pieces of a template body."""

    cpu: bool
    metal: bool = False
    trap: str = "__trap"  # the device function that aborts the kernel as an assert does (HIP: __builtin_trap)
    pdl: bool = False  # programmatic dependent launch (CUDA sm_90+, see the note above)
    pdl_all: bool = False  # every kernel that waits for its inputs a programmatic dependent (``PDL_ALL``)
    pdl_tma: bool = False  # so are the TMA-fed GEMMs and attention (``PDL_TMA``)

    def kernel(self, *grid, threads: int = 128):
        """The launch frame: a grid of tile programs (with ``threads`` on GPUs)."""
        if self.cpu:
            import tilelang.cpu.language as TC

            return TC.Kernel(*grid)
        return T.Kernel(*grid, threads=threads)

    def wait_inputs(self, launch_bound: bool = True, tma: bool = False):
        """Where a kernel may first read what earlier kernels wrote: with PDL, wait for the kernel before it and let
        the next one launch; nothing elsewhere. Call it before any load of an input or store of an output.
        ``launch_bound``: whether the kernel is small enough for its launch to matter (``PDL_MAX_ELEMENTS``, a decode
        step's); a larger one launches plainly, its source as before PDL (TileLang drops ``__restrict__`` from the
        parameters of a PDL kernel, and a large kernel's loads may need it); with ``pdl_all``, every kernel; with
        ``pdl_tma``, a kernel whose operands come by TMA (``tma``: GEMMs, the ws attention), which needs none."""
        if self.pdl and (launch_bound or self.pdl_all or (tma and self.pdl_tma)):
            from tilelang.cuda.language import pdl_sync, pdl_trigger

            T.evaluate(pdl_sync())
            T.evaluate(pdl_trigger())

    def shared(self, shape, dtype):
        return T.alloc_local(shape, dtype) if self.cpu else T.alloc_shared(shape, dtype)

    def fragment(self, shape, dtype):
        return T.alloc_local(shape, dtype) if self.cpu else T.alloc_fragment(shape, dtype)

    def tile_loop(self, *extents):
        """A loop nest over a tile (threads share it on GPUs; serial on CPU)."""
        return T.grid(*extents) if self.cpu else T.Parallel(*extents)

    def pipelined(self, n, num_stages: int):
        """``T.Pipelined`` on GPUs (TileLang's automatic warp specialization); a serial loop on CPUs or without stages."""
        return T.serial(n) if self.cpu or num_stages <= 0 else T.Pipelined(n, num_stages=num_stages)

    def reducible(self, shape, dtype):
        """A tile a row reduction reads or writes: a fragment, or threadgroup memory on Metal (where the reduction
        is ours, read across threads)."""
        return T.alloc_shared(shape, dtype) if self.metal else self.fragment(shape, dtype)

    def reduce(self, op: str, src, dst, clear: bool = True):
        """``dst[r] = op over c of src[r, c]`` (``op``: sum, max or min), folded into ``dst`` unless ``clear``.

        TileLang's ``T.reduce_*`` everywhere but Metal; there each row is folded serially by one thread, from
        ``reducible`` buffers (threadgroup memory; TileLang inserts the barriers around the loop)."""
        if not self.metal:
            return {"sum": T.reduce_sum, "max": T.reduce_max, "min": T.reduce_min}[op](src, dst, dim=1, clear=clear)
        return _serial_reduce(op, int(src.shape[0]), int(src.shape[1]), clear)(src, dst)


def _serial_reduce(op: str, rows: int, cols: int, clear: bool):
    """Metal's row reduction: one thread per row folds the row in column order (a NaN is dropped by max/min, as
    ``T.reduce_max`` drops it on the other targets; the templates track NaN themselves)."""
    identity = {"sum": 0.0, "max": -math.inf, "min": math.inf}[op]

    def fold(a, b):
        return a + b if op == "sum" else (T.max(a, b) if op == "max" else T.min(a, b))

    @T.macro
    def reduce_rows(src, dst):
        for r in T.Parallel(rows):
            # in a register, dst written once: a loop of reads and writes of dst inside the thread's branch is
            # what TileLang's barrier placement warns of
            acc = T.alloc_var(dst.dtype, init=T.Cast(dst.dtype, identity) if clear else dst[r])
            for c in T.serial(cols):
                acc = fold(acc, src[r, c])
            dst[r] = acc

    return reduce_rows


# The most elements an elementwise or row-reduction kernel touches and still launches as a programmatic dependent: a
# decode step's (batch 64 x an MLP's 5632 features is 360K), not a prefill's or a training step's.
PDL_MAX_ELEMENTS = 1 << 20


# The experimental name (``Options.experimental``) by which every kernel that calls ``Dialect.wait_inputs`` launches as
# a programmatic dependent, not only a decode step's: GEMMs (both schedules), attention, norms and elementwise kernels
# of any size. Each then waits for the kernel before it first thing and lets the next one launch at once, so the next
# kernel's launch and set-up (barriers, register reallocation) run under this one's last wave. Measured slower on an
# H100 (2026-12-06: zoo GPT-2 and BERT 2-3% longer, their GPU busy time 3% longer; ``config.Options.experimental``),
# so it stays opt-in and a prefill's kernels launch plainly.
PDL_ALL = "pdl_all"
# The same for the kernels whose operands come by TMA alone (the GEMMs and the ws attention): norms and elementwise
# kernels keep their ``__restrict__`` parameters. Measured slower on the H100 too (GPT-2 0.6%, BERT 1.7%; the GEMMs'
# and attention's own time longer, the norms' unchanged: ``config.Options.experimental``).
PDL_TMA = "pdl_tma"


def uses_pdl(target: dict | str) -> bool:
    """Whether kernels for ``target`` launch as programmatic dependents: CUDA sm_90 or later, unless the target
    says ``"pdl": False``."""
    if target_kind(target) != "cuda" or (isinstance(target, dict) and not target.get("pdl", True)):
        return False
    digits = "".join(c for c in cuda_arch(target).removeprefix("sm_") if c.isdigit())
    return bool(digits) and int(digits) >= 90


def dialect(target: dict | str) -> Dialect:
    kind = target_kind(target)
    pdl = uses_pdl(target)
    experimental = (target.get("experimental") or ()) if isinstance(target, dict) else ()
    return Dialect(cpu=kind in CPU_KINDS, metal=kind == "metal", trap="__builtin_trap" if kind == "hip" else "__trap",
                   pdl=pdl, pdl_all=pdl and PDL_ALL in experimental, pdl_tma=pdl and PDL_TMA in experimental)


def check_dtype(dtype: str, target: dict | str, what: str) -> None:
    """Refuse dtypes a target cannot store, with a message saying what to do instead."""
    if dtype not in FLOAT_DTYPES + ("float64", "int32", "int64", "int8", "uint8", "bool"):
        raise NotImplementedError(f"{what}: dtype {dtype!r} is not supported by the templates")
    if dtype == "bfloat16" and target_kind(target) in CPU_KINDS:
        raise NotImplementedError(
            f"{what}: the TileLang C target cannot store bfloat16 ('Cannot convert type bfloat16 to C type'); "
            "run this region in float32 or float16 on CPU (cast at the region boundary)")


def param(name: str, shape: Sequence[int], dtype: str):
    """Declare a kernel parameter inside a ``T.prim_func`` body (lets templates take N extra inputs)."""
    return _tir_builder.arg(name, T.Tensor(tuple(int(d) for d in shape), dtype))


def view(buf, shape: Sequence[int]):
    """``buf`` seen with another (same-size) shape, sharing its data.

    Not ``T.reshape``: its size check builds an int32 literal of the size in *bits* and fails for
    tensors of 256 MB and more. Keep views in a container, not bound to a local name inside the
    kernel body: a named binding renames the parameter's data pointer and breaks the host call.
    """
    return T.Tensor(tuple(int(d) for d in shape), buf.dtype, buf.data)


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def fit_pow2(tile: int, n: int) -> int:
    """``tile`` no wider than the power of two that covers ``n`` (a tile over a short dim shrinks to it), at least 1."""
    return max(1, min(tile, 1 << max(0, (n - 1).bit_length())))


def broadcast_shapes(*shapes: Sequence[int]) -> Shape:
    """numpy broadcasting of static shapes (plain Python: torch.broadcast_shapes imports torch._dynamo,
    half a second on the first call, which artifact loading would pay)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, start=rank - len(s)):
            d = int(d)
            if d != 1:
                if out[i] not in (1, d):
                    raise ValueError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[i] = d
    return tuple(out)


def unravel(flat, shape: Sequence[int]) -> list:
    """Coordinates of the row-major flat index ``flat`` in ``shape`` (constant strides, no loops)."""
    coords, rest = [], flat
    for i, d in enumerate(reversed(shape)):
        if i == len(shape) - 1:
            coords.append(rest)
        else:
            coords.append(rest % d)
            rest = rest // d
    return list(reversed(coords))


def broadcast_index(arg_shape: Sequence[int], coords: Sequence[Any]) -> tuple:
    """Index of an operand of ``arg_shape`` at output ``coords`` under numpy broadcasting."""
    lead = len(coords) - len(arg_shape)
    if lead < 0:
        raise ValueError(f"operand of shape {tuple(arg_shape)} has more dims than the output ({len(coords)})")
    return tuple(0 if int(d) == 1 else coords[lead + k] for k, d in enumerate(arg_shape))


def int32_index(index: Sequence[Any]) -> tuple:
    """An index an expression computed (``Load``), each coordinate as int32 (the buffers' index type)."""
    return tuple(x if str(x.dtype) == "int32" else T.Cast("int32", x) for x in index)


def arg_loader(bufs: Sequence[Any], shapes: Sequence[Sequence[int]], coords: Sequence[Any]) -> Callable[[int], Any]:
    """``Env.arg`` for extra inputs ``bufs`` read at output ``coords``."""
    def load(i: int):
        if i >= len(bufs):
            raise IndexError(f"expression reads arg{i} but the region has {len(bufs)} extra inputs")
        return bufs[i][broadcast_index(shapes[i], coords)]
    return load


def normalize_shapes(shapes: Sequence[Sequence[int]] | None) -> tuple[Shape, ...]:
    """Static shapes as int tuples; ``()`` stays a 0-d tensor (indexed ``buf[()]``)."""
    return tuple(tuple(int(d) for d in s) for s in (shapes or ()))


# 2^x for x <= 0 on the FMA units (FlashAttention-4's split of the exponents between MUFU and the FMA pipe; the ws
# attention's ``exp_poly``). At head dim 64 a key tile's 128 x 128 exponents keep the SM's MUFU (16 a clock) busy as
# long as its two products keep the tensor cores (4096 FLOP a clock). The form: round to nearest by the 1.5 * 2^23
# shift, a degree-3 fit of 2^f on [-1/2, 1/2] (relative error 7.5e-5, under the half ulp, 4.9e-4, of the fp16 the
# probabilities are stored in), and the integer part added to the exponent's bits.
# Measured on the H100 (2026-12-05): the attention ran slower with it at every shape of the sweep, so only
# ``bench_attention.py --configs poly`` asks for it.
POLY_EXP2 = (0.9999280571937561, 0.6932609677314758, 0.2426111400127411, 0.0551716685295105)
ROUND_SHIFT = 12582912.0  # 1.5 * 2^23: t = x + ROUND_SHIFT holds round(x) in its low mantissa bits


def poly_exp2(x):
    """2^x for a float32 expression ``x`` <= 0 without MUFU: 0 below -125 (as MUFU's flushed subnormals, and so
    that a row with every key hidden sums to 0), NaN for NaN (the tests are false for it, and the exponent's bits add
    0: a NaN's bits shifted by 23 are 0)."""
    small = x < T.float32(-125.0)
    x = T.if_then_else(small, T.float32(-125.0), x)
    bits = T.reinterpret(x + T.float32(ROUND_SHIFT), "uint32")
    f = x - (T.reinterpret(bits, "float32") - T.float32(ROUND_SHIFT))  # (through the bits: nothing folds it to 0)
    p = T.float32(POLY_EXP2[3])
    for coef in POLY_EXP2[2::-1]:
        p = p * f + T.float32(coef)
    return T.if_then_else(small, T.float32(0.0),
                          T.reinterpret(T.reinterpret(p, "uint32") + T.shift_left(bits, T.uint32(23)), "float32"))

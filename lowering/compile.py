"""Compile a template's PrimFunc for a target, or produce its source where no toolchain is here.

Note: TileLang builds C with no optimization flag (a 512^3 fp32 GEMM: 293 ms at -O0, 4.4 ms at
``-O3 -march=native``), so the ``c`` target always gets ``C_FLAGS`` (and ``C_PASS_CONFIGS``). ``-march=native`` ties the
compiled library to this CPU's ISA: an artifact built with it must be rebuilt on another machine
kind (the cache key does not include the host ISA). CUDA targets need an explicit ``arch``
(``sm_90a`` for the H200's WGMMA/TMA code; plain ``sm_90`` fails static asserts).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any

import tilelang
import tilelang.cache.kernel_cache as tl_kernel_cache
import tilelang.language.eager.ast as tl_eager_ast
import tilelang.language.eager.builder as tl_eager_builder
import torch

from tilefuse.config import setting
from tilefuse.lowering import cpu_parallel, host_lib, nvrtc
from tilefuse.lowering.exact_constants import exact_float_constants
from tilefuse.lowering.templates.common import CPU_KINDS, FAST_MATH_ATTR, target_kind

# TileLang logs every compile at INFO; tilefuse reports compile counts and times itself.
if setting("VERBOSE", "0") == "0":
    logging.getLogger("tilelang").setLevel(logging.WARNING)
    # "Found kernel in memory cache": expected here (identical regions share one kernel).
    logging.getLogger("tilelang.cache.kernel_cache").setLevel(logging.ERROR)

# -ffp-contract=off: gcc otherwise fuses a * b + c into one fma (one rounding where eager, one op at a time, has
# two): a quarter of the elements of a fused x * y + z differed from eager in the last bit. Inductor turns
# contraction off on the CPU too.
C_FLAGS = ("-O3", "-march=native", "-ffp-contract=off")
# TileLang's own vectorizer emits vector casts the C templates lack (float2 -> half2 fails to
# compile whenever a tile width is even); gcc -O3 vectorizes the scalar loops itself.
C_PASS_CONFIGS = {"tirx.disable_vectorize": True}
SOURCE_ONLY_KINDS = frozenset({"hip", "metal", "ascend", "webgpu"})
# The grid of a c kernel runs over torch's OpenMP threads and its libm calls are vectorized (lowering/cpu_parallel.py);
# False keeps TileLang's serial, scalar code.
C_PARALLEL_GRID = True
cpu_parallel.install()

# TileLang turns Python functions into IR by rewriting their source's AST (``tilelang.language.eager.ast.mutate``), and
# its lowering does so while it runs (the GEMM ops define T.prim_func/T.macro functions in ``lower``), in our compile
# threads. CPython 3.11 keeps the AST converters' recursion depth in interpreter-wide state (cpython gh-106905): two
# threads parsing at once failed CI with "AST constructor recursion depth mismatch (before=105, after=101)", a kernel
# then run through torch. The rewrite holds the GIL throughout, so taking turns there costs no parallelism.
_AST_TURN = threading.RLock()


def _one_at_a_time(mutate: Callable) -> Callable:
    if getattr(mutate, "_tilefuse_serial", False):
        return mutate

    @functools.wraps(mutate)
    def serial(*args, **kwargs):
        with _AST_TURN:
            return mutate(*args, **kwargs)
    serial._tilefuse_serial = True
    return serial


for _module in (tl_eager_ast, tl_eager_builder):
    _module.mutate = _one_at_a_time(_module.mutate)


# TileLang links a CUDA kernel's host module twice: its kernel cache exports the executable (a host compile and link
# into the cache's ``executable.so``), then the first call (``link_now``) exports it again into a temporary folder and
# loads that (``tvm.runtime.Executable.jit``). Both exports take ``host_lib.export_kwargs(executable)``, so the cache's
# library is the same one: loaded as the executable's module, it spares each kernel's compile one host compile (about
# 0.44 s a kernel on the H200's machine, in the compile threads). On by default since the H200 ran it (session 40,
# bench/results/2026-12-05-h200-session40: the end-to-end and artifact GPU tests pass with every kernel compiled
# afresh; the MLP's three kernels' links, 0.40-0.84 s each, gone; its cold compile 8.81 -> 8.54 s, the links being off
# its critical path but for the last); TILEFUSE_LINK_FROM_CACHE=0 turns it off.
LINK_FROM_CACHE = setting("LINK_FROM_CACHE", "1") == "1"


def _load_what_the_cache_wrote(write: Callable) -> Callable:
    if getattr(write, "_tilefuse_loads", False):
        return write

    @functools.wraps(write)
    def write_and_load(executable, path: str, export_kwargs: dict | None = None):
        write(executable, path, export_kwargs or host_lib.export_kwargs(executable) or None)
        if LINK_FROM_CACHE and not export_kwargs and getattr(executable, "_jitted_mod", True) is None \
                and torch.cuda.is_available():
            import tvm

            # (the staging folder is renamed into the cache, or removed where another process won: the loaded
            # library stays mapped either way)
            try:
                executable._jitted_mod = tvm.runtime.load_module(path)
            except Exception:  # noqa: BLE001  (the first call links the kernel as TileLang does; the entry is kept)
                logging.getLogger(__name__).warning("loading %s failed; the kernel is linked on its first call", path,
                                                    exc_info=True)
    write_and_load._tilefuse_loads = True
    return write_and_load


tl_kernel_cache.KernelCache._safe_write_executable = staticmethod(
    _load_what_the_cache_wrote(tl_kernel_cache.KernelCache._safe_write_executable))


def tilelang_target(target: dict | str) -> dict | str:
    """The target as TileLang takes it: ``"c"`` for CPU, a dict with ``arch`` for CUDA."""
    kind = target_kind(target)
    if kind in CPU_KINDS:
        return "c"  # the wheel has no LLVM codegen ("target.build.llvm" is missing)
    if kind == "cuda":
        arch = target.get("arch") if isinstance(target, dict) else None
        if not arch:
            raise ValueError("cuda target needs an arch, e.g. {'kind': 'cuda', 'arch': 'sm_90a'}")
        return {"kind": "cuda", "arch": arch}
    return dict(target) if isinstance(target, dict) else {"kind": kind}


def compile_kernel(prim_func, target: dict | str, out_idx: Sequence[int] | int | None = None,
                   pass_configs: dict[str, Any] | None = None, compile_flags: Sequence[str] | None = None):
    """Compile ``prim_func`` for ``target`` into a TileLang ``JITKernel`` callable on torch tensors.

    ``out_idx`` lists the parameters the kernel allocates and returns (negative indices count from
    the end). CPU kernels get ``C_FLAGS`` unless ``compile_flags`` is given, and with ``C_PARALLEL_GRID`` their grid
    runs on torch's OpenMP threads.
    """
    kind = target_kind(target)
    if kind in SOURCE_ONLY_KINDS:
        raise NotImplementedError(
            f"target {kind!r} needs its vendor toolchain to compile; use kernel_source() to get the source")
    flags = list(compile_flags) if compile_flags is not None else (list(C_FLAGS) if kind in CPU_KINDS else None)
    if kind == "cuda" and asks_fast_math(prim_func):
        pass_configs = {"tl.enable_fast_math": True, **(pass_configs or {})}
    if kind in CPU_KINDS:
        pass_configs = {**C_PASS_CONFIGS, **(pass_configs or {})}
        prim_func = exact_float_constants(prim_func)  # the C source prints float32 constants to 7 digits
        if compile_flags is None and C_PARALLEL_GRID:
            flags += cpu_parallel.grid_flags(prim_func) + list(cpu_parallel.vector_math_flags())
    kernel = tilelang.compile(prim_func, out_idx=_out_idx(out_idx), target=tilelang_target(target),
                              pass_configs=pass_configs, compile_flags=flags)
    link_now(kernel)
    return kernel


def asks_fast_math(prim_func) -> bool:
    """Whether the template marked ``prim_func`` for nvcc's fast math (``templates.common.fast_math``)."""
    attrs = getattr(prim_func, "attrs", None)
    return bool(attrs is not None and FAST_MATH_ATTR in attrs and attrs[FAST_MATH_ATTR])


def link_now(kernel) -> None:
    """Link ``kernel``'s host module now, in the compiling thread. TileLang's TVM-FFI adapter (CUDA) links a freshly
    compiled kernel on its first call (``Executable.jit``: a host compiler run of ~0.44 s a kernel on the H200's
    machine), so the measured choice's first calls did it one kernel after another: 5.1 s of ViT's 16.0 s cold
    compile, 15.0 s of ResNet-50's 47.7 s (2026-12-03, ``bench/diag_first_call.py``). Done here, ``compile_many``'s
    threads link in parallel. A kernel loaded from TileLang's disk cache is linked already; other adapters (the c
    target's) load a built library. Where no GPU is (CUDA kernels compiled, not run: the CPU tests) nothing is linked."""
    if not torch.cuda.is_available():
        return
    get = getattr(getattr(kernel, "adapter", None), "get_exportable_executable", None)
    executable = get() if get is not None else None
    jit = getattr(executable, "jit", None)
    if jit is not None:
        jit(**host_lib.export_kwargs(executable))


def compile_many(items: Iterable[tuple[Any, Sequence[int] | int | None]], target: dict | str,
                 num_workers: int | None = None, return_exceptions: bool = False,
                 on_done: Callable[[], None] | None = None, **kwargs) -> list:
    """Compile ``(prim_func, out_idx)`` pairs in parallel threads (lowering releases the GIL and nvcc
    is a subprocess), as ``tilelang.par_compile`` does, but with an ``out_idx`` per kernel.

    ``items`` may be a generator that builds each prim func as it is asked for: each is compiled as soon as it is
    built, while this thread builds the next (``lower``: the templates' Python overlaps nvcc). With
    ``return_exceptions`` a failed compile gives its exception in place of the kernel. ``on_done`` is called (in this
    thread, once every item is submitted) as each compile finishes, failed or not: a progress report's ``tick``."""
    cpus = os.cpu_count() or 1
    workers = num_workers or (min(len(items), cpus) if isinstance(items, Sized) else cpus) or 1
    with concurrent.futures.ThreadPoolExecutor(workers, nvrtc.COMPILE_THREADS) as pool:
        futures = [pool.submit(compile_kernel, f, target, idx, **kwargs) for f, idx in items]
        for _ in concurrent.futures.as_completed(futures):
            if on_done is not None:
                on_done()
    if not return_exceptions:
        return [f.result() for f in futures]
    return [f.exception() or f.result() for f in futures]


def kernel_source(prim_func, target: dict | str, pass_configs: dict[str, Any] | None = None) -> str:
    """Device source of ``prim_func`` for ``target`` without compiling it (hip, metal, or any).

    Metal gets ``tirx.disable_vectorize``: its simdgroup GEMM cannot take the vectorized (float32x4)
    epilogue TileLang would otherwise emit.
    """
    return lower_source(prim_func, target, pass_configs)[0]


def lower_source(prim_func, target: dict | str, pass_configs: dict[str, Any] | None = None) -> tuple[str, int]:
    """``kernel_source`` and the dynamic shared memory (bytes) its kernels are launched with, the largest."""
    import tvm

    configs = {"tirx.disable_vectorize": True} if target_kind(target) == "metal" else {}
    configs.update(pass_configs or {})
    tobj = tilelang.backend.target.determine_target(tilelang_target(target), return_object=True)
    with tvm.transform.PassContext(opt_level=3, config=configs), tobj:
        artifact = tilelang.lower(prim_func, target=tobj)
    shared = [int(fn.attrs["dyn_shared_memory_buf"]) for fn in artifact.device_mod.functions.values()
              if fn.attrs is not None and "dyn_shared_memory_buf" in fn.attrs]
    return artifact.kernel_source, max(shared, default=0)


def failure_reason(e: BaseException) -> str:
    """One line that says why a compile failed. TileLang's nvcc and gcc failures print the whole kernel source first,
    then ``Compilation error:``, the compiler's output and the command: the compiler's first error line is the
    reason (the source's first line, ``#if defined(_MSC_VER)...``, says nothing)."""
    text = str(e).strip()
    _, found, tail = text.partition("Compilation error:")
    lines = [ln.strip() for ln in (tail if found else text).split("\nCommand:")[0].splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() or "fatal" in ln.lower():
            return ln
    return lines[0] if lines else type(e).__name__


if nvrtc.ENABLED:  # (TILEFUSE_NVRTC=1: CUDA kernels compiled by NVRTC with shared precompiled headers)
    nvrtc.install(failure_reason)


def _out_idx(out_idx):
    if out_idx is None or isinstance(out_idx, int):
        return out_idx
    return list(out_idx)

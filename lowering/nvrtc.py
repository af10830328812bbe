"""CUDA C++ -> cubin in this process through NVRTC, with precompiled headers shared by every kernel it compiles, in
place of TileLang's nvcc process per kernel (``TILEFUSE_NVRTC=1``; off by default: see below).

Note: nvcc parses TileLang's, CUTLASS's and CUDA's headers again for every kernel: of a ws GEMM's 1.9-2.0 s of nvcc on
a 2-core CPU machine, its front end (cicc) takes 1.7 s, and nvcc was 53 s of ResNet-50's 85 s of kernel compiles
(28 kernels for sm_90a, 2026-12-06), the larger part of #13's compile bar (27.2 s against Inductor's 10.2 s on the
H200). NVRTC 12.8+ keeps a precompiled header of a source's leading ``#include``s in the process and reuses it for
every later source that starts with the same ones and is compiled with the same options (``-pch``): there a ws GEMM
compiled in 0.76 s once another had made its header (1.57 s without), a small kernel in 0.10-0.11 s (0.67-0.70 s).
It compiles the source as TileLang's own NVRTC adapter does: ``tl_templates/cuda/nvrtc_std.h`` first (NVRTC has no C++
standard library; it also declares ``CUtensorMap`` 64-byte aligned, where cuda.h asks 128: TMA needs 64), every
function a device function, the CUDA headers and CCCL's on the include path. A source NVRTC refuses, or options it
does not take, go to nvcc as before (logged).
Measured on the H100 device machine (16 cores, 2026-12-06, bench/results/2026-12-06-h100-session42): its cubins pass the
GPU tests (67 of the 71 run, none failing, before the runs' time limits) and its ws GEMMs run as fast as nvcc's (within
1-4%); but it does not compile faster there: the zoo MLP cold 8.0-9.3 s against 6.55 s with nvcc, ResNet-50 29.9 s
against 23.6 s (separate calls). Hence off by default. ``bench/nvrtc_cubins.py`` compares the two compilers' cubins.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import logging
import os
import threading
from collections.abc import Callable

from tilefuse.config import setting

_log = logging.getLogger("tilefuse")

ENABLED = setting("NVRTC", "0") == "1"
MIN_VERSION = (12, 8)  # automatic precompiled headers
PRELUDE = "#include <tl_templates/cuda/nvrtc_std.h>\n"
# nvcc's options that NVRTC takes as they are (a prefix match); any other sends the source to nvcc
PASSED = ("-std=", "-I", "--use_fast_math", "--ptxas-options=", "-lineinfo", "-w", "-D")
DROPPED = ("-O3",)  # NVRTC's device code is optimized by default (ptxas -O3)
PCH_HEAP_BYTES = 1 << 30  # room for the few headers' PCHs a model's kernels make (256 MiB by default)

_lib: ctypes.CDLL | None = None
_version = (0, 0)
_searched = False
_lock = threading.Lock()
# by header set and options: set once its first source's compile (which makes the PCH, 84-247 MiB of the heap) is done.
# Another source of the set that comes meanwhile waits for it where every CPU is compiling already (ResNet-50's 28
# sm_90a kernels, 5 header sets, on a 2-core CPU machine: 27.5 s of lowering waiting, 37.4 s not, 38.7 s with nvcc,
# 2026-12-06), and compiles without the PCH where CPUs are idle (the MLP's two GEMMs would otherwise compile one after
# the other on 16 cores). TILEFUSE_NVRTC_WAIT=1 always waits, 0 never does (for the H200's machine to compare).
WAIT = setting("NVRTC_WAIT", "")
COMPILE_THREADS = "tilefuse-compile"  # (``compile.compile_many``'s threads: as many as CPUs when all are busy)
_made: dict[str, threading.Event] = {}


def _candidates() -> list[str]:
    found = []
    try:
        import nvidia  # the pip packages torch's CUDA wheels install (nvidia-cuda-nvrtc)
        for root in nvidia.__path__:
            found += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*")), reverse=True)
    except ImportError:
        pass
    from tilelang.env import CUDA_HOME
    for home in filter(None, (CUDA_HOME, os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        found += sorted(glob.glob(os.path.join(home, "lib*", "libnvrtc.so*")), reverse=True)
    return [p for p in found if "alt" not in os.path.basename(p) and "builtins" not in os.path.basename(p)] + [
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def library() -> ctypes.CDLL | None:
    """libnvrtc 12.8 or later (its builtins library loaded first from beside it), or None where there is none."""
    global _lib, _searched, _version
    with _lock:
        if _searched:
            return _lib
        _searched = True
        for path in _candidates():
            try:
                if os.path.isabs(path):
                    for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
                        if "alt" not in os.path.basename(builtins):
                            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                lib = ctypes.CDLL(path)
                major, minor = ctypes.c_int(), ctypes.c_int()
                if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
                    continue
                if (major.value, minor.value) < MIN_VERSION:
                    _log.info("NVRTC %d.%d at %s has no precompiled headers; looking further", major.value,
                              minor.value, path)
                    continue
                lib.nvrtcSetPCHHeapSize(ctypes.c_size_t(PCH_HEAP_BYTES))
                _lib, _version = lib, (major.value, minor.value)
                return _lib
            except OSError:
                continue
        return None


def include_dirs() -> list[str]:
    """TileLang's templates, CUTLASS, and the CUDA toolkit's headers with CCCL's (``cuda/std``), found where TileLang's
    NVRTC adapter looks for them, under the first CUDA home that holds a toolkit's headers (not a bare /usr/local)."""
    from tilelang.env import CUDA_HOME, CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH
    from tilelang.jit.adapter.nvrtc.include_paths import discover_cuda_include_paths

    for home in dict.fromkeys(filter(None, (CUDA_HOME, os.environ.get("CUDA_HOME"), "/usr/local/cuda"))):
        found = [d for d in discover_cuda_include_paths(home) if os.path.isdir(d)]
        if any(os.path.isfile(os.path.join(d, "vector_types.h")) for d in found):
            return [d for d in (TILELANG_TEMPLATE_PATH, CUTLASS_INCLUDE_DIR) if d] + found
    return [d for d in (TILELANG_TEMPLATE_PATH, CUTLASS_INCLUDE_DIR) if d]


def nvrtc_options(arch, options) -> list[str] | None:
    """nvcc's ``arch`` (``["-gencode", "arch=compute_90a,code=sm_90a"]`` or ``"-arch=sm_90a"``) and ``options`` as
    NVRTC's, or None where an option has no NVRTC form here (or several GPU codes are asked: a fatbin)."""
    words = [arch] if isinstance(arch, str) else list(arch or [])
    codes = [w.split("code=", 1)[1] for w in words if "code=" in w] or \
        [w.split("=", 1)[1] if "=" in w else w for w in words if w.startswith(("-arch", "sm_"))]
    codes = [c for c in ",".join(codes).split(",") if c]
    if len(codes) != 1 or not codes[0].startswith("sm_"):
        return None
    out = [f"--gpu-architecture={codes[0]}"]
    for opt in [options] if isinstance(options, str) else list(options or []):
        if opt in DROPPED:
            continue
        if not opt.startswith(PASSED):
            return None
        out.append(opt)
    return out


def _check(lib, rc: int, what: str) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC {what}: {lib.nvrtcGetErrorString(rc).decode()}")


def compile_cubin(code: str, options: list[str]) -> bytes:
    """The cubin of ``code`` (TileLang's CUDA source) with NVRTC ``options`` (``nvrtc_options``'). A compile error
    raises with NVRTC's log after ``Compilation error:`` (as TileLang's nvcc errors do)."""
    lib = library()
    if lib is None:
        raise RuntimeError("no NVRTC 12.8+ here")
    opts = ["-default-device", "-pch", f"-D__CUDACC_VER_MAJOR__={_version[0]}",
            *(f"-I{d}" for d in include_dirs()), *options]
    source = PRELUDE + code
    if "cudaGridDependencySynchronize" in code or "cudaTriggerProgrammaticLaunchCompletion" in code:
        source = '#include "cuda_device_runtime_api.h"\n' + source  # (programmatic launch: as TileLang's NVRTC does)
    head = "\n".join(ln for ln in source.splitlines() if ln.startswith("#include"))
    key = hashlib.sha256("\0".join([head, *opts]).encode()).hexdigest()
    with _lock:  # the first source of a header set makes its PCH; the others wait for it or compile without (WAIT)
        made = _made.get(key)
        first = made is None
        if first:
            made = _made[key] = threading.Event()
    if not first and not made.is_set() and (WAIT == "1" or (WAIT == "" and _cpus_all_compiling())):
        made.wait()
    try:
        return _compile(lib, source, opts if first or made.is_set() else [o for o in opts if o != "-pch"])
    finally:
        if first:
            made.set()


def _cpus_all_compiling() -> bool:
    return sum(t.name.startswith(COMPILE_THREADS) for t in threading.enumerate()) >= len(os.sched_getaffinity(0))


def _compile(lib, source: str, opts: list[str]) -> bytes:
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"device_kernel.cu", 0, None, None),
           "create")
    try:
        args = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), args)
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError("NVRTC Compilation error:\n" + log.value.decode(errors="replace"))
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin), "cubin")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def install(reason: Callable[[BaseException], str]) -> bool:
    """Route TileLang's cubin compiles (``tilelang.contrib.nvcc.compile_cuda``) through ``compile_cubin`` where
    NVRTC takes them; the rest, and any NVRTC refuses (logged with ``reason(error)``), go to nvcc. True where NVRTC
    was found."""
    import tilelang.contrib.nvcc as tl_nvcc
    if library() is None or getattr(tl_nvcc.compile_cuda, "_tilefuse_nvrtc", False):
        return library() is not None
    nvcc_compile = tl_nvcc.compile_cuda

    def compile_cuda(code, target_format="ptx", arch=None, options=None, path_target=None, verbose=False):
        opts = nvrtc_options(arch, options) if target_format == "cubin" and path_target is None else None
        if opts is not None:
            try:
                return bytearray(compile_cubin(code, opts))
            except RuntimeError as e:
                _log.warning("NVRTC did not compile a kernel (%s); compiling it with nvcc", reason(e))
        return nvcc_compile(code, target_format, arch, options, path_target, verbose)
    compile_cuda._tilefuse_nvrtc = True
    tl_nvcc.compile_cuda = compile_cuda
    return True

"""``c`` kernels that use the machine: the grid spread over the CPU's cores with OpenMP, libm calls vectorized.

Note: TileLang's C codegen runs a kernel's grid as serial loops around the program body, with the program's tiles
declared once at the top of the function (``float C_f[4096];``), and has no option to emit OpenMP. Blocks of our
templates are independent (on a GPU they run concurrently; no template uses atomics), so the grid loops can run in
parallel if each thread has its own tiles. ``grid_flags`` reads the grid's extents from the PrimFunc and asks for
``-fopenmp`` plus a ``-DTILEFUSE_OMP_GRID=<extents>`` marker (compile flags are part of TileLang's cache key, so a
parallel kernel never reuses a serial one's cache entry); ``parallel_grid`` then rewrites the C source just before gcc
compiles it: ``#pragma omp parallel for`` on the outermost grid loops (``collapse`` over the grid dims that are more
than 1; ``schedule(dynamic)``, which also gives fewer blocks to a core that another process is using), with every
declaration above them ``private`` (tiles) or ``firstprivate`` (initialised scalars). The hook is the one place
TileLang writes the source out (``LibraryGenerator.compile_lib``) and acts only on compiles that carry the marker.
Where the source is not of the expected shape (the grid loops' extents differ from the grid's, a statement before
them, tiles too large for a worker thread's stack) it stays serial, correct as before.

Vector math: a loop calling ``tanhf`` or ``expf`` (a GELU epilogue, attention's ``exp2f``) stays scalar, since gcc
vectorizes libm calls only where the header declares their SIMD variants (glibc does so under ``-ffast-math`` alone).
``vector_math_flags`` asks for ``-fopenmp-simd -lmvec -fno-math-errno`` plus a ``-DTILEFUSE_VECTOR_MATH`` marker, and
``declare_vector_math`` declares the float functions the source calls ``#pragma omp declare simd`` (glibc's libmvec
has them: ``_ZGVeN16v_tanhf`` ...); results move by at most libmvec's few ulp (torch's own vectorized math differs
from libm too). ``-fno-math-errno`` lets ``sqrtf`` vectorize (nothing reads errno).

The kernels join torch's OpenMP runtime (torch's wheel ships ``libgomp.so.1``, loaded before any kernel, and the
kernel libraries link that soname): a kernel uses ``torch.get_num_threads()`` threads and the same thread pool.
"""

from __future__ import annotations

import functools
import logging
import math
import re

_log = logging.getLogger("tilefuse")

MARKER = "TILEFUSE_OMP_GRID"
# A worker thread's stack holds its private tiles (libgomp's default stack is the system's pthread default, commonly
# 8 MiB, at least 2 MiB): kernels whose tiles pass this stay serial.
MAX_PRIVATE_BYTES = 1 << 20
_SIZES = {"float": 4, "double": 8, "half_t": 2, "bfloat16_t": 2, "bool": 1, "char": 1, "signed char": 1,
          "int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4, "int64_t": 8,
          "uint64_t": 8, "int": 4}
_FUNC = re.compile(r"^(?:int32_t|void) (\w+)\(.*\) \{$")
_DECL = re.compile(r"^\s+((?:signed |unsigned )?\w+) (\w+)((?:\[\d+\])*)( = [^;]*)?;$")
_FOR = re.compile(r"^(\s*)for \((?:int32_t|int64_t|int) (\w+) = 0; \2 < (\d+); \+\+\2\) \{$")


VECTOR_MARKER = "TILEFUSE_VECTOR_MATH"
# float functions with SIMD variants in glibc's libmvec (x86_64, glibc >= 2.35), and their arity
VECTOR_MATH = {**{f: 1 for f in ("expf", "exp2f", "exp10f", "expm1f", "logf", "log2f", "log10f", "log1pf", "sinf",
                                 "cosf", "tanf", "asinf", "acosf", "atanf", "sinhf", "coshf", "tanhf", "erff",
                                 "erfcf", "cbrtf")},
               "powf": 2, "atan2f": 2, "hypotf": 2}


@functools.cache
def vector_math_flags() -> tuple[str, ...]:
    """The flags for vectorized libm calls, () where this machine has no libmvec (the loops stay scalar)."""
    import ctypes.util
    import platform

    if platform.machine() != "x86_64" or ctypes.util.find_library("mvec") is None:
        return ()
    return ("-fopenmp-simd", "-fno-math-errno", "-lmvec", f"-D{VECTOR_MARKER}")


def declare_vector_math(code: str) -> str:
    """``code`` with the vector-math functions it calls declared ``omp declare simd`` after its first include."""
    used = [f for f in VECTOR_MATH if re.search(rf"\b{f}\(", code)]
    head = "#include <tl_templates/cpp/common.h>\n"
    if not used or head not in code:
        return code
    decls = "".join(f"#pragma omp declare simd notinbranch\nfloat {f}({', '.join(['float'] * VECTOR_MATH[f])});\n"
                    for f in used)
    return code.replace(head, head + 'extern "C" {\n' + decls + "}\n", 1)


def grid_extents(prim_func) -> tuple[int, ...] | None:
    """The extents of ``prim_func``'s kernel grid (blockIdx.x, y, z), None where one is not a constant."""
    from tvm import tirx

    found: dict[str, object] = {}

    def visit(node):
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.THREAD_BINDING and node.thread_binding is not None:
            tag = node.thread_binding.thread_tag
            if tag.startswith("blockIdx."):
                found[tag] = node.extent

    tirx.stmt_functor.post_order_visit(prim_func.body, visit)
    extents = []
    for tag in ("blockIdx.x", "blockIdx.y", "blockIdx.z"):
        e = found.get(tag)
        if e is None:
            continue
        if not isinstance(e, tirx.IntImm):
            return None
        extents.append(int(e.value))
    return tuple(extents)


def grid_flags(prim_func) -> list[str]:
    """Compile flags asking for ``prim_func``'s grid to run in parallel: [] for a grid of one program, or one whose
    extents are not constants (dynamic shapes: serial)."""
    extents = grid_extents(prim_func)
    if not extents or math.prod(extents) < 2:
        return []
    return ["-fopenmp", f"-D{MARKER}=" + "x".join(str(e) for e in extents if e > 1)]


def marked_extents(flags) -> tuple[int, ...] | None:
    """The grid extents a compile's ``-DTILEFUSE_OMP_GRID=`` flag carries, None without one."""
    for flag in flags or ():
        for item in str(flag).split():
            if item.startswith(f"-D{MARKER}="):
                return tuple(int(e) for e in item.split("=", 1)[1].split("x"))
    return None


def parallel_grid(code: str, extents: tuple[int, ...]) -> str:
    """``code`` with an OpenMP pragma on the kernel's grid loops (``extents``: the grid's dims above 1, outermost
    first); ``code`` unchanged, with a debug log line, where its shape is not the expected one."""
    lines = code.split("\n")
    start = next((i for i, ln in enumerate(lines) if (m := _FUNC.match(ln)) and m.group(1) != "call"), None)
    if start is None:
        return _serial(code, "no kernel function")
    private, first, nbytes = [], [], 0
    i = start + 1
    while i < len(lines) and not _FOR.match(lines[i]):
        m = _DECL.match(lines[i])
        if m is None:
            return _serial(code, f"a statement before the grid loops: {lines[i].strip()[:80]!r}")
        ctype, name, dims, init = m.groups()
        if ctype not in _SIZES:
            return _serial(code, f"a declaration of unknown type {ctype!r}")
        nbytes += _SIZES[ctype] * math.prod(int(d) for d in re.findall(r"\d+", dims))
        (first if init else private).append(name)
        i += 1
    for depth, extent in enumerate(extents):
        m = _FOR.match(lines[i + depth]) if i + depth < len(lines) else None
        if m is None or int(m.group(3)) != extent:
            return _serial(code, f"grid loop {depth} is not a loop of {extent}")
    if nbytes > MAX_PRIVATE_BYTES:
        return _serial(code, f"{nbytes} bytes of tiles per thread")
    clauses = [f"collapse({len(extents)})"] if len(extents) > 1 else []
    clauses.append("schedule(dynamic, 1)")
    if private:
        clauses.append(f"private({', '.join(private)})")
    if first:
        clauses.append(f"firstprivate({', '.join(first)})")
    indent = _FOR.match(lines[i]).group(1)
    lines.insert(i, f"{indent}#pragma omp parallel for {' '.join(clauses)}")
    return "\n".join(lines)


def _serial(code: str, why: str) -> str:
    _log.debug("c kernel grid stays serial: %s", why)
    return code


def install() -> None:
    """Rewrite the source of marked ``c`` compiles in TileLang's library generator (once per process)."""
    from tilelang.jit.adapter.libgen import LibraryGenerator

    if getattr(LibraryGenerator.compile_lib, "_tilefuse_omp", False):
        return
    original = LibraryGenerator.compile_lib

    def compile_lib(self, *args, **kwargs):
        flags = getattr(self, "compile_flags", None) or []
        extents = marked_extents(flags)
        if extents is not None and getattr(self, "lib_code", None):
            self.lib_code = parallel_grid(self.lib_code, extents)
        if f"-D{VECTOR_MARKER}" in flags and getattr(self, "lib_code", None):
            self.lib_code = declare_vector_math(self.lib_code)
        return original(self, *args, **kwargs)

    compile_lib._tilefuse_omp = True
    LibraryGenerator.compile_lib = compile_lib

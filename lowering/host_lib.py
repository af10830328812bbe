"""A CUDA kernel's host library, built in a quarter of the time TVM's export takes.

TileLang's kernel cache exports each compiled CUDA kernel as a shared library (``executable.so``): TVM writes the
host wrapper as C (``lib0.c``) and the device module (the cubin and its function table) as a C array of hex bytes
(``devc.c``, about 1 MB of source for a 190 KB warp-specialized GEMM), then ``g++`` compiles both as C++. That took
0.29-0.30 s a kernel on the 2-core CPU machine (0.16 s of it parsing the hex array) and 0.3-0.96 s of "cache write"
per kernel on the device machine's 16 threads (session 42's ResNet-50 timeline), on every kernel's critical path.

Here the same bytes go into the library through the assembler (``.incbin`` of the packed blob: the symbol
``__tvm_ffi__library_bin``, its contents and its length prefix exactly as ``devc.c`` has them), and the host wrapper,
which TVM writes as C, is compiled as C: 0.04-0.05 s a kernel on the 2-core machine. Where the C compiler refuses
the wrapper, ``g++`` builds it as before (logged). Only a C host module that imports CUDA modules, on Linux, is built
this way (``export_kwargs``); anything else keeps TVM's export. ``TILEFUSE_FAST_HOST_LIB=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys

from tilefuse.config import setting

FAST_HOST_LIB = setting("FAST_HOST_LIB", "1") == "1"
BLOB_SYMBOL = "__tvm_ffi__library_bin"
_LOG = logging.getLogger(__name__)


def export_kwargs(executable) -> dict:
    """The arguments for ``executable.export_library`` (and ``jit``) that build its library this way: for a host
    module that imports CUDA modules, on Linux. Empty otherwise, or where it is off (TVM's defaults then)."""
    if not FAST_HOST_LIB or not sys.platform.startswith("linux"):
        return {}
    try:
        mod = executable.mod
        if mod.kind != "c" or not mod.imports or any(m.kind != "cuda" for m in mod.imports):
            return {}
    except Exception:  # noqa: BLE001  (not a TVM executable as this knows them: TVM's defaults)
        return {}
    return {"fpack_imports": pack_imports, "fcompile": create_shared}


def packed_bytes(mod) -> bytes:
    """``mod``'s imported modules serialized as TVM packs them (its length prefix included): the bytes of
    ``devc.c``'s array."""
    import tvm_ffi

    blob = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(mod)
    return bytes(memoryview(blob.numpy()))


def assembler_source(blob_path: str, symbol: str = BLOB_SYMBOL) -> str:
    """An ELF assembler file that defines ``symbol`` as the contents of ``blob_path`` (read-only data, exported)."""
    quoted = blob_path.replace("\\", "\\\\").replace('"', '\\"')
    return (f"\t.section .rodata\n\t.globl {symbol}\n\t.type {symbol}, %object\n\t.balign 64\n{symbol}:\n"
            f"\t.incbin \"{quoted}\"\n\t.size {symbol}, .-{symbol}\n"
            "\t.section .note.GNU-stack,\"\",%progbits\n")


def pack_imports(mod, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
    """``export_library``'s ``fpack_imports``: the packed imports as ``devc.bin`` and an assembler file that
    includes it. (TVM makes a system library, or prefixes the symbols, only for an LLVM host module, which
    ``export_kwargs`` never takes.)"""
    if is_system_lib or symbol_prefix:
        raise ValueError("host_lib packs the imports of a plain shared library, not of a system library")
    blob_path = os.path.join(workspace_dir, "devc.bin")
    with open(blob_path, "wb") as f:
        f.write(packed_bytes(mod))
    path = os.path.join(workspace_dir, "devc.S")
    with open(path, "w") as f:
        f.write(assembler_source(os.path.abspath(blob_path)))
    return path


def c_compiler() -> str | None:
    """The C compiler that builds the host wrapper: ``$CC``, else ``gcc`` or ``cc`` on the PATH. (TVM's, the
    fallback: ``$CXX``, else ``$CC``, else ``g++`` on the PATH.)"""
    cc = os.environ.get("CC")
    if cc:
        return cc
    return shutil.which("gcc") or shutil.which("cc")


def create_shared(output: str, objects, options=None, **kwargs) -> None:
    """``export_library``'s ``fcompile``: the objects linked into ``output`` by the C compiler, else by TVM's
    default (``g++``) where the C compiler is missing or refuses them."""
    from tvm.contrib import cc as tvm_cc

    compiler = c_compiler()
    if compiler is not None:
        try:
            tvm_cc.create_shared(output, objects, options, cc=compiler, **kwargs)
            return
        except Exception as exc:  # noqa: BLE001  (the wrapper is built the usual way; a real error fails there)
            _LOG.warning("%s did not build the host library %s (%s); building it with TVM's default compiler",
                         compiler, os.path.basename(output), str(exc).strip().splitlines()[-1:] or exc)
    tvm_cc.create_shared(output, objects, options, **kwargs)

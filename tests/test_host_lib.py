"""A CUDA kernel's host library built by ``lowering.host_lib`` (the packed cubin through the assembler, the wrapper
as C) holds what TVM's own export writes, loads as a module with its CUDA import, and falls back to TVM's compiler
where the C compiler refuses. Compiled for sm_90a without a GPU."""

import logging
import shutil
import subprocess

import pytest

from tilefuse.lowering import host_lib
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.expr import Acc, Arg, call
from tilefuse.lowering.templates import elementwise

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None,
                                reason="nvcc or nm is not on PATH")
SM90 = {"kind": "cuda", "arch": "sm_90a"}


@pytest.fixture(scope="module")
def executable(tmp_path_factory):
    """A kernel compiled now: one loaded from TileLang's disk cache is a built library, with nothing to export. (An
    empty cache folder, and a width no other test compiles, so the process's memory cache has none either.)"""
    func = elementwise.elementwise([(8, 1, 997), (997,)], ["float16", "float32"], [call("gelu", Acc() + Arg(1))],
                                   ["float16"], target=SM90)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TILELANG_CACHE_DIR", str(tmp_path_factory.mktemp("tl-cache")))
        executable = compile_kernel(func, SM90, [-1]).adapter.get_exportable_executable()
    assert executable.mod.kind == "c" and [m.kind for m in executable.mod.imports] == ["cuda"]
    return executable


def defined_symbols(path) -> dict:
    """``{name: (kind, size)}`` of the library's exported definitions."""
    out = subprocess.run(["nm", "-DS", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {f[3]: (f[2], int(f[1], 16)) for f in (ln.split() for ln in out.stdout.splitlines()) if len(f) == 4}


def test_the_library_holds_the_packed_cubin_and_the_symbols_tvms_export_writes(executable, tmp_path):
    import tvm

    kwargs = host_lib.export_kwargs(executable)
    assert kwargs["fpack_imports"] is host_lib.pack_imports and kwargs["fcompile"] is host_lib.create_shared
    executable.export_library(str(tmp_path / "tvm.so"))
    executable.export_library(str(tmp_path / "fast.so"), **kwargs)
    blob = host_lib.packed_bytes(executable.mod)
    assert int.from_bytes(blob[:8], "little") == len(blob) - 8  # the length prefix devc.c's array starts with
    for name in ("tvm.so", "fast.so"):
        assert blob in (tmp_path / name).read_bytes()
    ours, theirs = defined_symbols(tmp_path / "fast.so"), defined_symbols(tmp_path / "tvm.so")
    assert set(ours) == set(theirs)
    assert ours[host_lib.BLOB_SYMBOL] == theirs[host_lib.BLOB_SYMBOL] == ("R", len(blob))
    module = tvm.runtime.load_module(str(tmp_path / "fast.so"))
    assert [m.kind for m in module.imports] == ["cuda"]


def test_a_wrapper_the_c_compiler_refuses_is_built_by_tvms_compiler(executable, tmp_path, monkeypatch, caplog):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH")
    monkeypatch.setenv("CC", "false")  # a C compiler that fails every build
    monkeypatch.setenv("CXX", shutil.which("g++"))  # TVM's compiler: $CXX, else $CC, else g++ on the PATH
    with caplog.at_level(logging.WARNING, logger=host_lib.__name__):
        executable.export_library(str(tmp_path / "fallback.so"), **host_lib.export_kwargs(executable))
    assert "building it with TVM's default compiler" in caplog.text
    assert host_lib.packed_bytes(executable.mod) in (tmp_path / "fallback.so").read_bytes()
    assert host_lib.BLOB_SYMBOL in defined_symbols(tmp_path / "fallback.so")


def test_it_applies_only_to_a_c_host_module_with_cuda_imports_and_can_be_turned_off(executable, monkeypatch):
    class Module:
        def __init__(self, kind, imports=()):
            self.kind, self.imports = kind, list(imports)

    class Executable:
        def __init__(self, mod):
            self.mod = mod

    assert host_lib.export_kwargs(Executable(Module("c", [Module("cuda")])))
    assert host_lib.export_kwargs(Executable(Module("c"))) == {}  # a CPU kernel: nothing packed
    assert host_lib.export_kwargs(Executable(Module("c", [Module("cuda"), Module("metal")]))) == {}
    assert host_lib.export_kwargs(Executable(Module("llvm", [Module("cuda")]))) == {}
    assert host_lib.export_kwargs(object()) == {}
    monkeypatch.setattr(host_lib, "FAST_HOST_LIB", False)
    assert host_lib.export_kwargs(executable) == {}


def test_it_packs_a_plain_librarys_imports_and_refuses_a_system_librarys(executable, tmp_path):
    for system_lib, prefix in ((True, ""), (False, "pre_"), (True, "pre_")):
        with pytest.raises(ValueError, match="system library"):
            host_lib.pack_imports(executable.mod, system_lib, prefix, str(tmp_path))
    path = host_lib.pack_imports(executable.mod, False, "", str(tmp_path))
    assert path.endswith("devc.S") and (tmp_path / "devc.bin").read_bytes() == host_lib.packed_bytes(executable.mod)

"""TileLang rewrites Python functions' AST into IR, and its lowering does so inside our compile threads; CPython 3.11
keeps the AST converters' recursion depth in interpreter-wide state, so two threads parsing at once failed a CI run
("AST constructor recursion depth mismatch"). ``lowering.compile`` makes those rewrites take turns."""

import collections
import threading
import time

import pytest
import tilelang.language.eager.ast as tl_ast
import tilelang.language.eager.builder as tl_builder

from tilefuse.lowering import compile as compile_mod


def test_tilelangs_ast_rewrite_is_serialized_wherever_it_is_called_from():
    assert tl_builder.mutate._tilefuse_serial and tl_ast.mutate._tilefuse_serial
    assert compile_mod._one_at_a_time(tl_builder.mutate) is tl_builder.mutate  # (installed once)


def test_serialized_calls_never_overlap_and_pass_results_and_errors_through():
    inside, most, lock = [0], [0], threading.Lock()

    def probe(x):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)
        with lock:
            inside[0] -= 1
        if x < 0:
            raise ValueError(x)
        return x * 2

    serial = compile_mod._one_at_a_time(probe)
    results, errors = [], []

    def work(k):
        for x in (k, -1):
            try:
                results.append(serial(x))
            except ValueError as e:
                errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and sorted(results) == [2 * k for k in range(8)] and len(errors) == 8


class _Executable:
    def __init__(self):
        self.linked = 0

    def jit(self):
        self.linked += 1


class _Adapter:
    def __init__(self):
        self.executable = _Executable()

    def get_exportable_executable(self):
        return self.executable


class _Kernel:
    def __init__(self, adapter):
        self.adapter = adapter


def test_a_tvm_ffi_kernel_is_linked_in_the_compiling_thread_where_a_gpu_can_run_it(monkeypatch):
    """TileLang's TVM-FFI adapter links a fresh CUDA kernel on its first call (0.44 s of gcc a kernel, serially in
    the measured choice: 15 s of ResNet-50's cold compile on the H200): ``link_now`` does it where compiled."""
    ffi = _Adapter()
    monkeypatch.setattr(compile_mod.torch.cuda, "is_available", lambda: True)
    compile_mod.link_now(_Kernel(ffi))
    assert ffi.executable.linked == 1
    compile_mod.link_now(_Kernel(object()))  # the c target's Cython adapter: a built library, nothing to link
    compile_mod.link_now(object())  # (no adapter at all)
    monkeypatch.setattr(compile_mod.torch.cuda, "is_available", lambda: False)
    compile_mod.link_now(_Kernel(ffi))  # no GPU here: compiled to be read, never run
    assert ffi.executable.linked == 1


class _Exported:
    _jitted_mod = None


def test_the_cache_writes_library_becomes_the_kernels_module_where_jit_would_link_the_same(monkeypatch):
    """TileLang's kernel cache exports a CUDA kernel's executable, then its first call (``link_now``) exports and links
    it again; where the export took ``jit``'s arguments (none), the written library is loaded as the module."""
    import tilelang.cache.kernel_cache as tl_cache
    import tvm

    assert tl_cache.KernelCache._safe_write_executable._tilefuse_loads  # (installed on import, once)
    monkeypatch.setattr(compile_mod, "LINK_FROM_CACHE", True)  # (the default; TILEFUSE_LINK_FROM_CACHE=0 turns it off)
    written, loaded = [], []
    load = compile_mod._load_what_the_cache_wrote(lambda ex, path, kw=None: written.append(path))
    monkeypatch.setattr(tvm.runtime, "load_module", lambda path: loaded.append(path) or f"module {path}")
    monkeypatch.setattr(compile_mod.torch.cuda, "is_available", lambda: True)
    ex = _Exported()
    load(ex, "/cache/executable.so", {})
    assert written == loaded == ["/cache/executable.so"] and ex._jitted_mod == "module /cache/executable.so"
    linked = _Exported()
    linked._jitted_mod = "already"
    load(linked, "/b.so", None)  # a module linked already is kept
    other = _Exported()
    load(other, "/c.so", {"fcompile": print})  # another linker than jit's: jit links its own
    monkeypatch.setattr(compile_mod, "LINK_FROM_CACHE", False)
    off = _Exported()
    load(off, "/d.so")
    assert loaded == ["/cache/executable.so"] and linked._jitted_mod == "already"
    assert other._jitted_mod is None and off._jitted_mod is None and written[1:] == ["/b.so", "/c.so", "/d.so"]
    monkeypatch.setattr(compile_mod, "LINK_FROM_CACHE", True)
    monkeypatch.setattr(compile_mod.torch.cuda, "is_available", lambda: False)
    none = _Exported()
    load(none, "/e.so")  # no GPU here (the CPU tests' CUDA compiles): nothing is loaded
    assert none._jitted_mod is None and loaded == ["/cache/executable.so"]
    monkeypatch.setattr(compile_mod.torch.cuda, "is_available", lambda: True)

    def broken(path):
        raise OSError(f"cannot load {path}")
    monkeypatch.setattr(tvm.runtime, "load_module", broken)
    failed = _Exported()
    load(failed, "/f.so")  # a library that will not load: the kernel is linked on its first call, as without this
    assert failed._jitted_mod is None and written[-1] == "/f.so"


def test_the_cache_writes_library_is_loaded_unless_turned_off():
    assert compile_mod.LINK_FROM_CACHE is (compile_mod.setting("LINK_FROM_CACHE", "1") == "1")


def test_a_batch_compiles_its_tensor_core_kernels_first_and_keeps_each_result_with_its_region(monkeypatch):
    """``lower`` hands ``compile_many`` the convolutions first, then the GEMM and attention kernels (the longest
    compiles start first), the rest in plan order after them; each region still gets its own kernel back."""
    from tilefuse.lowering import lower as lower_mod
    from tilefuse.lowering.builders import KernelSpec

    plan_order = ["row_reduction", "gemm", "elementwise", "flash_attention", "conv2d", "pool2d", "gemm"]
    specs = {f"r{k}": KernelSpec(t, (("k", k),), (0,), (), ()) for k, t in enumerate(plan_order)}
    handed: list[str] = []

    def compile_many(items, target, **kw):
        out = []
        for func, _ in items:
            handed.append(func)
            out.append(f"kernel of {func}")
        return out
    monkeypatch.setattr(lower_mod, "compile_many", compile_many)
    monkeypatch.setattr(lower_mod, "default_config", lambda spec, target: {})
    monkeypatch.setattr(lower_mod, "make_prim_func", lambda spec, target, config: f"r{dict(spec.params)['k']}")
    got = lower_mod.lower(specs, {}, {"kind": "cuda", "arch": "sm_90a"}, use_process_cache=False)
    assert handed == ["r4", "r1", "r3", "r6", "r0", "r2", "r5"]
    assert {r: g.kernel for r, g in got.items()} == {r: f"kernel of {r}" for r in specs}


def test_an_artifacts_saved_kernel_is_not_kept_for_later_compiles(monkeypatch):
    """A kernel compiled from an artifact's saved function (``prebuilt``: maybe another tilefuse's templates) is not
    kept in the process's cache under the key of what this process builds: a later compile of the same spec builds
    its own. A kernel this process built is kept."""
    from tilefuse.lowering import lower as lower_mod
    from tilefuse.lowering.builders import KernelSpec

    monkeypatch.setattr(lower_mod, "_COMPILED", collections.OrderedDict())
    monkeypatch.setattr(lower_mod, "compile_many", lambda items, target, **kw: [f"kernel of {f}" for f, _ in items])
    monkeypatch.setattr(lower_mod, "default_config", lambda spec, target: {})
    monkeypatch.setattr(lower_mod, "make_prim_func", lambda spec, target, config: "ours")
    specs = {"r": KernelSpec("row_reduction", (("k", 0),), (0,), (), ())}
    target = {"kind": "cuda", "arch": "sm_90a"}
    loaded = lower_mod.lower(specs, {}, target, prebuilt=lambda spec, config: "saved", use_process_cache=False)
    assert loaded["r"].kernel == "kernel of saved"
    assert lower_mod.lower(specs, {}, target)["r"].kernel == "kernel of ours"
    monkeypatch.setattr(lower_mod, "compile_many", lambda items, target, **kw: pytest.fail("compiled again"))
    assert lower_mod.lower(specs, {}, target)["r"].kernel == "kernel of ours"

"""Every template kind, and every kernel of the zoo's MLP and GPT-2 (tiny), emits Metal source that passes the
syntax check of ``lowering/vendor_metal.py`` (clang against the project's stand-in headers).

Nothing here runs Metal code (no Apple GPU on CI): the check catches undeclared names, type errors and arithmetic on
opaque simdgroup matrices, not wrong results. It needs clang (``apt-get install -y clang-19``); the tests that
parse are skipped, with that instruction, where none is installed.
"""

import pathlib
import re

import pytest
import torch
from template_cases import cases

from tilefuse import models
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.compile import kernel_source
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.lower import make_prim_func
from tilefuse.lowering.vendor_metal import INSTALL_HINT, MetalSyntaxError, check_or_raise, check_source, find_clang
from tilefuse.pipeline import plan

METAL = {"kind": "metal"}
needs_clang = pytest.mark.skipif(find_clang() is None, reason=f"no clang here: {INSTALL_HINT}")
CASES = cases(METAL)


@needs_clang
@pytest.mark.parametrize("name", sorted(CASES))
def test_template_case_passes_metal_syntax_check(name):
    src = kernel_source(CASES[name](), METAL)
    assert "[[kernel" in src and "#include <metal_stdlib>" in src
    check_or_raise(src, name)
    if name.startswith(("reduction_", "layer_norm", "rms_norm", "softmax", "var", "attention")):
        assert "threadgroup_barrier" in src  # our reduction: rows folded from threadgroup memory, then synced
    # An MMA accumulator leaves only through threadgroup memory (never stored to a device buffer directly).
    staged = set(re.findall(r"threadgroup \w+\* (\w+) =", src))
    for dest in re.findall(r"simdgroup_store\([^,]+, \(&\((\w+)\[", src):
        assert dest in staged, f"{name}: a simdgroup matrix is stored to {dest}, not threadgroup memory"


def test_every_template_kind_has_metal_cases():
    kinds = {"elementwise", "gemm", "reduction", "layer_norm", "conv", "pool", "attention"}
    assert all(any(k in name for name in CASES) for k in kinds)
    assert {f"reduction_{k}" for k in ("softmax", "layer_norm", "rms_norm", "sum", "amax", "var", "any")} <= set(CASES)


BAD = """#include <metal_stdlib>
using namespace metal;
[[kernel]] void bad(device half* out [[buffer(0)]], uint3 threadIdx [[thread_position_in_threadgroup]]) {
  simdgroup_float8x8 acc[1];
  acc[0] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  out[threadIdx.x] = (half)(acc[0] + 1.0f);
  simdgroup_store(acc[0], out, 8, 0, false);
  out[1] = select(1.0h, 2.0f, true);
  out[2] = (half)erf(1.0f);
}
"""


@needs_clang
def test_check_finds_what_apples_compiler_would_refuse():
    """Arithmetic on a simdgroup matrix, a float matrix stored to half memory, select over two types, and erf
    (not in MSL) are each an error: the stand-in headers are strict where MSL is."""
    result = check_source(BAD, "bad")
    assert not result.ok
    text = "\n".join(result.errors)
    assert len(result.errors) >= 4, text
    assert "invalid operands" in text and "simdgroup_store" in text and "select" in text and "erf" in text
    with pytest.raises(MetalSyntaxError, match="bad.*fails the syntax check"):
        check_or_raise(BAD, "bad")
    good = BAD.split("  out[threadIdx.x]")[0] + "  out[threadIdx.x] = 1.0h + (half)exp(2.0f);\n}\n"
    assert check_source(good, "good").ok


def test_missing_clang_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("TILEFUSE_METAL_CLANG", "/nonexistent/clang-19")
    assert find_clang() is None
    with pytest.raises(FileNotFoundError, match="apt-get install -y clang-19"):
        check_source(BAD)


def _zoo_graph(name, dtype, tmp_path):
    from tilefuse.frontends.onnx import import_onnx

    model, inputs = models.build(name, "tiny", dtype=dtype)
    path = pathlib.Path(tmp_path) / f"{name}.onnx"
    torch.onnx.export(model, inputs, str(path), input_names=models.input_names(name),
                      output_names=models.output_names(name), opset_version=18, dynamo=True)
    return import_onnx(str(path))


@needs_clang
@pytest.mark.parametrize("name", ["mlp", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zoo_kernels_pass_metal_syntax_check(name, dtype, tmp_path):
    pytest.importorskip("onnxscript")
    p = plan(_zoo_graph(name, dtype, tmp_path))
    checked, failures = [], []
    for r in p.regions:
        if not r.launches:
            continue
        spec = build(r, p.graph, METAL, source=True)
        if not isinstance(spec, KernelSpec):
            # fp32 attention is refused on every GPU target (its MMA would be TF32); the fp16 model covers it
            assert dtype == torch.float32 and r.kind == "attention", f"{r.name}: {spec}"
            continue
        result = check_source(kernel_source(make_prim_func(spec, METAL), METAL), r.name)
        checked.append(spec.template)
        if not result.ok:
            failures.append(f"{r.name} ({spec.template}): " + "; ".join(result.errors[:3]))
    assert not failures, "\n".join(failures)
    expected = {"gemm", "row_reduction"} | ({"flash_attention", "elementwise"} if name == "gpt2" else set())
    if dtype == torch.float32:
        expected.discard("flash_attention")
    assert expected <= set(checked), checked

"""c kernels run their grid over torch's OpenMP threads (lowering/cpu_parallel.py): the pragma lands on the grid
loops with each thread's own tiles, or the source stays serial where it is not of the expected shape; results are
those of the serial kernel, bit for bit, whatever the thread count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tilefuse.lowering import compile as tf_compile
from tilefuse.lowering import cpu_parallel
from tilefuse.lowering.templates import elementwise, gemm, reduction

C = {"kind": "c"}

SOURCE = """#include <tl_templates/cpp/common.h>
int32_t k_kernel(float* A, float* C);
int32_t k_kernel(float* A, float* C) {
  float C_f[4096];
  float A_s[2048];
  int32_t n = 3;
  for (int32_t bx = 0; bx < 8; ++bx) {
    for (int32_t by = 0; by < 4; ++by) {
      for (int32_t i = 0; i < 64; ++i) {
        C_f[i] = A[i];
      }
    }
  }
  return 0;
}
int32_t call(float* A, float* C) {
  return k_kernel(A, C);
}"""


def test_pragma_on_the_grid_loops_with_private_tiles():
    out = cpu_parallel.parallel_grid(SOURCE, (8, 4))
    lines = out.split("\n")
    k = lines.index("  for (int32_t bx = 0; bx < 8; ++bx) {")
    assert lines[k - 1] == ("  #pragma omp parallel for collapse(2) schedule(dynamic, 1) private(C_f, A_s) "
                            "firstprivate(n)")
    assert out.count("#pragma") == 1 and out.replace(lines[k - 1] + "\n", "") == SOURCE
    one = cpu_parallel.parallel_grid(SOURCE, (8,))  # a grid of one dim above 1: no collapse
    assert "#pragma omp parallel for schedule(dynamic, 1) private(C_f, A_s) firstprivate(n)\n  for (int32_t bx" in one


@pytest.mark.parametrize("extents, source", [
    ((8, 5), SOURCE),  # the loops are not the grid's
    ((8, 4, 2), SOURCE),  # fewer loops than grid dims
    ((8, 4), SOURCE.replace("  int32_t n = 3;\n", "  int32_t n = 3;\n  A[0] = 1.0f;\n")),  # a statement before
    ((8, 4), SOURCE.replace("float C_f[4096];", "float C_f[1048576];")),  # 4 MiB of tiles per thread
    ((8, 4), SOURCE.replace("float C_f[4096];", "mystery_t C_f[4096];")),  # a type of unknown size
])
def test_source_of_another_shape_stays_serial(extents, source):
    assert cpu_parallel.parallel_grid(source, extents) == source


def test_grid_flags_from_the_prim_func():
    f = gemm.gemm(256, 128, 64, A_dtype="float32", block_M=64, block_N=32, block_K=32, target=C)
    assert cpu_parallel.grid_extents(f) == (4, 4, 1)
    assert cpu_parallel.grid_flags(f) == ["-fopenmp", "-DTILEFUSE_OMP_GRID=4x4"]
    assert cpu_parallel.marked_extents(["-O3", "-DTILEFUSE_OMP_GRID=4x4"]) == (4, 4)
    single = gemm.gemm(32, 32, 32, A_dtype="float32", block_M=32, block_N=32, block_K=32, target=C)
    assert cpu_parallel.grid_flags(single) == []  # one program: nothing to spread


def _parallel(kernel) -> bool:
    """Whether ``kernel``'s library starts OpenMP teams (also for a kernel TileLang's cache loaded: no source)."""
    return b"GOMP_parallel" in Path(kernel.adapter.libpath).read_bytes()


def _kernels(f, out_idx):
    """``f`` compiled with its grid parallel and serial (both with vector math)."""
    par = tf_compile.compile_kernel(f, C, out_idx=out_idx)
    ser = tf_compile.compile_kernel(f, C, out_idx=out_idx,
                                    compile_flags=[*tf_compile.C_FLAGS, *cpu_parallel.vector_math_flags()])
    return par, ser


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_kernels_match_serial_ones_bit_for_bit(threads, rng):
    """A GEMM with a fused epilogue (a clamped edge tile), a softmax and an elementwise chain, each over several
    programs: every output element equal to the serial kernel's and close to torch's, at 1, 2 and 3 threads."""
    from tilefuse.lowering.expr import Acc, Arg, call

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        M, N, K = 200, 144, 96
        f = gemm.gemm(M, N, K, trans_B=True, A_dtype="float32", block_M=64, block_N=64, block_K=32,
                      epilogue=call("relu", Acc() + Arg(0)), extra_shapes=[(N,)],
                      extra_dtypes=["float32"], target=C)
        par, ser = _kernels(f, [-1])
        assert _parallel(par) and not _parallel(ser)
        a, w, bias = (torch.randn(s, generator=rng) for s in ((M, K), (N, K), (N,)))
        a[0, 0], a[5, 3] = float("nan"), float("inf")
        got = par(a, w, bias)
        serial = ser(a, w, bias)
        assert torch.equal(got.nan_to_num(), serial.nan_to_num()) and torch.equal(got.isnan(), serial.isnan())
        want = torch.relu(a @ w.T + bias)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4, equal_nan=True)  # rows 0 and 5: NaN, inf

        x = torch.randn(300, 77, generator=rng)
        f = reduction.row_reduction((300, 77), "softmax", block_rows=8, target=C)
        par, ser = _kernels(f, [-1])
        assert _parallel(par)
        assert torch.equal(par(x), ser(x))
        torch.testing.assert_close(par(x), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)

        y = torch.randn(5000, generator=rng)
        f = elementwise.elementwise([(5000,)], ["float32"], [call("exp", Acc()) * Acc()], ["float32"], block=1024,
                                    target=C)
        par, ser = _kernels(f, [-1])
        assert _parallel(par)
        assert torch.equal(par(y), ser(y))
        torch.testing.assert_close(par(y), torch.exp(y) * y, rtol=1e-6, atol=1e-6)
    finally:
        torch.set_num_threads(before)


def test_vector_math_declared_for_the_functions_called():
    code = "#include <tl_templates/cpp/common.h>\nint k() { return tanhf(x) + powf(a, b) + sqrtf(c) + exp2f(d); }"
    out = cpu_parallel.declare_vector_math(code)
    decls = out.split('extern "C" {\n')[1].split("}\n")[0]
    assert decls == ("#pragma omp declare simd notinbranch\nfloat exp2f(float);\n"
                     "#pragma omp declare simd notinbranch\nfloat tanhf(float);\n"
                     "#pragma omp declare simd notinbranch\nfloat powf(float, float);\n")
    assert out.endswith(code.split("\n", 1)[1])
    assert cpu_parallel.declare_vector_math("#include <tl_templates/cpp/common.h>\nint k();") == \
        "#include <tl_templates/cpp/common.h>\nint k();"  # no libm call: unchanged


def test_vectorized_math_matches_torch_with_edge_values(rng):
    """tanh, exp, erf and sqrt through libmvec's SIMD variants (where this machine has them): every element within
    fp32 tolerance of torch, NaN, +-inf, +-0 and denormals included."""
    from tilefuse.lowering.expr import Acc, call

    n = 4099  # not a multiple of any vector width: the scalar tail runs too
    x = torch.randn(n, generator=rng) * 4
    x[:8] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, -1e-40, 88.0])
    exprs = [call("tanh", Acc()), call("exp", Acc()), call("erf", Acc()), call("sqrt", call("abs", Acc()))]
    f = elementwise.elementwise([(n,)], ["float32"], exprs, ["float32"] * 4, block=1024, target=C)
    kernel = tf_compile.compile_kernel(f, C, out_idx=[-4, -3, -2, -1])
    if cpu_parallel.vector_math_flags():
        assert b"_ZGV" in Path(kernel.adapter.libpath).read_bytes()  # the SIMD variants are called
    got = kernel(x)
    want = [torch.tanh(x), torch.exp(x), torch.erf(x), torch.sqrt(x.abs())]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-6, atol=1e-30, equal_nan=True)
        assert torch.equal(torch.signbit(g[3:5]), torch.signbit(w[3:5]))  # tanh(-0.0) = -0.0


def test_cpu_gemm_tile_fits_the_matrix():
    from tilefuse.lowering.templates.gemm_configs import cpu_config, default_config, get_configs

    base = get_configs(C)[0]
    picks = {(M, N): (c["block_M"], c["block_N"]) for M, N in [(1, 1000), (200, 384), (200, 1000), (512, 512), (7, 100)]
             for c in [cpu_config(base, M, N)]}
    assert picks == {(1, 1000): (8, 256), (200, 384): (104, 128), (200, 1000): (104, 256), (512, 512): (128, 256),
                     (7, 100): (8, 64)}
    assert default_config(get_configs(C), 200, 384, 1, C) == cpu_config(base, 200, 384)

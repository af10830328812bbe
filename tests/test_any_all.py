"""``aten.any``/``aten.all`` (default, dim, dims, keepdim) as registry reductions: the converter, the reference and
the row-reduction template on ``c``, against torch on bool and float inputs with NaN (true), -0.0 (false), rows all
zero or all nonzero, and empty reductions (any: False, all: True). Hugging Face models call them on CUDA: T5's
fp16 clamp (``isinf(h).any()``) and the SDPA math path's ``_safe_softmax`` (``all(x == -inf, dim, keepdim)``)."""

from __future__ import annotations

import shutil

import pytest
import torch

from tilefuse import ops
from tilefuse.backend import make_backend
from tilefuse.config import Options
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.templates import elementwise, reduction

C = {"kind": "c"}
NAN = float("nan")
KINDS = ("any", "all")


def edgy(rng, shape) -> torch.Tensor:
    """Float values where truth is hard: zeros, -0.0, NaN, inf, and rows all zero / all nonzero / all NaN."""
    x = torch.randn(shape, generator=rng)
    pick = torch.randint(0, 8, shape, generator=rng)
    x = torch.where(pick < 3, torch.zeros(()), x)
    x = torch.where(pick == 3, torch.tensor(-0.0), x)
    x = torch.where(pick == 4, torch.tensor(NAN), x)
    x = torch.where(pick == 5, torch.tensor(-torch.inf), x)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] >= 4:
        rows[0], rows[1], rows[2] = 0.0, 1.5, NAN
        rows[3] = -0.0
        rows[3, -1] = NAN  # the only true element, last
    return x


# ---- the template --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_N", [64, 8])  # one column tile, and several with a tail
@pytest.mark.parametrize("kind", KINDS)
def test_row_reduction_truth_of_floats(rng, kind, block_N):
    x = edgy(rng, (7, 37))
    f = reduction.row_reduction(x.shape, kind, out_dtype="bool", block_rows=2, block_N=block_N, target=C)
    out = elementwise.from_storage(compile_kernel(f, C, out_idx=[-1])(x), "bool")
    want = getattr(torch, kind)(x, -1)
    assert out.dtype == torch.bool and torch.equal(out, want), (out, want)
    assert torch.equal(reduction.reference(x, kind, out_dtype="bool")[0], want)


@pytest.mark.parametrize("kind", KINDS)
def test_row_reduction_truth_of_bools_with_a_producer_and_consumer(rng, kind):
    """Bool in (as int8), a producer making the bools (``x == -inf``, as _safe_softmax), the result read by a
    consumer (``where(acc, 0, 1)``), and the producer's bools written as the pre output."""
    from tilefuse.lowering.expr import Acc, call

    x = edgy(rng, (5, 19))
    producer = call("eq", Acc(), -torch.inf)
    f = reduction.row_reduction(x.shape, kind, x_dtype="float32", out_dtype="bool", producer=producer, block_N=8,
                                write_pre=True, pre_dtype="bool", target=C)
    out, pre = compile_kernel(f, C, out_idx=[-2, -1])(x)
    assert torch.equal(elementwise.from_storage(pre, "bool"), x == -torch.inf)
    assert torch.equal(elementwise.from_storage(out, "bool"), getattr(torch, kind)(x == -torch.inf, -1))
    b = torch.rand(6, 23, generator=rng) > 0.8
    b[0], b[1] = False, True
    f = reduction.row_reduction(b.shape, kind, x_dtype="bool", out_dtype="float32", keepdim=True,
                                consumer=call("where", Acc(), 0.0, 1.0), block_N=8, target=C)
    got = compile_kernel(f, C, out_idx=[-1])(elementwise.as_storage(b))
    assert torch.equal(got, torch.where(getattr(torch, kind)(b, -1, keepdim=True), 0.0, 1.0))


@pytest.mark.parametrize("kind", KINDS)
def test_row_reduction_truth_of_empty_rows(kind):
    e = torch.empty_strided((3, 0), (0, 1))  # the strides TileLang compiles an empty (3, 0) for
    f = reduction.row_reduction(e.shape, kind, out_dtype="bool", target=C)
    out = elementwise.from_storage(compile_kernel(f, C, out_idx=[-1])(e), "bool")
    assert out.tolist() == [kind == "all"] * 3


# ---- the registry op -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_registry_reference_and_types(rng, kind):
    x = edgy(rng, (3, 4, 5))
    spec, fn = ops.get(kind), getattr(torch, kind)
    for dims, keepdim in [(None, False), ((1,), False), ((0, 2), True), ((-1,), True)]:
        (out,) = spec.run([x], {"dims": dims, "keepdim": keepdim})
        want = fn(x) if dims is None and not keepdim else fn(x, dims if dims is not None else None, keepdim)
        assert out.dtype == torch.bool and torch.equal(out, want)
    u = torch.tensor([0, 3, 0], dtype=torch.uint8)
    assert torch.equal(spec.run([u], {})[0], fn(u)) and spec.run([u], {})[0].dtype == torch.uint8
    assert spec.run([torch.zeros(0, 3)], {})[0].item() is (kind == "all")


# ---- through torch.compile on c --------------------------------------------------------------------------------


CASES = {
    "default": lambda x: (x.any(), x.all()),
    "dim": lambda x: (torch.any(x, 2), torch.all(x, -1, keepdim=True)),
    "dims": lambda x: (torch.any(x, (1, 2)), torch.all(x, (-1, -2), keepdim=True)),
    "middle_dims": lambda x: (torch.any(x, 1), torch.all(x, (0, 2), keepdim=True)),  # torch: not trailing dims
    "dims_empty": lambda x: (torch.ops.aten.any.dims(x, []), torch.ops.aten.all.dims(x, [], True)),
    "of_bools": lambda x: (torch.isinf(x).any(), (x == -torch.inf).all(-1, keepdim=True)),
    "consumed": lambda x: torch.where((x == -torch.inf).all(-1, keepdim=True), torch.zeros(()), x.softmax(-1)),
    "t5_clamp": lambda x: torch.clamp(x, -torch.where(torch.isinf(x).any(), 1e4, 3e4),
                                      torch.where(torch.isinf(x).any(), 1e4, 3e4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_on_c_matches_eager_as_kernels(rng, case):
    fn, runners = CASES[case], []
    backend = make_backend(Options(target=C, quiet=True, observer=runners.append))
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    for shape in [(4, 6, 9), (3, 0, 5)]:  # and an empty reduction
        torch._dynamo.reset()
        x = edgy(rng, shape) if 0 not in shape else torch.empty(shape)
        got, want = compiled(x), fn(x)
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert backend.failures == [] and backend.fallback_ops() == set()
    plan = runners[0].plan  # the non-empty shape's
    regions = [r for r in plan.regions if {"any", "all"} & set(r.ops)]
    assert len(regions) == (0 if case == "dims_empty" else 1 if case == "consumed" else 2), plan.regions
    if case == "middle_dims":  # the row reduction reduces trailing dims only: the plan says why it runs in torch
        assert all(r.backend == "torch" for r in regions)
        assert all(any(r.name in why and "not trailing" in why for why in plan.refusals) for r in regions)
    else:  # an empty dim list reduces nothing: an elementwise ``ne``
        assert all(r.backend == "tilelang" for r in regions), [(r.name, r.backend) for r in regions]


def test_a_uint8_any_stays_uint8_through_compile(rng):
    u = torch.randint(0, 3, (5, 7), generator=rng, dtype=torch.uint8)
    fn = lambda t: (t.any(-1), torch.ops.aten.all.dims(t, []))
    compiled = torch.compile(fn, backend=make_backend(Options(target=C, quiet=True)), dynamic=False)
    for g, w in zip(compiled(u), fn(u), strict=True):
        assert g.dtype == w.dtype == torch.uint8 and torch.equal(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_on_cuda_matches_eager(rng, case):
    fn = CASES[case]
    backend = make_backend(Options(quiet=True, measure=False))
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    for dtype in (torch.float32, torch.float16):
        torch._dynamo.reset()
        x = edgy(rng, (4, 6, 9)).to("cuda", dtype)
        got, want = compiled(x), fn(x)
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2, equal_nan=True)
    assert backend.failures == [] and backend.fallback_ops() == set()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_truth_reductions_compile_for_cuda(arch):
    """The kernels the H200 runs for T5 (any of isinf's bools, whole tensor) and for ViT's _safe_softmax (all of
    ``x == -inf`` over the last dim, fp16, several tiles) lower and compile with nvcc."""
    from tilefuse.lowering.compile import compile_many
    from tilefuse.lowering.expr import Acc, call

    target = {"kind": "cuda", "arch": arch}
    funcs = [
        (reduction.row_reduction((1, 4 * 197 * 768), "any", x_dtype="bool", out_dtype="bool", target=target), [-1]),
        (reduction.row_reduction((2, 12, 197, 197), "all", x_dtype="float16", out_dtype="bool", keepdim=True,
                                 producer=call("eq", Acc(), -torch.inf), block_N=128, target=target), [-1]),
    ]
    built = compile_many(funcs, target, return_exceptions=True)
    failures = [f"{type(k).__name__}: {str(k).strip().splitlines()[-1][:300]}" for k in built
                if isinstance(k, BaseException)]
    assert failures == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_bool_outputs_compile_for_cuda(arch):
    """Elementwise kernels that store bools lower and compile with nvcc: a copy of a bool tensor (GPT-Neo's slice of
    its causal buffer; stored as a cast of TileLang's ``boolx8`` vector, which has no CUDA type: session 54's H100 run
    sent all 12 to torch), a comparison and an ``&`` of bools."""
    from tilefuse.lowering.compile import compile_many
    from tilefuse.lowering.expr import Arg, Coord, Load, call

    target = {"kind": "cuda", "arch": arch}
    corner = Load(0, tuple(Coord(d) for d in range(4)))  # x[:, :, :128, :128] of a (1, 1, 256, 256) buffer
    # (128 threads: 8 bools a thread, the vector that failed; its default config for these shapes)
    funcs = [
        (elementwise.elementwise([(1, 1, 256, 256)], ["bool"], [corner], ["bool"], out_shapes=[(1, 1, 128, 128)],
                                 threads=128, target=target), [-1]),
        (elementwise.elementwise([(1, 1, 256, 256)], ["bool"], [Arg(0)], ["bool"], threads=128, target=target), [-1]),
        (elementwise.elementwise([(4, 256), (4, 256)], ["float16", "float16"], [call("le", Arg(0), Arg(1))], ["bool"],
                                 target=target), [-1]),
        (elementwise.elementwise([(4, 256), (1, 256)], ["bool", "bool"], [call("bitwise_and", Arg(0), Arg(1))],
                                 ["bool"], target=target), [-1]),
    ]
    built = compile_many(funcs, target, return_exceptions=True)
    failures = [f"{type(k).__name__}: {str(k).strip().splitlines()[-1][:300]}" for k in built
                if isinstance(k, BaseException)]
    assert failures == []

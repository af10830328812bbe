"""In-place stores (issue 16): a static KV cache's ``index_copy_`` as the store of the elementwise kernel that makes
its rows (the elementwise template's ``scatters``, the registry's ``index_copy``, ``planner.partition``'s scatter
regions). Every element of the cache checked after each store, on the c target; NaN rows, indices out of range (torch's
error on the host, nothing stored), a cache the kernel is handed a copy of, the targets that leave the update to
torch, and the CUDA and HIP sources (a trap where torch asserts) compiled without a GPU."""

import shutil

import pytest
import torch

from tilefuse.config import Options
from tilefuse.ir import TensorType
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.dispatch import build
from tilefuse.lowering.expr import Arg, Call, Coord, Load
from tilefuse.lowering.templates import elementwise
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import build_runner, plan_step
from tilefuse.runtime.kernels import dense, written_back

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def _store(target, dim=2, cache=(2, 3, 8, 4), rows=2):
    """``cache.index_copy_(dim, index, 2 * src)`` beside an ordinary output ``src + 1``."""
    src = list(cache)
    src[dim] = rows
    return elementwise.elementwise(
        [tuple(cache), (rows,), tuple(src)], ["float32", "int64", "float32"],
        [Call("mul", (Arg(2), Arg(2))), Call("add", (Arg(2), Arg(2)))], ["float32", "float32"],
        out_shapes=[tuple(src), tuple(src)], scatters=[(0, dim, Load(1, (Coord(dim),))), None], target=target)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_the_template_stores_into_the_cache_on_c(rng, dim):
    """Rows at the index along any dim, NaN and inf stored as they are, the rest of the cache untouched; the other
    output computed as usual; an index out of range stores nothing (the host check is the runner's)."""
    shape = (2, 3, 8, 4)
    rows = min(2, shape[dim])
    (kernel,) = compile_many([(_store(C, dim, shape, rows), [-1])], C)
    src_shape = list(shape)
    src_shape[dim] = rows
    for index in ([shape[dim] - 1, 0][:rows], [1, 1][:rows]):
        cache = torch.randn(shape, generator=rng)
        src = torch.randn(src_shape, generator=rng)
        src.view(-1)[0], src.view(-1)[-1] = float("nan"), float("inf")
        idx = torch.tensor(index)
        want = cache.clone().index_copy_(dim, idx, src * src)
        other = kernel(cache, idx, src)
        torch.testing.assert_close(cache, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(other, src + src, rtol=0, atol=0, equal_nan=True)
    cache = torch.randn(shape, generator=rng)
    before = cache.clone()
    kernel(cache, torch.tensor([-1, shape[dim]][:rows]), torch.randn(src_shape, generator=rng))
    assert torch.equal(cache, before)


def test_the_template_refuses_a_cache_of_another_shape_or_dtype():
    for cache in ((2, 3, 8, 5), (2, 8, 4)):
        with pytest.raises(ValueError, match="must have the output's dtype, rank and dims"):
            elementwise.elementwise([cache, (2,), (2, 3, 2, 4)], ["float32", "int64", "float32"], [Arg(2)],
                                    ["float32"], out_shapes=[(2, 3, 2, 4)], scatters=[(0, 2, Load(1, (Coord(2),)))],
                                    target=C)
    with pytest.raises(ValueError, match="one scatter entry"):
        elementwise.elementwise([(4,)], ["float32"], [Arg(0)], ["float32"], scatters=[None, None], target=C)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_store_compiles_for_sm90a_with_a_trap():
    """A GPU traps at an index out of range (torch's device-side assert), in the index's own int64."""
    (kernel,) = compile_many([(_store(SM90), [-1])], SM90)
    src = kernel.get_kernel_source()
    assert "__trap();" in src and "(int64_t)8" in src


def _decode_graph(rows=1, dtype="float32"):
    """One decode step's k/v update as Hugging Face's LLaMA makes it: rotary k and transposed v stored into their
    caches at the step's positions, attention over the caches."""
    b = GraphBuilder("kv_update")
    k = b.input("k", TensorType((1, rows, 2, 8), dtype))
    v = b.input("v", TensorType((1, rows, 2, 8), dtype))
    q = b.input("q", TensorType((1, rows, 4, 8), dtype))
    cos, sin = (b.input(n, TensorType((1, 1, rows, 8), dtype)) for n in ("cos", "sin"))
    kc, vc = (b.input(n, TensorType((1, 2, 16, 8), dtype)) for n in ("k_cache", "v_cache"))
    pos = b.input("pos", TensorType((rows,), "int64"))
    kt = b.add1("rotary_embedding", [b.add1("transpose", [k], dim0=1, dim1=2), cos, sin])
    qt = b.add1("rotary_embedding", [b.add1("transpose", [q], dim0=1, dim1=2), cos, sin])
    vt = b.add1("transpose", [v], dim0=1, dim1=2)
    ks = b.add1("index_copy", [kc, pos, kt], dim=2)
    vs = b.add1("index_copy", [vc, pos, vt], dim=2)
    return b.build([b.add1("sdpa", [qt, ks, vs], is_causal=False, scale=0.25), ks, vs])


def test_a_decode_steps_kv_update_is_one_kernel_and_matches_eager(rng):
    """The rotary of q and k, the transpose of v and both stores: one TileLang kernel writing the caches where they
    live; each step's output and every element of both caches as torch's ops give them, NaN rows included; an
    index out of range is torch's IndexError, with the caches as they were."""
    graph = _decode_graph()
    planned = plan_step(graph, Options(target=C, quiet=True, measure=False))
    (store,) = [r for r in planned.plan.regions if "index_copy" in r.ops]
    assert store.backend == "tilelang" and store.ops.count("index_copy") == 2 and "rotary_embedding" in store.ops
    runner = build_runner(graph, Options(target=C, quiet=True, measure=False))
    caches = [torch.randn(1, 2, 16, 8, generator=rng) for _ in range(2)]
    want = [c.clone() for c in caches]
    for step in range(3):
        k, v = (torch.randn(1, 1, 2, 8, generator=rng) for _ in range(2))
        q = torch.randn(1, 1, 4, 8, generator=rng)
        if step == 1:
            v[0, 0, 1] = float("nan")
        cos, sin = torch.randn(1, 1, 1, 8, generator=rng), torch.randn(1, 1, 1, 8, generator=rng)
        pos = torch.tensor([5 + step])
        args = (k, v, q, cos, sin, *caches, pos)
        out, ks, vs = runner(*args)
        assert ks.data_ptr() == caches[0].data_ptr() and vs.data_ptr() == caches[1].data_ptr()
        ref_out, _, _ = runner_reference(graph, k, v, q, cos, sin, *want, pos)
        for got, exp in ((caches[0], want[0]), (caches[1], want[1]), (out, ref_out)):
            torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-5, equal_nan=True)
    before = [c.clone() for c in caches]
    with pytest.raises(IndexError, match="index 16 is out of bounds for dimension 2 with size 16"):
        runner(k, v, q, cos, sin, *caches, torch.tensor([16]))
    for c, b in zip(caches, before):  # (the NaN row of step 1 stays NaN)
        torch.testing.assert_close(c, b, rtol=0, atol=0, equal_nan=True)


def runner_reference(graph, *args):
    """``graph`` node by node through the registry's torch references (in place on the caches given)."""
    from tilefuse.ops.reference import run_graph

    return run_graph(graph, *args)


@pytest.mark.parametrize("target", [{"kind": "metal"}, {"kind": "ascend"}])
def test_targets_without_in_place_stores_leave_the_update_to_torch(target):
    region = next(r for r in plan_step(_decode_graph(), Options(target=C, quiet=True)).plan.regions
                  if "index_copy" in r.ops)
    graph = plan_step(_decode_graph(), Options(target=C, quiet=True)).plan.graph
    why = build(region, graph, target, source=True)
    assert isinstance(why, str) and ("in-place stores" in why or "Ascend" in why), why


def test_a_computed_index_leaves_the_update_to_torch(rng):
    """An index computed in the region (its bounds not checkable where it is made) is refused by the builder; the
    plan still gives eager's cache."""
    b = GraphBuilder("computed_index")
    kc = b.input("k_cache", TensorType((1, 2, 16, 8), "float32"))
    k = b.input("k", TensorType((1, 2, 1, 8), "float32"))
    pos = b.input("pos", TensorType((1,), "int64"))
    graph = b.build([b.add1("index_copy", [kc, b.add1("add", [pos, pos]), b.add1("neg", [k])], dim=2)])
    planned = plan_step(graph, Options(target=C, quiet=True, measure=False))
    assert not any(r.backend == "tilelang" and "index_copy" in r.ops and "add" in r.ops for r in planned.plan.regions)
    runner = build_runner(graph, Options(target=C, quiet=True, measure=False))
    cache, kk = torch.randn(1, 2, 16, 8, generator=rng), torch.randn(1, 2, 1, 8, generator=rng)
    want = cache.clone().index_copy_(2, torch.tensor([6]), -kk)
    runner(cache, kk, torch.tensor([3]))
    torch.testing.assert_close(cache, want, rtol=0, atol=0)


def test_a_copy_the_kernel_was_handed_is_written_back():
    dest = torch.zeros(4, 6)
    strided = dest.t()  # what a kernel is handed as dense is a copy
    passed = strided.contiguous()
    passed[1, 2] = 7.0
    assert written_back(strided, passed) is strided and dest[2, 1] == 7.0
    same = torch.zeros(3)
    assert written_back(same, same) is same
    one = torch.zeros(6, 4)[:1]  # a size-1 dim: dense restrides it over the same memory, nothing to copy back
    one = one.as_strided((1, 4), (99, 1))
    passed = dense(one)
    assert passed.data_ptr() == one.data_ptr() and passed.stride() != one.stride()
    passed.fill_(3.0)
    assert written_back(one, passed) is one and bool((one == 3.0).all())


@pytest.mark.gpu
def test_a_decode_steps_kv_update_on_the_gpu(rng):
    """The same on the H200 in float16, under a CUDA graph reading the caches in place (static inputs): each step's
    output and every element of both caches as torch's ops give them (an index out of range is not tried here: the
    kernel traps, as torch's index_copy_ asserts, and the CUDA context is lost)."""
    from tilefuse.config import default_target

    graph = _decode_graph(dtype="float16")
    options = Options(target=default_target(), quiet=True, measure=False)
    (store,) = [r for r in plan_step(graph, options).plan.regions if "index_copy" in r.ops]
    assert store.backend == "tilelang"
    runner = build_runner(graph, options, static_inputs=(5, 6))
    caches = [torch.randn(1, 2, 16, 8, generator=rng).half().cuda() for _ in range(2)]
    want = [c.clone() for c in caches]
    for step in range(4):
        k, v = (torch.randn(1, 1, 2, 8, generator=rng).half().cuda() for _ in range(2))
        q = torch.randn(1, 1, 4, 8, generator=rng).half().cuda()
        cos, sin = (torch.randn(1, 1, 1, 8, generator=rng).half().cuda() for _ in range(2))
        pos = torch.tensor([3 + step], device="cuda")
        out, ks, vs = runner(k, v, q, cos, sin, *caches, pos)
        assert ks.data_ptr() == caches[0].data_ptr() and vs.data_ptr() == caches[1].data_ptr()
        ref_out, _, _ = runner_reference(graph, k, v, q, cos, sin, *want, pos)
        torch.cuda.synchronize()
        for got, exp in ((caches[0], want[0]), (caches[1], want[1]), (out, ref_out)):
            torch.testing.assert_close(got, exp, rtol=1e-2, atol=1e-2, equal_nan=True)

"""The ``gemv`` template (a decode step's linear layers, issue 16): every output element against the fp64 reference on
the CPU target (tails in N and K, rows of A up to its limit, prologue and epilogue, NaN and inf), the planner's choice
of it (a CUDA target, at most ``GEMV_ROWS`` rows of an unbatched linear), every config compiled for sm_90a, and
every config run on the GPU."""

import math

import pytest
import torch

from tilefuse.config import Options, default_target
from tilefuse.ir import TensorType
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import Acc, Arg, Call
from tilefuse.lowering.lower import default_config
from tilefuse.lowering.templates import gemv
from tilefuse.lowering.templates.gemm import reference
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import plan_step

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}
BIAS_GELU = Call("gelu", (Call("add", (Acc(), Arg(0))),), {"approximate": "tanh"})
RESIDUAL = Call("add", (Acc(), Arg(0)))
SILU = Call("silu", (Acc(),))
GATED = Call("add", (Call("mul", (Arg(0), Acc())), Arg(1)))  # silu(gate) * up, plus a residual


def _case(rng, M, N, K, dtype, epilogue, specials=False, device="cpu"):
    A = torch.randn(M, K, generator=rng).to(dtype)
    B = (torch.randn(N, K, generator=rng) * 0.1).to(dtype)
    if specials:  # NaN and inf reach exactly the outputs whose row or column they are in
        A[0, K // 2] = float("nan")
        B[N - 1, 0] = float("inf")
    extras = []
    if epilogue is BIAS_GELU:
        extras = [torch.randn(N, generator=rng).to(dtype)]
    elif epilogue is RESIDUAL:
        extras = [torch.randn(M, N, generator=rng).to(dtype)]
    return [t.to(device) for t in (A, B, *extras)]


@pytest.mark.parametrize("M, N, K", [(1, 37, 64), (3, 16, 300), (4, 9, 13), (2, 64, 1000), (1, 5, 8)])
@pytest.mark.parametrize("epilogue", [None, BIAS_GELU, RESIDUAL], ids=["plain", "bias_gelu", "residual"])
def test_gemv_matches_the_reference_on_c(rng, M, N, K, epilogue):
    A, B, *extras = _case(rng, M, N, K, torch.float32, epilogue, specials=N > 8)
    f = gemv.gemv(M, N, K, A_dtype="float32", epilogue=epilogue, extra_shapes=[tuple(e.shape) for e in extras],
                  extra_dtypes=["float32"] * len(extras), target=C, **gemv.get_configs(C)[0])
    (kernel,) = compile_many([(f, [-1])], C)
    want = reference(A, B, extras, trans_B=True, epilogue=epilogue)
    torch.testing.assert_close(kernel(A, B, *extras), want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("unroll", [1, 3, 8, 64])
def test_gemv_unroll_matches_the_reference_on_c(rng, unroll):
    """``unroll`` (steps along K whose loads are issued together): any count, dividing a row's steps or not, more
    than it has, gives every element (NaN and inf included) as the reference."""
    for M, N, K in ((2, 19, 1000), (1, 12, 13), (3, 9, 36)):
        A, B, *extras = _case(rng, M, N, K, torch.float32, RESIDUAL, specials=True)
        f = gemv.gemv(M, N, K, A_dtype="float32", epilogue=RESIDUAL, extra_shapes=[tuple(extras[0].shape)],
                      extra_dtypes=["float32"], target=C, block_N=8, threads=1, unroll=unroll)
        (kernel,) = compile_many([(f, [-1])], C)
        want = reference(A, B, extras, trans_B=True, epilogue=RESIDUAL)
        torch.testing.assert_close(kernel(A, B, *extras), want, rtol=1e-5, atol=1e-5, equal_nan=True)
    with pytest.raises(ValueError, match="unroll=0"):
        gemv.gemv(1, 8, 16, A_dtype="float32", target=C, unroll=0)


def _group_case(rng, M, Ns, K, dtype, device="cpu"):
    """A group of weights over one A: q/k/v-like (a bias on the second, a residual on the third), NaN in A, inf in a
    weight, tails in N and K."""
    A = torch.randn(M, K, generator=rng).to(dtype)
    A[0, K // 3] = float("nan")
    Bs = [(torch.randn(N, K, generator=rng) * 0.1).to(dtype) for N in Ns]
    Bs[0][Ns[0] - 1, 1] = float("inf")
    epilogues = [None, BIAS_GELU, RESIDUAL][:len(Ns)]
    extras = [torch.randn(Ns[1], generator=rng).to(dtype)] + (
        [torch.randn(M, Ns[2], generator=rng).to(dtype)] if len(Ns) > 2 else [])
    extras_of = [(), (0,), (1,)][:len(Ns)]
    return [t.to(device) for t in (A, *Bs)], [e.to(device) for e in extras], epilogues, extras_of


def _group_want(A, Bs, extras, epilogues, extras_of):
    return [reference(A, B, [extras[j] for j in own], trans_B=True, epilogue=epi)
            for B, epi, own in zip(Bs, epilogues, extras_of)]


@pytest.mark.parametrize("M, Ns, K", [(1, (40, 9, 17), 64), (3, (16, 8, 24), 300), (2, (5, 33), 13)])
def test_gemv_group_matches_the_reference_on_c(rng, M, Ns, K):
    """``gemv_group``: each weight's output is what ``gemv`` gives it alone, every element (NaN and inf included)."""
    (A, *Bs), extras, epilogues, extras_of = _group_case(rng, M, Ns, K, torch.float32)
    f = gemv.gemv_group(M, Ns, K, A_dtype="float32", epilogues=epilogues, extra_shapes=[tuple(e.shape) for e in extras],
                        extra_dtypes=["float32"] * len(extras), extras_of=extras_of, target=C,
                        **gemv.get_configs(C)[0])
    (kernel,) = compile_many([(f, list(range(-len(Ns), 0)))], C)
    got = kernel(A, *Bs, *extras)
    for o, w in zip(got, _group_want(A, Bs, extras, epilogues, extras_of)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5, equal_nan=True)


def _check_joined(rng, M, K, stored, dtype, target, device, tol):
    """A gated MLP's gate and up of one input in one launch (``extras_of`` -1: the up's epilogue reads the gate's
    output, computed by the same programs and never stored unless asked), beside a weight of its own (q-like, a
    bias), every config: each output element (NaN and inf included) as the weights' own references give it."""
    N, Nq, dt = 37, 20, str(dtype)[6:]
    A = torch.randn(M, K, generator=rng).to(dtype)
    A[0, K // 2] = float("nan")
    gate, up, q = ((torch.randn(n, K, generator=rng) * 0.1).to(dtype) for n in (N, N, Nq))
    up[N - 1, 0] = float("inf")
    res, bias = torch.randn(M, N, generator=rng).to(dtype), torch.randn(Nq, generator=rng).to(dtype)
    g = reference(A, gate, trans_B=True, epilogue=SILU)
    want = [reference(A, q, [bias], trans_B=True, epilogue=BIAS_GELU)] + ([g] if stored[0] else []) + \
        [reference(A, up, [g, res], trans_B=True, epilogue=GATED)]
    items = [(gemv.gemv_group(M, (Nq, N, N), K, A_dtype=dt, epilogues=[BIAS_GELU, SILU, GATED],
                              extra_shapes=[(Nq,), (M, N)], extra_dtypes=[dt] * 2, extras_of=[(0,), (), (-2, 1)],
                              stored=(True, *stored), target=target, **cfg), list(range(-1 - sum(stored), 0)))
             for cfg in gemv.get_configs(target)]
    for kernel in compile_many(items, target):
        got = kernel(*(t.to(device) for t in (A, q, gate, up, bias, res)))
        assert len(got) == len(want)
        for o, w in zip(got, want):
            torch.testing.assert_close(o.cpu(), w, equal_nan=True, **tol)
        assert torch.isnan(got[-1][0]).all() and not torch.isnan(got[-1][1:]).any()


@pytest.mark.parametrize("M, K, stored", [(1, 64, (False, True)), (3, 300, (True, True)), (4, 13, (False, True))])
def test_gemv_group_joined_weights_match_the_reference_on_c(rng, M, K, stored):
    """A gate and up in one launch on the c target (see ``_check_joined``)."""
    assert gemv.joined_sets([(0,), (), (-2, 1)]) == [[0], [1, 2]]
    assert gemv.joined_sets([(-3,), (), (-1, -2)]) == [[0, 1, 2]]
    _check_joined(rng, M, K, stored, torch.float32, C, "cpu", {"rtol": 1e-5, "atol": 1e-5})


def test_gemv_group_refusals():
    with pytest.raises(ValueError, match="epilogues"):
        gemv.gemv_group(1, (8, 8), 16, epilogues=[None], target=SM90)
    with pytest.raises(ValueError, match="broadcast"):
        gemv.gemv_group(1, (8, 16), 16, epilogues=[None, RESIDUAL], extra_shapes=[(1, 8)], extra_dtypes=["float16"],
                        extras_of=[(), (0,)], target=SM90)
    with pytest.raises(ValueError, match="weight 1 reads weight 1"):
        gemv.gemv_group(1, (8, 8), 16, epilogues=[None, None], extras_of=[(), (-2,)], target=SM90)
    with pytest.raises(ValueError, match="weight 1 reads weight 0's output: it must be an earlier weight of the same"):
        gemv.gemv_group(1, (8, 16), 16, epilogues=[None, None], extras_of=[(), (-1,)], target=SM90)
    with pytest.raises(ValueError, match="stored flags"):
        gemv.gemv_group(1, (8, 8), 16, stored=(True,), target=SM90)


def test_gemv_prologue_and_a_cast(rng):
    """A float32 A with a prologue, multiplied as float16 values (as ``gemm`` does: the product runs in B's dtype)."""
    M, N, K = 2, 24, 40
    A, B = torch.randn(M, K, generator=rng), torch.randn(N, K, generator=rng).half()
    pro = Call("relu", (Acc(),))
    f = gemv.gemv(M, N, K, A_dtype="float32", B_dtype="float16", out_dtype="float32", prologue=pro, target=C,
                  **gemv.get_configs(C)[0])
    (kernel,) = compile_many([(f, [-1])], C)
    torch.testing.assert_close(kernel(A, B), reference(A, B, trans_B=True, prologue=pro, out_dtype="float32"),
                               rtol=1e-5, atol=1e-5)


def test_gemv_refusals():
    with pytest.raises(ValueError, match="at most"):
        gemv.gemv(gemv.GEMV_ROWS + 1, 8, 8, target=SM90)
    with pytest.raises(ValueError, match="do not split"):
        gemv.gemv(1, 8, 8, block_N=6, threads=128, target=SM90)
    with pytest.raises(ValueError, match="broadcast"):
        gemv.gemv(1, 8, 8, epilogue=RESIDUAL, extra_shapes=[(2, 8)], extra_dtypes=["float16"], target=SM90)


def _linear_graph(rows: tuple, N: int, K: int, bias: bool = True):
    b = GraphBuilder("linear")
    x = b.input("x", TensorType((*rows, K), "float16"))
    w = b.input("w", TensorType((N, K), "float16"))
    args = [x, w] + ([b.input("b", TensorType((N,), "float16"))] if bias else [])
    (y,) = b.add("linear", args)
    return b.build([b.add("gelu", [y], approximate="tanh")[0]])


@pytest.mark.parametrize("rows, target, template", [
    ((1, 1), SM90, "gemv"), ((2, 1), SM90, "gemv"), ((gemv.GEMV_ROWS,), SM90, "gemv"),
    ((gemv.GEMV_ROWS + 1,), SM90, "gemm"), ((64, 1), SM90, "gemm"), ((1, 1), C, "gemm")])
def test_the_planner_takes_gemv_for_a_decode_steps_linear_on_cuda(rows, target, template):
    """A linear of at most GEMV_ROWS rows on a CUDA GPU is a ``gemv`` spec with its bias and GELU fused; more rows, or
    the CPU, keep the GEMM template (planned here, nothing compiled)."""
    planned = plan_step(_linear_graph(rows, 5632, 2048), Options(target=target, quiet=True))
    (spec,) = planned.specs.values()
    assert spec.template == template
    kw = spec.factory_kwargs()
    assert kw["epilogue"] is not None and kw["N"] == 5632 and kw["K"] == 2048
    if template == "gemv":
        assert kw["M"] == math.prod(rows) and "trans_B" not in kw
        assert default_config(spec, target) == gemv.get_configs(target)[0] == {"block_N": 4, "threads": 128}


def test_gemv_compiles_for_sm90a():
    """Every config, an aligned and a tail shape, through nvcc for sm_90a (no GPU needed)."""
    items = [(gemv.gemv(M, N, K, epilogue=BIAS_GELU, extra_shapes=[(N,)], extra_dtypes=["float16"], target=SM90,
                        **cfg), [-1])
             for cfg in gemv.get_configs(SM90) for M, N, K in ((1, 512, 2048), (3, 100, 13))]
    kernels = compile_many(items, SM90, return_exceptions=True)
    assert not [k for k in kernels if isinstance(k, Exception)], kernels


def test_gemv_group_compiles_for_sm90a():
    """Every config, HF LLaMA's q/k/v and gate/up groups and a tail group, through nvcc for sm_90a."""
    items = [(gemv.gemv_group(1, Ns, K, target=SM90, **cfg), list(range(-len(Ns), 0)))
             for cfg in gemv.get_configs(SM90) for Ns, K in (((2048, 512, 512), 2048), ((5632, 5632), 2048),
                                                           ((100, 37, 9), 13))]
    items += [(gemv.gemv_group(M, (5632, 5632), K, epilogues=[SILU, GATED], extra_shapes=[(M, 5632)],
                               extra_dtypes=["float16"], extras_of=[(), (-1, 0)], stored=(False, True), target=SM90,
                               **cfg), [-1])
              for cfg in gemv.get_configs(SM90) for M, K in ((1, 2048), (3, 13))]  # a gated MLP's gate and up
    kernels = compile_many(items, SM90, return_exceptions=True)
    assert not [k for k in kernels if isinstance(k, Exception)], kernels


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_group_configs_gpu(rng, dtype):
    """Every config of ``gemv_group`` on the GPU, each output element against the fp64 reference."""
    target = default_target()
    dt = str(dtype)[6:]
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    for M, Ns, K in ((1, (2048, 512, 512), 2048), (gemv.GEMV_ROWS, (100, 37, 9), 1000)):
        (A, *Bs), extras, epilogues, extras_of = _group_case(rng, M, Ns, K, dtype, device="cuda")
        items = [(gemv.gemv_group(M, Ns, K, A_dtype=dt, epilogues=epilogues, extras_of=extras_of,
                                  extra_shapes=[tuple(e.shape) for e in extras], extra_dtypes=[dt] * len(extras),
                                  target=target, **cfg), list(range(-len(Ns), 0))) for cfg in gemv.get_configs(target)]
        want = _group_want(A, Bs, extras, epilogues, extras_of)
        for kernel in compile_many(items, target):
            for o, w in zip(kernel(A, *Bs, *extras), want):
                torch.testing.assert_close(o, w, equal_nan=True, **tol)
    for M, K, stored in ((1, 2048, (False, True)), (gemv.GEMV_ROWS, 1000, (True, True))):
        _check_joined(rng, M, K, stored, dtype, target, "cuda", tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_configs_gpu(rng, dtype):
    """Every config on the GPU: one to GEMV_ROWS rows, tails in N and K, a bias+GELU and a residual epilogue, NaN and
    inf in the operands, every element against the fp64 reference."""
    target = default_target()
    dt = str(dtype)[6:]
    shapes = [(1, 2048, 2048, BIAS_GELU), (gemv.GEMV_ROWS, 100, 1000, RESIDUAL), (2, 37, 13, None)]
    items, cases = [], []
    for cfg in gemv.get_configs(target):
        for M, N, K, epi in shapes:
            extra = {BIAS_GELU: [(N,)], RESIDUAL: [(M, N)]}.get(epi, [])
            items.append((gemv.gemv(M, N, K, A_dtype=dt, epilogue=epi, extra_shapes=extra,
                                    extra_dtypes=[dt] * len(extra), target=target, **cfg), [-1]))
            cases.append((M, N, K, epi))
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    for kernel, (M, N, K, epi) in zip(compile_many(items, target), cases):
        A, B, *extras = _case(rng, M, N, K, dtype, epi, specials=N > 8, device="cuda")
        want = reference(A, B, extras, trans_B=True, epilogue=epi)
        torch.testing.assert_close(kernel(A, B, *extras), want, equal_nan=True, **tol)


def test_the_planner_groups_a_decode_steps_linears_of_one_input():
    """Linears of one input (through reshapes) at a decode step's rows become ``gemv_group`` regions of at most
    ``GROUP_MAX`` on a GPU; one that reads another's output, one with more rows, and every linear on the CPU stay
    apart. Each group is one ``gemv_group`` spec whose outputs are its linears'."""
    from tilefuse.lowering.dispatch import build
    from tilefuse.planner.grouping import GROUP_MAX

    def graph(rows):
        b = GraphBuilder("decode_linears")
        x = b.input("x", TensorType((1, rows, 64), "float16"))
        flat = b.add1("reshape", [x], shape=[rows, 64])
        outs = []
        for k in range(6):
            w = b.input(f"w{k}", TensorType((16 * (k + 1), 64), "float16"))
            outs.append(b.add1("linear", [flat if k % 2 else x, w]))
        w6 = b.input("w6", TensorType((64, 16), "float16"))
        outs.append(b.add1("linear", [outs[0], w6]))  # reads the first one's output
        return b.build(outs)

    p = plan_step(graph(1), Options(target=SM90, quiet=True)).plan
    groups = [r for r in p.regions if r.kind == "gemv_group"]
    assert [r.ops.count("linear") for r in groups] == [GROUP_MAX, 6 - GROUP_MAX]
    assert all(r.backend == "tilelang" for r in groups)
    assert sum(r.kind == "gemm" for r in p.regions) == 1  # the dependent linear
    spec = build(groups[0], p.graph, SM90)
    assert spec.template == "gemv_group" and spec.factory_kwargs()["Ns"] == (16, 32, 48, 64)
    assert len(spec.outputs) == GROUP_MAX and spec.out_idx == (-4, -3, -2, -1)
    # an artifact's plan keeps the groups (a region kind the loader knows)
    from tilefuse.runtime.serialize import plan_from_json, plan_to_json

    back = plan_from_json(plan_to_json(p), p.graph.constants)
    assert [(r.name, r.kind, r.nodes, r.backend) for r in back.regions] == \
        [(r.name, r.kind, r.nodes, r.backend) for r in p.regions]
    for rows, target in ((gemv.GEMV_ROWS + 1, SM90), (1, C)):
        p = plan_step(graph(rows), Options(target=target, quiet=True)).plan
        assert not any(r.kind == "gemv_group" for r in p.regions)
    p = plan_step(graph(1), Options(target=SM90, quiet=True, group_linears=False)).plan  # the option: each apart
    assert not any(r.kind == "gemv_group" for r in p.regions) and sum(r.kind == "gemm" for r in p.regions) == 7


@pytest.mark.parametrize("form", ["joined", "gate_returned", "transposed"])
def test_the_planner_joins_a_gated_mlps_gate_and_up(form):
    """A decode step's gated MLP (``silu(x @ gate^T) * (x @ up^T)``) on a GPU: one ``gemv_group`` region whose up reads
    the gate's output in registers, the gate never stored. Where the graph returns the gate's output, or the product
    reads both through transposes, the planner leaves ``silu * up`` to an elementwise kernel: the two linears group
    apart from each other's outputs, both stored."""
    from tilefuse.lowering.dispatch import build

    b = GraphBuilder("gated_mlp")
    x = b.input("x", TensorType((1, 1, 64), "float16"))
    g = b.add1("linear", [x, b.input("gate", TensorType((96, 64), "float16"))])
    u = b.add1("linear", [x, b.input("up", TensorType((96, 64), "float16"))])
    s = b.add1("silu", [g])
    if form == "transposed":
        s = b.add1("transpose", [b.add1("reshape", [s], shape=[1, 8, 12])], dim0=1, dim1=2)
        u = b.add1("transpose", [b.add1("reshape", [u], shape=[1, 8, 12])], dim0=1, dim1=2)
    graph = b.build([b.add1("mul", [s, u])] + ([g] if form == "gate_returned" else []))
    p = plan_step(graph, Options(target=SM90, quiet=True)).plan
    (group,) = [r for r in p.regions if r.kind == "gemv_group"]
    assert group.backend == "tilelang" and group.ops.count("linear") == 2
    kw = build(group, p.graph, SM90).factory_kwargs()
    assert kw["Ns"] == (96, 96)
    if form == "joined":
        assert len(p.regions) == 1 and kw["extras_of"] == ((), (-1,)) and kw["stored"] == (False, True)
    else:
        assert kw["extras_of"] == ((), ()) and "stored" not in kw
        assert [r.kind for r in p.regions] == ["gemv_group", "elementwise"]

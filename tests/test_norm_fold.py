"""A decode step's RMSNorm folded into the gemv kernels that read it (issue 16, ``planner.norm_fold``): the ``gemv``
template's normalized input against the fp64 reference (every element, tails, NaN and inf, a zero row), every config
through nvcc for sm_90a and on the GPU; the planner's fold (the norm into its linears, its residual add into the
linear before) where every region so made lowers, and not elsewhere; a folded plan's outputs against the reference
interpreter."""

import pytest
import torch

from tilefuse.config import Options, default_target
from tilefuse.ir import TensorType
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import Acc, Arg, Call
from tilefuse.lowering.templates import gemv
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import run_graph
from tilefuse.pipeline import build_runner, plan_step

C = {"kind": "c"}
SM90 = {"kind": "cuda", "arch": "sm_90a"}
EPS = 1e-5
RESIDUAL = Call("add", (Acc(), Arg(0)))
SILU = Call("silu", (Acc(),))
GATED = Call("mul", (Arg(0), Acc()))  # silu(gate) * up


def _normed(A: torch.Tensor, G: torch.Tensor | None) -> torch.Tensor:
    """RMSNorm of A's rows in fp64 (times G), as the gemv reads it."""
    a = A.double()
    y = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + EPS)
    return y * G.double() if G is not None else y


def _case(rng, M, K, dtype, device="cpu", specials=True):
    A = torch.randn(M, K, generator=rng).to(dtype)
    G = (1 + 0.5 * torch.randn(K, generator=rng)).to(dtype)
    if specials and M > 1:
        A[1] = 0  # a zero row: its outputs are 0 (rsqrt(eps) times 0), not NaN
    if specials and M > 2:
        A[2, K // 3] = float("nan")  # NaN reaches exactly its row
    return A.to(device), G.to(device)


def _want(A, G, Bs, extras, epilogues, extras_of):
    """Each weight's output of the normalized A through its epilogue (fp64, then float32)."""
    x = _normed(A.cpu(), None if G is None else G.cpu())
    outs = []
    for B, epi, own in zip(Bs, epilogues, extras_of):
        acc = x @ B.cpu().double().T
        if epi is SILU:
            acc = torch.nn.functional.silu(acc)
        elif epi is RESIDUAL:
            acc = acc + extras[own[0]].cpu().double()
        elif epi is GATED:
            acc = acc * outs[-1 - own[0]]
        outs.append(acc)
    return outs


@pytest.mark.parametrize("M, Ns, K, weighted", [(1, (37,), 64, True), (3, (16, 9, 24), 300, True),
                                                (4, (5,), 13, False), (2, (8, 8), 1000, True)])
def test_gemv_norm_matches_the_reference_on_c(rng, M, Ns, K, weighted):
    """One weight with a residual epilogue, or a group (q/k/v-like, or a gated gate/up joined): every output element
    of the normalized A as the reference's (a zero row gives 0 but where it meets the inf weight, a NaN fills its
    row)."""
    A, G = _case(rng, M, K, torch.float32)
    Bs = [(torch.randn(N, K, generator=rng) * 0.1) for N in Ns]
    Bs[0][-1, 0] = float("inf")
    if len(Ns) == 1:
        extras, epilogues, extras_of = [torch.randn(M, Ns[0], generator=rng)], [RESIDUAL], [(0,)]
        f = gemv.gemv(M, Ns[0], K, A_dtype="float32", epilogue=RESIDUAL, extra_shapes=[(M, Ns[0])],
                      extra_dtypes=["float32"], norm_eps=EPS, norm_weight="float32" if weighted else None,
                      target=C, **gemv.get_configs(C)[0])
    else:
        joined = len(Ns) == 2
        extras, epilogues = [], [SILU, GATED] if joined else [None] * len(Ns)
        extras_of = [(), (-1,)] if joined else [()] * len(Ns)
        f = gemv.gemv_group(M, Ns, K, A_dtype="float32", epilogues=epilogues, extras_of=extras_of,
                            stored=(True,) * len(Ns), norm_eps=EPS, norm_weight="float32" if weighted else None,
                            target=C, **gemv.get_configs(C)[0])
    (kernel,) = compile_many([(f, list(range(-len(Ns), 0)))], C)
    got = kernel(A, *([G] if weighted else []), *Bs, *extras)
    got = got if isinstance(got, (list, tuple)) else [got]
    want = _want(A, G if weighted else None, Bs, extras, epilogues, extras_of)
    for o, w in zip(got, want, strict=True):
        torch.testing.assert_close(o, w.float(), rtol=1e-5, atol=1e-5, equal_nan=True)
        if M > 2:
            assert torch.isnan(o[2]).all()


def test_gemv_norm_refusals():
    with pytest.raises(ValueError, match="prologue and a norm"):
        gemv.gemv(1, 8, 16, A_dtype="float32", prologue=Call("neg", (Acc(),)), norm_eps=EPS, target=C)


def _norm_items(target, dt):
    """Every config of a q/k/v group and a gated gate/up with a norm of A (HF LLaMA's sizes and a tail): the kernels'
    items and their cases (M, Ns, K, joined)."""
    items, cases = [], []
    for cfg in gemv.get_configs(target):
        for M, K in ((1, 2048), (3, 13)):
            Ns = (2048, 512, 512) if K > 13 else (40, 9, 17)
            items.append((gemv.gemv_group(M, Ns, K, A_dtype=dt, norm_eps=EPS, norm_weight=dt, target=target, **cfg),
                          [-3, -2, -1]))
            items.append((gemv.gemv_group(M, (64, 64), K, A_dtype=dt, epilogues=[SILU, GATED],
                                          extras_of=[(), (-1,)], stored=(False, True), norm_eps=EPS, norm_weight=dt,
                                          target=target, **cfg), [-1]))
            cases += [(M, Ns, K, False), (M, (64, 64), K, True)]
    return items, cases


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not on PATH")
def test_gemv_norm_compiles_for_sm90a():
    kernels = compile_many(_norm_items(SM90, "float16")[0], SM90, return_exceptions=True)
    assert not [k for k in kernels if isinstance(k, Exception)], kernels


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_norm_configs_gpu(rng, dtype):
    """Every config with a norm of A on the GPU, every output element against the fp64 reference."""
    target, dt = default_target(), str(dtype)[6:]
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-2, "atol": 1e-2}
    items, cases = _norm_items(target, dt)
    for kernel, (M, Ns, K, joined) in zip(compile_many(items, target), cases, strict=True):
        A, G = _case(rng, M, K, dtype, "cuda")
        Bs = [(torch.randn(N, K, generator=rng) * 0.1).to(dtype).cuda() for N in Ns]
        got = kernel(A, G, *Bs)
        got = got if isinstance(got, (list, tuple)) else [got]
        epilogues, extras_of = ([SILU, GATED], [(), (-1,)]) if joined else ([None] * 3, [()] * 3)
        want = _want(A, G, Bs, [], epilogues, extras_of)
        for o, w in zip(got, want[-len(got):], strict=True):
            torch.testing.assert_close(o.float().cpu(), w.float(), equal_nan=True, **tol)


# ---- the planner's fold -----------------------------------------------------------------------------------------


def _layer(rows: int = 1, returned: bool = False, other_reader: bool = False, dtype: str = "float32"):
    """A decode step's residual block: h = x + a @ wo^T; n = rms_norm(h) * g; q, k of n; down(silu(gate) * up)
    added to h; a final norm and a head. ``returned``: the graph also returns the first norm's output;
    ``other_reader``: a mul reads it too."""
    b = GraphBuilder("decode_block")
    D, F = 64, 96
    x = b.input("x", TensorType((1, rows, D), dtype))
    a = b.input("a", TensorType((1, rows, D), dtype))
    w = {n: b.input(n, TensorType(s, dtype)) for n, s in (("wo", (D, D)), ("g", (D,)), ("wq", (D, D)),
                                                          ("wk", (16, D)), ("g2", (D,)), ("wg", (F, D)),
                                                          ("wu", (F, D)), ("wd", (D, F)), ("g3", (D,)),
                                                          ("head", (40, D)))}
    h = b.add1("add", [x, b.add1("linear", [a, w["wo"]])])
    n = b.add1("rms_norm", [h, w["g"]], eps=EPS)
    q, k = b.add1("linear", [n, w["wq"]]), b.add1("linear", [n, w["wk"]])
    h2 = b.add1("add", [h, b.add1("linear", [b.add1("reshape", [q], shape=[1, rows, D]), w["wo"]])])
    n2 = b.add1("rms_norm", [h2, w["g2"]], eps=EPS)
    mlp = b.add1("mul", [b.add1("silu", [b.add1("linear", [n2, w["wg"]])]), b.add1("linear", [n2, w["wu"]])])
    h3 = b.add1("add", [h2, b.add1("linear", [mlp, w["wd"]])])
    head = b.add1("linear", [b.add1("rms_norm", [h3, w["g3"]], eps=EPS), w["head"]])
    outs = [head, k] + ([n] if returned else []) + ([b.add1("mul", [n, n])] if other_reader else [])
    return b.build(outs)


def _norms(plan):
    return [r for r in plan.regions if r.kind == "reduction" and "rms_norm" in r.ops]


def test_the_planner_folds_a_decode_steps_rms_norms_on_a_gpu():
    """On sm_90a at a decode step's row: every norm inside the linears that read it (a q/k group, a gate/up group, the
    head), each residual add in the epilogue of the linear before it; the specs read the norm's input and weight."""
    from tilefuse.lowering.dispatch import build

    p = plan_step(_layer(), Options(target=SM90, quiet=True)).plan
    assert _norms(p) == [] and all(r.backend == "tilelang" for r in p.regions if r.kind != "view")
    folded = [r for r in p.regions if "rms_norm" in r.ops]
    assert sorted(r.kind for r in folded) == ["gemm", "gemv_group", "gemv_group"]
    adds = [r for r in p.regions if "add" in r.ops]
    assert len(adds) == 3 and all(r.kind == "gemm" and r.ops.count("linear") == 1 for r in adds)
    for r in folded:
        spec = build(r, p.graph, SM90)
        kw = spec.factory_kwargs()
        assert spec.template in ("gemv", "gemv_group") and kw["norm_eps"] == EPS and kw["norm_weight"] == "float32"
        assert spec.inputs[1][0] in ("g", "g2", "g3")
    # the option, a CPU target (no gemv), more rows than a gemv's: the norms stay kernels of their own
    for options in (Options(target=SM90, quiet=True, fold_norms=False), Options(target=C, quiet=True)):
        assert len(_norms(plan_step(_layer(), options).plan)) == 3
    assert len(_norms(plan_step(_layer(rows=gemv.GEMV_ROWS + 1), Options(target=SM90, quiet=True)).plan)) == 3


@pytest.mark.parametrize("form", ["returned", "other_reader"])
def test_a_norm_read_other_than_by_linears_is_not_folded(form):
    """A norm whose output the graph returns, or a non-linear reads, keeps its own kernel (and its add); the other
    norms still fold."""
    p = plan_step(_layer(**{form: True}), Options(target=SM90, quiet=True)).plan
    (kept,) = _norms(p)
    assert "add" in kept.ops and kept.backend == "tilelang"
    assert sum("rms_norm" in r.ops for r in p.regions if r.kind in ("gemm", "gemv_group")) == 2


@pytest.mark.parametrize("rows", [1, gemv.GEMV_ROWS])
def test_a_folded_plan_matches_the_reference(rng, rows, monkeypatch):
    """The folded plan run on the c target (gemv kernels there too) against the reference interpreter, every output
    element, fp32; with NaN in one row of the input only that row's outputs are NaN."""
    from tilefuse.lowering import builders

    monkeypatch.setattr(builders, "GEMV_TARGETS", ("c",))
    graph = _layer(rows=rows)
    runner = build_runner(graph, Options(target=C, quiet=True, measure=False))
    # (the head, a single linear, is the CPU's GEMM template, which takes no norm: the last norm stays its own)
    assert sum("rms_norm" in r.ops for r in runner.plan.regions if r.kind == "gemv_group") == 2
    args = [torch.randn(tuple(v.type.shape), generator=rng) * (0.3 if v.name.startswith("w") else 1)
            for v in graph.inputs]
    if rows > 1:
        args[0][0, 1, 5] = float("nan")
    got, want = runner(*args), run_graph(graph, *args)
    for o, w in zip(got, want, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    if rows > 1:
        assert torch.isnan(got[0][0, 1]).all() and not torch.isnan(got[0][0, 0]).any()

"""Programmatic dependent launch (issue 16): on CUDA sm_90+ the decode-step templates are placed while the kernel
before them finishes and wait for it before reading (``lowering/templates/common.py``). On the CPU: which targets use
it, the option that turns it off, and the sm_90a sources (the wait before any load; none for other targets). On the
GPU: a gemv launched behind a slow reduction reads the reduction's finished output, eagerly and replayed in a CUDA
graph whose edge between them is programmatic."""

import ctypes
import re

import pytest
import torch

from tilefuse.config import Options, default_target
from tilefuse.lowering.compile import compile_kernel, kernel_source
from tilefuse.lowering.expr import Acc, Arg, Call, call
from tilefuse.lowering.templates import gemm, gemv
from tilefuse.lowering.templates.attention import decode_configs, flash_attention, get_configs
from tilefuse.lowering.templates.common import PDL_ALL, PDL_MAX_ELEMENTS, PDL_TMA, dialect, uses_pdl
from tilefuse.lowering.templates.elementwise import elementwise
from tilefuse.lowering.templates.reduction import row_reduction

SM90 = {"kind": "cuda", "arch": "sm_90a"}
ALL = {**SM90, "experimental": [PDL_ALL]}  # (``Options(experimental="pdl_all")``'s target)
WAIT = "cudaGridDependencySynchronize();"
TRIGGER = "cudaTriggerProgrammaticLaunchCompletion();"


@pytest.mark.parametrize("target, want", [
    (SM90, True), ({"kind": "cuda", "arch": "sm_100a"}, True), ("cuda", True),
    ({"kind": "cuda", "arch": "sm_80"}, False), ({"kind": "cuda", "arch": "sm_89"}, False),
    ({**SM90, "pdl": False}, False), ({"kind": "c"}, False), ({"kind": "hip", "mcpu": "gfx942"}, False),
    ({"kind": "metal"}, False)])
def test_which_targets_launch_as_programmatic_dependents(target, want):
    assert uses_pdl(target) is want


def test_the_option_off_marks_a_cuda_target_and_leaves_others():
    assert Options(target=dict(SM90), pdl=False).target == {**SM90, "pdl": False}
    assert Options(target=dict(SM90)).target == SM90
    assert Options(target={"kind": "c"}, pdl=False).target == {"kind": "c"}


def _body(src: str) -> str:
    return src[src.index("__launch_bounds__"):]


@pytest.mark.parametrize("build", [
    lambda t: gemv.gemv(1, 2048, 5632, block_N=8, threads=128, target=t),
    lambda t: gemv.gemv_group(1, (2048, 512, 512), 2048, target=t),
], ids=["gemv", "gemv_group"])
def test_a_gemv_waits_before_it_reads(build):
    """The wait (then the trigger) comes before the first load of A or of a weight; with the option off the source
    has neither."""
    body = _body(kernel_source(build(SM90), SM90))
    wait = body.index(WAIT)
    assert body.index(TRIGGER) > wait
    assert not re.search(r"\b(A|B\d?)\b( \+|\[)", body[:wait]), body[:wait]
    assert re.search(r"\(A \+", body[wait:]) and re.search(r"\(B\d? \+", body[wait:])
    off = kernel_source(build({**SM90, "pdl": False}), {**SM90, "pdl": False})
    assert WAIT not in off and TRIGGER not in off


@pytest.mark.parametrize("build", [
    lambda t: elementwise([(4, 256)], ["float16"], [Call("silu", (Arg(0),))], ["float16"], target=t),
    lambda t: row_reduction((4, 2048), "rms_norm", x_dtype="float16", has_weight=True, target=t),
    lambda t: flash_attention(1, 8, 1, 512, 64, Hkv=2, mask_shape=(1, 1, 1, 512), mask_dtype="float16",
                              dtype="float16", target=t, **_decode_config(t)),
], ids=["elementwise", "rms_norm", "decode_attention"])
def test_other_decode_kernels_wait_before_anything(build):
    """Elementwise, norm and attention kernels start with the wait (then the trigger) on sm_90a; with the option
    off, and on C, they have neither."""
    body = _body(kernel_source(build(SM90), SM90))
    wait = body.index(WAIT)
    assert body.index(TRIGGER) == wait + len(WAIT) + body[wait + len(WAIT):].index(TRIGGER)
    assert not re.search(r"\b(in0|X|Q|K|V|Mask|mask)\b(\[| \+)", body[:wait]), body[:wait]
    for other in ({**SM90, "pdl": False}, {"kind": "c"}):
        assert WAIT not in kernel_source(build(other), other)


@pytest.mark.parametrize("build", [
    lambda t: elementwise([(2048, 1024)], ["float16"], [Call("silu", (Arg(0),))], ["float16"], target=t),
    lambda t: row_reduction((2048, 1024), "rms_norm", x_dtype="float16", has_weight=True, target=t),
    lambda t: flash_attention(1, 8, 1024, 1024, 64, is_causal=True, dtype="float16", target=t),
], ids=["elementwise_2M", "rms_norm_2M", "prefill_attention"])
def test_kernels_larger_than_a_decode_steps_launch_plainly(build):
    """Past PDL_MAX_ELEMENTS (a prefill's or a training step's activations), and an attention that is not a decode
    step's, the source is what it was without PDL: no wait, its parameters ``__restrict__``."""
    src = kernel_source(build(SM90), SM90)
    assert WAIT not in src and TRIGGER not in src
    assert src == kernel_source(build({**SM90, "pdl": False}), {**SM90, "pdl": False})
    assert 2048 * 1024 > PDL_MAX_ELEMENTS


def _ws_attention_config() -> dict:
    return next(c for c in get_configs(SM90, 64, ws=True) if c.get("ws"))


ALL_KERNELS = {  # a prefill's kernels of every family that waits for its inputs
    "ws_gemm": lambda t: gemm.gemm(1024, 3072, 768, trans_B=True, A_dtype="float16",
                                   epilogue=call("gelu", Acc() + Arg(0)), extra_shapes=[(3072,)],
                                   extra_dtypes=["float16"], ws=True, target=t, block_M=128, block_N=256, block_K=64,
                                   num_stages=3),
    "gemm": lambda t: gemm.gemm(1024, 3072, 768, trans_B=True, A_dtype="float16", target=t, block_M=128, block_N=128,
                                block_K=64, num_stages=3, threads=256),
    "ws_attention": lambda t: flash_attention(2, 8, 1024, 1024, 64, is_causal=True, dtype="float16", target=t,
                                              **_ws_attention_config()),
    "elementwise_2M": lambda t: elementwise([(2048, 1024)], ["float16"], [Call("silu", (Arg(0),))], ["float16"],
                                            target=t),
    "rms_norm_2M": lambda t: row_reduction((2048, 1024), "rms_norm", x_dtype="float16", has_weight=True, target=t),
}


def test_pdl_all_is_an_experimental_option_of_sm90_targets():
    assert Options(target=dict(SM90), experimental="pdl_all").target == ALL
    assert dialect(ALL).pdl_all and not dialect(SM90).pdl_all
    assert not dialect({**ALL, "pdl": False}).pdl_all  # (the option off wins)
    assert not dialect({"kind": "cuda", "arch": "sm_80", "experimental": [PDL_ALL]}).pdl_all


@pytest.mark.parametrize("name", sorted(ALL_KERNELS))
def test_with_pdl_all_every_kernel_waits_before_anything(name):
    """With ``pdl_all`` the GEMMs (both schedules), the ws attention and large elementwise and norm kernels wait
    first (then trigger): no operand is read, by a load or a TMA copy, before the wait. Without it their source has
    neither."""
    build = ALL_KERNELS[name]
    body = _body(kernel_source(build(ALL), ALL))
    wait = body.index(WAIT)
    assert body.index(TRIGGER) == wait + len(WAIT) + body[wait + len(WAIT):].index(TRIGGER)
    before = body[:wait]
    assert not re.search(r"\b(in0|X|X_nd|Q|K|V|O|A|B|C|extra\d)\b(\[| \+)", before), before
    assert "tma_load" not in before and "tma_store" not in before
    assert re.search(r"tma_load|\b(in0|X|X_nd)\b(\[| \+)", body[wait:])
    assert WAIT not in kernel_source(build(SM90), SM90)


@pytest.mark.parametrize("name", sorted(ALL_KERNELS))
def test_with_pdl_tma_only_the_tma_fed_kernels_wait(name):
    """``pdl_tma``: the GEMMs and the ws attention wait first, as with ``pdl_all``; the large elementwise and norm
    kernels launch plainly, their source unchanged (``__restrict__`` parameters kept)."""
    tma = {**SM90, "experimental": [PDL_TMA]}
    assert dialect(tma).pdl_tma and not dialect(tma).pdl_all
    src = kernel_source(ALL_KERNELS[name](tma), tma)
    if name in ("ws_gemm", "gemm", "ws_attention"):
        body = _body(src)
        assert "tma_load" not in body[:body.index(WAIT)] and TRIGGER in body
    else:
        assert src == kernel_source(ALL_KERNELS[name](SM90), SM90)


def test_with_pdl_tma_a_gemm_with_a_prologue_launches_plainly():
    """A GEMM whose A tile is computed element by element (a prologue) is not fed by TMA alone: with ``pdl_tma`` it
    keeps its plain launch and ``__restrict__`` parameters, unlike the same GEMM without the prologue."""
    tma = {**SM90, "experimental": [PDL_TMA]}

    def build(target, prologue):
        return gemm.gemm(1024, 3072, 768, trans_B=True, A_dtype="float16", prologue=prologue, target=target,
                         block_M=128, block_N=128, block_K=64, num_stages=3, threads=256)

    assert kernel_source(build(tma, Acc() * 2.0), tma) == kernel_source(build(SM90, Acc() * 2.0), SM90)
    assert WAIT in kernel_source(build(tma, None), tma)


def _decode_config(target) -> dict:
    """The default decode attention config on a GPU target (packed, keys bounded by the mask); none on the CPU."""
    configs = decode_configs(target, 1, 4, keys_masked=True)
    return configs[0] if configs else {}


def _edge_types(raw_graph: int) -> list[int]:
    """The dependency type of every edge of a CUDA graph (0 default, 1 programmatic), by the driver's
    cuGraphGetEdges_v2."""

    class EdgeData(ctypes.Structure):
        _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                    ("reserved", ctypes.c_ubyte * 5)]

    get = ctypes.CDLL("libcuda.so.1").cuGraphGetEdges_v2
    n = ctypes.c_size_t(0)
    assert get(ctypes.c_void_p(raw_graph), None, None, None, ctypes.byref(n)) == 0
    froms, tos, data = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)(), (EdgeData * n.value)()
    assert get(ctypes.c_void_p(raw_graph), froms, tos, data, ctypes.byref(n)) == 0
    return [d.type for d in data[:n.value]]


def _producer(kind: str, target: dict, gen):
    """(the slow kernel a gemv reads, its input X, its weight, its reference, K: the length of its output row).
    ``reduction``: a row sum of 2048 x 32768 (about 40 us, its last rows written last), a plain launch (past
    PDL_MAX_ELEMENTS). ``gemv``: a 32768 x 2048 gemv (about 30 us), itself a PDL kernel that lets its dependent launch
    as soon as it starts."""
    if kind == "reduction":
        K, cols = 2048, 32768
        red = compile_kernel(row_reduction((K, cols), "sum", x_dtype="float16", out_dtype="float16", target=target),
                             target, out_idx=[-1])
        X = torch.empty(K, cols, device="cuda", dtype=torch.float16)
        return (lambda: red(X).view(1, K)), X, (lambda: X.float().sum(-1).view(1, K)), K
    K, D = 32768, 2048
    first = compile_kernel(gemv.gemv(1, K, D, target=target), target, out_idx=[-1])
    W1 = (torch.randn(K, D, device="cuda", generator=gen) * 0.05).half()
    X = torch.empty(1, D, device="cuda", dtype=torch.float16)
    return (lambda: first(X, W1)), X, (lambda: X.float() @ W1.float().T), K


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["reduction", "gemv"])
def test_a_gemv_behind_a_slow_kernel_reads_its_finished_output(kind):
    """A slow kernel (``_producer``) feeds a gemv launched as its programmatic dependent. Each of 20 calls, eager and
    replayed in a CUDA graph, sees new data: the gemv's output is the product of the row the producer finished with
    (a read before the wait would see the previous call's), and the captured graph's edge between them is
    programmatic. (The reduction form ran on the H200 at f7c3ee4, when the reduction was a PDL kernel too; the gemv
    form is new since and has not run there yet.)"""
    target = default_target()
    assert uses_pdl(target), target
    gen = torch.Generator(device="cuda").manual_seed(16)
    produce, X, reference, K = _producer(kind, target, gen)
    N = 2048
    gv = compile_kernel(gemv.gemv(1, N, K, target=target), target, out_idx=[-1])
    W = (torch.randn(N, K, device="cuda", generator=gen) * 0.05 / (K / 2048) ** 0.5).half()

    def step():
        a = produce()
        return a, gv(a, W)

    def check(a, c, i):
        torch.testing.assert_close(a.float(), reference(), rtol=1e-2, atol=5e-2)
        want = a.float() @ W.float().T
        torch.testing.assert_close(c.float(), want, rtol=1e-2, atol=1e-1, msg=lambda m: f"call {i}: {m}")

    scale = 0.01 if kind == "reduction" else 1.0  # the producer's row about 2 in size, and new each call

    def fill(i):
        X.copy_(torch.randn(X.shape, device="cuda", generator=gen).half() * scale + (i % 5 - 2) * 0.2 * scale)

    for i in range(20):
        fill(i)
        check(*step(), i)
    for _ in range(2):  # warm
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        a, c = step()
    assert 1 in _edge_types(graph.raw_cuda_graph())  # the gemv's launch kept its programmatic edge
    for i in range(20):
        fill(i + 1)
        graph.replay()
        check(a, c, i)


@pytest.mark.gpu
def test_ws_gemms_launched_as_programmatic_dependents_read_finished_outputs():
    """With ``pdl_all``, two ws GEMMs, the second reading the first's output (each about 0.2 ms, launched back to
    back): every one of 10 calls, eager and replayed in a CUDA graph, gives the product of the first one's finished
    output for that call's fresh A (a read before the wait would see the previous call's), and the graph's edge
    between them is programmatic."""
    target = {**default_target(), "experimental": [PDL_ALL]}
    assert dialect(target).pdl_all, target
    M = N = K = 4096
    cfg = {"block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 3}
    first, second = (compile_kernel(gemm.gemm(M, N, K, trans_B=True, A_dtype="float16", ws=True, target=target, **cfg),
                                    target, out_idx=[-1]) for _ in range(2))
    gen = torch.Generator(device="cuda").manual_seed(20)
    A = torch.empty(M, K, device="cuda", dtype=torch.float16)
    W1, W2 = ((torch.randn(N, K, device="cuda", generator=gen) / K ** 0.5).half() for _ in range(2))

    def step():
        c1 = first(A, W1)
        return c1, second(c1, W2)

    def check(c1, c2, i):
        want1 = (A.float() @ W1.float().T)
        torch.testing.assert_close(c1.float(), want1, rtol=1e-2, atol=2e-2, msg=lambda m: f"call {i}, first: {m}")
        want2 = c1.float() @ W2.float().T
        torch.testing.assert_close(c2.float(), want2, rtol=1e-2, atol=2e-2, msg=lambda m: f"call {i}, second: {m}")

    def fill(i):
        A.copy_(torch.randn(A.shape, device="cuda", generator=gen).half() + (i % 5 - 2))

    for i in range(10):
        fill(i)
        check(*step(), i)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        c1, c2 = step()
    assert 1 in _edge_types(graph.raw_cuda_graph())
    for i in range(10):
        fill(i + 1)
        graph.replay()
        check(c1, c2, i)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "vit", "mlp"])
def test_zoo_models_with_pdl_all_match_eager(name):
    """The zoo's transformers and MLP (fp16, small) with every kernel a programmatic dependent, every region a kernel
    (``measure=False``), CUDA graphs on: three calls on fresh inputs match eager."""
    import tilefuse
    from tilefuse import models

    model, _ = models.build(name, "small", dtype=torch.float16, device="cuda")
    compiled = tilefuse.compile(model, experimental="pdl_all", measure=False)
    with torch.no_grad():
        for _ in range(3):
            inputs = models.example_inputs(name, "small", dtype=torch.float16, device="cuda")
            torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-2, atol=1e-2)

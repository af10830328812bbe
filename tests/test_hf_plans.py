"""Plans of Hugging Face transformers models (small configs, random weights, no network)."""

from contextlib import ExitStack
from unittest import mock

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

transformers = pytest.importorskip("transformers")

from tilefuse.capture import capture_graphs
from tilefuse.models.hf import MainOutput, build_hf
from tilefuse.pipeline import plan


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_plan_structure(name):
    torch.manual_seed(0)
    model = MainOutput(build_hf(name))
    graphs = capture_graphs(model, (torch.randint(0, 100, (2, 17)),))
    p = plan(max(graphs, key=lambda g: len(g.nodes)))
    print(p.to_text(reasons=False))
    assert 2 * p.kernels <= p.source_nodes
    assert [r.kind for r in p.regions].count("attention") == 2
    res_norms = [r for r in p.regions if r.kind == "reduction" and "add" in r.ops
                 and {"layer_norm", "rms_norm"} & set(r.ops)]
    assert len(res_norms) == 4  # two blocks, two residual norms each (the last folds into the final norm)
    act = "gelu" if name == "gpt2" else "silu"
    gemm_act = [r for r in p.regions if r.kind == "gemm" and act in r.ops]
    assert len(gemm_act) == 2
    if name == "gpt2":  # Conv1D is addmm: the bias lands in the same region as the GEMM and GELU
        assert all("add" in r.ops or "linear" in r.ops for r in gemm_act)


# ---- attention in every spelling (issue 14): eager and sdpa, five families ----------------------------------------

LAYERS = 2
CAUSAL = {"gpt2": True, "bert": False, "llama": True, "mistral": True, "t5": False}


def _tiny(name: str, impl: str) -> torch.nn.Module:
    """A tiny ``name`` model with random weights and ``attn_implementation=impl`` (no network)."""
    t = transformers
    common = {"vocab_size": 100, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    cfg = {
        "gpt2": lambda: (t.GPT2LMHeadModel, t.GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, n_positions=64,
                                                          **common)),
        "bert": lambda: (t.BertModel, t.BertConfig(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4,
                                                   intermediate_size=128, max_position_embeddings=64, **common)),
        "llama": lambda: (t.LlamaForCausalLM, t.LlamaConfig(num_hidden_layers=LAYERS, hidden_size=64,
                                                            num_attention_heads=4, num_key_value_heads=2,
                                                            intermediate_size=128, max_position_embeddings=64,
                                                            **common)),
        # a window shorter than the sequence, so the sliding window decides which keys a query sees
        "mistral": lambda: (t.MistralForCausalLM, t.MistralConfig(num_hidden_layers=LAYERS, hidden_size=64,
                                                                  num_attention_heads=4, num_key_value_heads=2,
                                                                  intermediate_size=128, max_position_embeddings=64,
                                                                  sliding_window=8, **common)),
        "t5": lambda: (t.T5EncoderModel, t.T5Config(num_layers=LAYERS, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                                                    **common)),
    }[name]
    cls, config = cfg()
    torch.manual_seed(0)
    return cls._from_config(config, attn_implementation=impl).eval()


class _Main(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        kw = {} if isinstance(self.model, (transformers.BertModel, transformers.T5EncoderModel)) else {"use_cache": False}
        out = self.model(input_ids=ids, attention_mask=mask, **kw)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _inputs(S=19):
    ids = torch.randint(1, 100, (2, S))
    mask = torch.ones(2, S, dtype=torch.long)
    mask[1, S - 5:] = 0  # right padding: every query row keeps a visible key
    return ids, mask


def _graph(model, args):
    """The ATen inference graph torch.compile hands tilefuse, imported (nothing compiled)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from tilefuse.backend import decompositions
    from tilefuse.frontends.fx import import_fx_program

    graphs = []

    def keep(gm, ex):
        graphs.append(import_fx_program(gm, ex, "hf").graph)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=keep, inference_compiler=keep,
                                                  decompositions=decompositions()))(*args)
    torch._dynamo.reset()
    (graph,) = graphs
    return graph


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_one_attention_region_per_layer(name, impl):
    p = plan(_graph(_Main(_tiny(name, impl)), _inputs()), {"kind": "c"})
    att = [r for r in p.regions if r.kind == "attention"]
    assert len(att) == LAYERS, p.to_text()
    nodes = {n.name: n for n in p.graph.nodes}
    for r in att:
        a = nodes[r.anchor]
        assert a.op == "sdpa" and r.backend == "tilelang", r
        assert bool(a.attr.get("is_causal")) == CAUSAL[name], (r.pattern, a.attr)
        assert ("causal" in r.pattern or "sliding_window" in r.pattern) == CAUSAL[name], r.pattern
        assert (a.attr.get("window") == 8) == (name == "mistral"), a.attr
        if len(a.inputs) > 3 and a.inputs[3] and name != "t5":  # the padding mask: per key, never S x S
            assert p.graph.values()[a.inputs[3]].type.shape[-2] == 1
    # nothing of the S x S mask runs: no node makes a (.., S, S) tensor outside the T5 bias
    if name != "t5":
        S = 19
        big = [n for n in p.graph.nodes if n.op != "sdpa" and any(
            (o.type.shape or ())[-2:] == (S, S) for o in n.outputs)]
        assert not big, [n.name for n in big]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_hf_attention_numerics_on_c(name, impl):
    _matches_eager_on_c(_Main(_tiny(name, impl)), _inputs())


def _matches_eager_on_c(model, args):
    """``model`` compiled by tilefuse (the default target, c here) against eager, every element (fp32 1e-4)."""
    import tilefuse

    with torch.no_grad():
        want = model(*args)
        torch._dynamo.reset()
        got = tilefuse.compile(model)(*args)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bloom_alibi_attention_is_one_causal_region_a_layer():
    """BLOOM (eager only): baddbmm(alibi, q, k^T) on (B*H, S, D), the mask and softmax in 4-D, bmm back in 3-D
    (``planner.patterns_alibi``): one causal sdpa a layer, ALiBi and the padding one (B, H, 1, S) per-key mask, nothing
    S x S; the values match eager on the c target."""
    t = transformers
    torch.manual_seed(0)
    model = _Main(t.BloomModel._from_config(t.BloomConfig(n_layer=LAYERS, hidden_size=64, n_head=4, vocab_size=100,
                                                          bos_token_id=0, eos_token_id=0, pad_token_id=0),
                                            attn_implementation="eager").eval())
    S = 19
    p = plan(_graph(model, _inputs(S)), {"kind": "c"})
    att = [r for r in p.regions if r.kind == "attention"]
    assert len(att) == LAYERS and all(r.backend == "tilelang" for r in att), p.to_text()
    nodes, values = {n.name: n for n in p.graph.nodes}, p.graph.values()
    for r in att:
        a = nodes[r.anchor]
        assert a.op == "sdpa" and a.attr.get("is_causal"), a.attr
        assert tuple(values[a.inputs[3]].type.shape) == (2, 4, 1, S)
    assert not [n.name for n in p.graph.nodes if n.op != "sdpa" and (values[n.outputs[0].name].type.shape or ())[-2:]
                == (S, S)]
    _matches_eager_on_c(model, _inputs(S))


def test_gpt_neo_where_hidden_attention_is_one_causal_region_a_layer():
    """GPT-Neo (eager only): ``where(bias, q @ k^T, finfo.min)`` over its causal (global) or local-window buffer, then
    the causal-and-padding mask, softmax over unscaled scores (``planner.patterns_hidden``): one causal sdpa a layer
    through TileLang, no torch fallback; the buffer stays an operand (a runtime input, its values may change); the
    values match eager on the c target, with a window shorter than the sequence."""
    t = transformers
    torch.manual_seed(0)
    cfg = t.GPTNeoConfig(num_layers=LAYERS, hidden_size=64, num_heads=4, max_position_embeddings=64, vocab_size=100,
                         attention_types=[[["global", "local"], LAYERS // 2]], window_size=8, bos_token_id=0,
                         eos_token_id=0, pad_token_id=0)
    model = _Main(t.GPTNeoForCausalLM._from_config(cfg, attn_implementation="eager").eval())
    p = plan(_graph(model, _inputs()), {"kind": "c"})
    att = [r for r in p.regions if r.kind == "attention"]
    assert len(att) == LAYERS and all(r.backend == "tilelang" for r in p.regions), p.to_text()
    nodes = {n.name: n for n in p.graph.nodes}
    assert all(nodes[r.anchor].attr.get("is_causal") and nodes[r.anchor].attr["scale"] == 1.0 for r in att)
    assert sum(r.startswith("attention.where_hidden") for r in p.rewrites) == LAYERS, p.rewrites
    _matches_eager_on_c(model, _inputs())


def test_mpt_masked_fill_alibi_attention_is_one_causal_region_a_layer():
    """MPT (eager only): ``masked_fill(q @ k^T * s + alibi, attention_mask.bool(), finfo.min)``, the boolean being the
    model's additive causal-and-padding mask cast (``planner.patterns_hidden``): one causal sdpa a layer, ALiBi and the
    padding vector one (B, H, 1, S) per-key mask, nothing S x S; the values match eager on the c target."""
    t = transformers
    torch.manual_seed(0)
    cfg = t.MptConfig(n_layers=LAYERS, d_model=64, n_heads=4, expansion_ratio=2, max_seq_len=64, vocab_size=100,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = _Main(t.MptForCausalLM._from_config(cfg, attn_implementation="eager").eval())
    S = 19
    p = plan(_graph(model, _inputs(S)), {"kind": "c"})
    att = [r for r in p.regions if r.kind == "attention"]
    assert len(att) == LAYERS and all(r.backend == "tilelang" for r in p.regions), p.to_text()
    nodes, values = {n.name: n for n in p.graph.nodes}, p.graph.values()
    for r in att:
        a = nodes[r.anchor]
        assert a.attr.get("is_causal") and tuple(values[a.inputs[3]].type.shape) == (2, 4, 1, S), a
    assert not [n.name for n in p.graph.nodes if n.op != "sdpa" and (values[n.outputs[0].name].type.shape or ())[-2:]
                == (S, S)]
    _matches_eager_on_c(model, _inputs(S))


# ---- torch's math SDPA: what dynamo hands a backend on CUDA (issue 14) -----------------------------------------------
# On CUDA, torch's fused SDPA kernels refuse a mask whose last dim has stride 0 (sdp_utils: "All fused kernels require
# the last dimension of the input to have stride 1"; the CPU kernel takes it), and transformers with torch < 2.14
# never skips the mask under torch.compile: BERT's all-visible mask ``(q_idx >= 0)`` expanded to (B, 1, S, S) is such
# a mask. SDPA then decomposes as ``_scaled_dot_product_attention_math``: fp32 upcasts, sqrt(scale) on q and k^T,
# bmm, the mask added, ``_safe_softmax``, bmm, the downcast (H200: BERT-base b32x512 ran it as fp32 GEMMs, 31.8 ms
# against eager's 7.7). Here the MATH backend forces that form on the CPU and ``forced`` makes transformers build
# the mask as it does there.

MATH_FAMILIES = ("bert", "gpt2")


def _sdpa_context(backend: str, forced: bool) -> ExitStack:
    stack = ExitStack()
    if backend == "math":
        stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
    if forced:  # transformers' mask skips off, as under torch.compile with torch < 2.14
        mu = transformers.masking_utils
        for name in ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa"):
            stack.enter_context(mock.patch.object(mu, name, lambda *a, **k: False))
    return stack


class _Ids(torch.nn.Module):
    """The model called as the H200 benchmark calls it: input_ids only."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        kw = {} if isinstance(self.model, transformers.BertModel) else {"use_cache": False}
        out = self.model(input_ids=ids, **kw)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _math_case(name: str, call: str, dtype=torch.float32):
    model = _tiny(name, "sdpa").to(dtype)
    ids, mask = _inputs()
    return (_Ids(model), (ids,)) if call == "ids" else (_Main(model), (ids, mask))


def _check_attention_plan(p, name: str, call: str, dtype: str) -> None:
    """LAYERS attention regions, each one sdpa on the model's dtype, causal as the family is, its mask per key
    (none when the model passed none); nothing of the S x S mask or of the softmax guard left in the graph."""
    att = [r for r in p.regions if r.kind == "attention"]
    assert len(att) == LAYERS, p.to_text()
    values = p.graph.values()
    nodes = {n.name: n for n in p.graph.nodes}
    for r in att:
        a = nodes[r.anchor]
        assert a.op == "sdpa" and bool(a.attr.get("is_causal")) == CAUSAL[name], (r.pattern, a.attr)
        assert all(values[x].type.dtype == dtype for x in a.inputs[:3]), a.inputs  # the fp32 upcasts are gone
        mask = a.inputs[3] if len(a.inputs) > 3 else ""
        if call == "ids":
            assert not mask, a.inputs  # an all-visible mask is no operand at all
        else:
            assert values[mask].type.shape[-2] == 1  # the padding mask: per key
    S = _inputs()[0].shape[1]
    big = [n.name for n in p.graph.nodes if n.op != "sdpa" and any(
        (o.type.shape or ())[-2:] == (S, S) for o in n.outputs)]
    assert not big, big
    guard = [n.name for n in p.graph.nodes if n.op in ("torch_fallback", "all", "eq", "isnan")]
    assert not guard, guard


@pytest.mark.parametrize("call", ["ids", "padded"])
@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("backend", ["math", "default"])
@pytest.mark.parametrize("name", MATH_FAMILIES)
def test_math_sdpa_one_attention_region_per_layer(name, backend, forced, call):
    model, args = _math_case(name, call)
    with _sdpa_context(backend, forced):
        g = _graph(model, args)
    if backend == "math":  # the form under test is really there: fp32 bmm products and the decomposed guard
        assert "sdpa" not in g.op_counts() and {"matmul", "softmax", "where"} <= set(g.op_counts())
    p = plan(g, {"kind": "c"})
    _check_attention_plan(p, name, call, "float32")
    assert all(r.backend == "tilelang" for r in p.regions if r.kind == "attention")
    if backend == "math":
        assert sum("split_scale" in w for w in p.rewrites) == LAYERS, p.rewrites


@pytest.mark.parametrize("name", MATH_FAMILIES)
def test_math_sdpa_fp16_plan(name):
    """fp16, as on the H200: the sdpa reads the fp16 q, k, v; the upcasts and the downcast are gone."""
    model, args = _math_case(name, "ids", torch.float16)
    with _sdpa_context("math", True):
        g = _graph(model, args)
    assert any(n.op == "cast" and n.outputs[0].type.dtype == "float32" for n in g.nodes)
    p = plan(g, {"kind": "c"})
    _check_attention_plan(p, name, "ids", "float16")
    users = p.graph.users()
    for n in p.graph.nodes:
        if n.op == "sdpa":
            assert n.outputs[0].type.dtype == "float16"
            assert all(u.op != "cast" for u in users.get(n.outputs[0].name, ())), users[n.outputs[0].name]


@pytest.mark.parametrize("call", ["ids", "padded"])
@pytest.mark.parametrize("name", MATH_FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_math_sdpa_numerics_on_c(name, call, dtype):
    import tilefuse

    model, args = _math_case(name, call, dtype)
    with torch.no_grad(), _sdpa_context("math", True):
        want = model(*args)
        torch._dynamo.reset()
        got = tilefuse.compile(model)(*args)
    torch._dynamo.reset()
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("call", ["ids", "padded"])
@pytest.mark.parametrize("name", MATH_FAMILIES)
def test_math_sdpa_fp16_cuda(name, call):
    """The H200's case: fp16 on CUDA with the math form (forced here, whatever this torch and transformers pick):
    one attention region per layer, each as the flash kernel (measure=False), against eager at 1e-2."""
    import tilefuse
    from tilefuse.config import default_target

    model, args = _math_case(name, call, torch.float16)
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    runners = []
    with torch.no_grad(), _sdpa_context("math", True):
        want = model(*args)
        torch._dynamo.reset()
        got = tilefuse.compile(model, target=default_target(), observer=runners.append, measure=False)(*args)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    (runner,) = runners
    _check_attention_plan(runner.plan, name, call, "float16")
    assert all(r.backend == "tilelang" for r in runner.plan.regions if r.kind == "attention"), runner.plan.to_text()


def _gemma2(softcap: float | None) -> torch.nn.Module:
    """Tiny Gemma 2 (eager, its only form): sliding-window and global layers in turn, grouped-query heads, the scores
    softcapped at ``softcap`` before the mask (a cap small against these scores, so tanh bends them)."""
    t = transformers
    cfg = t.Gemma2Config(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, intermediate_size=128, max_position_embeddings=64, sliding_window=8,
                         query_pre_attn_scalar=16, attn_logit_softcapping=softcap, vocab_size=100, bos_token_id=0,
                         eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    return _Main(t.Gemma2ForCausalLM._from_config(cfg, attn_implementation="eager").eval())


def test_gemma2_softcapped_attention_is_one_region_a_layer():
    """Gemma 2's ``cap * tanh(q @ k^T * s / cap)`` before its causal (or sliding-window) mask (``planner.
    patterns_softcap``): one sdpa a layer with the softcap, causal, the window in the sliding layer, the padding a
    per-key mask, nothing S x S, all through TileLang; the values match eager on the c target."""
    model = _gemma2(0.01)
    S = 19
    p = plan(_graph(model, _inputs(S)), {"kind": "c"})
    att = [r for r in p.regions if r.kind == "attention"]
    assert len(att) == LAYERS and all(r.backend == "tilelang" for r in p.regions), p.to_text()
    nodes, values = {n.name: n for n in p.graph.nodes}, p.graph.values()
    attrs = [nodes[r.anchor].attr for r in att]
    assert all(a["softcap"] == pytest.approx(0.01) and a["is_causal"] and a["scale"] == 0.25 for a in attrs), attrs
    assert sorted(a.get("window") or 0 for a in attrs) == [0, 8], attrs
    assert all(tuple(values[nodes[r.anchor].inputs[3]].type.shape) == (2, 1, 1, S) for r in att)
    assert not [n.name for n in p.graph.nodes if n.op != "sdpa" and (values[n.outputs[0].name].type.shape or ())[-2:]
                == (S, S)]
    args = _inputs(S)
    with torch.no_grad():  # the cap changes the model's answer: a kernel without it would not pass below
        assert (model(*args) - _gemma2(None)(*args)).abs().max() > 1e-2
    _matches_eager_on_c(model, args)

"""Op registry: every declared op has a kind and a reference; inference agrees with the reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from tilefuse import ops
from tilefuse.ir import TensorType

F32 = "float32"

# (op, input shapes (None = absent; a (shape, dtype) pair for a non-float input), attrs)
CASES = [
    ("relu", [(3, 4)], {}), ("gelu", [(3, 4)], {"approximate": "tanh"}), ("silu", [(5,)], {}),
    ("erf", [(2, 3)], {}), ("rsqrt", [(2, 3)], {}), ("clamp", [(4,)], {"min": -0.5, "max": 0.5}),
    ("add", [(3, 1), (1, 4)], {}), ("pow", [(3, 4), ()], {}), ("where", [((3, 4), "bool"), (3, 4), (4,)], {}),
    ("lt", [(3, 4), (4,)], {}), ("cast", [(3,)], {"dtype": "float16"}),
    ("matmul", [(2, 3, 5), (5, 7)], {}), ("linear", [(4, 5), (6, 5), (6,)], {}),
    ("conv", [(2, 3, 9, 9), (4, 3, 3, 3), (4,)], {"stride": (2, 2), "padding": (1, 1)}),
    ("sum", [(3, 4, 5)], {"dims": (1,), "keepdim": True}), ("mean", [(3, 4)], {"dims": (-1,)}),
    ("amax", [(3, 4)], {"dims": (0,)}), ("var", [(3, 4)], {"dims": (1,), "correction": 0}),
    ("argmax", [(3, 4)], {"dim": 1}), ("softmax", [(3, 4)], {"dim": -1}), ("log_softmax", [(3, 4)], {"dim": 0}),
    ("layer_norm", [(2, 3, 8), (8,), (8,)], {"eps": 1e-5}), ("rms_norm", [(2, 3, 8), (8,)], {}),
    ("batch_norm", [(2, 3, 4, 4), (3,), (3,), (3,), (3,)], {}),
    ("max_pool", [(1, 2, 8, 8)], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
    ("avg_pool", [(1, 2, 8, 8)], {"kernel": (2, 2), "stride": (2, 2)}),
    ("adaptive_avg_pool", [(1, 2, 7, 7)], {"output_size": (1, 1)}),
    ("sdpa", [(2, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8), None], {"is_causal": True}),
    ("sdpa", [(2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8), (2, 1, 5, 6)], {}),
    ("rotary_embedding", [(2, 4, 5, 8), (5, 8), (5, 8)], {}),
    ("reshape", [(2, 6)], {"shape": (3, -1)}), ("permute", [(2, 3, 4)], {"perm": (2, 0, 1)}),
    ("transpose", [(2, 3)], {"dim0": 0, "dim1": 1}), ("expand", [(1, 3)], {"shape": (4, 3)}),
    ("slice", [(5, 6)], {"dim": 1, "start": 1, "end": 5, "step": 2}), ("concat", [(2, 3), (4, 3)], {"dim": 0}),
    ("split", [(2, 6)], {"dim": 1, "sizes": (2, 4)}), ("squeeze", [(2, 1, 3)], {"dims": (1,)}),
    ("unsqueeze", [(2, 3)], {"dims": (0, 3)}), ("gather", [(3, 4), ((3, 2), "int64")], {"dim": 1}),
    ("index_select", [(5, 4), ((2, 3), "int64")], {"dim": 0}), ("embedding", [(10, 4), ((2, 3), "int64")], {}),
    ("pad", [(2, 3)], {"pads": (1, 2), "value": 0.5}), ("tril", [(4, 4)], {}),
    ("arange", [], {"start": 0, "end": 5}), ("full", [], {"shape": (2, 3), "value": 1.5}),
    ("cumsum", [(3, 4)], {"dim": 1}), ("topk", [(3, 6)], {"k": 2}),
]


def _make(spec, rng):
    if spec is None:
        return None
    shape, dtype = spec if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str) else (spec, F32)
    if dtype == "bool":
        return torch.rand(shape, generator=rng) > 0.5
    if dtype == "int64":
        return torch.randint(0, 2, shape, generator=rng)
    return torch.rand(shape, generator=rng) + 0.5  # positive: log/rsqrt/pow stay finite


@pytest.mark.parametrize("op,shapes,attrs", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_inference_matches_reference(op, shapes, attrs, rng):
    xs = [_make(s, rng) for s in shapes]
    outs = ops.get(op).run(xs, attrs)
    inferred = ops.infer_types(op, [None if x is None else TensorType.of(x) for x in xs], attrs)
    assert inferred == [TensorType.of(o) for o in outs]
    assert all(torch.isfinite(o.float()).all() for o in outs)


def test_every_op_is_declared_properly():
    for name, spec in ops.all_ops().items():
        assert spec.name == name and isinstance(spec.kind, ops.OpKind) and callable(spec.ref)


def test_unknown_op_and_bad_shapes_are_named():
    with pytest.raises(ops.UnsupportedOpError, match="'frobnicate'"):
        ops.get("frobnicate")
    with pytest.raises(ops.InferenceError, match="node 'mm'"):
        ops.infer_types("matmul", [TensorType((2, 3), F32), TensorType((4, 5), F32)], {}, node="mm")


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_a_norm_of_a_0d_tensor_is_refused_by_name(op):
    """torch refuses a norm of a 0-d input (an empty normalized shape); ours says so too, where the graph is typed,
    instead of dividing by its rank (ZeroDivisionError); the reference itself refuses the same."""
    with pytest.raises(ops.InferenceError, match=f"{op}: the input is 0-d"):
        ops.infer_types(op, [TensorType((), F32)], {"eps": 1e-6}, node="n")
    with pytest.raises(ValueError, match="0-d"):
        ops.get(op).ref(torch.tensor(2.0))
    with pytest.raises(RuntimeError, match="at least 1-dimensional"):
        F.rms_norm(torch.tensor(2.0), ()) if op == "rms_norm" else F.layer_norm(torch.tensor(2.0), ())


def test_symbolic_dims_survive():
    t = ops.infer_types("reshape", [TensorType(("b", "s", 8), F32)], {"shape": (-1, 8)})
    assert t == [TensorType(("s*b", 8), F32)] or t == [TensorType(("b*s", 8), F32)]
    t = ops.infer_types("softmax", [TensorType(("b", 8), "float16")], {"dim": -1})
    assert t == [TensorType(("b", 8), "float16")]


def test_references_against_formulas(rng):
    x = torch.randn(2, 3, 8, generator=rng)
    w = torch.randn(8, generator=rng)
    rms = ops.get("rms_norm").ref(x, w, eps=1e-6)
    torch.testing.assert_close(rms, x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    # grouped-query sdpa == repeating the KV heads by hand
    q, k, v = (torch.randn(1, 4, 5, 8, generator=rng), torch.randn(1, 2, 5, 8, generator=rng),
               torch.randn(1, 2, 5, 8, generator=rng))
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(ops.get("sdpa").ref(q, k, v, is_causal=True), ref)
    # rotary: the HF rotate_half form
    cos, sin = torch.randn(5, 8, generator=rng), torch.randn(5, 8, generator=rng)
    rot = torch.cat((-q[..., 4:], q[..., :4]), -1)
    torch.testing.assert_close(ops.get("rotary_embedding").ref(q, cos, sin), q * cos + rot * sin)
    g = ops.get("gelu").ref(x, approximate="none")
    torch.testing.assert_close(g, 0.5 * x * (1 + torch.erf(x / math.sqrt(2))))


def test_meta_inference_answers_are_kept_per_question():
    """Repeated layers ask type inference the same question: the second answer comes from the cache, equal to the
    first, and a caller changing its list does not change the next answer; a bad question still raises."""
    from tilefuse.ops import registry

    t = TensorType((3, 5, 7), "float32")
    args = ("softmax", [t], {"dim": -1})
    first = registry.infer_types(*args)
    first.append("scribbled")
    assert registry._meta_key(*args) in registry._META_CACHE
    assert registry.infer_types(*args) == [t]
    assert registry._meta_key("x", [t], {"w": torch.zeros(2)}) is None  # tensors in attributes: not cached
    with pytest.raises(registry.InferenceError):
        registry.infer_types("matmul", [t, TensorType((4, 4), "float32")], {})

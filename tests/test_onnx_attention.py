"""ONNX ``Attention`` (opset 23 on) imported as one sdpa (``frontends.onnx_attention``): what torch.onnx.export writes
for ``scaled_dot_product_attention`` at opset 23, and hand-written nodes with a softcap, boolean and additive masks,
causal, grouped-query 3-D operands; every element against onnxruntime, NaN included. What the converter does not
take (a past cache, the ``qk_matmul_output`` output) is expanded through the op's ONNX function as before."""

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper

from tilefuse.frontends.onnx import import_onnx
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

C = {"kind": "c"}
S4 = ((2, 4, 9, 16), (2, 2, 11, 16), (2, 2, 11, 16))  # grouped-query heads, more keys than queries


def _model(path, attrs: dict, shapes, out_shape, mask=None, outputs=(), extra=()) -> list[str]:
    """An opset-23 model of one Attention node over inputs Q, K, V (and M, then ``extra``: (name, shape)), with output
    Y and ``outputs`` (name, shape) after it; returns the input names."""
    names = ["Q", "K", "V"] + (["M"] if mask is not None else [])
    vi = helper.make_tensor_value_info
    inputs = [vi(n, TensorProto.FLOAT, list(s)) for n, s in zip("QKV", shapes)]
    if mask is not None:
        kind = TensorProto.BOOL if mask.dtype == torch.bool else TensorProto.FLOAT
        inputs.append(vi("M", kind, list(mask.shape)))
    inputs += [vi(n, TensorProto.FLOAT, list(s)) for n, s in extra]
    node_inputs = names + ([""] if mask is None and extra else []) + [n for n, _ in extra]
    node = helper.make_node("Attention", node_inputs, ["Y", *(n for n, _ in outputs)], **attrs)
    outs = [vi(n, TensorProto.FLOAT, list(s)) for n, s in (("Y", out_shape), *outputs)]
    graph = helper.make_graph([node], "attention", inputs, outs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), str(path))
    return names + [n for n, _ in extra]


def _against_ort(path, names, args, p):
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        ["Y"], {n: a.numpy() for n, a in zip(names, args)})
    got = PlanRunner(p)(*args)[0]
    torch.testing.assert_close(got, torch.from_numpy(want), equal_nan=True, rtol=1e-5, atol=1e-5)


def _qkv(rng, shapes):
    q, k, v = (3 * torch.randn(s, generator=rng) for s in shapes)  # (scores past a cap of 0.5)
    q.view(-1, q.shape[-1])[1, 0] = float("nan")
    return [q, k, v]


def _keep(rng, shape):
    keep = torch.rand(shape, generator=rng) > 0.3
    keep[..., 0] = True
    keep.view(-1, shape[-2], shape[-1])[-1, 3] = False  # a row that sees no key: 0
    return keep


CASES = {  # name: (attrs, mask kind)
    "softcap": ({"softcap": 0.5}, None),
    "softcap_causal": ({"softcap": 0.5, "is_causal": 1}, None),
    "bool_mask_scale": ({"scale": 0.2}, "bool"),
    "float_mask_causal": ({"is_causal": 1}, "float"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_node_is_one_sdpa(name, tmp_path, rng):
    attrs, kind = CASES[name]
    mask = None if kind is None else _keep(rng, (2, 1, 9, 11)) if kind == "bool" else torch.randn(9, 11, generator=rng)
    path = tmp_path / "a.onnx"
    names = _model(path, attrs, S4, (2, 4, 9, 16), mask)
    p = plan(import_onnx(path), C)
    sdpa = [n for n in p.graph.nodes if n.op == "sdpa"]
    # (a boolean mask: the additive one the kernel takes, 0 or -inf, made by an elementwise where)
    want = ["elementwise", "attention"] if kind == "bool" else ["attention"]
    assert len(sdpa) == 1 and [r.kind for r in p.regions] == want, p.to_text()
    assert all(r.backend == "tilelang" for r in p.regions)
    a = sdpa[0].attr
    assert a["is_causal"] == bool(attrs.get("is_causal")) and a.get("softcap") == attrs.get("softcap"), a
    assert a.get("scale") == (pytest.approx(attrs["scale"]) if "scale" in attrs else None)
    for _ in range(2):
        args = _qkv(rng, S4) + ([mask] if mask is not None else [])
        _against_ort(path, names, args, p)


def test_three_d_grouped_operands(tmp_path, rng):
    """(batch, seq, heads x size) operands with ``q_num_heads`` and ``kv_num_heads``: the head split and merge are
    views around the one sdpa."""
    shapes = ((2, 9, 64), (2, 11, 32), (2, 11, 32))
    path = tmp_path / "a3.onnx"
    names = _model(path, {"q_num_heads": 4, "kv_num_heads": 2, "softcap": 1.0}, shapes, (2, 9, 64))
    p = plan(import_onnx(path), C)
    assert [n.op for n in p.graph.nodes].count("sdpa") == 1
    assert [r.kind for r in p.regions if r.backend == "tilelang"] == ["attention"], p.to_text()
    _against_ort(path, names, _qkv(rng, shapes), p)


def test_torch_export_at_opset_23_is_one_sdpa(tmp_path, rng):
    """torch.onnx.export writes ``scaled_dot_product_attention`` as one Attention node at opset 23; its function
    body was imported before (the (q, kv) causal mask and the scores written out)."""
    class Attend(torch.nn.Module):
        def forward(self, q, k, v, m):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m) + \
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, m = torch.randn(2, 4, 9, 16), torch.randn(2, 1, 9, 9)
    path = tmp_path / "t.onnx"
    torch.onnx.export(Attend(), (q, q, q, m), str(path), dynamo=True, opset_version=23)
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count("Attention") == 2
    p = plan(import_onnx(path), C)
    assert [r.kind for r in p.regions].count("attention") == 2, p.to_text()
    assert sorted(n.attr["is_causal"] for n in p.graph.nodes if n.op == "sdpa") == [False, True]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for _ in range(2):
        args = [torch.randn(2, 4, 9, 16, generator=rng) for _ in range(3)] + [torch.randn(2, 1, 9, 9, generator=rng)]
        (want,) = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
        (got,) = PlanRunner(p)(*args)
        torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-5, atol=1e-5)


def test_what_the_converter_does_not_take_runs_the_function_body(tmp_path, rng):
    """A past cache (and its present outputs): the node is expanded through its ONNX function (no sdpa of the
    converter), and computes what onnxruntime does."""
    shapes = ((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8))
    path = tmp_path / "past.onnx"
    extra = (("PK", (1, 2, 5, 8)), ("PV", (1, 2, 5, 8)))
    names = _model(path, {"is_causal": 1}, shapes, (1, 2, 3, 8), extra=extra,
                   outputs=(("present_key", (1, 2, 8, 8)), ("present_value", (1, 2, 8, 8))))
    g = import_onnx(path)
    assert "sdpa" not in {n.op for n in g.nodes}
    args = [torch.randn(s, generator=rng) for s in (*shapes, (1, 2, 5, 8), (1, 2, 5, 8))]
    _against_ort(path, names, args, plan(g, C))

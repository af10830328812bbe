"""The model zoo: tiny builds run eagerly, behave like the models they imitate, and export to ONNX.

ONNX files are checked with onnx.checker and run with onnxruntime against torch eager in fp32.
Bench sizes are only ever built on the meta device here (no memory, no compute).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from tilefuse.models import ZOO, build, example_inputs, export_onnx, input_names, output_names

ort = pytest.importorskip("onnxruntime")

NAMES = ["mlp", "gpt2", "llama", "bert", "resnet", "vit"]


def expected_shape(name: str, size: str, batch: int | None = None) -> tuple[int, ...]:
    """The output shape a zoo model should produce, from its config and input shape."""
    config, shape = ZOO[name].sizes[size], ZOO[name].shapes[size]
    b = batch if batch is not None else shape.get("batch")
    if name == "mlp":
        return (batch or shape["tokens"], config["dim"])
    if name in ("gpt2", "llama"):
        return (b, shape["seq"], config["vocab"])
    if name == "bert":
        return (b, shape["seq"], config["dim"])
    return (b, config["classes"])


def run_onnx(path: str, name: str, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == input_names(name)
    assert [o.name for o in session.get_outputs()] == output_names(name)
    return session.run(None, {n: t.numpy() for n, t in zip(input_names(name), inputs)})[0]


def test_zoo_names_and_signatures():
    assert list(ZOO) == NAMES
    for name in NAMES:
        inputs = example_inputs(name)
        assert len(inputs) == len(input_names(name))
        assert len(output_names(name)) == 1
        assert set(ZOO[name].sizes) == set(ZOO[name].shapes) == {"tiny", "small", "bench"}


def test_unknown_name_or_size_is_reported():
    with pytest.raises(KeyError, match="unknown zoo model 'gpt3'"):
        build("gpt3")
    with pytest.raises(KeyError, match="no size 'huge'"):
        example_inputs("gpt2", "huge")


@pytest.mark.parametrize("name", NAMES)
def test_tiny_eager_shapes_and_finiteness(name):
    model, inputs = build(name)
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == torch.float32
    assert tuple(out.shape) == expected_shape(name, "tiny")
    assert torch.isfinite(out).all()
    assert out.std() > 1e-3  # the model does not collapse to a constant
    for t in inputs:
        if t.is_floating_point():
            assert t.dtype == torch.float32 and t.abs().sum() > 0
        else:
            assert t.dtype == torch.int64


@pytest.mark.parametrize("name", NAMES)
def test_tiny_runs_in_bfloat16(name):
    model, inputs = build(name, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_build_is_deterministic_per_seed():
    (m1, x1), (m2, x2), (m3, _) = build("llama", seed=3), build("llama", seed=3), build("llama", seed=4)
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not all(torch.equal(s1[k], s3[k]) for k in s1)
    assert all(torch.equal(a, b) for a, b in zip(x1, x2))


def test_example_inputs_are_fresh_and_valid():
    a, b = example_inputs("vit"), example_inputs("vit")
    assert not torch.equal(a[0], b[0])
    assert torch.equal(example_inputs("vit", seed=5)[0], example_inputs("vit", seed=5)[0])
    ids, mask = example_inputs("bert", "small", seed=0)
    assert ids.min() >= 0 and ids.max() < ZOO["bert"].sizes["small"]["vocab"]
    assert mask.dtype == torch.int64 and mask[0].all() and (mask[:, 0] == 1).all()


def test_norms_are_not_identities():
    model, _ = build("resnet")
    bn = model.stem[0][1]
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
    model, _ = build("llama")
    assert not torch.allclose(model.norm.weight, torch.ones_like(model.norm.weight))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoders_are_causal(name):
    model, (ids,) = build(name)
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 1) % ZOO[name].sizes["tiny"]["vocab"]
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :-1], after[:, :-1])
    assert not torch.allclose(before[:, -1], after[:, -1])


def test_bert_ignores_padding():
    model, (ids, mask) = build("bert")
    mask[1, 10:] = 0
    changed = ids.clone()
    changed[1, 10:] = (ids[1, 10:] + 1) % ZOO["bert"].sizes["tiny"]["vocab"]
    with torch.no_grad():
        before, after = model(ids, mask), model(changed, mask)
    torch.testing.assert_close(before[1, :10], after[1, :10])
    torch.testing.assert_close(before[0], after[0])


def test_bench_configs_on_meta():
    """Bench configs have the reference models' exact parameter counts (built on meta: no memory used)."""
    expected = {
        "mlp": 134_246_400,  # d=4096, hidden 16384
        "gpt2": 124_439_808,  # HF gpt2 (tied head)
        "llama": 1_104_218_112,  # Llama-3.2-1B layout with a 32k vocabulary, untied head
        "bert": 108_891_648,  # HF bert-base-uncased without the pooler
        "resnet": 25_557_032,  # torchvision resnet50
        "vit": 86_567_656,  # timm vit_base_patch16_224
    }
    for name, spec in ZOO.items():
        with torch.device("meta"):
            model = spec.builder(**spec.sizes["bench"])
        assert sum(p.numel() for p in model.parameters()) == expected[name], name
    llama = ZOO["llama"].sizes["bench"]
    assert llama["n_heads"] > llama["n_kv_heads"]
    assert ZOO["vit"].sizes["bench"]["image"] == ZOO["vit"].shapes["bench"]["image"]


@pytest.mark.parametrize("name", NAMES)
def test_onnx_export_matches_eager(name, tmp_path):
    path = export_onnx(name, tmp_path / f"{name}.onnx")
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [18]
    assert not list(tmp_path.glob("*.data"))  # weights embedded: a single file
    model, inputs = build(name)
    with torch.no_grad():
        ref = model(*inputs)
    torch.testing.assert_close(torch.from_numpy(run_onnx(path, name, inputs)), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_onnx_dynamic_batch(name, tmp_path):
    path = export_onnx(name, tmp_path / f"{name}.onnx", dynamic_batch=True)
    graph = onnx.load(path).graph
    for value in [*graph.input, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param == "batch" and all(d.dim_value > 0 for d in dims[1:])
    model, _ = build(name)
    inputs = tuple(torch.cat([t, t[:1]]) for t in example_inputs(name, seed=11))  # a batch the export never saw
    with torch.no_grad():
        ref = model(*inputs)
    out = run_onnx(path, name, inputs)
    assert out.shape[0] == inputs[0].shape[0]
    torch.testing.assert_close(torch.from_numpy(out), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "resnet"])
def test_onnx_older_opset_through_torchscript_exporter(name, tmp_path):
    path = export_onnx(name, tmp_path / f"{name}.onnx", opset=17, dynamic_batch=True)
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert [d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim[1:]] == list(
        expected_shape(name, "tiny")[1:]
    )
    model, inputs = build(name)
    with torch.no_grad():
        ref = model(*inputs)
    torch.testing.assert_close(torch.from_numpy(run_onnx(path, name, inputs)), ref, rtol=1e-4, atol=1e-4)


def test_export_rejects_opset_out_of_range(tmp_path):
    with pytest.raises(ValueError, match="opset 12"):
        export_onnx("mlp", tmp_path / "mlp.onnx", opset=12)

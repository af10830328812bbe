"""Graphs with symbolic dims: specialized per input shape, compiled, cached, checked."""

import pytest
import torch

import tilefuse
from tilefuse import models
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.specialize import bind_dims, specialize


def _graph():
    b = GraphBuilder("sym")
    x = b.input("x", TensorType(("batch", 8), "float32"))
    y = b.input("y", TensorType(("batch", 8), "float32"))
    h = b.add1("linear", [x, b.constant("w", torch.randn(4, 8)), ""])
    return b.build([b.add1("relu", [b.add1("add", [h, b.add1("slice", [y], dim=1, start=0, end=4)])])])


def test_specialize_binds_and_infers():
    g = specialize(_graph(), [(3, 8), (3, 8)])
    assert all(v.type.is_static for n in g.nodes for v in n.outputs)
    assert str(g.output_values()[0].type) == "float32[3x4]"
    with pytest.raises(ValueError, match="dim 'batch' is 3 in one input and 5 in 'y'"):
        bind_dims(_graph(), [(3, 8), (5, 8)])
    with pytest.raises(ValueError, match="input 'x' has shape"):
        bind_dims(_graph(), [(3, 9), (3, 8)])


def test_dynamic_batch_onnx_runs_every_batch_through_kernels(tmp_path, rng):
    ort = pytest.importorskip("onnxruntime")
    path = models.export_onnx("mlp", tmp_path / "mlp.onnx", dynamic_batch=True)
    m = tilefuse.compile_onnx(path, target="c")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (5, 9, 5):
        x = torch.randn(batch, 64, generator=rng)
        (y,) = m(x)
        torch.testing.assert_close(y, torch.from_numpy(sess.run(None, {"x": x.numpy()})[0]), rtol=1e-5, atol=1e-5)
        assert all(r.backend == "tilelang" for r in m.plan.regions if r.launches)
    assert len(m._specialized) == 2  # 5 and 9, each compiled once
    with pytest.raises(ValueError, match="input 'x'"):
        m(torch.randn(3, 65))

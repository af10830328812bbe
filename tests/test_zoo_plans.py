"""Every zoo model's plan, through torch.compile capture and through ONNX: printed, counted, checked.

The structural bar: on the GPT-2 and LLaMA models the plan has at most half as many kernels as the
graph has compute nodes; every attention block is one attention region; every norm with its
residual add is one region; every linear with its bias and activation is one gemm region.
"""

import pytest
import torch

from tilefuse import models
from tilefuse.capture import capture_graphs
from tilefuse.pipeline import plan
from tilefuse.runtime.plan_runner import PlanRunner

LAYERS = 2  # every tiny zoo transformer has two blocks
# (kernels at most, attention regions, norm regions holding a residual add) per zoo model, tiny size;
# resnet: 17 conv regions, the stem's max pool, the head's mean and linear, the image's NHWC transpose and the three
# downsampling shortcuts' strided slices (each 1x1 strided convolution is its slice and a GEMM: planner.layout)
EXPECT = {"gpt2": (17, LAYERS, 2 * LAYERS), "llama": (29, LAYERS, 2 * LAYERS), "bert": (21, LAYERS, 2 * LAYERS),
          "vit": (19, LAYERS, 2 * LAYERS), "mlp": (3, 0, 0), "resnet": (24, 0, 0)}


def _check(name, p, source):
    print(f"\n[{source}] {p.to_text(reasons=False)}")
    kmax, n_attn, n_res_norm = EXPECT[name]
    kinds = [r.kind for r in p.regions if r.launches]
    assert p.kernels <= kmax, p.summary()
    assert kinds.count("attention") == n_attn
    res_norms = [r for r in p.regions if r.kind == "reduction" and "add" in r.ops
                 and ({"layer_norm", "rms_norm"} & set(r.ops))]
    assert len(res_norms) >= n_res_norm
    for r in p.regions:  # a linear's activation sits in the linear's region
        if r.kind == "gemm" and "linear" in r.ops and {"gelu", "silu", "relu"} & set(r.ops):
            assert r.ops.index("linear") < min(r.ops.index(a) for a in ("gelu", "silu", "relu") if a in r.ops)
    if name in ("gpt2", "llama"):
        assert 2 * p.kernels <= p.source_nodes, p.summary()


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_zoo_plan_via_torch_compile(name):
    model, inputs = models.build(name, "tiny")
    graphs = capture_graphs(model, inputs)
    assert len(graphs) == 1
    p = plan(graphs[0])
    _check(name, p, "torch.compile")


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_zoo_plan_via_onnx(name, tmp_path, rng):
    ort = pytest.importorskip("onnxruntime")
    from tilefuse.frontends.onnx import import_onnx

    path = models.export_onnx(name, tmp_path / f"{name}.onnx", "tiny")
    p = plan(import_onnx(path))
    _check(name, p, "onnx")
    # The plan runs region by region and matches onnxruntime on fresh inputs.
    inputs = models.example_inputs(name, "tiny")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {n: t.numpy() for n, t in zip(models.input_names(name), inputs)})
    outs = PlanRunner(p)(*inputs)
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o, torch.from_numpy(r), rtol=1e-4, atol=1e-4)

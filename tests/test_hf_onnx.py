"""Hugging Face transformers models exported with torch.onnx.export, imported by tilefuse, run through
their fusion plan, compared with onnxruntime (small configs, random weights, no network)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from tilefuse.frontends.onnx import import_onnx
from tilefuse.models.hf import MainOutput, build_hf
from tilefuse.planner import plan
from tilefuse.runtime.plan_runner import PlanRunner


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_onnx_matches_onnxruntime(name, tmp_path, rng):
    torch.manual_seed(0)
    model = MainOutput(build_hf(name))
    ids = torch.randint(0, 100, (2, 13), generator=rng)
    mask = torch.ones(2, 13, dtype=torch.int64)
    mask[1, 9:] = 0  # a padded sequence
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, (ids, mask), str(path), input_names=["ids", "mask"], output_names=["out"], dynamo=True)
    graph = import_onnx(path)
    p = plan(graph)
    print(p.summary())
    assert [r.kind for r in p.regions].count("attention") == 2  # the decomposed export is one region again
    if name in ("gpt2", "llama"):
        assert 2 * p.kernels <= p.source_nodes
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fresh = torch.randint(0, 100, (2, 13), generator=rng)
    (want,) = sess.run(None, {"ids": fresh.numpy(), "mask": mask.numpy()})
    (got,) = PlanRunner(p)(fresh, mask)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-4, atol=1e-4)

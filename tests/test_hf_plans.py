"""Plans of Hugging Face transformers models (small configs, random weights, no network)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tilefuse.frontends.capture import capture_graphs
from tilefuse.models.hf import MainOutput, build_hf
from tilefuse.planner import plan


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

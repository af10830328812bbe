"""Graph IR: construction, verification, printing, networkx view."""

import pytest
import torch

from tilefuse.ir import Graph, GraphError, Node, TensorType, Value
from tilefuse.ops import GraphBuilder
from tilefuse.ops.reference import Executor


def _mlp_graph():
    b = GraphBuilder("mlp")
    x = b.input("x", TensorType(("n", 8), "float32"))
    w = b.constant("w", torch.randn(16, 8))
    h = b.add1("linear", [x, w, ""])
    y = b.add1("gelu", [h], approximate="tanh")
    return b.build([y])


def test_builder_infers_symbolic_types():
    g = _mlp_graph()
    assert [str(o.type) for o in g.output_values()] == ["float32[nx16]"]
    assert g.op_counts() == {"linear": 1, "gelu": 1}


def test_print_is_stable():
    a, b = str(_mlp_graph()), str(_mlp_graph())
    assert a == b
    assert "gelu(%linear, approximate='tanh')" in a
    assert a.splitlines()[0] == "graph mlp(%x: float32[nx8]) {"


def test_verify_rejects_use_before_def():
    t = TensorType((2,), "float32")
    n = Node("n0", "relu", ("missing",), (Value("y", t),))
    with pytest.raises(GraphError, match="reads 'missing' before it is defined"):
        Graph("g", (Value("x", t),), ("y",), (n,)).verify()


def test_verify_rejects_double_definition():
    t = TensorType((2,), "float32")
    nodes = (Node("a", "relu", ("x",), (Value("y", t),)), Node("b", "relu", ("x",), (Value("y", t),)))
    with pytest.raises(GraphError, match="defined twice"):
        Graph("g", (Value("x", t),), ("y",), nodes).verify()


def test_networkx_view_and_executor(rng):
    g = _mlp_graph()
    nxg = g.to_networkx()
    assert list(nxg.edges) == [("linear", "gelu")]
    x = torch.randn(5, 8, generator=rng)
    (y,) = Executor(g)(x)
    ref = torch.nn.functional.gelu(x @ g.constants["w"].T, approximate="tanh")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_executor_checks_inputs(rng):
    g = _mlp_graph()
    with pytest.raises(ValueError, match="input 'x' has shape"):
        Executor(g)(torch.randn(5, 9, generator=rng))
    with pytest.raises(ValueError, match="dtype"):
        Executor(g)(torch.randn(5, 8, generator=rng).double())
    with pytest.raises(ValueError, match="expected 1 inputs"):
        Executor(g)()

"""The graph builder's type inference: ``tilefuse.ir`` knows no ops, so its builder infers only what it is handed."""

import pytest

from tilefuse import ir, ops
from tilefuse.ir import TensorType


def test_ir_builder_without_inference_refuses_to_guess_a_type():
    b = ir.GraphBuilder("plain")
    x = b.input("x", TensorType((2, 3), "float32"))
    with pytest.raises(RuntimeError, match=r"'plain' has no type inference for relu .*tilefuse\.ops\.GraphBuilder"):
        b.add1("relu", [x])
    y = b.add1("relu", [x], out_types=[TensorType((2, 3), "float32")])  # given types need no inference
    assert str(b.build([y]).nodes[0].outputs[0].type) == "float32[2x3]"


def test_ops_builder_infers_through_the_registry():
    b = ops.GraphBuilder("typed")
    x = b.input("x", TensorType((2, 3), "float16"))
    y = b.add1("sum", [x], dims=(1,), keepdim=False)
    assert b.types[y] == TensorType((2,), "float16")
    assert b.infer is ops.infer_types

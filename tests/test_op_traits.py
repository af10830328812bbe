"""Op traits: the facts passes ask about an op live on its registry entry; the groups they use are read off it.

The literal sets below are the hand-kept lists the traits replaced (planner, lowering and frontends); a new op
with one of these traits adds itself to a group by its registry entry, and this test then says which group grew.
"""

import pytest

from tilefuse import ops
from tilefuse.lowering.expr import FLOAT_ONLY
from tilefuse.planner.layout import AXIS_OPS, POOLS
from tilefuse.planner.legality import EPILOGUE_OPS, LAYOUT_OPS, NORM_OPS, SPLIT_OPS
from tilefuse.planner.plan import VIEW_OPS

VIEWS = {"reshape", "squeeze", "unsqueeze", "flatten", "identity", "dropout", "expand"}
EXPECTED = {
    "view": VIEWS,
    "may_alias": {"identity", "reshape", "permute", "transpose", "expand", "slice", "squeeze", "unsqueeze", "flatten",
                  "split", "cast", "dropout"},
    "permute": {"permute", "transpose"},
    "slicing": {"split", "slice"},
    "norm": {"layer_norm", "rms_norm"},
    "pool": {"max_pool", "avg_pool", "adaptive_avg_pool"},
    "axis": {"rotary_embedding", "quantize_linear", "dequantize_linear", "bitcast", "batch_norm"},
    "epilogue": {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "neg", "abs", "reciprocal", "relu", "gelu",
                 "silu", "sigmoid", "tanh", "erf", "exp", "log", "sqrt", "rsqrt", "clamp", "where", "eq", "ne", "lt",
                 "le", "gt", "ge", "cast", "leaky_relu", "softplus", "sin", "cos", "scale", "identity", "dropout",
                 "batch_norm", "erfinv"},  # (erfinv: fused since the new-op check of issue #12)
    "float_only": {"scale", "reciprocal", "relu", "leaky_relu", "elu", "gelu", "silu", "sigmoid", "hardsigmoid",
                   "hardswish", "softplus", "mish", "softsign", "clamp", "tanh", "erf", "exp", "log", "sqrt", "rsqrt",
                   "sin", "cos", "tan", "floor", "ceil", "sign", "div", "pow", "erfinv"},
    "fold_dynamic": {"range_dynamic", "nonzero", "slice_dynamic", "reshape_dynamic", "squeeze_dynamic",
                     "unsqueeze_dynamic", "shape_of", "numel", "compress", "split_dynamic", "topk_dynamic",
                     "reduce_dynamic"},
    "collective": {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "rank_broadcast", "all_to_all_single",
                   "wait_tensor", "collective_fallback"},
    "in_place": {"index_copy"},
}


@pytest.mark.parametrize("trait", sorted(EXPECTED))
def test_each_trait_names_the_ops_it_did_by_hand(trait):
    assert ops.with_trait(trait) == EXPECTED[trait]


def test_the_groups_the_passes_use_are_read_off_the_traits():
    assert VIEW_OPS == VIEWS
    assert LAYOUT_OPS == {"permute", "transpose"} | VIEWS
    assert (EPILOGUE_OPS, SPLIT_OPS, NORM_OPS) == (EXPECTED["epilogue"], EXPECTED["slicing"], EXPECTED["norm"])
    assert (POOLS, AXIS_OPS, FLOAT_ONLY) == (EXPECTED["pool"], EXPECTED["axis"], EXPECTED["float_only"])
    assert ops.POOL_OPS == EXPECTED["pool"] and ops.MAY_ALIAS == EXPECTED["may_alias"]
    assert ops.FOLD_DYNAMIC == EXPECTED["fold_dynamic"]
    assert ops.COLLECTIVES == EXPECTED["collective"]
    assert all(isinstance(s, frozenset) for s in (VIEW_OPS, LAYOUT_OPS, EPILOGUE_OPS, POOLS, ops.MAY_ALIAS,
                                                  ops.FOLD_DYNAMIC))


def test_every_trait_is_known_and_a_fused_op_has_an_emitter():
    from tilefuse.lowering.expr import ops_supported

    assert set(EXPECTED) == set(ops.TRAITS)
    for spec in ops.all_ops().values():
        assert spec.traits <= ops.TRAITS.keys(), spec.name
    # an op a GEMM epilogue takes, or one widened before its emitter runs, has an emitter (the builders
    # pass dropout, a view, through and write batch_norm as arithmetic)
    assert (EXPECTED["epilogue"] - {"dropout", "batch_norm"}) | EXPECTED["float_only"] <= ops_supported()
    with pytest.raises(ValueError, match="unknown trait"):
        ops.with_trait("fast")
    with pytest.raises(ValueError, match="unknown traits"):
        ops.register("not_an_op", ops.OpKind.ELEMENTWISE, traits=("fast",))

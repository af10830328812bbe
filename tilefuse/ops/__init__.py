"""The op registry (one source of truth per op) and the declarations that fill it.

``tilefuse.ops.get("gelu")`` gives the ``OpSpec``: fusion kind, type inference, torch reference, traits
(``with_trait("view")``: the ops that only change metadata).
Declarations live in modules by meaning (pointwise math, tensor manipulation, neural-net ops, and the
ONNX-only ops in ``onnx_*``); importing this package registers them all.
"""

from tilefuse.ops import (  # noqa: F401  (registers the ops)
    collective,
    fallback,
    nn,
    onnx_image,
    onnx_index,
    onnx_layers,
    onnx_math,
    onnx_quant,
    onnx_shape,
    onnx_signal,
    pointwise,
    tensor,
)
from tilefuse.ops.registry import (  # noqa: F401
    FUSIBLE_POINTWISE,
    TRAITS,
    GraphBuilder,
    InferenceError,
    OpKind,
    OpSpec,
    UnsupportedOpError,
    all_ops,
    get,
    has,
    infer_types,
    register,
    with_trait,
)

# Op groups read off the traits (``TRAITS``), for the passes outside the planner that ask them.
MAY_ALIAS = with_trait("may_alias")  # the frontends copy a graph output that may share an input's storage
POOL_OPS = with_trait("pool")
FOLD_DYNAMIC = with_trait("fold_dynamic")  # the ONNX importer folds them on constant inputs
COLLECTIVES = with_trait("collective")  # side effects of every rank: alone, in program order (planner.partition)

"""The op registry (one source of truth per op) and the declarations that fill it.

``tilefuse.ops.get("gelu")`` gives the ``OpSpec``: fusion kind, type inference, torch reference.
Declarations live in modules by meaning (pointwise math, tensor manipulation, neural-net ops);
importing this package registers them all.
"""

from tilefuse.ops import fallback, nn, onnx_extra, onnx_more, onnx_seq, pointwise, tensor  # noqa: F401  (registers the ops)
from tilefuse.ops.registry import (  # noqa: F401
    FUSIBLE_POINTWISE,
    InferenceError,
    OpKind,
    OpSpec,
    UnsupportedOpError,
    all_ops,
    get,
    has,
    infer_types,
    register,
)

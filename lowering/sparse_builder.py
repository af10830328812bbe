"""The ``gemm_sp`` region builder: a ``sparse_linear`` region -> one ``gemm_sp`` template instance.

``dispatch.build`` calls it for regions of kind ``gemm_sp`` (see ``lowering.dispatch`` for the model and
``tilefuse.ops.sparse_layout`` for the compressed weight layout).
"""

from __future__ import annotations

from tilefuse.ir import Node
from tilefuse.lowering.builders import (
    PASS_VIEWS,
    Builder,
    KernelSpec,
    check_dtypes,
    domain_shape,
    epilogue_exprs,
    numel,
    require,
)
from tilefuse.lowering.expr import Acc
from tilefuse.ops.sparse_layout import SPARSE_DTYPES


def build_gemm_sp(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """A ``sparse_linear`` region (its input, the compressed weight, bias and elementwise epilogue) as
    one ``gemm_sp`` kernel: ``y = epilogue(x @ W^T)`` with W read as values + metadata."""
    require(anchor.op == "sparse_linear", f"no sparse GEMM template for {anchor.op}")
    require(target.get("kind") == "cuda", f"the {target.get('kind')} target has no gemm_sp (2:4 sparse tensor "
             "cores); the sparse_linear runs through torch on the decompressed weight")
    pos = b.members.index(anchor)
    require(all(n.op in PASS_VIEWS for n in b.members[:pos]), "the gemm_sp template reads its input as is (views "
             "only, no prologue)")
    x, values, meta, *rest = anchor.inputs
    bias = rest[0] if rest and rest[0] else None
    dense = rest[1] if len(rest) > 1 and rest[1] else None  # the dense form (the measured choice's), not read here
    require(values not in b.produced and meta not in b.produced, "the compressed weight is computed in the region")
    by_out = {v.name: n for n in b.members for v in n.outputs}
    while x in b.produced:  # views of the input: the kernel reads the outside value as (M, K)
        x = by_out[x].inputs[0]
    xt, vt = b.types[x], b.types[values]
    K = int(anchor.attr["in_features"])
    N = int(vt.shape[0])
    require(tuple(xt.shape[-1:]) == (K,), f"input {xt} does not end in K={K}")
    M = numel(xt.shape[:-1])
    require(xt.dtype == vt.dtype and vt.dtype in SPARSE_DTYPES, f"gemm_sp multiplies fp16/bf16 operands of one "
             f"dtype, not {xt.dtype} x {vt.dtype}")
    exprs, mapping = epilogue_exprs(b, anchor, bias, b.members[pos + 1:], "gemm_sp")
    extra = [a for a in b.args if a not in (x, values, meta, dense)]
    extra_shapes = tuple(domain_shape(b.types[a], M, N) for a in extra)
    out_dtype = b.types[b.region.outputs[0]].dtype
    check_dtypes((out_dtype, *(b.types[a].dtype for a in extra)), target, "gemm_sp")
    params = {"M": M, "N": N, "K": K, "dtype": vt.dtype, "out_dtype": out_dtype,
              "epilogue": exprs[0] if exprs[0] != Acc() else None, "extra_shapes": extra_shapes,
              "extra_dtypes": tuple(b.types[a].dtype for a in extra),
              "meta_k_major": bool(anchor.attr.get("meta_k_major", False))}
    inputs = ((x, (M, K)), (values, None), (meta, None), *zip(extra, extra_shapes))
    return KernelSpec("gemm_sp", tuple(params.items()), (-1,), tuple(inputs), tuple(mapping), tuple(b.pre))

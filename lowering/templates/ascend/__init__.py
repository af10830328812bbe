"""Templates in TileLang's Ascend dialect (``tilelang.ascend.language``): AscendC source for the main region kinds.

Note: the builders (``lowering.builders``) make the same ``KernelSpec`` for every target; for ``{"kind": "ascend"}``
``lowering.dispatch`` hands it to ``ascend_spec``, which names the Ascend template that takes it (same factory
arguments) or says why none does: the region then runs through torch. Elementwise chains, row reductions and GEMMs
with an epilogue have Ascend templates; convolutions, pooling, attention and 2:4 sparse GEMMs do not yet.
"""

from __future__ import annotations

import dataclasses

from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.templates.ascend import elementwise, gemm, reduction
from tilefuse.lowering.templates.ascend.common import refusal

# Region kinds with an Ascend template (for some anchors: a pooling reduction, a convolution find none).
ASCEND_KINDS = frozenset({"elementwise", "reduction", "gemm"})
# KernelSpec.template for Ascend -> (its module: get_configs; its factory: the PrimFunc)
TEMPLATES = {"ascend_elementwise": (elementwise, elementwise.elementwise),
             "ascend_row_reduction": (reduction, reduction.row_reduction),
             "ascend_gemm": (gemm, gemm.gemm)}
# The template every target shares -> its Ascend counterpart, and why the spec may not fit it.
_COUNTERPART = {
    "elementwise": ("ascend_elementwise",
                    lambda kw: refusal((*kw["in_dtypes"], *kw["out_dtypes"]), "elementwise")),
    "row_reduction": ("ascend_row_reduction", lambda kw: reduction.why_not(
        kw["kind"], (kw["x_dtype"], kw.get("out_dtype"), kw.get("pre_dtype"), kw.get("weight_dtype"),
                     *kw.get("extra_dtypes", ())), (kw.get("producer"), kw.get("consumer")))),
    "gemm": ("ascend_gemm", lambda kw: gemm.why_not(**kw)),
}


def ascend_spec(spec: KernelSpec) -> KernelSpec | str:
    """``spec`` retargeted to its Ascend template (one already retargeted as it is), or the reason no Ascend template
    takes it."""
    if spec.template in TEMPLATES:
        return spec
    if spec.template not in _COUNTERPART:
        return f"no Ascend template for {spec.template} kernels yet; the region runs through torch"
    name, why_not = _COUNTERPART[spec.template]
    why = why_not(spec.factory_kwargs())
    if why:
        return f"{why}; the region runs through torch"
    return dataclasses.replace(spec, template=name)


def get_configs(spec: KernelSpec) -> list[dict]:
    """The tile configs an Ascend ``spec``'s template offers (the first is the default)."""
    return TEMPLATES[spec.template][0].get_configs()


def make_prim_func(spec: KernelSpec, config: dict | None = None):
    """The Ascend template's ``T.prim_func`` for ``spec`` (an ``ascend_spec`` result) with tile ``config``."""
    _, factory = TEMPLATES[spec.template]
    config = get_configs(spec)[0] if config is None else config
    return factory(**spec.factory_kwargs(), **config, target={"kind": "ascend"})

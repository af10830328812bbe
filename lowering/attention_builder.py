"""The builder of attention regions: an sdpa node, with the head split of q/k/v and the head merge of its output
around it, as one ``flash_attention`` spec (a decode step's split over the keys included)."""

from __future__ import annotations

from tilefuse.ir import Node
from tilefuse.lowering import attention_layout
from tilefuse.lowering.builders import PASS_VIEWS, TEMPLATE_DTYPES, Builder, KernelSpec, require
from tilefuse.lowering.templates import attention
from tilefuse.lowering.templates.common import broadcast_shapes

# Layout ops an attention region may hold around its sdpa: the head split of q/k/v and the head merge of
# the output become the kernel's operand layouts (``attention_layout``); any others run through torch
# before the kernel (views of the inputs) and after it (the output's layout).
ATTENTION_LAYOUTS = PASS_VIEWS | {"transpose", "permute", "split", "slice", "contiguous"}


def build_attention(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """The sdpa node as one ``flash_attention`` kernel. The head split of q, k, v and the head merge of
    the output become the kernel's operand layouts where they match (``lowering.attention_layout``:
    a fused QKV projection is read in place, the output written as (B, S, H*D)); the layout ops left
    run through torch before (views of the inputs) and after (the output's layout)."""
    pos = b.members.index(anchor)
    others = [n for n in b.members if n is not anchor]
    bad = sorted({n.op for n in others if n.op not in ATTENTION_LAYOUTS})
    require(not bad, f"the attention region holds {' '.join(bad)} besides layouts; only layouts run around sdpa")
    pre, post = b.members[:pos], b.members[pos + 1:]
    produced_pre = {v.name for n in pre for v in n.outputs}
    require(all(i in b.available or i in produced_pre for n in pre for i in n.inputs if i),
             "a layout before sdpa reads a value the region computes after it")
    q, k, v, *rest = anchor.inputs
    mask = rest[0] if rest and rest[0] else None
    qt, kt, vt = (b.types[x] for x in (q, k, v))
    require(len(qt.shape) == 4 and len(kt.shape) == 4 and kt.shape == vt.shape,
             f"sdpa on q {qt.shape}, k {kt.shape}, v {vt.shape}: the template takes (B, H, S, D) with equal k/v")
    B, Hq, Sq, D = qt.shape
    _, Hkv, Skv, Dk = kt.shape
    require(Dk == D and kt.shape[0] == B and Hq % Hkv == 0, f"sdpa shapes q {qt.shape}, k {kt.shape} do not pair")
    dtype = qt.dtype
    require(kt.dtype == dtype and vt.dtype == dtype, "q, k and v differ in dtype")
    if target.get("kind") == "c":
        require(dtype == "float32", f"attention on the c target computes float32, not {dtype}")
    else:
        require(dtype in ("float16", "bfloat16"), f"attention on GPUs takes fp16/bf16 (MMA), not {dtype}")
    params = {"B": B, "Hq": Hq, "Sq": Sq, "Skv": Skv, "D": D, "Hkv": Hkv,
              "is_causal": bool(anchor.attr.get("is_causal", False)), "scale": anchor.attr.get("scale"),
              "dtype": dtype}
    if anchor.attr.get("window"):  # only where set: specs (and cache keys) without a window stay as they were
        params["window"] = int(anchor.attr["window"])
    if anchor.attr.get("softcap") is not None:  # (likewise)
        params["softcap"] = float(anchor.attr["softcap"])
    producers = {o.name: n for n in pre for o in n.outputs}
    operands = [attention_layout.operand(x, B, s, producers, b.types) for x, s in ((q, Sq), (k, Skv), (v, Skv))]
    inputs = [(a.value, a.shape) for a in operands]
    # Layout keys only where a layout applies: contiguous (B, H, S, D) specs (and their cache keys) stay as they were.
    params.update({f"{name}_layout": a.layout for name, a in zip("qkv", operands) if a.layout is not None})
    if mask is not None:
        mt = b.types[mask]
        require(mt.dtype in TEMPLATE_DTYPES, f"an sdpa mask of {mt.dtype} (only additive float masks lower)")
        require(len(mt.shape) <= 4 and broadcast_shapes((B, Hq, Sq, Skv), mt.shape) == (B, Hq, Sq, Skv),
                 f"sdpa mask {mt.shape} does not broadcast to {(B, Hq, Sq, Skv)}")
        require(mask in b.available or mask in produced_pre, "the sdpa mask is computed inside the region")
        if target.get("kind") == "c":
            require(mt.dtype == "float32", f"an sdpa mask of {mt.dtype} on the c target")
        params.update(mask_shape=tuple(mt.shape), mask_dtype=mt.dtype)
        inputs.append((mask, None))
    out = anchor.outputs[0].name
    outputs = ((0, out, tuple(b.types[out].shape)),)
    if attention_layout.merged_output(out, post, b.region.outputs, b.types):
        params["o_layout"] = attention_layout.TokenRows(Hq * D, 0)
        outputs, post = tuple((0, o, tuple(b.types[o].shape)) for o in b.region.outputs), []
    reads = {x for x, _ in inputs} | {i for n in post for i in n.inputs if i} | set(b.region.outputs)
    pre = attention_layout.needed(pre, reads)
    out_idx = (-1,)
    parts = attention.decode_parts(target, Sq, Hq // Hkv, B, Hkv, Skv)
    if parts > 1:  # a decode step that splits its keys: room for the parts, which come out before O
        params["split_max"] = parts
        out_idx, outputs = (-3, -2, -1), tuple((2, o, shape) for _, o, shape in outputs)
    return KernelSpec("flash_attention", tuple(params.items()), out_idx, tuple(inputs), outputs,
                      tuple(n.name for n in pre), tuple(n.name for n in post))

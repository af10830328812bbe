"""Per-kind region builders: a region's nodes -> one template instance (``KernelSpec``).

See ``lowering.dispatch`` for the model (pre views, kernel, post reshapes; the (rows, cols) domain).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from tilefuse.ir import Graph, Node, TensorType
from tilefuse.lowering import index
from tilefuse.lowering.expr import Acc, Arg, Call, Const, Coord, Expr, Load, ops_supported, tree_size
from tilefuse.lowering.index import NotLowerable
from tilefuse.lowering.templates import gemv, reduction
from tilefuse.lowering.templates.common import broadcast_shapes, check_dtype, dialect
from tilefuse.ops import POOL_OPS
from tilefuse.ops import get as get_op
from tilefuse.planner.plan import VIEW_OPS, Region

PASS_VIEWS = VIEW_OPS - {"expand"}
# Targets whose elementwise kernels store in place (a static cache's ``index_copy``): GPUs trap at an index out of
# range as torch's device-side assert does, the CPU's caller checks first (``runtime.kernels``). Metal's and Ascend's
# sources leave the update to torch.
SCATTER_TARGETS = ("cuda", "hip", "c", "cpu")
_log = logging.getLogger("tilefuse")
TEMPLATE_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class KernelSpec:
    """One template instance and how the region's tensors map onto its parameters."""

    template: str  # gemm | gemv | gemm_sp | row_reduction | elementwise | conv2d | pool2d | flash_attention
    params: tuple[tuple[str, Any], ...]  # factory keyword arguments (hashable)
    out_idx: tuple[int, ...]
    inputs: tuple[tuple[str, tuple | None], ...]  # (value, reshape-to) in parameter order
    outputs: tuple[tuple[int, str, tuple], ...]  # (kernel output #, region output value, its shape)
    pre: tuple[str, ...] = ()  # names of view nodes torch runs before the kernel
    post: tuple[str, ...] = ()  # names of layout nodes torch runs on the kernel's outputs (then ``outputs``
    # names the values the kernel computes, and the region's outputs are read after the post nodes)
    packed: tuple[int, ...] = ()  # input positions handed over with their last two dims swapped, made contiguous
    # once per tensor version (a CPU GEMM's linear weight: see ``build_gemm``)
    aliases: tuple[tuple[str, int], ...] = ()  # (region output, input position): an output the kernel writes into
    # that input itself (an in-place ``index_copy`` of a static cache: the elementwise template's ``scatters``)

    def factory_kwargs(self) -> dict:
        return dict(self.params)


def require(cond: bool, why: str) -> None:
    if not cond:
        raise NotLowerable(why)


def numel(shape) -> int:
    return math.prod(shape)


class Builder:
    """Builds the expressions of one region: leaves for outside values, Calls for its nodes."""

    def __init__(self, region: Region, graph: Graph, nodes: dict[str, Node], types: dict[str, TensorType],
                 target: dict | None = None):
        self.region, self.graph, self.types = region, graph, types
        self.cpu = target is not None and dialect(target).cpu  # computes as torch's CPU kernels (``cpu_form``)
        self.members = [nodes[m] for m in region.nodes]
        self.produced = {v.name for n in self.members for v in n.outputs}
        self.args: list[str] = []  # outside values read as Arg(i), in order
        self.pre: list[str] = []
        self.available: set[str] = set(region.inputs)  # values torch has before the kernel

    def leaf(self, value: str) -> Expr:
        c = self.graph.constants.get(value)
        if c is not None and c.numel() == 1:
            return Const(c.reshape(()).item(), str(c.dtype).removeprefix("torch."))
        require(value in self.available, f"{value} is computed inside the region before the kernel could read it")
        if value not in self.args:
            self.args.append(value)
        return Arg(self.args.index(value))

    def pointwise(self, nodes: list[Node], env: dict[str, Expr]) -> dict[str, Expr]:
        """Expressions for ``nodes`` (elementwise ops and views) over ``env``; views of outside values
        become pre nodes."""
        supported = ops_supported()
        for n in nodes:
            if n.op in PASS_VIEWS:
                if n.inputs[0] in env:
                    env[n.outputs[0].name] = env[n.inputs[0]]
                else:
                    require(n.inputs[0] in self.available, f"view {n.name} reads a value the kernel computes")
                    self.pre.append(n.name)
                    self.available.add(n.outputs[0].name)
                continue
            if n.op == "batch_norm":  # after a convolution, whose template reads (C,) vectors against the channels
                x, w, b, mean, var = (env[i] if i in env else self.leaf(i) for i in n.inputs)
                eps = n.attr.get("eps", 1e-5)
                env[n.outputs[0].name] = (x - mean) * Call("rsqrt", (var + Const(float(eps)),)) * w + b
                continue
            require(n.op in supported, f"the templates' expressions cannot compute {n.op} ({n.name})")
            require(len(n.outputs) == 1, f"{n.op} has several outputs")
            args = tuple(env[i] if i in env else self.leaf(i) for i in n.inputs if i)
            env[n.outputs[0].name] = self.call(n, args)
        return env

    def call(self, n: Node, args: tuple[Expr, ...]) -> Expr:
        """The expression of pointwise node ``n`` over ``args``: its op, or on a CPU target ``cpu_form``'s."""
        form = cpu_form(n, args, self.types[n.inputs[0]].dtype, self.types[n.outputs[0].name].dtype) \
            if self.cpu and n.inputs else None
        return Call(n.op, args, n.attrs) if form is None else form


def cpu_form(n: Node, args: tuple[Expr, ...], dtype: str, out: str = "") -> Expr | None:
    """The expression a CPU target computes for ``n`` where torch's CPU kernel departs from the op's definition (which
    the GPU targets follow, as torch's CUDA kernels do), else None.

    add/sub of a float16/bfloat16 tensor and a Python number: torch's CPU kernel rounds the number to the tensor's
    dtype first (``x - 3.0819921`` is 0 at x = 3.08203125), its CUDA kernel keeps it in float32, as mul and div do on
    both (checked against torch 2.13's CPU eager, float16 and bfloat16); the number's constant is rounded here
    (``out``: the result's dtype).

    gelu (erf form) of float32: torch's kernel for contiguous tensors of several elements gives NaN at +-inf and
    computes ``x * (1 + erf(x / sqrt 2))`` before halving (an ``x`` past 2^127 overflows); its scalar path on AVX2 and
    CUDA give the limit at +inf. float16/bfloat16 depend on the machine (``half_gelu_nan_at_inf``): AVX512 widens
    them into that kernel, AVX2 gives the limit. pytorch/pytorch#185770 (fix open in #192318). ``+ x * 0`` is NaN
    exactly at +-inf and NaN and +-0 elsewhere, which keeps every other result's bits, -0.0 included."""
    if n.op in ("add", "sub") and out in ("float16", "bfloat16"):
        rounded = tuple(Const(a.value, out) if isinstance(a, Const) and a.dtype == "float32" else a for a in args)
        return Call(n.op, rounded, n.attrs) if rounded != args else None
    if n.op == "gelu" and n.attr.get("approximate", "none") == "none" and (
            dtype == "float32" or dtype in ("float16", "bfloat16") and half_gelu_nan_at_inf(dtype)):
        (x,) = args
        return x * (Const(1.0) + Call("erf", (x * Const(math.sqrt(0.5)),))) * Const(0.5) + x * Const(0.0)
    return None


@functools.cache
def half_gelu_nan_at_inf(dtype: str) -> bool:
    """Whether this process's torch gives NaN (not the limit) for the CPU gelu of a contiguous ``dtype`` +inf."""
    return bool(torch.nn.functional.gelu(torch.full((64,), math.inf, dtype=getattr(torch, dtype))).isnan().all())


def domain_shape(t: TensorType, rows: int, cols: int) -> tuple:
    """How an extra operand reads in the (rows, cols) domain: full, a row vector, or a scalar."""
    n = numel(t.shape)
    if n == rows * cols and t.shape[-1:] == (cols,):
        return (rows, cols)
    if n == cols and (not t.shape or t.shape[-1] == cols):
        return (cols,)
    require(n == 1, f"operand {t} does not fit the ({rows}, {cols}) domain")
    return ()


def _outputs(b: Builder, env: dict[str, Expr], region: Region) -> tuple[list[Expr], list[tuple]]:
    """Distinct output expressions, and for each region output (kernel output #, its shape)."""
    exprs: list[Expr] = []
    mapping = []
    for o in region.outputs:
        require(o in env, f"output {o} is not computed by the kernel")
        e = env[o]
        if e not in exprs:
            exprs.append(e)
        mapping.append((exprs.index(e), o, tuple(b.types[o].shape)))
    return exprs, mapping


def check_static(region: Region, types: dict[str, TensorType], target: dict) -> None:
    for v in (*region.inputs, *region.outputs):
        t = types[v]
        require(t.is_static, f"{v} has a symbolic or unknown shape {t}")
        # TileLang's C code generator types a bool buffer int8_t in the kernel and bool in its host
        # wrapper, which fails to compile; the elementwise template stores bools as int8, so does the row
        # reduction its input and outputs (``build_reduction`` refuses its other bool operands), the others not yet.
        as_int8 = region.kind == "elementwise" or region.kind == "reduction" and not set(region.ops) & POOL_OPS
        require(as_int8 or not (target.get("kind") == "c" and t.dtype == "bool"),
                 f"{v} is bool, which the {region.kind} template cannot take on the c target")


# Integer divisions that trap on a zero divisor in a kernel's C (the c target's process dies of SIGFPE), where torch
# raises ZeroDivisionError on the CPU.
INT_DIVISIONS = frozenset({"floor_divide", "trunc_divide", "remainder", "fmod"})


def check_divisors(region: Region, nodes: dict[str, Node], types: dict[str, TensorType],
                   constants: dict[str, torch.Tensor]) -> None:
    """An integer division in ``region`` by anything but a constant without zeros runs through torch."""
    for name in region.nodes:
        n = nodes[name]
        if n.op in INT_DIVISIONS and len(n.inputs) > 1 and not types[n.inputs[1]].dtype.startswith(("float", "bfloat")):
            c = constants.get(n.inputs[1])
            require(c is not None and bool((c != 0).all()),
                    f"{n.name}: an integer {n.op} by a tensor runs through torch (a zero divisor raises there; a "
                    "kernel's division would trap)")


# ---- per kind ---------------------------------------------------------------------------------

def check_dtypes(dtypes, target: dict, what: str) -> None:
    for dt in dtypes:
        try:
            check_dtype(dt, target, what)
        except NotImplementedError as e:
            raise NotLowerable(str(e)) from None


def build_elementwise(b: Builder, target: dict) -> KernelSpec:
    """Pointwise and injective nodes as one elementwise kernel, each output element pulled through
    the nodes' index maps (``lowering.index``)."""
    types = b.types
    for n in b.members:  # views of values torch already has: free, before the kernel
        if n.op in PASS_VIEWS and n.inputs[0] in b.available:
            b.pre.append(n.name)
            b.available.add(n.outputs[0].name)
    computed = {v.name: (n, k) for n in b.members if n.name not in b.pre for k, v in enumerate(n.outputs)}
    stores = {n.outputs[0].name: n for n in b.members if "in_place" in get_op(n.op).traits}
    require(not stores or target.get("kind") in SCATTER_TARGETS,
            f"no in-place stores on {target.get('kind')} targets: the cache's update runs through torch")
    require(all(i not in stores for n in b.members for i in n.inputs), "a cache read after its update in the region")
    base_of = {}  # region output -> the kernel value it is a plain reshape of
    for o in b.region.outputs:
        v = o
        while v in computed and computed[v][0].op in PASS_VIEWS and computed[v][0].inputs[0] in computed:
            v = computed[v][0].inputs[0]
        base_of[o] = v
    bases = list(dict.fromkeys(base_of.values()))
    require(all(base_of[o] == o for o in b.region.outputs if base_of[o] in stores), "a view of a cache's update")
    shapes = [tuple(types[stores[v].inputs[2]].shape if v in stores else types[v].shape) for v in bases]
    require(all(numel(s) > 0 for s in shapes), "an empty output")
    current: list[tuple] = [()]

    def leaf(value: str, idx: tuple) -> Expr:
        e = b.leaf(value)
        if isinstance(e, Const):
            return e
        shape, out = tuple(types[value].shape), current[0]
        if len(shape) <= len(out) and all(d in (1, o) for d, o in zip(shape[::-1], out[::-1])) and \
                idx == index.broadcast(shape, index.coords(out)):
            return e
        return Load(e.index, idx)

    ib = index.IndexBuilder(computed, types, leaf, ops_supported(), b.call)
    exprs, scatters = [], []
    for v, shape in zip(bases, shapes):
        current[0] = shape
        ib.reset()
        if v in stores:  # src's element at c, stored into the cache at c with c[dim] = index[c[dim]]
            cache, idx, src = stores[v].inputs
            dim = stores[v].attr["dim"] % len(shape)
            dest = b.leaf(cache)
            require(isinstance(dest, Arg) and cache in b.region.inputs, "a cache made inside the region")
            at = ib.at(idx, (index.coords(shape)[dim],))
            require(isinstance(at, Load) and isinstance(at.index[0], Coord) and b.leaf(idx) == Arg(at.arg),
                    "an index computed in the cache's update (its bounds are checked where it is an input)")
            exprs.append(ib.at(src, index.coords(shape)))
            scatters.append((dest.index, dim, at))
        else:
            exprs.append(ib.at(v, index.coords(shape)))
            scatters.append(None)
    n_nodes = tree_size(exprs)
    require(n_nodes <= index.MAX_EXPR_NODES,
             f"the region's expressions unfold to {n_nodes} nodes (limit {index.MAX_EXPR_NODES})")
    in_dtypes = tuple(types[a].dtype for a in b.args)
    out_dtypes = tuple(types[v].dtype for v in bases)
    check_dtypes((*in_dtypes, *out_dtypes), target, "elementwise")
    in_shapes = tuple(tuple(types[a].shape) for a in b.args)
    params = {"in_shapes": in_shapes, "in_dtypes": in_dtypes, "exprs": tuple(exprs), "out_dtypes": out_dtypes,
              "out_shapes": tuple(shapes)}
    if stores:
        params["scatters"] = tuple(scatters)
    kept = [v for v in bases if v not in stores]  # the kernel's outputs, in order
    mapping = tuple((kept.index(base_of[o]), o, tuple(types[o].shape)) for o in b.region.outputs
                    if base_of[o] not in stores)
    aliases = tuple((o, b.args.index(stores[o].inputs[0])) for o in b.region.outputs if o in stores)
    n = len(kept)
    return KernelSpec("elementwise", tuple(params.items()), tuple(range(-n, 0)),
                      tuple((a, None) for a in b.args), mapping, tuple(b.pre), aliases=aliases)


def _trace_operand(b: Builder, value: str, env_nodes: dict[str, Node]
                   ) -> tuple[str, bool, list[Node], Node | None, tuple | None]:
    """Follow a GEMM operand back through the region: (outside value, transposed?, prologue nodes, the RMSNorm it
    is the output of or None: ``planner.norm_fold``'s, whose input is then the outside value, the shape the kernel
    reads the outside value as or None for its own). Views alone reshape it to the operand's shape (Funnel's
    ``einsum("td,dnh->tnh")``: a (64, 4, 16) weight as (64, 64)); views with a transpose or a prologue must keep the
    last two dims, and then read it with the operand's batch dims."""
    operand = tuple(b.types[value].shape)
    trans, prologue, norm, reshaped = False, [], None, False
    while value in b.produced:
        n = env_nodes[value]
        rank = len(b.types[n.inputs[0]].shape)
        if n.op in PASS_VIEWS and tuple(b.types[n.inputs[0]].shape)[-2:] != tuple(b.types[value].shape)[-2:]:
            reshaped = True
        if n.op == "rms_norm" and norm is None and not prologue and not trans:
            norm = n
            require(n.attr.get("axis", -1) % rank == rank - 1, "an RMSNorm before the GEMM, not over the last dim")
            require(n.inputs[0] not in b.produced, "the RMSNorm's input is computed in the GEMM's region")
        elif n.op == "transpose":
            require(sorted(d % rank for d in (n.attr["dim0"], n.attr["dim1"])) == [rank - 2, rank - 1],
                     "a transpose of other than the last two dims")
            trans = not trans
        elif n.op == "permute":
            perm = [p % rank for p in n.attr["perm"]]
            require(perm == list(range(rank - 2)) + [rank - 1, rank - 2], f"permute {perm} before the GEMM")
            trans = not trans
        elif n.op in ("cast", "scale"):
            prologue.insert(0, n)
        elif n.op in PASS_VIEWS:
            pass
        else:
            raise NotLowerable(f"{n.op} before the GEMM")
        value = n.inputs[0]
    if not (trans or prologue or norm):
        return value, False, [], None, operand if tuple(b.types[value].shape) != operand else None
    require(not reshaped, "views that change a GEMM operand's last two dims beside a transpose or a prologue")
    # views that only merge or split batch dims (ATen's 4-D matmul as bmm: (B, H, S, D) read as (B*H, S, D)); an
    # operand without batch dims (its leading dims fold into M) or a folded norm's is read with the value's own shape
    view = (*operand[:-2], *b.types[value].shape[-2:])
    if view == tuple(b.types[value].shape) or len(operand) <= 2 or norm is not None:
        return value, trans, prologue, norm, None
    return value, trans, prologue, norm, view


def epilogue_exprs(b: Builder, anchor: Node, bias: str | None, after: list[Node], what: str) -> tuple[list[Expr], list]:
    """The GEMM-family epilogue: the anchor's accumulator plus its ``bias`` (if any), through the elementwise
    nodes ``after`` it; one output expression and the region outputs' mapping (see ``_outputs``)."""
    out = anchor.outputs[0].name
    env: dict[str, Expr] = {out: Call("add", (Acc(), b.leaf(bias))) if bias else Acc()}
    b.available.discard(out)
    exprs, mapping = _outputs(b, b.pointwise(after, env), b.region)
    require(len(exprs) == 1, f"a {what} region with several outputs")
    return exprs, mapping


def build_gemm(b: Builder, anchor: Node, target: dict, as_gemv: bool = False) -> KernelSpec:
    """A GEMM region's spec: ``gemm``'s, or ``gemv``'s for a decode step's linear on a GPU (``decode_rows``); with
    ``as_gemv`` ``gemv``'s on any target (a ``gemv_group``'s parts), refused where its rows or layout do not fit."""
    by_out = {v.name: n for n in b.members for v in n.outputs}
    pos = b.members.index(anchor)
    require(all(n.op in PASS_VIEWS or n.op in ("cast", "scale", "transpose", "permute", "rms_norm")
                 for n in b.members[:pos]), "the GEMM prologue holds more than casts, scales, layouts and a norm")
    a_val, trans_a, pro_a, norm, a_view = _trace_operand(b, anchor.inputs[0], by_out)
    b_val, trans_b, pro_b, norm_b, b_view = _trace_operand(b, anchor.inputs[1], by_out)
    require(not pro_b and norm_b is None, "a prologue on the weight operand")
    at, bt = a_view or b.types[a_val].shape, b_view or b.types[b_val].shape
    if anchor.op == "linear":
        require(len(bt) == 2 and not trans_b, "linear weight is not a plain (N, K) matrix")
        trans_b = True
        require(not trans_a, "a transposed linear input")
    require(len(at) >= 2 and len(bt) >= 2, "1-D GEMM operands")
    if trans_a:
        M, K = at[-1], at[-2]
    else:
        M, K = at[-2], at[-1]
    N = bt[-2] if trans_b else bt[-1]
    batch_a, batch_b = tuple(at[:-2]), tuple(bt[:-2])
    a_shape = a_view
    if not batch_b and not trans_a:  # fold A's batch into M: (..., M, K) -> (M', K)
        M, batch_a, a_shape = numel(at[:-1]), (), (numel(at[:-1]), K)
    for v in (a_val, b_val):
        require(b.types[v].dtype in TEMPLATE_DTYPES, f"{v} is {b.types[v].dtype}")
    pro = None
    for n in pro_a:
        pro = Call(n.op, (pro or Acc(),), n.attrs)
    bias = anchor.inputs[2] if anchor.op == "linear" and len(anchor.inputs) > 2 else None
    packed = ()
    weight = b_val in b.graph.constants or b_val in {v.name for v in b.graph.inputs}
    if trans_b and not batch_b and b_view is None and dialect(target).cpu and not as_gemv and weight:
        # A linear weight (N, K) on the CPU: the kernel would transpose each tile of it again for every tile row of
        # the output; the runtime hands it over as (K, N) instead, transposed once per weight version (2 cores,
        # 200x688x256 fp32: 0.63 -> 0.50 ms; torch 0.36).
        trans_b, packed = False, (1,)
    exprs, mapping = epilogue_exprs(b, anchor, bias, b.members[pos + 1:], "GEMM")
    rows, cols = (numel((*broadcast(batch_a, batch_b), M)), N)
    extra = list(b.args)  # an operand the epilogue also reads (x @ w + x) stays an extra: Arg(i) indexes b.args
    extra_shapes = tuple(domain_shape(b.types[a], rows, cols) if not (batch_a or batch_b)
                         else tuple(b.types[a].shape) for a in extra)
    layout = {"trans_A": trans_a, "trans_B": trans_b, "batch_A": batch_a, "batch_B": batch_b}
    if as_gemv:
        require(gemv_shape(M, layout),
                f"a gemv group's linear of {M} rows (at most {gemv.GEMV_ROWS}, unbatched)")
    if as_gemv or decode_rows(target, M, layout):  # a decode step's few rows: the weight streamed by warps (templates/gemv.py)
        norm_kw, g = _norm_params(b, norm, K)
        spec = gemm_spec(b, M, N, K, (a_val, a_shape), (b_val, b_view), exprs[0], mapping, extra, extra_shapes,
                         template="gemv", prologue=pro, **norm_kw)
        return spec if g is None else dataclasses.replace(spec, inputs=(spec.inputs[0], (g, None), *spec.inputs[1:]))
    require(norm is None, "an RMSNorm before a GEMM of more rows than a gemv's (only the gemv reads it in its pass)")
    spec = gemm_spec(b, M, N, K, (a_val, a_shape), (b_val, b_view), exprs[0], mapping, extra, extra_shapes,
                     **layout, prologue=pro)
    return dataclasses.replace(spec, packed=packed) if packed else spec


def _norm_params(b: Builder, norm: Node | None, K: int) -> tuple[dict, str | None]:
    """The gemv's parameters of an RMSNorm of A (``planner.norm_fold``: its eps and its weight's dtype, None where it
    has no weight) and that weight, an outside (K,) vector the kernel reads after A (its ``G``); ({}, None) without
    a norm."""
    if norm is None:
        return {}, None
    w = norm.inputs[1] if len(norm.inputs) > 1 and norm.inputs[1] else None
    if w is not None:
        require(w in b.available and tuple(b.types[w].shape) == (K,) and w not in b.args,
                 "the RMSNorm's weight is not an outside (K,) vector read only by the norm")
    return {"norm_eps": float(norm.attr.get("eps", 1e-6)), "norm_weight": b.types[w].dtype if w else None}, w


# Targets whose decode-step linears are gemv kernels (AMD: compiled there, not yet run). The CPU's one-lane programs
# would lose to its GEMM template.
GEMV_TARGETS = ("cuda", "hip")


def decode_rows(target: dict, M: int, layout: dict) -> bool:
    """Whether a GEMM is a linear layer of a decode step on a GPU (``GEMV_TARGETS``) that ``gemv`` takes
    (``gemv_shape``)."""
    return target.get("kind") in GEMV_TARGETS and gemv_shape(M, layout)


def gemv_shape(M: int, layout: dict) -> bool:
    """At most ``gemv.GEMV_ROWS`` rows of A times an (N, K) weight, unbatched: the ``gemv`` template's shape."""
    return M <= gemv.GEMV_ROWS and layout["trans_B"] and not layout["trans_A"] and not layout["batch_A"] \
        and not layout["batch_B"]


def gemm_spec(b: Builder, M: int, N: int, K: int, a: tuple, b_: tuple, epilogue: Expr, mapping, extra,
               extra_shapes, template: str = "gemm", **layout) -> KernelSpec:
    """The ``gemm`` template's spec (or ``gemv``'s, which has no transposes or batch dims): operands ``a`` and ``b_``
    as (value, reshape-to), the epilogue over ``extra`` (read with ``extra_shapes``), ``layout`` the transposes,
    batch dims and prologue."""
    params = {"M": M, "N": N, "K": K}
    if template == "gemm":
        params.update({"trans_A": False, "trans_B": False, "batch_A": (), "batch_B": ()})
    params |= {"A_dtype": b.types[a[0]].dtype, "B_dtype": b.types[b_[0]].dtype,
               "out_dtype": b.types[b.region.outputs[0]].dtype, "prologue": None,
               "epilogue": epilogue if epilogue != Acc() else None, "extra_shapes": tuple(extra_shapes),
               "extra_dtypes": tuple(b.types[e].dtype for e in extra)}
    params.update(layout)
    inputs = (a, b_, *zip(extra, extra_shapes))
    return KernelSpec(template, tuple(params.items()), (-1,), tuple(inputs), tuple(mapping), tuple(b.pre))


def broadcast(a: tuple, b: tuple) -> tuple:
    return broadcast_shapes(a, b) if (a or b) else ()


def loaded_operand(b: Builder, x: str, before: list[Node], fits, why: str) -> tuple[str, dict[str, Expr]]:
    """The tensor a reduction or pooling kernel loads for its input ``x``: ``x`` itself, or where the region
    computes ``x`` from a producer chain (``before``), that chain's first outside operand whose type ``fits``
    (the chain then runs on each loaded element). Returns it with the producer chain's expressions."""
    env: dict[str, Expr] = {}
    loaded = x
    if x in b.produced:
        outside = [i for n in before for i in n.inputs if i and i not in b.produced and i in b.available
                   and fits(b.types[i])]
        require(bool(outside), why)
        loaded = outside[0]
        env[loaded] = Acc()
    return loaded, b.pointwise(before, env)


def _reduced_from(anchor: Node, shape: tuple) -> int:
    """The first reduced dim ``k``: the anchor reduces dims ``k..rank-1``, a row reduction over
    their product (rows = the product of the dims before). Dims of size 1 reduce nothing, so they may lie
    anywhere (an instance norm's statistics: ``var_mean`` over dims 0, 2 and 3 of a (1, N*C, H, W) view)."""
    a, rank = anchor.attr, len(shape)
    require(rank > 0, "a reduction of a 0-d tensor")
    if anchor.op in ("softmax", "log_softmax"):
        require(a.get("dim", -1) % rank == rank - 1, "softmax over another axis than the last")
        return rank - 1
    if anchor.op in ("layer_norm", "rms_norm"):
        return a.get("axis", -1) % rank
    dims = a.get("dims")
    dims = sorted({d % rank for d in dims}) if dims is not None else list(range(rank))
    wide = [d for d in dims if shape[d] != 1] or dims
    require(bool(dims) and all(shape[d] == 1 or d in dims for d in range(wide[0], rank)),
            f"a reduction over dims {dims}, not trailing ones")
    return wide[0]


def _row_operand(shape: tuple, x_shape: tuple, k: int, flat: bool) -> tuple | None:
    """How a producer operand (broadcast against X's shape) reads in the reduction's domain:
    ``(rows, cols)``, ``(cols,)``, ``(rows, 1)`` or ``()`` when ``flat``, else X's leading dims
    kept, ``(*lead, cols)`` or ``(*lead, 1)``; None when it does not fit."""
    rank = len(x_shape)
    if len(shape) > rank:
        return None
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    lead, tail = padded[:k], padded[k:]
    cols = numel(x_shape[k:])
    if tail == tuple(x_shape[k:]):
        last = cols
    elif all(d == 1 for d in tail):
        last = 1
    else:
        return None
    if not flat:
        return (*lead, last)
    if all(d == 1 for d in lead):
        return (last,) if last > 1 else ()
    return (numel(x_shape[:k]), last) if lead == tuple(x_shape[:k]) else None


def result_operand(shape: tuple, domain: tuple) -> tuple | None:
    """How a consumer operand reads against the result ``domain``: the planner lets only the full
    result (any view of it), a vector over its last dim or a scalar through."""
    n = numel(shape)
    if n == 1:
        return ()
    if n == numel(domain):
        return domain
    stripped = tuple(shape)
    while stripped[:1] == (1,):
        stripped = stripped[1:]
    return (domain[-1],) if n == domain[-1] and len(stripped) == 1 else None


def _splits_at(shape: tuple, cols: int) -> bool:
    """Whether ``shape``'s trailing dims multiply to ``cols`` (its rows are whole rows of the domain)."""
    return any(numel(shape[j:]) == cols for j in range(len(shape) + 1))


def is_global_pool(anchor: Node) -> bool:
    """adaptive_avg_pool to all-ones over the trailing dims: a mean over the pooled dims, which the row reduction
    does best (channels last, the channels follow them: the pool template reads them)."""
    return (anchor.op == "adaptive_avg_pool" and all(d == 1 for d in anchor.attr["output_size"])
            and not anchor.attr.get("channels_last", False))


def build_reduction(b: Builder, anchor: Node, target: dict) -> KernelSpec:
    """A row reduction (softmax, norms, sums, a global average pool), with its producers and consumers; other
    pooling is ``conv_builder.build_pool``'s."""
    require(anchor.op in reduction.KINDS or is_global_pool(anchor), f"no row-reduction template for {anchor.op}")
    kind = "mean" if is_global_pool(anchor) else anchor.op
    x = anchor.inputs[0]
    xt = b.types[x]
    xs = tuple(xt.shape)
    k = len(xs) - len(anchor.attr["output_size"]) if is_global_pool(anchor) else _reduced_from(anchor, xs)
    rows, cols = numel(xs[:k]), numel(xs[k:])
    norm = anchor.op in ("layer_norm", "rms_norm")
    a = anchor.attr
    pos = b.members.index(anchor)
    before, after = b.members[:pos], b.members[pos + 1:]
    # The loaded tensor: the producer chain's first outside operand with X's full size.
    loaded, env = loaded_operand(
        b, x, before, lambda t: numel(t.shape) == rows * cols and _splits_at(t.shape, cols),
        "the norm's input is not built from a full-size operand")
    producer = env.get(x) if x in b.produced else None
    pre_values = [o for o in b.region.outputs if o in env]
    extra_pro = list(b.args)
    weights = [anchor.inputs[i] for i in ((1, 2) if anchor.op == "layer_norm" else (1,) if norm else ())
               if len(anchor.inputs) > i and anchor.inputs[i]]
    for i in weights:
        require(tuple(b.types[i].shape) == xs[k:], "norm weight/bias is not shaped like the normalized dims")
    cenv = b.pointwise(after, {anchor.outputs[0].name: Acc()})
    outs = [o for o in b.region.outputs if o not in pre_values]
    require(len({cenv[o] for o in outs if o in cenv}) == 1 and all(o in cenv for o in outs),
             "the reduction region's outputs are not its result")
    for o in pre_values:
        require(env[o] == producer, "the region writes an intermediate other than the norm's input")
    consumer = cenv[outs[0]] if cenv[outs[0]] != Acc() else None
    out_t = b.types[outs[0]]
    normalizing = kind in reduction.NORMALIZING
    extra = [e for e in b.args if e != loaded and e not in weights]
    require(extra == b.args, "the norm's input or weight is also read by the fused expressions")
    extra_shapes = None
    for flat in (True, False):  # the 2-D (rows, cols) domain, else X's leading dims kept
        shape = (rows, cols) if flat else (*xs[:k], cols)
        result = shape if normalizing else (*shape[:-1], 1)
        found = [_row_operand(b.types[e].shape, xs, k, flat) if e in extra_pro else
                 result_operand(b.types[e].shape, result) for e in extra]
        if all(f is not None for f in found):
            extra_shapes = found
            break
    require(extra_shapes is not None, "an operand broadcasts against the reduction's input in a way the "
             f"row-reduction template cannot read: {[str(b.types[e]) for e in extra]}")
    dtypes = (*TEMPLATE_DTYPES, "bool") if anchor.op in ("any", "all") else TEMPLATE_DTYPES  # truth of bools too
    require(xt.dtype in dtypes and b.types[loaded].dtype in dtypes, f"input dtype {xt.dtype}")
    require(target.get("kind") != "c" or all(b.types[e].dtype != "bool" for e in extra),
             "a bool operand besides the reduced input, which the row reduction cannot take on the c target")
    params = {"shape": shape, "kind": kind, "x_dtype": b.types[loaded].dtype, "out_dtype": out_t.dtype,
              "eps": float(a.get("eps", 1e-5)), "correction": int(a.get("correction", 1)), "keepdim": True,
              "has_weight": len(weights) > 0, "has_bias": len(weights) > 1,
              "weight_dtype": b.types[weights[0]].dtype if weights else None,
              "producer": producer if producer != Acc() else None, "consumer": consumer,
              "extra_shapes": tuple(extra_shapes), "extra_dtypes": tuple(b.types[e].dtype for e in extra),
              "write_pre": bool(pre_values), "pre_dtype": b.types[pre_values[0]].dtype if pre_values else None}
    inputs = [(loaded, shape), *[(w, (cols,)) for w in weights], *zip(extra, extra_shapes)]
    mapping = [(1 if o in pre_values else 0, o, tuple(b.types[o].shape)) for o in b.region.outputs]
    out_idx = (-2, -1) if pre_values else (-1,)
    return KernelSpec("row_reduction", tuple(params.items()), out_idx, tuple(inputs), tuple(mapping), tuple(b.pre))


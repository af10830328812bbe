"""2:4 sparsity as graph passes: prune GEMM weights (``Options.sparsity="2:4"``) and give 2:4 weights the
sparse kernel where the target has one.

Note: eligibility. A weight is *eligible* when it is a 2-D float16/bfloat16/float32 graph constant (an ONNX
initializer; under ``torch.compile`` the backend freezes parameters into constants when sparsity is on, see
``freeze_linear_weights``) read only as a GEMM weight (``gemm_weights``: ``linear(x, W)``, ``matmul(x, W^T)``
through a transpose as ONNX exports a Linear, or ``matmul(x, W)``) and nothing else (never an output, never
also an embedding table: a tied weight keeps its values), and, seen as (N, K), has ``K >= MIN_K``,
``K % 8 == 0`` (16-byte rows for the activation's TMA loads) and ``N % 16 == 0``. Pruning (the option) keeps
the 2 largest |w| of every 4 along K of each eligible weight, the same on every target, so one model prunes
the same way everywhere; the pruned weight is a new constant (``<name>.pruned_2_4``: artifacts keep the
source's and the plan's constants side by side by name). The kernel choice depends on the target: on CUDA
an eligible fp16/bf16 weight with the 2:4 pattern (pruned, or already so: no option needed) is compressed
(``ops.sparse_layout``; the metadata K-major on sm_90, ``meta_k_major``) and its GEMMs become ``sparse_linear``
nodes, which plan as ``gemm_sp`` regions. They keep the dense 2:4 weight too: the measured choice runs each
region as the gemm_sp kernel or as a dense GEMM on that weight, whichever is faster (a weight's memory is
then 1.56x its dense size);
elsewhere (``c`` has no gemm_sp) and for fp32 weights the GEMM stays dense on the pruned weight, and the
plan's notes say why.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from tilefuse.ir import Graph, Node, TensorType, Value
from tilefuse.ops.reference import Executor
from tilefuse.ops.sparse_layout import compress_2_4, is_2_4, prune_2_4

MODES = ("2:4",)
MIN_K = 64
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KERNEL_DTYPES = (torch.float16, torch.bfloat16)  # what gemm_sp multiplies


@dataclass(frozen=True)
class PrunedWeight:
    """One pruned weight: ``zeroed`` is the fraction of its entries pruning set to zero, ``rel_change``
    ``||W - prune(W)|| / ||W||`` (Frobenius)."""

    name: str
    shape: tuple[int, ...]
    zeroed: float
    rel_change: float


@dataclass(frozen=True)
class SparsityReport:
    """What the sparsity passes did to one graph; ``max_rel_change`` is the largest change of any output
    (max |pruned - dense| / max |dense|) measured on ``measured_on`` inputs, None until measured."""

    mode: str | None
    pruned: tuple[PrunedWeight, ...] = ()
    already_2_4: tuple[str, ...] = ()  # eligible weights that had the pattern before any pruning
    sparse_kernel: tuple[str, ...] = ()  # weights compressed for gemm_sp (their linears are sparse_linear)
    dense: tuple[tuple[str, str], ...] = ()  # (2:4 weight, why its linear stays a dense gemm)
    skipped: tuple[tuple[str, str], ...] = ()  # (GEMM weight, why it is not eligible), with the option only
    max_rel_change: float | None = None
    measured_on: str = ""
    dense_nodes: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # (GEMM node, its dense 2:4 weight)
    compressed_bytes: int = 0  # the compressed forms (values + metadata), kept beside the dense 2:4 weights

    def summary(self) -> str:
        parts = [f"sparsity {self.mode or 'off'}: {len(self.pruned)} weights pruned 2:4"]
        if self.pruned:
            parts[0] += f" ({sum(p.zeroed * math.prod(p.shape) for p in self.pruned) / 1e6:.2f} M values zeroed)"
        if self.already_2_4:
            parts.append(f"{len(self.already_2_4)} already 2:4")
        parts.append(f"{len(self.sparse_kernel)} on the gemm_sp kernel, {len(self.dense)} dense on the 2:4 weight")
        if self.compressed_bytes:
            parts.append(f"compressed forms {self.compressed_bytes / 2**20:.1f} MiB kept beside the dense 2:4 weights "
                         "(the measured choice runs either)")
        if self.skipped:
            parts.append(f"{len(self.skipped)} GEMM weights not eligible")
        if self.max_rel_change is not None:
            parts.append(f"outputs changed by up to {self.max_rel_change:.3e} (relative, {self.measured_on})")
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {"mode": self.mode, "pruned": [dataclasses.asdict(p) for p in self.pruned],
                "already_2_4": list(self.already_2_4), "sparse_kernel": list(self.sparse_kernel),
                "dense": dict(self.dense), "skipped": dict(self.skipped), "max_rel_change": self.max_rel_change,
                "measured_on": self.measured_on, "compressed_bytes": self.compressed_bytes}


class SparsityLog:
    """The reports of every graph a ``torch.compile`` backend compiled with sparsity on; graphs compile at the
    model's first call, so this fills then. Reads like one ``SparsityReport`` over all of them."""

    def __init__(self) -> None:
        self.reports: list[SparsityReport] = []

    @property
    def pruned(self) -> tuple[PrunedWeight, ...]:
        return tuple(p for r in self.reports for p in r.pruned)

    @property
    def sparse_kernel(self) -> tuple[str, ...]:
        return tuple(w for r in self.reports for w in r.sparse_kernel)

    @property
    def dense(self) -> tuple[tuple[str, str], ...]:
        return tuple(d for r in self.reports for d in r.dense)

    @property
    def max_rel_change(self) -> float | None:
        changes = [r.max_rel_change for r in self.reports if r.max_rel_change is not None]
        return max(changes) if changes else None

    def summary(self) -> str:
        if not self.reports:
            return "sparsity: nothing compiled yet (torch.compile compiles at the first call)"
        return "\n".join(r.summary() for r in self.reports)

    def __repr__(self) -> str:
        return f"SparsityLog({self.summary()!r})"


def check_mode(mode: str | None) -> str | None:
    if mode in (None, "", "none", "off"):
        return None
    if mode not in MODES:
        raise ValueError(f"unknown sparsity {mode!r}; use one of {', '.join(MODES)} or None (TILEFUSE_SPARSITY)")
    return mode


@dataclass(frozen=True)
class GemmWeight:
    """A constant read as the weight of GEMM nodes: ``linear(x, W)`` (W is (N, K)), ``matmul(x, W^T)`` through a
    transpose node (``views``; an ONNX MatMul of a transposed initializer) or ``matmul(x, W)`` with W (K, N)
    (``transposed``)."""

    name: str
    nodes: tuple[str, ...]
    transposed: bool = False
    views: tuple[str, ...] = ()


def gemm_weights(graph: Graph) -> tuple[dict[str, GemmWeight], dict[str, str]]:
    """The 2-D constants read as GEMM weights, and (name -> why) those also read some other way."""
    users = graph.users()
    found, refused = {}, {}
    for c, t in graph.constants.items():
        if t.dim() != 2:
            continue
        nodes, views, orient, other = [], [], set(), False
        for u in users.get(c, ()):
            if u.op in ("linear", "matmul") and u.inputs[1] == c and u.inputs[0] != c:
                nodes.append(u.name)
                orient.add(u.op == "matmul")
                continue
            out = u.outputs[0].name if u.outputs else ""
            readers = users.get(out, ())
            if _swaps(u) and readers and out not in graph.outputs and all(
                    m.op == "matmul" and m.inputs[1] == out and m.inputs[0] != out for m in readers):
                views.append(u.name)
                nodes += [m.name for m in readers]
                orient.add(False)
            else:
                other = True
        if not nodes:
            continue
        if other or c in graph.outputs or len(orient) > 1:
            refused[c] = "also read as something else than a GEMM weight (a tied weight keeps its values)"
        else:
            found[c] = GemmWeight(c, tuple(nodes), orient.pop(), tuple(views))
    return found, refused


def _swaps(n: Node) -> bool:
    """A transpose/permute that swaps the two dims of a matrix."""
    if n.op == "transpose":
        return sorted(d % 2 for d in (n.attr["dim0"], n.attr["dim1"])) == [0, 1]
    return n.op == "permute" and tuple(p % 2 for p in n.attr["perm"]) == (1, 0)


def eligibility(w: torch.Tensor) -> str | None:
    """Why the (N, K) weight ``w`` cannot be pruned or compressed, or None when its shape and dtype are eligible."""
    if w.dtype not in WEIGHT_DTYPES:
        return f"a {w.dtype} weight, not fp16/bf16/fp32"
    n, k = w.shape
    if k < MIN_K or k % 8 or n % 16:
        return f"shape (N={n}, K={k}): needs K >= {MIN_K}, K % 8 == 0 and N % 16 == 0"
    return None


def sparsify(graph: Graph, target: dict | None, mode: str | None) -> tuple[Graph, SparsityReport]:
    """Prune eligible GEMM weights (``mode="2:4"``) and, on CUDA, turn the GEMMs of eligible fp16/bf16 2:4
    weights into ``sparse_linear`` nodes over the compressed weight. Returns the new graph and the report."""
    mode = check_mode(mode)
    on_cuda = (target or {}).get("kind") == "cuda"
    if mode is None and not on_cuda:  # without the option only CUDA has a use for 2:4 weights
        return graph, SparsityReport(None)
    weights, refused = gemm_weights(graph)
    skipped = list(refused.items()) if mode else []
    types = {k: v.type for k, v in graph.values().items()}
    nodes = {n.name: n for n in graph.nodes}
    constants = dict(graph.constants)
    taken = set(types)
    # A pruned weight is a new constant under a new name: artifacts keep the source graph's and the plan's
    # constants side by side, by name.
    renamed: dict[str, str] = {}
    pruned, already, two_four = [], [], {}
    for name, gw in weights.items():
        w = constants[name].T if gw.transposed else constants[name]  # (N, K)
        why = eligibility(w)
        if why is not None:
            if mode is not None:
                skipped.append((name, why))
            continue
        if is_2_4(w):
            already.append(name)
        elif mode is None:
            continue
        else:
            p = prune_2_4(w)
            wf, pf = w.float(), p.float()
            pruned.append(PrunedWeight(name, tuple(w.shape), float((pf == 0).float().mean() - (wf == 0).float().mean()),
                                       float((wf - pf).norm() / wf.norm().clamp_min(1e-30))))
            w = p
            renamed[name] = _fresh(f"{name}.pruned_2_4", taken)
            constants[renamed[name]] = p.T.contiguous() if gw.transposed else p
            del constants[name]
        two_four[name] = w
    dense, dense_nodes, rewrite, drop, compressed_bytes = [], [], {}, set(), 0
    k_major = meta_k_major(target)
    for name, w in two_four.items():
        gw = weights[name]
        dtype = str(w.dtype).removeprefix("torch.")
        if not on_cuda:
            why = f"the {(target or {}).get('kind')} target has no gemm_sp: the dense gemm runs on the decompressed " \
                  "(pruned) weight"
        elif w.dtype not in KERNEL_DTYPES:
            why = f"gemm_sp multiplies fp16/bf16, the weight is {dtype}: dense gemm on the 2:4 weight"
        elif any(types[nodes[g].inputs[0]].dtype != dtype for g in gw.nodes):
            why = "the GEMM input's dtype differs from the weight's: dense gemm on the 2:4 weight"
        else:
            values, meta = compress_2_4(w, k_major=k_major)
            v_name, m_name = _fresh(f"{name}.values_2_4", taken), _fresh(f"{name}.meta_2_4", taken)
            constants[v_name], constants[m_name] = values, meta
            compressed_bytes += values.nbytes + meta.nbytes
            d_name = renamed.pop(name, name)  # the dense 2:4 weight stays, (N, K): the measured choice's other way
            if gw.transposed:
                del constants[d_name]
                d_name = _fresh(f"{name}.dense_2_4", taken)
                constants[d_name] = w.contiguous()
            rewrite.update({g: (v_name, m_name, d_name, int(w.shape[1]), k_major) for g in gw.nodes})
            drop.update(gw.views)
            continue
        dense.append((name, why))
        dense_nodes += [(g, name) for g in gw.nodes]
    sparse = tuple(w for w in two_four if w not in dict(dense))
    report = SparsityReport(mode, tuple(pruned), tuple(already), sparse, tuple(dense), tuple(skipped),
                            dense_nodes=tuple(dense_nodes), compressed_bytes=compressed_bytes)
    if not (pruned or rewrite):
        return graph, report
    new_nodes = tuple(_sparse_node(n, rewrite[n.name]) if n.name in rewrite else _renamed(n, renamed)
                      for n in graph.nodes if n.name not in drop)
    return graph.replace(nodes=new_nodes, constants=constants).verify(), report


def _sparse_node(n: Node, compressed: tuple[str, str, str, int, bool]) -> Node:
    """``linear(x, W, b)`` or ``matmul(x, W^T)`` as ``sparse_linear(x, values, meta, b, W)``."""
    v_name, m_name, d_name, k, k_major = compressed
    bias = n.inputs[2] if n.op == "linear" and len(n.inputs) > 2 else ""
    return Node(n.name, "sparse_linear", (n.inputs[0], v_name, m_name, bias, d_name), n.outputs,
                {"in_features": k, "meta_k_major": k_major})


def meta_k_major(target: dict | None) -> bool:
    """Whether ``target``'s gemm_sp kernels read the 2:4 metadata K-major (sm_90: TMA loads at any tile depth,
    see ``lowering.templates.gemm_sp``) or row-major (sm_80's mma.sp kernels)."""
    return str((target or {}).get("arch", "")).startswith("sm_90")


def _renamed(n: Node, names: Mapping[str, str]) -> Node:
    if not any(i in names for i in n.inputs):
        return n
    return dataclasses.replace(n, inputs=tuple(names.get(i, i) for i in n.inputs))


def _fresh(base: str, taken: set[str]) -> str:
    name, i = base, 0
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def freeze_linear_weights(graph: Graph, tensors: Mapping[str, torch.Tensor],
                          names: Mapping[str, str] | None = None) -> Graph:
    """``graph`` with the inputs named in ``tensors`` that are read only as ``linear`` weights made constants
    holding those tensors (detached), renamed after ``names`` (the module's parameter names) where given: how
    ``torch.compile`` parameters become prunable. Like inductor's freezing, later in-place changes to those
    parameters are not seen by the compiled graph."""
    users = graph.users()
    frozen, renamed = {}, {}
    taken = set(graph.values())
    for v in graph.inputs:
        t = tensors.get(v.name)
        us = users.get(v.name, ())
        if t is not None and us and v.name not in graph.outputs and all(
                u.op == "linear" and list(u.inputs).index(v.name) == 1 for u in us):
            label = (names or {}).get(v.name)
            renamed[v.name] = _fresh(label, taken) if label else v.name
            frozen[renamed[v.name]] = t.detach()
    if not frozen:
        return graph
    return graph.replace(inputs=tuple(v for v in graph.inputs if v.name not in renamed),
                         nodes=tuple(_renamed(n, renamed) for n in graph.nodes),
                         constants={**graph.constants, **frozen}).verify()


def prune_module(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` weights are pruned as ``sparsify`` prunes them (eligible shape
    and dtype, not tied to another module): the eager model a ``sparsity="2:4"`` compile should match."""
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    pruned = copy.deepcopy(model)
    originals = dict(model.named_modules())
    for name, m in pruned.named_modules():
        w = getattr(m, "weight", None)
        if isinstance(m, torch.nn.Linear) and counts.get(id(originals[name].weight), 0) == 1 and \
                eligibility(w) is None:
            with torch.no_grad():
                w.copy_(prune_2_4(w))
    return pruned


# ---- the report's measurement ----------------------------------------------------------------------------

def example_inputs(inputs: Sequence[Value], device: torch.device | str, seed: int = 0) -> list[torch.Tensor] | None:
    """Random inputs for ``inputs`` (floats N(0, 1), integers and bools zero: always valid indices), or None
    when a shape is not static."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for v in inputs:
        t: TensorType = v.type
        if not t.is_static:
            return None
        dt = getattr(torch, t.dtype)
        x = torch.randn(t.shape, generator=g).to(dt) if dt.is_floating_point else torch.zeros(t.shape, dtype=dt)
        out.append(x.to(device))
    return out


def output_change(before: Graph, after: Graph, inputs: Sequence[torch.Tensor]) -> float:
    """max over float outputs of max |after - before| / max |before|, both graphs run through the reference
    executor on ``inputs``."""
    device = inputs[0].device if inputs else torch.device("cpu")
    with torch.no_grad():
        ref = Executor(before, device)(*inputs)
        new = Executor(after, device)(*inputs)
    worst = 0.0
    for a, b in zip(ref, new):
        if a.dtype.is_floating_point and a.numel():
            a32, b32 = a.float(), b.float()
            worst = max(worst, float((a32 - b32).abs().max() / a32.abs().max().clamp_min(1e-12)))
    return worst

"""What a plan runs per region: its TileLang kernel with the views around it, or a GEMM region split in two.

Note: a kernel parameter is compiled for row-major strides and int8 storage of booleans; ``RegionKernel`` hands it
tensors so (``dense``, ``as_storage``) and names the region and the devices when a kernel is given tensors on
several devices.
"""

from __future__ import annotations

import math

import torch

from tilefuse.ir import Node
from tilefuse.lowering.lower import Lowered
from tilefuse.ops import get as get_op
from tilefuse.ops.derived import Derived
from tilefuse.planner.plan import Region


class RegionKernel:
    """A compiled region: views torch runs first, the kernel, the output reshapes."""

    def __init__(self, lowered: Lowered, region: Region, nodes: dict[str, Node]):
        self.spec, self.config, self.kernel, self.region = lowered.spec, lowered.config, lowered.kernel, region
        spec = lowered.spec
        self.pre = [(nodes[p], get_op(nodes[p].op), nodes[p].attr) for p in spec.pre]
        self.post = [(nodes[p], get_op(nodes[p].op), nodes[p].attr) for p in spec.post]
        # Bool tensors cross the kernel boundary as int8 (see templates/elementwise.py; the row reduction's Out, Pre).
        kw = spec.factory_kwargs()
        dts = kw.get("out_dtypes") or ((kw.get("out_dtype"), kw.get("pre_dtype")) if spec.template == "row_reduction"
                                       else ())
        if kw.get("scatters"):  # (in-place stores have no kernel output)
            dts = [dt for dt, sc in zip(dts, kw["scatters"]) if sc is None]
        self.bool_outputs = {k for k, dt in enumerate(dts) if dt == "bool"}
        self.packs: dict[int, Derived] = {}  # input -> its transposed copy, kept while the input is unchanged
        # In-place stores (an elementwise kernel's ``scatters``): (dest, dim, index input) each
        self.scatters = tuple((sc[0], sc[1], sc[2].arg) for sc in kw.get("scatters") or () if sc is not None) \
            if spec.template == "elementwise" else ()
        if spec.template == "gemv_group" and kw.get("scatter_of"):  # (cache, index) among the extras, at the end
            base = len(spec.inputs) - len(kw["extra_shapes"])
            self.scatters = tuple((base + c, 2, base + i) for c, i in (sc for sc in kw["scatter_of"] if sc))

    def __call__(self, args):
        env = dict(zip(self.region.inputs, args))
        _run_nodes(self.pre, env)
        tensors = [aligned(as_storage(dense(env[v].reshape(s) if s is not None else env[v])))
                   for v, s in self.spec.inputs]
        for i in self.spec.packed:
            tensors[i] = self.pack(i, tensors[i])
        if self.scatters:
            check_scatters(self.scatters, tensors)
        try:
            outs = self.kernel(*tensors)
        except (RuntimeError, ValueError) as e:
            raise boundary_error(self.region.name, self.spec.inputs, tensors, e) or e
        outs = list(outs) if isinstance(outs, (list, tuple)) else [] if outs is None else [outs]
        outs = [o.view(torch.bool) if k in self.bool_outputs else o for k, o in enumerate(outs)]
        if self.spec.aliases:  # outputs the kernel wrote into an input: that input, where the caller has it
            env.update({v: outs[k].reshape(shape) for k, v, shape in self.spec.outputs})
            for v, pos in self.spec.aliases:
                env[v] = written_back(env[self.spec.inputs[pos][0]], tensors[pos])
            _run_nodes(self.post, env)
            return [env[o] for o in self.region.outputs]
        if not self.post:
            return [outs[k].reshape(shape) for k, _, shape in self.spec.outputs]
        env.update({v: outs[k].reshape(shape) for k, v, shape in self.spec.outputs})
        _run_nodes(self.post, env)
        return [env[o] for o in self.region.outputs]


    def pack(self, i: int, t: torch.Tensor) -> torch.Tensor:
        """Input ``i`` with its last two dims swapped and made contiguous, reused while ``t`` is unchanged (a weight:
        packed on the first call, again only after a change; ``ops.derived``)."""
        if i not in self.packs:
            self.packs[i] = Derived(lambda w: w.mT.contiguous())
        return self.packs[i](t)


def check_scatters(scatters, tensors: list[torch.Tensor]) -> None:
    """torch's error for an index out of range of an in-place store, where the index is on the host (a CPU target;
    a GPU's kernel traps there, as torch's device-side assert does): checked before the kernel, which stores
    nothing out of range."""
    for dest, dim, i in scatters:
        index = tensors[i]
        if index.device.type != "cpu" or index.numel() == 0:
            continue
        size = tensors[dest].shape[dim]
        bad = (index < 0) | (index >= size)
        if bool(bad.any()):
            raise IndexError(f"index_copy_(): index {int(index[bad][0])} is out of bounds for dimension {dim} with "
                             f"size {size}")


def written_back(dest: torch.Tensor, passed: torch.Tensor) -> torch.Tensor:
    """The input ``dest`` after a kernel stored into ``passed``, the tensor ``dense``/``aligned`` handed it: ``dest``'s
    own memory (restrided at most on size-1 dims: the same elements), or a copy, whose stores are copied back."""
    if passed.data_ptr() != dest.data_ptr():
        dest.copy_(passed.reshape(dest.shape))
    return dest


def _run_nodes(nodes, env: dict) -> None:
    """Run layout nodes through torch, every output (a split has several)."""
    for node, spec, attrs in nodes:
        for v, t in zip(node.outputs, spec.run([env[i] for i in node.inputs], attrs)):
            env[v.name] = t


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the row-major strides a kernel parameter is compiled for. ``contiguous()`` alone keeps any
    stride on a dim of size 1 and every stride of an empty tensor (numpy's zero-row arrays: strides (0, 0)),
    which TileLang's wrapper refuses ("Static stride mismatch"): those get their canonical strides over the
    same memory (no copy), an empty one a new empty tensor."""
    t = t.contiguous()
    canon = _STRIDES.get(t.shape)
    if canon is None:  # the products of the later dims, as TileLang compiles them: (3, 0) has (0, 1), not torch's (1, 1)
        canon = _STRIDES[t.shape] = tuple(math.prod(t.shape[i + 1:]) for i in range(t.dim()))
    if t.stride() == canon:
        return t
    if t.numel() == 0:
        return torch.empty_strided(t.shape, canon, dtype=t.dtype, device=t.device)
    return t.as_strided(t.shape, canon)


_STRIDES: dict[torch.Size, tuple[int, ...]] = {}  # shape -> row-major strides (kernels see a few shapes each)


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied to fresh memory where it starts off a 16-byte boundary (a view into the middle of a row): TMA
    copies and 16-byte vector loads need the boundary, which every allocation has."""
    return t if t.data_ptr() % 16 == 0 or t.numel() == 0 else t.clone(memory_format=torch.contiguous_format)


def boundary_error(region: str, inputs, tensors: list[torch.Tensor], e: Exception) -> Exception | None:
    """A clear error for inputs a kernel cannot take because they are on different devices (a host tensor
    reaching a GPU kernel), naming the region and the inputs; None when that is not why it failed."""
    devices = {t.device for t in tensors}
    if len(devices) < 2:
        return None
    where = ", ".join(f"{v} on {t.device}" for (v, _), t in zip(inputs, tensors))
    return RuntimeError(f"region {region}: its kernel's inputs are on different devices ({where}); a plan runs on "
                        f"one device (PlanRunner.place stages the others onto it): {e}")


def as_storage(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int8) if t.dtype == torch.bool else t


class SplitRegion:
    """A region run as its head through torch, then its tail's kernel: a ``RegionFn`` like the others."""

    def __init__(self, region: Region, head: Region, tail: Region, head_fn, tail_fn):
        self.region, self.head, self.tail, self.head_fn, self.tail_fn = region, head, tail, head_fn, tail_fn

    def __call__(self, args):
        env = dict(zip(self.region.inputs, args))
        env.update(zip(self.head.outputs, self.head_fn([env[i] for i in self.head.inputs])))
        env.update(zip(self.tail.outputs, self.tail_fn([env[i] for i in self.tail.inputs])))
        return [env[o] for o in self.region.outputs]

"""A disk cache of what AOTAutograd and the ATen import make of a dynamo graph: a warm compile skips both.

Note: why. The compile bar wants a warm compile in at most 2 s; ResNet-50's took 3.26 s on the H200's machine
(2026-12-04). Of what the backend spends warm, AOTAutograd's trace and functionalization are the largest part (under
cProfile on a 2-core CPU: 0.44 s of 0.64 s; tilefuse's import, plan and lower from the caches the rest). The inference
graph AOTAutograd makes of a dynamo graph follows from that graph, its inputs' types and torch's global state, all of
which the backend is handed: so the imported program (``FxProgram``) is kept under a key of those, and a later compile
with the same key plans it at once. ResNet-50 (small) warm, 2-core CPU, fresh processes: 1.29 -> 1.04 s, where
dynamo alone (``backend="eager"``) takes 0.89 s.

Note: what is kept: inference graphs that AOTAutograd's runtime wrapper passes through unchanged (``plain_inference``):
no input mutated, every output a fresh tensor (not an input, not a view of one), no tensor subclass, effect token or
RNG state; plain tensors as inputs, as many as AOTAutograd's graph takes; static shapes; no autocast; one rank. A hit
is called as that wrapper calls it: autograd off for the call, under ``torch._dynamo.disable``.

Note: the key (``key``): dynamo's graph code (its ops, their constant arguments, its inputs' names), the data of
each tensor it holds (``get_attr``, up to ``HELD_NUMEL`` elements), each input's shape, strides, offset, dtype,
device, ``requires_grad``, whether it is a parameter or static, which inputs share storage, torch's global state as
dynamo guards it (grad mode, autocast, default dtype, deterministic algorithms, ...), inference mode, the SDPA
backends enabled, torch's version and a digest of the source of the packages that trace and import (``tilefuse``,
its frontends). A graph with a submodule (``call_module``, or a ``get_attr`` of a module: higher-order ops) is not
kept.

An entry is one JSON file (constants as base64 safetensors, at most ``MAX_CONSTANT_BYTES``) written atomically; an
unreadable one is a miss, and the compile rewrites it. ``TILEFUSE_GRAPH_CACHE=0`` turns the cache off,
``TILEFUSE_GRAPH_CACHE_DIR`` moves it (default ``~/.cache/tilefuse/graphs``); its size is bounded
(``tilefuse/disk_cache.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from tilefuse import disk_cache
from tilefuse.frontends import fx as fx_import
from tilefuse.frontends.fx import FxProgram, OutSpec
from tilefuse.runtime.distributed import world_size
from tilefuse.runtime.serialize import attr_from, attr_json, graph_from_json, graph_to_json, weights_bytes, weights_from

_log = logging.getLogger("tilefuse")
FORMAT = 1
# A graph holding a larger tensor (a module's weights as attributes: dynamo without inlining nn modules, which
# AOTAutograd then lifts to inputs, so such a graph is never kept) is not hashed whole on every compile.
HELD_NUMEL = 1 << 16
# An import whose constants take more bytes than this is not kept: writing it (base64 in JSON) and reading it back
# would cost more than the AOTAutograd trace it saves (HF BERT's 4.8 GB of folded masks took 42 s to write, session 44;
# the importer no longer folds such masks, frontends/fx.py: FOLD_NUMEL).
MAX_CONSTANT_BYTES = 64 << 20


CACHE = disk_cache.DiskCache("GRAPH_CACHE", "graphs")


def source_digest() -> str:
    """sha256 of every ``.py`` file of the ``tilefuse`` package and its frontends (the backend, its decompositions,
    the importer, the op registry)."""
    return disk_cache.source_digest(Path(__file__).resolve().parent, Path(fx_import.__file__).resolve().parent)


def _tensor_digest(t: torch.Tensor) -> str:
    data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def _global_state() -> Any:
    guard = torch._C._dynamo.guards.GlobalStateGuard()
    if hasattr(guard, "__getstate__"):
        state = guard.__getstate__()
        if isinstance(state, str):
            return json.loads(state)
    return [torch.is_grad_enabled(), str(torch.get_default_dtype()), torch.are_deterministic_algorithms_enabled(),
            torch.get_num_threads()]


def key(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """The cache key of dynamo's graph ``gm`` called on ``example_inputs``; None where it is not kept (the cache is
    off, several ranks, autocast on, an input that is not a plain tensor, symbolic shapes, a submodule)."""
    if not CACHE.enabled() or world_size() > 1 or torch._C._is_any_autocast_enabled():
        return None
    inputs, storages = [], {}
    for t in example_inputs:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type == "meta":
            return None
        alias = storages.setdefault((str(t.device), t.untyped_storage().data_ptr()), len(storages))
        inputs.append([list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype), str(t.device),
                       t.requires_grad, isinstance(t, torch.nn.Parameter),
                       str(getattr(t, "_dynamo_static_input_type", None)), alias])
    held = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            return None
        if n.op == "placeholder":
            val = n.meta.get("example_value", n.meta.get("val"))
            if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in (*val.shape, *val.stride())):
                return None
        if n.op == "get_attr":
            val = gm
            for part in str(n.target).split("."):
                val = getattr(val, part, None)
            if type(val) is not torch.Tensor or val.numel() > HELD_NUMEL:
                return None
            held.append([str(n.target), list(val.shape), str(val.dtype), str(val.device), _tensor_digest(val)])
    sdpa = [f() for f in (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
                          torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)]
    doc = {"format": FORMAT, "code": gm.code, "held": held, "inputs": inputs, "state": _global_state(),
           "inference_mode": torch.is_inference_mode_enabled(), "sdpa": sdpa, "torch": torch.__version__,
           "source": source_digest()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def plain_inference(aot_gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd's runtime wrapper hands the inference graph ``aot_gm`` (being compiled now) dynamo's
    ``example_inputs`` as they are and returns its outputs unchanged, so that a cached copy may be called directly."""
    from torch._functorch._aot_autograd.schemas import OutputType, SubclassCreationMeta
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return False
    vals = [n.meta.get("val") for n in aot_gm.graph.nodes if n.op == "placeholder"]
    if len(vals) != len(example_inputs) or not all(
            isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(t.shape) and v.dtype == t.dtype
            for v, t in zip(vals, example_inputs)):
        return False
    return (not any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info)
            and all(o.output_type == OutputType.non_alias for o in meta.output_info)
            and meta.num_intermediate_bases == 0 and not meta.tokens
            and not getattr(meta, "num_graphsafe_rng_states", 0)
            and not any(isinstance(s, SubclassCreationMeta) for s in (meta.subclass_inp_meta or ()))
            and meta.grad_enabled_mutation is None)


def _spec_json(spec: Any) -> Any:
    if isinstance(spec, (list, tuple)):
        return {"seq": type(spec).__name__, "items": [_spec_json(s) for s in spec]}
    if not isinstance(spec, OutSpec):
        raise ValueError(f"an output spec of type {type(spec).__name__}")
    return {"kind": spec.kind, "index": spec.index, "copy": spec.copy, "value": attr_json(spec.value, "an output"),
            "device": None if spec.device is None else str(spec.device)}


def _spec_from(doc: Any) -> Any:
    if "seq" in doc:
        seq = {"tuple": tuple, "list": list}[doc["seq"]]
        return seq(_spec_from(d) for d in doc["items"])
    if doc["kind"] not in ("graph", "input", "value"):
        raise ValueError(f"bad output kind {doc['kind']!r}")
    return OutSpec(str(doc["kind"]), int(doc["index"]), bool(doc["copy"]), attr_from(doc["value"]),
                   None if doc["device"] is None else torch.device(doc["device"]))


def store(k: str, program: FxProgram, static: Sequence[int]) -> None:
    """Keep ``program`` (an inference graph without mutations) and its static inputs' positions under ``k``. A graph
    JSON cannot hold, or a cache that cannot be written, is left out (logged at debug level)."""
    if program.mutations:
        raise ValueError("a program that updates its inputs is not cached")
    graph = program.graph
    size = sum(t.numel() * t.element_size() for t in graph.constants.values())
    if size > MAX_CONSTANT_BYTES:
        _log.debug("tilefuse: graph cache: %s not kept (its constants take %d bytes)", graph.name, size)
        return
    try:
        doc = {"format": FORMAT, "graph": graph_to_json(graph),
               "constants": base64.b64encode(weights_bytes(graph.constants)).decode() if graph.constants else None,
               "devices": {n: str(t.device) for n, t in graph.constants.items()},
               "input_indices": list(program.input_indices), "outputs": _spec_json(program.outputs),
               "fallback_ops": list(program.fallback_ops), "static": sorted(static)}
        CACHE.write(k, json.dumps(doc))
    except (ValueError, TypeError, OSError) as e:
        _log.debug("tilefuse: graph cache: %s not kept (%s: %s)", graph.name, type(e).__name__, e)


def load(k: str, name: str) -> tuple[FxProgram, frozenset[int]] | None:
    """The program kept under ``k`` (its graph named ``name``) and its static inputs' positions; None on a miss. A
    damaged entry is a miss, with a warning (the compile then rewrites it)."""
    text = CACHE.read(k)
    if text is None:
        return None
    try:
        doc = json.loads(text)
        if doc["format"] != FORMAT:
            raise ValueError(f"format {doc['format']!r}")
        constants = weights_from(base64.b64decode(doc["constants"])) if doc["constants"] else {}
        constants = {n: t.to(doc["devices"][n]) for n, t in constants.items()}
        graph = graph_from_json(doc["graph"], constants).replace(name=name)
        program = FxProgram(graph, tuple(int(i) for i in doc["input_indices"]), _spec_from(doc["outputs"]),
                            tuple(str(o) for o in doc["fallback_ops"]))
        if len(program.input_indices) != len(graph.inputs):
            raise ValueError("its input positions do not match its graph's inputs")
        return program, frozenset(int(i) for i in doc["static"])
    except Exception as e:  # noqa: BLE001 -- a damaged entry: compiled anew and rewritten
        _log.warning("tilefuse: graph cache entry %s is unreadable (%s: %s); compiling the graph anew", CACHE.path(k),
                     type(e).__name__, str(e)[:200])
        return None

"""Lossless JSON forms of graphs and plans, and weights as safetensors bytes (no pickle).

Used by artifacts (``runtime/artifact.py``); pure functions, each with its inverse.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import torch

from tilefuse.ir import Graph, Node, TensorType, Value, dtype_name, torch_dtype
from tilefuse.planner.plan import BACKENDS, KINDS, FusionPlan, Region

_RAW_DTYPES = frozenset({"complex128"})  # safetensors has no such dtype: stored as bytes


def type_json(t: TensorType) -> dict:
    return {"shape": None if t.shape is None else list(t.shape), "dtype": t.dtype}


def _type_from(doc: Mapping) -> TensorType:
    shape = doc["shape"]
    if shape is not None and not all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"bad shape {shape!r}")
    return TensorType(None if shape is None else tuple(shape), str(doc["dtype"]))


def attr_json(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$float": repr(v)}  # strict JSON has no inf/nan
    if isinstance(v, (tuple, list)):
        return [attr_json(x, where) for x in v]
    if hasattr(v, "item") and getattr(v, "ndim", None) == 0:  # a numpy/torch scalar
        return attr_json(v.item(), where)
    raise ValueError(f"{where} holds a {type(v).__name__}, which graph.json cannot store")


def attr_from(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(attr_from(x) for x in v)
    if isinstance(v, dict):
        if set(v) != {"$float"} or v["$float"] not in ("inf", "-inf", "nan"):
            raise ValueError(f"bad attribute value {v!r}")
        return float(v["$float"])
    return v


def graph_to_json(graph: Graph) -> dict:
    """A lossless JSON form of ``graph`` (constants by name, dtype and shape; their data goes elsewhere)."""
    nodes = [{"name": n.name, "op": n.op, "inputs": list(n.inputs),
              "outputs": [{"name": o.name, **type_json(o.type)} for o in n.outputs],
              "attrs": [[k, attr_json(v, f"node {n.name!r} ({n.op}) attribute {k!r}")] for k, v in n.attrs]}
             for n in graph.nodes]
    return {"name": graph.name, "inputs": [{"name": v.name, **type_json(v.type)} for v in graph.inputs],
            "outputs": list(graph.outputs),
            "constants": [{"name": k, "shape": list(t.shape), "dtype": dtype_name(t.dtype)}
                          for k, t in graph.constants.items()],
            "nodes": nodes}


def graph_from_json(doc: Mapping, constants: Mapping[str, torch.Tensor]) -> Graph:
    """The ``Graph`` of ``graph_to_json``'s ``doc``, its constants taken from ``constants`` by name.

    Raises ``ValueError`` (or ``KeyError``/``TypeError`` for a malformed ``doc``) when a constant is
    missing or has another dtype or shape, or when the graph breaks an invariant (``Graph.verify``).
    """
    consts = {}
    for c in doc["constants"]:
        name = str(c["name"])
        t = constants.get(name)
        if t is None:
            raise ValueError(f"constant {name!r} has no tensor")
        if list(t.shape) != list(c["shape"]) or dtype_name(t.dtype) != c["dtype"]:
            raise ValueError(f"constant {name!r} is {TensorType.of(t)} in the weights but "
                             f"{TensorType(tuple(c['shape']), c['dtype'])} in the graph")
        consts[name] = t
    nodes = tuple(Node(str(n["name"]), str(n["op"]), tuple(str(i) for i in n["inputs"]),
                       tuple(Value(str(o["name"]), _type_from(o)) for o in n["outputs"]),
                       tuple((str(k), attr_from(v)) for k, v in n["attrs"]))
                  for n in doc["nodes"])
    return Graph(str(doc["name"]), tuple(Value(str(v["name"]), _type_from(v)) for v in doc["inputs"]),
                 tuple(str(o) for o in doc["outputs"]), nodes, consts).verify()


def plan_to_json(plan) -> dict:
    """A ``FusionPlan`` as JSON: its regions and its (canonicalized) graph, constants by name."""
    return {"regions": [r.to_json() for r in plan.regions], "refusals": list(plan.refusals),
            "rewrites": list(plan.rewrites), "source_nodes": plan.source_nodes, "notes": list(plan.notes),
            "graph": graph_to_json(plan.graph)}


def plan_from_json(doc: Mapping, constants: Mapping[str, torch.Tensor]):
    """The ``FusionPlan`` of ``plan_to_json``'s ``doc``; ``ValueError`` unless its regions partition its graph."""
    graph = graph_from_json(doc["graph"], constants)
    regions = tuple(Region(**{f.name: tuple(r[f.name]) if isinstance(r[f.name], list) else r[f.name]
                              for f in dataclasses.fields(Region)}) for r in doc["regions"])
    members = sorted(m for r in regions for m in r.nodes)
    if members != sorted(n.name for n in graph.nodes):
        raise ValueError("its regions do not hold each node of its graph exactly once")
    values = graph.values()
    for r in regions:
        if r.kind not in KINDS or r.backend not in BACKENDS or not {*r.inputs, *r.outputs} <= set(values):
            raise ValueError(f"region {r.name} has a bad kind, backend or value")
    return FusionPlan(graph, regions, tuple(map(str, doc["refusals"])), tuple(map(str, doc["rewrites"])),
                      int(doc["source_nodes"]), tuple(map(str, doc["notes"])))


# ---- weights ----------------------------------------------------------------------------------

def weights_bytes(constants: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save as st_save

    tensors, raw, seen = {}, {}, set()
    for k, t in constants.items():
        t = t.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() != t.nbytes:
            t = t.clone()  # safetensors refuses tensors that share memory
        seen.add(t.untyped_storage().data_ptr())
        if dtype_name(t.dtype) in _RAW_DTYPES:
            raw[k] = {"dtype": dtype_name(t.dtype), "shape": list(t.shape)}
            t = t.reshape(-1).view(torch.uint8)
        tensors[k] = t
    return st_save(tensors, metadata={"raw": json.dumps(raw)})


def weights_from(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load as st_load

    tensors = st_load(data)
    n = int.from_bytes(data[:8], "little")
    raw = json.loads((json.loads(data[8:8 + n]).get("__metadata__") or {}).get("raw", "{}"))
    for k, meta in raw.items():  # stored as bytes: back to their dtype and shape
        tensors[k] = tensors[k].view(torch_dtype(meta["dtype"])).reshape(meta["shape"])
    return tensors


# ---- save -------------------------------------------------------------------------------------

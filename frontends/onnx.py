"""ONNX import: an ONNX model (file, bytes or ``ModelProto``) becomes a tilefuse ``Graph``.

Note: the path of a model is load -> ``onnx.checker`` -> ``onnx.shape_inference`` -> one converter
per node from the plain table ``CONVERTERS`` (``onnx_ops.py``, ``onnx_nn.py``), each mapping the node
onto registry ops through ``Ctx.add``. ``Ctx.add`` folds a node whose inputs are all constants on the
spot (through the op's own torch reference), so shape arithmetic (``Shape -> Gather -> Concat ->
Reshape``) reaches the converters as constants and becomes static attributes; what stays dynamic
becomes a runtime-tensor op (``reshape_dynamic``, ``slice_dynamic``, ...). An ONNX op without a
converter whose schema defines it as an ONNX function is expanded into that function's body.

Documented choices:
- Opsets 13 to 23 are the target; default-domain opsets up to 28 (``NEWEST_OPSET``, the newest the
  converters were checked against with the ONNX node suite) are accepted, since each converter reads
  the op's own version (``node.version``) and older op versions than a converter knows (``OLDEST``,
  default 7) are expanded through their ONNX function or refused.
- A graph input that also has an initializer is a constant: its value is fixed at import (as
  onnxruntime does when the input is not overridden); it is not an input of the tilefuse graph.
- Control flow (If, Loop, Scan), sequences, optionals, strings, sparse tensors and the 2/4-bit and
  float8e8m0 types raise ``UnsupportedOnnxOpError``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import onnx
import onnx.defs
import torch
from onnx import helper

from tilefuse.frontends import onnx_attention, onnx_nn, onnx_ops
from tilefuse.frontends.onnx_context import FOLD_LIMIT, Converter, Ctx, OnnxNode, Unsupported, evaluate
from tilefuse.frontends.onnx_tensors import DTYPE_TO_ONNX, UnsupportedDtypeError, tensor_from_proto, type_from_proto
from tilefuse.ir import Graph, Node, TensorType, Value, prune
from tilefuse.ops import FOLD_DYNAMIC, GraphBuilder

NEWEST_OPSET = min(28, onnx.defs.onnx_opset_version())  # the newest opset the converters were checked against
# The converter of each default-domain ONNX op, and the oldest op version it understands where that is not 7.
CONVERTERS: dict[str, Converter] = {**onnx_ops.CONVERTERS, **onnx_nn.CONVERTERS, **onnx_attention.CONVERTERS}
OLDEST: dict[str, int] = {**onnx_ops.OLDEST, **onnx_nn.OLDEST, **onnx_attention.OLDEST}


class OnnxImportError(ValueError):
    """An ONNX model that cannot be imported: the message names the file and what is wrong."""


class UnsupportedOnnxOpError(OnnxImportError):
    """A node whose op (or this use of it) tilefuse does not support: names file, op, node, domain."""


def import_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, *, name: str | None = None) -> Graph:
    """Import an ONNX model (path, serialized bytes or ``ModelProto``) as a tilefuse ``Graph``.

    Raises ``OnnxImportError`` (a ``ValueError``) for a missing, unreadable or invalid file and
    ``UnsupportedOnnxOpError`` for an op tilefuse does not support, naming file, op, node and domain.
    """
    proto, label, base_dir = _load(model)
    _check(label if base_dir else proto, label, proto.graph)
    if proto.functions:
        import onnx.inliner

        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:
            raise OnnxImportError(f"{label}: cannot inline the model's local functions: {e}") from e
    opsets = _opsets(proto, label)
    g = proto.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001  (inference is a hint: our registry infers types on its own)
        inferred = g
    onnx_types = {vi.name: vi.type for vi in (*inferred.value_info, *inferred.output)}
    ctx = Ctx(GraphBuilder(name or g.name or "onnx_model"), label, base_dir, onnx_types)
    if g.sparse_initializer:
        raise UnsupportedOnnxOpError(f"{label}: sparse initializers are not supported")
    for init in g.initializer:
        try:
            ctx.env[init.name] = ctx.constant(tensor_from_proto(init, base_dir), init.name)
        except (UnsupportedDtypeError, FileNotFoundError, OSError, ValueError) as e:
            raise OnnxImportError(f"{label}: initializer {init.name!r}: {e}") from e
    for vi in g.input:
        if vi.name in ctx.env:
            continue  # an input with an initializer is a constant (see the module docstring)
        try:
            t = type_from_proto(vi.type, vi.name)
        except UnsupportedDtypeError as e:
            raise UnsupportedOnnxOpError(f"{label}: graph input {vi.name!r}: {e}") from e
        if t is None:
            raise UnsupportedOnnxOpError(f"{label}: graph input {vi.name!r} is a sequence/optional/map; "
                                         "only tensor inputs are supported")
        ctx.env[vi.name] = ctx.b.input(vi.name, t)
        ctx.symbols.update(d for d in t.shape or () if isinstance(d, str))
    for node in g.node:
        _convert(ctx, node, opsets)
    for vo in g.output:
        if vo.name not in ctx.env:
            raise OnnxImportError(f"{label}: graph output {vo.name!r} is never produced")
    graph = ctx.b.build([ctx.env[vo.name] for vo in g.output])
    return _rename_values(prune(graph), {ctx.env[vo.name]: vo.name for vo in g.output})


# ---- loading and checking -----------------------------------------------------------------------

def _load(model) -> tuple[onnx.ModelProto, str, str]:
    if isinstance(model, onnx.ModelProto):
        return model, f"<ModelProto {model.graph.name!r}>", ""
    if isinstance(model, (bytes, bytearray)):
        return _parse(bytes(model), "<bytes>"), "<bytes>", ""
    if not isinstance(model, (str, os.PathLike)):
        raise OnnxImportError(f"cannot import an ONNX model from a {type(model).__name__}; "
                              "give a path, bytes or an onnx.ModelProto")
    path = os.fspath(model)
    if os.path.isdir(path):
        raise OnnxImportError(f"{path} is a directory, not an ONNX file; give the path of the .onnx file in it")
    if not os.path.isfile(path):
        raise OnnxImportError(f"{path}: no such ONNX file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OnnxImportError(f"{path}: cannot read the file: {e}") from e
    return _parse(data, path), path, os.path.dirname(os.path.abspath(path))


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception as e:
        raise OnnxImportError(f"{label}: not an ONNX model (protobuf parse failed: {e}); "
                              "the file is corrupt, truncated or of another format") from e
    if not m.HasField("graph"):
        raise OnnxImportError(f"{label}: not an ONNX model (no graph in the protobuf; {len(data)} bytes); "
                              "the file is corrupt, truncated or of another format")
    return m


def _check(m: onnx.ModelProto | str, label: str, graph: onnx.GraphProto) -> None:
    """``onnx.checker`` on the model (by path when it has one, so external data resolves)."""
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        text = " ".join(str(e).split()) or type(e).__name__  # its messages span lines mid-sentence
        order = re.search(r"however input '(.*)' of node: name: ?(.*?) ?OpType: (\S+) is not output", text)
        if order:  # a cycle, nodes out of order, or a dangling input: say which
            value, node, op = order.groups()
            made = any(value in n.output for n in graph.node)
            text = (f"input {value!r} of {f'node {node!r}' if node else 'an unnamed node'} ({op}) is not made by "
                    "any node before it: " +
                    ("the graph has a cycle or its nodes are not in topological order." if made else
                     "no node, graph input or initializer makes it (a dangling input)."))
        raise OnnxImportError(f"{label}: fails onnx.checker (corrupt, truncated or invalid model): {text}") from e


def _opsets(m: onnx.ModelProto, label: str) -> dict[str, int]:
    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in m.opset_import}
    v = opsets.get("")
    if v is not None and v > NEWEST_OPSET:
        raise OnnxImportError(f"{label}: default-domain opset {v} is newer than the newest tilefuse supports "
                              f"({NEWEST_OPSET}); convert the model to an older opset (onnx.version_converter)")
    return opsets


# ---- node conversion ----------------------------------------------------------------------------

def _convert(ctx: Ctx, proto: onnx.NodeProto, opsets: Mapping[str, int]) -> None:
    """Convert one ONNX node (expanding it into its ONNX function body when it has no converter)."""
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    where = f"node {proto.name or '(unnamed)'!r} (op {proto.op_type!r}, domain {domain or 'ai.onnx'!r})"
    if domain not in opsets:
        raise OnnxImportError(f"{ctx.label}: {where}: domain not in the model's opset_import")
    try:
        schema = onnx.defs.get_schema(proto.op_type, opsets[domain], domain)
    except Exception:  # noqa: BLE001  (SchemaError: unknown op)
        raise UnsupportedOnnxOpError(f"{ctx.label}: {where}: unsupported op (no such op in "
                                     f"{domain or 'ai.onnx'} opset {opsets[domain]}); export the model with "
                                     "standard ONNX ops") from None
    conv = CONVERTERS.get(proto.op_type) if domain == "" else None
    missing = [i for i in proto.input if i and i not in ctx.env]
    if missing:
        raise OnnxImportError(f"{ctx.label}: {where} reads {missing} before they are defined")
    outs = None
    if conv is not None and schema.since_version >= OLDEST.get(proto.op_type, 7):
        try:
            n = OnnxNode(proto.op_type, domain, proto.name, tuple(proto.input), tuple(proto.output),
                         _attrs(proto, ctx.base_dir), schema.since_version, dict(opsets), proto)
            outs = conv(ctx, n)  # (None: the converter declines this node, before adding anything)
        except (Unsupported, UnsupportedDtypeError) as e:
            raise UnsupportedOnnxOpError(f"{ctx.label}: {where}: unsupported: {e}") from e
        except OnnxImportError:
            raise
        except Exception as e:
            raise OnnxImportError(f"{ctx.label}: {where}: {type(e).__name__}: {e}") from e
    if outs is None:
        body = _function_body(ctx, proto, schema, opsets)
        if body is None:
            what = "unsupported op" if conv is None else f"unsupported op version {schema.since_version}"
            what += " (control flow is not supported)" if proto.op_type in ("If", "Loop", "Scan") else ""
            raise UnsupportedOnnxOpError(f"{ctx.label}: {where}: {what}; tilefuse has no converter for it "
                                         "(add one to CONVERTERS in tilefuse/frontends/onnx_ops.py)")
        for sub, sub_opsets in body:
            _convert(ctx, sub, sub_opsets)
        return
    for onnx_name, ours in zip(proto.output, outs):
        if onnx_name:
            ctx.env[onnx_name] = _check_type(ctx, onnx_name, ours, where)
    absent = [o for o in proto.output[len(outs):] if o]
    if absent:
        raise UnsupportedOnnxOpError(f"{ctx.label}: {where}: unsupported optional outputs {absent}")


def _check_type(ctx: Ctx, onnx_name: str, ours: str, where: str) -> str:
    """Our inferred type must agree with ONNX shape inference where both are known; where ours
    has unknown rank (a data-dependent op), ONNX's shape is adopted. Returns ``ours``."""
    tp = ctx.onnx_types.get(onnx_name)
    try:
        theirs = type_from_proto(tp, onnx_name) if tp is not None else None
    except UnsupportedDtypeError:
        return ours
    t = ctx.type(ours)
    if theirs is None:
        return ours
    if theirs.dtype != t.dtype:
        raise OnnxImportError(f"{ctx.label}: {where}: output {onnx_name!r} converted to {t}, but ONNX says "
                              f"{theirs} (a tilefuse converter bug)")
    if theirs.shape is None:
        return ours
    if t.shape is not None and len(t.shape) != len(theirs.shape):
        raise OnnxImportError(f"{ctx.label}: {where}: output {onnx_name!r} converted to {t}, but ONNX says "
                              f"{theirs} (a tilefuse converter bug)")
    if t.shape is not None and any(isinstance(a, int) and isinstance(b, int) and a != b
                                   for a, b in zip(t.shape, theirs.shape)):
        # ONNX's shape inference is not always right (MaxPool's ceil_mode, ...): ours follows the
        # reference semantics and runs; say so rather than refuse the model.
        warnings.warn(f"{ctx.label}: {where}: output {onnx_name!r} has type {t}; ONNX shape inference "
                      f"says {theirs}", stacklevel=2)
        return ours
    # Where ours is unknown (a data-dependent size) and ONNX knows an int or a graph-input symbol, take it.
    mine = t.shape if t.shape is not None else (None,) * len(theirs.shape)
    better = tuple(b if (a is None or a in ctx.unknown) and (isinstance(b, int) or b in ctx.symbols) else
                   ("?" if a is None else a) for a, b in zip(mine, theirs.shape))
    if better != t.shape:
        if "?" in better:
            base = ctx.b.fresh(f"{onnx_name}_dim")
            better = tuple(f"{base}{k}" if d == "?" else d for k, d in enumerate(better))
            ctx.unknown.update(d for d in better if isinstance(d, str) and d.startswith(base))
        _retype(ctx, ours, TensorType(better, t.dtype))
    return ours


def _retype(ctx: Ctx, name: str, t: TensorType) -> None:
    """Give the node output ``name`` the type ``t`` (refining an unknown shape)."""
    for k in range(len(ctx.b.nodes) - 1, -1, -1):
        node = ctx.b.nodes[k]
        if any(o.name == name for o in node.outputs):
            outs = tuple(Value(o.name, t) if o.name == name else o for o in node.outputs)
            ctx.b.nodes[k] = dataclasses.replace(node, outputs=outs)
            ctx.b.types[name] = t
            return


def _attrs(proto: onnx.NodeProto, base_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in proto.attribute:
        if a.ref_attr_name:
            raise Unsupported(f"attribute {a.name!r} references {a.ref_attr_name!r} outside a function")
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, onnx.TensorProto):
            v = tensor_from_proto(v, base_dir)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode("utf-8", "replace") for s in v]
        elif isinstance(v, (onnx.GraphProto, onnx.SparseTensorProto, onnx.TypeProto)) or (
                isinstance(v, list) and v and not isinstance(v[0], (int, float, str))):
            raise Unsupported(f"attribute {a.name!r} of kind {onnx.AttributeProto.AttributeType.Name(a.type)}")
        out[a.name] = v
    return out


# ---- ONNX functions -----------------------------------------------------------------------------

def _function_body(ctx: Ctx, proto: onnx.NodeProto, schema, opsets: Mapping[str, int]
                   ) -> list[tuple[onnx.NodeProto, dict]] | None:
    """The nodes of the ONNX function that defines ``proto``'s op (renamed into the graph) with the
    opsets they are written in, or None when the op is no function."""
    opset = opsets["" if proto.domain == "ai.onnx" else proto.domain]
    fn = onnx.FunctionProto()
    if schema.has_function:
        fn.ParseFromString(schema.get_function_with_opset_version(opset))
    elif schema.has_context_dependent_function:
        types = []
        for i in proto.input:
            if not i:
                types.append(onnx.TypeProto().SerializeToString())
                continue
            t = ctx.type(ctx.env[i])
            if t.dtype not in DTYPE_TO_ONNX:
                return None
            shape = None if t.shape is None else [d if isinstance(d, int) else None for d in t.shape]
            types.append(helper.make_tensor_type_proto(DTYPE_TO_ONNX[t.dtype], shape).SerializeToString())
        try:
            data = schema.get_context_dependent_function_with_opset_version(opset, proto.SerializeToString(), types)
        except Exception:  # noqa: BLE001
            return None
        if not data:
            return None
        fn.ParseFromString(data)
    else:
        return None
    if not fn.node:
        return None
    prefix = ctx.b.fresh(f"{proto.name or proto.op_type}_fn") + "__"
    rename = {f: a for f, a in zip(fn.input, proto.input)}
    rename.update({f: "" for f in fn.input[len(proto.input):]})
    rename.update({f: a for f, a in zip(fn.output, proto.output)})
    values = {name: a.default_value for name, a in schema.attributes.items() if a.default_value.name}
    values.update({a.name: a for a in fn.attribute_proto})
    values.update({a.name: a for a in proto.attribute})
    sub_opsets = dict(opsets)
    sub_opsets.update({("" if i.domain == "ai.onnx" else i.domain): i.version for i in fn.opset_import})
    body = []
    for k, node in enumerate(fn.node):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = f"{prefix}{node.name or node.op_type}_{k}"
        new.ClearField("input")
        new.ClearField("output")
        new.input.extend(rename.get(i, prefix + i) if i else "" for i in node.input)
        new.output.extend(rename.get(o, prefix + o) if o else "" for o in node.output)
        new.ClearField("attribute")
        for a in node.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in values:
                    ref = onnx.AttributeProto()
                    ref.CopyFrom(values[a.ref_attr_name])
                    ref.name = a.name
                    new.attribute.append(ref)
            else:
                new.attribute.append(a)
        body.append((new, sub_opsets))
    return body


# ---- graph clean-up (pure) ----------------------------------------------------------------------

def fold_constants(graph: Graph) -> Graph:
    """A new graph where every node whose inputs are all constants (and whose outputs are small) is
    replaced by constants computed through its reference; ``shape_of`` a static value folds too."""
    consts = dict(graph.constants)
    nodes: list[Node] = []
    types = {v.name: v.type for v in graph.values().values()}
    for n in graph.nodes:
        outs = None
        if n.op == "shape_of" and types[n.inputs[0]].is_static:
            a = n.attr
            outs = (torch.tensor(types[n.inputs[0]].shape[a.get("start", 0):a.get("end")], dtype=torch.int64),)
        elif all(i in consts for i in n.inputs if i) and (
                all(o.type.is_static for o in n.outputs) and sum(o.type.numel for o in n.outputs) <= FOLD_LIMIT
                or n.op in FOLD_DYNAMIC):  # data-dependent sizes, but shape arithmetic (the fold_dynamic trait)
            outs = evaluate(n.op, [consts[i] if i else None for i in n.inputs], n.attr)
        if outs is None or len(outs) != len(n.outputs):
            nodes.append(n)
            continue
        consts.update({v.name: t for v, t in zip(n.outputs, outs)})
    return prune(graph.replace(nodes=tuple(nodes), constants=consts))


def _rename_values(graph: Graph, wanted: Mapping[str, str]) -> Graph:
    """Rename node outputs/constants to the ONNX names in ``wanted`` where the name is free."""
    taken = set(graph.values()) | {n.name for n in graph.nodes}
    mapping: dict[str, str] = {}
    inputs = {v.name for v in graph.inputs}
    for old, new in wanted.items():
        new = "".join(c if c.isalnum() or c in "_." else "_" for c in new).strip("_")
        if old == new or old in inputs or not new or new in taken or old in mapping:
            continue
        mapping[old] = new
        taken.add(new)
    if not mapping:
        return graph
    r = lambda s: mapping.get(s, s)
    nodes = tuple(dataclasses.replace(n, inputs=tuple(r(i) for i in n.inputs),
                                      outputs=tuple(Value(r(o.name), o.type) for o in n.outputs)) for n in graph.nodes)
    consts = {r(k): t for k, t in graph.constants.items()}
    return graph.replace(nodes=nodes, constants=consts, outputs=tuple(r(o) for o in graph.outputs)).verify()


__all__ = [
    "CONVERTERS",
    "OnnxImportError",
    "UnsupportedOnnxOpError",
    "fold_constants",
    "import_onnx",
]

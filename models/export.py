"""ONNX export of zoo models: one call that picks the exporter that works for the requested opset.

Note: torch 2.13's dynamo exporter (`torch.onnx.export(..., dynamo=True)`, through onnxscript) emits
opset 18 natively and converts to other opsets afterwards. Converting *down* fails for our models
(LayerNormalization has no opset-16 form; the C-API converter trips on Reduce* axes) and the
exporter then quietly keeps opset 18. So opsets 13-17 go through the TorchScript exporter
(`dynamo=False`), which emits them natively, and 18-23 through the dynamo exporter. The file's opset
is checked after export so a request is never silently answered with another opset. SDPA needs
opset 14 or later. Both paths fold eval-mode BatchNorm into the preceding Conv and fold constant
subgraphs (sliced position and rotary tables; the causal mask too when no dim is dynamic) into
initializers.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Sequence

import onnx
import torch

MIN_OPSET, MAX_OPSET = 13, 23
# Protobuf caps a single file at 2 GiB; above this the weights go to a side file `<path>.data`.
_EXTERNAL_DATA_BYTES = 1 << 30


def _parameter_bytes(model: torch.nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def export_module(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    path: str | os.PathLike,
    input_names: Sequence[str],
    output_names: Sequence[str],
    *,
    opset: int = 18,
    dynamic_batch: bool = False,
) -> str:
    """Export `model` called on `inputs` to the ONNX file `path` and return the path as a string.

    Dim 0 of every input and output becomes the symbolic dim "batch" when `dynamic_batch` is set;
    all other dims stay static. Weights are embedded unless the model exceeds 1 GiB, in which case
    (opset 18 and up) they go to `<path>.data` beside the file.
    """
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}")
    path = os.fspath(path)
    external = _parameter_bytes(model) > _EXTERNAL_DATA_BYTES
    common = {"input_names": list(input_names), "output_names": list(output_names), "opset_version": opset}
    # The exporters print progress and deprecation notices; keep test and CLI output readable.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if opset >= 18:
            dynamic = None
            if dynamic_batch:
                batch = torch.export.Dim("batch")
                dynamic = tuple({0: batch} for _ in inputs)
            torch.onnx.export(
                model, inputs, path, dynamo=True, external_data=external, dynamic_shapes=dynamic, **common
            )
        else:
            _export_torchscript(model, inputs, path, dynamic_batch, common)
    _check_opset(path, opset)
    return path


def _export_torchscript(model: torch.nn.Module, inputs: tuple, path: str, dynamic_batch: bool, common: dict) -> None:
    """The TorchScript exporter, for opsets below 18.

    With `dynamic_axes` it marks every output dim it cannot prove static as symbolic (the sequence
    dim of the logits becomes "MatMullogits_dim_1"), so the output dims other than the batch are
    set back to the shapes the trace produced, captured with a forward hook at no extra cost.
    """
    if not dynamic_batch:
        torch.onnx.export(model, inputs, path, dynamo=False, **common)
        return
    names = [*common["input_names"], *common["output_names"]]
    shapes: list[torch.Size] = []
    handle = model.register_forward_hook(
        lambda _m, _args, out: shapes.extend(t.shape for t in (out if isinstance(out, tuple) else (out,)))
    )
    try:
        torch.onnx.export(model, inputs, path, dynamo=False, dynamic_axes={n: {0: "batch"} for n in names}, **common)
    finally:
        handle.remove()
    proto = onnx.load(path, load_external_data=False)
    for value, shape in zip(proto.graph.output, shapes[-len(proto.graph.output) :]):
        for dim, size in list(zip(value.type.tensor_type.shape.dim, shape))[1:]:
            dim.dim_value = size
    onnx.save(proto, path)


def _check_opset(path: str, opset: int) -> None:
    model = onnx.load(path, load_external_data=False)
    found = {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")}
    if found != {opset}:
        raise RuntimeError(f"{path}: asked the exporter for opset {opset}, the file declares {sorted(found)}")

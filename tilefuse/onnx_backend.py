"""The ONNX Backend API (``onnx.backend.base``) over tilefuse, like ``onnxruntime.backend``.

    from tilefuse import onnx_backend as backend
    rep = backend.prepare(model, "CPU")
    (y,) = rep.run([x])          # numpy in, numpy out (dtypes kept exactly)

Models run through ``tilefuse.compile_onnx``: every op is a tilefuse registry op executed by its torch
reference or its compiled kernel; nothing is delegated to onnxruntime or onnx's reference evaluator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
import torch
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import tilefuse
from tilefuse.config import Options
from tilefuse.frontends.onnx_tensors import numpy_to_torch, torch_to_numpy


class TilefuseRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes numpy arrays (a list in graph-input order, or a dict
    by input name) and returns the outputs as a namedtuple of numpy arrays."""

    def __init__(self, compiled: tilefuse.CompiledModel, device: torch.device, input_names: Sequence[str],
                 output_names: Sequence[str]):
        self.compiled = compiled
        self.device = device
        self.input_names = list(input_names)  # the ONNX names, in the order of the graph's inputs
        self.output_names = list(output_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run the model once; raise ``ValueError`` for a missing input or a wrong shape/dtype."""
        graph = self.compiled.graph
        names = self.input_names
        if isinstance(inputs, Mapping):
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ValueError(f"{graph.name}: missing inputs {missing}; the model takes {names}")
            arrays = [inputs[n] for n in names]
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) != len(names):
                raise ValueError(f"{graph.name}: expected {len(names)} inputs {names}, got {len(arrays)}")
        tensors = []
        for name, a, value in zip(names, arrays, graph.inputs):
            t = numpy_to_torch(np.asarray(a))
            want = value.type
            if want.shape is not None and (t.dim() != len(want.shape) or any(
                    isinstance(d, int) and d != s for d, s in zip(want.shape, t.shape))):
                raise ValueError(f"{graph.name}: input {name!r} has shape {tuple(t.shape)}, but the model declares "
                                 f"{want}")
            if str(t.dtype).removeprefix("torch.") != want.dtype:
                raise ValueError(f"{graph.name}: input {name!r} has dtype {t.dtype}, but the model declares "
                                 f"{want.dtype}")
            tensors.append(t.to(self.device))
        outs = self.compiled(*tensors)
        return namedtupledict("Outputs", self.output_names)(*[torch_to_numpy(o) for o in outs])


class TilefuseBackend(Backend):
    """ONNX backend running models through tilefuse (``prepare``, ``run_model``, ``run_node``).

    ``prepare`` passes its keyword arguments that name ``tilefuse.config.Options`` fields (``fuse``,
    ``lower``, ...) to ``compile_onnx``, over the class defaults ``compile_options``.
    """

    compile_options: Mapping[str, Any] = MappingProxyType({})

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """``CPU`` always; ``CUDA`` when torch sees a GPU."""
        d = Device(device)
        if d.type == DeviceType.CPU:
            return True
        return d.type == DeviceType.CUDA and torch.cuda.is_available()

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> TilefuseRep:
        """Import and compile ``model`` (ModelProto, path or bytes) for ``device``."""
        if not cls.supports_device(device):
            raise RuntimeError(f"tilefuse backend: device {device!r} is not available")
        d = Device(device)
        torch_device = torch.device("cuda", d.device_id) if d.type == DeviceType.CUDA else torch.device("cpu")
        target = "cuda" if d.type == DeviceType.CUDA else "c"
        fields = {f.name for f in dataclasses.fields(Options)} - {"target"}
        options = {**cls.compile_options, **{k: v for k, v in kwargs.items() if k in fields}}
        compiled = tilefuse.compile_onnx(model, target=target, **options)
        if isinstance(model, onnx.ModelProto):
            graph = model.graph
        elif isinstance(model, (bytes, bytearray)):
            graph = onnx.load_from_string(bytes(model)).graph
        else:
            graph = onnx.load(model, load_external_data=False).graph
        constant = {i.name for i in graph.initializer}
        inputs = [v.name for v in graph.input if v.name not in constant]
        return TilefuseRep(compiled, torch_device, inputs, [v.name for v in graph.output])

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        """``prepare(model, device).run(inputs)``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run a single node on numpy ``inputs`` (wrapped into a one-node model of opset
        ``kwargs['opset_version']``, default the newest)."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        arrays = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        names = list(inputs.keys()) if isinstance(inputs, Mapping) else list(node.input)
        vis = []
        for name, a in zip(names, arrays):
            a = np.asarray(a)
            vis.append(onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                          a.shape))
        outs = [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        graph = onnx.helper.make_graph([node], "run_node", vis, outs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        return cls.run_model(model, dict(zip(names, arrays)), device)


prepare = TilefuseBackend.prepare
run_model = TilefuseBackend.run_model
run_node = TilefuseBackend.run_node
supports_device = TilefuseBackend.supports_device
is_compatible = TilefuseBackend.is_compatible

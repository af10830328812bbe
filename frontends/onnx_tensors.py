"""ONNX element types, TensorProtos and numpy arrays as torch tensors, exactly.

Note: numpy has no bfloat16 or float8; ONNX and onnxruntime use ``ml_dtypes`` for them. Those
arrays cross into torch by a bit-exact view through the unsigned integer of the same width, so no
value is ever rounded on the way in or out.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from tilefuse.ir import TensorType, dtype_name

# ONNX elem_type -> torch dtype name (tilefuse.ir dtype names). Types torch cannot hold (string,
# 4-bit and 2-bit ints, float4, float8e8m0) are absent: importing them is an unsupported feature.
ONNX_TO_DTYPE: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.UINT8: "uint8",
    TensorProto.INT8: "int8",
    TensorProto.UINT16: "uint16",
    TensorProto.INT16: "int16",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.BOOL: "bool",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
    TensorProto.COMPLEX64: "complex64",
    TensorProto.COMPLEX128: "complex128",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    TensorProto.FLOAT8E5M2: "float8_e5m2",
    TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
}
DTYPE_TO_ONNX = {v: k for k, v in ONNX_TO_DTYPE.items()}

# dtypes numpy lacks: carried as the unsigned integer of the same width and reinterpreted.
_BIT_VIEWS = {"bfloat16": ("uint16", torch.uint16), "float8_e4m3fn": ("uint8", torch.uint8),
              "float8_e4m3fnuz": ("uint8", torch.uint8), "float8_e5m2": ("uint8", torch.uint8),
              "float8_e5m2fnuz": ("uint8", torch.uint8)}


class UnsupportedDtypeError(TypeError):
    """An ONNX element type that torch cannot represent (string, int4, float4, ...)."""


def onnx_dtype(elem_type: int) -> str:
    """ONNX ``elem_type`` -> tilefuse dtype name; ``UnsupportedDtypeError`` for types torch lacks."""
    try:
        return ONNX_TO_DTYPE[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise UnsupportedDtypeError(f"ONNX element type {name} has no torch equivalent") from None


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """A numpy array (including ml_dtypes bfloat16/float8) as a torch tensor of the same dtype."""
    a = np.asarray(a)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    name = a.dtype.name
    if name in _BIT_VIEWS:
        view_np, _ = _BIT_VIEWS[name]
        return torch.from_numpy(a.copy(order="C").view(view_np)).view(getattr(torch, name))
    if a.dtype == object or a.dtype.kind in "USV":
        raise UnsupportedDtypeError(f"numpy dtype {a.dtype} (strings/objects) has no torch equivalent")
    return torch.from_numpy(a.copy(order="C"))


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as a numpy array of the same dtype (ml_dtypes for bfloat16/float8)."""
    t = t.detach().cpu().contiguous()
    name = dtype_name(t.dtype)
    if name in _BIT_VIEWS:
        import ml_dtypes

        _, view_torch = _BIT_VIEWS[name]
        return t.view(view_torch).numpy().view(getattr(ml_dtypes, name))
    return t.numpy()


def tensor_from_proto(t: TensorProto, base_dir: str | os.PathLike = "") -> torch.Tensor:
    """A TensorProto (raw_data, typed fields or external data under ``base_dir``) as a torch tensor."""
    onnx_dtype(t.data_type)
    if t.data_location == TensorProto.EXTERNAL and not base_dir:
        info = {e.key: e.value for e in t.external_data}
        raise FileNotFoundError(f"tensor {t.name!r} keeps its data in the external file {info.get('location')!r}, "
                                "but the model was given without its folder; pass the .onnx path instead")
    return numpy_to_torch(numpy_helper.to_array(t, os.fspath(base_dir)))


def type_from_proto(tp: onnx.TypeProto, name: str) -> TensorType | None:
    """A tensor TypeProto as a TensorType (``None`` if not a tensor type). Unknown dims get
    a symbolic name derived from ``name``; an absent shape is unknown rank."""
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    dtype = onnx_dtype(tt.elem_type)
    if not tt.HasField("shape"):
        return TensorType(None, dtype)
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(f"{name}_dim{i}")
    return TensorType(tuple(dims), dtype)

"""Moved: the ONNX-only ops live by meaning in ``onnx_math``, ``onnx_quant``, ``onnx_shape``, ``onnx_index``,
``onnx_layers``, ``onnx_image`` and ``onnx_signal`` (``onnx_common`` says what they share).

Kept only while ``frontends/onnx_nn.py`` reads ``_extreme`` and ``_pool_geometry`` here: they are
``onnx_common.extreme`` and ``onnx_layers.pool_geometry``. Delete this module once it imports those.
"""

from tilefuse.ops.onnx_common import extreme as _extreme  # noqa: F401
from tilefuse.ops.onnx_layers import pool_geometry as _pool_geometry  # noqa: F401

"""Moved: the ONNX-only ops live by meaning in ``onnx_math``, ``onnx_quant``, ``onnx_shape``, ``onnx_index``,
``onnx_layers``, ``onnx_image`` and ``onnx_signal`` (``onnx_common`` says what they share).

Kept only while ``frontends/onnx_nn.py`` reads ``resize_geometry`` here: it is ``onnx_image.resize_geometry``.
Delete this module once it imports that.
"""

from tilefuse.ops.onnx_image import resize_geometry  # noqa: F401

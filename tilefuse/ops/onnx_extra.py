"""Ops declared for the onnx_extra frontend (see the module docstring of tilefuse.ops)."""

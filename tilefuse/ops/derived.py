"""A tensor derived from another and kept until the source changes: a weight transposed for a GEMM kernel
(``runtime.kernels.RegionKernel``), a convolution's weight channels last for cuDNN (``ops.nn.WeightChannelsLast``).

Note: the derived tensor is reused while each call passes a tensor at the same address, with the same version, shape,
strides and dtype (a plan's constant, a module's parameter); the source is held, so no other tensor can take its
address meanwhile. torch counts in-place changes as versions (``load_state_dict``, changes under ``no_grad``) and a
replaced ``.data`` moves the address, so both are seen; a write through ``.data`` in place is not a version and is
not seen. An inference tensor has no version to check: it is derived on every call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Derived:
    """``derived(t)``: ``make(t)``, made again only when ``t`` is not the source it was made from (see the note)."""

    def __init__(self, make: Callable[[torch.Tensor], torch.Tensor]):
        self.make = make
        self.held: tuple[torch.Tensor, tuple, torch.Tensor] | None = None  # (source, its key, made)

    @property
    def made(self) -> torch.Tensor | None:
        """The tensor made last, or None before the first call."""
        return None if self.held is None else self.held[2]

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_inference():
            return self.make(t)
        key = (t.data_ptr(), t._version, t.shape, t.stride(), t.dtype)
        if self.held is None or self.held[1] != key:
            self.held = (t, key, self.make(t))
        return self.held[2]

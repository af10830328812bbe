"""Profitability: a traffic model (bytes through device memory between kernels) plus launch cost.

Note: in the spirit of Welder, a region costs the bytes it reads and writes in device memory plus a
fixed launch cost, both as time on the target. Fusing saves the write and re-read of the values
that stop crossing a kernel boundary, and a launch; it costs nothing else here because region
growing never duplicates work. Defaults are the H200 numbers measured for this project (copy
bandwidth 4.2 TB/s; 0.9 us a kernel inside a replayed CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefuse.ir import TensorType, torch_dtype

NOMINAL_DIM = 128  # stands in for a symbolic dim when estimating bytes


@dataclass(frozen=True)
class CostModel:
    bandwidth_bytes_per_us: float = 4.2e6
    launch_us: float = 0.9

    def nbytes(self, t: TensorType) -> int:
        if t.shape is None:
            return 0
        n = 1
        for d in t.shape:
            n *= d if isinstance(d, int) else NOMINAL_DIM
        return n * torch_dtype(t.dtype).itemsize

    def region_us(self, in_types: list[TensorType], out_types: list[TensorType], launches: int = 1) -> float:
        traffic = sum(self.nbytes(t) for t in in_types) + sum(self.nbytes(t) for t in out_types)
        return traffic / self.bandwidth_bytes_per_us + launches * self.launch_us

    def fusion_gain_us(self, crossing: list[TensorType], still_written: list[TensorType]) -> float:
        """Time saved by fusing two kernels across the values ``crossing`` between them.

        Each crossing value stops being written and re-read, except those in ``still_written``
        (read by someone else, so the fused kernel still writes them once). One launch is saved.
        """
        saved = sum(2 * self.nbytes(t) for t in crossing) - sum(self.nbytes(t) for t in still_written)
        return saved / self.bandwidth_bytes_per_us + self.launch_us

"""Whether this machine can run kernels built for a target: checked before an artifact's kernels are
loaded and before a model is served, so a model that cannot run is refused up front, not on its first call.

Note: CUDA kernels are compiled ahead of time to machine code for one architecture (``sm_XY``). Such a
binary runs on a GPU of the same major compute capability and an equal or newer minor one; an
architecture-specific one (``sm_90a``: WGMMA, TMA) runs only on exactly that capability. Compiling needs
no GPU (nvcc is enough), so ``compile`` and ``save`` do not check; loading and serving do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from tilefuse.config import CPU_KINDS

_ARCH = re.compile(r"sm_(\d+)(\d)(a?)")


def _cuda_need(arch: str) -> tuple[str, tuple[int, int, bool] | None]:
    """What a CUDA binary for ``arch`` needs, in words, and (major, minor, exact) when the arch parses."""
    m = _ARCH.fullmatch(arch)
    if m is None:
        return "an NVIDIA GPU", None
    major, minor, exact = int(m[1]), int(m[2]), bool(m[3])
    if exact:
        return f"an NVIDIA GPU of compute capability exactly {major}.{minor} ({arch} code)", (major, minor, True)
    return f"an NVIDIA GPU of compute capability {major}.{minor} to {major}.9", (major, minor, False)


def target_problem(target: Mapping) -> str | None:
    """Why kernels built for ``target`` cannot run on this machine, as a sentence; None when they can."""
    kind = target.get("kind")
    if kind in CPU_KINDS:
        return None
    if kind == "cuda":
        arch = str(target.get("arch") or "")
        need, parsed = _cuda_need(arch)
        if not torch.cuda.is_available() or torch.version.hip:
            return (f"target {dict(target)} needs {need} with its driver, and this machine has none "
                    "(torch.cuda.is_available() is False)")
        major, minor = torch.cuda.get_device_capability()
        if parsed is not None and (major != parsed[0] or minor < parsed[1] or (parsed[2] and minor != parsed[1])):
            return (f"target {dict(target)} needs {need}, and this machine's GPU "
                    f"({torch.cuda.get_device_name()}) has compute capability {major}.{minor}")
        return None
    if kind == "hip":
        if torch.version.hip and torch.cuda.is_available():
            return None
        return f"target {dict(target)} needs an AMD GPU with ROCm, and this machine has none"
    if kind == "metal":
        if torch.backends.mps.is_available():
            return None
        return f"target {dict(target)} needs an Apple GPU (MPS), and this machine has none"
    return f"target {dict(target)} kernels cannot run through tilefuse (it only generates their source)"


def local_target_hint() -> str:
    """How to get a model for this machine instead, for the end of an error message."""
    if torch.cuda.is_available() and not torch.version.hip:
        major, minor = torch.cuda.get_device_capability()
        return f"target='cuda:sm_{major}{minor}{'a' if major == 9 else ''}' (this GPU)"
    return "target='c' (this CPU)"

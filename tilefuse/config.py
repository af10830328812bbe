"""Settings: every flag lives here, read from ``TILEFUSE_<NAME>`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TILEFUSE_{name}", default)


def default_target() -> dict:
    """The local target: the first CUDA GPU if torch sees one, else the CPU (``c``)."""
    forced = _env("TARGET", "")
    if forced:
        return parse_target(forced)
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}" + ("a" if major == 9 else "")
        return {"kind": "cuda", "arch": arch}
    return {"kind": "c"}


TARGET_KINDS = ("cuda", "c", "hip", "metal", "ascend")
CPU_KINDS = frozenset({"c", "llvm"})  # targets that compile for this machine's CPU


def parse_target(spec: str | dict | None) -> dict:
    """``"cuda"``, ``"cuda:sm_80"``, ``"c"``, ``"hip:gfx942"`` or a dict -> a target dict."""
    if spec is None:
        return default_target()
    if isinstance(spec, dict):
        if spec.get("kind") not in TARGET_KINDS:
            raise ValueError(f"unknown target kind {spec.get('kind')!r}; known: {', '.join(TARGET_KINDS)}")
        return dict(spec)
    kind, _, arch = spec.partition(":")
    if kind not in TARGET_KINDS:
        raise ValueError(f"unknown target {spec!r}; known kinds: {', '.join(TARGET_KINDS)}")
    if kind == "cuda":
        return {"kind": "cuda", "arch": arch or "sm_90a"}
    if kind == "hip":
        return {"kind": "hip", "mcpu": arch or "gfx942"}
    return {"kind": kind}


@dataclass(frozen=True)
class Options:
    """Compile options shared by every entry point."""

    target: dict = field(default_factory=default_target)
    fuse: bool = _env("FUSE", "1") != "0"
    lower: bool = _env("LOWER", "1") != "0"
    verbose: bool = _env("VERBOSE", "0") != "0"
    # Progress lines on stderr while tuning and compiling kernels: True silences them, False shows them
    # always (the command line's default), None (unset) only when stderr is a terminal (tilefuse/progress.py).
    quiet: bool | None = field(default={"": None, "0": False}.get(_env("QUIET", ""), True), compare=False)
    cuda_graphs: bool = _env("CUDA_GRAPHS", "1") != "0"
    # With CUDA graphs, run the plan's last regions that write its outputs after the replay, outside the
    # graph (no copy of those outputs out of graph memory; see PlanRunner.enable_cuda_graphs). Off until a
    # device run has measured it and its gpu test has passed there.
    eager_tail: bool = _env("EAGER_TAIL", "0") != "0"
    # Run convolutional networks channels last (tilefuse/planner/layout.py). None ("auto"): on the CPU targets,
    # where CI checks it; CUDA stays channels first until a device run has passed the channels-last template
    # tests and measured the zoo there (the kernels compile for sm_90a; their numerics are checked on c).
    channels_last: bool | None = {"": None, "auto": None, "0": False}.get(_env("CHANNELS_LAST", ""), True)
    # Graphs with symbolic input dims compile once per input signature; this many are kept.
    max_specializations: int = int(_env("MAX_SPECIALIZATIONS", "16"))
    # Measure tile configs before lowering: "none", "fast" (a few seeds) or "max" (every candidate); winners
    # are kept in TILEFUSE_TUNING_DB (default ~/.cache/tilefuse/tuning.json), see lowering/tune.py.
    tune: str = _env("TUNE", "none")
    # The most seconds tuning may spend on one model; specs left over keep their default config.
    tune_seconds: float = float(_env("TUNE_SECONDS", "600"))
    # "2:4": prune eligible linear weights to 2:4 sparsity (2 of every 4 along K, by magnitude); the compile
    # reports the outputs' change. On CUDA, 2:4 weights (pruned or already so) run the gemm_sp kernel. See
    # tilefuse/planner/sparsity.py for which weights are eligible.
    sparsity: str | None = _env("SPARSITY", "") or None
    # Called with each runner built (one per compiled graph): lets callers see plans and timings.
    observer: Callable[[Any], None] | None = field(default=None, compare=False)

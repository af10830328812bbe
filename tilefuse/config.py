"""Settings: every flag lives here, read from ``TILEFUSE_<NAME>`` environment variables."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


VERSION = "0.1.0"  # tilefuse's (the package's __version__)


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
        if spec["kind"] == "cuda" and spec.get("arch") is not None:
            check_cuda_arch(spec["arch"])
        return dict(spec)
    kind, _, arch = spec.partition(":")
    if kind not in TARGET_KINDS:
        raise ValueError(f"unknown target {spec!r}; known kinds: {', '.join(TARGET_KINDS)}")
    if kind == "cuda":
        return {"kind": "cuda", "arch": check_cuda_arch(arch or "sm_90a")}
    if kind == "hip":
        return {"kind": "hip", "mcpu": arch or "gfx942"}
    return {"kind": kind}


# CUDA compute capabilities nvcc 12/13 build for (``sm_XY``; ``a``/``f``: the arch-specific feature sets, sm_90 on).
CUDA_ARCHS = (70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)


def check_cuda_arch(arch: str) -> str:
    """``arch`` if it names a CUDA GPU arch (``sm_90a``, ``sm_80``...), else a ValueError saying which exist: a typo
    must not compile every kernel into an nvcc failure and run the model through torch."""
    m = re.fullmatch(r"sm_(\d+)([af]?)", str(arch))
    if m is None or int(m.group(1)) not in CUDA_ARCHS or (m.group(2) and int(m.group(1)) < 90):
        raise ValueError(f"unknown CUDA arch {arch!r}; known: " + ", ".join(f"sm_{a}" for a in CUDA_ARCHS)
                         + " (an 'a' or 'f' suffix from sm_90 on; the H200 is sm_90a)")
    return arch


@dataclass(frozen=True)
class DeviceFacts:
    """What kernels are sized by, for one GPU arch family."""

    sms: int  # streaming multiprocessors: a wave of tiles
    smem_per_block: int  # bytes of shared memory a block may opt in to
    l2_bytes: int


# By arch family: sm_90 is the H200 (what we run on), sm_80 an A100, sm_86/sm_89 the consumer parts' shared memory.
DEVICE_FACTS = {"sm_90": DeviceFacts(132, 227 * 1024, 50 * 2**20), "sm_80": DeviceFacts(108, 163 * 1024, 40 * 2**20),
                "sm_86": DeviceFacts(84, 99 * 1024, 6 * 2**20), "sm_89": DeviceFacts(128, 99 * 1024, 72 * 2**20)}


def cuda_arch(target: dict | str) -> str:
    """A CUDA target's arch: ``"sm_90a"`` for ``{"kind": "cuda", "arch": "sm_90a"}``, ``"cuda:sm_80"`` or ``"cuda"``
    (the default arch)."""
    return target.get("arch", "sm_90a") if isinstance(target, dict) else str(target).partition(":")[2] or "sm_90a"


def arch_family(target: dict | str) -> str:
    """``"sm_90"`` for ``{"kind": "cuda", "arch": "sm_90a"}`` (the default CUDA arch), and so on."""
    return cuda_arch(target).rstrip("a")[:5]


def device_facts(target: dict | str) -> DeviceFacts:
    """The facts of ``target``'s arch family; an unknown family gets sm_80's SM count and 99 KB of shared memory."""
    return DEVICE_FACTS.get(arch_family(target), DeviceFacts(108, 99 * 1024, 40 * 2**20))


def setting(name: str, default: str = "") -> str:
    """``TILEFUSE_<name>`` as it is now: the one place outside ``Options`` that the environment is read (the tuning
    database's and the PrimFunc cache's paths, which are read where they are used)."""
    return _env(name, default)


def _read(name: str, default: str, parse: Callable[[str], Any] = str, **kw):
    """A field whose default is read from ``TILEFUSE_<name>`` when an ``Options`` is constructed (not when this
    module is imported: a variable set later in the process counts)."""
    return field(default_factory=lambda: parse(_env(name, default)), **kw)


def _on(v: str) -> bool:
    return v != "0"


# Options.experimental's names (what each does: lowering/lower.py config_space).
# (Measured wins left this list for the defaults: the ws GEMM and the ws attention with a padding mask,
# lowering/lower.py config_space; attention_ws's pair_rows and fast_math, attention_configs.get_configs.)
EXPERIMENTAL = ("gemm_ws_pingpong", "attention_pingpong", "attention_late_store", "attention_double_q",
                "attention_chain", "attention_pin_softmax", "attention_lean_producer", "pdl_all", "pdl_tma",
                "global_pool")


@dataclass(frozen=True)
class Options:
    """Compile options shared by every entry point; unset ones come from ``TILEFUSE_<NAME>`` at construction."""

    target: dict = field(default_factory=default_target)
    fuse: bool = _read("FUSE", "1", _on)
    lower: bool = _read("LOWER", "1", _on)
    verbose: bool = _read("VERBOSE", "0", _on)
    # Progress lines on stderr while tuning and compiling kernels: True silences them, False shows them
    # always (the command line's default), None (unset) only when stderr is a terminal (tilefuse/progress.py).
    quiet: bool | None = _read("QUIET", "", lambda v: {"": None, "0": False}.get(v, True), compare=False)
    cuda_graphs: bool = _read("CUDA_GRAPHS", "1", _on)
    # With CUDA graphs, run the plan's last regions that write its outputs after the replay, outside the
    # graph: no copy of those outputs out of graph memory (GPT-2's logits: 0.39 ms a call on the H200, measured
    # 2026-12-01 with its gpu test passing there); see PlanRunner.enable_cuda_graphs.
    eager_tail: bool = _read("EAGER_TAIL", "1", _on)
    # Run convolutional networks channels last (tilefuse/planner/layout.py), on every target: on the H200 it took
    # ResNet-50 from 4.02 to 2.70 ms tuned and 10.1 to 4.8 ms untuned (2026-12-01), its gpu tests passing.
    channels_last: bool = _read("CHANNELS_LAST", "1", _on)
    # Each region keeps the fastest of its fused kernel, its own ops through torch and (a GEMM with an epilogue)
    # the split, measured with cold caches on its first call's inputs and remembered in the tuning database
    # (tilefuse/pipeline.py decide). On CUDA and on the CPU targets (there timed with perf_counter, the median
    # of enough calls); 0 runs every region that lowered as its kernel. The test session sets 0 (tests/conftest.py).
    measure: bool = _read("MEASURE", "1", _on)
    # A decode step's linears of one input as one gemv_group launch (q/k/v; a gated MLP's gate and up, the up
    # reading silu(gate) in registers): tilefuse/planner/grouping.py. 0 keeps each linear its own kernel (the A/B
    # of bench_decode.py's tilefuse-apart mode).
    group_linears: bool = _read("GROUP_LINEARS", "1", _on)
    # A decode step's RMSNorm as the prologue of the gemv kernels that read it, its residual add the epilogue of the
    # linear before (tilefuse/planner/norm_fold.py): no norm launches. 0 keeps the norm kernels (bench_decode.py's
    # tilefuse-nofold mode).
    fold_norms: bool = _read("FOLD_NORMS", "1", _on)
    # A decode step's rotary embedding of q and k and its KV-cache stores inside the q/k/v gemv_group
    # (tilefuse/planner/rotary_fold.py): no store kernel per layer. 0 keeps them (bench_decode.py's tilefuse-norotary).
    fold_rotary: bool = _read("FOLD_ROTARY", "1", _on)
    # On CUDA sm_90+, the decode-step kernels (gemv, elementwise, row reductions, attention) launch as programmatic
    # dependents, placed while the kernel before them finishes (lowering/templates/common.py: an HF LLaMA decode
    # step's GPU time 3-5% less on the H200). 0 builds plain launches: the target then carries "pdl": False.
    pdl: bool = _read("PDL", "1", _on)
    # Kernel schedules that measured no consistent win on the H200, kept for A/B runs of whole models (comma-separated
    # ``EXPERIMENTAL`` names; the target then carries them, so their kernels are cached apart): "gemm_ws_pingpong"
    # puts gemm(ws=True, pingpong=True)'s seed first where it applies;
    # "attention_pingpong", "attention_late_store" and "attention_double_q" add those options to the warp-specialized
    # attention's seeds (measured 2026-12-03: none of them a consistent win; bench/results/2026-12-03-h200-session22;
    # with fast math the last two together lead up to 2048 keys: lowering/templates/attention_configs.py SHORT_KEYS);
    # "attention_chain" adds ``chain`` (each tile's first scores under the previous tile's last P V; measured
    # 2026-12-05: slower than without at all 13 of the sweep's shapes; with late_store and fast math on 192x128 tiles
    # it led one, 2x32/8 heads x 8192 D 64, 1.06x cuDNN against 0.96x: bench/results/2026-12-05-h200-session33).
    # "attention_pin_softmax" adds ``pin_softmax`` (each key tile's exponents ahead of the wait for the previous P V,
    # where ptxas put that wait first: lowering/templates/attention_ws.py ``PIN_SRC``; measured 2026-12-06 on an H100:
    # its GPU tests pass, slower at 16 of the 18 D-64 points of the sweep, by 1-8%:
    # bench/results/2026-12-06-h100-session46).
    # "attention_lean_producer" adds ``lean_producer`` (one producer warp loads; the others leave: cuDNN's form).
    # Measured 2026-12-06 on an H100 (bench/results/2026-12-06-h100-session47): its GPU tests pass; within 1% of the
    # default pick at most points of the sweep, 4-8% slower at some, so the three idle warps cost nothing.
    # "pdl_all": every kernel launches as a programmatic dependent, not only a decode step's small ones
    # (lowering/templates/common.py ``PDL_ALL``). Measured 2026-12-06 on an H100 (bench/results/2026-12-06-h100-
    # session45): its GPU tests pass, but zoo GPT-2 ran 4.683 against 4.599 ms without it and BERT 6.904 against 6.697
    # (in turns), their GPU busy time 3% longer.
    # "pdl_tma": the same for the GEMMs and the ws attention alone (their operands come by TMA: TileLang's dropping
    # of ``__restrict__`` from a PDL kernel's parameters costs them nothing). Slower too on the H100 (same run):
    # GPT-2 4.609 against 4.583 ms, BERT 6.823 against 6.706, GPU busy time 1.7-2% longer, the norms' unchanged.
    # (``exp_poly``, a share of the attention's exponents on the FMA units, measured slower than without at all 13
    # shapes on the H100, 2026-12-05: the template and bench_attention.py keep it, no option offers it.)
    # (The ws attention with a padding mask and with nvcc's fast math, opt-in until then, are now the defaults.)
    # (The depthwise template, opt-in as "depthwise" until it ran on a GPU, is now the default on CUDA: 1.12-3.5x
    # cuDNN at ConvNeXt-T's and EfficientNet-B0's shapes on the H200, bench/results/2026-12-07-h200-session56.)
    # "global_pool": a whole-plane average pool channels last (EfficientNet's squeeze-and-excitation, a CNN's head)
    # takes the pool template's global schedule (lowering/templates/pool.py ``global_C``: the plane's pixels split over
    # the threads), not one thread walking each output's window. Checked on the CPU (`c`) and compiled for sm_90a, not
    # yet run on a GPU (run_pending part 92).
    experimental: str = _read("EXPERIMENTAL", "")
    # Graphs with symbolic input dims compile once per input signature; this many are kept.
    max_specializations: int = _read("MAX_SPECIALIZATIONS", "16", int)
    # Measure tile configs before lowering: "none", "fast" (a few seeds) or "max" (every candidate); winners
    # are kept in TILEFUSE_TUNING_DB (default ~/.cache/tilefuse/tuning.json), see lowering/tune.py. Without
    # tuning, GEMMs build with the configs the H200 measured best (lowering/templates/gemm_configs.py).
    tune: str = _read("TUNE", "none")
    # The most seconds tuning may spend on one model; specs left over keep their default config.
    tune_seconds: float = _read("TUNE_SECONDS", "600", float)
    # "2:4": prune eligible linear weights to 2:4 sparsity (2 of every 4 along K, by magnitude); the compile
    # reports the outputs' change. On CUDA, 2:4 weights (pruned or already so) run the gemm_sp kernel. See
    # tilefuse/planner/sparsity.py for which weights are eligible.
    sparsity: str | None = _read("SPARSITY", "", lambda v: v or None)
    # Called with each runner built (one per compiled graph): lets callers see plans and timings.
    observer: Callable[[Any], None] | None = field(default=None, compare=False)

    def __post_init__(self):
        if not self.pdl and self.target.get("kind") == "cuda" and self.target.get("pdl", True):
            object.__setattr__(self, "target", {**self.target, "pdl": False})
        names = tuple(sorted({n.strip() for n in (self.experimental or "").split(",") if n.strip()}))
        unknown = [n for n in names if n not in EXPERIMENTAL]
        if unknown:
            raise ValueError(f"unknown experimental schedule(s) {', '.join(unknown)} (TILEFUSE_EXPERIMENTAL); "
                             f"known: {', '.join(sorted(EXPERIMENTAL))}")
        if names and self.target.get("kind") == "cuda":
            object.__setattr__(self, "target", {**self.target, "experimental": list(names)})

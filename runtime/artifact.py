"""Artifacts: a compiled model saved as one zip file (``.tfz``) and loaded without compiling again.

Note: the layout; every member but the weights and the kernels is JSON::

    manifest.json           format + version, tilefuse/tilelang/torch versions, target, host, options,
                            input/output signature, kernel keys, sha256 and size of every other member
    graph.json              the source graph (``graph_to_json``); constants by name, dtype and shape
    plan.json               the plans the model ran (``plan_to_json``): regions with their backends
                            after lowering, and the planner's canonicalized graph. One plan for a static
                            graph; for a graph with symbolic dims, one per input signature compiled so far
    tuning.json             per plan and lowered region: template, the tile config make_prim_func chose,
                            kernel key
    weights.safetensors     the constants of both graphs (safetensors: no pickle anywhere)
    kernels/<key>/<file>    TileLang cache entries (kernel_lib.so, params.json, sources, manifest.json)
    funcs/<key>.json        each kernel's PrimFunc (TVM JSON)
    integrity.json          the integrity root: one sha256 over every member, manifest.json included
                            (``runtime/integrity.py``)

Note: load does not re-plan: re-planning would redo shape inference on torch's meta tensors, whose
first use imports torch._dynamo (~2 s), and a later planner could group the nodes differently. The
stored plan is checked to partition its graph. Each lowered region's PrimFunc is rebuilt from its
KernelSpec and stored tile config and handed to ``tilelang.compile`` with ``TILELANG_CACHE_DIR``
pointed at the unpacked ``kernels/``: same PrimFunc, target and tilelang version give the same cache
key, so every kernel is a cache hit (no lowering, no gcc/nvcc). ``load_report.compiled`` counts the
kernels that were compiled all the same: a cache key the artifact does not carry (the templates changed
since saving), or an unpacked entry TileLang rejected and rebuilt (``integrity.rebuilt_entries``); either
warns. A different target, tilelang version or host (for ``c`` also the CPU, as kernels are built with
``-march=native``) recompiles from graph.json with an ``ArtifactWarning``, or raises
``ArtifactMismatchError`` when ``strict`` (strict also wants the same tilefuse version, and refuses a
load that compiled anything). A target this machine cannot run (``cuda`` without a GPU, or a GPU of
another architecture) is refused whether strict or not; ``target=`` recompiles for another target.

Note: trust. The hashes and the integrity root detect corruption and edits of any member or of the
manifest, not a hostile author (who can recompute them). Loading runs no Python from the artifact (no pickle, no eval; JSON and
safetensors only) and never extracts a path it did not build itself, but it does load the artifact's
compiled kernel libraries: load only artifacts you trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import asdict as dataclasses_asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tilelang
import torch
import tvm

from tilefuse.config import VERSION as __version__
from tilefuse.ir import dtype_name, torch_dtype
from tilefuse.lowering import func_cache
from tilefuse.lowering.compile import compile_kernel
from tilefuse.lowering.lower import make_prim_func
from tilefuse.runtime.integrity import (
    FORMAT,
    FORMAT_VERSION,
    FUNC_MEMBER,
    GRAPH,
    KERNEL_MEMBER,
    LIBS,
    MANIFEST,
    PLAN,
    ROOT,
    SHA,
    TUNING,
    WEIGHTS,
    ArtifactError,
    entry_stamps,
    json_member,
    read_artifact,
    rebuilt_entries,
    root_bytes,
)
from tilefuse.runtime.kernels import RegionKernel
from tilefuse.runtime.machine import local_target_hint, target_problem
from tilefuse.runtime.serialize import (
    graph_from_json,
    graph_to_json,
    plan_from_json,
    plan_to_json,
    type_json,
    weights_bytes,
    weights_from,
)

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member dates: the same model saves to the same bytes


class ArtifactMismatchError(ArtifactError):
    """An artifact built for a target this machine cannot run, or a strict load of one built for another
    target, toolchain or host (or one that compiled a kernel)."""


class ArtifactWarning(UserWarning):
    """An artifact loaded with recompilation (another target, tilelang version or host)."""


@dataclass(frozen=True)
class LoadReport:
    """What ``load`` did: ``compiled`` counts kernels that were compiled, not loaded (0 on a clean load);
    ``failed`` those that failed to load or compile (their regions run through torch)."""

    path: str
    seconds: float
    kernels: int
    cache_hits: int
    compiled: int
    recompiled: str | None = None  # why the model was recompiled from its graph, if it was
    failed: int = 0


# ---- graph <-> JSON ---------------------------------------------------------------------------

def host_info(target: Mapping) -> dict:
    """The host facts compiled kernels depend on: OS and machine; for ``c`` also the CPU (``-march=native``)."""
    info = {"platform": f"{sys.platform}-{platform.machine()}"}
    if target.get("kind") in ("c", "llvm"):
        text = platform.processor()
        with contextlib.suppress(OSError):
            first = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
            text = "\n".join(line for line in first if line.split(":")[0].strip() in
                             ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part"))
        info["cpu"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return info


def _cache_entry(kernel) -> tuple[str, Path] | None:
    """The TileLang cache entry a compiled kernel came from (TileLang tags kernels with it), if it exists."""
    key, path = getattr(kernel, "_tilelang_cache_key", None), getattr(kernel, "_tilelang_cache_path", None)
    if key and path and SHA.fullmatch(key) and (Path(path) / "params.json").is_file() \
            and any((Path(path) / lib).is_file() for lib in LIBS):
        return key, Path(path)
    return None


def _kernel_entries(runner, target: dict, scratch: Path) -> tuple[dict, dict[str, Path], dict]:
    """``runner``'s tuning decisions by region, the cache entry directory and the PrimFunc of each kernel."""
    regions, entries, funcs = {}, {}, {}
    for name, rk in sorted(runner.kernels.items()):
        rk = getattr(rk, "tail_fn", rk)  # a split region keeps its epilogue's kernel (its GEMM runs through torch)
        if not isinstance(rk, RegionKernel):
            raise TypeError(f"region {name} runs a {type(rk).__name__}, not a TileLang kernel; it cannot be saved")
        spec, config = rk.spec, rk.config  # the config it was built with (lowering.lower.Lowered)
        found = _cache_entry(rk.kernel)
        if found is None:  # compiled with the cache off (or its entry was deleted): build one in scratch
            with kernel_cache(scratch):
                found = _cache_entry(compile_kernel(make_prim_func(spec, target, config), target,
                                                    list(spec.out_idx)))
            if found is None:
                raise RuntimeError(f"region {name}: TileLang wrote no cache entry for its kernel; cannot save it")
        entries[found[0]] = found[1]
        regions[name] = {"template": spec.template, "config": config, "kernel": found[0],
                         "spec": spec_digest(spec, config)}
        func = getattr(rk.kernel, "prim_func", None)
        if func is not None:
            funcs[found[0]] = func
    return {"regions": regions}, entries, funcs


def spec_digest(spec, config) -> str:
    """What a kernel was built from: a saved PrimFunc stands in for a rebuild only while this matches."""
    return hashlib.sha256(repr((spec.template, spec.params, spec.out_idx, config)).encode()).hexdigest()


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, indent=1, allow_nan=False).encode()


def save(compiled, path: str | os.PathLike) -> Path:
    """Write ``compiled`` (a ``CompiledModel``) to the artifact ``path`` (one zip, ``.tfz`` by convention).

    The file is written next to ``path`` and renamed into place, so a reader never sees half of it.
    """
    graph, options = compiled.graph, compiled.options
    # A static graph has one runner; a graph with symbolic dims one per input signature compiled so far.
    runners = [(None, compiled.runner)] if compiled.runner is not None else list(compiled._specialized.items())
    for _, runner in runners:
        if getattr(runner, "plan", None) is None:
            raise ValueError(f"{graph.name}: the compiled model has no fusion plan; only plan runners can be saved")
    path, target = Path(path), dict(options.target)
    constants = dict(graph.constants)
    for _, runner in runners:  # the planner's graphs share the source's constants (or add some)
        for k, t in runner.plan.graph.constants.items():
            if constants.setdefault(k, t) is not t and not torch.equal(constants[k], t):
                raise ValueError(f"{graph.name}: constant {k!r} differs between the graph and a plan's graph")
    plans, tunings, entries, funcs = [], [], {}, {}
    with tempfile.TemporaryDirectory(prefix="tilefuse-save-") as scratch:
        for sig, runner in runners:
            tuning, found, prim_funcs = _kernel_entries(runner, target, Path(scratch))
            funcs.update(prim_funcs)
            sig = None if sig is None else [[list(shape), dtype_name(dtype), device] for shape, dtype, device in sig]
            plans.append({"signature": sig, **plan_to_json(runner.plan)})
            tunings.append({"signature": sig, **tuning})
            entries.update(found)
        members = {GRAPH: _json_bytes(graph_to_json(graph)), PLAN: _json_bytes({"plans": plans}),
                   TUNING: _json_bytes({"plans": tunings})}
        for key, entry in sorted(entries.items()):
            for f in sorted(entry.iterdir()):
                if f.name.startswith("."):  # TileLang's temporary files
                    continue
                if not KERNEL_MEMBER.fullmatch(f"kernels/{key}/{f.name}"):
                    raise ValueError(f"TileLang cache entry {entry} holds {f.name}, which artifacts do not carry "
                                     "(use the default execution backend)")
                members[f"kernels/{key}/{f.name}"] = f.read_bytes()
    for key, func in sorted(funcs.items()):
        members[f"funcs/{key}.json"] = tvm.ir.save_json(func).encode()
    members[WEIGHTS] = weights_bytes(constants)
    return _write(path, _manifest(graph, options, target, sorted(entries), members), members)


def _manifest(graph, options, target: dict, kernels: list[str], members: dict[str, bytes], **extra) -> dict:
    signature = [{"name": v.name, **type_json(v.type)} for v in graph.inputs]
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "tilefuse": __version__,
        "tilelang": tilelang.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "target": target, "host": host_info(target), "graph": graph.name,
        "options": {"fuse": options.fuse, "lower": options.lower, "cuda_graphs": options.cuda_graphs,
                    "sparsity": options.sparsity},
        "inputs": signature, "outputs": [{"name": v.name, **type_json(v.type)} for v in graph.output_values()],
        "kernels": kernels, **extra,
        "members": {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in members.items()},
    }


def _write(path: Path, manifest: dict, members: dict[str, bytes]) -> Path:
    """The zip at ``path``: the manifest, ``members`` and the integrity root, written beside it and renamed in."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    members = {MANIFEST: _json_bytes(manifest), **members}
    members[ROOT] = root_bytes(members)
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            for name, data in members.items():
                info = zipfile.ZipInfo(name, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_STORED if name == WEIGHTS else zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


# Where kernels built for a vendor's toolchain (``lowering/vendor.py``) run, for the error that refuses to load them.
VENDOR_NEEDS = {"hip": "an AMD GPU with ROCm to load its .hsaco code objects (hipModuleLoad)",
                "metal": "an Apple GPU, its .metal source built by Apple's Metal compiler (xcrun metal, macOS)",
                "ascend": "an Ascend NPU, its AscendC source built by CANN's bisheng compiler"}


def save_vendor(build, graph, options, path: str | os.PathLike) -> Path:
    """Write a vendor build (``lowering.vendor.VendorBuild``: the plan for a hip/metal/ascend target and each
    kernel's source and build product) as an artifact: graph, plan and weights as ``save`` writes them, tuning.json
    with each region's template, config, kernel key and resources, and ``vendor/<key>.<ext>`` per distinct kernel
    (``.hip`` + ``.hsaco``, ``.metal``, ``.cpp``). ``tilefuse.load`` refuses it where the vendor's device is absent,
    naming what it needs; ``target=`` recompiles it from its graph for a target that runs here."""
    path, target, plan = Path(path), dict(build.target), build.plan
    constants = {**graph.constants, **plan.graph.constants}
    regions, members = {}, {}
    for k in build.kernels:
        regions[k.region] = {"template": k.template, "config": k.config, "kernel": k.key,
                             "resources": [dataclasses_asdict(r) for r in k.resources]}
        members[f"vendor/{k.key}.{k.ext}"] = k.source.encode()
        if k.product is not None:
            members[f"vendor/{k.key}.{k.product_ext}"] = k.product
    members = {GRAPH: _json_bytes(graph_to_json(graph)),
               PLAN: _json_bytes({"plans": [{"signature": None, **plan_to_json(plan)}]}),
               TUNING: _json_bytes({"plans": [{"signature": None, "regions": regions}]}),
               **dict(sorted(members.items())), WEIGHTS: weights_bytes(constants)}
    vendor = {"built_by": build.toolchain, "kernels": sorted({k.key for k in build.kernels})}
    return _write(path, _manifest(graph, options, target, [], members, vendor=vendor), members)


# ---- reading and checking ---------------------------------------------------------------------

class _Mismatch(Exception):
    """The artifact is sound but was made for something else: recompile (or refuse, when strict)."""


@contextlib.contextmanager
def _blame(path: Path, member: str):
    """Turn a malformed member's parse error into an ``ArtifactError`` naming the member."""
    try:
        yield
    except (ArtifactError, _Mismatch):
        raise
    except Exception as e:  # noqa: BLE001 - anything a malformed member makes a parser raise
        raise ArtifactError(f"{path}: member {member} is malformed ({type(e).__name__}: {e})") from None


# ---- load -------------------------------------------------------------------------------------

@contextlib.contextmanager
def kernel_cache(root: str | os.PathLike):
    """Point TileLang's kernel cache at ``root``, with the cache on, for the block (process-wide): through
    TileLang's own overrides of its settings (``tilelang.env``), never by writing ``os.environ``."""
    from tilelang.env import CacheState, Environment

    settings = (Environment.__dict__["TILELANG_CACHE_DIR"], Environment.__dict__["TILELANG_DISABLE_CACHE"])
    saved = [v._forced_value for v in settings]
    was_on = CacheState.is_enabled()
    settings[0]._forced_value, settings[1]._forced_value = str(root), "0"
    CacheState.enable()
    try:
        yield
    finally:
        for v, old in zip(settings, saved):
            v._forced_value = old
        if not was_on:
            CacheState.disable()


def _mismatches(manifest: dict, target: dict, strict: bool) -> list[str]:
    why = []
    if json.dumps(manifest["target"], sort_keys=True) != json.dumps(target, sort_keys=True):
        why.append(f"it was compiled for target {manifest['target']}, not {target}")
    elif manifest["host"] != host_info(target):
        why.append(f"its kernels were built on another host ({manifest['host']}; this one is {host_info(target)})")
    if manifest["tilelang"] != tilelang.__version__:
        why.append(f"its kernels were built by tilelang {manifest['tilelang']}; this is tilelang {tilelang.__version__}")
    if strict and manifest["tilefuse"] != __version__:
        why.append(f"it was saved by tilefuse {manifest['tilefuse']}; this is tilefuse {__version__}")
    return why


def _tuning(doc: dict, keys: set[str]) -> dict[str, tuple[str, dict | None, str, str | None]]:
    out = {}
    for name, r in doc["regions"].items():
        config = r["config"]
        if config is not None and not all(isinstance(k, str) and k.isidentifier() and isinstance(v, (int, float, str))
                                          for k, v in config.items()):
            raise ValueError(f"region {name}: bad tile config {config!r}")
        if r["kernel"] not in keys:
            raise ValueError(f"region {name}: kernel {r['kernel']} is not in the artifact")
        out[str(name)] = (str(r["template"]), config, r["kernel"], r.get("spec"))
    return out


def _plans(path: Path, data: dict[str, bytes], constants: dict, keys: set[str]) -> list[tuple]:
    """(input signature or None, FusionPlan, tuning by region) for each plan the artifact holds."""
    with _blame(path, PLAN):
        docs = json_member(path, PLAN, data[PLAN])["plans"]
        plans = [(None if d["signature"] is None else
                  tuple((tuple(int(n) for n in shape), torch_dtype(dtype), str(device))
                        for shape, dtype, device in d["signature"]), plan_from_json(d, constants)) for d in docs]
    with _blame(path, TUNING):
        tunings = [_tuning(t, keys) for t in json_member(path, TUNING, data[TUNING])["plans"]]
        if len(tunings) != len(plans):
            raise ValueError(f"{len(tunings)} tunings for {len(plans)} plans")
    return [(sig, plan, tuning) for (sig, plan), tuning in zip(plans, tunings)]


@dataclass
class Contents:
    """An artifact read and checked (every member hashed, parsed and consistent): what a load builds from."""

    path: Path
    manifest: dict
    data: dict[str, bytes]
    graph: Any
    plans: list[tuple]  # (input signature or None, FusionPlan, tuning by region: (template, config, key, digest))
    options: Any  # the compile options the artifact records, with the target to load for
    why: list[str]  # why its kernels cannot be loaded as they are (target, host, versions): recompile or refuse


def read(path: str | os.PathLike, options_for: Any, target: str | dict | None = None,
         strict: bool = False) -> Contents:
    """Read and check the artifact at ``path``. ``options_for(target, manifest options)`` makes the compile
    options (``config.Options``). Raises ``ArtifactError`` for a corrupted, tampered or malformed artifact, and
    ``ArtifactMismatchError`` for a target this machine cannot run."""
    path = Path(path)
    manifest, data = read_artifact(path)
    with _blame(path, WEIGHTS):
        constants = weights_from(data[WEIGHTS])
    with _blame(path, GRAPH):
        graph = graph_from_json(json_member(path, GRAPH, data[GRAPH]), constants)
    with _blame(path, MANIFEST):
        vendor_keys = {k for k in manifest["vendor"]["kernels"] if SHA.fullmatch(k)} if "vendor" in manifest else set()
    plans = _plans(path, data, constants, set(manifest["kernels"]) | vendor_keys)
    used = set(graph.constants).union(*(p.graph.constants for _, p, _ in plans))
    if set(constants) - used:
        raise ArtifactError(f"{path}: member {WEIGHTS} holds tensors no graph uses: {sorted(set(constants) - used)[:5]}")
    with _blame(path, MANIFEST):
        options = options_for(target if target is not None else manifest["target"], manifest["options"])
    problem = target_problem(options.target)
    kind = manifest["target"].get("kind")
    if "vendor" in manifest and options.target == manifest["target"]:  # kernels for a vendor toolchain: never run here
        raise ArtifactMismatchError(
            f"{path}: built for target {manifest['target']} as {kind} kernels for the vendor's toolchain, which "
            f"need {VENDOR_NEEDS.get(kind, 'the vendor device')}; tilefuse does not run them"
            + (f" ({problem})" if problem else "") + f". Pass {local_target_hint()} to recompile it from its graph")
    if problem is not None:
        raise ArtifactMismatchError(f"{path}: {problem}, so its kernels cannot run here. Load it on such a machine, "
                                    f"or pass {local_target_hint()} to recompile it from its graph")
    return Contents(path, manifest, data, graph, plans, options, _mismatches(manifest, options.target, strict))


class KernelStore:
    """The artifact's kernels unpacked as a TileLang cache in a temporary directory (removed with the last runner
    that keeps this store), and its saved PrimFuncs: ``prebuilt`` hands the lowering a saved PrimFunc wherever
    the spec and config it was saved for are the ones asked for (the same cache key, milliseconds to read)."""

    def __init__(self, contents: Contents):
        self.contents = contents
        self.scratch = tempfile.TemporaryDirectory(prefix="tilefuse-kernels-")
        with kernel_cache(self.scratch.name):
            from tilelang.cache.kernel_cache import KernelCache  # (tilelang's own cache layout)

            root = Path(KernelCache._get_cache_root())  # <dir>/<tilelang version>/<os-machine>/kernels
        data = contents.data
        for name, blob in data.items():
            m = KERNEL_MEMBER.fullmatch(name)
            if m:  # a name that matched a strict pattern: it cannot leave root
                (root / m[1]).mkdir(parents=True, exist_ok=True)
                (root / m[1] / m[2]).write_bytes(blob)
        self.root = root
        self.stamps = entry_stamps(root, {m[1] for name in data for m in [KERNEL_MEMBER.fullmatch(name)] if m})
        self.funcs = {}
        for name, blob in data.items():
            m = FUNC_MEMBER.fullmatch(name)
            if m:
                with _blame(contents.path, name):
                    self.funcs[m[1]] = func_cache.load_func(blob.decode())

    def prebuilt(self, tuning: dict) -> Any:
        """``lower``'s ``prebuilt(spec, config)`` for one plan's ``tuning``."""
        saved = {digest: key for _, _, key, digest in tuning.values() if digest}
        return lambda spec, config: self.funcs.get(saved.get(spec_digest(spec, config), ""))

    def rebuilt(self) -> set[str]:
        """Keys of the artifact's kernels TileLang compiled again (its entry rejected)."""
        return rebuilt_entries(self.root, self.stamps)


def report(contents: Contents, keys: list, rebuilt: set[str], failed: list[str], seconds: float,
           strict: bool) -> LoadReport:
    """What a load did, from the cache keys of the kernels loaded (warned of; refused when ``strict`` and anything
    compiled)."""
    path, manifest = contents.path, contents.manifest
    n = len({k for k in keys if k}) + keys.count(None)  # distinct kernels; None: a kernel with no cache key
    rebuilt &= set(keys)
    hits = len({k for k in keys if k} & set(manifest["kernels"]) - rebuilt)
    missing, msgs = n - hits - len(rebuilt), []
    if missing:
        msgs.append(f"{missing} of {n} kernels were not in the artifact and were compiled (saved by tilefuse "
                    f"{manifest['tilefuse']}, this is {__version__})")
    if rebuilt:
        msgs.append(f"{len(rebuilt)} of {n} kernels were in the artifact but TileLang rejected their library (it "
                    f"does not match TileLang's entry manifest, or does not load here) and compiled them again: "
                    f"{', '.join(k[:12] for k in sorted(rebuilt))}")
    if failed:
        msgs.append(f"the kernels of regions {', '.join(failed)} failed to load; they run through torch")
    if msgs and strict:
        raise ArtifactMismatchError(f"{path}: {'; '.join(msgs)} (strict load: refusing a load that compiled)")
    for msg in msgs:
        warnings.warn(f"{path}: {msg}", ArtifactWarning, stacklevel=3)
    return LoadReport(str(path), seconds, n, hits, n - hits, failed=len(failed))

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

Note: load does not re-plan: re-planning would redo shape inference on torch's meta tensors, whose
first use imports torch._dynamo (~2 s), and a later planner could group the nodes differently. The
stored plan is checked to partition its graph. Each lowered region's PrimFunc is rebuilt from its
KernelSpec and stored tile config and handed to ``tilelang.compile`` with ``TILELANG_CACHE_DIR``
pointed at the unpacked ``kernels/``: same PrimFunc, target and tilelang version give the same cache
key, so every kernel is a cache hit (no lowering, no gcc/nvcc). Each loaded kernel's cache key is
checked against the artifact's; ``load_report.compiled`` counts the misses (a miss warns: the
templates changed since saving). A different target, tilelang version or host (for ``c`` also the
CPU, as kernels are built with ``-march=native``) recompiles from graph.json with an
``ArtifactWarning``, or raises ``ArtifactMismatchError`` when ``strict`` (strict also wants the same
tilefuse version, and refuses a load that compiled anything).

Note: trust. The hashes detect corruption and tampering of members, not a hostile author (who can
rewrite manifest.json too). Loading runs no Python from the artifact (no pickle, no eval; JSON and
safetensors only) and never extracts a path it did not build itself, but it does load the artifact's
compiled kernel libraries: load only artifacts you trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tilefuse.ir import dtype_name, torch_dtype
from tilefuse.runtime.serialize import (
    _type_json,
    _weights_bytes,
    _weights_from,
    graph_from_json,
    graph_to_json,
    plan_from_json,
    plan_to_json,
)

FORMAT, FORMAT_VERSION = "tilefuse-artifact", 1
MANIFEST, GRAPH, PLAN, TUNING, WEIGHTS = "manifest.json", "graph.json", "plan.json", "tuning.json", "weights.safetensors"
REQUIRED = (GRAPH, PLAN, TUNING, WEIGHTS)
# The files of a TileLang cache entry for the default execution backends (cython for c, tvm_ffi for cuda).
# Backends that cache Python (nvrtc/cutedsl ``kernel.py``) are left out: loading runs no Python from an artifact.
_LIBS = ("kernel_lib.so", "executable.so")
_KERNEL_FILES = (*_LIBS, "params.json", "manifest.json", "device_kernel.cu", "host_kernel.cu", "resource_usage.json")
_KERNEL_MEMBER = re.compile(r"kernels/([0-9a-f]{64})/(" + "|".join(map(re.escape, _KERNEL_FILES)) + ")")
# Each kernel's PrimFunc as TVM JSON (IR data, no code): loading it takes milliseconds where rebuilding it
# from the template takes ~0.15 s a kernel, and it hashes to the same cache key.
_FUNC_MEMBER = re.compile(r"funcs/([0-9a-f]{64})\.json")
_SHA = re.compile(r"[0-9a-f]{64}")
_RAW_DTYPES = frozenset({"complex128"})  # safetensors has no such dtype: stored as bytes
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member dates: the same model saves to the same bytes


class ArtifactError(ValueError):
    """An artifact that cannot be trusted or read: corrupted, tampered, truncated, unsafe or malformed."""


class ArtifactMismatchError(ArtifactError):
    """A strict load of an artifact built for another target, toolchain or host."""


class ArtifactWarning(UserWarning):
    """An artifact loaded with recompilation (another target, tilelang version or host)."""


@dataclass(frozen=True)
class LoadReport:
    """What ``load`` did: ``compiled`` counts kernels that were not cache hits (0 on a clean load)."""

    path: str
    seconds: float
    kernels: int
    cache_hits: int
    compiled: int
    recompiled: str | None = None  # why the model was recompiled from its graph, if it was


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


def _candidate_configs(spec, target: dict) -> list[dict]:
    """The configs make_prim_func chooses among for ``spec`` (its template's seeds)."""
    from tilefuse.lowering.registry import config_space
    from tilefuse.lowering.tune import best_config

    tuned = best_config(spec, target)
    return ([tuned] if tuned else []) + config_space(spec, target)


def _tile_config(spec, target: dict, func) -> dict | None:
    """The tile config ``func`` was built with: the candidate whose PrimFunc prints the same (None if none)."""
    from tilefuse.lowering.registry import make_prim_func

    if func is None:
        return None
    want = func.script(show_meta=True)
    for config in _candidate_configs(spec, target):
        with contextlib.suppress(Exception):  # a seed this spec cannot take is simply not the one chosen
            if make_prim_func(spec, target, config).script(show_meta=True) == want:
                return dict(config)
    return None


def _cache_entry(kernel) -> tuple[str, Path] | None:
    """The TileLang cache entry a compiled kernel came from (TileLang tags kernels with it), if it exists."""
    key, path = getattr(kernel, "_tilelang_cache_key", None), getattr(kernel, "_tilelang_cache_path", None)
    if key and path and _SHA.fullmatch(key) and (Path(path) / "params.json").is_file() \
            and any((Path(path) / lib).is_file() for lib in _LIBS):
        return key, Path(path)
    return None


def _kernel_entries(runner, target: dict, scratch: Path) -> tuple[dict, dict[str, Path], dict]:
    """``runner``'s tuning decisions by region, the cache entry directory and the PrimFunc of each kernel."""
    from tilefuse.lowering.compile import compile_kernel
    from tilefuse.lowering.registry import RegionKernel, make_prim_func

    regions, entries, configs, funcs = {}, {}, {}, {}
    for name, rk in sorted(runner.kernels.items()):
        rk = getattr(rk, "tail_fn", rk)  # a split region keeps its epilogue's kernel (its GEMM runs through torch)
        if not isinstance(rk, RegionKernel):
            raise TypeError(f"region {name} runs a {type(rk).__name__}, not a TileLang kernel; it cannot be saved")
        spec = rk.spec
        sk = (spec.template, spec.params, spec.out_idx)
        if sk not in configs:
            configs[sk] = _tile_config(spec, target, getattr(rk.kernel, "prim_func", None))
        found = _cache_entry(rk.kernel)
        if found is None:  # compiled with the cache off (or its entry was deleted): build one in scratch
            with _tilelang_cache(scratch):
                found = _cache_entry(compile_kernel(make_prim_func(spec, target, configs[sk]), target,
                                                    list(spec.out_idx)))
            if found is None:
                raise RuntimeError(f"region {name}: TileLang wrote no cache entry for its kernel; cannot save it")
        entries[found[0]] = found[1]
        regions[name] = {"template": spec.template, "config": configs[sk], "kernel": found[0],
                         "spec": _spec_digest(spec, configs[sk])}
        func = getattr(rk.kernel, "prim_func", None)
        if func is not None:
            funcs[found[0]] = func
    return {"regions": regions}, entries, funcs


def _spec_digest(spec, config) -> str:
    """What a kernel was built from: a saved PrimFunc stands in for a rebuild only while this matches."""
    return hashlib.sha256(repr((spec.template, spec.params, spec.out_idx, config)).encode()).hexdigest()


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, indent=1, allow_nan=False).encode()


def save(compiled, path: str | os.PathLike) -> Path:
    """Write ``compiled`` (a ``CompiledModel``) to the artifact ``path`` (one zip, ``.tfz`` by convention).

    The file is written next to ``path`` and renamed into place, so a reader never sees half of it.
    """
    import tilelang

    from tilefuse import __version__

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
                if not _KERNEL_MEMBER.fullmatch(f"kernels/{key}/{f.name}"):
                    raise ValueError(f"TileLang cache entry {entry} holds {f.name}, which artifacts do not carry "
                                     "(use the default execution backend)")
                members[f"kernels/{key}/{f.name}"] = f.read_bytes()
    import tvm

    for key, func in sorted(funcs.items()):
        members[f"funcs/{key}.json"] = tvm.ir.save_json(func).encode()
    members[WEIGHTS] = _weights_bytes(constants)
    signature = [{"name": v.name, **_type_json(v.type)} for v in graph.inputs]
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "tilefuse": __version__,
        "tilelang": tilelang.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "target": target, "host": host_info(target), "graph": graph.name,
        "options": {"fuse": options.fuse, "lower": options.lower, "cuda_graphs": options.cuda_graphs,
                    "sparsity": options.sparsity},
        "inputs": signature, "outputs": [{"name": v.name, **_type_json(v.type)} for v in graph.output_values()],
        "kernels": sorted(entries),
        "members": {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in members.items()},
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            for name, data in ((MANIFEST, _json_bytes(manifest)), *members.items()):
                info = zipfile.ZipInfo(name, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_STORED if name == WEIGHTS else zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


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


def _check_name(path: Path, name: str) -> None:
    if name in (MANIFEST, *REQUIRED) or _KERNEL_MEMBER.fullmatch(name) or _FUNC_MEMBER.fullmatch(name):
        return
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or re.match(r"[A-Za-z]:", name):
        raise ArtifactError(f"{path}: member {name!r} has an unsafe path (absolute or with '..'); refused")
    raise ArtifactError(f"{path}: unexpected member {name!r}")


def _check_manifest(m: Any) -> dict:
    """The manifest's member table, after checking the manifest's shape (``ValueError`` otherwise)."""
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError("not a tilefuse artifact manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format version {m.get('format_version')!r}; this tilefuse reads version "
                         f"{FORMAT_VERSION} (save the model again with this tilefuse)")
    for k in ("tilefuse", "tilelang", "torch"):
        if not isinstance(m[k], str):
            raise TypeError(f"{k} version is not a string")
    if not (isinstance(m["target"], dict) and isinstance(m["target"].get("kind"), str)):
        raise TypeError(f"bad target {m['target']!r}")
    if not (isinstance(m["host"], dict) and isinstance(m["options"], dict)):
        raise TypeError("bad host or options")
    if not all(isinstance(k, str) and _SHA.fullmatch(k) for k in m["kernels"]):
        raise ValueError("bad kernel keys")
    members = m["members"]
    for name, meta in members.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and _SHA.fullmatch(meta["sha256"])
                and isinstance(meta.get("size"), int) and meta["size"] >= 0):
            raise ValueError(f"bad entry for member {name!r}")
    return members


def _read_member(zf: zipfile.ZipFile, path: Path, name: str) -> bytes:
    try:
        return zf.read(name)
    except Exception as e:  # noqa: BLE001 - BadZipFile (CRC), zlib.error, EOFError: all mean a damaged member
        raise ArtifactError(f"{path}: member {name} is corrupted ({type(e).__name__}: {e})") from None


def _json_member(path: Path, name: str, blob: bytes) -> Any:
    def refuse(c):
        raise ValueError(f"{c} is not JSON")

    try:
        return json.loads(blob.decode("utf-8"), parse_constant=refuse)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ArtifactError(f"{path}: member {name} is not valid JSON ({e})") from None


def read_artifact(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every other member's bytes, each checked against the manifest's size and sha256.

    Raises ``ArtifactError`` naming the member for a truncated archive, an unsafe or unexpected member
    name, a missing or unlisted member, a bad manifest or format version, or a hash mismatch.
    """
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError) as e:
        raise ArtifactError(f"{path}: not a tilefuse artifact: the zip archive is truncated or damaged ({e})") from None
    with zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        for n in names:
            _check_name(path, n)
        if len(set(names)) != len(names):
            raise ArtifactError(f"{path}: member {next(n for n in names if names.count(n) > 1)!r} appears twice")
        if MANIFEST not in names:
            raise ArtifactError(f"{path}: member {MANIFEST} is missing")
        manifest = _json_member(path, MANIFEST, _read_member(zf, path, MANIFEST))
        with _blame(path, MANIFEST):
            listed = _check_manifest(manifest)
        for n in (*REQUIRED, *listed, *(f"kernels/{k}/params.json" for k in manifest["kernels"])):
            if n not in names:
                raise ArtifactError(f"{path}: member {n} is missing")
        for k in manifest["kernels"]:
            if not any(f"kernels/{k}/{lib}" in names for lib in _LIBS):
                raise ArtifactError(f"{path}: member kernels/{k}/{' or '.join(_LIBS)} is missing")
        data = {}
        for info in infos:
            n = info.filename
            if n == MANIFEST:
                continue
            if n not in listed:
                raise ArtifactError(f"{path}: member {n} is not listed in {MANIFEST}")
            if info.file_size != listed[n]["size"]:
                raise ArtifactError(f"{path}: member {n} has {info.file_size} bytes, {MANIFEST} says {listed[n]['size']}")
            blob = _read_member(zf, path, n)
            if hashlib.sha256(blob).hexdigest() != listed[n]["sha256"]:
                raise ArtifactError(f"{path}: member {n} fails its sha256 check (corrupted or tampered)")
            data[n] = blob
    return manifest, data


# ---- load -------------------------------------------------------------------------------------

@contextlib.contextmanager
def _tilelang_cache(root: str | os.PathLike):
    """Point TileLang's kernel cache at ``root``, with the cache on, for the block (process-wide)."""
    from tilelang.env import CacheState

    saved = {k: os.environ.get(k) for k in ("TILELANG_CACHE_DIR", "TILELANG_DISABLE_CACHE")}
    was_on = CacheState.is_enabled()
    os.environ.update(TILELANG_CACHE_DIR=str(root), TILELANG_DISABLE_CACHE="0")
    CacheState.enable()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not was_on:
            CacheState.disable()


def _mismatches(manifest: dict, target: dict, strict: bool) -> list[str]:
    import tilelang

    from tilefuse import __version__

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


def _lower(path: Path, plan, target: dict, tuning: dict, scratch: Path, funcs: dict[str, bytes] | None = None):
    """Each tilelang region's kernel, built from its stored config and loaded from the unpacked cache."""
    from tilefuse.lowering.compile import compile_many
    from tilefuse.lowering.registry import KernelSpec, RegionKernel, build, graph_facts, make_prim_func
    from tilefuse.lowering.split import SplitRegion, node_maps, split
    from tilefuse.runtime.plan_runner import reference_region

    graph = plan.graph
    facts = graph_facts(graph)
    specs, parts, maps = {}, {}, node_maps(plan)
    for r in plan.regions:
        if r.backend not in ("tilelang", "split"):
            continue
        if r.backend == "split":  # the stored kernel is the epilogue's, the part after the GEMM
            parts[r.name] = split(plan, r, maps)
            if parts[r.name] is None:
                raise _Mismatch(f"region {r.name} was saved split in two and does not split here")
        lowered = parts[r.name][1] if r.name in parts else r
        s, (template, config, _) = build(lowered, graph, target, facts), tuning.get(r.name, (None, None, None, None))[:3]
        if not isinstance(s, KernelSpec) or s.template != template:
            raise _Mismatch(f"region {r.name} lowers differently here ({getattr(s, 'template', s)}) "
                            f"than when it was saved ({template})")
        specs[r.name] = (s, config)

    def key(s, c):  # regions with one spec and config share one kernel
        return s.template, s.params, s.out_idx, json.dumps(c, sort_keys=True)

    distinct = {key(s, c): (s, c) for s, c in specs.values()}
    stored = {key(s, c): tuning[name][2] for name, (s, c) in specs.items()}
    same = {key(s, c): tuning[name][3] == _spec_digest(s, c) for name, (s, c) in specs.items()}
    items = []
    for k, (s, c) in distinct.items():
        blob = (funcs or {}).get(stored[k]) if same[k] else None
        if blob is not None:  # the saved PrimFunc: same cache key, milliseconds to read
            import tvm

            with _blame(path, f"funcs/{stored[k]}.json"):
                items.append((tvm.ir.load_json(blob.decode()), list(s.out_idx)))
            continue
        with _blame(path, TUNING):  # a stored config the template rejects
            items.append((make_prim_func(s, target, c), list(s.out_idx)))
    with _tilelang_cache(scratch):
        compiled = dict(zip(distinct, compile_many(items, target, return_exceptions=True))) if items else {}
    kernels, failed = {}, []
    nodes = facts[0]
    for name, (s, c) in specs.items():
        k = compiled[key(s, c)]
        if isinstance(k, BaseException):
            failed.append(name)
            warnings.warn(f"{path}: region {name}'s kernel failed to load ({type(k).__name__}: {k}); "
                          "it runs through torch", ArtifactWarning, stacklevel=3)
            continue
        region = next(r for r in plan.regions if r.name == name)
        if name in parts:
            head, tail = parts[name]
            kernels[name] = SplitRegion(region, head, tail, reference_region(plan, head), RegionKernel(s, k, tail, nodes))
        else:
            kernels[name] = RegionKernel(s, k, region, nodes)
    keys = [getattr(k, "_tilelang_cache_key", None) for k in compiled.values() if not isinstance(k, BaseException)]
    return kernels, failed, keys


def _plans(path: Path, data: dict[str, bytes], constants: dict, keys: set[str]) -> list[tuple]:
    """(input signature or None, FusionPlan, tuning by region) for each plan the artifact holds."""
    with _blame(path, PLAN):
        docs = _json_member(path, PLAN, data[PLAN])["plans"]
        plans = [(None if d["signature"] is None else
                  tuple((tuple(int(n) for n in shape), torch_dtype(dtype), str(device))
                        for shape, dtype, device in d["signature"]), plan_from_json(d, constants)) for d in docs]
    with _blame(path, TUNING):
        tunings = [_tuning(t, keys) for t in _json_member(path, TUNING, data[TUNING])["plans"]]
        if len(tunings) != len(plans):
            raise ValueError(f"{len(tunings)} tunings for {len(plans)} plans")
    return [(sig, plan, tuning) for (sig, plan), tuning in zip(plans, tunings)]


def _restore(path: Path, plans: list[tuple], options, data: dict[str, bytes]):
    """A runner per plan, kernels from the artifact: ([(signature, runner)], cache keys of the kernels loaded)."""
    import dataclasses

    from tilelang.cache.kernel_cache import KernelCache

    from tilefuse.runtime.plan_runner import PlanRunner

    scratch = tempfile.TemporaryDirectory(prefix="tilefuse-kernels-")  # removed with the last runner using it
    with _tilelang_cache(scratch.name):
        root = Path(KernelCache._get_cache_root())  # <dir>/<tilelang version>/<os-machine>/kernels
    for name, blob in data.items():
        m = _KERNEL_MEMBER.fullmatch(name)
        if m:  # a name that matched a strict pattern: it cannot leave root
            (root / m[1]).mkdir(parents=True, exist_ok=True)
            (root / m[1] / m[2]).write_bytes(blob)
    runners, keys = [], []
    for sig, plan, tuning in plans:
        funcs = {m[1]: blob for name, blob in data.items() for m in [_FUNC_MEMBER.fullmatch(name)] if m}
        kernels, failed, loaded = _lower(path, plan, options.target, tuning, Path(scratch.name), funcs) \
            if options.lower else ({}, [], [])
        plan = dataclasses.replace(plan, regions=tuple(dataclasses.replace(r, backend="torch") if r.name in failed
                                                       else r for r in plan.regions))
        runner = PlanRunner(plan, kernels)
        if options.cuda_graphs and options.target.get("kind") == "cuda" and plan.kernels:
            runner.enable_cuda_graphs(options.eager_tail)
        runner.artifact_dir = scratch
        runners.append((sig, runner))
        keys += loaded
    return runners, keys


def load(path: str | os.PathLike, *, target: str | dict | None = None, strict: bool = False):
    """Load the artifact at ``path`` as a runnable ``CompiledModel`` without compiling anything.

    ``target`` defaults to the artifact's. On another target, tilelang version or host the model is
    recompiled from the artifact's graph with an ``ArtifactWarning``, or, with ``strict``,
    ``ArtifactMismatchError`` is raised. A corrupted, tampered or malformed artifact raises
    ``ArtifactError`` naming the member. ``model.load_report`` says what happened (``compiled == 0``).
    """
    from tilefuse import __version__
    from tilefuse.api import CompiledModel
    from tilefuse.config import Options, parse_target

    t0 = time.perf_counter()
    path = Path(path)
    manifest, data = read_artifact(path)
    with _blame(path, WEIGHTS):
        constants = _weights_from(data[WEIGHTS])
    with _blame(path, GRAPH):
        graph = graph_from_json(_json_member(path, GRAPH, data[GRAPH]), constants)
    plans = _plans(path, data, constants, set(manifest["kernels"]))
    used = set(graph.constants).union(*(p.graph.constants for _, p, _ in plans))
    if set(constants) - used:
        raise ArtifactError(f"{path}: member {WEIGHTS} holds tensors no graph uses: {sorted(set(constants) - used)[:5]}")
    with _blame(path, MANIFEST):
        opts = manifest["options"]
        options = Options(target=parse_target(target if target is not None else manifest["target"]),
                          fuse=bool(opts["fuse"]), lower=bool(opts["lower"]), cuda_graphs=bool(opts["cuda_graphs"]),
                          sparsity=opts.get("sparsity"))
    why = _mismatches(manifest, options.target, strict)
    if not why:
        try:
            runners, keys = _restore(path, plans, options, data)
        except _Mismatch as e:
            why = [str(e)]
    if why:
        if strict:
            raise ArtifactMismatchError(f"{path}: {'; '.join(why)} (strict load: not recompiling)")
        warnings.warn(f"{path}: {'; '.join(why)}; recompiling it from its graph", ArtifactWarning, stacklevel=3)
        model = CompiledModel(graph, options)
        n = len({id(k.kernel) for k in getattr(model.runner, "kernels", {}).values()})
        model.load_report = LoadReport(str(path), time.perf_counter() - t0, n, 0, n, "; ".join(why))
        return model
    n = len({k for k in keys if k}) + keys.count(None)  # distinct kernels; None: a kernel with no cache key
    hits = len({k for k in keys if k} & set(manifest["kernels"]))
    if hits < n:
        msg = (f"{path}: {n - hits} of {n} kernels were not in the artifact and were compiled "
               f"(saved by tilefuse {manifest['tilefuse']}, this is {__version__})")
        if strict:
            raise ArtifactMismatchError(msg)
        warnings.warn(msg, ArtifactWarning, stacklevel=3)
    static = [r for sig, r in runners if sig is None]
    model = CompiledModel(graph, options, runner=static[0] if static else None)
    for sig, runner in runners:
        if sig is not None:  # a symbolic graph's specializations compiled before saving
            model._specialized[sig] = runner
    seconds = time.perf_counter() - t0
    for sig, runner in runners:
        runner.compile_seconds = seconds
        runner.source_graph = graph if sig is None else runner.plan.graph  # a specialization's: as planned
    model.load_report = LoadReport(str(path), seconds, n, hits, n - hits)
    return model

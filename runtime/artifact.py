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
import time
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tilefuse.ir import dtype_name, torch_dtype
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
from tilefuse.runtime.machine import local_target_hint, target_problem
from tilefuse.runtime.serialize import (
    _type_json,
    _weights_bytes,
    _weights_from,
    graph_from_json,
    graph_to_json,
    plan_from_json,
    plan_to_json,
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


def _candidate_configs(spec, target: dict) -> list[dict]:
    """The configs make_prim_func chooses among for ``spec``: the one it picks by default (tuned, or the
    template's untuned pick, which may lie outside its seeds), then the template's seeds."""
    from tilefuse.lowering.registry import config_space, kernel_key

    return [kernel_key(spec, target)[0], *config_space(spec, target)]


def _tile_config(spec, target: dict, func) -> dict | None:
    """The tile config ``func`` was built with: the candidate whose PrimFunc prints the same (None if none)."""
    from tilefuse.config import CPU_KINDS
    from tilefuse.lowering.exact_constants import exact_float_constants
    from tilefuse.lowering.registry import make_prim_func

    if func is None:
        return None
    want = func.script(show_meta=True)
    as_compiled = exact_float_constants if target.get("kind") in CPU_KINDS else (lambda f: f)  # as compile_kernel
    for config in _candidate_configs(spec, target):
        with contextlib.suppress(Exception):  # a seed this spec cannot take is simply not the one chosen
            if as_compiled(make_prim_func(spec, target, config)).script(show_meta=True) == want:
                return dict(config)
    return None


def _cache_entry(kernel) -> tuple[str, Path] | None:
    """The TileLang cache entry a compiled kernel came from (TileLang tags kernels with it), if it exists."""
    key, path = getattr(kernel, "_tilelang_cache_key", None), getattr(kernel, "_tilelang_cache_path", None)
    if key and path and SHA.fullmatch(key) and (Path(path) / "params.json").is_file() \
            and any((Path(path) / lib).is_file() for lib in LIBS):
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
                if not KERNEL_MEMBER.fullmatch(f"kernels/{key}/{f.name}"):
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
        docs = json_member(path, PLAN, data[PLAN])["plans"]
        plans = [(None if d["signature"] is None else
                  tuple((tuple(int(n) for n in shape), torch_dtype(dtype), str(device))
                        for shape, dtype, device in d["signature"]), plan_from_json(d, constants)) for d in docs]
    with _blame(path, TUNING):
        tunings = [_tuning(t, keys) for t in json_member(path, TUNING, data[TUNING])["plans"]]
        if len(tunings) != len(plans):
            raise ValueError(f"{len(tunings)} tunings for {len(plans)} plans")
    return [(sig, plan, tuning) for (sig, plan), tuning in zip(plans, tunings)]


def _restore(path: Path, plans: list[tuple], options, data: dict[str, bytes]):
    """A runner per plan, kernels from the artifact: ([(signature, runner)], cache keys of the kernels loaded,
    keys of the artifact's kernels TileLang compiled again, regions whose kernel failed)."""
    import dataclasses

    from tilelang.cache.kernel_cache import KernelCache

    from tilefuse.runtime.plan_runner import PlanRunner

    scratch = tempfile.TemporaryDirectory(prefix="tilefuse-kernels-")  # removed with the last runner using it
    with _tilelang_cache(scratch.name):
        root = Path(KernelCache._get_cache_root())  # <dir>/<tilelang version>/<os-machine>/kernels
    for name, blob in data.items():
        m = KERNEL_MEMBER.fullmatch(name)
        if m:  # a name that matched a strict pattern: it cannot leave root
            (root / m[1]).mkdir(parents=True, exist_ok=True)
            (root / m[1] / m[2]).write_bytes(blob)
    stamps = entry_stamps(root, {m[1] for name in data for m in [KERNEL_MEMBER.fullmatch(name)] if m})
    runners, keys, failures = [], [], []
    for sig, plan, tuning in plans:
        funcs = {m[1]: blob for name, blob in data.items() for m in [FUNC_MEMBER.fullmatch(name)] if m}
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
        failures += failed
    return runners, keys, rebuilt_entries(root, stamps), failures


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
        graph = graph_from_json(json_member(path, GRAPH, data[GRAPH]), constants)
    plans = _plans(path, data, constants, set(manifest["kernels"]))
    used = set(graph.constants).union(*(p.graph.constants for _, p, _ in plans))
    if set(constants) - used:
        raise ArtifactError(f"{path}: member {WEIGHTS} holds tensors no graph uses: {sorted(set(constants) - used)[:5]}")
    with _blame(path, MANIFEST):
        opts = manifest["options"]
        options = Options(target=parse_target(target if target is not None else manifest["target"]),
                          fuse=bool(opts["fuse"]), lower=bool(opts["lower"]), cuda_graphs=bool(opts["cuda_graphs"]),
                          sparsity=opts.get("sparsity"))
    problem = target_problem(options.target)
    if problem is not None:
        raise ArtifactMismatchError(f"{path}: {problem}, so its kernels cannot run here. Load it on such a machine, "
                                    f"or pass {local_target_hint()} to recompile it from its graph")
    why = _mismatches(manifest, options.target, strict)
    if not why:
        try:
            runners, keys, rebuilt, failed = _restore(path, plans, options, data)
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
    for msg in msgs[:len(msgs) - bool(failed)]:  # _lower has warned of each failed region already
        warnings.warn(f"{path}: {msg}", ArtifactWarning, stacklevel=3)
    static = [r for sig, r in runners if sig is None]
    model = CompiledModel(graph, options, runner=static[0] if static else None)
    for sig, runner in runners:
        if sig is not None:  # a symbolic graph's specializations compiled before saving
            model._specialized[sig] = runner
    seconds = time.perf_counter() - t0
    for sig, runner in runners:
        runner.compile_seconds = seconds
        runner.source_graph = graph if sig is None else runner.plan.graph  # a specialization's: as planned
    model.load_report = LoadReport(str(path), seconds, n, hits, n - hits, failed=len(failed))
    return model

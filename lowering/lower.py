"""Kernel specs -> compiled kernels: each template's config space, the config a spec builds with, and the compile.

Note: a spec's config is chosen before it is built (``pipeline`` step ``configs``: tuned winners where tuning ran,
else ``default_config``), and the compiled kernel keeps it (``Lowered.config``): what runs, what an artifact saves
and what a reload rebuilds is that one config, never a config recovered afterwards. Each distinct (spec, config)
compiles once per process (``_COMPILED``), in one parallel batch per plan.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tilefuse.lowering import func_cache
from tilefuse.lowering.builders import KernelSpec, broadcast, numel
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import ops_used
from tilefuse.lowering.templates import (
    ascend,
    attention,
    attention_ws,
    conv,
    depthwise,
    elementwise,
    gemm,
    gemm_configs,
    gemm_sp,
    gemm_ws,
    gemv,
    pool,
    reduction,
)
from tilefuse.lowering.templates.common import dialect
from tilefuse.progress import Progress

_log = logging.getLogger("tilefuse")

# template name (``KernelSpec.template``) -> (its module: config space; its factory: the PrimFunc)
TEMPLATES = {"gemm": (gemm, gemm.gemm), "row_reduction": (reduction, reduction.row_reduction),
             "elementwise": (elementwise, elementwise.elementwise), "conv2d": (conv, conv.conv2d),
             "pool2d": (pool, pool.pool2d), "flash_attention": (attention, attention.flash_attention),
             "gemm_sp": (gemm_sp, gemm_sp.gemm_sp), "gemv": (gemv, gemv.gemv),
             "gemv_group": (gemv, gemv.gemv_group), "depthwise_conv2d": (depthwise, depthwise.depthwise_conv2d),
             **ascend.TEMPLATES}

# Templates whose kernels compile longest, longest first (tensor-core main loops: a ws GEMM's lowering and nvcc take
# 2.8-3.0 s on a 2-core CPU machine, a layer norm's 1.2 s; ResNet-50's convolutions 5.0 s on average against its GEMMs'
# 3.3, 2026-12-06): a batch compiles them first, in this order, so its longest compiles start first and the short
# ones fill the threads as they free up (the MLP's GEMMs had waited for its norm's build: its lowering for sm_90a on 2
# threads took 5.0 s in plan order; ResNet-50's last convolution started 46 s into its 52). ResNet-50's 28 kernels'
# compile times from the 2-core machine, scheduled on 16 threads: 8.3 s with its convolutions among its GEMMs, 7.5 s
# with them first (all in the order of their times: 7.2); on 2 threads no difference shows (42.1-44.8 s either way).
COMPILE_FIRST = (("conv2d",), ("gemm", "gemm_sp", "flash_attention"))


def library_first(spec: KernelSpec, target: dict) -> str | None:
    """Why ``spec``'s kernel is not worth building on ``target`` where the measured choice may run its region through
    the library (its template's ``library_first``: a profitability rule from measurements), or None."""
    rule = getattr(TEMPLATES[spec.template][0], "library_first", None) if spec.template in TEMPLATES else None
    return rule(dict(spec.params), target) if rule is not None else None


def compile_rank(template: str) -> int:
    """Where a kernel of ``template`` goes in a batch's order (``COMPILE_FIRST``; the rest after, a stable sort)."""
    for rank, group in enumerate(COMPILE_FIRST):
        if template in group:
            return rank
    return len(COMPILE_FIRST)


@dataclass(frozen=True)
class Lowered:
    """A region's compiled kernel and what it was built from."""

    spec: KernelSpec
    config: dict
    kernel: object  # TileLang's JITKernel: call it with the spec's inputs


def config_space(spec: KernelSpec, target: dict) -> list[dict]:
    """The tile configs ``spec``'s template offers for ``target``: its ``config_space`` where it has one wider
    than its ``get_configs`` seeds (the seeds come first either way; the default pick is made from them)."""
    module, _ = TEMPLATES[spec.template]
    kw = spec.factory_kwargs()
    if spec.template == "gemm_sp":  # block_K must divide the padded K; the output tile's bytes count too
        staged = module.staged_extras(kw["M"], kw["N"], kw.get("epilogue"), kw.get("extra_shapes", ()))
        configs = module.config_space(target, kw["K"], kw.get("out_dtype"), kw.get("meta_k_major", False),
                                      staged_tiles=len(staged), M=kw["M"])
        return configs
    space = getattr(module, "config_space", module.get_configs)
    trying = experimental(target)
    if spec.template == "flash_attention":  # the head dim; a decode step's few queries (packed rows)
        # a padding mask takes the ws schedule too (never a decode step's few queries), which then walks each batch's
        # keys up to its last kept one (bound_keys): BERT's masks on the H200, 2026-12-05, 1.30-2.03x cuDNN (1.50-2.20x
        # with fast math) where the TileLang-scheduled template ran 0.67-1.07x (bench/results/2026-12-05-h200-session33)
        ws = attention_ws.eligible(target, **kw) and (
            kw.get("mask_shape") is None or not attention.decodes(target, kw["Sq"], _groups(kw)))
        configs = space(target, kw.get("D"), Sq=kw["Sq"], groups=_groups(kw), keys_masked=_keys_masked(kw),
                        ws=ws, causal=kw.get("is_causal", False), heads=kw["B"] * kw["Hq"],
                        **{"Skv": kw["Skv"], **_decode_shape(kw)})
        # each "attention_<option>" of Options.experimental is flash_attention's ws option of that name
        options = {o.removeprefix("attention_"): True for o in trying if o.startswith("attention_")}
        if ws and kw.get("mask_shape") is not None:  # the padding mask's bound: no key tile past the last kept key
            options["bound_keys"] = True
        return [{**c, **options} if c.get("ws") else c for c in configs]
    if spec.template == "gemv_group" and any(kw.get("rotary_of") or ()):  # rows in rotary pairs
        return module.get_configs(target, kw.get("B_dtype"), paired=True)
    if spec.template in SHAPED_PICKS:  # the untuned pick by the spec's shape first, then the seeds
        pick = SHAPED_PICKS[spec.template](kw, target)
        return [pick, *(c for c in space(target) if c != pick)]
    # gemm/conv seeds depend on the operand dtype
    arg = {"gemm": kw.get("B_dtype"), "gemv": kw.get("B_dtype"), "gemv_group": kw.get("B_dtype"),
           "conv2d": kw.get("in_dtype")}.get(spec.template)
    configs = space(target, arg) if arg else space(target)
    if spec.template == "gemm" and gemm_ws.eligible(target, **kw):  # (its seeds lead: the default pick)
        out = kw.get("out_dtype") or kw.get("B_dtype") or kw.get("A_dtype", "float16")
        staged = gemm.ws_staged_extra(kw["M"], kw["N"], kw.get("epilogue"), kw.get("extra_shapes") or (),
                                      kw.get("extra_dtypes") or (), out) is not None
        seeds = gemm_ws.seeds(out, kw["M"], kw["N"], kw["K"], gemm_configs.sm_count(target),
                              ops_used(kw.get("epilogue")), staged) \
            if kw["M"] >= gemm_ws.MIN_M else []
        return seeds + ([gemm_ws.seed(out, pingpong=True)] if "gemm_ws_pingpong" in trying else []) + configs
    return configs


# Templates whose untuned pick depends on the spec's shape (its factory's keyword arguments), not only its seeds.
SHAPED_PICKS = {
    "row_reduction": lambda kw, target: reduction.default_config(numel(kw["shape"][:-1]), kw["shape"][-1], target),
    "depthwise_conv2d": lambda kw, target: depthwise.default_config(kw["w_shape"][0], kw.get("stride", (1, 1)),
                                                                         target),
    "pool2d": lambda kw, target: pool.default_config(kw, target, "global_pool" in experimental(target)),
}


def experimental(target: dict) -> set[str]:
    """The unmeasured schedules ``target`` asks for (``Options.experimental``)."""
    return set(target.get("experimental", ())) if isinstance(target, dict) else set()


def _groups(kw: dict) -> int:
    """Query heads per kv head of a flash_attention spec's arguments."""
    return kw["Hq"] // (kw.get("Hkv") or kw["Hq"])


def _decode_shape(kw: dict) -> dict:
    """What ``attention.decode_configs`` splits the keys by: batch, kv heads and cache length, where the spec has room
    for the parts (``split_max``)."""
    if not kw.get("split_max"):
        return {}
    return {"B": kw["B"], "Hkv": kw.get("Hkv") or kw["Hq"], "Skv": kw["Skv"]}


def _keys_masked(kw: dict) -> bool:
    """Whether a flash_attention spec's mask is one value per key (``attention.per_key_mask``)."""
    return attention.per_key_mask(kw.get("mask_shape"), kw.get("is_causal", False))


def gemm_batch(kw: dict) -> int:
    return numel(broadcast(tuple(kw.get("batch_A", ())), tuple(kw.get("batch_B", ()))))


def gemm_wave_cost(config: dict, kw: dict, target: dict) -> int:
    """Padded output elements one SM computes over the waves of ``config``'s tiles on ``target``'s SMs (less is
    better: it counts tile padding and a last, partly idle wave)."""
    return gemm_configs.wave_cost(config, kw["M"], kw["N"], gemm_batch(kw), gemm_configs.sm_count(target))


def default_config(spec: KernelSpec, target: dict) -> dict:
    """The config ``spec`` builds with when nothing was tuned: for GEMMs the measured leaders' pick by padded
    waves (``gemm_configs.default_config``), for 2:4 GEMMs on CUDA ``gemm_sp.default_config``, else the first seed."""
    configs = config_space(spec, target)
    kw = spec.factory_kwargs()
    if spec.template == "gemm" and configs and configs[0].get("ws"):  # (gemm_ws: where it applies, it leads)
        return configs[0]
    if spec.template == "gemm":
        return gemm_configs.default_config(configs, kw["M"], kw["N"], gemm_batch(kw), target)
    if spec.template == "flash_attention" and dialect(target).cpu:
        return attention.cpu_config(kw["Sq"], kw["Skv"])
    if spec.template == "flash_attention":  # a decode step: packed rows (attention.decode_configs)
        decode = attention.decode_configs(target, kw["Sq"], _groups(kw), _keys_masked(kw), **_decode_shape(kw))
        if decode:
            return decode[0]
    if spec.template == "gemm_sp" and configs and configs[0].get("ws"):  # (Options.experimental asked for it)
        return configs[0]
    if spec.template == "gemm_sp" and configs and target.get("kind") == "cuda":
        return gemm_sp.default_config(configs[:gemm_sp.SEEDS], kw["M"], kw["N"], gemm_configs.sm_count(target))
    return configs[0] if configs else {}


def func_key(spec: KernelSpec, target: dict, config: dict) -> str:
    """The key of ``spec`` built with ``config`` for ``target`` (``func_cache.key``)."""
    return func_cache.key(spec.template, spec.params, spec.out_idx, config, target)


def make_prim_func(spec: KernelSpec, target: dict, config: dict | None = None):
    """The template's ``T.prim_func`` for ``spec`` with tile ``config`` (None: ``default_config``)."""
    _, factory = TEMPLATES[spec.template]
    config = default_config(spec, target) if config is None else config
    return func_cache.cached(func_key(spec, target, config),
                             lambda: factory(**spec.factory_kwargs(), **config, target=target))


# Kernels compiled in this process, by ``func_key``: a recompile (dynamo's, after a guard fails or a reset) takes
# them as they are, without reading the function back or asking TileLang's cache.
_COMPILED: collections.OrderedDict[str, object] = collections.OrderedDict()
COMPILED_KEEP = 1024


def lower(specs: Mapping[str, KernelSpec], configs: Mapping[str, dict], target: dict, name: str = "",
          log: Callable[[str], None] | None = None, progress: bool = False,
          prebuilt: Callable[[KernelSpec, dict], object | None] | None = None,
          use_process_cache: bool = True) -> dict[str, Lowered | BaseException]:
    """Compile each region's spec with its config (a region missing from ``configs``: ``default_config``), each
    distinct pair once, in one parallel batch: region name -> ``Lowered``, or the exception that stopped it (a
    template refusing the config, a compile error). With ``progress``, kernels compiled and the time left go to
    stderr (``tilefuse.progress``). ``prebuilt(spec, config)``: a PrimFunc to compile instead of building one, or
    None (an artifact's saved ones); ``use_process_cache=False`` compiles (or loads from TileLang's cache) even
    what this process compiled before (an artifact's load must see its own kernels)."""
    chosen = {r: (s, dict(configs[r]) if r in configs else default_config(s, target)) for r, s in specs.items()}
    keys = {r: func_key(s, target, c) for r, (s, c) in chosen.items()}
    t0 = time.perf_counter()
    kernels: dict[str, object] = {}
    todo: dict[str, tuple[KernelSpec, dict]] = {}
    for r, key in keys.items():
        if key in kernels or key in todo:
            continue
        if use_process_cache and key in _COMPILED:
            _COMPILED.move_to_end(key)
            kernels[key] = _COMPILED[key]
            continue
        todo[key] = chosen[r]
    todo = dict(sorted(todo.items(), key=lambda item: compile_rank(item[1][0].template)))  # (stable)
    built: list[str] = []
    saved: set[str] = set()  # keys whose function ``prebuilt`` gave: never kept for this process's later compiles

    def funcs():  # built one at a time as compile_many asks: each compiles while the next is built
        for key, (spec, config) in todo.items():
            try:
                func = prebuilt(spec, config) if prebuilt is not None else None
                if func is None:
                    func = make_prim_func(spec, target, config)
                else:
                    saved.add(key)
            except Exception as e:  # noqa: BLE001 -- a template refusing the spec is reported like a compile failure
                kernels[key] = e
                bar.tick()
                continue
            built.append(key)
            yield func, list(spec.out_idx)

    with Progress(f"compiling {name}", len(todo), "kernels", enabled=progress) as bar:
        compiled = compile_many(funcs(), target, num_workers=min(len(todo), os.cpu_count() or 1),
                                return_exceptions=True, on_done=bar.tick) if todo else []
    for key, kernel in zip(built, compiled):
        kernels[key] = kernel
        # (an artifact's saved function may come from other templates than this process's: kept under the key of
        # what this process would build, a later compile of the same spec would run the artifact's kernel)
        if not isinstance(kernel, BaseException) and key not in saved:
            _COMPILED[key] = kernel
            while len(_COMPILED) > COMPILED_KEEP:
                _COMPILED.popitem(last=False)
    if log is not None:
        log(f"compiled {len(set(keys.values()))} distinct kernels for {len(specs)} regions in "
            f"{time.perf_counter() - t0:.1f} s")
    out: dict[str, Lowered | BaseException] = {}
    for r, (spec, config) in chosen.items():
        k = kernels[keys[r]]
        out[r] = k if isinstance(k, BaseException) else Lowered(spec, config, k)
    return out

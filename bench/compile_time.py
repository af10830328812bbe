"""Compile time as a user meets it: each compiler in a fresh process of its own, cold caches, then warm ones.

Usage (on the device machine):  python bench/compile_time.py --models vit,gpt2 [--size bench] [--out FILE.json]

For each zoo model and each compiler (``torch.compile(model, backend="tilefuse")`` with no options, and Inductor's
default ``torch.compile(model)``), a child process imports torch, builds the model, runs it once eagerly (CUDA,
cuBLAS and cuDNN initialized for both alike), then times ``torch.compile`` and the first call, synchronized: the
compile a user waits for, dynamo's first use included. Both libraries are imported before the timer in both children
(tilefuse, with TileLang, for the zoo; ``torch._inductor.compile_fx``). It runs twice per compiler: "cold" with empty
caches of its own (tilefuse: tuning database, PrimFunc cache, graph cache, TileLang's kernel cache; Inductor: its cache
and triton's), "warm" in a new process with the caches the cold run filled. Tilefuse's children also print where the time
went (``PlanRunner.compile_phases``: import, plan, lower, the first call's splits and decide, the CUDA graphs'
capture; the rest is dynamo and AOTAutograd). In-process comparisons (``bench_models.py``) favour whichever compiler
runs second: the first pays dynamo's first use (about 1.3 s on a 2-core CPU) and lazy CUDA module loads.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time

COMPILERS = ("tilefuse", "inductor")
# Further compilers a run may name: "dynamo" (``backend="eager"``: dynamo's trace alone, the floor under both),
# "tilefuse-tuned" (``options={"tune": "fast"}``) and "inductor-max-autotune" (the tuned compile bar's peer).
EXTRA = ("dynamo", "tilefuse-tuned", "inductor-max-autotune")


def compile_model(model, compiler: str, observer):
    """``torch.compile`` of ``model`` as ``compiler`` names it (``observer`` gets tilefuse's runners)."""
    import torch

    if compiler.startswith("tilefuse"):
        options = {"observer": observer}
        if compiler == "tilefuse-tuned":
            options["tune"] = "fast"
        return torch.compile(model, backend="tilefuse", options=options)
    if compiler == "dynamo":
        return torch.compile(model, backend="eager")
    return torch.compile(model, mode="max-autotune" if compiler == "inductor-max-autotune" else None)


SPANS: list = []  # --timeline: (thread, what, start s, end s) of the compile's steps, in every thread
KERNELS: list = []  # --timeline: (thread, template and config, start s, end s) of each kernel's whole compile


def _record_spans() -> None:
    """Wrap the steps of a kernel's compile (``compile_kernel``, and inside it nvcc, the kernel cache's write and the
    host link: the rest is TileLang's lowering) and the templates' PrimFunc builds, so that each call's span, in
    whichever thread ran it, lands in ``SPANS``: where a cold compile's seconds go when its kernels compile in
    parallel threads (a profile of the main thread sees a wait)."""
    import importlib
    import threading

    from tilelang.cache.kernel_cache import KernelCache
    from tilelang.contrib import nvcc

    from tilefuse.lowering import compile as tf_compile
    from tilefuse.lowering import lower as tf_lower

    tl_lower = importlib.import_module("tilelang.engine.lower")  # (the package's ``lower`` is the function)

    def wrap(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def spanned(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                SPANS.append((threading.current_thread().name, label, t, time.perf_counter()))
        setattr(owner, name, spanned)
    for owner, name, label in ((tf_compile, "compile_kernel", "kernel"), (nvcc, "compile_cuda", "nvcc"),
                               (tf_compile, "link_now", "link"), (KernelCache, "_save_kernel_to_disk", "cache write"),
                               (tf_lower, "make_prim_func", "prim func built"),
                               (tl_lower, "lower_to_host_device_ir", "TIR passes"),
                               (tl_lower, "host_codegen", "host codegen")):
        if hasattr(owner, name):
            wrap(owner, name, label)
    # each kernel's compile by the spec it was built from (which are the long ones, in a model of many kernels)
    built, make, compile_kernel = {}, tf_lower.make_prim_func, tf_compile.compile_kernel

    def labelled_make(spec, target, config=None):
        func = make(spec, target, config)
        built[id(func)] = f"{spec.template} " + " ".join(f"{k}={v}" for k, v in (config or {}).items())
        return func

    def labelled_compile(prim_func, *args, **kwargs):
        t = time.perf_counter()
        try:
            return compile_kernel(prim_func, *args, **kwargs)
        finally:
            KERNELS.append((threading.current_thread().name, built.get(id(prim_func), "?"), t, time.perf_counter()))
    tf_lower.make_prim_func, tf_compile.compile_kernel = labelled_make, labelled_compile


def child(model_name: str, size: str, compiler: str, profile: str = "", timeline: bool = False) -> dict:
    """The timed compile, in this (fresh) process. ``profile``: a path for the cProfile statistics of the timed
    section (pstats, and the costliest calls, by cumulative and by own time, as text beside it). ``timeline``: the
    spans of each kernel's compile steps (``_record_spans``) in the result, as seconds from the compile's start."""
    import torch
    import torch._inductor.compile_fx  # (imported before the timer, as tilefuse is for its zoo)

    from tilefuse import models

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model, inputs = models.build(model_name, size, dtype=dtype, device=device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    runners: list = []
    if timeline and compiler.startswith("tilefuse"):
        _record_spans()
    with torch.no_grad():
        model(*inputs)
        sync()
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        fn = compile_model(model, compiler, runners.append)
        fn(*inputs)
        sync()
        seconds = time.perf_counter() - t0
        if prof:
            prof.disable()
            prof.dump_stats(profile)
            with open(profile + ".txt", "w") as f:
                stats = pstats.Stats(profile, stream=f)
                stats.sort_stats("cumulative").print_stats(60)
                stats.sort_stats("tottime").print_stats(30)
    from bench_models import phase_totals  # (this directory; imported here, in the child only)

    from tilefuse.lowering.timing import SPENT  # (where the measured choice's timings went)

    return {"model": model_name, "compiler": compiler, "seconds": round(seconds, 3), "phases": phase_totals(runners),
            "timing": {k: round(v, 3) for k, v in SPENT.items()}, "graphs": len(runners),
            **({"spans": [(th, what, round(a - t0, 3), round(b - t0, 3)) for th, what, a, b in SPANS],
                "kernels": [(th, what, round(a - t0, 3), round(b - t0, 3)) for th, what, a, b in KERNELS]}
               if timeline else {})}


def _env(compiler: str, cache: str) -> dict:
    env = dict(os.environ, TILEFUSE_QUIET="1")
    if compiler.startswith("tilefuse"):
        env.update(TILEFUSE_TUNING_DB=os.path.join(cache, "tuning.json"), TILEFUSE_FUNC_CACHE_DIR=os.path.join(
            cache, "funcs"), TILEFUSE_GRAPH_CACHE_DIR=os.path.join(cache, "graphs"),
            TILELANG_CACHE_DIR=os.path.join(cache, "tilelang"))
    else:
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    return env


def run_child(model: str, size: str, compiler: str, cache: str, timeout: float, profile: str = "",
              timeline: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--models", model, "--size", size,
           "--compilers", compiler] + (["--profile", profile] if profile else []) + (["--timeline"] if timeline else [])
    try:
        done = subprocess.run(cmd, check=False, env=_env(compiler, cache), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "compiler": compiler, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"model": model, "compiler": compiler, "error": (done.stderr or done.stdout).strip()[-600:]}
    return json.loads(lines[-1])


def print_spans(spans: list) -> None:
    """The timeline's spans by thread, in order of their start (seconds from the compile's start)."""
    for th, what, a, b in sorted(spans, key=lambda s: (s[0], s[2])):
        print(f"  {th[:24]:24} {what:16} {a:7.3f} -> {b:7.3f}  ({b - a:6.3f} s)")


LONGEST = 12  # --summarize: the kernels that took longest to compile, with their template and config


def summarize(rows: list) -> None:
    """Each cold compile's timeline summed by step (count, total and longest span), the compile threads' first start
    and last end, how long each thread was busy, and the ``LONGEST`` kernel compiles by template and config: a model
    of many kernels prints no span list worth reading."""
    for r in rows:
        spans = r.get("spans") or []
        if not spans or r.get("caches") != "cold":
            continue
        print(f"{r['model']} {r['compiler']} cold {r.get('seconds', float('nan')):.2f} s, {len(spans)} spans")
        for what in dict.fromkeys(w for _, w, _, _ in spans):
            got = [b - a for _, w, a, b in spans if w == what]
            print(f"  {what:16} {len(got):4d} spans, {sum(got):7.2f} s in all, longest {max(got):6.3f} s")
        kernels = [(th, a, b) for th, w, a, b in spans if w == "kernel"]
        if kernels:
            busy: dict = {}
            for th, a, b in kernels:
                busy[th] = busy.get(th, 0.0) + b - a
            print(f"  kernels from {min(a for _, a, _ in kernels):.2f} to {max(b for _, _, b in kernels):.2f} s over "
                  f"{len(busy)} threads, busy {min(busy.values()):.2f}-{max(busy.values()):.2f} s each")
        for th, what, a, b in sorted(r.get("kernels") or [], key=lambda k: k[2] - k[3])[:LONGEST]:
            print(f"  {b - a:6.2f} s  {a:6.2f}-{b:6.2f} s  {th:20}  {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vit,gpt2")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--compilers", default=",".join(COMPILERS))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="")
    ap.add_argument("--profile", default="", help="a folder for each compile's cProfile statistics")
    ap.add_argument("--timeline", action="store_true",
                    help="tilefuse's cold compiles: print each kernel's compile steps by thread (lowering, nvcc, ...)")
    ap.add_argument("--summarize", default="", help="a --timeline run's --out file: its spans summed by step")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            summarize(json.load(f))
        return 0
    models, compilers = args.models.split(","), args.compilers.split(",")
    unknown = sorted(set(compilers) - set(COMPILERS) - set(EXTRA))
    if unknown:
        ap.error(f"unknown compilers {unknown}; known: {', '.join(COMPILERS + EXTRA)}")
    if args.child:
        print(json.dumps(child(models[0], args.size, compilers[0], args.profile, args.timeline)), flush=True)
        return 0
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    rows = []
    for model in models:
        for compiler in compilers:
            with tempfile.TemporaryDirectory(prefix=f"compile-{compiler}-") as cache:
                for state in ("cold", "warm"):
                    prof = os.path.join(os.path.abspath(args.profile), f"{model}-{compiler}-{state}.prof") \
                        if args.profile else ""
                    row = dict(run_child(model, args.size, compiler, cache, args.timeout, prof, args.timeline),
                               caches=state)
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "spans"}), flush=True)
                    print_spans(row.get("spans", []))
    print(f"\n{'model':8} {'compiler':9} {'cold s':>7} {'warm s':>7}  tilefuse's phases, cold (s)")
    for model in models:
        got = {(r["compiler"], r["caches"]): r for r in rows if r["model"] == model}
        for compiler in compilers:
            cold, warm = got.get((compiler, "cold"), {}), got.get((compiler, "warm"), {})
            phases = ", ".join(f"{k} {v:.2f}" for k, v in cold.get("phases", {}).items())
            if cold.get("timing"):  # (the decide and tuning phases' timings, by step)
                phases += "; timings: " + ", ".join(f"{k} {v:.2f}" for k, v in cold["timing"].items())
            print(f"{model:8} {compiler:9} {cold.get('seconds', float('nan')):7.2f} "
                  f"{warm.get('seconds', float('nan')):7.2f}  {phases or cold.get('error', '')[:200]}")
        for ours, peer, bar in (("tilefuse", "inductor", "at most 2x"),
                                ("tilefuse-tuned", "inductor-max-autotune", "at most 1x")):
            t, i = got.get((ours, "cold"), {}), got.get((peer, "cold"), {})
            if "seconds" in t and "seconds" in i:
                print(f"{model:8} {ours}'s cold compile is {t['seconds'] / i['seconds']:.2f}x {peer}'s "
                      f"(the bar: {bar})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

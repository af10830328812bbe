"""Benchmark the zoo on a GPU: tilefuse against torch eager and Inductor, measured in one run.

Usage (on the device machine):  python bench/bench_models.py --models gpt2,bert --size bench
    [--peers eager,default,reduce-overhead,max-autotune] [--tune none,fast] [--json out.json] [--reps 50]

Prints a table (median ms over ``--reps`` timed runs after warm-up, L2 flushed before each; tilefuse compiled once
per tuning mode, then each peer, so the slowest to compile goes last; then all of them timed again in ``--rounds``
turns, the order reversed each round, each one's time the median of its turns, and the kernel profiles by category
likewise; speedup over the best peer; kernels in the plan and how many run as TileLang; compile time) and a
kernel-level table per model (each lowered GEMM/reduction region against its torch reference, with achieved TB/s
and TFLOP/s). Writes everything as JSON with the date, device and versions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout
from profile_kernels import category_line, profile, time_ms

import tilefuse

PEERS = ("eager", "default", "reduce-overhead", "max-autotune")


def cuda_time_ms(fn, *args, reps: int = 50, warmup: int = 5) -> float:
    """Median milliseconds of ``fn(*args)``, L2 flushed before each call, warm-up excluded (``kernels.time_ms``)."""
    return time_ms(fn, *args, reps=reps, warmup=warmup)


def _compile_peer(model, peer: str):
    if peer == "eager":
        return model
    return torch.compile(model, mode=None if peer == "default" else peer)


def phase_totals(runners) -> dict[str, float]:
    """Seconds by compile phase (``PlanRunner.compile_phases``) summed over the compiled graphs."""
    out: dict[str, float] = {}
    for r in runners:
        for k, v in r.compile_phases().items():
            out[k] = out.get(k, 0.0) + v
    return {k: round(v, 3) for k, v in out.items()}


def _max_rel(a, b) -> float:
    a, b = (a[0] if isinstance(a, (tuple, list)) else a).float(), (b[0] if isinstance(b, (tuple, list)) else b).float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def bench_model(name: str, size: str, peers: list[str], reps: int, tunes: list[str],
                tune_seconds: float = 120.0, flush=lambda row: None) -> dict:
    """One model: tilefuse once per tuning mode in ``tunes`` (``row["tilefuse"][mode]``), then each peer.
    ``flush(row)`` runs after every measurement, so a run cut short keeps what it measured (the slowest
    peer to compile, Inductor max-autotune, goes last when listed last)."""
    torch._dynamo.reset()
    model, inputs = heldout.build(name, size)  # a held-out real model (bench/heldout.py), or the zoo's at size
    row: dict = {"model": name, "size": size, "tilefuse": {}, "peers": {}}
    fns: dict[tuple[str, str], object] = {}  # ("tilefuse", mode) or ("peers", peer): the compiled callable
    with torch.no_grad():
        ref = model(*inputs)
        for mode in tunes:
            row["tilefuse"][mode] = _bench_tilefuse(row, model, inputs, ref, mode, tune_seconds, reps, fns)
            flush(row)
        for peer in peers:
            torch._dynamo.reset()
            t0 = time.perf_counter()
            fn = _compile_peer(model, peer)
            fn(*inputs)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            row["peers"][peer] = {"ms": cuda_time_ms(fn, *inputs, reps=reps), "compile_s": compile_s}
            fns[("peers", peer)] = fn
            if peer != "eager" and WARM:  # a second compile, as tilefuse's warm one: dynamo again, Inductor's caches hit
                torch._dynamo.reset()
                t0 = time.perf_counter()
                _compile_peer(model, peer)(*inputs)
                torch.cuda.synchronize()
                row["peers"][peer]["warm_compile_s"] = time.perf_counter() - t0
            print(f"  {name}: {peer} {row['peers'][peer]['ms']:.3f} ms (compile {compile_s:.1f} s, warm "
                  f"{row['peers'][peer].get('warm_compile_s', 0):.1f} s)", flush=True)
            flush(row)
        turns = ROUNDS > 1 and len(fns) > 1
        if turns:  # (the profiles too)
            in_turns(row, fns, inputs, reps)
            flush(row)
        for mode, res in row["tilefuse"].items() if PROFILE and not turns else ():
            if "profile" not in res and ("tilefuse", mode) in fns:  # (one contender alone: timed once)
                res["profile"] = profile(fns[("tilefuse", mode)], *inputs)
                print(f"  {name}: tilefuse tune={mode} kernels ms/call: {category_line(res['profile'])}", flush=True)
        if PROFILE and row["peers"] and not turns:  # the best peer's kernels by category, beside tilefuse's
            best = min(row["peers"], key=lambda p: row["peers"][p]["ms"])
            torch._dynamo.reset()
            fn = _compile_peer(model, best)
            row["peers"][best]["profile"] = profile(fn, *inputs)
            print(f"  {name}: {best} kernels ms/call: {category_line(row['peers'][best]['profile'])}", flush=True)
            flush(row)
    return row


def in_turns(row: dict, fns: dict, inputs, reps: int) -> None:
    """Every contender timed again in ``ROUNDS`` turns (the order reversed each round), each one's ``ms`` the median of
    its turns (``ms_turns``; its first, alone, measurement kept as ``ms_alone``). The GPU's clock follows its power
    cap and temperature: on an H100 (bench/results/2026-12-05-h100-session39, call 2, bench/tuned_order.py) zoo BERT's
    kernels ran 6% slower a turn later, whichever plan ran, so what ran one after the other is not compared fairly."""
    for fn in fns.values():  # (a dynamo reset since it was compiled: it recompiles here, outside the timing)
        fn(*inputs)
    torch.cuda.synchronize()
    keys = list(fns)
    turns: dict = {k: [] for k in keys}
    for r in range(ROUNDS):
        for k in keys if r % 2 == 0 else keys[::-1]:
            turns[k].append(cuda_time_ms(fns[k], *inputs, reps=reps))
    for (side, key), ms in turns.items():
        res = row[side][key]
        res["ms_alone"], res["ms_turns"], res["ms"] = res["ms"], ms, statistics.median(ms)
    print(f"  {row['model']}: in {ROUNDS} turns (median ms): " + ", ".join(
        f"{_label(side, key)} {row[side][key]['ms']:.3f} ({'/'.join(f'{t:.3f}' for t in turns[(side, key)])})"
        for side, key in keys), flush=True)
    if not PROFILE:
        return
    # the kernel profiles in turns too (tilefuse's and the best peer's): each one's profile of median busy time
    peers = [k for k in keys if k[0] == "peers"]
    best = [min(peers, key=lambda k: row["peers"][k[1]]["ms"])] if peers else []
    keys = [k for k in keys if k[0] == "tilefuse"] + best
    profs: dict = {k: [] for k in keys}
    for r in range(ROUNDS):
        for k in keys if r % 2 == 0 else keys[::-1]:
            profs[k].append(profile(fns[k], *inputs))
    for (side, key), ps in profs.items():
        row[side][key]["profile"] = p = sorted(ps, key=lambda q: q["busy_ms"])[len(ps) // 2]
        busy = "/".join(f"{q['busy_ms']:.3f}" for q in ps)
        print(f"  {row['model']}: {_label(side, key)} kernels ms/call (busy {busy}): {category_line(p)}", flush=True)


def _label(side: str, key: str) -> str:
    return key if side == "peers" else f"tilefuse tune={key}"


def _mode(mode: str) -> tuple[str, str]:
    """A ``--tune`` mode's tuning and its experimental schedules: ``"none+pdl_all"`` -> ``("none", "pdl_all")``."""
    tune, *experimental = mode.split("+")
    return tune, ",".join(experimental)


def _bench_tilefuse(row: dict, model, inputs, ref, mode: str, tune_seconds: float, reps: int, fns: dict) -> dict:
    name, (tune, experimental) = row["model"], _mode(mode)
    torch._dynamo.reset()
    runners: list = []
    t0 = time.perf_counter()
    extra = {"experimental": experimental} if experimental else {}  # (else TILEFUSE_EXPERIMENTAL's)
    fn = tilefuse.compile(model, observer=runners.append, tune=tune, tune_seconds=tune_seconds, **extra)
    out = fn(*inputs)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0  # (as the peers': compile and first call, not the timing that follows)
    res = {"ms": cuda_time_ms(fn, *inputs, reps=reps), "compile_s": compile_s, "max_rel_err": _max_rel(out, ref),
           "tune": tune, "experimental": experimental, "phases": phase_totals(runners)}
    fns[("tilefuse", mode)] = fn
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(*inputs)
    torch.cuda.synchronize()
    res["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    if "eager_peak" not in row:
        torch.cuda.reset_peak_memory_stats()
        model(*inputs)
        torch.cuda.synchronize()
        row["eager_peak"] = {"peak_mb": (torch.cuda.max_memory_allocated() - base) / 2**20}
    if PROFILE and ROUNDS <= 1:  # (else in turns with the peers: ``in_turns``)
        res["profile"] = profile(fn, *inputs)
        print(f"  {name}: tilefuse tune={mode} kernels ms/call: {category_line(res['profile'])}", flush=True)
    for r in runners:
        r.record = True
    fn(*inputs)
    plans = [r.plan for r in runners]
    res["kernels"] = sum(p.kernels for p in plans)
    res["tilelang_kernels"] = sum(1 for p in plans for r in p.regions if r.launches and r.backend == "tilelang")
    res["split_regions"] = sum(1 for p in plans for r in p.regions if r.backend == "split")  # GEMM torch, rest TileLang
    res["compute_nodes"] = sum(p.source_nodes for p in plans)
    res["regions"] = kernel_table(runners) if KERNEL_TABLE else []
    res["chosen_sum_ms"] = chosen_sum_ms(runners)
    print(f"  {name}: tune={mode}: the regions as chosen sum to {res['chosen_sum_ms']:.3f} ms timed one by one with "
          f"cold caches, {res['chosen_sum_ms'] / res['ms']:.2f}x the whole model's {res['ms']:.3f} ms", flush=True)
    notes = [n for r in runners for n in r.plan.notes if "measured" in n]
    res["given_to_torch"] = notes
    res["backends"] = {b: sum(1 for r in runners for g in r.plan.regions if g.launches and g.backend == b)
                       for b in ("tilelang", "torch", "split")}
    print(f"  {name}: tune={mode}: launching regions by how they run: {res['backends']}", flush=True)
    if tune != "none":  # last: a dynamo reset makes ``fn`` recompile (and report a second runner) if called again
        torch._dynamo.reset()
        t0 = time.perf_counter()
        tilefuse.compile(model, tune=tune, tune_seconds=tune_seconds, **extra)(*inputs)
        torch.cuda.synchronize()
        res["warm_compile_s"] = time.perf_counter() - t0
        print(f"  {name}: tune={mode}: warm compile {res['warm_compile_s']:.1f} s; {len(notes)} regions measured "
              f"faster through torch", flush=True)
    print(f"  {name}: tilefuse tune={mode} {res['ms']:.3f} ms (compile {res['compile_s']:.1f} s: "
          f"{', '.join(f'{k} {v:.2f}' for k, v in res['phases'].items())}), err {res['max_rel_err']:.1e}", flush=True)
    return res


PROFILE, KERNEL_TABLE, WARM, ROUNDS = True, False, True, 3  # set by main's flags


def chosen_sum_ms(runners) -> float:
    """Every launching region of the plans as it now runs (kernel, torch or split, as chosen), timed alone on the
    last call's values with cold caches (``lowering.timing.device_time``), summed: what the measured choice judged by. Near
    the whole model's time, the choice judged each region as it runs in the model."""
    from tilefuse.lowering.timing import device_time

    total = 0.0
    for runner in runners:
        inputs = getattr(runner, "last_inputs", None)
        if inputs is None:
            continue
        env = dict(runner.constants(inputs[0].device))
        env.update({v.name: a for v, a in zip(runner.plan.graph.inputs, inputs)})
        for region, fn in zip(runner.plan.regions, runner.fns):
            ins = [env[i] for i in region.inputs]
            outs = fn(ins)
            if region.launches:
                total += device_time(fn, (ins,), "cuda") * 1e3
            env.update(zip(region.outputs, outs))
    return total


def kernel_table(runners) -> list[dict]:
    """Each lowered region (distinct signature once) against its torch reference, same inputs; device time
    (CUDA-graph replays), with the bytes each kernel moves, so ``bench/calibrate_cost.py`` can fit the
    planner's cost model to it."""
    from tilefuse.lowering.timing import device_time
    from tilefuse.runtime.plan_runner import PlanRunner

    rows, seen = [], set()
    for runner in runners:
        inputs = getattr(runner, "last_inputs", None)
        if inputs is None:
            continue
        ref = PlanRunner(runner.plan, {}, check=False)
        env = dict(ref.constants(inputs[0].device))
        env.update({v.name: a for v, a in zip(runner.plan.graph.inputs, inputs)})
        for region, fn_ref in zip(ref.plan.regions, ref.fns):
            ins = [env[i] for i in region.inputs]
            kernel = runner.kernels.get(region.name)
            outs = fn_ref(ins)
            key = (region.kind, region.ops, tuple(tuple(t.shape) for t in ins))
            if kernel is not None and key not in seen:
                seen.add(key)
                # CUDA-graph replays: device time, as the runtime replays it (single-call event timings
                # include Python's launch latency, tens of us, which swamps small kernels)
                t_k = device_time(kernel, (ins,), "cuda") * 1e3
                t_r = device_time(fn_ref, (ins,), "cuda") * 1e3
                nbytes = sum(t.numel() * t.element_size() for t in ins) + sum(
                    o.numel() * o.element_size() for o in outs)
                flops = _flops(runner.plan, region)
                rows.append({"region": region.name, "kind": region.kind, "ops": " ".join(region.ops), "bytes": nbytes,
                             "timing": "cuda_graph",
                             "tilefuse_ms": t_k, "torch_ms": t_r, "speedup": t_r / t_k,
                             "TB_s": nbytes / t_k / 1e9, "TFLOP_s": flops / t_k / 1e9 if flops else None})
            env.update(zip(region.outputs, outs))
    return rows


def _flops(plan, region) -> float:
    nodes = {n.name: n for n in plan.graph.nodes}
    a = nodes.get(region.anchor) if region.anchor else None
    if a is None or a.op not in ("linear", "matmul"):
        return 0.0
    out = a.outputs[0].type.shape
    k = plan.graph.values()[a.inputs[0]].type.shape[-1]
    n = 1
    for d in out:
        n *= d
    return 2.0 * n * k


def print_tables(rows: list[dict], peers: list[str]) -> None:
    modes = list(dict.fromkeys(m for r in rows for m in r["tilefuse"]))
    cols = [f"tilefuse/{m}" for m in modes]
    print(f"{'model':8} " + " ".join(f"{p:>15}" for p in peers + cols) + " ".join(
        f" {c + ' x best peer':>26}" for c in cols))
    for r in rows:
        ms = [r["peers"].get(p, {}).get("ms") for p in peers] + [r["tilefuse"].get(m, {}).get("ms") for m in modes]
        line = f"{r['model']:8} " + " ".join(f"{x:15.3f}" if x else f"{'-':>15}" for x in ms)
        best = min((r["peers"][p]["ms"] for p in peers if p in r["peers"]), default=None)
        for m in modes:
            t = r["tilefuse"].get(m, {}).get("ms")
            line += f" {best / t:26.2f}" if best and t else f" {'-':>26}"
        print(line)
    print(f"\n{'model':8} {'tilefuse':16} {'kernels':>8} {'TileLang':>8} {'compile s':>9} {'warm s':>7} {'err':>8} "
          f"{'peak MB':>8} {'eager MB':>8}   " + " ".join(f"{'compile s ' + p:>24}" for p in peers))
    for r in rows:
        for m, t in r["tilefuse"].items():
            warm = f"{t['warm_compile_s']:7.1f}" if "warm_compile_s" in t else f"{'-':>7}"
            print(f"{r['model']:8} {'tune=' + m:16} {t['kernels']:8d} {t['tilelang_kernels']:8d} {t['compile_s']:9.1f} "
                  f"{warm} {t['max_rel_err']:8.1e} {t.get('peak_mb', 0):8.0f} "
                  f"{r.get('eager_peak', {}).get('peak_mb', 0):8.0f}   " + " ".join(
                      f"{_peer_compile(r['peers'][p]):>24}" if p in r["peers"] else f"{'-':>24}" for p in peers))
    for r in rows:
        for m, t in r["tilefuse"].items():
            print(f"\nkernels of {r['model']}, tune={m} (distinct regions; torch = the region's ops run by torch, "
                  "unfused):")
            print(f"  {'region':42} {'kind':10} {'tilefuse ms':>11} {'torch ms':>9} {'x':>6} {'TB/s':>6} {'TFLOP/s':>8}")
            for k in t["regions"]:
                tf = f"{k['TFLOP_s']:8.1f}" if k["TFLOP_s"] else f"{'':8}"
                print(f"  {k['region'][:42]:42} {k['kind']:10} {k['tilefuse_ms']:11.4f} {k['torch_ms']:9.4f} "
                      f"{k['speedup']:6.2f} {k['TB_s']:6.2f} {tf}")


def gemm_lines(rows: list[dict]) -> list[str]:
    """#13's GEMM bar, per model and tuning mode: our profiled GEMM time against the best profiled peer's (within 5%,
    or under it), and beside it GEMM plus elementwise time for both: our GEMMs carry the epilogues (GELU, silu * up)
    that a peer runs as separate elementwise kernels, so the second pair says whether the fusion pays."""
    out = []
    for r in rows:
        peers = [(p, v) for p, v in r["peers"].items() if "profile" in v]
        if not peers:
            continue
        name, peer = min(peers, key=lambda pv: pv[1]["ms"])
        theirs = peer["profile"]["by_category_ms"]
        for mode, t in r["tilefuse"].items():
            ours = t.get("profile", {}).get("by_category_ms")
            if not ours or not theirs.get("gemm"):
                continue
            g, pg = ours.get("gemm", 0.0), theirs["gemm"]
            ge, pge = g + ours.get("elementwise", 0.0), pg + theirs.get("elementwise", 0.0)
            out.append(f"{r['model']:8} tune={mode:5} GEMM ms {g:.3f} against {name}'s {pg:.3f}: {g / pg:.3f}x "
                       f"({'within 5%' if g <= 1.05 * pg else 'over 5%'}); GEMM + elementwise {ge:.3f} against "
                       f"{pge:.3f}: {ge / pge:.3f}x")
    return out


def _peer_compile(p: dict) -> str:
    """A peer's compile seconds, cold / warm (the second compile, caches hit) where measured."""
    return f"{p['compile_s']:.1f} / {p['warm_compile_s']:.1f}" if "warm_compile_s" in p else f"{p['compile_s']:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,gpt2,bert,llama,resnet,vit")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--peers", default="eager,default,reduce-overhead")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--tune", default="none",
                    help="comma-separated tuning modes (none, fast, max), each optionally with '+'-joined "
                         "experimental schedules (none+pdl_all): one tilefuse row each; a tuned row's "
                         "compile time is the cold one (use a fresh TILEFUSE_TUNING_DB) and it also reports a warm "
                         "compile (tuning database and caches hit)")
    ap.add_argument("--tune-seconds", type=float, default=120.0)
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel profiles by category")
    ap.add_argument("--no-warm", action="store_true", help="skip the peers' second (warm) compile")
    ap.add_argument("--kernel-table", action="store_true", help="also time each region against its torch ops")
    ap.add_argument("--rounds", type=int, default=3,
                    help="time every contender again in this many turns, order reversed each round; 1: once each")
    args = ap.parse_args()
    global PROFILE, KERNEL_TABLE, WARM, ROUNDS
    PROFILE, KERNEL_TABLE, WARM, ROUNDS = not args.no_profile, args.kernel_table, not args.no_warm, args.rounds
    if not torch.cuda.is_available():
        print("bench_models: needs a CUDA GPU", file=sys.stderr)
        return 2
    peers = [p for p in args.peers.split(",") if p]
    tunes = [m for m in args.tune.split(",") if m]
    from tilefuse.config import EXPERIMENTAL

    bad = [m for m in tunes if _mode(m)[0] not in ("none", "fast", "max")
           or any(x not in EXPERIMENTAL for x in _mode(m)[1].split(",") if x)] + [p for p in peers if p not in PEERS]
    if bad:
        print(f"bench_models: unknown tuning mode or peer {bad}; modes: none, fast, max; peers: {', '.join(PEERS)}",
              file=sys.stderr)
        return 2
    import tilelang

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "tilelang": tilelang.__version__,
            "python": platform.python_version(), "dtype": "float16", "reps": args.reps}
    print(json.dumps(meta))
    # dynamo's first use in a process (its imports, about 1.3 s on a 2-core CPU) before any timed compile: tilefuse
    # compiles first and would otherwise pay it alone (bench/compile_time.py times each compiler in its own process)
    torch.compile(lambda x: x * 2, backend="aot_eager")(torch.ones(2, device="cuda"))
    torch._dynamo.reset()
    rows: list[dict] = []

    def flush(partial: dict | None = None) -> None:  # after every measurement: a run cut short keeps it
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows + ([partial] if partial else [])}, f, indent=1)

    for name in args.models.split(","):
        try:
            rows.append(bench_model(name, args.size, peers, args.reps, tunes, args.tune_seconds, flush))
        except Exception as e:  # noqa: BLE001  (one model failing must not hide the others' numbers)
            print(f"  {name}: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)
        flush()
    print_tables(rows, peers)
    lines = gemm_lines(rows)
    if lines:
        print("\nthe GEMM bar (profiled, per call; the best peer's kernels):\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode benchmark (issue 16): Hugging Face LlamaForCausalLM with a static KV cache, one token per step, through
eager, Inductor (default and reduce-overhead) and tilefuse: ms per token, tokens/s and the bandwidth reached.

Usage (on the device machine):
    python bench/bench_decode.py --out bench/results/decode.json                       # everything
    python bench/bench_decode.py --quick --out /tmp/decode.json                        # a short run
    python bench/bench_decode.py --quick --device cpu --out /tmp/decode_cpu.json       # this script's own check

The model is the issue's: 8 layers, hidden 2048, GQA 32/8 heads, intermediate 5632, vocab 32000, fp16, random weights
(``--device cpu`` uses a tiny fp32 config). For each batch and cache length every mode runs the recipe: a static cache
(``transformers.StaticCache``), a prompt of ``--prompt`` tokens (prefill, compiled like the steps), then greedy steps of
one token; the caches are allocated before the first call (``early_initialization``: static addresses, as
gpt-fast's ``setup_caches``; ``tests/test_decode.py`` covers the lazily allocated cache). Each mode is compiled afresh (``torch._dynamo.reset()``) for each (batch, cache length).

Measured per mode: the first ``--check`` steps run in lockstep with an eager model on its own cache, both fed eager's
tokens, and the largest logits error relative to eager's largest logit is reported (fp16 tolerance: 2e-2); then
``--warmup`` steps, then ``--steps`` timed steps (wall time over all of them, synchronized at both ends; a step is the
forward and the argmax that picks the next token). Bandwidth = bytes a step must read / step time: every weight once
(the embedding table only for the batch's rows) plus the filled part of the K and V caches (at the timed steps' mean
position). ``% peak`` is that over ``--peak-tbps`` (the H200's ~4.8 TB/s). Reduce-overhead calls
``torch.compiler.cudagraph_mark_step_begin()`` before each step and clones the logits it keeps, as its docs ask.
``compiles`` counts the graphs tilefuse compiled (prefill and decode: 2 when nothing recompiles per step).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import inspect
import json
import platform
import pstats
import sys
import time
from pathlib import Path

import torch

MODES = ("eager", "inductor", "inductor-ro", "tilefuse", "tilefuse-apart", "tilefuse-nopdl", "tilefuse-nofold",
         "tilefuse-norotary")


def model_config(device: str):
    from transformers import LlamaConfig

    if device == "cpu":
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    return LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def step_bytes(model, batch: int, position: float) -> float:
    """Bytes one decode step must read: the weights (the embedding's rows only) and the filled K/V cache."""
    cfg = model.config
    embed = model.get_input_embeddings().weight
    size = embed.element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)
    weights += batch * cfg.hidden_size * size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * position * head_dim * size
    return weights + cache


def compiled_forward(model, mode: str, target: dict, runners: list):
    """(the forward ``mode`` runs, the tilefuse backend or None)."""
    forward = model.forward
    if mode == "eager":
        return forward, None
    if mode == "inductor":
        return torch.compile(forward, fullgraph=True), None
    if mode == "inductor-ro":
        fn = torch.compile(forward, mode="reduce-overhead", fullgraph=True)

        def step(*args, **kw):
            torch.compiler.cudagraph_mark_step_begin()
            return fn(*args, **kw)
        return step, None
    if mode.startswith("tilefuse"):
        # apart: each linear its own kernel (Options.group_linears off); nopdl: plain launches (Options.pdl off);
        # nofold: the norms their own kernels (Options.fold_norms off); norotary: the rotary and cache stores their
        # own kernel (Options.fold_rotary off)
        from tilefuse.backend import make_backend
        from tilefuse.config import Options

        backend = make_backend(Options(target=target, quiet=True, observer=runners.append,
                                       group_linears=mode != "tilefuse-apart", pdl=mode != "tilefuse-nopdl",
                                       fold_norms=mode != "tilefuse-nofold",
                                       fold_rotary=mode != "tilefuse-norotary"))
        return torch.compile(forward, backend=backend), backend
    raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_one(model, ref_model, mode: str, batch: int, cache_len: int, args, target: dict) -> dict:
    from transformers import StaticCache

    torch._dynamo.reset()
    runners: list = []
    fwd, backend = compiled_forward(model, mode, target, runners)
    cfg, dev = model.config, args.device
    gen = torch.Generator(device="cpu").manual_seed(1234 + batch)
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.prompt), generator=gen).to(dev)
    need = args.prompt + args.check + args.warmup + args.steps
    if need > cache_len:
        raise SystemExit(f"cache length {cache_len} holds {cache_len} tokens; this run needs {need} "
                         f"(--prompt {args.prompt} + --check {args.check} + --warmup {args.warmup} + --steps {args.steps})")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    caches = [StaticCache(config=cfg, max_cache_len=cache_len) for _ in range(2)]
    for c in caches:  # allocated up front (gpt-fast's setup_caches): static addresses for every mode's graphs
        c.early_initialization(batch, cfg.num_key_value_heads, head_dim, model.dtype, torch.device(dev))
    cache, ref_cache = caches
    # the cache's argument: ``cache`` in newer transformers, ``past_key_values`` in older ones (5.17 drops an
    # unknown ``cache=`` silently and decodes without one)
    kw = "cache" if "cache" in inspect.signature(type(ref_model).forward).parameters else "past_key_values"
    with torch.no_grad():
        t0 = time.perf_counter()
        logits = fwd(prompt, **{kw: cache}).logits[:, -1].float()
        sync(dev)
        prefill_s = time.perf_counter() - t0
        want = ref_model(prompt, **{kw: ref_cache}).logits[:, -1].float()
        worst = 0.0
        for _ in range(args.check + 1):  # the prefill's logits, then --check steps, all on eager's tokens
            worst = max(worst, ((logits - want).abs().max() / want.abs().max().clamp_min(1e-6)).item())
            tok = want.argmax(-1, keepdim=True)
            if _ == args.check:
                break
            logits = fwd(tok, **{kw: cache}).logits[:, -1].float()
            want = ref_model(tok, **{kw: ref_cache}).logits[:, -1].float()
        del ref_cache, caches
        for _ in range(args.warmup):
            tok = fwd(tok, **{kw: cache}).logits[:, -1].argmax(-1, keepdim=True)
        sync(dev)
        host = cProfile.Profile() if args.host_profile and mode == "tilefuse" else None
        t0 = time.perf_counter()
        if host is not None:
            host.enable()
        for _ in range(args.steps):
            tok = fwd(tok, **{kw: cache}).logits[:, -1].argmax(-1, keepdim=True)
        sync(dev)
        step_s = (time.perf_counter() - t0) / args.steps
        if host is not None:  # where the host's time per step goes (cumulative, the top entries)
            host.disable()
            pstats.Stats(host).sort_stats("cumulative").print_stats(30)
        prof = profile_steps(lambda t: fwd(t, **{kw: cache}).logits[:, -1].argmax(-1, keepdim=True), tok, step_s) \
            if args.profile and dev == "cuda" else None
        replay_ms = graph_replay_ms(runners) if mode.startswith("tilefuse") and dev == "cuda" else None
    position = args.prompt + args.check + args.warmup + args.steps / 2
    nbytes = step_bytes(model, batch, position)
    return {"mode": mode, "batch": batch, "cache_len": cache_len, "ms_per_token": step_s * 1e3,
            "tokens_per_s": batch / step_s, "bytes_per_step": nbytes, "tb_per_s": nbytes / step_s / 1e12,
            "pct_peak": 100 * nbytes / step_s / 1e12 / args.peak_tbps, "logits_rel_err": worst,
            "prefill_s": prefill_s, "compiles": len(runners) if mode.startswith("tilefuse") else None,
            "tilefuse_failures": list(backend.failures) if backend is not None else None,
            "tilefuse_fallback_ops": sorted(backend.fallback_ops()) if backend is not None else None,
            "graph_replay_ms": replay_ms, "profile": prof,
            "plan": _plan_summary(runners) if mode.startswith("tilefuse") else None}


def graph_replay_ms(runners, replays: int = 200) -> float | None:
    """The GPU's time per decode step without the host: the last captured graph of the last compiled graph (the
    decode step's) replayed back to back, timed by events (its weights are far larger than L2, as in a real step; it
    rewrites the same cache position). A step's wall time above this is host time the GPU waited for."""
    graphs = [g for r in runners if getattr(r, "_graphed", None) is not None for g in r._graphed.graphs]
    if not graphs:
        return None
    g = graphs[-1].graph
    for _ in range(10):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end) / replays
    print(f"    graph replay alone: {ms:.4f} ms a step", flush=True)
    return ms


def profile_steps(step, tok, step_s: float, steps: int = 8) -> dict:
    """The GPU's kernels over ``steps`` decode steps, per step: by category, the top kernels, and how much of the
    step's wall time the GPU was busy (the rest is launch and host time)."""
    from profile_kernels import profile_calls

    state = [tok]

    def one() -> None:
        state[0] = step(state[0])

    out = {**profile_calls(one, steps, top=20), "wall_ms": step_s * 1e3}
    busy = out["busy_ms"]
    overlap = (f" (the kernels' own times sum to {out['kernel_sum_ms']:.3f}: PDL kernels wait while the one before "
               "runs)") if out["overlap_ms"] > 0.001 else ""
    print(f"    profile: GPU busy {busy:.3f} of {step_s * 1e3:.3f} ms a step{overlap}; "
          + ", ".join(f"{c} {ms:.3f}" for c, ms in out["by_category_ms"].items()), flush=True)
    for k in out["top"][:14]:
        print(f"      {k['ms']:.4f} ms x{k['count']:.0f} {k['kernel'][:100]}", flush=True)
    return out


def _plan_summary(runners) -> list[dict]:
    rows = []
    for r in runners:
        p = r.plan
        rows.append({"graph": p.graph.name, "regions": {b: sum(1 for g in p.regions if g.launches and g.backend == b)
                                                        for b in ("tilelang", "torch", "split")},
                     "runs_as": r.graph_backend,
                     "cuda_graphs": None if r._graphed is None else len(r._graphed.graphs),
                     "given_to_torch": [n for n in p.notes if "measured" in n]})
        print(f"    plan {p.graph.name}: {rows[-1]['regions']}, runs as {r.graph_backend}, CUDA graphs "
              f"{rows[-1]['cuda_graphs']}; " + "; ".join(rows[-1]["given_to_torch"][:40]), flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="a short run: fewer shapes and steps")
    ap.add_argument("--modes", default=None, help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--batches", default=None, help="comma list (default 1,8,64)")
    ap.add_argument("--cache-lens", default=None, help="comma list (default 512,4096)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 128)")
    ap.add_argument("--check", type=int, default=None, help="steps checked against eager (default 8)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 64)")
    ap.add_argument("--peak-tbps", type=float, default=4.8, help="the memory bandwidth %% peak is of")
    ap.add_argument("--tol", type=float, default=None, help="logits tolerance (default 2e-2 fp16, 1e-4 fp32)")
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--profile", action="store_true", help="also profile 8 steps per mode: kernels by category")
    ap.add_argument("--host-profile", action="store_true", help="cProfile tilefuse's timed steps: host time by function")
    args = ap.parse_args(argv)
    cpu, quick = args.device == "cpu", args.quick
    defaults = {"batches": "1,2" if cpu else ("1,8" if quick else "1,8,64"),
                    "cache_lens": "64" if cpu else ("512" if quick else "512,4096"),
                    "prompt": 8 if cpu else (32 if quick else 128), "check": 3 if cpu else 8,
                    "warmup": 2 if cpu else 3, "steps": 6 if cpu else (16 if quick else 64),
                    "modes": "eager,inductor,tilefuse" if cpu else ",".join(MODES)}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    modes = args.modes.split(",")
    if cpu and "inductor-ro" in modes:
        raise SystemExit("inductor-ro (CUDA graphs) needs --device cuda")
    if not cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --device cpu (a tiny model) or on the GPU machine")
    dtype = torch.float32 if cpu else torch.float16
    tol = args.tol if args.tol is not None else (1e-4 if cpu else 2e-2)
    target = {"kind": "c"} if cpu else {"kind": "cuda", "arch": "sm_90a"}

    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = model_config(args.device)
    model = LlamaForCausalLM(cfg).to(args.device, dtype).eval()
    ref_model = LlamaForCausalLM(cfg).to(args.device, dtype).eval()
    ref_model.load_state_dict(model.state_dict())
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)

    rows = []
    for cache_len in (int(x) for x in args.cache_lens.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            for mode in modes:
                try:
                    row = run_one(model, ref_model, mode, batch, cache_len, args, target)
                except Exception as e:  # noqa: BLE001 -- a mode that fails is a result, the others still run
                    row = {"mode": mode, "batch": batch, "cache_len": cache_len,
                           "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"}
                row["logits_ok"] = row.get("logits_rel_err", float("inf")) <= tol
                rows.append(row)
                print(_line(row), flush=True)
    _add_ratios(rows)
    print()
    print(table(rows))
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": _device_name(args.device),
            "torch": torch.__version__, "transformers": _version("transformers"), "tilelang": _version("tilelang"),
            "python": platform.python_version(), "dtype": str(dtype), "config": cfg.to_dict(), "args": vars(args),
            "tolerance": tol}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=str))
    print(f"\nwrote {args.out}")
    bad = [r for r in rows if "error" in r or not r["logits_ok"]]
    if bad:
        print(f"{len(bad)} runs failed or missed the logits tolerance {tol}", file=sys.stderr)
        sys.exit(1)


def _add_ratios(rows: list[dict]) -> None:
    """Each row's tokens/s over the best Inductor mode's at the same (batch, cache length)."""
    for r in rows:
        peers = [p["tokens_per_s"] for p in rows if p["mode"].startswith("inductor") and "tokens_per_s" in p
                 and (p["batch"], p["cache_len"]) == (r["batch"], r["cache_len"])]
        if peers and "tokens_per_s" in r:
            r["vs_best_inductor"] = r["tokens_per_s"] / max(peers)


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['mode']:14} b={r['batch']:<3} L={r['cache_len']:<5} ERROR {r['error']}"
    return (f"{r['mode']:14} b={r['batch']:<3} L={r['cache_len']:<5} {r['ms_per_token']:8.3f} ms/token "
            f"{r['tokens_per_s']:10.1f} tok/s {r['tb_per_s']:6.3f} TB/s ({r['pct_peak']:5.1f}% peak) "
            f"logits err {r['logits_rel_err']:.1e}")


def table(rows: list[dict]) -> str:
    head = (f"{'mode':14} {'batch':>5} {'cache':>6} {'ms/token':>9} {'tokens/s':>10} {'TB/s':>6} {'%peak':>6} "
            f"{'vs ind.':>7} {'logit err':>9} {'compiles':>8}")
    out = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            out.append(f"{r['mode']:14} {r['batch']:>5} {r['cache_len']:>6}  ERROR {r['error'][:80]}")
            continue
        ratio = f"{r['vs_best_inductor']:.2f}x" if "vs_best_inductor" in r else "-"
        out.append(f"{r['mode']:14} {r['batch']:>5} {r['cache_len']:>6} {r['ms_per_token']:9.3f} "
                   f"{r['tokens_per_s']:10.1f} {r['tb_per_s']:6.3f} {r['pct_peak']:6.1f} {ratio:>7} "
                   f"{r['logits_rel_err']:9.1e} {r['compiles'] if r['compiles'] is not None else '-':>8}")
    return "\n".join(out)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()

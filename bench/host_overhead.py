"""The host's time per decode step, without the GPU: what tilefuse's runner costs around a CUDA-graph replay.

Usage (any machine):  python bench/host_overhead.py [--layers 8] [--steps 300] [--profile]

A Hugging Face LlamaForCausalLM with ``--layers`` layers and tiny widths (so the arguments, outputs and regions are a
real decode step's, the arithmetic negligible) decodes with a static cache through ``torch.compile(backend=tilefuse)``
on the CPU target, its plan's CUDA graphs emulated by a graph whose replay does nothing: each step then costs what
the host does around a replay (dynamo's and AOTAutograd's wrappers, the runner's key, the input copies, the output
copies, the eager tail, the cache write-back). Prints microseconds per step, and with ``--profile`` the top entries
of a cProfile of the timed steps. Compare against the H200's per-step wall and GPU-busy times (bench_decode.py).
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import pstats
import sys
import time

import torch


class _NoReplay:
    """A captured graph stand-in whose replay launches nothing: the outputs keep the capture call's values."""

    replays = 0

    def replay(self) -> None:
        self.replays += 1


def record_without_replay(fn, inputs, warmup):
    for _ in range(warmup):
        fn(*inputs)
    return _NoReplay(), tuple(fn(*inputs))


def main(argv=None) -> int:
    import transformers

    from tilefuse.backend import make_backend
    from tilefuse.config import Options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=a.layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg).eval()
    runners = []

    def observe(r):  # as build_runner does for a CUDA plan: graphs (emulated here) and the eager tail
        runners.append(r)
        r.enable_cuda_graphs(True)
        r._graphed.record, r._graphed.device_type = record_without_replay, "cpu"

    options = Options(target={"kind": "c"}, quiet=True, measure=False, observer=observe)
    fwd = torch.compile(model.forward, backend=make_backend(options))
    kw = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    cache = transformers.StaticCache(config=cfg, max_cache_len=a.steps + 64)
    tok = torch.randint(1, 512, (1, 8))
    with torch.no_grad():
        fwd(tok, **{kw: cache})
        tok = tok[:, -1:]
        for _ in range(10):
            fwd(tok, **{kw: cache})
        prof = cProfile.Profile() if a.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        for _ in range(a.steps):
            fwd(tok, **{kw: cache})
        if prof:
            prof.disable()
        us = (time.perf_counter() - t0) / a.steps * 1e6
    decode = runners[-1]
    graphs = decode._graphed.graphs if decode._graphed is not None else []
    print(f"{a.layers} layers: {us:.1f} us of host time a decode step ({len(decode.plan.regions)} regions, "
          f"{len(graphs)} graph(s), {sum(g.graph.replays for g in graphs)} replays, "
          f"{len(graphs[0].copied) if graphs else 0} inputs copied a replay)")
    if prof:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(35)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

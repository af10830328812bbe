"""Why a tuned plan with the untuned plan's configs profiles slower: both plans of one model, measured in turns.

Usage (on the device machine):  python bench/tuned_order.py --models bert,gpt2 [--rounds 3] [--json out.json]

Session 38 saw zoo BERT's tuned plan (``tune="fast"``, every GEMM config the same as untuned) profile 6% slower in
every category, GEMMs, attention and norms alike, on the H200 and on an H100, and GPT-2's tuned plan run 4.5% slower
whole with the same kernel times. ``bench_models.py`` measures the two plans one after the other, the tuned one right
after its tuning. Here each model's two plans are compiled first (the untuned one, then ``tune="fast"`` into an empty
tuning database), then measured in turns, ``rounds`` times each (untuned, tuned, tuned, untuned, ...), each turn
with the GPU's SM clock, temperature and power read before and after it (nvidia-smi) beside the whole call's time
(``time_ms``: L2 flushed before each call) and its kernel profile by category. Where the two plans' configs differ,
the regions are listed. A gap that follows the turn's place rather than the plan is the GPU's state, not the plan.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout
from profile_kernels import category_line, profile, time_ms

import tilefuse


def gpu_state() -> str:
    """SM clock (MHz), temperature (C), power (W) and the active clock-throttle reasons, as nvidia-smi reads them."""
    q = "clocks.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                       text=True, check=False)
    return r.stdout.strip().replace(" ", "") or r.stderr.strip()[:80]


def configs(runners) -> dict[str, object]:
    return {f"{i}:{name}": k.config for i, r in enumerate(runners) for name, k in r.kernels.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    out: list[dict] = []
    for name in a.models.split(","):
        torch._dynamo.reset()
        model, inputs = heldout.build(name, "bench")
        plans, fns = {}, {}
        with torch.no_grad():
            for mode in ("none", "fast"):
                runners: list = []
                fns[mode] = tilefuse.compile(model, observer=runners.append, tune=mode)
                fns[mode](*inputs)
                torch.cuda.synchronize()
                plans[mode] = configs(runners)
            same = plans["none"] == plans["fast"]
            print(f"{name}: tuned configs {'the same as' if same else 'differ from'} untuned "
                  f"({len(plans['none'])} kernels)", flush=True)
            for k in sorted(set(plans["none"]) | set(plans["fast"])):
                if plans["none"].get(k) != plans["fast"].get(k):
                    print(f"  {k}: untuned {plans['none'].get(k)}  tuned {plans['fast'].get(k)}", flush=True)
            order = [m for i in range(a.rounds) for m in (("none", "fast") if i % 2 == 0 else ("fast", "none"))]
            for turn, mode in enumerate(order):
                before = gpu_state()
                ms = time_ms(fns[mode], *inputs, reps=a.reps)
                prof = profile(fns[mode], *inputs)
                after = gpu_state()
                row = {"model": name, "turn": turn, "mode": mode, "ms": ms, "busy_ms": prof["busy_ms"],
                       "by_category_ms": prof["by_category_ms"], "gpu_before": before, "gpu_after": after}
                out.append(row)
                print(f"{name} turn {turn} tune={mode:4s} {ms:.3f} ms busy {prof['busy_ms']:.3f}: "
                      f"{category_line(prof)} | clock,temp,W,throttle {before} -> {after}", flush=True)
        del model, inputs, fns
        torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The constants the fx import makes of a held-out model, those over 1 MB named with where they came from, and the
compile's time (device diagnosis, session 44).

Why: HF BERT b32x512's cold compile took 58-91 s on the device machine (Inductor's 12.8 s) while tilefuse's phases
summed to ~10 s. cProfile (``profile_compile.py --model hf-bert --cold``) put 42 s in ``graph_cache.store``; this
script found what it wrote: 12 folded ``zeros_like`` masks of (32, 12, 512, 512) fp32, 403 MB each (transformers
5.17 on CUDA). Run: ``python3 bench/hf_constants.py [--model hf-bert]`` with empty caches for a cold compile.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402

from tilefuse import ir  # noqa: E402

BIG = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="hf-bert", choices=sorted(heldout.BUILDERS))
    args = ap.parse_args()
    seen = []
    real = ir.GraphBuilder.constant

    def constant(self, name, tensor):
        size = tensor.numel() * tensor.element_size()
        if size > BIG:
            where = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack()[-6:-1]]
            seen.append(size)
            print("BIG", name, tuple(tensor.shape), tensor.dtype, f"{size / 1e6:.1f} MB", where, flush=True)
        return real(self, name, tensor)

    ir.GraphBuilder.constant = constant
    model, inputs = heldout.build(args.model)
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend="tilefuse")(*inputs)
    torch.cuda.synchronize()
    print(f"compile+run {time.perf_counter() - t0:.1f} s; constants over 1 MB: {len(seen)}, "
          f"{sum(seen) / 1e9:.2f} GB", flush=True)
    print(torch._dynamo.utils.compile_times(repr="str")[:3000])


if __name__ == "__main__":
    main()

"""Where a warm compile's time goes: dynamo, AOTAutograd, planning, lowering, the first call.

Usage (on the device machine):  python bench/profile_compile.py --model gpt2 [--tune fast] [--top 40] [--cold]
(``--model``: a zoo model, or a held-out one of ``heldout.BUILDERS``: hf-bert, hf-gpt2, ...)

Compiles the zoo model once (cold: fills the tuning database and the kernel cache), resets dynamo, then
compiles it again under cProfile (warm: what ``bench_models.py`` reports as the warm compile) and prints
the warm compile's wall time, the phases by cumulative time, and the functions by own time. ``--cold`` profiles the
first compile instead (what ``bench_models.py`` reports as the compile; kernels compile in worker threads, so their
time shows as the main thread's wait in ``lowering/lower.py``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

import tilefuse
from tilefuse import models

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import heldout  # noqa: E402

PHASES = ("convert_frame.py", "aot_autograd.py", "tilefuse/backend.py", "planner/__init__.py", "lowering/lower.py",
          "tilefuse/pipeline.py", "lowering/tune.py", "runtime/plan_runner.py", "runtime/graphs.py", "tilelang/jit")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--tune", default="fast", choices=["none", "fast", "max"])
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--cold", action="store_true", help="profile the first (cold) compile, not the warm one")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    if args.model in heldout.BUILDERS:  # a Hugging Face or timm model (fp16, on the GPU)
        model, inputs = heldout.build(args.model)
    else:
        model, inputs = models.build(args.model, args.size, dtype=dtype, device=device)

    def compile_and_call() -> float:
        torch._dynamo.reset()
        t0 = time.perf_counter()
        with torch.no_grad():
            tilefuse.compile(model, tune=args.tune, quiet=True)(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    prof = cProfile.Profile()
    if args.cold:
        prof.enable()
        cold = compile_and_call()
        prof.disable()
        print(f"{args.model}: cold compile {cold:.2f} s (profiled)", flush=True)
    else:
        print(f"{args.model}: cold compile {compile_and_call():.2f} s", flush=True)
        print(f"{args.model}: warm compile {compile_and_call():.2f} s (unprofiled)", flush=True)
        prof.enable()
        warm = compile_and_call()
        prof.disable()
        print(f"{args.model}: warm compile {warm:.2f} s (profiled)")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(args.top * 4)
    lines = out.getvalue().splitlines()
    print("\nphases (cumulative):")
    print("\n".join(ln for ln in lines if any(p in ln for p in PHASES))[:6000])
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print("\nown time:")
    print(out.getvalue()[-8000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())

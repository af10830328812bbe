"""tilefuse on the CPU target ``c`` against torch eager, in one process (issue 18's done-when).

Usage:  python bench/bench_cpu.py [--size small] [--models gpt2,llama,...] [--rounds 30] [--gemm 512,1024]
        [--md bench/results/<date>-cpu.md]

For each zoo model (fp32, ``torch.no_grad``): eager, tilefuse with the measured choice (``measure=True``: each
region keeps the faster of its kernel and its torch ops, timed on the first call, in a fresh tuning database) and
tilefuse with every region forced to its TileLang kernel (``measure=False``). The three are timed in interleaved
rounds (one call of each per round, after warm-up), so load from other processes on a shared machine falls on all
three alike; the table gives the medians over ``--rounds`` rounds, the ratio eager/tilefuse (>= 1: tilefuse is as
fast as eager or faster), how many regions run as TileLang kernels and how each graph runs after the measured
choice (``tilefuse``: its plan; ``torch``: dynamo's graph through torch, measured faster than the plan). Then the GEMM template (the ``c`` pick,
through ``tilefuse.compile`` of ``a @ b``) against ``torch.matmul`` at n^3 fp32. Outputs are checked against eager.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _load() -> str:
    return " ".join(os.getloadavg().__repr__().strip("()").split(", ")[:3]) if hasattr(os, "getloadavg") else "?"


def interleaved_ms(fns: dict, args, rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median ms per call of each of ``fns`` over ``rounds`` rounds of one call each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(*args)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn(*args)
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def kernel_share(runners) -> tuple[int, int]:
    """(regions running as TileLang kernels, regions launching anything) over every graph compiled."""
    regions = [(r, runner) for runner in runners for r in runner.plan.regions if r.launches]
    return sum(r.backend in ("tilelang", "split") and runner.graph_backend != "torch" for r, runner in regions), \
        len(regions)


def _err(out, ref) -> float:
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    out = getattr(out, "logits", out)
    ref = getattr(ref, "logits", ref)
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-12))


def bench_model(name: str, size: str, rounds: int) -> dict:
    import tilefuse
    from tilefuse import models

    model, inputs = models.build(name, size, dtype=torch.float32, device="cpu")
    measured_runners, forced_runners = [], []
    with torch.no_grad():
        ref = model(*inputs)
        t0 = time.perf_counter()
        measured = tilefuse.compile(model, target="c", measure=True, quiet=True, observer=measured_runners.append)
        err_m = _err(measured(*inputs), ref)  # the first call measures each region
        compile_m = time.perf_counter() - t0
        forced = tilefuse.compile(model, target="c", measure=False, quiet=True, observer=forced_runners.append)
        err_f = _err(forced(*inputs), ref)
        ms = interleaved_ms({"eager": model, "measured": measured, "forced": forced}, inputs, rounds)
    return {"model": name, **ms, "err": max(err_m, err_f), "share_m": kernel_share(measured_runners),
            "share_f": kernel_share(forced_runners), "compile_s": compile_m,
            "graph": ",".join(r.graph_backend for r in measured_runners)}


class _MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def bench_gemm(n: int, rounds: int) -> dict:
    import tilefuse

    a, b = torch.randn(n, n), torch.randn(n, n)
    runners = []
    with torch.no_grad():
        compiled = tilefuse.compile(_MatMul(), target="c", measure=False, quiet=True, observer=runners.append)
        got = compiled(a, b)
        err = float((got - a @ b).abs().max() / (a @ b).abs().max())
        ms = interleaved_ms({"torch": torch.matmul, "template": compiled}, (a, b), rounds)
    kernels = [k for r in runners for k in r.kernels.values()]
    config = getattr(getattr(kernels[0], "spec", None), "template", "?") if kernels else "none"
    return {"n": n, **ms, "err": err, "kernel": config, "share": kernel_share(runners)}


def machine() -> str:
    lines = []
    try:
        lines.append(subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.strip()
                     .splitlines()[:12])
    except OSError:
        lines.append([platform.processor()])
    import tilelang

    out = "\n".join(lines[0])
    out += (f"\ntorch {torch.__version__}, torch.get_num_threads() = {torch.get_num_threads()}, tilelang "
            f"{tilelang.__version__}, python {platform.python_version()}")
    return out


def main(argv=None) -> int:
    from tilefuse import models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--models", default=",".join(models.ZOO))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--gemm", default="512,1024")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (the kernels' OpenMP threads follow it)")
    ap.add_argument("--md", help="also write the tables and the machine's description to this markdown file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not os.environ.get("TILEFUSE_TUNING_DB"):  # the measured choice is made in this run, not read from before
        os.environ["TILEFUSE_TUNING_DB"] = str(Path(tempfile.mkdtemp(prefix="bench_cpu_")) / "tuning.json")

    out = [f"load average before: {_load()}", "",
           (f"zoo at --size {args.size}, fp32, median of {args.rounds} interleaved rounds (ms); ratio = eager / "
           "tilefuse (>= 1.00: at least as fast as eager)"), "",
           ("| model | eager ms | measured ms | ratio | kernels (measured) | graph runs (measured) | forced ms | ratio "
            "| kernels (forced) | max rel err | first call s |"),
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(out), flush=True)
    for name in args.models.split(","):
        r = bench_model(name, args.size, args.rounds)
        (km, nm), (kf, nf) = r["share_m"], r["share_f"]
        line = (f"| {name} | {r['eager']:.2f} | {r['measured']:.2f} | {r['eager'] / r['measured']:.2f} | {km}/{nm} | "
                f"{r['graph']} | {r['forced']:.2f} | {r['eager'] / r['forced']:.2f} | {kf}/{nf} | {r['err']:.1e} | "
                f"{r['compile_s']:.1f} |")
        out.append(line)
        print(line, flush=True)
    head = ["", (f"GEMM fp32 n^3, median of {args.rounds} interleaved rounds (ms); ratio = template / torch.matmul "
                "(<= 1.5 wanted)"), "", "| n | torch.matmul ms | template ms | ratio | max rel err |",
            "| --- | --- | --- | --- | --- |"]
    out += head
    print("\n".join(head), flush=True)
    for n in (int(x) for x in args.gemm.split(",") if x):
        g = bench_gemm(n, args.rounds)
        line = f"| {n} | {g['torch']:.2f} | {g['template']:.2f} | {g['template'] / g['torch']:.2f} | {g['err']:.1e} |"
        out.append(line)
        print(line, flush=True)
    tail = ["", f"load average after: {_load()}"]
    out += tail
    print("\n".join(tail))
    if args.md:
        desc = machine()
        Path(args.md).write_text("```\n" + desc + "\n```\n\n" + "\n".join(out) + "\n")
        print(f"wrote {args.md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

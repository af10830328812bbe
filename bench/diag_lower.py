"""Where a cold compile's lower step goes, kernel by kernel: TileLang's lowering, nvcc (and inside it the host
preprocessor, cicc and ptxas), the host links, the kernel cache's fsyncs.

Session 25 measured the zoo MLP's lower step at 7.3 s on the H200 machine (16 cores, three kernels compiled in
parallel); the same three kernels compile in 4.0 s on the 2-core CPU machine, where an empty kernel with TileLang's
headers alone costs nvcc 1.27 of a warp-specialized GEMM's 1.76 s (2026-12-04). This says which part grows there.

Usage (device):  python bench/diag_lower.py --models mlp,gpt2 --out DIR

Each model compiles in a fresh process with empty caches (``torch.compile(model, backend="tilefuse")`` and its first
call). Every ``compile_kernel`` call is timed in its thread, with the subprocesses it ran (nvcc, g++) and the
``os.fsync`` calls it made; nvcc's own phases come from ``NVCC_APPEND_FLAGS=--time`` (a CSV in DIR).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict


def hooks(events: dict) -> None:
    """Record, per thread, the seconds of each subprocess (by program) and each fsync into ``events``."""
    popen_init, popen_wait, fsync = subprocess.Popen.__init__, subprocess.Popen.wait, os.fsync

    def init(self, args, *a, **k):
        prog = args[0] if isinstance(args, list) else str(args).split()[0]
        self._diag = (time.perf_counter(), os.path.basename(str(prog)))
        popen_init(self, args, *a, **k)

    def wait(self, *a, **k):
        r = popen_wait(self, *a, **k)
        t0, prog = getattr(self, "_diag", (None, None))
        if t0 is not None:
            self._diag = (None, None)
            events[threading.get_ident()][prog].append(time.perf_counter() - t0)
        return r

    def timed_fsync(fd):
        t0 = time.perf_counter()
        try:
            return fsync(fd)
        finally:
            events[threading.get_ident()]["fsync"].append(time.perf_counter() - t0)

    subprocess.Popen.__init__, subprocess.Popen.wait, os.fsync = init, wait, timed_fsync


def child(model_name: str, out: str, device: str) -> None:
    import torch

    import tilefuse.lowering.compile as comp
    from tilefuse import models

    events: dict = defaultdict(lambda: defaultdict(list))
    rows: list[dict] = []
    hooks(events)
    compile_kernel = comp.compile_kernel

    def timed(func, *a, **k):
        me = threading.get_ident()
        events[me].clear()
        t0 = time.perf_counter()
        try:
            return compile_kernel(func, *a, **k)
        finally:
            took = time.perf_counter() - t0
            ev = {p: (len(v), round(sum(v), 3)) for p, v in events[me].items()}
            spent = sum(s for _, s in ev.values())
            name = str(func.attrs["global_symbol"]) if getattr(func, "attrs", None) else "?"
            rows.append({"kernel": name, "s": round(took, 3), "sub": ev, "rest": round(took - spent, 3),
                         "start": round(t0, 3)})

    comp.compile_kernel = timed
    runners: list = []
    cuda = device == "cuda"
    size, dtype = ("bench", torch.float16) if cuda else ("tiny", torch.float32)
    model, inputs = models.build(model_name, size, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        model(*inputs)
        sync()
        t0 = time.perf_counter()
        torch.compile(model, backend="tilefuse", options={"observer": runners.append})(*inputs)
        sync()
    total = time.perf_counter() - t0
    phases = [r.compile_phases() for r in runners]
    lower = sum(p.get("lower", 0.0) + p.get("splits", 0.0) for p in phases)
    first = min((r["start"] for r in rows), default=t0)
    span = max((r["start"] + r["s"] for r in rows), default=t0) - first
    print(f"{model_name}: compile + first call {total:.2f} s; lower + splits {lower:.2f} s; {len(rows)} kernels "
          f"compiled over {span:.2f} s on {os.cpu_count()} cores; their seconds summed {sum(r['s'] for r in rows):.2f}")
    by: dict = defaultdict(lambda: [0, 0.0])
    for r in rows:
        for prog, (n, s) in r["sub"].items():
            by[prog][0] += n
            by[prog][1] += s
        by["tilelang (rest)"][0] += 1
        by["tilelang (rest)"][1] += r["rest"]
    for prog, (n, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {prog:16} {n:4} calls {s:8.2f} s")
    print("  slowest kernels (s: total, then each program's calls and seconds, then the rest):")
    for r in sorted(rows, key=lambda r: -r["s"])[:12]:
        print(f"    {r['s']:6.2f}  {r['kernel'][:40]:40} {r['sub']} rest {r['rest']}")
    with open(os.path.join(out, f"{model_name}_lower.json"), "w") as f:
        json.dump({"model": model_name, "total_s": total, "lower_s": lower, "span_s": span, "rows": rows}, f, indent=1)


def nvcc_phases(path: str) -> str:
    """nvcc's ``--time`` CSV summed by phase (host preprocessing, cicc, ptxas, ...)."""
    if not os.path.exists(path):
        return "  (no nvcc --time file)"
    sums: dict = defaultdict(lambda: [0, 0.0])
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) >= 8 and row[6].strip().replace(".", "", 1).isdigit():
                phase = row[1].strip()
                sums[phase][0] += 1
                sums[phase][1] += float(row[6]) / 1e3
    ordered = sorted(sums.items(), key=lambda kv: -kv[1][1])
    return "\n".join(f"  nvcc {p:26} {n:4} runs {s:8.2f} s" for p, (n, s) in ordered)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp")
    ap.add_argument("--out", default=".")
    ap.add_argument("--timeout", type=float, default=200)
    ap.add_argument("--device", default="cuda", help="cuda (bench size, fp16) or cpu (tiny, fp32: a dry run)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        child(args.models, args.out, args.device)
        return 0
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            times = os.path.abspath(os.path.join(args.out, f"{model}_nvcc_time.csv"))
            env = dict(os.environ, TILEFUSE_QUIET="1", TILEFUSE_TUNING_DB=os.path.join(cache, "tuning.json"),
                       TILEFUSE_FUNC_CACHE_DIR=os.path.join(cache, "funcs"),
                       TILELANG_CACHE_DIR=os.path.join(cache, "tilelang"), NVCC_APPEND_FLAGS=f"--time {times}")
            try:
                cmd = [sys.executable, os.path.abspath(__file__), "--child", "--models", model, "--device", args.device,
                       "--out", args.out]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=args.timeout, check=False)
                print(done.stdout + (done.stderr[-2000:] if done.returncode else ""), flush=True)
            except subprocess.TimeoutExpired:
                print(f"{model}: timed out after {args.timeout:.0f} s", flush=True)
            print(nvcc_phases(times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How a cold kernel compile's steps scale with the kernels compiled at once: in threads (``compile_many``, as a
model's compile runs them) and in processes of their own (no shared interpreter), on this machine's CPUs.

Usage (on the device machine):  python bench/compile_scaling.py [--counts 1,3] [--json FILE]

#13's compile bar (session 40): the MLP's three kernels compiled in three threads on the H200's machine took 2.1-2.5 s
of TileLang lowering and 3.0-3.5 s of nvcc each, where a 2-core CPU machine takes 0.7-0.8 s and 1.7-2.0 s. Each
count ``n`` compiles ``n`` fp16 ws GEMMs with a GELU epilogue (distinct shapes, an empty TileLang cache of their
own) once in ``n`` threads and once in ``n`` processes, and prints each step's spans (``compile_time._record_spans``):
if the threads' steps stretch with ``n`` and the processes' do not, the interpreter (the GIL) is what they share; if
both stretch, the machine's CPUs (a quota, a slow core) are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def machine() -> dict:
    """The CPUs this process may use, and any cgroup quota on them."""
    facts = {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "loadavg": os.getloadavg()}
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        if os.path.exists(path):
            facts[path] = Path(path).read_text().strip()
    try:
        model = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        facts["cpu"] = model[0].split(":", 1)[1].strip() if model else "?"
    except OSError:
        pass
    return facts


def compile_in_threads(first: int, n: int) -> dict:
    """``n`` kernels (shape index ``first`` on) compiled by ``compile_many`` in ``n`` threads, in this process."""
    sys.path.insert(0, str(HERE))
    import compile_time
    import proto_gemm_ws

    from tilefuse.lowering.compile import compile_many

    compile_time._record_spans()
    proto_gemm_ws.EPILOGUE = proto_gemm_ws.EPILOGUES["gelu"]
    funcs = [(proto_gemm_ws.gemm_ws(8192, 3072 + 64 * (first + i), 768, block_N=192, stages=4), [-1])
             for i in range(n)]
    t0 = time.perf_counter()
    compile_many(funcs, SM90, num_workers=n)
    return {"seconds": time.perf_counter() - t0,
            "spans": [(th, w, a - t0, b - t0) for th, w, a, b in compile_time.SPANS if a >= t0]}


def run(n: int, processes: bool) -> dict:
    """``n`` kernels in ``n`` threads of one child process, or in ``n`` child processes of one kernel each."""
    cache = tempfile.mkdtemp(prefix="tl-cache-")
    env = dict(os.environ, TILELANG_CACHE_DIR=cache, TILEFUSE_QUIET="1")
    cmds = [[sys.executable, __file__, "--child", str(k if processes else 0), str(1 if processes else n)]
            for k in (range(n) if processes else [0])]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for c in cmds]
    outs = [json.loads([ln for ln in p.communicate()[0].splitlines() if ln.startswith("{")][-1]) for p in procs]
    wall = time.perf_counter() - t0
    steps: dict = {}
    for out in outs:
        for _, what, a, b in out["spans"]:
            steps.setdefault(what, []).append(b - a)
    return {"n": n, "how": "processes" if processes else "threads", "wall": wall,
            "compile": max(o["seconds"] for o in outs), "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="1,3")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(compile_in_threads(*args.child)), flush=True)
        return 0
    facts = machine()
    print(json.dumps(facts), flush=True)
    rows = []
    for n in (int(c) for c in args.counts.split(",")):
        for processes in (False, True) if n > 1 else (False,):
            r = run(n, processes)
            rows.append(r)
            steps = ", ".join(f"{w} {statistics.median(v):.2f} (max {max(v):.2f})" for w, v in r["steps"].items()
                              if w in ("TIR passes", "nvcc", "cache write", "kernel"))
            print(f"{n} kernels in {r['how']:9}: compile {r['compile']:.2f} s (wall {r['wall']:.2f} s); "
                  f"median step s: {steps}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": facts, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

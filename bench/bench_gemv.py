"""A decode step's linear layers: the ``gemv`` template's configs against cuBLAS (``F.linear``), as a model streams them.

Usage (on the device machine):  python bench/bench_gemv.py [--json out.json]

Shapes: HF LLaMA's (hidden 2048, GQA 32/8, MLP 5632, vocabulary 32000; ``bench_decode.py``'s model) and LLaMA-3-8B's
projections, at 1 and 8 rows, fp16, with a bias-free and a residual-add epilogue. Each weight is one of enough
copies that together they exceed the L2 cache several times, and one CUDA graph calls the layer once per copy: the
time per call is what a decode step pays, its weight read from memory, the launch inside a graph. Every output
element is checked against the fp32 reference. Prints a table (ms per call, TB/s of the weight, x cuBLAS).

``--groups``: instead, the linears a decode step applies to one input (q/k/v, gate/up) as one ``gemv_group`` launch,
against the same weights as separate ``gemv`` launches (the default config), separate cuBLAS calls, and one cuBLAS
call on the weights concatenated (what a plan-time concatenation would give). Then each gate/up pair as a gated MLP's
decode step runs it: one launch whose up reads ``silu(gate)`` in registers (the gate never stored, every config)
against the two launches a plan made before (the gate stored, the up's epilogue reading it). ``--device cpu`` runs
the same on the ``c`` target with wall-clock timing and tiny shapes (a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch
import torch.nn.functional as F

from tilefuse.config import default_target
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import Acc, Arg, Call
from tilefuse.lowering.templates import gemv
from tilefuse.lowering.templates.gemm import reference

SHAPES = {"llama q/o": (2048, 2048), "llama k/v": (512, 2048), "llama gate/up": (5632, 2048),
          "llama down": (2048, 5632), "llama lm head": (32000, 2048), "8b q/o": (4096, 4096), "8b k/v": (1024, 4096),
          "8b gate/up": (14336, 4096), "8b down": (4096, 14336)}
GROUPS = {"llama q/k/v": ((2048, 512, 512), 2048), "llama gate/up": ((5632, 5632), 2048),
          "8b q/k/v": ((4096, 1024, 1024), 4096), "8b gate/up": ((14336, 14336), 4096)}
CPU_GROUPS = {"tiny q/k/v": ((64, 16, 16), 64), "tiny gate/up": ((96, 96), 64)}
L2_BYTES = 50 * 2**20
SILU = Call("silu", (Acc(),))
GATED = Call("mul", (Call("silu", (Arg(0),)), Acc()))  # the up's epilogue reading the stored gate
JOINED = Call("mul", (Arg(0), Acc()))  # the up's epilogue reading the gate's silu in registers


def graph_ms(calls, reps: int = 20) -> float:
    """Milliseconds per call of ``calls`` (callables) captured once in a CUDA graph; median of ``reps`` replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / len(calls))
    return sorted(times)[len(times) // 2]


def wall_ms(calls, reps: int = 5) -> float:
    """``graph_ms`` on the CPU: wall-clock milliseconds per call (a check of the script, not a measurement)."""
    import time

    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for c in calls:
            c()
        times.append((time.perf_counter() - t0) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def group_rows(target: dict, device: str, rows: list[int], timer) -> list[dict]:
    """Each group of ``GROUPS`` (``CPU_GROUPS`` on the CPU) at each row count: ms per call of one ``gemv_group`` launch
    (every config), separate ``gemv`` launches (the default config), separate cuBLAS calls and one cuBLAS call on the
    concatenated weight; every output checked against the fp32 reference."""
    groups = GROUPS if device == "cuda" else CPU_GROUPS
    configs = gemv.get_configs(target)
    dt = "float16" if device == "cuda" else "float32"
    dtype = getattr(torch, dt)
    cases = [(name, M, Ns, K) for name, (Ns, K) in groups.items() for M in rows]
    items = []
    for _, M, Ns, K in cases:
        items += [(gemv.gemv_group(M, Ns, K, A_dtype=dt, target=target, **cfg), list(range(-len(Ns), 0)))
                  for cfg in configs]
        items += [(gemv.gemv(M, N, K, A_dtype=dt, target=target, **configs[0]), [-1]) for N in Ns]
    kernels = iter(compile_many(items, target))
    out = []
    gen = torch.Generator(device=device).manual_seed(0)
    for name, M, Ns, K in cases:
        nbytes = sum(Ns) * K * torch.finfo(dtype).bits // 8
        copies = max(2, -(-4 * L2_BYTES // nbytes)) if device == "cuda" else 2
        sets = [[torch.randn(N, K, device=device, dtype=dtype, generator=gen) * 0.05 for N in Ns] for _ in range(copies)]
        cats = [torch.cat(ws) for ws in sets]
        x = torch.randn(M, K, device=device, dtype=dtype, generator=gen)
        want = [reference(x, w, trans_B=True).float() for w in sets[0]]
        row = {"group": name, "M": M, "Ns": list(Ns), "K": K, "configs": {}}
        row["cublas_ms"] = timer([(lambda w=w, x=x: F.linear(x, w)) for ws in sets for w in ws]) * len(Ns)
        row["cublas_cat_ms"] = timer([(lambda c=c, x=x: F.linear(x, c)) for c in cats])
        group_kernels = [next(kernels) for _ in configs]
        singles = [next(kernels) for _ in Ns]
        row["gemv_ms"] = timer([(lambda k=k, w=w, x=x: k(x, w)) for ws in sets for k, w in zip(singles, ws)]) * len(Ns)
        ok = all(torch.allclose(k(x, w).float(), r, rtol=1e-2, atol=1e-2) for k, w, r in zip(singles, sets[0], want))
        for cfg, kern in zip(configs, group_kernels):
            got = kern(x, *sets[0])
            good = all(torch.allclose(g.float(), r, rtol=1e-2, atol=1e-2) for g, r in zip(got, want))
            t = timer([(lambda k=kern, ws=ws, x=x: k(x, *ws)) for ws in sets])
            row["configs"][gemv.config_label(cfg)] = {"ms": t, "ok": good}
        row["ok"] = ok and all(v["ok"] for v in row["configs"].values())
        best = min(row["configs"].items(), key=lambda kv: kv[1]["ms"])
        print(f"{name:14s} M={M} cuBLAS {row['cublas_ms']:.4f} ms, concatenated {row['cublas_cat_ms']:.4f} | gemv "
              f"apart {row['gemv_ms']:.4f} | group " + " ".join(f"{k} {v['ms']:.4f}{'' if v['ok'] else ' BAD'}"
                                                             for k, v in row["configs"].items())
              + f" | best {best[0]} {nbytes / 1e9 / best[1]['ms']:.2f} TB/s, x{row['gemv_ms'] / best[1]['ms']:.2f} "
              f"apart, x{row['cublas_cat_ms'] / best[1]['ms']:.2f} concatenated cuBLAS{'' if row['ok'] else ' BAD'}",
              flush=True)
        out.append(row)
    return out


def gated_rows(target: dict, device: str, rows: list[int], timer) -> list[dict]:
    """Each gate/up pair of ``GROUPS`` (``CPU_GROUPS``) at each row count: ms per call of the joined ``gemv_group``
    (every config) and of the two launches apart (the default config); every output checked against the fp32
    reference of ``silu(x @ gate^T) * (x @ up^T)``."""
    groups = {k: v for k, v in (GROUPS if device == "cuda" else CPU_GROUPS).items() if "gate/up" in k}
    configs = gemv.get_configs(target)
    dt = "float16" if device == "cuda" else "float32"
    dtype = getattr(torch, dt)
    cases = [(name, M, Ns[0], K) for name, (Ns, K) in groups.items() for M in rows]
    items = []
    for _, M, N, K in cases:
        items += [(gemv.gemv_group(M, (N, N), K, A_dtype=dt, epilogues=[SILU, JOINED], extras_of=[(), (-1,)],
                                   stored=(False, True), target=target, **cfg), [-1]) for cfg in configs]
        items += [(gemv.gemv(M, N, K, A_dtype=dt, target=target, **configs[0]), [-1]),
                  (gemv.gemv(M, N, K, A_dtype=dt, epilogue=GATED, extra_shapes=[(M, N)], extra_dtypes=[dt],
                             target=target, **configs[0]), [-1])]
    kernels = iter(compile_many(items, target))
    out = []
    gen = torch.Generator(device=device).manual_seed(0)
    for name, M, N, K in cases:
        nbytes = 2 * N * K * torch.finfo(dtype).bits // 8
        copies = max(2, -(-4 * L2_BYTES // nbytes)) if device == "cuda" else 2
        sets = [[torch.randn(N, K, device=device, dtype=dtype, generator=gen) * 0.05 for _ in range(2)]
                for _ in range(copies)]
        x = torch.randn(M, K, device=device, dtype=dtype, generator=gen)
        g = reference(x, sets[0][0], trans_B=True)
        want = reference(x, sets[0][1], [g], trans_B=True, epilogue=GATED).float()
        joined = [next(kernels) for _ in configs]
        gate_k, up_k = next(kernels), next(kernels)
        row = {"pair": name, "M": M, "N": N, "K": K, "configs": {}}
        row["apart_ms"] = timer([(lambda ws=ws, x=x, u=up_k, g=gate_k: u(x, ws[1], g(x, ws[0]))) for ws in sets])
        ok = torch.allclose(up_k(x, sets[0][1], gate_k(x, sets[0][0])).float(), want, rtol=1e-2, atol=1e-2)
        for cfg, kern in zip(configs, joined):
            good = torch.allclose(kern(x, *sets[0]).float(), want, rtol=1e-2, atol=1e-2)
            t = timer([(lambda k=kern, ws=ws, x=x: k(x, *ws)) for ws in sets])
            row["configs"][gemv.config_label(cfg)] = {"ms": t, "ok": good}
        row["ok"] = ok and all(v["ok"] for v in row["configs"].values())
        best = min(row["configs"].items(), key=lambda kv: kv[1]["ms"])
        print(f"{name:14s} M={M} gated: apart {row['apart_ms']:.4f} ms | joined "
              + " ".join(f"{k} {v['ms']:.4f}{'' if v['ok'] else ' BAD'}" for k, v in row["configs"].items())
              + f" | best {best[0]} {nbytes / 1e9 / best[1]['ms']:.2f} TB/s, x{row['apart_ms'] / best[1]['ms']:.2f} "
              f"apart{'' if row['ok'] else ' BAD'}", flush=True)
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--groups", action="store_true", help="q/k/v and gate/up as one launch (gemv_group)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args()
    if a.groups:
        target = default_target() if a.device == "cuda" else {"kind": "c"}
        counts = [int(r) for r in a.rows.split(",") if int(r) <= gemv.GEMV_ROWS]
        timer = graph_ms if a.device == "cuda" else wall_ms
        rows = group_rows(target, a.device, counts, timer) + gated_rows(target, a.device, counts, timer)
        if a.json:
            _write(a.json, rows)
        return 0 if all(r["ok"] for r in rows) else 1
    target = default_target()
    configs = gemv.get_configs(target)
    cases = [(name, M, N, K, epi) for name, (N, K) in SHAPES.items() for M in map(int, a.rows.split(","))
             for epi in ("none", "residual")]
    items = []
    for _, M, N, K, epi in cases:
        for cfg in configs:
            kw = {"epilogue": Call("add", (Acc(), Arg(0))), "extra_shapes": [(M, N)], "extra_dtypes": ["float16"]} \
                if epi == "residual" else {}
            items.append((gemv.gemv(M, N, K, A_dtype="float16", target=target, **kw, **cfg), [-1]))
    kernels = iter(compile_many(items, target))
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, M, N, K, epi in cases:
        copies = max(2, -(-4 * L2_BYTES // (N * K * 2)))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen) * 0.05 for _ in range(copies)]
        x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
        res = torch.randn(M, N, device="cuda", dtype=torch.float16, generator=gen)
        extras = [res] if epi == "residual" else []
        want = reference(x, ws[0], extras, trans_B=True,
                         epilogue=Call("add", (Acc(), Arg(0))) if extras else None).float()

        def torch_call(w, x=x, res=res, add=bool(extras)):
            return (lambda: F.linear(x, w) + res) if add else (lambda: F.linear(x, w))
        t_torch = graph_ms([torch_call(w) for w in ws])
        row = {"shape": name, "M": M, "N": N, "K": K, "epilogue": epi, "torch_ms": t_torch, "configs": {}}
        for cfg in configs:
            kern = next(kernels)
            got = kern(x, ws[0], *extras).float()
            err = ((got - want).abs() / (want.abs() + 1e-2)).max().item()
            ok = torch.allclose(got, want, rtol=1e-2, atol=1e-2)
            t = graph_ms([(lambda w=w, k=kern, x=x, e=extras: k(x, w, *e)) for w in ws])
            row["configs"][gemv.config_label(cfg)] = {"ms": t, "ok": ok, "rel_err": err}
        pick = configs[0]
        row["default"] = gemv.config_label(pick)
        best = min(row["configs"].items(), key=lambda kv: kv[1]["ms"])
        gb = N * K * 2 / 1e9
        print(f"{name:14s} M={M} {epi:8s} cuBLAS {t_torch:.4f} ms ({gb / t_torch:.2f} TB/s) | "
              + " ".join(f"{k} {v['ms']:.4f}{'' if v['ok'] else ' BAD'}" for k, v in row["configs"].items())
              + f" | best {best[0]} {gb / best[1]['ms']:.2f} TB/s x{t_torch / best[1]['ms']:.2f}; default {row['default']}"
              f" x{t_torch / row['configs'][row['default']]['ms']:.2f}", flush=True)
        rows.append(row)
    if a.json:
        _write(a.json, rows)
    return 0


def _write(path: str, rows: list[dict]) -> None:
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())

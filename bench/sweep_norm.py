"""Row-reduction configs at held-out and zoo norm/softmax shapes, against eager torch and Inductor: is the untuned pick
(``reduction.default_config``) the best, and where does it stand against the peers?

Usage (on the device machine):  python bench/sweep_norm.py [--json out.json] [--only convnext]

For each shape (fp16): every config of a grid around the pick (rows a program, columns a tile, threads) compiled in one
parallel batch, each checked against torch on fresh random rows (every element, fp16: 1e-2) and timed with cold caches
(``lowering.timing.device_time``: CUDA-graph replays, each call on its own copy of the operands); eager
``F.layer_norm``/``softmax``/RMS norm and Inductor default's compile of the same function timed the same way. Prints
per shape the pick, the first seed (the pick before session 55), the best config and the peers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch
import torch.nn.functional as F

from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import reduction
from tilefuse.lowering.timing import device_time

TARGET = {"kind": "cuda", "arch": "sm_90a"}
# (label, rows, cols, kind): ConvNeXt-T's layer norms at b64 (stages 1-4, channels last), Swin-T's window softmax
# (49 keys; its stage norms are ConvNeXt's shapes), zoo BERT's and GPT-2's residual norms, LLaMA's RMS norm, and 64
# short rows.
SHAPES = [("convnext s1", 200704, 96, "layer_norm"), ("convnext s2", 50176, 192, "layer_norm"),
          ("convnext s3", 12544, 384, "layer_norm"), ("convnext s4", 3136, 768, "layer_norm"),
          ("swin softmax", 602112, 49, "softmax"),
          ("bert/vit norm", 16384, 768, "layer_norm"), ("gpt2 norm", 8192, 768, "layer_norm"),
          ("llama rms", 8192, 4096, "rms_norm"), ("wide ln", 4096, 2048, "layer_norm"),
          ("few rows", 64, 256, "layer_norm")]


def grid(rows: int, cols: int) -> list[dict]:
    """The pick, the first seed, and configs around them: block_N the row's power of two (or 1024-8192 for long
    rows), rows a program and threads so that each thread holds 1-32 elements."""
    width = 1 << max(0, (cols - 1).bit_length())
    out = [reduction.default_config(rows, cols, TARGET), reduction.get_configs(TARGET)[0]]
    if width <= 512:
        for br in (1, 2, 4, 8, 16, 32, 64):
            for t in (64, 128, 256):
                if br * width <= 8192 and 1 <= br * width // t <= 32:
                    out.append({"block_rows": br, "block_N": width, "threads": t})
    else:
        for n in (1024, 2048, 4096, 8192):
            if n > 2 * width:
                continue
            for br in (1, 2):
                for t in (128, 256, 512):
                    if 1 <= br * min(n, width) // t <= 32:
                        out.append({"block_rows": br, "block_N": n, "threads": t})
    return unique(out)


def unique(configs: list[dict]) -> list[dict]:
    """``configs`` without repeats, in order."""
    seen, out = set(), []
    for c in configs:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def save(path: str | None, info: dict, results: list) -> None:
    """Write what was measured so far (after every shape: a run cut short keeps it)."""
    if path:
        with open(path, "w") as f:
            json.dump({"meta": info, "rows": results}, f, indent=1)


def torch_fn(kind: str, cols: int):
    if kind == "layer_norm":
        return lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-6)
    if kind == "rms_norm":
        return lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    return lambda x: torch.softmax(x, -1)


def time_configs(label: str, configs: list[dict], kernels: list, args: list, want: torch.Tensor, peers: dict,
                 pick: dict, first: dict | None = None, tol: float = 1e-2, atol: float | None = None) -> dict:
    """Check each compiled config of one shape against ``want`` (every element), time it with cold caches, print one
    line (the peers, the first seed, the pick and the best) and return the row (what ``--json`` writes)."""
    times, bad = {}, {}
    for c, k in zip(configs, kernels):
        key = json.dumps(c, sort_keys=True)
        if isinstance(k, BaseException):
            bad[key] = f"{type(k).__name__}: {str(k).splitlines()[0][:120] if str(k) else ''}"
            continue
        got = k(*args).float()
        if not torch.allclose(got, want, rtol=tol, atol=tol if atol is None else atol, equal_nan=True):
            bad[key] = f"WRONG: max err {(got - want).abs().max().item():.3g}"
            continue
        times[key] = device_time(k, args, "cuda") * 1e3
    pick_key, first_key = json.dumps(pick, sort_keys=True), json.dumps(first, sort_keys=True)
    best = min(times, key=times.get) if times else None
    nan, peer = float("nan"), min(peers.values())
    cells = " ".join(f"{v:8.4f}" for v in peers.values())
    print(f"{label:26} {cells} {times.get(first_key, nan):8.4f} {times.get(pick_key, nan):8.4f} "
          f"{times.get(best, nan):8.4f}  {peer / times.get(pick_key, nan):6.2f}  {best}  ({len(bad)} dropped)",
          flush=True)
    for key, why in list(bad.items())[:3]:
        print(f"    dropped {key}: {why}", flush=True)
    return {"label": label, "peers_ms": peers, "times_ms": times, "dropped": bad, "pick": pick_key,
            "first": first_key, "best": best}


def meta() -> dict:
    import tilelang

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "tilelang": tilelang.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--only", default="", help="labels containing this text")
    a = ap.parse_args()
    shapes = [s for s in SHAPES if a.only in s[0]]
    items, configs = [], {}
    for label, rows, cols, kind in shapes:
        extra = {"has_weight": True, "has_bias": kind == "layer_norm"} if kind != "softmax" else {}
        configs[label] = grid(rows, cols)
        for c in configs[label]:
            items.append((reduction.row_reduction((rows, cols), kind, x_dtype="float16", eps=1e-6, target=TARGET,
                                                  **extra, **c), [-1]))
    t0 = time.perf_counter()
    kernels = compile_many(items, TARGET, return_exceptions=True)
    print(f"{len(items)} kernels for {len(shapes)} shapes compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    results, info = [], meta()
    print(f"{'shape':26} {'eager':>8} {'inductor':>8} {'first':>8} {'pick':>8} {'best':>8}  pick x best peer  best "
          "config", flush=True)
    for label, rows, cols, kind in shapes:
        torch._dynamo.reset()
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
        args = [x] + ([torch.randn(cols, device="cuda", dtype=torch.float16)] if kind != "softmax" else []) + \
            ([torch.randn(cols, device="cuda", dtype=torch.float16)] if kind == "layer_norm" else [])
        ref = torch_fn(kind, cols)
        want = ref(*[t.float() for t in args]).float()
        peers = {"eager": device_time(ref, args, "cuda") * 1e3,
                 "inductor": device_time(torch.compile(ref), args, "cuda") * 1e3}
        done, kernels = kernels[:len(configs[label])], kernels[len(configs[label]):]
        row = time_configs(f"{label} {rows}x{cols}", configs[label], done, args, want, peers,
                           reduction.default_config(rows, cols, TARGET), reduction.get_configs(TARGET)[0])
        results.append({**row, "rows": rows, "cols": cols, "kind": kind})
        save(a.json, info, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

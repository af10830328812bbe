"""Group norm + SiLU (a diffusion U-Net's and VAE's most frequent pair) at Stable Diffusion's shapes: tilefuse's row
reduction (``lowering/norm_builder.py``, the kernel forced: no measured choice) against eager torch (two kernels) and
Inductor default, in one process.

Usage (on the device machine):  python bench/bench_group_norm.py [--json out.json] [--device cpu]

For each shape: the kernels' GPU time per call under the profiler (``busy``: what the kernels cost, launches
aside), and the whole call's median with L2 flushed before each (``profile_kernels.time_ms``). Every output element is
checked against eager (fp16: 1e-2). ``--device cpu`` runs tiny shapes on the ``c`` target (a check of the script).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
from torch import nn

import tilefuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_kernels import profile, time_ms  # noqa: E402

# (batch, channels, height, width, groups): SD 1.5's U-Net at 512x512 (latents 64x64) and its VAE decoder's last
# stages; the last is a 1-D audio shape (wav2vec2's first feature layer, a group per channel).
SHAPES = [(2, 320, 64, 64, 32), (2, 640, 32, 32, 32), (2, 1280, 16, 16, 32), (2, 1280, 8, 8, 32),
          (1, 512, 128, 128, 32), (1, 256, 256, 256, 32), (1, 128, 512, 512, 32), (8, 512, 1, 3199, 512)]
CPU_SHAPES = [(2, 32, 8, 8, 8), (1, 16, 1, 40, 16)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    rows = []
    print(f"{'shape':>26s} {'eager ms':>9s} {'inductor':>9s} {'tilefuse':>9s} | busy: {'eager':>7s} {'inductor':>8s} "
          f"{'tilefuse':>8s}  x eager  x inductor", flush=True)
    for n, c, h, w, g in SHAPES if cuda else CPU_SHAPES:
        torch._dynamo.reset()
        m = nn.Sequential(nn.GroupNorm(g, c), nn.SiLU()).to(a.device, dtype).eval()
        with torch.no_grad():
            for p in m.parameters():
                p.normal_()
        x = torch.randn(n, c, w, device=a.device, dtype=dtype) if h == 1 else \
            torch.randn(n, c, h, w, device=a.device, dtype=dtype)
        runners = []
        peers = {"eager": m, "tilefuse": tilefuse.compile(m, target=None if cuda else "c", measure=False,
                                                          observer=runners.append)}
        if cuda:
            peers["inductor"] = torch.compile(m)
        row = {"shape": [n, c, h, w], "groups": g, "ms": {}, "busy_ms": {}}
        with torch.no_grad():
            want = m(x).float()
            for name, fn in peers.items():
                got = fn(x).float()
                row.setdefault("ok", True)
                row["ok"] &= bool(torch.allclose(got, want, rtol=1e-2, atol=1e-2))
                row["ms"][name] = time_ms(fn, x) if cuda else float("nan")
                row["busy_ms"][name] = profile(fn, x)["busy_ms"] if cuda else float("nan")
        regions = [r for run in runners for r in run.plan.regions]
        row["tilefuse_backends"] = sorted({r.backend for r in regions if "group_norm" in r.ops})
        ms, busy = row["ms"], row["busy_ms"]
        best = min(busy.get("eager", 1), busy.get("inductor", busy.get("eager", 1)))
        print(f"{str((n, c, h, w, g)):>26s} {ms['eager']:9.4f} {ms.get('inductor', float('nan')):9.4f} "
              f"{ms['tilefuse']:9.4f} | {busy['eager']:7.4f} {busy.get('inductor', float('nan')):8.4f} "
              f"{busy['tilefuse']:8.4f}  {busy['eager'] / busy['tilefuse']:7.2f}  {best / busy['tilefuse']:9.2f}"
              f"{'' if row['ok'] else '  WRONG'} {row['tilefuse_backends']}", flush=True)
        rows.append(row)
    if a.json:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

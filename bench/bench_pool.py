"""ResNet-50's stem max pool (NHWC fp16, 3x3 stride 2, padding 1): the ``pool2d`` template's configs against torch and
Inductor, in one process.

Usage (on the device machine):  python bench/bench_pool.py [--json out.json] [--device cpu]

Session 52's profile of zoo ResNet-50 (b64) had our pool2d at 97.6 us a call on the H100 (1.3 TB/s) where Inductor
runs the stem's batch norm, ReLU and this pool as one kernel in 53.6 us. Each config of ``--configs`` (``block`` output
elements a program, ``threads``) is compiled (all at once), checked against torch on every output element, and timed
with L2 flushed before each call (``profile_kernels.time_ms``); TB/s counts the input read once and the output
written once. Peers: torch's channels-last ``max_pool2d`` and Inductor's, and Inductor's batch norm + ReLU + pool.
``--device cpu`` runs a tiny shape on the ``c`` target (a check of the script).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_kernels import time_ms  # noqa: E402

from tilefuse.lowering.compile import compile_many  # noqa: E402
from tilefuse.lowering.templates import pool  # noqa: E402

# (block, threads, pixel_tiles): the seeds (get_configs), then longer programs, then whole pixels a program
CONFIGS = [(256, 128, False), (512, 256, False), (128, 128, False), (1024, 128, False), (2048, 256, False),
           (256, 128, True), (512, 128, True), (1024, 128, True), (1024, 256, True), (2048, 256, True),
           (2048, 128, True), (4096, 256, True)]
GEOMETRY = {"kind": "max", "kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="64,112,112,64", help="N,H,W,C")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    n, h, w, c = (int(v) for v in a.shape.split(",")) if cuda else (2, 9, 10, 8)
    dtype = torch.float16 if cuda else torch.float32
    target = {"kind": "cuda", "arch": "sm_90a"} if cuda else {"kind": "c"}
    dt = "float16" if cuda else "float32"
    x = torch.randn(n, h, w, c, device=a.device, dtype=dtype)
    want = F.max_pool2d(x.permute(0, 3, 1, 2), 3, 2, 1).permute(0, 2, 3, 1)
    nbytes = (x.numel() + want.numel()) * x.element_size()
    configs = CONFIGS if cuda else [(256, 1, False), (1024, 1, True)]
    funcs = [pool.pool2d(x_shape=(n, h, w, c), x_dtype=dt, channels_last=True, block=b, threads=t, pixel_tiles=p,
                         target=target, **GEOMETRY) for b, t, p in configs]
    kernels = compile_many([(f, -1) for f in funcs], target, return_exceptions=True)
    rows = []

    def row(name: str, fn, check=True):
        if check:
            got = fn()
            got = got[0] if isinstance(got, (list, tuple)) else got
            torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0)
        ms = time_ms(fn) if cuda else float("nan")
        rows.append({"name": name, "ms": ms, "tb_s": nbytes / ms / 1e9 if cuda else None})
        print(f"{name:>34s} {ms:8.4f} ms {nbytes / ms / 1e9 if cuda else 0:6.2f} TB/s", flush=True)

    xc = x.permute(0, 3, 1, 2)  # (a channels-last NCHW view: torch's NHWC kernel)
    row("torch max_pool2d", lambda: F.max_pool2d(xc, 3, 2, 1).permute(0, 2, 3, 1))
    if cuda:
        ind = torch.compile(lambda t: F.max_pool2d(t, 3, 2, 1))
        row("inductor max_pool2d", lambda: ind(xc).permute(0, 2, 3, 1))
        scale, shift = torch.rand(c, device=a.device, dtype=dtype) + 0.5, torch.randn(c, device=a.device, dtype=dtype)
        fused = torch.compile(lambda t: F.max_pool2d(torch.relu(t * scale[:, None, None] + shift[:, None, None]),
                                                     3, 2, 1))
        row("inductor bn+relu+max_pool2d", lambda: fused(xc), check=False)
    for (b, t, p), k in zip(configs, kernels):
        name = f"pool2d block {b} threads {t}{' pixels' if p else ''}"
        if isinstance(k, BaseException):
            print(f"{name}: {str(k)[:200]}")
            continue
        row(name, lambda k=k: k(x))
    if a.json:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                "shape": [n, h, w, c]}
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

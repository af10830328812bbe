"""ResNet-50's convolutions through the conv2d template at each of its CUDA seeds and a few configs more, against
cuDNN: channels-last activations (NHWC), the model's OIHW weights, fp16, batch 64, the folded batch norm and ReLU as
the epilogue (``relu(acc * scale + shift)``), as the zoo ResNet-50's regions build them by default.

Peers, in the same process: ``F.conv2d`` on channels-last tensors alone (cuDNN), the same with the model's OIHW weight
as it is (``cudnn_oihw_ms``: how the split's head calls it), and with the batch norm and ReLU after it in eager torch
(what the measured choice's "torch" path runs). Every config's output is checked against the float64 reference first
(fp16 tolerance); times are medians with L2 flushed before every call (``profile_kernels.time_ms``), all candidates
compiled first, in parallel.

``--tma`` adds ``proto_conv_tma``'s kernel (A loaded by TMA in im2col mode) at its configs where it applies, given the
weight permuted to OHWI once; ``permute_ms`` is what that permute would cost a call.

Usage (device):  python bench/bench_conv.py [--json FILE] [--reps 50] [--shapes stem,l1,...] [--tma] [--no-seeds]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proto_conv_tma  # noqa: E402
from profile_kernels import time_ms  # noqa: E402

from tilefuse.lowering.compile import compile_many  # noqa: E402
from tilefuse.lowering.expr import Acc, Arg, call  # noqa: E402
from tilefuse.lowering.templates import conv  # noqa: E402

SHAPES = [  # label, input (N, H, W, C), weight (O, C, KH, KW), stride, padding (torchvision's ResNet-50 v1.5, b64)
    ("stem", (64, 224, 224, 3), (64, 3, 7, 7), 2, 3),
    ("l1", (64, 56, 56, 64), (64, 64, 3, 3), 1, 1),
    ("l2s2", (64, 56, 56, 128), (128, 128, 3, 3), 2, 1),
    ("l2", (64, 28, 28, 128), (128, 128, 3, 3), 1, 1),
    ("l3s2", (64, 28, 28, 256), (256, 256, 3, 3), 2, 1),
    ("l3", (64, 14, 14, 256), (256, 256, 3, 3), 1, 1),
    ("l4s2", (64, 14, 14, 512), (512, 512, 3, 3), 2, 1),
    ("l4", (64, 7, 7, 512), (512, 512, 3, 3), 1, 1),
]
EXTRA = [(128, 64, 32, 3, 128), (128, 64, 64, 3, 128), (64, 64, 64, 3, 128), (64, 64, 32, 4, 128),
         (256, 64, 32, 2, 256), (256, 128, 32, 3, 256), (128, 128, 64, 3, 256)]
EPILOGUE = call("relu", Acc() * Arg(0) + Arg(1))
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def configs() -> list[dict]:
    seeds = conv.get_configs(SM90)
    more = [{"block_M": m, "block_N": n, "block_K": k, "num_stages": st, "threads": t} for m, n, k, st, t in EXTRA]
    return seeds + [c for c in more if c not in seeds]


def build(shape, cfg):
    _, x, w, s, p = shape
    if cfg.get("kind") == "tma":
        tiles = {k: v for k, v in cfg.items() if k != "kind"}
        return proto_conv_tma.conv_tma(x, w, s, p, **tiles)
    return conv.conv2d(x, w, stride=(s, s), padding=(p, p), layout="NHWC", weight_layout="OIHW", epilogue=EPILOGUE,
                       extra_shapes=[(w[0],), (w[0],)], extra_dtypes=["float16", "float16"], **cfg, target=SM90)


def tma_configs(shape) -> list[dict]:
    """``proto_conv_tma``'s configs that take ``shape``."""
    _, x, w, s, p = shape
    return [{"kind": "tma", "block_M": m, "block_N": n, "block_K": k, "stages": st, "threads": t}
            for m, n, k, st, t in proto_conv_tma.CONFIGS if proto_conv_tma.applies(x, w, s, p, m, n, k)]


def bench_shape(shape, cfgs, kernels, reps: int) -> dict:
    label, xs, ws, s, p = shape
    torch.manual_seed(0)
    x = torch.randn(xs, device="cuda", dtype=torch.float16)
    w = torch.randn(ws, device="cuda", dtype=torch.float16) / (ws[1] * ws[2] * ws[3]) ** 0.5
    scale = torch.rand(ws[0], device="cuda", dtype=torch.float16) + 0.5
    shift = torch.randn(ws[0], device="cuda", dtype=torch.float16)
    ref = conv.reference(x, w, [scale, shift], stride=(s, s), padding=(p, p), layout="NHWC", weight_layout="OIHW",
                         epilogue=EPILOGUE).float()
    x_cl = x.permute(0, 3, 1, 2)  # (N, C, H, W) viewed over NHWC memory: channels last
    w_cl = w.contiguous(memory_format=torch.channels_last)
    cudnn = time_ms(lambda: F.conv2d(x_cl, w_cl, stride=s, padding=p), reps=reps)
    # the model's own (OIHW-contiguous) weight under channels-last input, as the split heads call cuDNN: a difference
    # is what converting the weight costs each call (session 43's lead: 20 direct_copy kernels in ResNet-50's profile)
    cudnn_oihw = time_ms(lambda: F.conv2d(x_cl, w, stride=s, padding=p), reps=reps)
    eager = time_ms(lambda: F.relu(F.conv2d(x_cl, w_cl, stride=s, padding=p) * scale[:, None, None]
                                   + shift[:, None, None]), reps=reps)
    row = {"shape": label, "x": xs, "w": ws, "stride": s, "padding": p, "cudnn_ms": cudnn, "cudnn_oihw_ms": cudnn_oihw,
           "eager_ms": eager, "configs": []}
    w_ohwi = w.permute(0, 2, 3, 1).reshape(ws[0], -1).contiguous()  # (O, KH * KW * C): proto_conv_tma's weight
    if any(c.get("kind") == "tma" for c in cfgs):
        row["permute_ms"] = time_ms(lambda: w.permute(0, 2, 3, 1).contiguous(), reps=reps)
    for cfg, k in zip(cfgs, kernels):
        entry = {"config": cfg}
        args = (x, w_ohwi, scale, shift) if cfg.get("kind") == "tma" else (x, w, scale, shift)
        if isinstance(k, BaseException):
            entry["error"] = str(k).strip().splitlines()[-1][:200] if str(k).strip() else type(k).__name__
        else:
            try:
                out = k(*args).float().reshape(ref.shape)
                err = ((out - ref).abs() / (ref.abs().amax() + 1e-6)).amax().item()
                entry.update(err=err, ok=bool(err < 1e-2))
                if entry["ok"]:
                    entry["ms"] = time_ms(lambda k=k, args=args: k(*args), reps=reps)
            except Exception as e:  # noqa: BLE001  (a launch failing: reported, the other configs still run)
                entry["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
        row["configs"].append(entry)
    return row


def print_row(row: dict) -> None:
    timed = [c for c in row["configs"] if "ms" in c]
    best = min(timed, key=lambda c: c["ms"]) if timed else None
    permute = f", weight permute {row['permute_ms']:.4f} ms" if "permute_ms" in row else ""
    print(f"{row['shape']:5s} x{row['x']} w{row['w']} s{row['stride']}: cuDNN {row['cudnn_ms']:.4f} ms "
          f"(OIHW weight {row['cudnn_oihw_ms']:.4f}), +bn+relu eager {row['eager_ms']:.4f} ms{permute}", flush=True)
    for c in row["configs"]:
        cfg = c["config"]
        tag = (f"{cfg.get('kind', 'conv2d')} {cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} "
               f"s{cfg.get('num_stages', cfg.get('stages'))} t{cfg['threads']}")
        if "ms" in c:
            mark = " <- best" if c is best else ""
            print(f"    {tag:24s} {c['ms']:.4f} ms  x cuDNN {row['cudnn_ms'] / c['ms']:.2f}  "
                  f"x eager {row['eager_ms'] / c['ms']:.2f}{mark}")
        else:
            print(f"    {tag:24s} {c.get('error') or 'wrong: err %.2e' % c['err']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--shapes", default="", help="labels, comma-separated (default: all)")
    ap.add_argument("--tma", action="store_true", help="add proto_conv_tma's kernel where it applies")
    ap.add_argument("--no-seeds", action="store_true", help="only conv2d's default config (and --tma's)")
    a = ap.parse_args()
    shapes = [s for s in SHAPES if not a.shapes or s[0] in a.shapes.split(",")]
    per_shape = [(configs()[:1] if a.no_seeds else configs()) + (tma_configs(shape) if a.tma else [])
                 for shape in shapes]
    t0 = time.monotonic()
    built = []
    for shape, cfgs in zip(shapes, per_shape):
        for cfg in cfgs:
            try:
                built.append((build(shape, cfg), [-1]))
            except Exception as e:  # noqa: BLE001  (the template refused the config: reported in the row)
                built.append(e)
    good = iter(compile_many([b for b in built if not isinstance(b, BaseException)], SM90, return_exceptions=True))
    kernels = [b if isinstance(b, BaseException) else next(good) for b in built]
    print(f"compiled {len(built)} kernels for {len(shapes)} shapes in {time.monotonic() - t0:.0f} s", flush=True)
    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "python": platform.python_version(), "rows": []}
    first = 0
    for shape, cfgs in zip(shapes, per_shape):
        row = bench_shape(shape, cfgs, kernels[first:first + len(cfgs)], a.reps)
        first += len(cfgs)
        result["rows"].append(row)
        print_row(row)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a GEMM's GELU epilogue costs: the same product and tile with no epilogue, bias, bias + exact GELU (erf),
bias + GELU's tanh form, and bias + an erf written with a short polynomial (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7),
against cuBLAS (``F.linear`` with its bias) then ``F.gelu``.

Usage (on the device machine):  python bench/gemm_epilogues.py [--json out.json]

Shapes: the MLP block's first linear (8192 x 16384 x 4096), BERT-base's (16384 x 3072 x 768) and GPT-2's (8192 x 3072 x
768); the default config of each (``gemm_configs.default_config``); every kernel compiled in one parallel batch; timed
with cold caches (``lowering.timing.device_time``). The question it answers: is the gap between our fused GEMM + GELU
and cuBLAS + a separate GELU the GELU's arithmetic in the epilogue (not overlapped with the next tile's MMAs)?
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys

import torch
import torch.nn.functional as F

from tilefuse.config import default_target
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.expr import Acc, Arg, Call, Const
from tilefuse.lowering.templates.gemm import gemm
from tilefuse.lowering.templates.gemm_configs import default_config, get_configs
from tilefuse.lowering.timing import device_time

SHAPES = {"mlp fc1": (8192, 16384, 4096), "bert fc1": (16384, 3072, 768), "gpt2 fc1": (8192, 3072, 768)}


def _erf_poly(z):
    """erf(z) by Abramowitz-Stegun 7.1.26: sign(z) (1 - poly(t) exp(-z^2)), t = 1 / (1 + p |z|)."""
    p, a = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
    az = Call("abs", (z,))
    t = Const(1.0) / (Const(1.0) + Const(p) * az)
    poly = t * (Const(a[0]) + t * (Const(a[1]) + t * (Const(a[2]) + t * (Const(a[3]) + t * Const(a[4])))))
    y = Const(1.0) - poly * Call("exp", (Call("neg", (z * z,)),))
    return Call("sign", (z,)) * y


def epilogues() -> dict:
    x = Acc() + Arg(0)
    return {"none": None, "bias": x,
            "bias+gelu(erf)": Call("gelu", (x,), {"approximate": "none"}),
            "bias+gelu(tanh)": Call("gelu", (x,), {"approximate": "tanh"}),
            "bias+gelu(erf poly)": x * Const(0.5) * (Const(1.0) + _erf_poly(x * Const(math.sqrt(0.5))))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    target = default_target()
    eps = epilogues()
    items, keys = [], []
    for name, (M, N, K) in SHAPES.items():
        cfg = default_config(get_configs(target, "float16"), M, N, 1, target)
        for ep_name, ep in eps.items():
            extra = () if ep is None else ((N,),)
            items.append((gemm(M, N, K, trans_B=True, epilogue=ep, extra_shapes=extra,
                               extra_dtypes=("float16",) * len(extra), target=target, **cfg), [-1]))
            keys.append((name, ep_name, cfg))
    kernels = compile_many(items, target, return_exceptions=True)
    rows = []
    for name, (M, N, K) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(M, K, device="cuda", generator=g).half()
        w = (torch.randn(N, K, device="cuda", generator=g) / math.sqrt(K)).half()
        b = torch.randn(N, device="cuda", generator=g).half()
        want = F.gelu(F.linear(x.float(), w.float(), b.float()))
        row = {"shape": name, "M": M, "N": N, "K": K,
               "cublas_ms": device_time(lambda x, w: F.linear(x, w), (x, w), "cuda") * 1e3,
               "cublas_bias_gelu_ms": device_time(lambda x, w, b: F.gelu(F.linear(x, w, b)), (x, w, b), "cuda") * 1e3,
               "kernels": {}}
        for (shape, ep_name, cfg), k in zip(keys, kernels):
            if shape != name:
                continue
            if isinstance(k, BaseException):
                row["kernels"][ep_name] = {"error": str(k).splitlines()[0][:200]}
                continue
            args = (x, w) if eps[ep_name] is None else (x, w, b)
            entry = {"ms": device_time(k, args, "cuda") * 1e3, "config": cfg}
            if "gelu" in ep_name:
                entry["max_err"] = ((k(*args).float() - want).abs().max() / want.abs().max()).item()
            row["kernels"][ep_name] = entry
        rows.append(row)
        print(f"{name} {M}x{N}x{K}: cuBLAS {row['cublas_ms']:.4f}, cuBLAS+bias then gelu {row['cublas_bias_gelu_ms']:.4f}; "
              + "; ".join(f"{e} {v.get('ms', float('nan')):.4f}" + (f" (err {v['max_err']:.1e})" if "max_err" in v else "")
                          for e, v in row["kernels"].items()), flush=True)
    if a.json:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name(), "torch": torch.__version__}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

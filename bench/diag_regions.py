"""Which region of a compiled zoo model is off: each lowered region's kernel against its ops through torch, fed the
reference values (``runtime.check.compare_regions``), worst first, with its template and config.

Usage (on the device machine):  python bench/diag_regions.py --model resnet [--size tiny] [--top 12]
The model goes through its ONNX export (fp32) and every region runs as its kernel (``measure=False``), as
``tests/test_dynamo_e2e.py``'s ONNX GPU test runs it (session 52: it named a GEMM of 2 rows wrong in fp32).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

import tilefuse
from tilefuse import models
from tilefuse.runtime.check import compare_regions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        compiled = tilefuse.compile_onnx(models.export_onnx(a.model, Path(tmp) / "m.onnx", size=a.size),
                                         measure=False, target=None if device == "cuda" else "c")
    runner = compiled.runner
    with torch.no_grad():
        report = compare_regions(runner, *models.example_inputs(a.model, a.size, device=device))
    by = {r.name: r for r in runner.plan.regions}
    for name, err in sorted(report, key=lambda r: -r[1])[:a.top]:
        k = runner.kernels.get(name)
        spec = getattr(k, "spec", None)
        print(f"{err:10.3e}  {name:40s} {by[name].ops} {spec.template if spec else '-'} {getattr(k, 'config', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

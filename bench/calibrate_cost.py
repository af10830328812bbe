"""Fit the planner's cost model (``tilefuse.planner.cost.CostModel``) to measured kernels.

Usage:  python bench/calibrate_cost.py bench/results/<run>.json [more.json ...] [--kinds elementwise,reduction]

Reads the kernel tables ``bench/bench_models.py`` writes (each lowered region's bytes moved and its device
time from CUDA-graph replays) and fits ``time = fixed + bytes / bandwidth`` by least squares over the
memory-bound kinds (GEMMs, convolutions and attention are compute-bound and would bias the fit). Prints
every region's measured and predicted time, the fit, and the ``CostModel`` it implies: ``bandwidth`` is
the model's ``bandwidth_bytes_per_us``; ``fixed`` is what one more kernel costs beyond its bytes (its launch
in a replayed graph plus its ramp-up and tail), the model's ``launch_us``. Tables timed with single-call
CUDA events (older runs, ``"timing"`` missing) include Python's launch latency and are skipped unless
``--include-event-timings``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Fit:
    fixed_us: float
    bandwidth_bytes_per_us: float
    n: int
    median_rel_err: float


def samples(results: list[dict], kinds: set[str], include_events: bool = False) -> list[tuple[str, float, float]]:
    """(label, bytes, device microseconds) of every memory-bound region in ``results``' kernel tables."""
    out = []
    for res in results:
        for row in res.get("rows", []):
            for k in _kernel_rows(row):
                if k.get("kind") not in kinds or k.get("tilefuse_ms") is None:
                    continue
                if k.get("timing") != "cuda_graph" and not include_events:
                    continue
                nbytes = k.get("bytes")
                if nbytes is None:  # older tables: bytes = achieved TB/s x time
                    nbytes = k["TB_s"] * k["tilefuse_ms"] * 1e9
                out.append((f"{row.get('model')}:{k['region']}", float(nbytes), k["tilefuse_ms"] * 1e3))
    return out


def _kernel_rows(row: dict) -> list[dict]:
    """A model row's kernel table: per tuning mode (``row["tilefuse"][mode]["regions"]``, each region's
    kernel timed once, the first mode that timed it kept) or, in older files, ``row["regions"]``."""
    if "regions" in row:
        return row["regions"]
    seen, out = set(), []
    for res in row.get("tilefuse", {}).values():
        for k in res.get("regions", []):
            key = (k.get("kind"), k.get("ops"), k.get("bytes"))
            if key not in seen:
                seen.add(key)
                out.append(k)
    return out


def fit(points: list[tuple[str, float, float]]) -> Fit:
    """Least squares of ``us = fixed + bytes * inv_bw`` with both terms kept non-negative."""
    if len(points) < 2:
        raise ValueError(f"need at least 2 measured memory-bound regions to fit, got {len(points)}")
    b = np.array([p[1] for p in points])
    t = np.array([p[2] for p in points])
    (fixed, inv_bw), *_ = np.linalg.lstsq(np.stack([np.ones_like(b), b], axis=1), t, rcond=None)
    if inv_bw <= 0:  # no bandwidth term in the data: time is all fixed cost
        fixed, inv_bw = float(np.median(t)), 1e-12
    if fixed < 0:  # through the origin
        fixed, inv_bw = 0.0, float((b @ t) / (b @ b))
    pred = fixed + b * inv_bw
    return Fit(float(fixed), float(1.0 / inv_bw), len(points), float(np.median(np.abs(pred - t) / t)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--kinds", default="elementwise,reduction")
    p.add_argument("--include-event-timings", action="store_true")
    a = p.parse_args(argv)
    results = [json.loads(Path(f).read_text()) for f in a.results]
    pts = samples(results, set(a.kinds.split(",")), a.include_event_timings)
    try:
        f = fit(pts)
    except ValueError as e:
        print(f"calibrate_cost: {e} (run bench/bench_models.py on a GPU: its kernel tables carry device times)",
              file=sys.stderr)
        return 2
    print(f"{'region':48} {'MB':>9} {'measured us':>12} {'model us':>9}")
    for label, nbytes, us in pts:
        print(f"{label[:48]:48} {nbytes / 1e6:9.2f} {us:12.1f} {f.fixed_us + nbytes / f.bandwidth_bytes_per_us:9.1f}")
    print(f"\nfit over {f.n} regions: fixed {f.fixed_us:.2f} us per kernel, bandwidth "
          f"{f.bandwidth_bytes_per_us / 1e6:.2f} TB/s, median relative error {f.median_rel_err:.1%}")
    print(f"CostModel(bandwidth_bytes_per_us={f.bandwidth_bytes_per_us:.4g}, launch_us={f.fixed_us:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

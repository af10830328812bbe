"""The cost-model fit recovers known constants from synthetic kernel tables and skips event-timed ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import calibrate_cost


def table(rng_points, timing="cuda_graph", per_mode=False):
    regions = [{"region": f"r{i}", "kind": kind, "ops": f"op{i}", "bytes": b, "tilefuse_ms": us / 1e3,
                "timing": timing, "TB_s": 1.0} for i, (kind, b, us) in enumerate(rng_points)]
    if per_mode:  # bench_models.py's layout since it times several tuning modes: a region timed twice counts once
        return {"rows": [{"model": "m", "tilefuse": {"none": {"regions": regions}, "fast": {"regions": regions[:2]}}}]}
    return {"rows": [{"model": "m", "regions": regions}]}


@pytest.mark.parametrize("per_mode", [False, True])
def test_fit_recovers_fixed_cost_and_bandwidth(per_mode):
    fixed, bw = 4.0, 3.5e6  # us, bytes/us
    pts = [("reduction" if i % 2 else "elementwise", b, fixed + b / bw) for i, b in
           enumerate([1e6, 5e6, 2e7, 8e7, 1.5e8, 3e8])]
    pts.append(("gemm", 1e6, 900.0))  # compute-bound kinds stay out of the fit
    f = calibrate_cost.fit(calibrate_cost.samples([table(pts, per_mode=per_mode)], {"elementwise", "reduction"}))
    assert f.n == 6 and f.fixed_us == pytest.approx(fixed, rel=1e-6)
    assert f.bandwidth_bytes_per_us == pytest.approx(bw, rel=1e-6) and f.median_rel_err < 1e-9


def test_event_timed_tables_are_skipped_unless_asked(tmp_path):
    pts = [("reduction", b, 30.0 + b / 4e6) for b in (1e6, 1e7, 1e8)]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(table(pts, timing=None)))
    run = [sys.executable, str(ROOT / "bench" / "calibrate_cost.py"), str(path)]
    refused = subprocess.run(run, check=False, capture_output=True, text=True)
    assert refused.returncode == 2 and "at least 2" in refused.stderr
    ok = subprocess.run(run + ["--include-event-timings"], check=False, capture_output=True, text=True)
    assert ok.returncode == 0 and "CostModel(bandwidth_bytes_per_us=4e+06, launch_us=30)" in ok.stdout, ok.stdout

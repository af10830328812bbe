"""bench/bench_group_norm.py on the CPU (``--device cpu``: tiny shapes on ``c``, no timing): the script runs, every
output checks against eager, and the group norms run as kernels."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_group_norm  # noqa: E402


def test_the_group_norm_bench_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gn.json"
    assert bench_group_norm.main(["--device", "cpu", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(bench_group_norm.CPU_SHAPES)
    assert all(r["ok"] and r["tilefuse_backends"] == ["tilelang"] for r in rows), rows

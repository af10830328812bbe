"""Per shape, each config's speed against cuDNN from ``bench_attention.py``'s JSON (one line a shape).

Usage:  python bench/summarize_attention.py RESULT.json [...]
Tags: ``tl`` the TileLang-scheduled template; a tile alone the ws schedule, plain; else its options joined by ``+``.
A number is cuDNN's time over the config's (above 1: faster than cuDNN); an error is its first words.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OPTIONS = ("pair_rows", "chain", "late_store", "double_q", "bound_keys", "fast_math")


def tag(config: dict) -> str:
    if not config.get("ws"):
        return "tl"
    return "+".join(k for k in OPTIONS if config.get(k) and k != "pair_rows")


def line(row: dict) -> str:
    cudnn, cells = row["sdpa"].get("cudnn"), []
    for e in row["tilefuse"]:
        c = e["config"]
        name = f"{c['block_M']}x{c['block_N']}" + (f"/{tag(c)}" if tag(c) else "")
        cells.append(f"{name} " + (f"{cudnn / e['ms']:.3f}" if "ms" in e and cudnn else e.get("error", "?")[:40]))
    flags = ("c" if row["causal"] else "-") + ("m" if row.get("masked") else "-")
    return f"{row['B']} {row['Hq']}/{row['Hkv']} {row['S']} {row['D']} {flags} | " + " ".join(cells)


def main(argv: list[str]) -> int:
    for f in argv:
        if Path(f).exists():
            for row in json.loads(Path(f).read_text())["rows"]:
                print(line(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Save, or check against a saved copy, the kernel source of every case in ``tests/template_cases.py`` for CUDA
(sm_90a) and C: a change meant for another target (a Metal branch in a template) must leave them byte-identical.

    python scripts/source_identity.py save  DIR     # before the change
    python scripts/source_identity.py check DIR     # after it: exit status 1 and the differing cases if any

Sources come from ``lowering.compile.kernel_source`` (no nvcc or gcc needed). The C source is the PrimFunc the
``c`` target compiles, after ``exact_float_constants`` (as ``compile_kernel`` does).
"""

from __future__ import annotations

import difflib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from template_cases import cases

from tilefuse.lowering.compile import C_PASS_CONFIGS, kernel_source
from tilefuse.lowering.exact_constants import exact_float_constants

TARGETS = {"cuda_sm_90a": {"kind": "cuda", "arch": "sm_90a"}, "c": {"kind": "c"}}


def sources(name: str, target: dict) -> dict[str, str]:
    out = {}
    for case, build in cases(target).items():
        f = build()
        if target["kind"] == "c":
            out[case] = kernel_source(exact_float_constants(f), target, pass_configs=C_PASS_CONFIGS)
        else:
            out[case] = kernel_source(f, target)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "check"):
        print(__doc__)
        return 2
    mode, root = argv[0], Path(argv[1])
    bad, total = [], 0
    for tname, target in TARGETS.items():
        start = time.perf_counter()
        srcs = sources(tname, target)
        folder = root / tname
        folder.mkdir(parents=True, exist_ok=True)
        for case, src in srcs.items():
            path = folder / f"{case}.src"
            total += 1
            if mode == "save":
                path.write_text(src)
            elif not path.exists():
                bad.append(f"{tname}/{case}: no saved source")
            elif path.read_text() != src:
                diff = difflib.unified_diff(path.read_text().splitlines(), src.splitlines(), "saved", "now",
                                            lineterm="", n=1)
                bad.append(f"{tname}/{case}: differs\n" + "\n".join(list(diff)[:40]))
        print(f"{tname}: {len(srcs)} kernels in {time.perf_counter() - start:.1f}s")
    if mode == "save":
        print(f"saved {total} sources under {root}")
        return 0
    if bad:
        print("\n".join(bad))
        print(f"{len(bad)} of {total} sources differ")
        return 1
    print(f"all {total} sources byte-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

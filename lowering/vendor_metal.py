"""A syntax check of emitted Metal (MSL) kernels on a machine without Apple's compiler.

Note: nothing on Linux compiles MSL. MSL is C++14 with address-space qualifiers and a few attributes, so clang
parses it as C++ once the Metal headers are replaced by stand-ins (``metal_headers/``: the types and functions
the templates' kernels use, declared with C++ meanings, address spaces as empty macros). The check catches
undeclared names, wrong argument types and arithmetic on types that have none (an element of a
``simdgroup_float8x8`` fragment), not Metal's own rules (address-space mismatches, resource limits, what the
GPU supports), but for one: a kernel's threadgroup memory is held to Apple's 32 KB. It runs
``clang-19 -x c++ -std=c++17 -fsyntax-only`` (``TILEFUSE_METAL_CLANG`` names another clang); on Debian/Ubuntu,
``apt-get install -y clang-19`` gets it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tilefuse.config import setting

HEADERS = Path(__file__).resolve().parent / "metal_headers"
CLANG_NAMES = ("clang-19", "clang++-19", "clang")
FLAGS = ("-x", "c++", "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", "-ferror-limit=50")
# Apple GPUs give a threadgroup at most 32 KB (MTLDevice.maxThreadgroupMemoryLength); past it the pipeline fails.
THREADGROUP_LIMIT = 32768
INSTALL_HINT = ("the Metal syntax check needs clang (19 tested): `apt-get install -y clang-19` on Debian/Ubuntu, "
                "or set TILEFUSE_METAL_CLANG to a clang binary")


class MetalSyntaxError(RuntimeError):
    """An emitted Metal kernel that does not parse; ``errors`` holds clang's error lines."""

    def __init__(self, name: str, errors: list[str], source: str):
        self.name, self.errors, self.source = name, errors, source
        shown = "\n".join(errors[:12]) + (f"\n... {len(errors) - 12} more" if len(errors) > 12 else "")
        super().__init__(f"Metal kernel {name!r} fails the syntax check ({len(errors)} errors):\n{shown}")


@dataclass(frozen=True)
class CheckResult:
    """What clang said about one kernel: ``ok`` when it parsed; ``errors`` are the ``error:`` lines."""

    name: str
    ok: bool
    errors: tuple[str, ...]
    output: str


def find_clang() -> str | None:
    """The clang binary the check runs, or None if none is installed."""
    named = setting("METAL_CLANG", "")
    if named:
        return shutil.which(named) or (named if Path(named).is_file() else None)
    return next((p for p in map(shutil.which, CLANG_NAMES) if p), None)


def threadgroup_bytes(source: str) -> int:
    """Threadgroup memory the kernel declares (TileLang emits its shared buffers as threadgroup arrays)."""
    sizes = {"uchar": 1, "char": 1, "half": 2, "short": 2, "ushort": 2, "float": 4, "int": 4, "uint": 4}
    return sum(sizes.get(t, 8) * int(n) for t, n in re.findall(r"threadgroup (\w+) \w+\[(\d+)\];", source))


def check_source(source: str, name: str = "kernel", clang: str | None = None, timeout: float = 60.0) -> CheckResult:
    """Parse one emitted Metal source with clang against the stand-in headers, and check its threadgroup memory
    against Apple's limit (raises ``FileNotFoundError`` with how to install clang when there is none)."""
    clang = clang or find_clang()
    if clang is None:
        raise FileNotFoundError(INSTALL_HINT)
    with tempfile.TemporaryDirectory(prefix="tilefuse-metal-") as tmp:
        path = Path(tmp) / f"{name}.metal"
        path.write_text(source)
        proc = subprocess.run([clang, *FLAGS, f"-I{HEADERS}", str(path)], capture_output=True, text=True, check=False,
                              timeout=timeout)
    output = proc.stderr.replace(str(path), f"{name}.metal")
    errors = [line for line in output.splitlines() if ": error:" in line or line.startswith("fatal error")]
    if proc.returncode != 0 and not errors:
        errors.append(output.strip()[-500:])
    shared = threadgroup_bytes(source)
    if shared > THREADGROUP_LIMIT:
        errors.append(f"{name}.metal: error: {shared} bytes of threadgroup memory, past Apple GPUs' "
                      f"{THREADGROUP_LIMIT} (use smaller tiles)")
    return CheckResult(name, not errors, tuple(errors), output)


def check_or_raise(source: str, name: str = "kernel", clang: str | None = None) -> None:
    """``check_source``, raising ``MetalSyntaxError`` with clang's errors when the kernel does not parse."""
    result = check_source(source, name, clang)
    if not result.ok:
        raise MetalSyntaxError(name, list(result.errors), source)

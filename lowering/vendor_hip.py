"""AMD code objects from HIP source without ROCm: clang-19 with HIP headers and device libraries unpacked in the project.

Note: TileLang's own HIP build needs ``hipcc``. A code object needs much less (``../shared/REACH.md``, AMD): clang-19
and lld-19, the HIP headers of ``libamdhip64-dev`` and the amdgcn bitcode of ``rocm-device-libs-17``, all of which
``scripts/install_rocm_toolchain.sh`` puts in ``.toolchains/rocm`` (``TILEFUSE_ROCM_DIR`` points elsewhere). The
compile is device-only (``--cuda-device-only --no-gpu-bundle-output``: an ELF ``.hsaco``, no offload bundle) and
asks clang for its resource remarks, which give each kernel's registers, spills and occupancy. A spill is an error:
a kernel that spills registers to scratch memory is one whose tile config is wrong for the arch.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tilelang

from tilefuse.config import setting

INSTALL_SCRIPT = "scripts/install_rocm_toolchain.sh"
# Arch -> ELF e_flags machine id (EF_AMDGPU_MACH_*): the MFMA-capable CDNA parts the HIP templates target (TileLang's
# HIP GEMM is MFMA code; an RDNA or pre-gfx908 arch does not compile it).
ARCHS = {"gfx908": 0x30, "gfx90a": 0x3F, "gfx940": 0x40, "gfx941": 0x4B, "gfx942": 0x4C}
DEFAULT_ARCH = "gfx942"
EM_AMDGPU = 224
LDS_BYTES = 65536  # LDS a workgroup may use on gfx9 (CDNA1-3)
_PROJECT = Path(__file__).resolve().parent.parent


class HipCompileError(RuntimeError):
    """clang could not compile a kernel's HIP source (its diagnostics in the message)."""


class HipSpillError(HipCompileError):
    """A kernel compiled, but spills registers to scratch memory."""


def arch_of(target: dict | str) -> str:
    """The gfx arch of a hip target (``{"kind": "hip", "mcpu": "gfx90a"}`` or ``"hip:gfx90a"``); ValueError naming
    the known archs for any other."""
    if isinstance(target, dict):
        arch = target.get("mcpu") or target.get("arch") or DEFAULT_ARCH
    else:
        arch = str(target).partition(":")[2] or DEFAULT_ARCH
    if arch not in ARCHS:
        raise ValueError(f"unknown AMD arch {arch!r} for target hip; known: {', '.join(ARCHS)} (e.g. hip:gfx942)")
    return arch


@dataclass(frozen=True)
class Toolchain:
    """Where the pieces of a HIP device compile are."""

    clang: str
    rocm: Path  # the unpacked packages' root: usr/include/hip, usr/lib/llvm-17/.../amdgcn/bitcode
    shim: Path  # rocwmma/rocwmma.hpp stand-in

    @property
    def bitcode(self) -> Path:
        return self.rocm / "usr/lib/llvm-17/lib/clang/17/amdgcn/bitcode"


def toolchain_dir() -> Path:
    return Path(setting("ROCM_DIR", "") or _PROJECT / ".toolchains/rocm")


def find_toolchain() -> Toolchain | None:
    """The toolchain the install script set up, or None where any piece is missing."""
    root = toolchain_dir()
    clang = shutil.which("clang-19")
    lld = shutil.which("ld.lld-19") or (os.path.exists("/usr/lib/llvm-19/bin/ld.lld") and "/usr/lib/llvm-19/bin/ld.lld")
    tc = Toolchain(clang or "", root, root / "shim")
    ok = clang and lld and (root / "usr/include/hip/hip_runtime.h").is_file() and (tc.bitcode / "ockl.bc").is_file() \
        and (tc.shim / "rocwmma/rocwmma.hpp").is_file()
    return tc if ok else None


def missing_message() -> str:
    """How to get the toolchain, for a message where it is absent."""
    return (f"no HIP toolchain (clang-19, lld-19, HIP headers and device libraries in {toolchain_dir()}): run "
            f"{_PROJECT / INSTALL_SCRIPT} to install it (clang-19/lld-19 through apt, the rest unpacked into the "
            "project); the HIP source is written all the same")


@dataclass(frozen=True)
class Resources:
    """One kernel's resource usage as clang's ``kernel-resource-usage`` remarks report it."""

    name: str
    vgprs: int
    agprs: int
    sgprs: int
    vgpr_spill: int
    sgpr_spill: int
    scratch: int  # bytes per lane
    occupancy: int  # waves per SIMD
    lds: int  # bytes a workgroup: static (clang's remark), plus the dynamic shared memory it is launched with

    @property
    def spills(self) -> int:
        return self.vgpr_spill + self.sgpr_spill


_REMARK = re.compile(r"remark:\s+([^:\n]+?):\s+([^\n]+?) \[-Rpass-analysis=kernel-resource-usage\]")
_FIELDS = {"VGPRs": "vgprs", "AGPRs": "agprs", "SGPRs": "sgprs", "VGPRs Spill": "vgpr_spill",
           "SGPRs Spill": "sgpr_spill", "ScratchSize [bytes/lane]": "scratch", "Occupancy [waves/SIMD]": "occupancy",
           "LDS Size [bytes/block]": "lds"}


def parse_resources(remarks: str) -> list[Resources]:
    """Each kernel's ``Resources`` from clang's ``-Rpass-analysis=kernel-resource-usage`` remarks (stderr)."""
    out, cur = [], None
    for key, value in _REMARK.findall(remarks):
        key, value = key.strip(), value.strip()
        if key == "Function Name":
            cur = {"name": value}
            out.append(cur)
        elif cur is not None and key in _FIELDS:
            cur[_FIELDS[key]] = int(value.split()[0])
    return [Resources(**{f: 0 for f in _FIELDS.values()} | d) for d in out]


@dataclass(frozen=True)
class CodeObject:
    """A compiled kernel: the ``.hsaco`` ELF and its kernels' resource usage."""

    arch: str
    hsaco: bytes
    resources: tuple[Resources, ...]


def check_elf(hsaco: bytes, arch: str) -> None:
    """RuntimeError unless ``hsaco`` is an AMD GPU ELF for ``arch`` (``readelf -h``: Machine AMD GPU, the flags' mach)."""
    if hsaco[:4] != b"\x7fELF" or int.from_bytes(hsaco[18:20], "little") != EM_AMDGPU:
        raise HipCompileError("the code object is not an AMD GPU ELF")
    mach = int.from_bytes(hsaco[48:52], "little") & 0xFF
    if mach != ARCHS[arch]:
        raise HipCompileError(f"the code object is for mach {mach:#x}, not {arch} ({ARCHS[arch]:#x})")


def compile_hip(source: str, arch: str = DEFAULT_ARCH, toolchain: Toolchain | None = None,
                allow_spills: bool = False, dynamic_lds: int = 0) -> CodeObject:
    """Compile one kernel's HIP ``source`` to a code object for ``arch``. Raises ``HipCompileError`` with clang's
    diagnostics or where the kernel's LDS (static, plus ``dynamic_lds`` bytes it is launched with) passes the arch's
    64 KB a workgroup, ``HipSpillError`` where a kernel spills (unless ``allow_spills``), ``FileNotFoundError``
    saying how to install the toolchain where it is absent."""
    arch = arch_of({"kind": "hip", "mcpu": arch})
    if dynamic_lds > LDS_BYTES:
        raise HipCompileError(f"the kernel is launched with {dynamic_lds} bytes of dynamic shared memory, past "
                              f"{arch}'s {LDS_BYTES} bytes of LDS a workgroup (use smaller tiles)")
    tc = toolchain or find_toolchain()
    if tc is None:
        raise FileNotFoundError(missing_message())
    templates = Path(tilelang.__file__).parent / "src"
    with tempfile.TemporaryDirectory(prefix="tilefuse-hip-") as d:
        src, obj = Path(d) / "kernel.hip", Path(d) / "kernel.hsaco"
        src.write_text(source)
        cmd = [tc.clang, "-x", "hip", "-std=c++17", f"--offload-arch={arch}", "--cuda-device-only",
               "--no-gpu-bundle-output", f"--rocm-path={tc.rocm / 'usr'}", f"--rocm-device-lib-path={tc.bitcode}",
               f"-I{templates}", f"-I{tc.shim}", "-O3", "-c", str(src), "-o", str(obj),
               "-Rpass-analysis=kernel-resource-usage"]
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not obj.is_file():
            errors = [ln for ln in r.stderr.splitlines() if "error" in ln][:8] or r.stderr.splitlines()[-8:]
            raise HipCompileError(f"clang-19 failed for {arch} (exit {r.returncode}):\n" + "\n".join(errors))
        hsaco = obj.read_bytes()
    check_elf(hsaco, arch)
    res = tuple(dataclasses.replace(x, lds=x.lds + dynamic_lds) for x in parse_resources(r.stderr))
    if any(x.lds > LDS_BYTES for x in res):
        raise HipCompileError(f"LDS past {arch}'s {LDS_BYTES} bytes a workgroup: {[x for x in res if x.lds > LDS_BYTES]}")
    spilled = [x for x in res if x.spills]
    if spilled and not allow_spills:
        raise HipSpillError("; ".join(f"{x.name} spills {x.vgpr_spill} VGPRs and {x.sgpr_spill} SGPRs on {arch}"
                                      for x in spilled))
    return CodeObject(arch, hsaco, res)

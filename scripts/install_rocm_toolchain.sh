#!/usr/bin/env bash
# Install what compiling tilefuse's HIP kernels to AMD code objects (.hsaco) needs, without ROCm:
#   - clang-19 and lld-19 from the system's apt sources (the only change outside the project);
#   - HIP headers (libamdhip64-dev, Debian sid) and the device libraries' bitcode (rocm-device-libs-17, Debian
#     trixie), fetched with `apt-get download` through a PRIVATE sources list and unpacked with `dpkg -x` into
#     .toolchains/rocm/ (gitignored); the system's package lists and caches are left as they are;
#   - a one-line rocwmma/rocwmma.hpp stand-in (TileLang's HIP templates include rocWMMA only for hip_bfloat16).
# Idempotent: a second run finds everything and does nothing. Exits non-zero with the reason when it cannot.
# Where the toolchain lives is what tilefuse.lowering.vendor_hip looks for (TILEFUSE_ROCM_DIR overrides it).
# See ../shared/REACH.md (AMD) for how this was verified.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${TILEFUSE_ROCM_DIR:-$root/.toolchains/rocm}"
mirror="${TILEFUSE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
say() { echo "install_rocm_toolchain: $*"; }
die() { echo "install_rocm_toolchain: error: $*" >&2; exit 1; }

# 1. clang-19 + lld-19 (the system's apt; root needed only when they are missing)
have_llvm() { command -v clang-19 >/dev/null && { command -v ld.lld-19 >/dev/null || [ -x /usr/lib/llvm-19/bin/ld.lld ]; }; }
if have_llvm; then
    say "clang-19 and lld-19 present ($(command -v clang-19))"
else
    command -v apt-get >/dev/null || die "clang-19 and lld-19 are missing and there is no apt-get: install LLVM 19's clang and lld"
    [ "$(id -u)" = 0 ] || die "clang-19 and lld-19 are missing; run as root or: apt-get install -y clang-19 lld-19"
    say "installing clang-19 lld-19 with apt-get"
    apt-get install -y --no-install-recommends clang-19 lld-19 >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends clang-19 lld-19; } \
        || die "apt-get install clang-19 lld-19 failed"
    have_llvm || die "clang-19 or ld.lld-19 still missing after apt-get install"
fi

# 2. HIP headers + device libraries, unpacked into $dest
hip_h="$dest/usr/include/hip/hip_runtime.h"
bitcode="$dest/usr/lib/llvm-17/lib/clang/17/amdgcn/bitcode"
if [ -f "$hip_h" ] && [ -f "$bitcode/ockl.bc" ]; then
    say "HIP headers and device libraries present in $dest"
else
    command -v apt-get >/dev/null || die "no apt-get to download libamdhip64-dev and rocm-device-libs-17"
    work="$dest/.apt"
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$dest"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s trixie main\n' "$mirror" >"$work/sources.list"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s sid main\n' "$mirror" >>"$work/sources.list"
    apt_private=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
                 -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache"
                 -o Dir::State::Status=/dev/null -o APT::Get::List-Cleanup=0)
    say "reading trixie and sid package lists from $mirror (private lists in $work)"
    apt-get "${apt_private[@]}" update >"$work/update.log" 2>&1 \
        || die "apt-get update of the private sources failed (see $work/update.log): is $mirror reachable?"
    # libamdhip64-dev from sid (6.4.x: has hip/hip_bf16.h), device libs from trixie (LLVM-17 bitcode with gfx942)
    for spec in "libamdhip64-dev/sid" "rocm-device-libs-17/trixie"; do
        say "downloading $spec"
        (cd "$work/debs" && apt-get "${apt_private[@]}" download "$spec" >>"$work/download.log" 2>&1) \
            || die "apt-get download $spec failed (see $work/download.log)"
    done
    for deb in "$work"/debs/*.deb; do
        say "unpacking $(basename "$deb") into $dest"
        dpkg -x "$deb" "$dest"
    done
    [ -f "$hip_h" ] || die "no hip/hip_runtime.h after unpacking libamdhip64-dev into $dest"
    [ -f "$bitcode/ockl.bc" ] || die "no amdgcn bitcode (ockl.bc) after unpacking rocm-device-libs-17 into $dest"
    rm -rf "$work/lists" "$work/cache"
fi

# 3. rocWMMA stand-in
shim="$dest/shim/rocwmma/rocwmma.hpp"
if [ ! -f "$shim" ]; then
    mkdir -p "$(dirname "$shim")"
    echo '#include <hip/hip_bfloat16.h>  // tilefuse stand-in: the HIP templates use rocWMMA only for hip_bfloat16' >"$shim"
    say "wrote the rocwmma stand-in $shim"
fi

# 4. one smoke compile: the toolchain gives a gfx942 code object
probe="$dest/.probe"
mkdir -p "$probe"
printf '#include <hip/hip_runtime.h>\nextern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n' >"$probe/k.hip"
clang-19 -x hip -std=c++17 --offload-arch=gfx942 --cuda-device-only --no-gpu-bundle-output \
    --rocm-path="$dest/usr" --rocm-device-lib-path="$bitcode" -I"$dest/shim" -O3 \
    -c "$probe/k.hip" -o "$probe/k.hsaco" 2>"$probe/err.log" \
    || die "the smoke compile failed: $(head -5 "$probe/err.log")"
say "ready: clang-19 compiles HIP to gfx942 code objects with $dest"

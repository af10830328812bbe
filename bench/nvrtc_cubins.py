"""NVRTC's cubins beside nvcc's, read from the ELF (no GPU, no cuobjdump): registers, stack frame, code and parameter
bytes of every kernel of ``tests/test_templates_cuda_compile``, a ws GEMM with a GELU epilogue and the ws attention,
each compiled for sm_90a with the options TileLang gives nvcc.

Usage:  python bench/nvrtc_cubins.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SM90 = {"kind": "cuda", "arch": "sm_90a"}
# .nv.info attributes (EIFMT_SVAL, kernel symbol then value) read here
ATTRS = {0x2F: "regs", 0x11: "frame"}


def facts(cubin: bytes) -> dict:
    """A cubin's kernel facts: ``regs`` and ``frame`` (bytes of stack: spills) from ``.nv.info``; ``code`` (bytes of
    ``.text.*``), ``param`` (bytes of ``.nv.constant0.*``: the kernel's parameters) summed over its kernels."""
    b = bytes(cubin)
    shoff, = struct.unpack_from("<Q", b, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", b, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * entsize) for i in range(count)]
    strings = sections[names][4]
    out = {"regs": 0, "frame": 0, "code": 0, "param": 0}
    for name_at, _, _, _, offset, size, *_ in sections:
        name = b[strings + name_at: b.index(b"\0", strings + name_at)].decode()
        if name.startswith(".text."):
            out["code"] += size
        elif name.startswith(".nv.constant0."):
            out["param"] += size
        elif name.startswith(".nv.info"):
            _info(b[offset: offset + size], out)
    return out


def _info(data: bytes, out: dict) -> None:
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        i += 2
        if fmt == 4:  # EIFMT_SVAL: a 2-byte size, then that many bytes
            size, = struct.unpack_from("<H", data, i)
            if attr in ATTRS and size == 8:
                out[ATTRS[attr]] = max(out[ATTRS[attr]], struct.unpack_from("<I", data, i + 6)[0])
            i += 2 + size
        elif fmt in (2, 3):  # EIFMT_BVAL, EIFMT_HVAL
            i += fmt - 1
        elif fmt != 1:  # (EIFMT_NVAL has no value; anything else: unknown, stop)
            return


def kernels() -> dict:
    from tests.test_templates_cuda_compile import kernels as template_kernels
    from tilefuse.lowering.expr import Acc, Arg, call
    from tilefuse.lowering.templates import attention, gemm

    funcs = {name: f for name, (f, _, _) in template_kernels(SM90).items()}
    funcs["gemm_ws_gelu"] = gemm.gemm(4096, 3072, 768, trans_B=True, A_dtype="float16",
                                      epilogue=call("gelu", Acc() + Arg(0)), extra_shapes=[(3072,)],
                                      extra_dtypes=["float16"], block_M=128, block_N=192, block_K=64, num_stages=4,
                                      ws=True, target=SM90)
    for causal in (False, True):  # the ws attention's default pick at BERT's and GPT-2's head dim
        config = attention.get_configs(SM90, 64, ws=True, causal=causal)[0]
        funcs[f"attention_ws{'_causal' if causal else ''}"] = attention.flash_attention(
            8, 12, 1024, 1024, 64, Hkv=12, is_causal=causal, target=SM90, **config)
    return funcs


def nvcc_requests() -> list[tuple[str, str, str, object, object]]:
    """(kernel, source, format, arch, options) of each of ``kernels()``: what TileLang's compile callback asks nvcc
    for (nvcc and TileLang's cubin cache stood in for while it asks, then put back)."""
    import tilelang.contrib.nvcc as tl_nvcc
    import tilelang.cuda.backend as tl_cuda_backend
    import tvm
    from tilelang.cache.cuda_binary_cache import CUDABinaryCache

    from tilefuse.lowering.compile import lower_source

    asked, nvcc = [], tl_nvcc.compile_cuda
    own = {m: CUDABinaryCache.__dict__[m] for m in ("load", "save") if m in CUDABinaryCache.__dict__}
    tl_nvcc.compile_cuda = lambda code, fmt, arch=None, options=None, **kw: asked.append(
        (code, fmt, arch, options)) or bytearray(b"\x7fELF")
    CUDABinaryCache.load = CUDABinaryCache.save = classmethod(lambda cls, *a, **kw: None)
    try:
        for name, func in kernels().items():
            source, _ = lower_source(func, SM90)
            tl_cuda_backend.tilelang_callback_cuda_compile(source, tvm.target.Target(SM90))
            asked[-1] = (name, *asked[-1])
    finally:
        tl_nvcc.compile_cuda = nvcc
        for m in ("load", "save"):  # (as they were: the class's own, or its base's again)
            if m in own:
                setattr(CUDABinaryCache, m, own[m])
            else:
                delattr(CUDABinaryCache, m)
    return asked


def compare() -> list[dict]:
    """Each kernel compiled by nvcc and by NVRTC with the options TileLang gives nvcc, and their cubins' facts."""
    import tilelang.contrib.nvcc as tl_nvcc

    from tilefuse.lowering import nvrtc

    return [{"kernel": name, "nvcc": facts(tl_nvcc.compile_cuda(code, fmt, arch, options)),
             "nvrtc": facts(nvrtc.compile_cubin(code, nvrtc.nvrtc_options(arch, options)))}
            for name, code, fmt, arch, options in nvcc_requests()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = compare()
    print("| kernel | regs nvcc / NVRTC | stack frame | code bytes | param bytes |")
    print("|---|---|---|---|---|")
    for r in rows:
        a, b = r["nvcc"], r["nvrtc"]
        print(f"| {r['kernel']} | " + " | ".join(f"{a[k]} / {b[k]}" for k in ("regs", "frame", "code", "param")) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Experiment (session 43): a 2-D convolution whose A tile Hopper's TMA loads in im2col mode (``T.im2col``), against
the conv2d template and cuDNN.

Why: on the H100 the conv2d template ran ResNet-50's 3x3 convolutions at 0.15-0.37x cuDNN (``bench_conv.py``, part
56). Its threads gather A's tile from the NHWC input (16-byte loads into registers, then shared memory), which
blocks the warps every K step; the measured choice therefore runs those convolutions through cuDNN and our epilogue
after (the split). A fused convolution wins where it reaches about 0.75x cuDNN: it saves writing the convolution's
output and reading it back (ResNet-50's 56x56x64 layer: 51 MB, ~15 us of a 47 us cuDNN convolution).

The kernel: NHWC input, the weight as ``(O, KH * KW * C)`` (OHWI flattened: k runs over (kh, kw, c) as im2col's
does), TMA for both operands in ``T.Pipelined`` stages, WGMMA, then the folded batch norm and ReLU on the
accumulator and a plain store. It needs C a multiple of ``block_K`` (one tap a K tile), a square kernel, stride,
dilation and padding, M and O multiples of the tile (ResNet-50's 3x3s all are). Not the stem (3 channels: TMA's
inner box must be 16 bytes). The model's weight is OIHW: the template would take the permuted copy that
``bench_conv.py --tma`` makes once, whose per-call cost it times apart (``permute_ms``).

Compiled for sm_90a here (the 2-core machine): it lowers to ``tl::tma_load_im2col`` with mbarrier-pipelined stages.
"""

from __future__ import annotations

import tilelang.language as T

from tilefuse.lowering.templates.common import param
from tilefuse.lowering.templates.conv import output_hw

TARGET = {"kind": "cuda", "arch": "sm_90a"}
# (block_M, block_N, block_K, stages, threads): one warp group (128) or two (256) consumers of a plain pipeline
CONFIGS = [(128, 64, 64, 3, 128), (128, 128, 64, 3, 128), (128, 128, 64, 4, 256), (128, 256, 64, 3, 256),
           (64, 128, 64, 4, 128), (128, 64, 64, 4, 128)]


def applies(x_shape, w_shape, stride: int, padding: int, block_M: int, block_N: int, block_K: int) -> bool:
    """Whether the prototype takes this convolution at this tile (see the module's note)."""
    N, H, W, C = x_shape
    O, _, KH, KW = w_shape
    OH, OW = output_hw(H, W, KH, KW, (stride, stride), (padding, padding), (1, 1))
    return KH == KW and C % block_K == 0 and (N * OH * OW) % block_M == 0 and O % block_N == 0 and C * 2 >= 16


def conv_tma(x_shape, w_shape, stride: int, padding: int, *, block_M: int = 128, block_N: int = 64,
             block_K: int = 64, stages: int = 3, threads: int = 128, dtype: str = "float16"):
    """``out (N*OH*OW, O) = relu(conv(x, w) * scale + shift)``; parameters ``x (N, H, W, C)``, ``w (O, KH*KW*C)``,
    ``scale (O,)``, ``shift (O,)``, ``out``."""
    if not applies(x_shape, w_shape, stride, padding, block_M, block_N, block_K):
        raise ValueError(f"conv_tma: {x_shape} by {w_shape} at {block_M}x{block_N}x{block_K} is not taken")
    N, H, W, C = x_shape
    O, _, KH, _ = w_shape
    OH, OW = output_hw(H, W, KH, KH, (stride, stride), (padding, padding), (1, 1))
    M, K = N * OH * OW, KH * KH * C

    @T.prim_func
    def conv_tma_kernel():
        x = param("x", (N, H, W, C), dtype)
        w = param("w", (O, K), dtype)
        scale = param("scale", (O,), dtype)
        shift = param("shift", (O,), dtype)
        out = param("out", (M, O), dtype)
        with T.Kernel(T.ceildiv(O, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_N, block_K), dtype)
            C_f = T.alloc_fragment((block_M, block_N), "float")
            T.clear(C_f)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages):
                T.im2col(x, A_s, by, ko, KH, stride, 1, padding)
                T.copy(w[bx * block_N, ko * block_K], B_s)
                T.gemm(A_s, B_s, C_f, transpose_B=True)
            for i, j in T.Parallel(block_M, block_N):
                C_f[i, j] = T.max(C_f[i, j] * T.Cast("float", scale[bx * block_N + j])
                                  + T.Cast("float", shift[bx * block_N + j]), T.float32(0))
            T.copy(C_f, out[by * block_M, bx * block_N])

    return conv_tma_kernel

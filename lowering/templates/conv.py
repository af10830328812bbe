"""2-D convolution as an implicit GEMM with a fused epilogue (groups=1; NCHW or NHWC).

Note: the GEMM is out[m, o] = sum_k A[m, k] * W[o, k] with m = (n, oh, ow) the output pixel and
k the filter tap: (c, kh, kw) for NCHW, (kh, kw, c) for NHWC, so that k follows the input's channel order.
A weight stored in that order too (OIHW for NCHW, OHWI for NHWC) reads as a plain (O, K) matrix; an OIHW
weight under NHWC input (a model's weight, used as is) is gathered like A. A is never materialized:
each A tile is gathered from the input (zero outside the padded image and past M or K). The
epilogue reads ``Acc`` and ``Arg(i)`` broadcast against the output's own layout (``(N, O, OH, OW)``
for NCHW, e.g. a bias of shape ``(O, 1, 1)``; ``(N, OH, OW, O)`` for NHWC, a bias ``(O,)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import tilelang.language as T
import torch

from tilefuse.lowering.expr import Env, Expr, emit, evaluate
from tilefuse.lowering.templates.common import (
    arg_loader,
    broadcast_shapes,
    check_dtype,
    dialect,
    normalize_shapes,
    param,
    target_kind,
    view,
)


def output_hw(H: int, W: int, KH: int, KW: int, stride, padding, dilation, transposed: bool = False,
              output_padding=(0, 0)) -> tuple[int, int]:
    if transposed:
        return tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, k, s, p, d, op in
                     zip((H, W), (KH, KW), stride, padding, dilation, output_padding))
    OH = (H + 2 * padding[0] - dilation[0] * (KH - 1) - 1) // stride[0] + 1
    OW = (W + 2 * padding[1] - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    return OH, OW


def conv2d(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
    transposed: bool = False,
    output_padding: Sequence[int] = (0, 0),
    layout: str = "NCHW",
    weight_layout: str | None = None,
    in_dtype: str = "float16",
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    epilogue: Expr | None = None,
    extra_shapes: Sequence[Sequence[int]] = (),
    extra_dtypes: Sequence[str] = (),
    block_M: int = 128,
    block_N: int = 128,
    block_K: int = 32,
    num_stages: int = 2,
    threads: int = 128,
    allow_tf32: bool = False,
    target: dict | str = "cuda",
):
    """A ``T.prim_func`` for ``out = epilogue(conv2d(x, w))``; parameters ``x, w, extra_0.., out``.

    NCHW: x ``(N, C, H, W)``, w ``(O, C, KH, KW)``, out ``(N, O, OH, OW)``. NHWC: x ``(N, H, W, C)``,
    w ``(O, KH, KW, C)``, out ``(N, OH, OW, O)``; ``weight_layout`` ``"OIHW"`` or ``"OHWI"`` overrides the
    weight's (default: the layout's). Symmetric ``padding`` per spatial dim. fp32 on GPUs
    uses an exact FMA loop unless ``allow_tf32`` (as ``gemm``). ``groups``: the weight holds ``C / groups`` input
    channels; each group is its own implicit GEMM of ``O / groups`` output channels, a program's column tile within one
    group (ResNeXt's and RegNet's grouped 3x3s, wav2vec2's positional convolution). ``transposed``: the transposed
    convolution (NCHW, w ``(C, O / groups, KH, KW)``): output ``(oh, ow)`` sums input ``((oh + ph - kh dh) / sh, ...)``
    where that divides and lies inside, the same implicit GEMM gathering its other elements as zeros (a U-Net's
    and a vocoder's upsampling).
    """
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"conv2d: layout {layout!r} is not NCHW or NHWC")
    nhwc = layout == "NHWC"
    weight_layout = weight_layout or ("OHWI" if nhwc else "OIHW")
    if weight_layout not in ("OIHW", "OHWI"):
        raise ValueError(f"conv2d: weight layout {weight_layout!r} is not OIHW or OHWI")
    ohwi = weight_layout == "OHWI"
    if ohwi and not nhwc:
        raise ValueError("conv2d: an OHWI weight takes NHWC input")
    plain_w = ohwi == nhwc and not transposed  # the weight's memory order is k's: read as an (O, K) matrix
    out_dtype = out_dtype or in_dtype
    extra_shapes = normalize_shapes(extra_shapes)
    for d_ in (in_dtype, out_dtype, *extra_dtypes):
        check_dtype(d_, target, "conv2d")
    Nb, H, W, C = x_shape if nhwc else (x_shape[0], x_shape[2], x_shape[3], x_shape[1])
    if transposed:
        if nhwc or groups < 1 or w_shape[0] != C or C % groups:
            raise ValueError(f"conv2d(transposed): NCHW input of {C} channels in {groups} groups by a {w_shape} weight")
        Cw, O, KH, KW = C // groups, w_shape[1] * groups, w_shape[2], w_shape[3]
    else:
        O, KH, KW, Cw = w_shape if ohwi else (w_shape[0], w_shape[2], w_shape[3], w_shape[1])
    if groups < 1 or Cw * groups != C or O % groups:
        raise ValueError(f"conv2d: weight has {Cw} input channels of {O} outputs in {groups} groups, input has {C}")
    Og = O // groups  # output channels a group
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    OH, OW = output_hw(H, W, KH, KW, stride, padding, dilation, transposed, output_padding)
    M, K = Nb * OH * OW, Cw * KH * KW
    if dialect(target).cpu:  # no tile wider than the channels or taller than the pixels (padding is computed)
        block_M = min(block_M, max(8, 1 << (M - 1).bit_length()))
    if dialect(target).cpu or groups > 1:  # nor wider than a group's channels (ResNeXt's: 8 to 64)
        block_N = min(block_N, max(16, 1 << (Og - 1).bit_length()))
    col_tiles = -(-Og // block_N)  # a group's column tiles
    out_shape = (Nb, OH, OW, O) if nhwc else (Nb, O, OH, OW)
    if broadcast_shapes(out_shape, *extra_shapes) != out_shape:
        raise ValueError(f"conv2d: extra inputs {extra_shapes} do not broadcast to the output {out_shape}")
    d = dialect(target)
    simt = in_dtype == "float32" and not allow_tf32 and not d.cpu

    def a_elem(X, m, k, c0):
        """Input element feeding A[m, k] of the group whose first input channel is ``c0``; 0 in the padding and past
        M or K."""
        n, oh, ow = m // (OH * OW), (m // OW) % OH, m % OW
        if nhwc:
            kh, kw, c = k // (KW * Cw), (k // Cw) % KW, k % Cw
        else:
            c, kh, kw = k // (KH * KW), (k // KW) % KH, k % KW
        c = c + c0
        if transposed:  # the input element whose stride-spread copy lands on this tap, where one does
            hs, ws = oh + ph - kh * dh, ow + pw - kw * dw
            h, w = hs // sh, ws // sw
            spread = T.And(T.And(hs >= 0, hs % sh == 0), T.And(ws >= 0, ws % sw == 0))
            inside = T.And(T.And(T.And(m < M, k < K), spread), T.And(h < H, w < W))
        else:
            h, w = oh * sh - ph + kh * dh, ow * sw - pw + kw * dw
            inside = T.And(T.And(T.And(m < M, k < K), T.And(h >= 0, h < H)), T.And(w >= 0, w < W))
        val = X[n, h, w, c] if nhwc else X[n, c, h, w]
        return T.if_then_else(inside, val, T.Cast(in_dtype, 0))

    def w_elem(Wt, o, j, k, c0):
        """Weight element B[o, k] of an OIHW weight under NHWC input (k = (kh, kw, c)), or of a transposed
        convolution's ``(C, O / groups, KH, KW)`` weight (k = (c, kh, kw); ``c0``: the group's first input channel); 0
        past the group's ``Og`` channels (``j``: o's place in its group) or K."""
        inside = T.And(j < Og, k < K)
        if transposed:
            c, kh, kw = k // (KH * KW), (k // KW) % KH, k % KW
            return T.if_then_else(inside, Wt[T.min(c0 + c, C - 1), T.min(j, Og - 1), kh, kw], T.Cast(in_dtype, 0))
        kh, kw, c = k // (KW * Cw), (k // Cw) % KW, k % Cw
        return T.if_then_else(inside, Wt[T.min(o, O - 1), c, kh, kw], T.Cast(in_dtype, 0))

    def out_index(m, o):
        n, oh, ow = m // (OH * OW), (m // OW) % OH, m % OW
        return [n, oh, ow, o] if nhwc else [n, o, oh, ow]

    def out_elem(C_f, extras, i, j, m, o):
        coords = out_index(T.min(m, M - 1), T.min(o, O - 1))  # (o is inside: the stores are guarded)
        env = Env(acc=C_f[i, j], arg=arg_loader(extras, extra_shapes, coords))
        value = C_f[i, j] if epilogue is None else emit(epilogue, env)
        return T.Cast(out_dtype, value)

    @T.prim_func
    def conv2d_kernel():
        X = param("x", x_shape, in_dtype)
        Wt = param("w", w_shape, in_dtype)
        extras = [param(f"extra{i}", s, dt) for i, (s, dt) in enumerate(zip(extra_shapes, extra_dtypes))]
        Out = param("out", out_shape, out_dtype)
        with d.kernel(col_tiles * groups, T.ceildiv(M, block_M), threads=threads) as (bx, by):
            w2 = [view(Wt, (O, K))]  # the weight as an (O, K) matrix, in a list (see common.view)
            # this program's group, its first output and input channels, and the column tile's first channel in it
            grp, jt = bx // col_tiles, bx % col_tiles
            o0, c0, j0 = grp * Og + jt * block_N, grp * Cw, jt * block_N
            A_s = d.shared((block_M, block_K), in_dtype)
            B_s = d.shared((block_N, block_K), in_dtype)
            C_f = d.fragment((block_M, block_N), accum_dtype)
            B_t = d.shared((block_K, block_N), in_dtype) if d.cpu else None
            T.clear(C_f)
            for ko in d.pipelined(T.ceildiv(K, block_K), num_stages):
                for i, k in d.tile_loop(block_M, block_K):
                    A_s[i, k] = a_elem(X, by * block_M + i, ko * block_K + k, c0)
                if plain_w:  # (rows past the group's are the next group's, or zeros: their columns are not stored)
                    T.copy(w2[0][o0, ko * block_K], B_s)
                else:
                    for j, k in d.tile_loop(block_N, block_K):
                        B_s[j, k] = w_elem(Wt, o0 + j, j0 + j, ko * block_K + k, c0)
                if simt:
                    for i, j in T.Parallel(block_M, block_N):
                        for k in T.serial(block_K):
                            C_f[i, j] += A_s[i, k] * B_s[j, k]
                elif d.cpu:  # k outside a vectorized j, as gemm.py does on CPU (the same sums, in k order)
                    for k, j in T.grid(block_K, block_N):
                        B_t[k, j] = B_s[j, k]
                    for i, k, j in T.grid(block_M, block_K, block_N):
                        C_f[i, j] += T.Cast(accum_dtype, A_s[i, k]) * T.Cast(accum_dtype, B_t[k, j])
                else:
                    T.gemm(A_s, B_s, C_f, transpose_B=True)
            if d.metal and not simt:
                # Metal: the T.gemm accumulator is opaque simdgroup matrices; the epilogue reads a threadgroup copy.
                C_s = T.alloc_shared((block_M, block_N), accum_dtype)
                T.sync_threads()  # C_s may reuse A_s/B_s, which other simdgroups may still be reading
                T.copy(C_f, C_s)
                T.sync_threads()  # TileLang does not sync after a simdgroup_store
                for i, j in T.Parallel(block_M, block_N):
                    if T.And(by * block_M + i < M, j0 + j < Og):
                        T.buffer_store(Out, out_elem(C_s, extras, i, j, by * block_M + i, o0 + j),
                                       out_index(by * block_M + i, o0 + j))
            else:
                for i, j in d.tile_loop(block_M, block_N):
                    if T.And(by * block_M + i < M, j0 + j < Og):
                        T.buffer_store(Out, out_elem(C_f, extras, i, j, by * block_M + i, o0 + j),
                                       out_index(by * block_M + i, o0 + j))

    return conv2d_kernel


def reference(x: torch.Tensor, w: torch.Tensor, extras: Sequence[torch.Tensor] = (), *, stride=(1, 1),
              padding=(0, 0), dilation=(1, 1), groups: int = 1, transposed: bool = False, output_padding=(0, 0),
              layout: str = "NCHW", weight_layout: str | None = None,
              epilogue: Expr | None = None, out_dtype: str | None = None) -> torch.Tensor:
    """Torch reference of ``conv2d`` (float64 convolution, fp32 epilogue)."""
    out_dtype = getattr(torch, out_dtype) if out_dtype else x.dtype
    if layout == "NHWC":
        x = x.permute(0, 3, 1, 2)
    if (weight_layout or ("OHWI" if layout == "NHWC" else "OIHW")) == "OHWI":
        w = w.permute(0, 3, 1, 2)
    if transposed:
        acc = torch.nn.functional.conv_transpose2d(x.double(), w.double(), None, tuple(stride), tuple(padding),
                                                   tuple(output_padding), groups, tuple(dilation))
    else:
        acc = torch.nn.functional.conv2d(x.double(), w.double(), None, tuple(stride), tuple(padding),
                                         tuple(dilation), groups)
    acc = acc.float()
    if layout == "NHWC":
        acc = acc.permute(0, 2, 3, 1)
    if epilogue is not None:
        acc = evaluate(epilogue, acc, list(extras)).float()
    return acc.to(out_dtype).contiguous()


def get_configs(target: dict | str, dtype: str = "float16") -> list[dict]:
    """Seed configs for inputs of ``dtype``; keys are ``conv2d``'s tunables."""
    if dialect(target).cpu:
        # the product runs k outside a vectorized j (see conv2d); 128x64 measured best at ResNet's 3x3 convs on a
        # 2-core AVX-512 machine (0.15 ms against 0.27 for 32x32), narrowed to the channels by the template
        return [{"block_M": 128, "block_N": 64, "block_K": 32, "num_stages": 0, "threads": 1},
                {"block_M": 64, "block_N": 32, "block_K": 32, "num_stages": 0, "threads": 1}]
    seeds = [(128, 128, 32, 2, 128), (64, 128, 32, 3, 128), (128, 64, 64, 2, 128), (128, 256, 32, 3, 256)]
    if target_kind(target) == "cuda":
        # The first seed is the default. At each of ResNet-50's convolutions on the H100 (NHWC, OIHW weight, BN and
        # ReLU epilogue; bench/bench_conv.py, bench/results/2026-12-06-h100-session43), 128 x 64 x 32 in 3 stages
        # was the one config of 11 faster than the former default, 128 x 128 x 32 in 2, by 5-17%. It still runs
        # 0.65x cuDNN at the 7x7 stem and 0.15-0.37x at the 3x3s (the threads gather A's tile; no TMA im2col), so
        # the measured choice runs most of those through cuDNN.
        seeds = [(128, 64, 32, 3, 128)] + seeds
    if dialect(target).metal:  # within Apple GPUs' 32 KB of threadgroup memory, the staged accumulator included
        seeds = [(64, 64, 32, 2, 128), (32, 64, 32, 2, 128)]
    elif dtype == "float32":  # the exact FMA loop (see allow_tf32): modest tiles, its inner loop is unrolled
        seeds = [(64, 64, 32, 2, 128), (128, 64, 32, 2, 128)]
    return [{"block_M": m, "block_N": n, "block_K": k, "num_stages": st, "threads": t} for m, n, k, st, t in seeds]


def library_first(params: dict, target: dict | str) -> str | None:
    """Profitability, not legality: why, on ``target``, this convolution's fused kernel is not worth building where
    the measured choice can run it through the library instead (cuDNN, its epilogue split off as our kernel), or
    None. ResNet-50's 3x3 convolutions (NHWC, 64-512 channels, the model's OIHW weight, BN and ReLU after) ran
    0.15-0.37x cuDNN in the best of 11 configs on the H100 (``bench/bench_conv.py``, sessions 43-44; a TMA-im2col
    prototype's best configs 0.64-0.85x): writing and reading back the output, what the split adds, costs far
    less, so the measured choice split every one of them, after compiling each fused kernel (7 s of compile-thread
    time apiece, the longest ResNet-50 builds). Few-channel inputs (the 7x7 stem: 0.65x, and fused it wins) are left
    to the measurement."""
    if target_kind(target) != "cuda" or params.get("transposed") or params.get("groups", 1) != 1:
        return None
    _, c, kh, kw = params["w_shape"]
    if params.get("layout") == "NHWC" and kh * kw > 1 and c >= 64 and params.get("in_dtype") in ("float16", "bfloat16"):
        return f"conv2d runs a {kh}x{kw} convolution of {c} channels at 0.15-0.37x cuDNN (sm_90, bench_conv.py)"
    return None

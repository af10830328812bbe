"""Neural-network ops: GEMM, convolution, reductions, normalizations, pooling, attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType, torch_dtype
from tilefuse.ops.derived import Derived
from tilefuse.ops.registry import OpKind, register
from tilefuse.ops.sparse_layout import decompress_2_4

FLOAT32_MAX = torch.finfo(torch.float32).max

G, C, R, A, O = OpKind.GEMM, OpKind.CONV, OpKind.REDUCTION, OpKind.ATTENTION, OpKind.OPAQUE


# ---- GEMM and convolution ------------------------------------------------------------------

@register("matmul", G)
def matmul(a, b):
    """numpy-style matmul: batched, broadcast batch dims, 1-D operands promoted."""
    return torch.matmul(a, b)


@register("linear", G)
def linear(x, weight, bias=None):
    """x @ weight.T + bias, weight (N, K)."""
    return F.linear(x, weight, bias)


def _sparse_linear_type(in_types, attrs):
    x, values = in_types[0], in_types[1]
    shape = None if x.shape is None or values.shape is None else (*x.shape[:-1], values.shape[0])
    return [TensorType(shape, x.dtype)]


@register("sparse_linear", G, infer=_sparse_linear_type)
def sparse_linear(x, values, meta, bias=None, dense=None, in_features: int = 0, meta_k_major: bool = False):
    """``linear`` with a 2:4 sparse weight (N, in_features) given compressed: ``values`` (N, Kp/2) and ``meta``
    (N, Kp/16) int16, or (Kp/16, N) with ``meta_k_major`` (``ops.sparse_layout.compress_2_4``), and optionally the
    same weight stored ``dense`` (N, in_features). The planner makes it (``Options.sparsity``); CUDA runs it as
    the ``gemm_sp`` template, or as a dense GEMM on ``dense`` where that measured faster; this reference uses
    ``dense`` when given, else decompresses the weight."""
    w = dense if dense is not None else decompress_2_4(values, meta, in_features, k_major=meta_k_major)
    return F.linear(x, w.to(x.dtype), bias)


def _channels_first(fn, x, *args, channels_last: bool = False, **kw):
    """``fn`` (a channels-first op) on ``x``; with ``channels_last`` x is (N, *spatial, C) and so is the result:
    torch runs it as a channels-last strided tensor (no copy; cuDNN's NHWC kernels) and hands back the view."""
    if not channels_last:
        return fn(x, *args, **kw)
    return fn(x.movedim(-1, 1), *args, **kw).movedim(1, -1)


class WeightChannelsLast:
    """``conv``'s reference for one channels-last node on a GPU: cuDNN's NHWC kernels want the weight channels last
    too and, handed the model's (O, C, KH, KW) weight, rearrange it on every call (a copy kernel before each of
    ResNet-50's 3x3 convolutions, 2.5-9.6 us apiece on the H100, 0.07 ms a call). Here it is rearranged once and
    reused while the weight is unchanged (``ops.derived``: what is seen as a change, what is not)."""

    def __init__(self, ref):
        self.ref, self.weight = ref, Derived(lambda w: w.contiguous(memory_format=torch.channels_last))

    @staticmethod
    def wants(weight: torch.Tensor) -> bool:
        """Is ``weight`` one to rearrange: a 2-D convolution's, larger than 1x1 (1x1 is channels last already), on a
        GPU, not an inference tensor (no version to keep it by: cuDNN rearranges it, as it would)."""
        return weight.dim() == 4 and weight.shape[2] * weight.shape[3] > 1 and weight.is_cuda and \
            not weight.is_inference()

    def __call__(self, x, weight, *args, **kw):
        return self.ref(x, self.weight(weight) if self.wants(weight) else weight, *args, **kw)


def _conv_per_node(ref, attrs: dict):
    return WeightChannelsLast(ref) if attrs.get("channels_last") else ref


@register("conv", C, per_node=_conv_per_node)
def conv(x, weight, bias=None, stride: tuple = (1, 1), padding: tuple = (0, 0), dilation: tuple = (1, 1),
         groups: int = 1, channels_last: bool = False):
    """N-d convolution (1-d, 2-d or 3-d by the weight's rank), symmetric padding. Channels first, or with
    ``channels_last`` x and the result (N, *spatial, C); the weight is (O, C/groups, *kernel) either way."""
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[weight.dim()]
    return _channels_first(fn, x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups,
                           channels_last=channels_last)


@register("conv_transpose", C)
def conv_transpose(x, weight, bias=None, stride: tuple = (1, 1), padding: tuple = (0, 0),
                   output_padding: tuple = (0, 0), dilation: tuple = (1, 1), groups: int = 1):
    fn = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[weight.dim()]
    return fn(x, weight, bias, tuple(stride), tuple(padding), tuple(output_padding), groups, tuple(dilation))


# ---- reductions -----------------------------------------------------------------------------

def _dims(x, dims):
    return tuple(range(x.dim())) if dims is None else tuple(dims)


@register("sum", R)
def sum_(x, dims: tuple | None = None, keepdim: bool = False, dtype: str | None = None):
    return torch.sum(x, _dims(x, dims), keepdim, dtype=torch_dtype(dtype) if dtype else None)


@register("mean", R)
def mean(x, dims: tuple | None = None, keepdim: bool = False):
    return torch.mean(x, _dims(x, dims), keepdim)


@register("prod", R)
def prod(x, dims: tuple | None = None, keepdim: bool = False):
    for d in sorted((d % max(x.dim(), 1) for d in _dims(x, dims)), reverse=True):
        x = torch.prod(x, d, keepdim)
    return x


@register("amax", R)
def amax(x, dims: tuple | None = None, keepdim: bool = False):
    return torch.amax(x, _dims(x, dims), keepdim)


@register("amin", R)
def amin(x, dims: tuple | None = None, keepdim: bool = False):
    return torch.amin(x, _dims(x, dims), keepdim)


@register("any", R)
def any_(x, dims: tuple | None = None, keepdim: bool = False):
    """Whether any element along ``dims`` (every dim when None) is nonzero; NaN counts as nonzero, an empty
    reduction is False. Bool out (uint8 for a uint8 input, as torch)."""
    return torch.any(x, _dims(x, dims), keepdim)


@register("all", R)
def all_(x, dims: tuple | None = None, keepdim: bool = False):
    """Whether every element along ``dims`` (every dim when None) is nonzero; NaN counts as nonzero, an empty
    reduction is True. Bool out (uint8 for a uint8 input, as torch)."""
    return torch.all(x, _dims(x, dims), keepdim)


@register("var", R)
def var(x, dims: tuple | None = None, correction: float = 1, keepdim: bool = False):
    return torch.var(x, _dims(x, dims), correction=correction, keepdim=keepdim)


@register("argmax", R)
def argmax(x, dim: int, keepdim: bool = False, select_last_index: bool = False):
    if select_last_index:
        return x.shape[dim] - 1 - torch.argmax(x.flip(dim), dim, keepdim)
    return torch.argmax(x, dim, keepdim)


@register("argmin", R)
def argmin(x, dim: int, keepdim: bool = False, select_last_index: bool = False):
    if select_last_index:
        return x.shape[dim] - 1 - torch.argmin(x.flip(dim), dim, keepdim)
    return torch.argmin(x, dim, keepdim)


@register("logsumexp", R)
def logsumexp(x, dims: tuple | None = None, keepdim: bool = False):
    return torch.logsumexp(x, _dims(x, dims), keepdim)


@register("softmax", R)
def softmax(x, dim: int = -1):
    return torch.softmax(x, dim)


@register("log_softmax", R)
def log_softmax(x, dim: int = -1):
    return torch.log_softmax(x, dim)


# ---- normalizations --------------------------------------------------------------------------

@register("layer_norm", R, traits=("norm",))
def layer_norm(x, weight=None, bias=None, axis: int = -1, eps: float = 1e-5):
    """Normalize over dims ``axis..end`` (ONNX LayerNormalization, ATen layer_norm). On the CPU, rows whose moments
    leave float32's range follow the kernels' rule (``lowering/templates/reduction.py``): NaN where the sum of
    squared deviations overflows, float64's answer where only torch's lanes would square a mean past 1.8e19 (torch
    gives NaN or 0 there by its lane order), so a region run through torch says what its kernel says. Ordinary
    inputs cost one ``aminmax`` more; on GPUs the reference stays torch's (a data-dependent branch would stop CUDA
    graph capture)."""
    _normalized_dims("layer_norm", x)
    axis = axis % x.dim()
    y = F.layer_norm(x, x.shape[axis:], weight, bias, eps)
    if x.is_meta or x.device.type != "cpu" or x.numel() == 0 or not x.dtype.is_floating_point:
        return y
    small = min(2.0**62, (FLOAT32_MAX / max(x.shape[axis:].numel(), 1)) ** 0.5 / 2)
    lo, hi = (t.item() for t in torch.aminmax(x))  # one pass, no temporaries (abs, compare, any: three)
    if -small < lo and hi < small:  # (a NaN fails both: then element by element, so it cannot hide a large row)
        return y
    if hi != hi and not bool((x.abs() >= small).any()):
        return y
    dims = tuple(range(axis, x.dim()))
    x64 = x.double()
    m2 = ((x64 - x64.mean(dims, keepdim=True)) ** 2).sum(dims, keepdim=True)
    exact = F.layer_norm(x64, x.shape[axis:], *(t if t is None else t.double() for t in (weight, bias)), eps)
    y = torch.where(x64.abs().amax(dims, keepdim=True) >= 2.0**62, exact.to(y.dtype), y)
    return torch.where(m2 < FLOAT32_MAX, y, torch.tensor(float("nan"), dtype=y.dtype))


def _normalized_dims(op: str, x) -> None:
    """torch's refusal of a 0-d input to a norm (its normalized shape would be empty), as a clear error."""
    if x.dim() == 0:
        raise ValueError(f"{op}: the input is 0-d; a norm needs at least one dimension to normalize over (torch: "
                         "'Expected normalized_shape to be at least 1-dimensional')")


@register("rms_norm", R, traits=("norm",))
def rms_norm(x, weight=None, axis: int = -1, eps: float = 1e-6):
    """x / sqrt(mean(x^2) + eps) * weight over dims ``axis..end``, computed in fp32."""
    _normalized_dims("rms_norm", x)
    axis = axis % x.dim()
    dims = tuple(range(axis, x.dim()))
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
    y = y.to(x.dtype)
    return y * weight if weight is not None else y


@register("batch_norm", OpKind.BROADCAST, traits=("epilogue", "axis"))
def batch_norm(x, weight, bias, running_mean, running_var, eps: float = 1e-5, channels_last: bool = False):
    """Inference batch norm with running statistics (channels on dim 1, or the last with ``channels_last``):
    a per-channel affine map, so it fuses like a broadcast op (a convolution's epilogue)."""
    return _channels_first(F.batch_norm, x, running_mean, running_var, weight, bias, False, 0.0, eps,
                           channels_last=channels_last)


@register("group_norm", R)
def group_norm(x, weight=None, bias=None, groups: int = 1, eps: float = 1e-5):
    return F.group_norm(x, groups, weight, bias, eps)


@register("instance_norm", R)
def instance_norm(x, weight=None, bias=None, eps: float = 1e-5):
    return F.instance_norm(x, weight=weight, bias=bias, eps=eps)


def norm_groups(op: str, attr: dict, channels: int) -> int:
    """How many groups a ``group_norm`` or ``instance_norm`` of ``channels`` channels normalizes (an instance norm: one
    a channel); the caller checks that they divide the channels."""
    return channels if op == "instance_norm" else int(attr.get("groups", 1))


# ---- pooling -------------------------------------------------------------------------------

# Pooling is channels first, or (N, *spatial, C) in and out with ``channels_last``.

@register("max_pool", R, traits=("pool",))
def max_pool(x, kernel: tuple, stride: tuple, padding: tuple = (0, 0), dilation: tuple = (1, 1),
             ceil_mode: bool = False, channels_last: bool = False):
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[len(kernel)]
    return _channels_first(fn, x, tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), ceil_mode,
                           channels_last=channels_last)


@register("avg_pool", R, traits=("pool",))
def avg_pool(x, kernel: tuple, stride: tuple, padding: tuple = (0, 0), ceil_mode: bool = False,
             count_include_pad: bool = True, channels_last: bool = False):
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[len(kernel)]
    return _channels_first(fn, x, tuple(kernel), tuple(stride), tuple(padding), ceil_mode, count_include_pad,
                           channels_last=channels_last)


@register("adaptive_avg_pool", R, traits=("pool",))
def adaptive_avg_pool(x, output_size: tuple, channels_last: bool = False):
    fn = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[len(output_size)]
    return _channels_first(fn, x, tuple(output_size), channels_last=channels_last)


# ---- attention -------------------------------------------------------------------------------

@register("sdpa", A)
def sdpa(q, k, v, mask=None, is_causal: bool = False, scale: float | None = None, window: int | None = None,
         softcap: float | None = None):
    """Scaled dot-product attention on (..., heads, seq, dim); an additive or boolean mask
    broadcast to (..., heads, q_seq, k_seq); fewer KV heads than query heads is grouped-query
    attention. A causal mask is aligned to the top left, as torch does; ``window`` (with ``is_causal``)
    lets query ``i`` see keys ``i - window < j <= i`` only (Mistral's sliding window). ``is_causal``
    and ``mask`` may both be given: both apply. ``softcap`` (> 0) caps the scaled scores at +-softcap before
    the mask: ``softcap * tanh(s / softcap)`` (Gemma 2's logit softcapping; computed in float32 here)."""
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if window is not None and not is_causal:
        raise ValueError("sdpa: a sliding window needs is_causal")
    if is_causal and (mask is not None or window is not None):
        i = torch.arange(q.shape[-2], device=q.device).view(-1, 1)
        j = torch.arange(k.shape[-2], device=q.device).view(1, -1)
        visible = (j <= i) & ((j > i - window) if window is not None else True)
        if mask is None:
            mask = visible
        elif mask.dtype == torch.bool:
            mask = mask & visible
        else:
            mask = mask.masked_fill(~visible, float("-inf"))
        is_causal = False
    if softcap is not None:
        return _capped_attention(q, k, v, mask, is_causal, scale, float(softcap))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def _capped_attention(q, k, v, mask, is_causal: bool, scale: float | None, cap: float):
    """``sdpa`` with the scores capped (``cap * tanh(s / cap)``), in float32, rounded to q's dtype at the end (k, v
    already repeated for grouped-query attention, a causal flag beside a mask or window already folded into it)."""
    if not cap > 0:
        raise ValueError(f"sdpa: softcap must be positive, got {cap}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    s = torch.tanh(s / cap) * cap
    if is_causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    hidden = (s == float("-inf")).all(dim=-1, keepdim=True)  # a row that sees no key: 0, as torch's sdpa gives
    p = torch.softmax(s.masked_fill(hidden, 0.0), dim=-1).masked_fill(hidden, 0.0)
    return torch.matmul(p, v.float()).to(q.dtype)


@register("rotary_embedding", OpKind.BROADCAST, traits=("axis",))
def rotary_embedding(x, cos, sin, interleaved: bool = False):
    """x * cos + rotate_half(x) * sin (rotate_half pairs the two halves of the last dim, or
    adjacent elements when ``interleaved``); cos/sin broadcast against x."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


@register("dropout", OpKind.ELEMENTWISE, traits=("view", "may_alias", "epilogue"))
def dropout(x):
    """Inference dropout: the identity."""
    return x

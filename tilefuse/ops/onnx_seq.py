"""ONNX-only ops, last part: signal processing, detection and recurrent networks.

See ``tilefuse.ops.onnx_extra`` for the conventions (``"?"`` dims, widened integer dtypes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType, torch_dtype
from tilefuse.ops.onnx_extra import _WIDE, _dynamic, _extreme, _wide, cast_float8  # noqa: F401
from tilefuse.ops.registry import OpKind, register

E, B, I, R, O = OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE, OpKind.REDUCTION, OpKind.OPAQUE



# ---- signal processing --------------------------------------------------------------------------

@register("window", O, infer=_dynamic(rank=1))
def window(size, kind: str = "hann", periodic: int = 1, dtype: str = "float32"):
    """Hann / Hamming / Blackman window of runtime ``size``."""
    n = int(size.reshape(-1)[0].item())
    denom = n if periodic else n - 1
    k = torch.arange(n, dtype=torch.float64) * (2 * math.pi / max(denom, 1))
    if kind == "blackman":
        w = 0.42 - 0.5 * torch.cos(k) + 0.08 * torch.cos(2 * k)
    else:
        a0 = 0.5 if kind == "hann" else 25 / 46
        w = a0 - (1 - a0) * torch.cos(k)
    return w.to(device=size.device, dtype=torch_dtype(dtype))


def _as_complex(x):
    """[..., 2] (or [..., 1] real) -> complex, in the input's precision (complex64 below float64)."""
    x = x if x.dtype == torch.float64 else x.float()
    return torch.complex(x[..., 0], x[..., 1]) if x.shape[-1] == 2 else x[..., 0].to(
        torch.complex128 if x.dtype == torch.float64 else torch.complex64)


@register("dft", O, infer=_dynamic(rank_of=0))
def dft(x, length=None, axis_tensor=None, axis: int = 1, inverse: int = 0, onesided: int = 0):
    """ONNX DFT on [..., 1] (real) or [..., 2] (complex) signals; the result is [..., 2] (or [..., 1]
    for an inverse one-sided transform)."""
    if axis_tensor is not None:
        axis = int(axis_tensor.reshape(-1)[0].item())
    axis %= x.dim()
    n = int(length.reshape(-1)[0].item()) if length is not None and length.numel() else None
    sig = _as_complex(x)
    if inverse:
        if onesided:
            return torch.fft.irfft(sig, n=n or 2 * (sig.shape[axis] - 1), dim=axis).unsqueeze(-1).to(x.dtype)
        y = torch.fft.ifft(sig, n=n, dim=axis)
    else:
        y = torch.fft.fft(sig, n=n, dim=axis)
        if onesided:
            y = y.narrow(axis, 0, y.shape[axis] // 2 + 1)
    return torch.stack([y.real, y.imag], -1).to(x.dtype)


@register("stft", O, infer=_dynamic(rank=4))
def stft(signal, frame_step, window=None, frame_length=None, onesided: int = 1):
    """ONNX STFT: [batch, frames, bins, 2] from [batch, length, 1 or 2]."""
    step = int(frame_step.reshape(-1)[0].item())
    size = int(frame_length.reshape(-1)[0].item()) if frame_length is not None else window.shape[0]
    sig = _as_complex(signal)
    frames = sig.unfold(1, size, step)
    if window is not None:
        frames = frames * window.to(frames.real.dtype)
    y = torch.fft.fft(frames, dim=-1)
    if onesided:
        y = y[..., : size // 2 + 1]
    return torch.stack([y.real, y.imag], -1).to(signal.dtype)


@register("mel_weight_matrix", O, infer=_dynamic(rank=2))
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                      dtype: str = "float32"):
    """ONNX MelWeightMatrix: triangular filters on the mel scale, [dft_length // 2 + 1, num_mel_bins]."""
    bins, n, rate = int(num_mel_bins.item()), int(dft_length.item()), int(sample_rate.item())
    lo, hi = float(lower_edge_hertz.item()), float(upper_edge_hertz.item())
    spectrogram = n // 2 + 1
    mel = lambda f: 2595 * math.log10(1 + f / 700)
    step = (mel(hi) - mel(lo)) / (bins + 2)
    points = [int((n + 1) * (700 * math.expm1((mel(lo) + i * step) / 2595 * math.log(10))) // rate)
              for i in range(bins + 2)]
    out = torch.zeros(spectrogram, bins, dtype=torch.float64)
    for i in range(bins):
        low, center, high = points[i], points[i + 1], points[i + 2]
        if center == low:
            out[center, i] = 1
        for j in range(low, center + 1 if center > low else low):
            out[j, i] = (j - low) / (center - low)
        if high > center:
            for j in range(center, high):
                out[j, i] = (high - j) / (high - center)
    return out.to(device=num_mel_bins.device, dtype=torch_dtype(dtype))


# ---- detection ------------------------------------------------------------------------------------

@register("non_max_suppression", O, infer=_dynamic(rank=2, dtype="int64"))
def non_max_suppression(boxes, scores, max_output=None, iou_threshold=None, score_threshold=None,
                        center_point_box: int = 0):
    """ONNX NonMaxSuppression: greedy per batch and class; rows (batch, class, box) as int64."""
    limit = int(max_output.reshape(-1)[0].item()) if max_output is not None and max_output.numel() else 0
    iou_t = float(iou_threshold.reshape(-1)[0].item()) if iou_threshold is not None and iou_threshold.numel() else 0.0
    score_t = float(score_threshold.reshape(-1)[0].item()) if score_threshold is not None and \
        score_threshold.numel() else None
    b = boxes.double()
    if center_point_box:
        xc, yc, w, h = b.unbind(-1)
        y1, x1, y2, x2 = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    else:
        y1, x1, y2, x2 = b.unbind(-1)
        y1, y2 = torch.minimum(y1, y2), torch.maximum(y1, y2)
        x1, x2 = torch.minimum(x1, x2), torch.maximum(x1, x2)
    area = (y2 - y1) * (x2 - x1)
    rows = []
    for bi in range(scores.shape[0]):
        for ci in range(scores.shape[1]):
            s = scores[bi, ci].double()
            order = [int(i) for i in torch.sort(s, descending=True, stable=True).indices.tolist()
                     if score_t is None or s[i] > score_t]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                ok = True
                for j in kept:
                    ih = (torch.minimum(y2[bi, i], y2[bi, j]) - torch.maximum(y1[bi, i], y1[bi, j])).clamp(min=0)
                    iw = (torch.minimum(x2[bi, i], x2[bi, j]) - torch.maximum(x1[bi, i], x1[bi, j])).clamp(min=0)
                    inter = ih * iw
                    union = area[bi, i] + area[bi, j] - inter
                    if union > 0 and inter / union > iou_t:
                        ok = False
                        break
                if ok:
                    kept.append(i)
            rows += [[bi, ci, i] for i in kept]
    return torch.tensor(rows, dtype=torch.int64, device=boxes.device).reshape(-1, 3)


def _unique_infer(in_types, attrs):
    x = in_types[0]
    axis = attrs.get("axis")
    y_rank = 1 if axis is None else x.rank
    return [TensorType(("?",) * y_rank, x.dtype)] + [TensorType(("?",), "int64")] * 3


@register("unique", O, infer=_unique_infer, num_outputs=4)
def unique(x, axis: int | None = None, sorted: int = 1):
    """ONNX Unique: (values, first-occurrence indices, inverse indices, counts), sorted or in
    order of first occurrence."""
    flat = x.reshape(-1) if axis is None else x.movedim(axis, 0).reshape(x.shape[axis], -1)
    values, inverse, counts = torch.unique(flat, sorted=True, return_inverse=True, return_counts=True, dim=0)
    n = flat.shape[0]
    dev = x.device
    first = torch.full((values.shape[0],), n, dtype=torch.int64, device=dev).scatter_reduce(
        0, inverse, torch.arange(n, device=dev), "amin")
    order = torch.arange(values.shape[0], device=dev) if sorted else torch.argsort(first)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=dev))
    values = values[order]
    if axis is not None:
        axis %= x.dim()
        values = values.reshape(-1, *[s for i, s in enumerate(x.shape) if i != axis]).movedim(0, axis)
    return values, first[order], rank[inverse], counts[order]


# ---- recurrent networks -------------------------------------------------------------------------

def _activation(name: str, alpha: float | None, beta: float | None):
    name = name.lower()
    table = {
        "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softsign": F.softsign,
        "softplus": lambda x: torch.log1p(torch.exp(x)),
        "affine": lambda x: (1.0 if alpha is None else alpha) * x + (0.0 if beta is None else beta),
        "leakyrelu": lambda x: F.leaky_relu(x, 0.01 if alpha is None else alpha),
        "thresholdedrelu": lambda x: torch.where(x > (1.0 if alpha is None else alpha), x, torch.zeros_like(x)),
        "scaledtanh": lambda x: (1.0 if alpha is None else alpha) * torch.tanh((1.0 if beta is None else beta) * x),
        "hardsigmoid": lambda x: ((0.2 if alpha is None else alpha) * x + (0.5 if beta is None else beta)).clamp(0, 1),
        "elu": lambda x: F.elu(x, 1.0 if alpha is None else alpha),
    }
    return table[name]


def _rnn_infer(in_types, attrs):
    x = in_types[0]
    layout, dirs, hidden = attrs.get("layout", 0), attrs["num_directions"], attrs["hidden_size"]
    seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    y = (seq, dirs, batch, hidden) if layout == 0 else (batch, seq, dirs, hidden)
    h = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    return [TensorType(y, x.dtype), TensorType(h, x.dtype)] + ([TensorType(h, x.dtype)] if attrs["kind"] == "lstm"
                                                                else [])


@register("rnn", O, infer=_rnn_infer, num_outputs=-1)
def rnn(x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None, kind: str = "rnn", hidden_size: int = 1,
        num_directions: int = 1, direction: str = "forward", activations: tuple = (), alphas: tuple = (),
        betas: tuple = (), clip: float | None = None, layout: int = 0, linear_before_reset: int = 0,
        input_forget: int = 0):
    """ONNX RNN / GRU / LSTM (``kind``): outputs Y, Y_h (and Y_c for LSTM)."""
    if layout:
        x = x.transpose(0, 1)
        h0 = None if h0 is None else h0.transpose(0, 1)
        c0 = None if c0 is None else c0.transpose(0, 1)
    seq, batch, hs = x.shape[0], x.shape[1], hidden_size
    gates = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    per_dir = {"rnn": 1, "gru": 2, "lstm": 3}[kind]
    lens = torch.full((batch,), seq, dtype=torch.long) if seq_lens is None else seq_lens.long().cpu()
    ys, hs_out, cs_out = [], [], []
    for d in range(num_directions):
        acts = [_activation(a, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None)
                for k, a in enumerate(activations[d * per_dir:(d + 1) * per_dir])]
        wd, rd = w[d], r[d]
        bias = b[d] if b is not None else x.new_zeros(2 * gates * hs)
        wb, rb = bias[:gates * hs], bias[gates * hs:]
        h = h0[d] if h0 is not None else x.new_zeros(batch, hs)
        c = c0[d] if c0 is not None else x.new_zeros(batch, hs)
        peep = p[d] if p is not None else x.new_zeros(3 * hs)
        reverse = direction == "reverse" or d == 1
        y = x.new_zeros(seq, batch, hs)
        for t in range(seq):
            live = (t < lens).to(x.device)[:, None]
            steps = torch.where(lens > t, lens - 1 - t, torch.zeros_like(lens)) if reverse else torch.full_like(lens, t)
            xt = x[steps.to(x.device), torch.arange(batch, device=x.device)]
            clipf = (lambda v: v.clamp(-clip, clip)) if clip else (lambda v: v)
            gx = xt @ wd.T + wb
            if kind == "rnn":
                h_new = acts[0](clipf(gx + h @ rd.T + rb))
            elif kind == "gru":
                gh = h @ rd.T
                z = acts[0](clipf(gx[:, :hs] + gh[:, :hs] + rb[:hs]))
                rr = acts[0](clipf(gx[:, hs:2 * hs] + gh[:, hs:2 * hs] + rb[hs:2 * hs]))
                if linear_before_reset:
                    hh = acts[1](clipf(gx[:, 2 * hs:] + rr * (gh[:, 2 * hs:] + rb[2 * hs:])))
                else:
                    hh = acts[1](clipf(gx[:, 2 * hs:] + (rr * h) @ rd[2 * hs:].T + rb[2 * hs:]))
                h_new = (1 - z) * hh + z * h
            else:
                g = gx + h @ rd.T + rb
                i = acts[0](clipf(g[:, :hs] + peep[:hs] * c))
                f = 1 - i if input_forget else acts[0](clipf(g[:, 2 * hs:3 * hs] + peep[2 * hs:] * c))
                cc = acts[1](clipf(g[:, 3 * hs:]))
                c_new = f * c + i * cc
                o = acts[0](clipf(g[:, hs:2 * hs] + peep[hs:2 * hs] * c_new))
                h_new = o * acts[2](c_new)
                c = torch.where(live, c_new, c)
            h = torch.where(live, h_new, h)
            y[steps.to(x.device), torch.arange(batch, device=x.device)] = torch.where(live, h_new, torch.zeros_like(h))
        ys.append(y)
        hs_out.append(h)
        cs_out.append(c)
    y = torch.stack(ys, 1)
    h, c = torch.stack(hs_out), torch.stack(cs_out)
    if layout:
        y, h, c = y.permute(2, 0, 1, 3), h.transpose(0, 1), c.transpose(0, 1)
    return (y, h, c) if kind == "lstm" else (y, h)


@register("deform_conv", OpKind.CONV)
def deform_conv(x, w, offset, bias=None, mask=None, stride: tuple = (1, 1), padding: tuple = (0, 0),
                dilation: tuple = (1, 1), groups: int = 1, offset_groups: int = 1):
    """ONNX DeformConv (2-D): each kernel tap samples ``x`` bilinearly at its offset position (zero
    outside), scaled by ``mask``, then a grouped convolution over the samples."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = offset.shape[-2:]
    k = kh * kw
    off = offset.double().reshape(n, offset_groups, kh, kw, 2, oh, ow)
    f64 = {"dtype": torch.float64, "device": x.device}
    base_h = (torch.arange(oh, **f64) * stride[0] - padding[0])[:, None]
    base_w = (torch.arange(ow, **f64) * stride[1] - padding[1])[None, :]
    tap_h = (torch.arange(kh, **f64) * dilation[0])[:, None, None, None]
    tap_w = (torch.arange(kw, **f64) * dilation[1])[None, :, None, None]
    py = base_h + tap_h + off[:, :, :, :, 0]  # [N, G, kh, kw, oh, ow]
    px = base_w + tap_w + off[:, :, :, :, 1]
    grid = torch.stack([px / max(wd - 1, 1) * 2 - 1, py / max(h - 1, 1) * 2 - 1], -1)
    per = c // offset_groups
    msk = torch.ones(n, offset_groups, k, oh, ow, **f64) if mask is None else \
        mask.double().reshape(n, offset_groups, k, oh, ow)
    cols = []
    for g in range(offset_groups):
        sampled = F.grid_sample(x[:, g * per:(g + 1) * per].double(), grid[:, g].reshape(n, k * oh, ow, 2),
                                mode="bilinear", padding_mode="zeros", align_corners=True)
        cols.append(sampled.reshape(n, per, k, oh, ow) * msk[:, g, None])
    cols = torch.cat(cols, 1)  # [N, C, K, oh, ow]
    cg, mg = c // groups, m // groups
    out = torch.cat([torch.einsum("nckhw,mck->nmhw", cols[:, gi * cg:(gi + 1) * cg],
                                  w[gi * mg:(gi + 1) * mg].double().reshape(mg, cg, k)) for gi in range(groups)], 1)
    if bias is not None:
        out = out + bias.double().reshape(1, -1, 1, 1)
    return out.to(x.dtype)

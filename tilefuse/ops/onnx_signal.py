"""ONNX-only signal processing: windows, DFT, STFT and the mel filter bank.

See ``tilefuse.ops.onnx_common`` for the conventions (``"?"`` dims).
"""

from __future__ import annotations

import math

import torch

from tilefuse.ir import torch_dtype
from tilefuse.ops.onnx_common import dynamic_infer
from tilefuse.ops.registry import OpKind, register

O = OpKind.OPAQUE


@register("window", O, infer=dynamic_infer(rank=1))
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


@register("dft", O, infer=dynamic_infer(rank_of=0))
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


@register("stft", O, infer=dynamic_infer(rank=4))
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


@register("mel_weight_matrix", O, infer=dynamic_infer(rank=2))
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

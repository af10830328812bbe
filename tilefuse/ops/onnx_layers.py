"""ONNX-only neural-network layers: pooling with ONNX's pads and ceil mode, LRN, unpooling, col2im, deformable
convolution and the recurrent networks (RNN, GRU, LSTM).

See ``tilefuse.ops.onnx_common`` for the conventions (``"?"`` dims).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilefuse.ir import TensorType
from tilefuse.ops.onnx_common import dynamic_infer
from tilefuse.ops.registry import OpKind, register

R, O = OpKind.REDUCTION, OpKind.OPAQUE


# ---- pooling -------------------------------------------------------------------------------------

@register("lrn", R)
def lrn(x, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0):
    """ONNX LRN: the square sum runs over channels [c - (size-1)//2, c + ceil((size-1)/2)]."""
    sq = (x * x).unsqueeze(1)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = F.pad(sq, (0, 0) * (x.dim() - 2) + (lo, hi))
    s = sq.unfold(2, size, 1).sum(-1).squeeze(1)
    return x / (bias + alpha / size * s) ** beta


def _windows(x, kernel, strides, dilations):
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        x = x.unfold(2 + i, (k - 1) * d + 1, s)[..., ::d]
    return x


def pool_geometry(shape, kernel, strides, pads, dilations, ceil_mode):
    """Output size and the extra end padding ceil mode adds, per spatial dim, of an ONNX pooling window."""
    nd = len(kernel)
    out, extra = [], []
    for i in range(nd):
        n, k, s, d = shape[2 + i], kernel[i], strides[i], dilations[i]
        span = (k - 1) * d + 1
        size = (n + pads[i] + pads[nd + i] - span) / s + 1
        o = math.ceil(size) if ceil_mode else math.floor(size)
        if ceil_mode and (o - 1) * s >= n + pads[i]:
            o -= 1
        out.append(o)
        extra.append(max(0, (o - 1) * s + span - n - pads[i] - pads[nd + i]))
    return out, extra


@register("onnx_pool", R)
def onnx_pool(x, mode: str, kernel: tuple, strides: tuple, pads: tuple, dilations: tuple,
              ceil_mode: int = 0, count_include_pad: int = 0, p: float = 2.0):
    """ONNX Max/Average/Lp pooling with any pads ([begins..., ends...]), dilations and ceil mode."""
    nd = len(kernel)
    out, extra = pool_geometry(x.shape, kernel, strides, pads, dilations, ceil_mode)
    if min(out) <= 0:  # the window is larger than the padded input
        return x.new_empty(tuple(x.shape[:2]) + tuple(max(o, 0) for o in out))
    torch_pads = []
    for i in reversed(range(nd)):
        torch_pads += [pads[i], pads[nd + i] + extra[i]]
    if mode == "max":
        low = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        return _windows(F.pad(x, torch_pads, value=low), kernel, strides, dilations).amax(
            tuple(range(-nd, 0)))
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if mode == "lp":
        w = _windows(F.pad(xf.abs() ** p, torch_pads), kernel, strides, dilations)
        return (w.sum(tuple(range(-nd, 0))) ** (1.0 / p)).to(x.dtype)
    total = _windows(F.pad(xf, torch_pads), kernel, strides, dilations).sum(tuple(range(-nd, 0)))
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=xf.dtype, device=x.device)
    if count_include_pad:  # padding counts; the extra cells of ceil mode do not
        mask_pads = []
        for i in reversed(range(nd)):
            mask_pads += [0, extra[i]]
        ones = F.pad(F.pad(ones, [q for i in reversed(range(nd)) for q in (pads[i], pads[nd + i])], value=1.0),
                     mask_pads)
    else:
        ones = F.pad(ones, torch_pads)
    count = _windows(ones, kernel, strides, dilations).sum(tuple(range(-nd, 0)))
    return (total / count).to(x.dtype)


@register("max_pool_indices", R, num_outputs=2)
def max_pool_indices(x, kernel: tuple, strides: tuple, pads: tuple, dilations: tuple, ceil_mode: int = 0,
                     storage_order: int = 0):
    """ONNX MaxPool with its second output: flat indices into ``x`` (row- or column-major per plane)."""
    nd = len(kernel)
    _, extra = pool_geometry(x.shape, kernel, strides, pads, dilations, ceil_mode)
    torch_pads = []
    for i in reversed(range(nd)):
        torch_pads += [pads[i], pads[nd + i] + extra[i]]
    low = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    w = _windows(F.pad(x, torch_pads, value=low), kernel, strides, dilations)
    spatial = tuple(x.shape[2:])
    plane = torch.arange(math.prod(spatial), device=x.device)
    if storage_order:
        plane = plane.reshape(tuple(reversed(spatial))).permute(tuple(reversed(range(nd)))).reshape(spatial)
    n, c = x.shape[:2]
    base = (torch.arange(n * c, device=x.device) * math.prod(spatial)).reshape(n, c, *([1] * nd))
    idx = plane.reshape(1, 1, *spatial) + base
    wi = _windows(F.pad(idx, torch_pads, value=-1), kernel, strides, dilations)
    flat = w.flatten(-nd)
    arg = flat.argmax(-1, keepdim=True)
    return flat.gather(-1, arg).squeeze(-1), wi.flatten(-nd).gather(-1, arg).squeeze(-1)


@register("max_unpool", O, infer=lambda t, a: [TensorType(a["output_shape"], t[0].dtype)] if a.get(
    "output_shape") else dynamic_infer(rank_of=0)(t, a))
def max_unpool(x, indices, shape=None, inferred_shape: tuple = (), output_shape: tuple | None = None):
    """ONNX MaxUnpool: scatter ``x`` to the flat ``indices`` of a zero tensor of ``inferred_shape``
    (the pooling's input shape), placed at the start of ``output_shape`` (or the runtime ``shape``)."""
    output_shape = output_shape or tuple(int(v) for v in shape.tolist())
    y = torch.zeros(math.prod(inferred_shape), dtype=x.dtype, device=x.device)
    y = y.scatter(0, indices.reshape(-1).long(), x.reshape(-1)).reshape(inferred_shape)
    out = torch.zeros(output_shape, dtype=x.dtype, device=x.device)
    out[tuple(slice(0, d) for d in inferred_shape)] = y
    return out


@register("col2im", O, infer=lambda t, a: [TensorType(None if t[1].shape is None else ("?",) * (t[1].shape[0] + 2),
                                                      t[0].dtype)])
def col2im(x, image_shape, block_shape, dilations: tuple = (), pads: tuple = (), strides: tuple = ()):
    """ONNX Col2Im: sum the columns [N, C*prod(block), L] back into images [N, C, *image_shape]."""
    image_shape, block_shape = [int(v) for v in image_shape.tolist()], [int(v) for v in block_shape.tolist()]
    nd = len(image_shape)
    dilations, pads, strides = dilations or (1,) * nd, pads or (0,) * 2 * nd, strides or (1,) * nd
    n, cb, _ = x.shape
    c = cb // math.prod(block_shape)
    counts = [(image_shape[i] + pads[i] + pads[nd + i] - dilations[i] * (block_shape[i] - 1) - 1) // strides[i] + 1
              for i in range(nd)]
    k = torch.stack(torch.meshgrid(*[torch.arange(b) for b in block_shape], indexing="ij"), -1).reshape(-1, nd)
    loc = torch.stack(torch.meshgrid(*[torch.arange(m) for m in counts], indexing="ij"), -1).reshape(-1, nd)
    pos = loc[None, :, :] * torch.tensor(strides) - torch.tensor(pads[:nd]) + k[:, None, :] * torch.tensor(dilations)
    inside = ((pos >= 0) & (pos < torch.tensor(image_shape))).all(-1)
    flat = torch.zeros_like(pos[..., 0])
    for i in range(nd):
        flat = flat * image_shape[i] + pos[..., i].clamp(0, image_shape[i] - 1)
    cols = x.reshape(n, c, k.shape[0], loc.shape[0]) * inside.to(x.dtype).to(x.device)
    out = torch.zeros(n, c, math.prod(image_shape), dtype=x.dtype, device=x.device)
    out.index_add_(2, flat.reshape(-1).to(x.device), cols.reshape(n, c, -1))
    return out.reshape(n, c, *image_shape)


# ---- deformable convolution ----------------------------------------------------------------------

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


# ---- recurrent networks --------------------------------------------------------------------------

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

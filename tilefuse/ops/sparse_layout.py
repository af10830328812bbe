"""2:4 structured sparsity as data: prune, detect, compress and decompress weights for TileLang's ``T.gemm_sp``.

Note: the layout is TileLang's *natural* row-major metadata (``tilelang.cuda.intrinsics.sparse_layout``,
read by ``ldmatrix_e`` of the mma.sp / wgmma.sp emitters through ``E[row, k // 16]``, no layout annotation).
A weight ``W`` (N, K) is cut along K into groups of 4; each group keeps 2 values:

* ``values`` (N, Kp/2): the two kept values of each group, in index order (``W[n, 4g+i0], W[n, 4g+i1]``);
* ``meta`` (N, Kp/16) int16: per group a 4-bit code ``i0 | i1 << 2`` (``i0 < i1``), four groups per int16,
  the group with the lowest K in the lowest bits (``E_FACTOR`` = 16 elements of K per metadata element,
  ``get_e_factor(float16, int16)``).

``Kp`` is K rounded up to ``K_ALIGN`` = 32: the zero columns added to pad it are compressed like the rest
(TileLang 0.1.15 computes wrong results for a K that is not a multiple of 32, see TILELANG.md), so a
kernel reading ``values``/``meta`` sees whole 32-wide K steps while its dense operand keeps its own K
(the template zero-fills the tail of its last K tile). A group with fewer than two nonzeros still names
two distinct positions (the nonzeros first, then zeros in index order): the hardware only accepts the
six ascending pairs. Pruning keeps the two largest ``|w|`` of each group; ties keep the lower index.
Every function works on fp16, bf16 and fp32 tensors on any device; the metadata is the fp16/bf16 kind
(the sparse tensor cores run fp32 as 1:2, which TileLang's kernels here do not use).
"""

from __future__ import annotations

import torch

GROUP, KEEP = 4, 2
E_FACTOR = 16  # K elements described by one int16 metadata element (4 groups of 4 bits)
K_ALIGN = 32
META_DTYPE = torch.int16
SPARSE_DTYPES = ("float16", "bfloat16")  # what the gemm_sp template multiplies


def padded_k(K: int) -> int:
    """K rounded up to the multiple of ``K_ALIGN`` the compressed layout holds."""
    return -(-int(K) // K_ALIGN) * K_ALIGN


def _groups(w: torch.Tensor) -> torch.Tensor:
    """``w`` (N, K) zero-padded to (N, Kp) and seen as (N, Kp/4, 4)."""
    if w.dim() != 2:
        raise ValueError(f"2:4 sparsity takes a 2-D weight (N, K), got shape {tuple(w.shape)}")
    n, k = w.shape
    kp = padded_k(k)
    if kp != k:
        w = torch.nn.functional.pad(w, (0, kp - k))
    return w.reshape(n, kp // GROUP, GROUP)


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """``w`` (N, K) with all but the 2 largest-magnitude values of each group of 4 along K set to zero
    (ties keep the lower index; a last partial group counts its missing columns as zeros)."""
    n, k = w.shape if w.dim() == 2 else (None, None)
    g = _groups(w)
    order = torch.sort(g.abs(), dim=-1, descending=True, stable=True).indices
    keep = torch.zeros(g.shape, dtype=torch.bool, device=w.device).scatter_(-1, order[..., :KEEP], True)
    return torch.where(keep, g, torch.zeros((), dtype=w.dtype, device=w.device)).reshape(n, -1)[:, :k].clone()


def is_2_4(w: torch.Tensor) -> bool:
    """Whether every group of 4 along K of ``w`` (N, K) holds at most 2 nonzeros."""
    if w.dim() != 2:
        return False
    # a dense weight fails in its first rows: look there before reading all of it
    return all(bool(((_groups(part) != 0).sum(-1) <= KEEP).all()) for part in (w[:16], w))


def compress_2_4(w: torch.Tensor, k_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values (N, Kp/2), meta (N, Kp/16) int16)`` of a 2:4 weight ``w`` (N, K): see the module note. With
    ``k_major`` the metadata comes transposed, (Kp/16, N) contiguous: the layout sm_90's gemm_sp kernels read
    with TMA at any tile depth (``lowering.templates.gemm_sp``). Raises ``ValueError`` when a group holds more
    than 2 nonzeros (``prune_2_4`` first)."""
    g = _groups(w)
    n, groups, _ = g.shape
    nz = g != 0
    if bool((nz.sum(-1) > KEEP).any()):
        raise ValueError(f"weight {tuple(w.shape)} is not 2:4 sparse (a group of 4 along K holds more than 2 "
                         "nonzeros); prune it with prune_2_4 first")
    pos = torch.arange(GROUP, device=w.device)
    # nonzeros first, then zeros, each in index order; the two chosen positions sorted ascending
    sel = ((~nz).to(torch.int64) * GROUP + pos).argsort(dim=-1)[..., :KEEP].sort(dim=-1).values
    values = g.gather(-1, sel).reshape(n, groups * KEEP)
    codes = (sel[..., 0] | (sel[..., 1] << 2)).reshape(n, groups // GROUP, GROUP)
    meta = codes[..., 0] | (codes[..., 1] << 4) | (codes[..., 2] << 8) | (codes[..., 3] << 12)
    meta = torch.where(meta >= 1 << 15, meta - (1 << 16), meta).to(META_DTYPE)  # two's complement int16
    return values.contiguous(), (meta.t() if k_major else meta).contiguous()


def decompress_2_4(values: torch.Tensor, meta: torch.Tensor, K: int | None = None,
                   k_major: bool = False) -> torch.Tensor:
    """The dense (N, K) weight of ``compress_2_4``'s output (N, Kp without ``K``); exact. ``k_major``: ``meta`` is
    (Kp/16, N), as ``compress_2_4(w, k_major=True)`` gives it."""
    meta = meta.t() if k_major else meta
    n, half = values.shape
    groups = half // KEEP
    if meta.shape != (n, groups // GROUP) or meta.dtype != META_DTYPE:
        raise ValueError(f"metadata {meta.dtype}{tuple(meta.shape)} does not describe values {tuple(values.shape)} "
                         f"(expected int16 ({n}, {groups // GROUP}))")
    m = meta.to(torch.int32) & 0xFFFF
    codes = torch.stack([(m >> (4 * j)) & 0xF for j in range(GROUP)], dim=-1).reshape(n, groups)
    idx = torch.stack([codes & 3, (codes >> 2) & 3], dim=-1).to(torch.int64)
    dense = torch.zeros(n, groups, GROUP, dtype=values.dtype, device=values.device)
    dense.scatter_(-1, idx, values.reshape(n, groups, KEEP))
    dense = dense.reshape(n, groups * GROUP)
    return dense if K is None else dense[:, :K].contiguous()

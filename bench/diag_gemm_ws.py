"""Diagnosis (session 22): every ``gemm(ws=True)`` and ``gemm_sp(ws=True)`` case of ``tests/test_gemm_ws.py`` with each
of its schedules (and the 128 x 192, 4-stage tile the H200 measured best), compiled in parallel, run once on fresh
inputs: per case, how many elements of the finite rows differ from the GPU reference and where (rows, columns), and
whether the NaN/Inf rows follow torch. A test stops at its first wrong case; this prints them all.

Usage (device):  python bench/diag_gemm_ws.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_gemm_ws as t

from tilefuse.config import default_target
from tilefuse.lowering.compile import compile_many
from tilefuse.lowering.templates import gemm, gemm_sp
from tilefuse.ops.sparse_layout import compress_2_4, prune_2_4


def where(bad: torch.Tensor) -> str:
    if not bad.any():
        return "ok"
    r, c = bad.nonzero(as_tuple=True)
    return (f"{int(bad.sum())}/{bad.numel()} wrong, rows {int(r.min())}-{int(r.max())} ({r.unique().numel()}), "
            f"cols {int(c.min())}-{int(c.max())} ({c.unique().numel()})")


def built(runs: list, label: str):
    """(run, kernel) for each of ``runs`` (name first, PrimFunc last), compiled in parallel; a build error is a line."""
    kernels = compile_many([(r[-1], [-1]) for r in runs], default_target(), return_exceptions=True)
    for r, k in zip(runs, kernels):
        if isinstance(k, BaseException):
            print(f"{label} {r[0]}: BUILD {type(k).__name__}: {str(k)[:200]}", flush=True)
            continue
        yield r, k


def dense(dtype: str) -> None:
    runs = list(t._funcs(dtype))
    extra = []
    for name, (M, N, K, kw, extras) in sorted(t.CASES.items()):
        if N >= 192 and kw.get("out_dtype") is None:
            extra.append((f"{name} 128x192x4", (M, N, K, kw, extras),
                          gemm.gemm(M, N, K, A_dtype=dtype, extra_shapes=extras, extra_dtypes=[dtype] * len(extras),
                                    ws=True, target=t.SM90, block_M=128, block_N=192, block_K=64, num_stages=4, **kw)))
    runs += extra
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    for (name, (M, N, K, kw, extras), _), k in built(runs, dtype):
        A = torch.randn(M, K, generator=g).to(tdt)
        B = torch.randn(*((N, K) if kw.get("trans_B") else (K, N)), generator=g).to(tdt) / K ** 0.5
        ex = [torch.randn(s, generator=g).to(tdt) for s in extras]
        A[M // 2, 3], A[M - 1, 0] = float("nan"), float("inf")
        try:
            got = k(A.cuda(), B.cuda(), *[e.cuda() for e in ex]).float()
        except Exception as e:  # noqa: BLE001 -- one case's failure is a line
            print(f"{dtype} {name}: RUN {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        want = gemm.reference(A.cuda(), B.cuda(), [e.cuda() for e in ex], trans_B=kw.get("trans_B", False),
                              epilogue=kw.get("epilogue"), out_dtype=kw.get("out_dtype")).float()
        tol = 1e-2 + 1e-2 * want.abs()
        fin = torch.ones(M, dtype=torch.bool, device=want.device)
        fin[[M // 2, M - 1]] = False
        bad = ((got - want).abs() > tol) | (got.isnan() != want.isnan())
        nan_rows = (got[~fin].isnan() != want[~fin].isnan()) | (got[~fin].isinf() != want[~fin].isinf())
        print(f"{dtype} {name:60s} finite rows: {where(bad & fin[:, None])}; NaN/Inf rows: "
              f"{int(nan_rows.sum())} differ", flush=True)


def sparse(dtype: str) -> None:
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    for (name, (M, N, K, kw, extras), _), k in built(list(t._sparse_funcs(dtype)), f"{dtype} sparse"):
        x = torch.randn(M, K, generator=g).to(tdt)
        w = prune_2_4(torch.randn(N, K, generator=g).to(tdt) / K ** 0.5)
        values, meta = compress_2_4(w, k_major=True)
        ex = [torch.randn(s, generator=g).to(tdt) for s in extras]
        want = gemm_sp.reference(x, values, meta, ex, K=K, epilogue=kw.get("epilogue"), meta_k_major=True).float()
        x[M // 3, 5] = float("nan")
        try:
            got = k(x.cuda(), values.cuda(), meta.cuda(), *[e.cuda() for e in ex]).float().cpu()
        except Exception as e:  # noqa: BLE001
            print(f"{dtype} sparse {name}: RUN {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        fin = torch.arange(M) != M // 3
        bad = ((got - want).abs() > 1e-2 + 1e-2 * want.abs()) & fin[:, None]
        kept = w[:, 5] != 0
        row = got[M // 3]
        print(f"{dtype} sparse {name:40s} finite rows: {where(bad)}; NaN row: {int(row[kept].isnan().sum())}/"
              f"{int(kept.sum())} NaN where kept, {int(row[~kept].isnan().sum())}/{int((~kept).sum())} where pruned",
              flush=True)


def sparse_probe(dtype: str = "float16") -> None:
    """The wrong 2:4 case (4096 x 2048 x 512, no epilogue) beside one change each: a bias, one round (fewer tokens
    and weight rows), a deeper K, 128-token tiles; for the wrong ones, which reference row each output row matches."""
    import tilelang.language as T

    from tilefuse.lowering.expr import Acc, Arg
    from tilefuse.lowering.templates import gemm_sp_ws
    probes = [("as found", 4096, 2048, 512, False, {}), ("bias", 4096, 2048, 512, True, {}),
              ("one round", 2048, 1024, 512, False, {}), ("K 1024", 4096, 2048, 1024, False, {}),
              ("128 tokens", 4096, 2048, 512, False, {"block_M": 128}), ("3 rounds", 8192, 2048, 512, False, {}),
              ("stages 2", 4096, 2048, 512, False, {"num_stages": 2}),
              # no product in flight while the next metadata loads: right here says the metadata-register cause
              ("in flight 0", 4096, 2048, 512, False, {"in_flight": 0}),
              ("in flight 0 K1024", 4096, 2048, 1024, False, {"in_flight": 0})]
    runs = []
    for name, M, N, K, bias, over in probes:
        # (the rows without a bias keep the schedule as found, one product in flight, unless they say otherwise)
        cfg = {**({} if bias else {"in_flight": 1}), **{k: v for k, v in gemm_sp_ws.seed(K).items() if k != "ws"},
               **over}
        ep = {"epilogue": Acc() + Arg(0), "extra_shapes": [(N,)], "extra_dtypes": [dtype]} if bias else {}
        if "in_flight" in cfg:  # (a knob of the ws schedule alone: built without gemm_sp's wrapper)
            plain = lambda C_f, extras, tiles, i, j, m0, n0: T.Cast(dtype, C_f[i, j])
            func = gemm_sp_ws.gemm_sp_ws(M, N, K, dtype=dtype, out_dtype=dtype, y_elem=plain, extra_shapes=[],
                                         extra_dtypes=[], staged=[], target=t.SM90, **cfg)
        else:
            func = gemm_sp.gemm_sp(M, N, K, dtype=dtype, meta_k_major=True, ws=True, target=t.SM90, **ep, **cfg)
        runs.append((name, M, N, K, bias, over, func))
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    for (name, M, N, K, bias, over, _), k in built(runs, "probe"):
        x = torch.randn(M, K, generator=g).to(tdt)
        w = prune_2_4(torch.randn(N, K, generator=g).to(tdt) / K ** 0.5)
        values, meta = compress_2_4(w, k_major=True)
        ex = [torch.randn(N, generator=g).to(tdt)] if bias else []
        want = gemm_sp.reference(x, values, meta, ex, K=K, epilogue=Acc() + Arg(0) if bias else None,
                                 meta_k_major=True).float()
        got = k(x.cuda(), values.cuda(), meta.cuda(), *[e.cuda() for e in ex]).float().cpu()
        bad = (got - want).abs() > 1e-2 + 1e-2 * want.abs()
        print(f"probe {name:12s} {M}x{N}x{K} bias={bias} {over}: {where(bad)}", flush=True)
        if bad.any():
            rows = bad.any(1).nonzero()[:6, 0].tolist()
            match = [int(((want - got[r]).abs().sum(1)).argmin()) for r in rows]
            cols = bad.any(0).nonzero()[:6, 0].tolist()
            cmatch = [int(((want - got[:, c:c + 1]).abs().sum(0)).argmin()) for c in cols]
            print(f"   wrong rows {rows} match reference rows {match}; wrong cols {cols} match cols {cmatch}; "
                  f"got[{rows[0]}, :4] {got[rows[0], :4].tolist()} want {want[rows[0], :4].tolist()}", flush=True)


if __name__ == "__main__":
    if "--sparse-probe" in sys.argv:
        sparse_probe()
        sys.exit(0)
    import traceback
    for dt in ("float16", "bfloat16"):
        for part in (dense, sparse):
            try:
                part(dt)
            except Exception:  # noqa: BLE001 -- the other parts still run
                traceback.print_exc()

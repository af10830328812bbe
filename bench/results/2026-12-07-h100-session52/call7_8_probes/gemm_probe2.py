import torch, itertools
from tilefuse.lowering.templates.gemm import gemm
from tilefuse.lowering.compile import compile_many
from tilefuse.config import default_target
t = default_target()
cases = list(itertools.product((1, 2, 3, 4, 8, 16), (64, 128, 256), (2, 3), ("float32", "float16")))
fs = [gemm(M, 256, K, trans_B=True, A_dtype=dt, block_M=64, block_N=64, block_K=32, num_stages=s, threads=128,
           target=t) for M, K, s, dt in cases]
ks = compile_many([(f, -1) for f in fs], t, return_exceptions=True)
for (M, K, s, dt), k in zip(cases, ks):
    td = getattr(torch, dt)
    if isinstance(k, BaseException):
        print(M, K, s, "ERR", str(k)[:100]); continue
    errs = []
    for layout in ("plain", "offset"):
        if layout == "plain":
            a = torch.randn(M, K, device="cuda", dtype=td)
        else:  # A in a larger buffer, 16-byte aligned (what a reshaped view's copy could be)
            a = torch.randn(M + 3, K, device="cuda", dtype=td)[1:M + 1].contiguous()
        b = torch.randn(256, K, device="cuda", dtype=td)
        got = k(a, b)
        want = (a.double() @ b.double().T).float()
        errs.append(((got.float() - want).abs().max() / want.abs().max()).item())
    print(f"{dt} M={M} K={K} stages={s}: rel err {errs[0]:.2e} {errs[1]:.2e}", flush=True)

"""What a kernel is handed: any input with a legal torch layout runs (issue 15, item 3), and a plan never hands a
kernel tensors on different devices without saying which."""

import numpy as np
import pytest
import torch

import tilefuse
from tilefuse.runtime.kernels import aligned, boundary_error, dense


def _zero_stride_empty(cols: int) -> torch.Tensor:
    x = torch.from_numpy(np.zeros((0, cols), np.float32))  # numpy's zero-row arrays: strides (0, 0)
    assert x.stride() == (0, 0) and x.is_contiguous()
    return x


@pytest.mark.parametrize("frontend", ["compile", "dynamo"])
def test_zero_row_numpy_input_runs_through_a_gemm(frontend, rng):
    lin = torch.nn.Linear(8, 4)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 8, generator=rng))
    m = tilefuse.compile(lin, target="c") if frontend == "compile" else torch.compile(lin, backend="tilefuse")
    x = _zero_stride_empty(8)
    with torch.no_grad():
        out = m(x)
        assert out.shape == (0, 4) and out.dtype == torch.float32
        # the same compiled model still computes right on rows afterwards, and on a plain empty tensor
        y = torch.randn(5, 8, generator=rng)
        assert m(torch.randn(0, 8)).shape == (0, 4)
        torch.testing.assert_close(m(y), lin(y), rtol=1e-5, atol=1e-5)


def test_dense_gives_row_major_strides_without_copying():
    x = torch.randn(5, 100)[:1, :8]  # contiguous by torch's rule (a size-1 dim's stride is free), stride (100, 1)
    d = dense(x)
    assert d.stride() == (8, 1) and d.data_ptr() == x.data_ptr() and torch.equal(d, x)
    e = dense(_zero_stride_empty(3))
    assert e.shape == (0, 3) and e.stride() == (3, 1)
    y = torch.randn(4, 6).t()  # really not contiguous: copied
    assert dense(y).stride() == (4, 1) and torch.equal(dense(y), y)
    z = torch.randn(2, 3)
    assert dense(z) is z


def test_mixed_devices_at_a_kernel_are_named():
    err = RuntimeError("elementwise_kernel input in1 device_type mismatch")
    t = [torch.zeros(2, device="meta"), torch.zeros(2)]
    msg = str(boundary_error("fused_add_0", [("a", None), ("b", None)], t, err))
    assert "fused_add_0" in msg and "b on cpu" in msg and "a on meta" in msg and "device_type mismatch" in msg
    assert boundary_error("r", [("a", None)], [torch.zeros(1)], err) is None


def test_views_off_a_16_byte_boundary_are_copied_to_one(rng):
    """A view into the middle of a row (a slice of a model's mask, say) starts off the 16-byte boundary that TMA
    copies and vector loads need: it reaches the kernel as a fresh copy; aligned tensors pass as they are."""
    base = torch.randn(4, 10, generator=rng)
    odd = base.view(-1)[3:19].view(2, 8)  # contiguous, 12 bytes past an aligned start
    assert odd.data_ptr() % 16 != 0
    fixed = aligned(odd)
    assert fixed.data_ptr() % 16 == 0 and torch.equal(fixed, odd) and fixed.stride() == odd.stride()
    assert aligned(base) is base and aligned(torch.empty(0)).numel() == 0

    @torch.compile(backend="tilefuse")
    def f(x):
        return x * 2 + 1
    torch.testing.assert_close(f(odd), odd * 2 + 1)

"""What a kernel is handed: any input with a legal torch layout runs (issue 15, item 3), and a plan never hands a
kernel tensors on different devices without saying which."""

import numpy as np
import pytest
import torch

import tilefuse
from tilefuse.runtime.kernels import boundary_error, dense


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

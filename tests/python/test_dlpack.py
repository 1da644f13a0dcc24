"""DLPack in and out (python/bind_dlpack.cc): torch and NumPy take remat
tensors without a copy (bf16 too), remat takes theirs, each side keeps the
other's memory alive, and what cannot be shared is a clear error."""
import gc

import numpy as np
import pytest
import torch

import remat


def test_torch_takes_a_remat_tensor_without_a_copy():
    t = remat.randn((3, 4))
    p = torch.from_dlpack(t)
    assert p.data_ptr() == t.data_ptr() and tuple(p.shape) == (3, 4) and p.dtype == torch.float32
    assert np.array_equal(p.numpy(), t.numpy())
    p[1, 2] = 42.0  # one memory
    assert t[1, 2].item() == 42.0
    del t
    gc.collect()
    assert p[1, 2].item() == 42.0  # the capsule keeps remat's tensor alive


def test_bf16_and_strided_views_travel():
    b = (remat.arange(6, dtype="i64").to(remat.f32) * 0.5).to(remat.bf16).view(2, 3)
    p = torch.from_dlpack(b)
    assert p.dtype == torch.bfloat16 and p.data_ptr() == b.data_ptr()
    assert p.float().tolist() == [[0.0, 0.5, 1.0], [1.5, 2.0, 2.5]]
    tt = remat.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4)).transpose(0, 1)
    q = torch.from_dlpack(tt)
    assert q.stride() == (1, 4) and q.tolist() == tt.tolist()


def test_remat_takes_torch_and_numpy_tensors_without_a_copy():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    r = remat.from_dlpack(x)
    assert r.data_ptr() == x.data_ptr() and r.strides == (1, 3)
    assert r.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    r[0, 1] = 9.0
    assert x[0, 1].item() == 9.0
    del x
    gc.collect()
    assert r[0, 1].item() == 9.0  # remat keeps torch's storage
    y = remat.from_dlpack(torch.ones(2, 2, dtype=torch.bfloat16))
    assert y.dtype == remat.bf16 and y.to(remat.f32).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    a = np.arange(5, dtype=np.int64)
    z = remat.from_dlpack(a)
    assert z.dtype == remat.i64 and z.data_ptr() == a.ctypes.data
    n = np.from_dlpack(remat.ones((2, 2)))
    assert n.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_gradients_flow_through_a_wrapped_torch_tensor():
    w = remat.from_dlpack(torch.full((2, 2), 2.0)).requires_grad_()
    (w * w).sum().backward()
    assert w.grad.tolist() == [[4.0, 4.0], [4.0, 4.0]]


def test_what_cannot_be_shared_is_a_clear_error():
    with pytest.raises(remat.DTypeError, match="no DLPack type"):
        remat.ones((2,)).to(remat.fp8_e4m3).__dlpack__()
    with pytest.raises(remat.DeviceError, match="meta"):
        remat.zeros((2,), device="meta").__dlpack__()
    with pytest.raises(remat.DTypeError, match="no remat dtype"):
        remat.from_dlpack(torch.zeros(2, dtype=torch.float64))
    cap = remat.ones((2,)).__dlpack__()
    remat.from_dlpack(cap)
    with pytest.raises(TypeError, match="unused"):
        remat.from_dlpack(cap)  # a capsule is taken once
    with pytest.raises(TypeError):
        remat.from_dlpack([1, 2])
    assert remat.from_dlpack(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]  # and the next call works


def test_dlpack_device():
    assert remat.ones((1,)).__dlpack_device__() == (1, 0)  # kDLCPU

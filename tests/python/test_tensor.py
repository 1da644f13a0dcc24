"""remat.Tensor from Python: metadata, NumPy interop without copies, views,
operators against NumPy, reductions, factories and argument errors."""
import numpy as np
import pytest

import remat
from remat_test_util import assert_isolated_ok


def arr(t):
    """A tensor's elements as a NumPy array (a view, through the buffer protocol)."""
    return np.asarray(t)


# --- metadata ---------------------------------------------------------------

def test_shape_dtype_device_strides():
    t = remat.zeros((2, 3, 4))
    assert t.shape == (2, 3, 4)
    assert t.size() == (2, 3, 4)
    assert t.size(1) == 3
    assert t.ndim == 3 and t.dim() == 3
    assert t.numel() == 24
    assert t.nbytes == 24 * 4
    assert t.dtype == remat.f32 == remat.float32
    assert t.device == "cpu"
    assert t.strides == (12, 4, 1)
    assert t.is_contiguous()
    assert len(t) == 2
    i = remat.zeros((5,), dtype="i64")
    assert i.dtype == remat.i64 == remat.int64
    assert i.nbytes == 40
    assert remat.zeros(3, dtype=remat.bf16).dtype == remat.bf16


def test_transposed_strides():
    t = remat.zeros((2, 3, 4)).transpose(0, 2)
    assert t.shape == (4, 3, 2)
    assert t.strides == (1, 4, 12)
    assert not t.is_contiguous()
    assert t.contiguous().strides == (6, 2, 1)


def test_factories():
    assert arr(remat.ones((2, 2))).tolist() == [[1, 1], [1, 1]]
    assert arr(remat.full((3,), 2.5)).tolist() == [2.5, 2.5, 2.5]
    a = remat.arange(5)
    assert a.dtype == remat.i64 and arr(a).tolist() == [0, 1, 2, 3, 4]
    remat.manual_seed(11)
    r1 = arr(remat.randn((3, 4))).copy()
    remat.manual_seed(11)
    r2 = arr(remat.randn((3, 4))).copy()
    assert np.array_equal(r1, r2)
    assert not np.array_equal(r1, arr(remat.randn((3, 4))))
    u = arr(remat.rand((1000,)))
    assert u.min() >= 0 and u.max() < 1
    assert remat.randn((2, 2), requires_grad=True).requires_grad
    assert remat.zeros((2,), requires_grad=True).is_leaf


# --- NumPy interop ----------------------------------------------------------

def test_from_numpy_shares_memory_both_ways():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = remat.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    assert t.shape == (3, 4) and t.strides == (4, 1) and t.dtype == remat.f32
    back = np.asarray(t)
    assert back.ctypes.data == a.ctypes.data
    assert np.shares_memory(back, a)
    assert t.numpy().ctypes.data == a.ctypes.data
    # Writes are visible both ways.
    a[1, 2] = 100.0
    assert t.tolist()[1][2] == 100.0
    t.fill_(7.0)
    assert (a == 7.0).all()
    back[0, 0] = -1.0
    assert a[0, 0] == -1.0


def test_tensor_to_numpy_shares_memory():
    t = remat.arange(6).to(remat.f32)
    n = np.asarray(t)
    assert n.ctypes.data == t.data_ptr()
    assert n.dtype == np.float32 and n.shape == (6,)
    assert n.flags.writeable
    n[3] = 42.0
    assert t.tolist()[3] == 42.0
    t.zero_()
    assert (n == 0).all()


def test_numpy_view_keeps_tensor_alive():
    n = np.asarray(remat.full((1000,), 3.0))
    big = [remat.full((1000,), 9.0) for _ in range(10)]  # would reuse the block if it were freed
    assert (n == 3.0).all()
    del big


def test_tensor_keeps_array_alive():
    a = np.full((64,), 5.0, dtype=np.float32)
    t = remat.from_numpy(a)
    del a
    junk = [np.full((64,), 1.0, dtype=np.float32) for _ in range(10)]
    assert t.tolist() == [5.0] * 64
    del junk


def test_strided_views_export_correct_strides():
    t = remat.arange(12).to(remat.f32).view(3, 4)
    tt = t.transpose(0, 1)
    n = np.asarray(tt)
    assert n.shape == (4, 3)
    assert n.strides == (4, 16)  # bytes
    assert n.ctypes.data == t.data_ptr()
    assert np.array_equal(n, np.arange(12, dtype=np.float32).reshape(3, 4).T)
    assert np.array_equal(np.asarray(t.T), n)
    # narrow/select: an offset into the storage
    assert np.asarray(t.narrow(1, 1, 2)).tolist() == [[1, 2], [5, 6], [9, 10]]
    assert np.asarray(t.select(1, 2)).tolist() == [2, 6, 10]
    e = remat.ones((2, 3)).expand(4, 2, 3)
    assert np.asarray(e).strides == (0, 12, 4)


def test_from_numpy_strided_arrays():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    s = a[::2, 1::2]
    t = remat.from_numpy(s)
    assert t.data_ptr() == s.ctypes.data
    assert t.shape == (2, 3) and t.strides == (12, 2)
    assert t.tolist() == s.tolist()
    f = np.asfortranarray(a)
    tf = remat.from_numpy(f)
    assert tf.strides == (1, 4) and tf.tolist() == a.tolist()
    # A transposed array: the same memory, strides in elements.
    tt = remat.from_numpy(a.T)
    assert tt.data_ptr() == a.ctypes.data and tt.strides == (1, 6)
    assert np.array_equal(np.asarray(tt), a.T)


def test_from_numpy_negative_strides_raise():
    a = np.arange(6, dtype=np.float32)[::-1]
    with pytest.raises(remat.ShapeError, match="negative"):
        remat.from_numpy(a)


def test_read_only_arrays_are_copied():
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = remat.from_numpy(a)
    assert t.data_ptr() != a.ctypes.data
    assert t.tolist() == [0, 1, 2, 3]
    t.fill_(1.0)  # the copy is writable, the array untouched
    assert a.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("np_dtype,remat_dtype", [
    (np.float32, "f32"), (np.float16, "f16"), (np.int32, "i32"), (np.int64, "i64"), (np.bool_, "bool")])
def test_from_numpy_dtypes(np_dtype, remat_dtype):
    a = np.array([1, 0, 1], dtype=np_dtype)
    t = remat.from_numpy(a)
    assert t.dtype == getattr(remat.dtype, remat_dtype)
    assert t.data_ptr() == a.ctypes.data
    back = np.asarray(t)
    assert back.dtype == np_dtype and np.array_equal(back, a)


@pytest.mark.parametrize("np_dtype", [np.float64, np.uint8, np.int16, np.complex64])
def test_wrong_dtype_raises_dtype_error(np_dtype):
    with pytest.raises(remat.DTypeError, match="float32") as info:
        remat.from_numpy(np.zeros(3, dtype=np_dtype))
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, remat.Error)


def test_float64_dtype_error_is_catchable_as_type_error():
    with pytest.raises(TypeError, match="float32"):
        remat.from_numpy(np.zeros((2, 2)))


def test_non_native_byte_order_is_not_misread():
    """A big-endian float32 array must not be read as native f32: either it is
    refused (DTypeError) or its values come through right."""
    a = np.arange(4, dtype=">f4")
    try:
        t = remat.from_numpy(a)
    except remat.DTypeError:
        return
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_bf16_numpy_raises_clearly():
    t = remat.ones((2,)).to(remat.bf16)
    with pytest.raises(remat.DTypeError, match="bf16.*no NumPy dtype") as info:
        t.numpy()
    assert "to(remat.f32)" in str(info.value)
    assert t.to(remat.f32).numpy().tolist() == [1.0, 1.0]
    assert t.tolist() == [1.0, 1.0]  # tolist converts


def test_buffer_protocol_errors_raise_instead_of_aborting():
    """np.asarray / memoryview straight on a tensor NumPy cannot view (bf16, a
    meta tensor) raise remat's error. Run in a child interpreter: an exception
    thrown out of the buffer callback aborts the process."""
    assert_isolated_ok("""
        import numpy as np, remat
        for make, err, text in [(lambda: remat.ones((2,)).to(remat.bf16), remat.DTypeError, "no NumPy dtype"),
                                (lambda: remat.zeros((2,), device="meta"), remat.DeviceError, "meta")]:
            for view in (np.asarray, memoryview):
                try:
                    view(make())
                except err as e:
                    assert text in str(e), str(e)
                else:
                    raise AssertionError("no error from %s" % view)
        print("ok")
    """)


def test_meta_tensor_numpy_raises_device_error():
    t = remat.zeros((2,), device="meta")
    assert t.device == "meta"
    with pytest.raises(remat.DeviceError, match="meta"):
        t.numpy()


def test_empty_and_scalar_tensors():
    assert np.asarray(remat.zeros((0, 3))).shape == (0, 3)
    assert remat.from_numpy(np.zeros((0, 3), dtype=np.float32)).shape == (0, 3)
    s = remat.from_numpy(np.array(3.5, dtype=np.float32))
    assert s.shape == () and s.item() == 3.5
    assert np.asarray(remat.tensor(2.5)).shape == ()
    assert float(remat.tensor(2.5)) == 2.5 and int(remat.tensor(7)) == 7
    with pytest.raises(TypeError):
        len(remat.tensor(1.0))


# --- remat.tensor -----------------------------------------------------------

def test_tensor_from_lists():
    t = remat.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.dtype == remat.f32 and t.shape == (2, 2)
    assert t.tolist() == [[1, 2], [3, 4]]
    assert remat.tensor([1, 2, 3]).dtype == remat.i64
    assert remat.tensor([True, False]).dtype == remat.dtype.bool
    assert remat.tensor(1.5).shape == ()
    assert remat.tensor([1.0, 2.0], dtype="bf16").dtype == remat.bf16
    g = remat.tensor([1.0], requires_grad=True)
    assert g.requires_grad and g.is_leaf


def test_tensor_copies_its_data():
    a = np.ones(3, dtype=np.float32)
    t = remat.tensor(a)
    assert t.data_ptr() != a.ctypes.data
    a[0] = 5.0
    assert t.tolist() == [1.0, 1.0, 1.0]
    u = remat.tensor(t)
    assert u.data_ptr() != t.data_ptr() and u.tolist() == t.tolist()


def test_argument_errors():
    with pytest.raises(TypeError, match="shape"):
        remat.zeros("ab")
    with pytest.raises(TypeError, match="shape's entries"):
        remat.zeros((2, "a"))
    with pytest.raises(TypeError, match="dtype"):
        remat.zeros((2,), dtype=3)
    with pytest.raises(remat.DTypeError, match="unknown dtype 'nope'"):
        remat.zeros((2,), dtype="nope")
    with pytest.raises(remat.DeviceError, match="tpu"):
        remat.zeros((2,), device="tpu")
    with pytest.raises(TypeError):
        remat.from_numpy([1, 2])


# --- operators against NumPy -------------------------------------------------

@pytest.fixture
def ab():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = (rng.standard_normal((3, 4)).astype(np.float32) + 3.0)
    return a, b


def close(t, expected, rtol=1e-6, atol=1e-6):
    got = np.asarray(t)
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def test_binary_operators(ab):
    a, b = ab
    ta, tb = remat.from_numpy(a), remat.from_numpy(b)
    close(ta + tb, a + b)
    close(ta - tb, a - b)
    close(ta * tb, a * b)
    close(ta / tb, a / b)
    close(remat.add(ta, tb), a + b)
    close(remat.sub(ta, tb), a - b)
    close(remat.mul(ta, tb), a * b)
    close(remat.div(ta, tb), a / b)


def test_scalar_and_reflected_operators(ab):
    a, b = ab
    ta, tb = remat.from_numpy(a), remat.from_numpy(b)
    close(ta + 2.0, a + 2)
    close(2.0 + ta, 2 + a)
    close(ta - 1.5, a - 1.5)
    close(1.5 - ta, 1.5 - a)
    close(ta * 3.0, a * 3)
    close(3.0 * ta, 3 * a)
    close(ta / 4.0, a / 4)
    close(4.0 / tb, 4 / b, rtol=1e-6)
    close(ta + 1, a + 1)  # a Python int works as a scalar too
    close(-ta, -a)
    close(remat.neg(ta), -a)
    close(tb ** 2, b ** 2, rtol=1e-5)
    close(tb ** 0.5, np.sqrt(b), rtol=1e-5)
    close(remat.pow(tb, 3.0), b ** 3, rtol=1e-5)


def test_broadcasting(ab):
    a, _ = ab
    row = np.arange(4, dtype=np.float32)
    close(remat.from_numpy(a) + remat.from_numpy(row), a + row)
    col = np.arange(3, dtype=np.float32).reshape(3, 1)
    close(remat.from_numpy(a) * remat.from_numpy(col), a * col)


def test_matmul(ab):
    a, b = ab
    ta, tb = remat.from_numpy(a), remat.from_numpy(b)
    close(ta @ tb.T, a @ b.T, rtol=1e-5, atol=1e-5)
    close(remat.matmul(ta, tb.transpose(0, 1)), a @ b.T, rtol=1e-5, atol=1e-5)
    close(ta.matmul(tb.t()), a @ b.T, rtol=1e-5, atol=1e-5)
    w = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    bias = np.arange(5, dtype=np.float32)
    close(remat.linear(ta, remat.from_numpy(w)), a @ w.T, rtol=1e-5, atol=1e-5)
    close(remat.linear(ta, remat.from_numpy(w), remat.from_numpy(bias)), a @ w.T + bias, rtol=1e-5, atol=1e-5)
    x3 = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    y3 = np.random.default_rng(3).standard_normal((2, 4, 5)).astype(np.float32)
    close(remat.bmm(remat.from_numpy(x3), remat.from_numpy(y3)), x3 @ y3, rtol=1e-5, atol=1e-5)


def test_in_place_operators():
    a = remat.ones(3)
    alias = a
    a += remat.ones(3)
    assert alias.tolist() == [2.0, 2.0, 2.0]  # the same storage was updated
    a *= 3.0
    assert alias.tolist() == [6.0, 6.0, 6.0]


def test_unary_ops(ab):
    a, b = ab
    ta, tb = remat.from_numpy(a), remat.from_numpy(b)
    close(ta.exp(), np.exp(a), rtol=1e-5)
    close(remat.exp(ta), np.exp(a), rtol=1e-5)
    close(tb.log(), np.log(b), rtol=1e-5)
    close(tb.sqrt(), np.sqrt(b), rtol=1e-5)
    close(remat.rsqrt(tb), 1 / np.sqrt(b), rtol=1e-5)
    close(ta.abs(), np.abs(a))
    close(ta.relu(), np.maximum(a, 0))
    close(ta.sigmoid(), 1 / (1 + np.exp(-a)), rtol=1e-5)
    close(ta.tanh(), np.tanh(a), rtol=1e-5, atol=1e-6)
    close(remat.silu(ta), a / (1 + np.exp(-a)), rtol=1e-5, atol=1e-6)
    sm = np.exp(a - a.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    close(ta.softmax(-1), sm, rtol=1e-5)
    close(remat.log_softmax(ta, -1), np.log(sm), rtol=1e-5, atol=1e-5)


def test_reductions(ab):
    a, _ = ab
    t = remat.from_numpy(a)
    assert t.sum().shape == ()
    np.testing.assert_allclose(t.sum().item(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(t.mean().item(), a.mean(), rtol=1e-5)
    close(t.sum(0), a.sum(0), rtol=1e-5)
    close(t.sum(1, keepdim=True), a.sum(1, keepdims=True), rtol=1e-5)
    close(t.mean((0, 1)), np.array(a.mean(), dtype=np.float32), rtol=1e-5)
    close(remat.mean(t, 1), a.mean(1), rtol=1e-5)
    close(remat.sum(t, [0]), a.sum(0), rtol=1e-5)
    close(t.amax(1), a.max(1))
    close(remat.amax(t, 0, keepdim=True), a.max(0, keepdims=True))
    vals, idx = remat.topk(remat.tensor([3.0, 1.0, 2.0]), 2)
    assert vals.tolist() == [3.0, 2.0] and idx.tolist() == [0, 2]


def test_views(ab):
    a, _ = ab
    t = remat.from_numpy(a)
    v = t.view(4, 3)
    assert v.shape == (4, 3) and v.shares_memory(t) and v.data_ptr() == t.data_ptr()
    assert np.array_equal(np.asarray(v), a.reshape(4, 3))
    assert t.reshape((12,)).shape == (12,)
    assert np.array_equal(np.asarray(t.permute(1, 0)), a.T)
    assert t.unsqueeze(0).shape == (1, 3, 4)
    assert t.unsqueeze(0).squeeze(0).shape == (3, 4)
    assert remat.zeros((1, 3, 1)).squeeze().shape == (3,)
    assert remat.zeros((2, 3, 4)).flatten(1).shape == (2, 12)
    assert np.array_equal(np.asarray(t.transpose(0, 1).contiguous()), a.T)
    c = t.clone()
    assert not c.shares_memory(t) and np.array_equal(np.asarray(c), a)
    assert t.detach().shares_memory(t)
    with pytest.raises(remat.ShapeError):
        t.view(5, 2)
    assert remat.cat([remat.ones(2), remat.zeros(3)]).tolist() == [1, 1, 0, 0, 0]
    assert remat.stack([remat.ones(2), remat.zeros(2)], 1).shape == (2, 2)


def test_views_with_one_int_dim():
    """t.view(12) / t.reshape(12) take one int like t.view(4, 3) takes two."""
    t = remat.arange(12)
    assert t.view(12).shape == (12,)
    assert t.reshape(12).shape == (12,)
    assert t.view(3, 4).reshape(12).tolist() == list(range(12))
    assert remat.ones(1).expand(3).shape == (3,)
    assert t.permute(0).shape == (12,)
    with pytest.raises(remat.ShapeError):
        t.view(5)


def test_dtype_conversion():
    t = remat.tensor([1.5, -2.25])
    b = t.to("bf16")
    assert b.dtype == remat.bf16 and b.to(remat.f32).tolist() == [1.5, -2.25]
    h = t.to(remat.f16)
    assert np.asarray(h).dtype == np.float16
    assert remat.cast(t, remat.f16).dtype == remat.f16
    assert t.to("cpu").device == "cpu"


def test_truthiness_and_repr():
    assert bool(remat.tensor([1.0])) is True
    assert bool(remat.tensor([0.0])) is False
    with pytest.raises(remat.ShapeError, match="ambiguous"):
        bool(remat.zeros((3, 4)))
    r = repr(remat.ones(2))
    assert "shape=[2]" in r and "f32" in r

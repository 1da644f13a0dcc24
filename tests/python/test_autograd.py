"""Autograd from Python: gradients against hand and NumPy derivations, grad
mode, gradient hooks, and remat's errors as Python exceptions that leave the
engine usable."""
import numpy as np
import pytest

import remat


def leaf(values):
    return remat.tensor(np.asarray(values, dtype=np.float32), requires_grad=True)


def g(t):
    return np.asarray(t.grad)


def test_matmul_gradients_match_numpy():
    rng = np.random.default_rng(0)
    xa = rng.standard_normal((3, 4)).astype(np.float32)
    wa = rng.standard_normal((4, 5)).astype(np.float32)
    x, w = leaf(xa), leaf(wa)
    y = (x @ w).sum()
    assert y.grad_fn is not None and x.grad_fn is None and x.is_leaf and not y.is_leaf
    y.backward()
    # d sum(xw) / dx = 1 w^T, / dw = x^T 1
    np.testing.assert_allclose(g(x), np.ones((3, 5), np.float32) @ wa.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g(w), xa.T @ np.ones((3, 5), np.float32), rtol=1e-5, atol=1e-6)


def test_elementwise_chain_gradient():
    xa = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    x = leaf(xa)
    # f = sum(x^2 * exp(x) + 3 / (1 + x^2))
    f = (x * x * x.exp() + 3.0 / (1.0 + x ** 2)).sum()
    f.backward()
    expected = 2 * xa * np.exp(xa) + xa * xa * np.exp(xa) - 3.0 * 2 * xa / (1 + xa ** 2) ** 2
    np.testing.assert_allclose(g(x), expected, rtol=1e-5)


def test_mean_and_broadcast_gradients():
    x = leaf(np.arange(6).reshape(2, 3))
    b = leaf([1.0, 2.0, 3.0])
    ((x + b) ** 2).mean().backward()
    xa = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = 2 * (xa + np.array([1, 2, 3], np.float32)) / 6
    np.testing.assert_allclose(g(x), d, rtol=1e-6)
    np.testing.assert_allclose(g(b), d.sum(0), rtol=1e-6)


def test_softmax_cross_entropy_gradient():
    rng = np.random.default_rng(1)
    la = rng.standard_normal((4, 7)).astype(np.float32)
    targets = np.array([0, 3, 6, 2], dtype=np.int64)
    logits = leaf(la)
    loss = remat.cross_entropy(logits, remat.from_numpy(targets))
    p = np.exp(la - la.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(loss.item(), -np.log(p[np.arange(4), targets]).mean(), rtol=1e-5)
    loss.backward()
    onehot = np.eye(7, dtype=np.float32)[targets]
    np.testing.assert_allclose(g(logits), (p - onehot) / 4, rtol=1e-4, atol=1e-6)


def test_gradients_accumulate_and_reset():
    x = leaf([1.0, 2.0])
    (x * x).sum().backward()
    (x * x).sum().backward()
    assert g(x).tolist() == [4.0, 8.0]
    x.grad = None
    assert x.grad is None
    (x * 3.0).sum().backward()
    assert g(x).tolist() == [3.0, 3.0]


def test_backward_with_seed_and_retain_graph():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    remat.backward([y], [remat.tensor(2.0)])
    assert g(x).tolist() == [4.0, 8.0]
    x.grad = None
    y = x * x
    y.backward(remat.tensor([1.0, 10.0]))
    assert g(x).tolist() == [2.0, 40.0]
    x.grad = None
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert g(x).tolist() == [4.0, 8.0]


def test_second_backward_without_retain_raises_autograd_error():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    with pytest.raises(remat.AutogradError, match="retain_graph") as info:
        y.backward()
    assert isinstance(info.value, remat.Error) and isinstance(info.value, RuntimeError)


def test_no_grad():
    x = leaf([1.0, 2.0])
    assert remat.is_grad_enabled()
    with remat.no_grad():
        assert not remat.is_grad_enabled()
        y = x * 2.0
        with remat.enable_grad():
            assert remat.is_grad_enabled()
            z = x * 2.0
    assert remat.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None
    remat.set_grad_enabled(False)
    try:
        assert not (x * 2.0).requires_grad
    finally:
        remat.set_grad_enabled(True)
    assert (x * 2.0).requires_grad


def test_no_grad_restored_after_exception():
    with pytest.raises(KeyError):
        with remat.no_grad():
            raise KeyError("x")
    assert remat.is_grad_enabled()


def test_scope_object_cannot_be_entered_twice_at_once():
    s = remat.no_grad()
    with s:
        pass
    with s:  # again after it exited: fine
        pass
    with pytest.raises(remat.AutogradError, match="already entered"):
        with s:
            with s:
                pass
    assert remat.is_grad_enabled()


def test_detach_and_requires_grad():
    x = leaf([1.0, 2.0])
    d = x.detach()
    assert not d.requires_grad and d.shares_memory(x)
    t = remat.ones(2)
    assert t.requires_grad_() is not None and t.requires_grad
    t.requires_grad = False
    assert not t.requires_grad


def test_register_hook_sees_and_replaces_gradient():
    a = leaf([1.0, 2.0, 3.0])
    b = a * 3.0
    seen = []

    def hook(grad):
        seen.append(np.asarray(grad).copy())
        return grad * 2.0

    b.register_hook(hook)
    (b * b).sum().backward()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], [6.0, 12.0, 18.0])  # d(b^2)/db = 2b
    np.testing.assert_array_equal(g(a), [36.0, 72.0, 108.0])   # 2 * 2b * 3


def test_register_hook_returning_none_keeps_gradient():
    a = leaf([1.0, 2.0])
    calls = []
    a.register_hook(lambda grad: calls.append(1))
    (a * 5.0).sum().backward()
    assert calls == [1]
    assert g(a).tolist() == [5.0, 5.0]


def test_hook_exception_propagates_and_engine_recovers():
    c = leaf([1.0, 2.0])
    d = c * 2.0

    def bad(grad):
        raise KeyError("boom from a hook")

    d.register_hook(bad)
    with pytest.raises(KeyError, match="boom from a hook"):
        d.sum().backward()
    e = c * 2.0
    e.register_hook(lambda grad: 5)
    with pytest.raises(TypeError, match="gradient hook must return a remat.Tensor"):
        e.sum().backward()
    c.grad = None
    (c * c).sum().backward()
    assert g(c).tolist() == [2.0, 4.0]


def test_shape_error_is_value_error_with_remats_message():
    a, b = remat.ones((2, 3)), remat.ones((2, 3))
    with pytest.raises(remat.ShapeError) as info:
        remat.matmul(a, b)
    e = info.value
    assert isinstance(e, ValueError) and isinstance(e, remat.Error) and isinstance(e, RuntimeError)
    assert "matmul" in str(e) and "[2, 3]" in str(e)
    with pytest.raises(ValueError):
        a + remat.ones((4,))
    # the engine is intact: the next call works
    np.testing.assert_array_equal(np.asarray(remat.matmul(a, b.T)), np.full((2, 2), 3.0))


def test_error_in_forward_leaves_graph_usable():
    x = leaf(np.ones((2, 3)))
    h = x * 2.0
    with pytest.raises(remat.ShapeError):
        h @ remat.ones((2, 3))
    (h @ remat.ones((3, 2))).sum().backward()
    np.testing.assert_array_equal(g(x), np.full((2, 3), 4.0))


def test_dtype_error_is_type_error():
    with pytest.raises(remat.DTypeError) as info:
        remat.tensor([1, 2]) + 1.5  # add_scalar takes floating tensors
    assert isinstance(info.value, TypeError) and isinstance(info.value, remat.Error)
    assert (remat.tensor([1.0, 2.0]) + 1.5).tolist() == [2.5, 3.5]


def test_error_classes():
    assert issubclass(remat.Error, RuntimeError)
    assert issubclass(remat.ShapeError, ValueError)
    assert issubclass(remat.DTypeError, TypeError)
    assert issubclass(remat.OutOfMemoryError, MemoryError)
    assert issubclass(remat.IOError, OSError)
    for cls in (remat.ShapeError, remat.DTypeError, remat.DeviceError, remat.OutOfMemoryError,
                remat.CheckpointMismatchError, remat.AutogradError, remat.IOError):
        assert issubclass(cls, remat.Error), cls


def test_out_of_memory_error_under_a_limit():
    remat.empty_cache()
    limit = remat.memory_stats()["reserved_bytes"] + (1 << 20)
    remat.set_memory_limit(limit)
    try:
        with pytest.raises(remat.OutOfMemoryError) as info:
            remat.empty((64, 1024, 1024))  # 256 MiB
        assert isinstance(info.value, MemoryError)
    finally:
        remat.set_memory_limit(0)
    assert remat.zeros((1024,)).numel() == 1024


def test_many_errors_in_a_row_then_work():
    x = leaf([1.0, 2.0])
    for _ in range(200):
        with pytest.raises(remat.ShapeError):
            (x * 2.0) @ remat.ones((3, 3))
    (x * x).sum().backward()
    assert g(x).tolist() == [2.0, 4.0]

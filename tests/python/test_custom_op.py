"""remat.custom_op: Python forward/backward with ctx (save_for_backward,
attributes), gradcheck catching a wrong backward, custom ops inside
checkpoint regions, and the errors a bad op gets."""
import gc
import weakref

import numpy as np
import pytest

import remat


def square_forward(ctx, x):
    ctx.save_for_backward(x)
    ctx.scale = 2.0  # an attribute set in forward, read in backward
    return x * x


def square_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * x * ctx.scale


square = remat.custom_op("py_square", square_forward, square_backward)


def wrong_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * x  # missing the factor 2


bad_square = remat.custom_op("py_bad_square", square_forward, wrong_backward)


def mul_add_forward(ctx, a, b):
    ctx.save_for_backward(a, b)
    return a * b, a + b


def mul_add_backward(ctx, g_prod, g_sum):
    a, b = ctx.saved_tensors
    return g_prod * b + g_sum, g_prod * a + g_sum


mul_add = remat.custom_op("py_mul_add", mul_add_forward, mul_add_backward)


def test_square_values_and_gradient():
    assert square.name == "py_square"
    x = remat.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = square(x)
    assert y.grad_fn == "py_square"
    assert y.tolist() == [1.0, 4.0, 9.0]
    y.sum().backward()
    assert x.grad.tolist() == [2.0, -4.0, 6.0]


def test_two_outputs():
    a = remat.tensor([1.0, 2.0], requires_grad=True)
    b = remat.tensor([3.0, 5.0], requires_grad=True)
    p, s = mul_add(a, b)
    assert p.tolist() == [3.0, 10.0] and s.tolist() == [4.0, 7.0]
    (p.sum() + (s * s).sum()).backward()
    # d/da = b + 2s, d/db = a + 2s
    assert a.grad.tolist() == [11.0, 19.0]
    assert b.grad.tolist() == [9.0, 16.0]


def test_gradcheck_passes_for_correct_op():
    remat.manual_seed(0)
    r = remat.gradcheck(lambda t: square(t), [remat.randn((3, 4), requires_grad=True)])
    assert r and r.ok
    assert r.checked > 0
    assert list(r.failures) == []
    assert r.max_abs_error < 1e-2
    r2 = remat.gradcheck(lambda a, b: mul_add(a, b)[0] * 2.0 + mul_add(a, b)[1],
                         [remat.randn((2, 3), requires_grad=True), remat.randn((2, 3), requires_grad=True)])
    assert r2.ok, r2.report()


def test_gradcheck_fails_for_wrong_backward():
    remat.manual_seed(0)
    r = remat.gradcheck(lambda t: bad_square(t), [remat.randn((3, 4), requires_grad=True)])
    assert not r
    assert not r.ok
    assert len(r.failures) > 0
    assert "numeric" in r.failures[0] and "analytic" in r.failures[0]
    assert "failed" in r.report()


def test_gradcheck_function_must_return_one_tensor():
    with pytest.raises(ValueError, match="one tensor"):
        remat.gradcheck(lambda a: (a * 2.0, a * 3.0), [remat.randn((2,), requires_grad=True)])


def test_needs_input_grad_and_none_gradients():
    flags = []

    def fwd(ctx, a, b):
        flags.append((ctx.needs_input_grad(0), ctx.needs_input_grad(1)))
        ctx.save_for_backward(a, b)
        return a * b

    def bwd(ctx, g):
        a, b = ctx.saved_tensors
        return g * b, None  # no gradient for b

    op = remat.custom_op("py_mul_a_only", fwd, bwd)
    a = remat.tensor([1.0, 2.0], requires_grad=True)
    b = remat.tensor([3.0, 4.0])
    op(a, b).sum().backward()
    assert flags == [(True, False)]
    assert a.grad.tolist() == [3.0, 4.0]
    assert b.grad is None


@pytest.mark.parametrize("reentrant", [False, True])
def test_custom_op_inside_checkpoint_same_grads(reentrant):
    def data():
        remat.manual_seed(1)
        return remat.randn((3, 4)), remat.randn((4, 4), requires_grad=True)

    def blk(t, w):
        p, s = mul_add(square(t @ w), t)
        return p + s.tanh()

    x, w = data()
    (blk(x, w) * 1.0).sum().backward()
    ref = np.asarray(w.grad).copy()
    remat.reset_checkpoint_counters()
    x, w = data()
    remat.checkpoint(blk, x, w, reentrant=reentrant).sum().backward()
    assert np.array_equal(np.asarray(w.grad), ref)
    assert remat.checkpoint_counters()["replays"] == 1


def test_custom_op_inside_checkpoint_with_policy_same_grads():
    remat.manual_seed(2)
    x, w = remat.randn((3, 4)), remat.randn((4, 4), requires_grad=True)
    blk = lambda t, u: square(remat.silu(t @ u))  # noqa: E731
    blk(x, w).sum().backward()
    ref = np.asarray(w.grad).copy()
    w.grad = None
    remat.checkpoint(blk, x, w, policy=remat.save_matmul_outputs()).sum().backward()
    assert np.array_equal(np.asarray(w.grad), ref)


@pytest.mark.parametrize("n_grads", [1, 3])
def test_backward_returning_wrong_number_of_gradients_raises(n_grads):
    op = remat.custom_op("py_wrong_count", mul_add_forward,
                         lambda ctx, g1, g2: g1 if n_grads == 1 else (g1, g1, g1))
    a = remat.tensor([1.0, 2.0], requires_grad=True)
    b = remat.tensor([3.0, 5.0], requires_grad=True)
    p, s = op(a, b)
    with pytest.raises(remat.AutogradError, match=f"returned {n_grads} gradients for 2 inputs"):
        (p.sum() + s.sum()).backward()
    # the engine still works
    a.grad = None
    p, s = mul_add(a, b)
    (p + s).sum().backward()
    assert a.grad.tolist() == [4.0, 6.0]


def test_forward_returning_wrong_type_raises_type_error():
    op = remat.custom_op("py_bad_forward", lambda ctx, a: "x", lambda ctx, g: g)
    with pytest.raises(TypeError, match="py_bad_forward' forward must return a remat.Tensor"):
        op(remat.ones(2))


def test_backward_returning_wrong_type_raises_type_error():
    op = remat.custom_op("py_bad_backward", lambda ctx, a: a * 2.0, lambda ctx, g: [g, 3])
    a = remat.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match="py_bad_backward' backward must return remat.Tensor values"):
        op(a).sum().backward()


def test_exceptions_in_forward_and_backward_propagate():
    def fwd(ctx, a):
        raise KeyError("forward failed")

    with pytest.raises(KeyError, match="forward failed"):
        remat.custom_op("py_raise_fwd", fwd, lambda ctx, g: g)(remat.ones(2))
    op = remat.custom_op("py_raise_bwd", lambda ctx, a: a * 1.0, lambda ctx, g: 1 / 0)
    a = remat.tensor([1.0], requires_grad=True)
    with pytest.raises(ZeroDivisionError):
        op(a).sum().backward()
    (square(a)).sum().backward()
    assert a.grad.tolist() == [2.0]


def test_ctx_attribute_rules():
    def bwd_sets(ctx, g):
        ctx.other = 1
        return g

    op = remat.custom_op("py_set_in_backward", lambda ctx, a: a * 1.0, bwd_sets)
    a = remat.tensor([1.0], requires_grad=True)
    with pytest.raises(remat.AutogradError, match="set attributes on ctx in forward"):
        op(a).sum().backward()
    op2 = remat.custom_op("py_missing_attr", lambda ctx, a: a * 1.0, lambda ctx, g: g * ctx.missing)
    with pytest.raises(AttributeError, match="missing"):
        op2(a).sum().backward()


def test_ctx_is_invalid_after_the_call():
    kept = []

    def fwd(ctx, a):
        kept.append(ctx)
        assert ctx.op == "py_keep_ctx"
        return a * 2.0

    op = remat.custom_op("py_keep_ctx", fwd, lambda ctx, g: g * 2.0)
    op(remat.ones(2))
    with pytest.raises(remat.AutogradError, match="after the forward or backward call"):
        kept[0].save_for_backward(remat.ones(2))
    with pytest.raises(remat.AutogradError):
        kept[0].op


def test_mark_non_differentiable():
    def fwd(ctx, a):
        idx = remat.arange(2)
        out = a * 2.0
        ctx.mark_non_differentiable(idx)
        return out, idx

    op = remat.custom_op("py_non_diff", fwd, lambda ctx, g, gi: g * 2.0)
    a = remat.tensor([1.0, 2.0], requires_grad=True)
    out, idx = op(a)
    assert not idx.requires_grad
    out.sum().backward()
    assert a.grad.tolist() == [2.0, 2.0]


def test_custom_op_functions_are_released():
    class Fwd:
        def __call__(self, ctx, a):
            ctx.save_for_backward(a)
            return a * 1.0

    fwd = Fwd()
    ref = weakref.ref(fwd)
    op = remat.custom_op("py_released", fwd, lambda ctx, g: g)
    del fwd
    a = remat.tensor([1.0], requires_grad=True)
    y = op(a)
    y.sum().backward()
    del op, y
    gc.collect()
    assert ref() is None

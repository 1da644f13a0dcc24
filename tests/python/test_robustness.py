"""Misuse that must end in a clear Python exception, never a crash or a
silent wrong answer (found by reviewing the bindings): memory a NumPy view
or a DLPack capsule reads outliving an in-place move of its tensor, scopes
left on the wrong thread or out of order, shapes whose byte count
overflows, values of the wrong type, nested memory recordings, NumPy
operators taking over remat's."""
import math
import threading

import numpy as np
import pytest
import torch

import remat


def test_numpy_and_dlpack_views_keep_the_memory_of_a_tensor_moved_in_place():
    m = remat.DecoderModel("tiny", seed=0)
    name, p = m.named_parameters()[0]
    before = p.detach().numpy().copy()
    n = p.detach().numpy()
    d = torch.from_dlpack(p.detach())
    m.to("meta")  # every parameter's storage replaced in place
    junk = [remat.full((before.size,), 12345.0) for _ in range(8)]  # would reuse freed blocks
    assert np.array_equal(n, before) and np.array_equal(d.numpy(), before), name
    n[...] = 7.0  # writes into the old storage, not into junk
    assert all(j[0].item() == 12345.0 for j in junk)


def test_tensors_that_require_grad_are_not_exported_writable():
    x = remat.ones((2,), requires_grad=True)
    with pytest.raises(remat.AutogradError, match="detach"):
        x.numpy()
    with pytest.raises(remat.AutogradError, match="detach"):
        np.asarray(x)
    with pytest.raises(remat.AutogradError, match="detach"):
        x.__dlpack__()
    assert x.tolist() == [1.0, 1.0] and np.asarray(x.detach()).tolist() == [1.0, 1.0]


def test_a_scope_left_on_another_thread_raises_and_stays_open():
    s = remat.saved_tensors_hooks(lambda t: t, lambda t: t)
    s.__enter__()
    errors = []

    def leave():
        try:
            s.__exit__(None, None, None)
        except ValueError as e:
            errors.append(str(e))

    th = threading.Thread(target=leave)
    th.start()
    th.join()
    assert errors and "thread that entered it" in errors[0]
    s.__exit__(None, None, None)  # the right thread closes it
    x = remat.ones((2,), requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_scopes_left_out_of_order_raise():
    a = remat.disable_saved_tensors_hooks()
    b = remat.saved_tensors_hooks(lambda t: t, lambda t: t)
    a.__enter__()
    b.__enter__()
    with pytest.raises(ValueError, match="innermost first"):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    g = remat.no_grad()
    g.__enter__()
    del g  # collected while open, innermost on its thread: closed
    assert remat.is_grad_enabled()


def test_shapes_whose_bytes_overflow_are_shape_errors():
    with pytest.raises(remat.ShapeError, match="64-bit"):
        remat.zeros((2**62, 4))
    with pytest.raises(remat.ShapeError, match="outside dim 0"):
        remat.zeros(4).narrow(0, 1, 2**63 - 1)
    with pytest.raises(TypeError):
        remat.zeros(2**64)


def test_values_of_the_wrong_type_are_type_errors_naming_them():
    t = remat.zeros((2, 3))
    with pytest.raises(TypeError, match="list"):
        t[0] = [1, 2, 3]
    with pytest.raises(TypeError):
        remat.DecoderModel("tiny").set_plan(5)
    with pytest.raises(TypeError):
        remat.linear(t, remat.zeros((4, 3)), bias=1)
    with pytest.raises(TypeError, match="bool"):
        t[True]
    assert remat.zeros(np.int64(3)).shape == (3,) and t[np.int64(1)].shape == (3,)
    assert remat.zeros((np.int32(2), 2)).shape == (2, 2)


def test_numpy_operators_do_not_take_over():
    t = remat.ones((3,))
    with pytest.raises(TypeError):
        t + np.ones(3)
    with pytest.raises(TypeError):
        np.ones(3) + t
    with pytest.raises(ValueError, match="finite"):
        int(remat.tensor([math.nan]))


def test_nested_recordings_of_one_allocator_are_refused():
    with remat.record_memory() as outer:
        with pytest.raises(remat.Error, match="already being recorded"):
            with remat.record_memory():
                pass
        remat.ones((1024,))
    assert len(outer.events()) > 2


def test_config_and_options_are_copies():
    m = remat.DecoderModel("tiny")
    c = m.config
    c.n_layers = 99
    assert m.config.n_layers == 4
    t = remat.Trainer(config="tiny", steps=1, batch=2, seq=16, eval_every=0, threads=1)
    o = t.options
    o.steps = 50
    assert t.options.steps == 1


def test_custom_op_ctx_keeps_tensors_detached():
    def fwd(ctx, x):
        y = x * 2.0
        ctx.y = y  # no cycle through y's history
        return y

    def bwd(ctx, g):
        assert not ctx.y.requires_grad
        return g * 2.0

    op = remat.custom_op("double_keep", fwd, bwd)
    x = remat.ones((2,), requires_grad=True)
    op(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]

"""Saved-tensor hooks written in Python: pack/unpack with SaveInfo, the
wants filter, stacking with checkpoint regions (bit-identical gradients), and
errors from pack and unpack."""
import gc
import weakref

import numpy as np
import pytest

import remat
from remat_test_util import assert_bit_identical, block, grads, params


def reference_grads():
    ts = params()
    y = block(*ts)
    (y * y).sum().backward()
    return grads(ts)


def test_pack_unpack_counts_bytes_with_info():
    packed, unpacked = [], []

    def pack(t, info):
        assert isinstance(info, remat.SaveInfo)
        packed.append((info.op, info.shape, info.bytes, info.dtype))
        assert info.shape == t.shape and info.dtype == t.dtype
        assert info.bytes == t.nbytes
        return ("mine", t)

    def unpack(obj, info):
        assert obj[0] == "mine"
        unpacked.append(info.op)
        return obj[1]

    ts = params()
    with remat.saved_tensors_hooks(pack, unpack, with_info=True):
        y = block(*ts)
        loss = (y * y).sum()
    ops = [p[0] for p in packed]
    assert "matmul" in ops and "silu" in ops
    total = sum(p[2] for p in packed)
    # x [4,16] saved for linear 1, h [4,32] for silu and (activated) for linear 2, y for y*y: all f32
    assert total >= (4 * 16 + 4 * 32 + 4 * 32) * 4
    assert all(p[3] == remat.f32 for p in packed)
    loss.backward()
    assert sorted(unpacked) == sorted(ops)
    assert_bit_identical(grads(ts), reference_grads())


def test_pack_without_info_and_repr():
    infos = []
    with remat.saved_tensors_hooks(lambda t: t, lambda p: p, with_info=False):
        pass
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.saved_tensors_hooks(lambda t, i: infos.append(i) or t, lambda p, i: p, with_info=True):
        (x * x).sum().backward()
    assert infos and "remat.SaveInfo(op=mul" in repr(infos[0])
    assert x.grad.tolist() == [2.0, 4.0]


def test_hooks_only_apply_inside_the_scope():
    calls = []
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.saved_tensors_hooks(lambda t: calls.append(1) or t, lambda p: p):
        y = x * x
    n = len(calls)
    assert n > 0
    z = (y * x).sum()  # outside: not packed
    assert len(calls) == n
    z.backward()
    assert x.grad.tolist() == [3.0, 12.0]


def test_wants_filters_saves():
    asked = []

    def wants(t, info):
        asked.append(info.op)
        return info.op == "exp"

    taken = []
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.saved_tensors_hooks(lambda t, i: taken.append(i.op) or t, lambda p, i: p,
                                   wants=wants, with_info=True):
        z = (x * x).exp().sum()
    assert "mul" in asked and "exp" in asked
    assert taken == ["exp"]
    z.backward()
    xa = np.array([1.0, 2.0], np.float32)
    np.testing.assert_allclose(np.asarray(x.grad), 2 * xa * np.exp(xa * xa), rtol=1e-6)


def test_hook_that_copies_to_numpy_and_back():
    """A pack that moves the bytes out into a NumPy array and an unpack that
    wraps them again: bit-identical gradients."""
    def pack(t):
        return np.array(np.asarray(t.contiguous()), copy=True)

    def unpack(a):
        return remat.from_numpy(a)

    ts = params()
    with remat.saved_tensors_hooks(pack, unpack):
        y = block(*ts)
        loss = (y * y).sum()
    loss.backward()
    assert_bit_identical(grads(ts), reference_grads())


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("hook_outside", [True, False])
def test_hook_stacked_with_checkpoint_bit_identical(reentrant, hook_outside):
    ref = reference_grads()
    seen = []

    def pack(t, info):
        seen.append(info.op)
        return t

    def unpack(t, info):
        return t

    ts = params()
    hooks = remat.saved_tensors_hooks(pack, unpack, with_info=True)
    if hook_outside:
        with hooks:
            y = remat.checkpoint(block, *ts, reentrant=reentrant)
            loss = (y * y).sum()
    else:
        def region(*a):
            with remat.saved_tensors_hooks(pack, unpack, with_info=True):
                return block(*a)
        y = remat.checkpoint(region, *ts, reentrant=reentrant)
        loss = (y * y).sum()
    loss.backward()
    assert seen, "the hook saw no save"
    assert_bit_identical(grads(ts), ref)


def test_unpack_returning_wrong_type_raises_type_error_then_backward_works():
    x = remat.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    with remat.saved_tensors_hooks(lambda t: t, lambda p: "not a tensor", name="bad_unpack"):
        y = (x * x).sum()
    with pytest.raises(TypeError, match="unpack must return a remat.Tensor") as info:
        y.backward()
    assert "bad_unpack" in str(info.value) and "str" in str(info.value)
    # a fresh graph, no hooks
    x.grad = None
    (x * x).sum().backward()
    assert np.asarray(x.grad).tolist() == [[2.0, 4.0], [6.0, 8.0]]


def test_unpack_wrong_shape_is_caught_by_the_engine():
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.saved_tensors_hooks(lambda t: t, lambda p: remat.ones((5,))):
        y = (x * x).sum()
    with pytest.raises(remat.Error):
        y.backward()
    x.grad = None
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_pack_raising_propagates_same_exception_type():
    class PackError(Exception):
        pass

    def pack(t):
        raise PackError("pack refused")

    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(PackError, match="pack refused"):
        with remat.saved_tensors_hooks(pack, lambda p: p):
            (x * x).sum()
    # the scope was popped and the engine works
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_unpack_raising_propagates_same_exception_type():
    x = remat.tensor([1.0, 2.0], requires_grad=True)

    def unpack(p):
        raise LookupError("unpack refused")

    with remat.saved_tensors_hooks(lambda t: t, unpack):
        y = (x * x).sum()
    with pytest.raises(LookupError, match="unpack refused"):
        y.backward()
    x.grad = None
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_disable_saved_tensors_hooks():
    calls = []
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.saved_tensors_hooks(lambda t: calls.append(1) or t, lambda p: p):
        with remat.disable_saved_tensors_hooks():
            y = (x * x).sum()
    assert calls == []
    y.backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_hooks_and_packed_objects_are_released():
    class Pack:
        def __call__(self, t):
            p = Packed()
            p.t = t
            packed.append(weakref.ref(p))
            return p

    class Packed:
        pass

    packed = []
    pack = Pack()
    pack_ref = weakref.ref(pack)
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.saved_tensors_hooks(pack, lambda p: p.t):
        y = (x * x * x).sum()
    y.backward()
    del y, pack
    gc.collect()
    assert packed and all(r() is None for r in packed)
    assert pack_ref() is None


def test_saved_bytes_report():
    remat.reset_saved_bytes_peak()
    x = remat.randn((64, 64), requires_grad=True)
    y = (x * x).exp().sum()
    live = remat.saved_bytes()
    assert live["live_bytes"] >= 2 * 64 * 64 * 4
    assert live["live_count"] >= 2
    assert "mul" in live["bytes_by_op"] and "exp" in live["bytes_by_op"]
    y.backward()
    after = remat.saved_bytes()
    assert after["live_bytes"] < live["live_bytes"]
    assert after["peak_bytes"] >= live["live_bytes"]

"""remat.checkpoint from Python (non-reentrant with early stop, reentrant,
selective policies), plans, and the offload / compress / dynamic-remat
scopes: gradients bit-identical to the run without them (compress: close)."""
import functools

import numpy as np
import pytest

import remat
from remat_test_util import assert_bit_identical, block, grads, params


def run(wrap=None, **kw):
    ts = params()
    y = remat.checkpoint(block, *ts, **kw) if wrap is None else wrap(*ts)
    (y * y).sum().backward()
    return grads(ts)


@pytest.fixture(scope="module")
def ref():
    return run(wrap=block)


def must_save_matmul(op):
    return remat.SaveDecision.must_save if op == "matmul" else remat.SaveDecision.must_recompute


POLICIES = {
    "none": None,
    "list": ["matmul"],
    "tuple": ("matmul",),
    "callable_decision": must_save_matmul,
    "callable_bool": lambda op: op == "silu",
    "save_matmul_outputs": remat.save_matmul_outputs(),
    "save_ops": remat.save_ops(["matmul"]),
    "recompute_all": remat.recompute_all(),
}


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_non_reentrant_with_policies_bit_identical(ref, policy, early_stop):
    remat.reset_checkpoint_counters()
    g = run(policy=POLICIES[policy], early_stop=early_stop)
    assert_bit_identical(g, ref)
    c = remat.checkpoint_counters()
    assert c["regions"] == 1 and c["replays"] == 1, c
    if policy in ("list", "tuple", "callable_decision", "save_matmul_outputs", "save_ops"):
        assert c["ops_skipped"] > 0, c  # the replay reused the saved matmul outputs


def test_default_checkpoint_stops_early(ref):
    """The non-reentrant default stops the replay once the last needed save is
    regenerated: the early stop crosses the Python region function."""
    remat.reset_checkpoint_counters()
    ts = params()
    y = remat.checkpoint(block, *ts)
    (y * y).sum().backward()
    assert_bit_identical(grads(ts), ref)
    c = remat.checkpoint_counters()
    assert c["replays"] == 1 and c["early_stops"] == 1, c
    assert c["tensors_regenerated"] > 0 and c["bytes_regenerated"] > 0 and c["replay_ms"] >= 0


def test_early_stop_passes_through_user_try_except(ref):
    """A region whose code catches Exception (and runs finally blocks) still
    stops early and gives the same gradients."""
    finals = []

    def region(x, w1, w2):
        try:
            return block(x, w1, w2)
        except Exception:  # must not swallow the replay's early stop
            raise AssertionError("the early stop was caught as an Exception")
        finally:
            finals.append(1)

    remat.reset_checkpoint_counters()
    ts = params()
    y = remat.checkpoint(region, *ts)
    (y * y).sum().backward()
    assert_bit_identical(grads(ts), ref)
    assert finals == [1, 1]  # forward and replay
    assert remat.checkpoint_counters()["replays"] == 1


def test_reentrant_bit_identical(ref):
    remat.reset_checkpoint_counters()
    assert_bit_identical(run(reentrant=True), ref)
    c = remat.checkpoint_counters()
    assert c["regions"] == 1 and c["replays"] == 1 and c["ops_recomputed"] >= 3, c


def test_counters_count_each_replay():
    remat.reset_checkpoint_counters()
    for _ in range(3):
        run()
    c = remat.checkpoint_counters()
    assert c["regions"] == 3 and c["replays"] == 3, c
    remat.reset_checkpoint_counters()
    assert remat.checkpoint_counters()["replays"] == 0


def test_nested_and_sequential_regions_bit_identical():
    def two_blocks(wrap):
        remat.manual_seed(9)
        x = remat.randn((4, 16), requires_grad=True)
        ws = [remat.randn((16, 16), requires_grad=True) for _ in range(4)]
        h = x
        for i in range(0, 4, 2):
            h = wrap(lambda a, u, v: remat.silu(remat.linear(remat.silu(remat.linear(a, u)), v)), h, ws[i], ws[i + 1])
        (h * h).sum().backward()
        return grads([x] + ws)

    ref = two_blocks(lambda f, *a: f(*a))
    assert_bit_identical(two_blocks(lambda f, *a: remat.checkpoint(f, *a)), ref)
    assert_bit_identical(two_blocks(lambda f, *a: remat.checkpoint(f, *a, reentrant=True)), ref)

    def nested(f, a, u, v):
        inner = lambda b, w: remat.silu(remat.linear(b, w))  # noqa: E731
        return remat.checkpoint(lambda b, w1, w2: inner(remat.checkpoint(inner, b, w1), w2), a, u, v)

    assert_bit_identical(two_blocks(nested), ref)


def test_multiple_outputs_and_weights_captured_by_closure():
    remat.manual_seed(4)
    x = remat.randn((3, 8), requires_grad=True)
    w = remat.randn((8, 8), requires_grad=True)

    def region(a):  # w is not an input: the graph still reaches it
        h = a @ w
        return remat.silu(h), h.tanh()

    def loss(p, q):
        return (p * q).sum() + p.sum()

    loss(*region(x)).backward()
    ref = grads([x, w])
    x.grad = None
    w.grad = None
    p, q = remat.checkpoint(region, x)
    loss(p, q).backward()
    assert_bit_identical(grads([x, w]), ref)


def test_random_ops_replay_the_same_draws():
    remat.manual_seed(5)
    x = remat.randn((8, 32), requires_grad=True)

    def region(a):
        return remat.dropout(remat.silu(a), 0.5)

    remat.manual_seed(77)
    (region(x) * x).sum().backward()
    ref = grads([x])
    x.grad = None
    remat.manual_seed(77)
    (remat.checkpoint(region, x) * x).sum().backward()
    assert_bit_identical(grads([x]), ref)


def test_policy_exception_surfaces_and_next_call_works(ref):
    def bad_policy(op):
        raise ZeroDivisionError("policy failed for " + op)

    with pytest.raises(ZeroDivisionError, match="policy failed"):
        run(policy=bad_policy)
    with pytest.raises(TypeError, match="SaveDecision or a bool"):
        run(policy=lambda op: 3)
    assert remat.is_grad_enabled()
    assert_bit_identical(run(), ref)
    assert_bit_identical(run(policy=["matmul"]), ref)


def test_region_exception_surfaces_and_next_call_works(ref):
    calls = []

    def flaky(x, w1, w2):
        calls.append(1)
        if len(calls) == 2:  # the replay
            raise OSError("replay failed")
        return block(x, w1, w2)

    ts = params()
    y = remat.checkpoint(flaky, *ts)
    with pytest.raises(OSError, match="replay failed"):
        (y * y).sum().backward()
    assert_bit_identical(run(), ref)


def test_checkpoint_argument_errors():
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match="argument 1 is a float"):
        remat.checkpoint(lambda a, b: a * b, x, 3.0)
    with pytest.raises(TypeError, match="must return a remat.Tensor"):
        remat.checkpoint(lambda a: 3, x)
    with pytest.raises(TypeError, match="policy"):
        remat.checkpoint(lambda a: a * 2.0, x, policy=42)
    with pytest.raises(remat.Error, match="reentrant region takes no selective policy"):
        remat.checkpoint(lambda a: a * 2.0, x, reentrant=True, policy=["matmul"])
    y = remat.checkpoint(functools.partial(lambda s, a: a * s, 3.0), x)  # the suggested fix works
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_nondeterministic_region_raises_mismatch():
    calls = []

    def region(a):
        calls.append(1)
        return (a * a).sum() if len(calls) == 1 else (a * a * a).sum()

    x = remat.tensor([1.0, 2.0], requires_grad=True)
    y = remat.checkpoint(region, x, early_stop=False)
    with pytest.raises(remat.CheckpointMismatchError):
        y.backward()
    x.grad = None
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_checkpoint_under_no_grad_just_runs():
    remat.reset_checkpoint_counters()
    x = remat.tensor([1.0, 2.0], requires_grad=True)
    with remat.no_grad():
        y = remat.checkpoint(lambda a: a * 2.0, x)
    assert not y.requires_grad and y.tolist() == [2.0, 4.0]


def test_save_ops_rejects_ops_without_cached_outputs():
    with pytest.raises(remat.Error, match="silu.*valid ops: matmul"):
        remat.save_ops(["silu"])
    with pytest.raises(remat.Error, match="silu"):
        run(policy=["silu"])


def test_policy_objects():
    p = remat.save_matmul_outputs()
    assert p("matmul") in (remat.SaveDecision.must_save, remat.SaveDecision.prefer_save)
    assert p("silu") in (remat.SaveDecision.must_recompute, remat.SaveDecision.prefer_recompute)
    sdpa = "scaled_dot_product_attention"
    assert remat.save_ops([sdpa])(sdpa) in (remat.SaveDecision.must_save, remat.SaveDecision.prefer_save)
    assert remat.recompute_all()("matmul") in (remat.SaveDecision.must_recompute,
                                               remat.SaveDecision.prefer_recompute)


def test_builtin_policies_are_remat_policy_objects():
    """The built-in policies come back as remat.Policy (the class bound for
    them), not as anonymous callables."""
    for p in (remat.save_matmul_outputs(), remat.save_attention_outputs(), remat.recompute_all(),
              remat.save_ops(["matmul"])):
        assert isinstance(p, remat.Policy), type(p)


# --- plans --------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["none", "per_block", "uniform:2", "per_block+offload", "selected:1,3",
                                  "uniform:2+compress:bf16", "per_block:reentrant", "dynamic:1000000"])
def test_plan_parse_round_trip(spec):
    p = remat.Plan.parse(spec, 4)
    assert p.n_layers == 4
    again = remat.Plan.parse(str(p), 4)
    assert again == p
    assert str(again) == str(p)
    assert repr(p) == f'remat.Plan.parse("{p}")'


def test_plan_fields():
    assert remat.Plan.parse("none", 4).is_none()
    p = remat.Plan.parse("uniform:2+offload", 4)
    assert not p.is_none() and p.offload
    assert p.block_regions == [[0, 1], [2, 3]]
    assert remat.Plan.parse("per_block", 4) == remat.Plan.parse("uniform:1", 4)
    assert remat.Plan.parse("per_block", 4) != remat.Plan.parse("uniform:2", 4)


@pytest.mark.parametrize("spec,text", [("bogus", "unknown component 'bogus'"),
                                       ("selected:9", "block 9 does not exist")])
def test_plan_bad_spec(spec, text):
    with pytest.raises(remat.Error, match=text):
        remat.Plan.parse(spec, 4)


# --- offload, compress, dynamic remat ----------------------------------------

def test_offload_saved_tensors_bit_identical(ref, tmp_path):
    for synchronous in (False, True):
        ts = params()
        with remat.offload_saved_tensors(min_bytes=0, dir=str(tmp_path), synchronous=synchronous) as hooks:
            y = block(*ts)
            loss = (y * y).sum()
        loss.backward()
        assert_bit_identical(grads(ts), ref)
        s = hooks.stats()
        assert s["saves"] > 0 and s["bytes_taken"] > 0, s


def test_offload_stacked_with_checkpoint_bit_identical(ref):
    ts = params()
    with remat.offload_saved_tensors(min_bytes=0):
        y = remat.checkpoint(block, *ts)
        loss = (y * y).sum()
    loss.backward()
    assert_bit_identical(grads(ts), ref)


def test_python_hook_offload_and_checkpoint_stacked_bit_identical(ref):
    """Offload outside, a Python hook inside it, a checkpoint region inside
    that: the Python hook packs first (the innermost scope), offload takes
    the tensor it returns, and the gradients stay none's. (The other way
    round the Python hook would see nothing: offload packs tensors into its
    own records, and a Python hook is given tensors only.)"""
    seen = []
    ts = params()
    with remat.offload_saved_tensors(min_bytes=0) as hooks:
        with remat.saved_tensors_hooks(lambda t, info: (seen.append(info.op), t)[1], lambda t, info: t,
                                       with_info=True):
            y = remat.checkpoint(block, *ts)
            loss = (y * y).sum()
    loss.backward()
    assert_bit_identical(grads(ts), ref)
    assert hooks.stats()["saves"] > 0 and seen, (hooks.stats(), seen)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_compress_saved_tensors_close(ref, fmt):
    ts = params()
    with remat.compress_saved_tensors(fmt, all_saves=True, min_bytes=0):
        y = block(*ts)
        loss = (y * y).sum()
    loss.backward()
    got = grads(ts)
    tol = 0.02 if fmt == "bf16" else 0.2
    for u, v in zip(got, ref):
        rel = np.abs(u - v).max() / np.abs(v).max()
        assert rel < tol, rel
    if fmt == "bf16":
        assert any(not np.array_equal(u, v) for u, v in zip(got, ref)), "bf16 saves changed nothing"


def test_compress_bad_format_raises():
    with pytest.raises(remat.Error):
        remat.compress_saved_tensors("int3")


def dtr_model(seed=5):
    remat.manual_seed(seed)
    x = remat.randn((64, 32), requires_grad=True)
    ws = [remat.randn((32, 32), requires_grad=True) for _ in range(6)]
    return [x] + ws


def dtr_loss(ts):
    h = ts[0]
    for w in ts[1:]:
        h = remat.silu(remat.linear(h, w))
    return (h * h).sum()


def test_dynamic_remat_small_budget_bit_identical():
    ts = dtr_model()
    dtr_loss(ts).backward()
    ref = grads(ts)
    del ts
    ts = dtr_model()
    # Room for the gradients (7 x 8 KiB at most) and a few saves: the ~100 KiB of saves do not fit.
    budget = remat.memory_stats()["allocated_bytes"] + 64 * 1024
    with remat.dynamic_remat(budget) as dtr:
        loss = dtr_loss(ts)
        loss.backward()
    assert_bit_identical(grads(ts), ref)
    s = dtr.stats()
    assert s["evictions"] > 0 and s["rebuilds"] > 0 and s["evicted_bytes"] > 0, s


def test_dynamic_remat_budget_too_small_raises_oom_then_works():
    ts = dtr_model()
    budget = remat.memory_stats()["allocated_bytes"] + 1024
    with pytest.raises(remat.OutOfMemoryError, match="budget"):
        with remat.dynamic_remat(budget):
            dtr_loss(ts).backward()
    for t in ts:
        t.grad = None
    dtr_loss(ts).backward()
    assert all(t.grad is not None for t in ts)

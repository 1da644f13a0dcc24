"""Models and training from Python: DecoderModel under recompute plans
(bit-identical gradients), memory recording, the Trainer driven a step at a
time, remat.optim.AdamW in one's own loop, generation, tokenizers, batches
and Hugging Face folders."""
import gc
import math
import os
import subprocess

import numpy as np
import pytest

import remat
from remat_test_util import REPO_ROOT, assert_isolated_ok

VOCAB = 256  # tiny's


def uniform_tokens(batch=2, seq=32, seed=0):
    rng = np.random.default_rng(seed)
    return remat.from_numpy(rng.integers(0, VOCAB, size=(batch, seq + 1), dtype=np.int64))


def loss_and_grads(plan, tokens, seed=7):
    model = remat.DecoderModel("tiny", seed=seed)
    model.set_plan(plan)
    out = model.forward_loss(tokens)
    out.loss.backward()
    return out.loss.item(), {n: np.asarray(p.grad).copy() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def tokens():
    return uniform_tokens()


@pytest.fixture(scope="module")
def reference(tokens):
    return loss_and_grads("none", tokens)


def test_config():
    cfg = remat.ModelConfig("tiny")
    assert cfg.name == "tiny" and cfg.vocab == VOCAB and cfg.n_layers == 4
    assert "tiny" in remat.ModelConfig.names()
    again = remat.ModelConfig.from_json(cfg.to_json())
    assert again.to_json() == cfg.to_json()
    cfg.n_layers = 2
    assert remat.DecoderModel(cfg).config.n_layers == 2
    with pytest.raises(remat.Error):
        remat.ModelConfig("no_such_config")
    with pytest.raises(TypeError, match="model config"):
        remat.DecoderModel(3)


def test_forward_loss_and_backward(reference):
    loss, grads = reference
    assert abs(loss - math.log(VOCAB)) < 0.5  # a fresh model is near uniform
    assert len(grads) > 10
    assert all(np.isfinite(g).all() for g in grads.values())
    assert any(np.abs(g).max() > 0 for g in grads.values())


def test_forward_logits_shape(tokens):
    model = remat.DecoderModel("tiny", seed=7)
    ids = remat.from_numpy(np.asarray(tokens)[:, :-1].copy())
    with remat.no_grad():
        logits = model(ids)
        assert model.forward(ids).shape == logits.shape
    assert logits.shape == (2, 32, VOCAB)
    out = model.forward_loss(tokens)
    assert out.loss.shape == () and out.ce.item() == pytest.approx(out.loss.item())


@pytest.mark.parametrize("plan", ["per_block", "uniform:2", "per_block:reentrant", "selected:1,3",
                                  "per_block+offload"])
def test_plan_gradients_bit_identical_to_none(tokens, reference, plan):
    ref_loss, ref_grads = reference
    loss, grads = loss_and_grads(plan, tokens)
    assert loss == ref_loss
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert np.array_equal(grads[name], ref_grads[name]), name


def test_set_plan_takes_a_plan_object(tokens, reference):
    model = remat.DecoderModel("tiny", seed=7)
    model.set_plan(remat.Plan.parse("per_block", 4))
    model.forward_loss(tokens).loss.backward()
    for name, p in model.named_parameters():
        assert np.array_equal(np.asarray(p.grad), reference[1][name]), name
    with pytest.raises(remat.Error):
        model.set_plan("bogus")


def test_same_batch_from_remat_batches_bit_identical(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    b = remat.batches(str(path), 2, 32, seed=3)
    assert b.vocab == VOCAB
    batch = next(b)
    assert batch.shape == (2, 33) and batch.dtype == remat.i64
    assert iter(b) is b
    again = next(remat.batches(str(path), 2, 32, seed=3))
    assert np.array_equal(np.asarray(batch), np.asarray(again))  # seeded
    l0, g0 = loss_and_grads("none", batch)
    l1, g1 = loss_and_grads("per_block", batch)
    assert l0 == l1
    for name in g0:
        assert np.array_equal(g0[name], g1[name]), name


def test_batches_from_token_shards(tmp_path):
    """remat.batches over shards `./remat tokenize` wrote: the shards'
    vocabulary, and every row a window of the text's token ids."""
    tok_path = os.path.join(REPO_ROOT, "tests/tokenizer/data/qwen3/tokenizer.json")
    text = " ".join(f"In the beginning {i} God created the heaven and the earth." for i in range(300))
    (tmp_path / "text.txt").write_text(text)
    subprocess.run([os.path.join(REPO_ROOT, "bazel-bin/tools/remat"), "tokenize", "--tokenizer", tok_path,
                    "--data", str(tmp_path / "text.txt"), "--out", str(tmp_path / "shards")],
                   check=True, stdout=subprocess.DEVNULL)
    ids = remat.Tokenizer(tok_path).encode(text)
    b = remat.batches(str(tmp_path / "shards"), 3, 16, seed=1)
    assert b.vocab == remat.Tokenizer(tok_path).vocab_size
    joined = ",".join(map(str, ids))
    for _ in range(2):
        batch = next(b)
        assert batch.shape == (3, 17) and batch.dtype == remat.i64
        for row in batch.numpy().tolist():
            assert ",".join(map(str, row)) in joined, row  # a window of the document's ids


def test_record_memory_html(tokens):
    model = remat.DecoderModel("tiny", seed=1)
    with remat.record_memory() as rec:
        out = model.forward_loss(tokens)
        rec.mark("backward")
        out.loss.backward()
    html = rec.html()
    assert "<svg" in html
    assert "backward" in html
    assert rec.peak_bytes() > 0
    events = rec.events()
    assert events and {"kind", "size", "category", "allocated_after"} <= set(events[0])
    assert '"events"' in rec.json() or "events" in rec.json()
    with pytest.raises(remat.Error, match="outside the with-block"):
        rec.mark("late")


def test_record_memory_save_html(tmp_path):
    with remat.record_memory() as rec:
        x = remat.randn((64, 64), requires_grad=True)
        (x * x).sum().backward()
    path = tmp_path / "mem.html"
    rec.save_html(str(path))
    assert "<svg" in path.read_text()
    with pytest.raises(remat.IOError):
        rec.save_html(str(tmp_path / "no_such_dir" / "mem.html"))


def test_memory_stats_keys():
    s = remat.memory_stats()
    for key in ("allocated_bytes", "allocated_peak", "reserved_bytes", "reserved_peak", "requested_bytes",
                "num_allocs", "num_frees", "num_device_allocs", "cache_hits", "num_ooms", "categories",
                "categories_at_peak"):
        assert key in s, key
    assert {"parameter", "gradient", "activation", "recompute", "optimizer"} <= set(s["categories"])
    assert s["reserved_bytes"] >= s["allocated_bytes"] >= 0
    remat.reset_peak_memory_stats()
    assert remat.memory_stats()["allocated_peak"] == remat.memory_stats()["allocated_bytes"]
    assert isinstance(remat.memory_summary(), str)


def test_memory_category_scope():
    gc.collect()
    before = remat.memory_stats()["categories"]["optimizer"]
    with remat.memory_category(remat.MemoryCategory.optimizer):
        t = remat.zeros((1024,))
    assert remat.memory_stats()["categories"]["optimizer"] >= before + 4096
    del t
    assert remat.memory_stats()["categories"]["optimizer"] <= before


def test_trainer_steps():
    t = remat.Trainer(config="tiny", steps=3, batch=2, seq=32, eval_every=0, threads=1)
    assert t.steps_done == 0 and t.world_size == 1 and t.rank == 0
    assert t.options.steps == 3
    stats = [t.step() for _ in range(3)]
    for i, s in enumerate(stats, 1):
        assert isinstance(s, dict)
        assert s["step"] == i
        assert math.isfinite(s["loss"])
        assert "lr" in s and "grad_norm" in s and "step_ms" in s
    assert t.steps_done == 3
    assert t.model.config.name == "tiny"
    with pytest.raises(remat.Error, match="steps are done"):
        t.step()


def test_trainer_bad_flag_names_it():
    with pytest.raises(remat.Error, match="--bogus-flag"):
        remat.Trainer(config="tiny", bogus_flag=3)
    with pytest.raises(remat.Error, match="--steps"):
        remat.Trainer(config="tiny", steps="abc")


def test_trainer_options_from_args():
    o = remat.TrainOptions.from_args(["--config", "tiny", "--steps", "2", "--recompute", "per_block"])
    assert o.steps == 2 and o.recompute == "per_block"
    t = remat.Trainer(o)
    assert t.options.steps == 2


def test_trainer_with_recompute_and_save(tmp_path):
    common = dict(config="tiny", steps=2, batch=2, seq=32, eval_every=0, threads=1, seed=5)
    a = remat.Trainer(recompute="none", **common)
    b = remat.Trainer(recompute="per_block", **common)
    for _ in range(2):
        sa, sb = a.step(), b.step()
        assert sa["loss"] == sb["loss"]
    assert sb["recomputed_ops"] > 0 and sa["recomputed_ops"] == 0
    a.save(str(tmp_path / "ck"))
    assert os.listdir(tmp_path / "ck")


def test_trainer_auto_plan_under_a_budget():
    """recompute="auto" with memory_budget: the planner chooses a plan before
    the first step (options.recompute is it) and the steps run under it."""
    # (75%: the planner's margin for measurement spread leaves no plan at 50%
    # on a loaded machine now and then)
    t = remat.Trainer(config="tiny", recompute="auto", memory_budget="75%", steps=2, batch=2, seq=64,
                      eval_every=0, threads=1, profile_rounds=2)
    chosen = t.options.recompute
    assert chosen and chosen != "auto" and chosen != "none", chosen
    remat.Plan.parse(chosen, t.model.config.n_layers)  # a plan string the model takes
    assert [t.step()["step"] for _ in range(2)] == [1, 2]


def test_adamw_own_loop_decreases_loss(tokens):
    remat.manual_seed(0)
    model = remat.DecoderModel("tiny", seed=2)
    opt = remat.optim.AdamW(model.trainable_parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        out = model.forward_loss(tokens)
        out.loss.backward()
        norm = remat.clip_grad_norm(model.parameters(), 1.0)
        assert norm > 0
        opt.step()
        losses.append(out.loss.item())
    assert opt.steps == 5
    assert losses[-1] < losses[0] - 0.05, losses


def test_adamw_on_plain_tensors():
    w = remat.tensor([1.0, -2.0], requires_grad=True)
    opt = remat.optim.AdamW([w], lr=0.1, weight_decay=0.0)
    for _ in range(20):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    assert np.abs(np.asarray(w.detach())).max() < 1.0
    import remat.optim as optim_module  # importable as a submodule too
    assert optim_module.AdamW is remat.optim.AdamW


def test_adamw_rejects_what_is_not_a_parameter():
    with pytest.raises(remat.DTypeError, match="f32"):
        remat.optim.AdamW([remat.tensor([1, 2])])
    with pytest.raises(TypeError):  # not a tensor nor a (name, tensor) pair
        remat.optim.AdamW([3])


def test_generate_returns_ints():
    model = remat.DecoderModel("tiny", seed=3)
    ids = remat.generate(model, [1, 2, 3], max_new=5, temperature=0)
    assert isinstance(ids, list) and len(ids) == 5
    assert all(isinstance(i, int) and 0 <= i < VOCAB for i in ids)
    assert remat.generate(model, [1, 2, 3], max_new=5, temperature=0) == ids  # greedy is deterministic
    sampled = remat.generate(model, [1, 2, 3], max_new=4, temperature=1.0, top_k=10, seed=1)
    assert len(sampled) == 4 and all(isinstance(i, int) for i in sampled)


def test_tokenizer_round_trip():
    tok = remat.Tokenizer(os.path.join(REPO_ROOT, "tests/tokenizer/data/qwen3/tokenizer.json"))
    text = "Hello world, remat!"
    ids = tok.encode(text)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    assert tok.vocab_size > 100000
    with pytest.raises(remat.IOError):
        remat.Tokenizer("/nonexistent/tokenizer.json")


def test_load_hf_model(tmp_path):
    """A Hugging Face folder (written by ./remat train --save-hf) loads through
    remat.load_hf_model with the weights Trainer(model=DIR) loads; a missing
    folder raises remat.Error. In a child interpreter: a crash in the binding
    must not take the suite down."""
    hf = tmp_path / "hf"
    cli = os.path.join(REPO_ROOT, "bazel-bin", "tools", "remat")
    r = subprocess.run([cli, "train", "--config", "tiny", "--steps", "1", "--batch", "2", "--seq", "16",
                        "--threads", "1", "--eval-every", "0", "--progress", "off", "--save-hf", str(hf)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (hf / "config.json").exists()
    assert_isolated_ok(f"""
        import math, numpy as np, remat
        m = remat.load_hf_model({str(hf)!r}, batch=2, seq=16)
        assert m.config.n_layers == 4, m.config
        toks = remat.from_numpy(np.random.default_rng(0).integers(0, 256, (2, 17)).astype(np.int64))
        loss = m.forward_loss(toks).loss.item()
        assert math.isfinite(loss), loss
        t = remat.Trainer(model={str(hf)!r}, steps=1, batch=2, seq=16, eval_every=0, threads=1)
        other = t.model.forward_loss(toks).loss.item()
        assert abs(other - loss) <= 1e-6 * abs(loss), (other, loss)
        try:
            remat.load_hf_model({str(tmp_path / "missing")!r})
        except remat.Error as e:
            assert "missing" in str(e), str(e)
        else:
            raise AssertionError("no error for a missing folder")
        print("ok")
    """)

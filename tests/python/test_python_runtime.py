"""The module as a citizen of the Python runtime: the GIL is released while
remat computes (other Python threads run during Trainer.step and backward),
several Python threads can drive remat at once, and round trips between
NumPy and remat leak neither references nor memory."""
import gc
import sys
import threading
import time
import tracemalloc

import numpy as np

import remat


class Spinner:
    """A Python thread that records when it ran (perf_counter stamps)."""

    def __init__(self):
        self.stamps = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        stamps, now, stop = self.stamps, time.perf_counter, self._stop
        while not stop.is_set():
            stamps.append(now())

    def __enter__(self):
        self._thread.start()
        while not self.stamps:  # running before the caller's work starts
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def ran_between(self, t0, t1):
        return sum(1 for s in self.stamps if t0 < s < t1)


def test_gil_released_during_trainer_step():
    trainer = remat.Trainer(config="tiny", steps=3, batch=8, seq=128, eval_every=0, threads=1)
    trainer.step()  # warm-up (allocator, kernels)
    with Spinner() as spin:
        t0 = time.perf_counter()
        stats = trainer.step()
        t1 = time.perf_counter()
    assert stats["step"] == 2
    d = t1 - t0
    assert d > 0.02, f"the step took only {d * 1e3:.1f} ms: too short to measure"
    # The other thread ran in the middle of the step, away from where the GIL
    # changes hands at the call's start and end (the switch interval is 5 ms).
    middle = spin.ran_between(t0 + 0.25 * d, t1 - 0.25 * d)
    # (With the GIL held throughout, it cannot run there at all.)
    assert middle > 0, f"the other thread did not run in the middle of a {d * 1e3:.0f} ms step"


def test_gil_released_during_backward_and_forward_loss():
    model = remat.DecoderModel("tiny", seed=0)
    tokens = remat.from_numpy(np.random.default_rng(0).integers(0, 256, (8, 129)).astype(np.int64))
    model.forward_loss(tokens).loss.backward()  # warm-up
    with Spinner() as spin:
        t0 = time.perf_counter()
        out = model.forward_loss(tokens)
        t1 = time.perf_counter()
        out.loss.backward()
        t2 = time.perf_counter()
    for a, b, what in ((t0, t1, "forward_loss"), (t1, t2, "backward")):
        d = b - a
        if d > 0.02:  # long enough to see
            assert spin.ran_between(a + 0.25 * d, b - 0.25 * d) > 0, what


def test_python_threads_drive_remat_concurrently():
    results, errors = {}, []

    def work(k):
        try:
            out = []
            for _ in range(20):
                x = remat.tensor(np.full((8, 8), k + 1.0, np.float32), requires_grad=True)
                with remat.saved_tensors_hooks(lambda t: t, lambda p: p):
                    y = remat.checkpoint(lambda a: remat.silu(a @ a), x).sum()
                y.backward()
                out.append(np.asarray(x.grad).copy())
            results[k] = out
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    assert not errors, errors
    for k, out in results.items():
        assert len(out) == 20 and all(np.array_equal(out[0], o) for o in out), k
    assert not np.array_equal(results[0][0], results[1][0])


def test_numpy_round_trips_do_not_leak_references():
    a = np.ones((8, 8), dtype=np.float32)
    base = sys.getrefcount(a)
    t = remat.from_numpy(a)
    assert sys.getrefcount(a) == base + 1  # the tensor holds the array's buffer
    n = np.asarray(t)
    del t
    assert sys.getrefcount(a) == base + 1  # n -> tensor -> a
    del n
    assert sys.getrefcount(a) == base
    for _ in range(10000):
        back = np.asarray(remat.from_numpy(a))
        again = remat.from_numpy(back).numpy()
        del back, again
    gc.collect()
    assert sys.getrefcount(a) == base


def test_numpy_round_trips_keep_memory_flat():
    def rss_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4  # resident pages of 4 KiB

    def round_trips(n):
        for i in range(n):
            a = np.full(1024, float(i), dtype=np.float32)  # 4 KiB, new every time
            t = remat.from_numpy(a) * 2.0
            b = np.asarray(t)
            assert b[0] == 2.0 * i
            del a, t, b

    round_trips(500)  # warm-up: caches, allocator blocks
    gc.collect()
    tracemalloc.start()
    try:
        traced0 = tracemalloc.get_traced_memory()[0]
        rss0 = rss_kib()
        round_trips(10000)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced0
        rss = rss_kib() - rss0
    finally:
        tracemalloc.stop()
    # Leaking the arrays or the results would be 40 MB or more.
    assert traced < 1 << 20, f"Python-traced memory grew by {traced} bytes"
    assert rss < 16 * 1024, f"resident memory grew by {rss} KiB"


def test_allocated_bytes_return_to_baseline():
    gc.collect()
    base = remat.memory_stats()["allocated_bytes"]
    ts = [remat.zeros((16, 16)) for _ in range(10000)]
    assert remat.memory_stats()["allocated_bytes"] >= base + 10000 * 16 * 16 * 4
    del ts
    assert remat.memory_stats()["allocated_bytes"] <= base
    for _ in range(10000):
        x = remat.tensor(np.ones(8, dtype=np.float32), requires_grad=True)
        (x * 2.0).sum().backward()
        del x
    gc.collect()
    assert remat.memory_stats()["allocated_bytes"] <= base


def test_tensors_from_numpy_do_not_allocate():
    gc.collect()
    base = remat.memory_stats()["allocated_bytes"]
    a = np.ones((256, 256), dtype=np.float32)
    t = remat.from_numpy(a)
    assert remat.memory_stats()["allocated_bytes"] == base  # the array's memory, not the allocator's
    del t
    assert remat.memory_stats()["allocated_bytes"] == base

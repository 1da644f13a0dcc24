"""A checkpointed block's gradients in Python are bit-identical to the C++
API's for the same seed: tests/python/cpp_reference.cc runs
manual_seed(S); x, w1, w2 = randn [4,16], [32,16], [16,32];
y = checkpoint(linear(silu(linear(x, w1)), w2)); sum(y * y).backward()
and writes the raw f32 bytes of x.grad, w1.grad and w2.grad; this file does
the same through the module, the draws in the same order and shapes."""
import os
import subprocess

import numpy as np
import pytest

import remat
from remat_test_util import REPO_ROOT

CPP_REFERENCE = os.path.join(REPO_ROOT, "bazel-bin", "tests", "python", "cpp_reference")
SHAPES = [(4, 16), (32, 16), (16, 32)]


def cpp_grads(tmp_path, seed, reentrant):
    assert os.access(CPP_REFERENCE, os.X_OK), (
        f"{CPP_REFERENCE} is missing: bazel build //tests/python:cpp_reference")
    out = tmp_path / f"grads_{seed}_{reentrant}.bin"
    args = [CPP_REFERENCE, str(out), str(seed)] + (["reentrant"] if reentrant else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return out.read_bytes()


def python_grads(seed, reentrant):
    remat.manual_seed(seed)
    x = remat.randn((4, 16), requires_grad=True)
    w1 = remat.randn((32, 16), requires_grad=True)
    w2 = remat.randn((16, 32), requires_grad=True)

    def block(a, u, v):
        return remat.linear(remat.silu(remat.linear(a, u)), v)

    y = remat.checkpoint(block, x, w1, w2, reentrant=reentrant)
    remat.sum(y * y).backward()
    return b"".join(np.ascontiguousarray(np.asarray(t.grad), dtype=np.float32).tobytes() for t in (x, w1, w2))


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("seed", [1234, 7])
def test_checkpointed_block_grads_bit_identical_to_cpp(tmp_path, seed, reentrant):
    want = cpp_grads(tmp_path, seed, reentrant)
    assert len(want) == sum(a * b for a, b in SHAPES) * 4
    got = python_grads(seed, reentrant)
    assert len(got) == len(want)
    if got != want:
        g = np.frombuffer(got, np.float32)
        w = np.frombuffer(want, np.float32)
        bad = np.flatnonzero(g.view(np.uint32) != w.view(np.uint32))
        pytest.fail(f"{bad.size} of {g.size} gradient values differ from the C++ API's; first at {bad[0]}: "
                    f"python {g[bad[0]]!r} vs C++ {w[bad[0]]!r}")
    assert np.isfinite(np.frombuffer(got, np.float32)).all()


def test_seeds_change_the_gradients(tmp_path):
    assert cpp_grads(tmp_path, 1234, False) != cpp_grads(tmp_path, 7, False)

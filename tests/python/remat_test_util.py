"""Helpers the suite's test files share (not a test file itself)."""
import os
import subprocess
import sys
import textwrap

import numpy as np

import remat

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_DIR = os.path.join(REPO_ROOT, "bazel-bin", "python")


def run_isolated(code, timeout=120):
    """Runs `code` (dedented) in a fresh /usr/bin/python3 with the built module
    importable, and returns the CompletedProcess (text output). For checks
    whose failure could take the interpreter down (an abort or a crash in the
    extension), so that the rest of the suite still runs and reports."""
    env = dict(os.environ)
    env["PYTHONPATH"] = MODULE_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONFAULTHANDLER"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_isolated_ok(code, timeout=120):
    """run_isolated(code) must exit 0 (it asserts what it checks); on failure
    the message has its exit status (a negative one is the signal) and output."""
    r = run_isolated(code, timeout)
    assert r.returncode == 0, (f"isolated check exited with status {r.returncode}\n"
                               f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr[-4000:]}")
    return r


# A small seeded block the hook and checkpoint tests share: its inputs, the
# block, the gradients after a backward, and a bit-for-bit comparison.
def params(seed=3):
    remat.manual_seed(seed)
    x = remat.randn((4, 16), requires_grad=True)
    w1 = remat.randn((32, 16), requires_grad=True)
    w2 = remat.randn((16, 32), requires_grad=True)
    return x, w1, w2


def block(x, w1, w2):
    return remat.linear(remat.silu(remat.linear(x, w1)), w2)


def grads(ts):
    return [np.asarray(t.grad).copy() for t in ts]


def assert_bit_identical(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and u.shape == v.shape
        assert np.array_equal(u, v), f"max |diff| {np.abs(u - v).max()}"

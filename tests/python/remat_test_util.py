"""Helpers the suite's test files share (not a test file itself)."""
import os
import subprocess
import sys
import textwrap

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

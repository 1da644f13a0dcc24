"""pytest configuration for the `remat` Python module's suite (tests/python).

Puts the repository's bazel-bin/python (where `bazel build //python:remat.so`
leaves remat.so) first on sys.path, so `import remat` finds the module built
from this tree, and prints the summary line tools/run_tests.sh adds up:

    remat-tests: N passed, M failed, K skipped

(failed counts errors too: a collection error, or a fixture that raised).
"""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_DIR = os.path.join(REPO_ROOT, "bazel-bin", "python")
if MODULE_DIR in sys.path:
    sys.path.remove(MODULE_DIR)
sys.path.insert(0, MODULE_DIR)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    n = lambda key: len(stats.get(key, []))  # noqa: E731
    # (the suite marks nothing xfail; an xpass would count as passed, an xfail as skipped)
    passed = n("passed") + n("xpassed")
    failed = n("failed") + n("error")
    skipped = n("skipped") + n("xfailed")
    terminalreporter.write_line(f"remat-tests: {passed} passed, {failed} failed, {skipped} skipped")

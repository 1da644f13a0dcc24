#!/usr/bin/env bash
# The `remat` Python module's pytest suite (tests/python/test_*.py): tensors
# and NumPy zero-copy interop, autograd, saved-tensor hooks, checkpoint
# regions and policies, custom ops, models and the Trainer, the GIL and
# reference counts, and gradients bit-identical to the C++ API's
# (cpp_reference.cc). Builds //python:remat.so, //tests/python:cpp_reference
# and //tools:remat (it writes a Hugging Face folder to load) only if one is
# missing (the suite's runner builds //... first), then runs pytest with
# /usr/bin/python3, OMP_NUM_THREADS=1, and exits with its status.
# tests/python/conftest.py prints the summary line tools/run_tests.sh adds up.
# remat-test-timeout: 1800
set -u
cd "$(dirname "$(readlink -f "$0")")/../.." || exit 1

targets=(//python:remat.so //tests/python:cpp_reference //tools:remat)
if [ ! -e bazel-bin/python/remat.so ] || [ ! -x bazel-bin/tests/python/cpp_reference ] ||
   [ ! -x bazel-bin/tools/remat ]; then
  echo "building ${targets[*]} (missing)"
  bazel build --noshow_progress "${targets[@]}" || {
    echo "build failed"
    echo "remat-tests: 0 passed, 1 failed, 0 skipped"
    exit 1
  }
fi

export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1  # (no __pycache__ in the tree)
/usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python

#!/usr/bin/env bash
# Cross-check: ./remat dump for `tiny` and `tiny-moe` (two seeds each)
# against the independent PyTorch reference (tools/reference/reference.py,
# Debian's python3-torch): loss.ce and loss.aux to 1e-5 relative (aux to 1e-7
# absolute where the reference's is 0), every gradient, router and experts
# included, to 1e-4 (max diff / max value).
# Prints the summary line tools/run_tests.sh adds up.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for config in tiny tiny-moe; do
  for seed in 0 1; do
    name="dump $config seed $seed matches the PyTorch reference"
    if ./bazel-bin/tools/remat dump --config "$config" --seed "$seed" --out "$tmp/$config-$seed.safetensors" &&
       /usr/bin/python3 tools/reference/reference.py "$tmp/$config-$seed.safetensors"; then
      passed=$((passed + 1))
      echo "passed: $name"
    else
      failed=$((failed + 1))
      echo "FAILED: $name"
    fi
  done
done
echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# tools/gpu: the GPU check bundle builds, fits the 64 MiB a device run can
# carry, runs out of tree (its libraries bundled), and on a machine without a
# GPU says so (exit 2) instead of pretending to check anything.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
bash tools/gpu/build.sh > "$tmp/build.txt" 2>&1
rc=$?
check "the bundle builds, under 64 MiB, with the CUDA test binaries and remat" \
  '[ $rc -eq 0 ] && tar -tJf out/gpu-check/bundle.tar.xz | grep -qx "bin/cuda_test" && tar -tJf out/gpu-check/bundle.tar.xz | grep -qx "bin/remat" && [ "$(du -sm out/gpu-check | cut -f1)" -lt 64 ]' \
  || cat "$tmp/build.txt"
cp -r out/gpu-check "$tmp/bundle"  # out of the tree: no Bazel rpaths to lean on
"$tmp/bundle/run.sh" "$tmp/out" --quick > "$tmp/run.txt" 2>&1
rc=$?
if nvidia-smi -L > /dev/null 2>&1; then
  check "with a GPU the check passes" '[ $rc -eq 0 ]'
else
  check "without a GPU the runner says so and exits 2" '[ $rc -eq 2 ] && grep -q "^no GPU" "$tmp/out/summary.txt"'
fi
check "the runner found the bundled libraries (remat info ran)" 'grep -q "CUDA back end" "$tmp/out/info.txt"'
finish

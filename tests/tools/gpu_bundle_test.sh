#!/usr/bin/env bash
# tools/gpu: the GPU check bundle builds, fits the 64 MiB a device run can
# carry, runs out of tree (its libraries bundled), and on a machine without a
# GPU says so (exit 2) instead of pretending to check anything. The summary
# and the dump comparison the GPU run ends with work on data shaped as theirs.
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
# The summary the GPU run ends with, from bench and PyTorch JSON shaped as they write it.
mkdir -p "$tmp/fake"
cat > "$tmp/fake/bench-gpu-dense.json" <<'J'
{"config": "gpu-dense", "rows": [
 {"plan": "none", "tokens_per_s": 60000, "step_ms": 136.5, "mfu": 0.5, "activation_bytes": 8589934592, "peak_allocated_bytes": 12884901888},
 {"plan": "per_block", "tokens_per_s": 48000, "step_ms": 170.6, "mfu": 0.4, "activation_bytes": 1073741824, "peak_allocated_bytes": 5368709120}],
 "runs": []}
J
echo '{"config": "gpu-dense", "tokens_per_s": 40000.0, "step_ms": 204.8}' > "$tmp/fake/torch-gpu-dense.json"
python3 out/gpu-check/summarize.py "$tmp/fake" > "$tmp/summary.txt" 2>&1
check "the GPU summary gives MFU, the ratio to PyTorch and per_block against none" \
  'grep -q "gpu-dense none: 60000 tok/s, step 136.5 ms, MFU 50.0%" "$tmp/summary.txt" && grep -q "1.50x PyTorch eager" "$tmp/summary.txt" && grep -q "per_block vs none: activations x0.12, step time x1.25" "$tmp/summary.txt"' \
  || cat "$tmp/summary.txt"
# The dump comparison the GPU run uses: a tolerance relative to each tensor's scale.
./bazel-bin/tools/remat dump --config tiny --out "$tmp/a.safetensors" > /dev/null 2>&1
./bazel-bin/tools/remat dump --config tiny --recompute per_block --out "$tmp/b.safetensors" > /dev/null 2>&1
./bazel-bin/tools/remat dump --config tiny --seed 1 --out "$tmp/c.safetensors" > /dev/null 2>&1
check "compare_dumps --rtol passes equal dumps and fails different ones" \
  'python3 out/gpu-check/compare_dumps.py "$tmp/a.safetensors" "$tmp/b.safetensors" --rtol 1e-5 --plan per_block > /dev/null && ! python3 out/gpu-check/compare_dumps.py "$tmp/a.safetensors" "$tmp/c.safetensors" --rtol 1e-5 > /dev/null'
check "compare_dumps --plan fails a dump that did not run the plan (none's dump, equal bits, named per_block)" \
  '! python3 out/gpu-check/compare_dumps.py "$tmp/a.safetensors" "$tmp/a.safetensors" --plan per_block > "$tmp/noplan.txt" && grep -q "B: the model ran plan .none., expected .per_block." "$tmp/noplan.txt" && grep -q "B: recomputed_ops 0, expected > 0" "$tmp/noplan.txt"'
finish

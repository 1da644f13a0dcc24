#!/usr/bin/env bash
# Every fuzz target (tests/fuzz/targets.h) under libFuzzer for a short fixed
# time (15 s each; REMAT_FUZZ_SECONDS), built by tools/fuzz.sh with clang,
# ASan and UBSan in its own output base: each target runs, replays its seeds
# and past findings, and finds nothing. Without clang's libFuzzer it counts
# one skipped check and says why.
# The first run compiles the libraries once more with clang (minutes on two
# cores); later runs rebuild only what changed.
# remat-test-timeout: 3600
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
seconds="${REMAT_FUZZ_SECONDS:-15}"
tools/fuzz.sh --seconds "$seconds" > "$tmp/fuzz.txt" 2>&1
rc=$?
cat "$tmp/fuzz.txt"
if [ "$rc" -eq 2 ]; then
  echo "skipped: the fuzz targets (no clang/libFuzzer here)"
  echo "remat-tests: 0 passed, 0 failed, 1 skipped"
  exit 0
fi
check "tools/fuzz.sh builds and runs every target without a finding (exit $rc)" '[ "$rc" -eq 0 ]'
for t in json config plan safetensors tokenizer tokenizer_config hf_config hf_index token_shard safetensors_decode; do
  line=$(grep "^fuzz $t: " "$tmp/fuzz.txt")
  execs=$(echo "$line" | sed -nE 's/^fuzz [a-z_]+: ([0-9]+) executions in .*, 0 crashes$/\1/p')
  # At least every committed input ran (libFuzzer replays them all before it
  # mutates, however slow the machine): a target that stops early (a broken
  # build, a corpus it cannot read) fails here.
  committed=$(find "tests/fuzz/corpus/$t" "tests/fuzz/crashes/$t" -type f 2>/dev/null | wc -l)
  check "$t: ran at least its $committed committed inputs, 0 crashes ($line)" \
    '[ -n "$execs" ] && [ "$execs" -ge "$committed" ]'
done
finish

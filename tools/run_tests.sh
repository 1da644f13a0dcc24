#!/usr/bin/env bash
# Runs every test binary built under //tests/... and adds up their summaries.
# Each binary prints "remat-tests: N passed, M failed, K skipped" (test
# cases); a binary that crashes or prints no summary counts as one failure.
# Logs go to out/test-logs/. The last line is "N passed, M failed, K skipped".
#
# Usage: tools/run_tests.sh [substring filter on the target label]
#
# REMAT_BIN_DIR (default bazel-bin): where the test binaries are, e.g.
# out/asan-bin for ./remat test --asan. REMAT_SCRIPT_TESTS=0 leaves out the
# script tests (they run the CLI of the normal build). REMAT_TEST_LOGS
# (default out/test-logs): where the logs go. A sanitizer report in a log is
# printed with the failure.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

filter="${1:-}"
logdir="${REMAT_TEST_LOGS:-out/test-logs}"
mkdir -p "$logdir"
per_binary_timeout="${REMAT_TEST_TIMEOUT:-1200}"
bin_dir="${REMAT_BIN_DIR:-bazel-bin}"

mapfile -t targets < <(bazel query --noshow_progress 'kind(cc_test, //tests/...)' 2>/dev/null | sort)
# Script tests (tests/**/*_test.sh) run after the binaries they use are built.
mapfile -t scripts < <(find tests -name '*_test.sh' | sort)
if [ "${REMAT_SCRIPT_TESTS:-1}" = 0 ]; then
  echo "script tests left out (REMAT_SCRIPT_TESTS=0): ${#scripts[@]} of them"
else
  targets+=("${scripts[@]}")
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "no test targets found" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

# The start of the first ASan/UBSan/LSan report in log $1, if any.
sanitizer_report() {
  grep -m1 -A14 -E 'ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:' "$1" | sed 's/^/        | /'
}

passed=0 failed=0 skipped=0 failed_bins=()
start_all=$(date +%s)
for t in "${targets[@]}"; do
  [ -n "$filter" ] && [[ "$t" != *"$filter"* ]] && continue
  if [[ "$t" == //* ]]; then
    path="$bin_dir/${t#//}"
    path="${path/://}"
  else
    path="$t"
  fi
  name="${t#//}"; name="${name//[:\/.]/_}"
  logf="$logdir/$name.log"
  t0=$(date +%s%N)
  limit="$per_binary_timeout"
  # A script test that needs longer (its first run builds something) says so
  # in a line "# remat-test-timeout: SECONDS" (a set REMAT_TEST_TIMEOUT wins).
  if [[ "$t" != //* ]]; then
    own=$(sed -nE 's/^# remat-test-timeout: ([0-9]+)$/\1/p' "$path" | head -1)
    [ -n "$own" ] && [ -z "${REMAT_TEST_TIMEOUT:-}" ] && limit="$own"
  fi
  timeout "$limit" "$path" >"$logf" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  dt="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  summary=$(grep -E '^remat-tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$logf" | tail -1)
  if [ -z "$summary" ]; then
    failed=$((failed + 1))
    failed_bins+=("$t")
    printf "  CRASH %-45s rc=%d (%ss), log: %s\n" "$t" "$rc" "$dt" "$logf"
    tail -20 "$logf" | sed 's/^/        /'
    sanitizer_report "$logf"
    continue
  fi
  read -r p f s < <(echo "$summary" | sed -E 's/remat-tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -gt 0 ] || [ "$rc" -ne 0 ]; then
    [ "$f" -eq 0 ] && failed=$((failed + 1))
    failed_bins+=("$t")
    printf "  FAIL  %-45s %d passed, %d failed (%ss), log: %s\n" "$t" "$p" "$f" "$dt" "$logf"
    grep -B2 -A8 -E 'FAILED|unexpected exception' "$logf" | head -60 | sed 's/^/        /'
    sanitizer_report "$logf"
  else
    extra=""
    [ "$s" -gt 0 ] && extra=", $s skipped"
    printf "  ok    %-45s %d passed%s (%ss)\n" "$t" "$p" "$extra" "$dt"
  fi
done

echo "total time $(( $(date +%s) - start_all ))s"
[ ${#failed_bins[@]} -gt 0 ] && echo "failed: ${failed_bins[*]}"
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Runs every test binary built under //tests/... and adds up their summaries.
# Each binary prints "remat-tests: N passed, M failed, K skipped" (test
# cases); a binary that crashes or prints no summary counts as one failure.
# Logs go to out/test-logs/. The last line is "N passed, M failed, K skipped".
#
# Usage: tools/run_tests.sh [substring filter on the target label]
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

filter="${1:-}"
logdir=out/test-logs
mkdir -p "$logdir"
per_binary_timeout="${REMAT_TEST_TIMEOUT:-1200}"

mapfile -t targets < <(bazel query --noshow_progress 'kind(cc_test, //tests/...)' 2>/dev/null | sort)
# Script tests (tests/**/*_test.sh) run after the binaries they use are built.
mapfile -t scripts < <(find tests -name '*_test.sh' | sort)
targets+=("${scripts[@]}")
if [ ${#targets[@]} -eq 0 ]; then
  echo "no test targets found" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

passed=0 failed=0 skipped=0 failed_bins=()
start_all=$(date +%s)
for t in "${targets[@]}"; do
  [ -n "$filter" ] && [[ "$t" != *"$filter"* ]] && continue
  if [[ "$t" == //* ]]; then
    path="bazel-bin/${t#//}"
    path="${path/://}"
  else
    path="$t"
  fi
  name="${t#//}"; name="${name//[:\/.]/_}"
  logf="$logdir/$name.log"
  t0=$(date +%s%N)
  timeout "$per_binary_timeout" "$path" >"$logf" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  dt="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  summary=$(grep -E '^remat-tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$logf" | tail -1)
  if [ -z "$summary" ]; then
    failed=$((failed + 1))
    failed_bins+=("$t")
    printf "  CRASH %-45s rc=%d (%ss), log: %s\n" "$t" "$rc" "$dt" "$logf"
    tail -20 "$logf" | sed 's/^/        /'
    continue
  fi
  read -r p f s < <(echo "$summary" | sed -E 's/remat-tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -gt 0 ] || [ "$rc" -ne 0 ]; then
    [ "$f" -eq 0 ] && failed=$((failed + 1))
    failed_bins+=("$t")
    printf "  FAIL  %-45s %d passed, %d failed (%ss), log: %s\n" "$t" "$p" "$f" "$dt" "$logf"
    grep -B2 -A8 -E 'FAILED|unexpected exception' "$logf" | head -60 | sed 's/^/        /'
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

# Sourced by script tests (tests/**/*_test.sh): moves to the repository root,
# makes $tmp (removed at exit), and gives
#   check NAME 'CONDITION'  evaluates CONDITION, prints passed/FAILED NAME,
#                           counts it, and returns non-zero when it failed
#                           (so `check ... || show-diagnostics` works);
#   finish                  prints the summary line tools/run_tests.sh adds
#                           up and returns non-zero if any check failed.
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {
  if eval "$2"; then
    passed=$((passed + 1))
    echo "passed: $1"
  else
    failed=$((failed + 1))
    echo "FAILED: $1"
    return 1
  fi
}
finish() {
  echo "remat-tests: $passed passed, $failed failed, 0 skipped"
  [ "$failed" -eq 0 ]
}

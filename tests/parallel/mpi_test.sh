#!/usr/bin/env bash
# The collectives under real MPI: the test binary under mpirun with 2 and 4
# ranks (every rank checks what it receives; a failing rank fails the run).
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
for np in 2 4; do
  out=$(timeout 300 mpirun "${flags[@]}" --tag-output -np "$np" ./bazel-bin/tests/parallel/collectives_test 2>&1)
  rc=$?
  line=$(echo "$out" | grep -E '^\[1,0\]<stdout>:remat-tests:' | sed 's/^\[1,0\]<stdout>://')
  p=$(echo "$line" | sed -E 's/remat-tests: ([0-9]+) passed.*/\1/')
  if [ "$rc" -eq 0 ] && [ -n "$line" ] && [ "$(echo "$out" | grep -c 'remat-tests: [0-9]* passed, 0 failed')" -eq "$np" ]; then
    passed=$((passed + p))
    echo "passed: $p collective test cases on $np ranks"
  else
    failed=$((failed + 1))
    echo "FAILED: collectives on $np ranks (rc $rc)"
    echo "$out" | grep -E 'FAILED|error|exception' | head -20
  fi
done
echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

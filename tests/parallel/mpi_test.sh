#!/usr/bin/env bash
# The multi-process tests under real MPI: each binary under mpirun with 2
# and 4 ranks (every rank checks what it computes; a failing rank fails the
# run). One thread per rank; a rank stuck in a collective gives up after 60 s.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
skipped=0
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 REMAT_COMM_TIMEOUT=60
for bin in collectives_test p2p_test parallel_training_test simulated_rank_test zero_test tensor_parallel_test; do
for np in 2 4; do
  out=$(timeout 600 mpirun "${flags[@]}" --tag-output -np "$np" "./bazel-bin/tests/parallel/$bin" 2>&1)
  rc=$?
  line=$(echo "$out" | grep -E '^\[1,0\]<stdout>:remat-tests:' | sed 's/^\[1,0\]<stdout>://')
  p=$(echo "$line" | sed -E 's/remat-tests: ([0-9]+) passed.*/\1/')
  k=$(echo "$line" | sed -E 's/.* ([0-9]+) skipped.*/\1/')
  if [ "$rc" -eq 0 ] && [ -n "$line" ] && [ "$(echo "$out" | grep -c 'remat-tests: [0-9]* passed, 0 failed')" -eq "$np" ]; then
    passed=$((passed + p))
    skipped=$((skipped + k))
    echo "passed: $p $bin cases on $np ranks ($k skipped)"
  else
    failed=$((failed + 1))
    echo "FAILED: $bin on $np ranks (rc $rc)"
    echo "$out" | grep -E 'FAILED|error|exception|with expansion' -A3 | head -40
  fi
done
done
echo "remat-tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

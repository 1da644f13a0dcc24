#!/usr/bin/env bash
# A peer that fails during a point-to-point message, under mpirun -np 2 with
# the comm watchdog (p2p_test opts in, as remat does): REMAT_FAULT kills or
# stops rank 1 at its N-th counted operation (sends and receives count like
# collectives) while rank 0 waits in a recv (or a send); rank 0 must exit
# non-zero, naming the send / receive it was in.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
bin=./bazel-bin/tests/parallel/p2p_test

# Killed (SIGKILL) at its 2nd operation, the send rank 0 waits to receive.
start=$(date +%s)
REMAT_FAULT=kill:1:2 timeout 120 mpirun "${flags[@]}" -np 2 $bin "[.p2p_fault]" > "$tmp/kill.txt" 2>&1
rc=$?
check "a rank killed before its send ends the job non-zero, well within the timeout" \
  '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 100 ]' || echo "rc $rc"
check "fault injection counted rank 1's receive and struck at its send" \
  'grep -q "REMAT_FAULT: killing this rank" "$tmp/kill.txt"' || cat "$tmp/kill.txt"
check "the survivor names the recv it was in" \
  'grep -qE "remat: (terminated while in recv from rank 1 \(tag 7, phase forward, 4096 bytes, rank 0 of 2\)|MPI recv from rank 1 \(tag 7, rank 0 of 2\).* failed)" "$tmp/kill.txt"' \
  || cat "$tmp/kill.txt"

# Killed at its 1st operation (the receive), while rank 0 waits for a 4 MiB
# send to be received.
start=$(date +%s)
REMAT_FAULT=kill:1:1 timeout 120 mpirun "${flags[@]}" -np 2 $bin "[.p2p_fault_send]" > "$tmp/kill_send.txt" 2>&1
rc=$?
check "a rank killed before its receive ends the job non-zero" \
  '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 100 ]' || echo "rc $rc"
check "the survivor names the send it was in" \
  'grep -qE "remat: (terminated while in send to rank 1 \(tag 9, phase forward, 4194304 bytes, rank 0 of 2\)|MPI send to rank 1 \(tag 9, rank 0 of 2\).* failed)" "$tmp/kill_send.txt"' \
  || cat "$tmp/kill_send.txt"

# Stops answering instead: rank 0 gives up after the comm timeout.
start=$(date +%s)
REMAT_FAULT=hang:1:2 REMAT_COMM_TIMEOUT=3 timeout 120 mpirun "${flags[@]}" -np 2 $bin "[.p2p_fault]" \
  > "$tmp/hang.txt" 2>&1
rc=$?
check "a stuck peer: the waiting rank exits non-zero after the comm timeout" \
  '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 60 ]' || echo "rc $rc"
check "the timeout message names the recv" \
  'grep -q "remat: recv from rank 1 (tag 7, phase forward, 4096 bytes, rank 0 of 2) did not finish within 3 s" "$tmp/hang.txt"' \
  || cat "$tmp/hang.txt"

# Without a fault the same cases pass.
timeout 120 mpirun "${flags[@]}" -np 2 $bin "[.p2p_fault],[.p2p_fault_send]" > "$tmp/ok.txt" 2>&1
rc=$?
check "without a fault both cases pass on both ranks" \
  '[ $rc -eq 0 ] && [ "$(grep -c "remat-tests: 2 passed, 0 failed" "$tmp/ok.txt")" -eq 2 ]' || cat "$tmp/ok.txt"

finish

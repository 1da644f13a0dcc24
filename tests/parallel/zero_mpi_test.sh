#!/usr/bin/env bash
# `./remat train --zero` and `bench --dp --zero` under mpirun, through the
# CLI: a sharded state (one file per rank and an index) resumes in one
# process and exports to one Hugging Face folder; a rank killed while the
# others are in a gather or reduce-scatter ends the job, the survivor naming
# the collective; bench reports per-rank memory and the gathers per phase;
# bad layouts are refused before any work. (The exactness and crash checks
# are tests/parallel/zero_test.cc.)
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
common=(--config tiny --steps 4 --warmup 2 --eval-every 0 --seed 5 --progress off)

# A sharded save, resumed in one process, exported.
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --zero 3 --stop-after 2 --save "$tmp/state" \
  > "$tmp/save.txt" 2>&1
rc=$?
check "train --zero 3 under mpirun -np 2 saves" '[ $rc -eq 0 ]' || tail -5 "$tmp/save.txt"
check "one file per rank and the index" '[ -f "$tmp/state/shards-2/rank-0.safetensors" ] && [ -f "$tmp/state/shards-2/rank-1.safetensors" ] && [ -f "$tmp/state/state.safetensors" ]'
$remat train "${common[@]}" --resume "$tmp/state" > "$tmp/resume.txt" 2>&1
rc=$?
check "one process resumes the sharded state" '[ $rc -eq 0 ] && grep -q "resumed at step 2" "$tmp/resume.txt"' \
  || tail -5 "$tmp/resume.txt"
$remat export --resume "$tmp/state" --out "$tmp/hf" > "$tmp/export.txt" 2>&1
rc=$?
check "export writes the sharded state as one Hugging Face folder" '[ $rc -eq 0 ] && [ -f "$tmp/hf/model.safetensors" ]' \
  || tail -5 "$tmp/export.txt"

# Rank 1 is killed at its 60th collective (in step 1's gathers and
# reduce-scatters); rank 0 exits non-zero, naming what it was blocked in.
start=$(date +%s)
REMAT_FAULT=kill:1:60 timeout 120 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --zero 3 > "$tmp/kill.txt" 2>&1
rc=$?
check "a rank killed under --zero 3 ends the job non-zero, within the timeout" \
  '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 100 ]'
check "the surviving rank names the gather or reduce-scatter it was in" \
  'grep -qE "remat: .*(collective (all_gather|reduce_scatter) \(phase|MPI [a-z_]+.* failed)" "$tmp/kill.txt"' \
  || cat "$tmp/kill.txt"

# bench --dp 2 --zero 3: each worker is 2 ranks; rank 0's memory and gathers.
$remat bench --config tiny --recompute none,per_block,keep_gathered --dp 2 --zero 3 --repeats 1 --warmup 1 \
  --steps 1 --threads 2 --json "$tmp/bench.json" > "$tmp/bench.txt" 2>&1
$remat bench --config tiny --recompute none --dp 2 --repeats 1 --warmup 1 --steps 1 --threads 2 \
  --json "$tmp/bench0.json" > "$tmp/bench0.txt" 2>&1
check "bench --dp 2 --zero 3: half the persistent bytes (16/2 of 16 per parameter), two gathers per block" \
  "/usr/bin/python3 - '$tmp/bench.json' '$tmp/bench0.json' <<'PY'
import json, sys
rows = {r['plan']: r for r in json.load(open(sys.argv[1]))['rows']}
dp = json.load(open(sys.argv[2]))['rows'][0]
L = 4
for r in rows.values():
    assert r['dp'] == 2 and r['zero'] == 3 and r['step_ms'] > 0, r
    assert abs(r['persistent_bytes'] - dp['persistent_bytes'] / 2) < 0.01 * dp['persistent_bytes'], (r, dp)
    assert r['reduce_scatter_calls_backward'] == L + 2, r
    assert r['zero_comm_wait_ms'] >= 0 and r['rss_peak_bytes'] > r['peak_allocated_bytes'], r
back = lambda r: r['all_gather_calls_backward'] + r['all_gather_calls_replay']
assert back(rows['none']) == L + 1 == back(rows['per_block']), rows
assert back(rows['keep_gathered']) == 1, rows
assert rows['per_block']['activation_bytes'] < rows['none']['activation_bytes']
assert rows['none']['peak_allocated_bytes'] < dp['peak_allocated_bytes']
PY" || tail -20 "$tmp/bench.txt"

# Bad input, before any work.
$remat train --config tiny --steps 1 --zero 2 > "$tmp/bad1.txt" 2>&1
check "--zero without data-parallel ranks is refused" \
  'grep -q "zero 2 shards over the data-parallel ranks, but this run has one" "$tmp/bad1.txt"'
$remat mem --device meta --config tiny --simulate-world pp=2,zero=1 --out "$tmp/m" > "$tmp/bad2.txt" 2>&1
check "a simulated world with zero and no data-parallel ranks is refused" 'grep -q "it needs dp >= 2" "$tmp/bad2.txt"'
$remat bench --config tiny --recompute none --zero 2 > "$tmp/bad3.txt" 2>&1
check "bench --zero without --dp is refused" 'grep -q "give --dp D" "$tmp/bad3.txt"'
timeout 60 mpirun "${flags[@]}" -np 2 $remat train --config tiny --steps 1 --zero 2 --recompute keep_gathered \
  > "$tmp/bad4.txt" 2>&1
check "keep_gathered without --zero 3 is refused" 'grep -q "which only --zero 3 gathers" "$tmp/bad4.txt"'

finish

#!/usr/bin/env bash
# `./remat train` under mpirun: expert and data parallel runs log the losses
# of one process; only rank 0 prints; a state saved with --ep 2 resumes in one
# process and continues as the uninterrupted run; a rank killed mid-step (or
# one that stops answering) makes the others exit non-zero with a message
# naming the collective they were in. The one-process run uses the default
# thread count; ranks run one thread each. Losses agree within 1e-5, not bit
# for bit: the data-parallel all-reduce and the expert-parallel exchange sum
# in another order than one process.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
common=(--config tiny-moe --steps 4 --warmup 2 --eval-every 0 --seed 5)

env -u OMP_NUM_THREADS $remat train "${common[@]}" --log "$tmp/one.jsonl" > "$tmp/one.txt" 2>&1
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --ep 2 --recompute per_block+chunked_loss \
  --log "$tmp/ep2.jsonl" > "$tmp/ep2.txt" 2>&1
rc=$?
check "mpirun -np 2 train --ep 2 runs" '[ $rc -eq 0 ] && [ -s "$tmp/ep2.jsonl" ]' || tail -5 "$tmp/ep2.txt"
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --dp 2 --recompute chunked_loss --log "$tmp/dp2.jsonl" \
  > "$tmp/dp2.txt" 2>&1
rc=$?
check "mpirun -np 2 train --dp 2 runs" '[ $rc -eq 0 ] && [ -s "$tmp/dp2.jsonl" ]' || tail -5 "$tmp/dp2.txt"
check "only rank 0 prints" '[ "$(grep -c "^remat train:" "$tmp/ep2.txt")" -eq 1 ] && [ "$(grep -c "^done:" "$tmp/ep2.txt")" -eq 1 ]'
check "ep 2 (per_block+chunked_loss) and dp 2 (chunked_loss) log the losses of one process; per_block replays the dispatch/combine bytes" \
  "/usr/bin/python3 - '$tmp' <<'PY'
import json, sys
d = sys.argv[1]
def rows(n): return [json.loads(l) for l in open(f'{d}/{n}.jsonl')]
one, ep2, dp2 = rows('one'), rows('ep2'), rows('dp2')
assert len(one) == len(ep2) == len(dp2) == 4
for a, b, c in zip(one, ep2, dp2):
    assert abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (a['loss'], b['loss'])
    assert abs(a['loss'] - c['loss']) <= 1e-5 * a['loss'], (a['loss'], c['loss'])
    assert abs(a['grad_norm'] - b['grad_norm']) <= 1e-5 * a['grad_norm']
c = ep2[-1]['comm']
assert c['replay']['all_to_all']['calls'] == c['forward']['all_to_all']['calls'] == 6, c
assert c['replay']['all_to_all']['bytes'] == c['forward']['all_to_all']['bytes'], c
assert 'all_gather' not in c['replay'], c  # counts reused, not exchanged again
assert ep2[-1]['routing_metadata_saved_bytes'] == 3 * 8 * 8, ep2[-1]  # 3 MoE layers x 8 experts x i64
assert dp2[-1]['grad_buckets'] >= 1 and 'all_to_all' not in dp2[-1]['comm']['forward']
PY"

# Save with --ep 2 after 2 steps (experts gathered on rank 0), resume in one
# process: the rest of the run matches the uninterrupted one.
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --ep 2 --stop-after 2 --save "$tmp/state" \
  > "$tmp/save.txt" 2>&1
check "a state saved with --ep 2 holds every expert" \
  "/usr/bin/python3 - '$tmp/state/state.safetensors' <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
for l in (1, 2, 3):
    for e in range(8):
        for w in ('gate_proj', 'up_proj', 'down_proj'):
            k = f'model.layers.{l}.mlp.experts.{e}.{w}.weight'
            assert k in h and 'optimizer.exp_avg.' + k in h, k
assert h['__metadata__']['ep'] == '2'
PY"
$remat train "${common[@]}" --resume "$tmp/state" --log "$tmp/resumed.jsonl" > "$tmp/resumed.txt" 2>&1
check "one process resumes the --ep 2 state and continues as the uninterrupted run" \
  "/usr/bin/python3 - '$tmp' <<'PY'
import json, sys
d = sys.argv[1]
one = [json.loads(l) for l in open(f'{d}/one.jsonl')]
res = [json.loads(l) for l in open(f'{d}/resumed.jsonl')]
assert [r['step'] for r in res] == [3, 4], res
for a, b in zip(one[2:], res):
    assert abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (a['loss'], b['loss'])
PY"

# Failures: rank 1 is killed at its 40th collective (mid-step); rank 0 must
# exit non-zero, naming the collective it was blocked in.
start=$(date +%s)
REMAT_FAULT=kill:1:40 timeout 120 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --ep 2 > "$tmp/kill.txt" 2>&1
rc=$?
check "a killed rank ends the job non-zero, within the timeout" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 100 ]'
check "the surviving rank names the collective it was in" 'grep -qE "remat: .*(collective (all_to_all|all_gather|all_reduce|broadcast|reduce_scatter) \(phase|MPI [a-z_]+.* failed)" "$tmp/kill.txt"' \
  || cat "$tmp/kill.txt"
# A rank that stops answering: the others give up after --comm-timeout.
start=$(date +%s)
REMAT_FAULT=hang:1:40 timeout 120 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --ep 2 --comm-timeout 3 \
  > "$tmp/hang.txt" 2>&1
rc=$?
check "a stuck rank: the others exit non-zero after the comm timeout" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 60 ]'
check "the timeout message names the collective" 'grep -qE "collective [a-z_]+ \(phase [a-z]+, [0-9]+ bytes, rank 0 of 2\) did not finish within 3 s" "$tmp/hang.txt"' \
  || cat "$tmp/hang.txt"
# bench --ep 2: each worker is 2 ranks; the JSON reports the traffic.
./bazel-bin/tools/remat bench --config tiny-moe --recompute none,per_block,moe_expert --ep 2 --repeats 1 --warmup 1 \
  --steps 1 --threads 2 --json "$tmp/bench.json" > "$tmp/bench.txt" 2>&1
check "bench --ep 2 reports the all_to_all bytes each plan sends and re-sends" \
  "/usr/bin/python3 - '$tmp/bench.json' <<'PY'
import json, sys
rows = {r['plan']: r for r in json.load(open(sys.argv[1]))['rows']}
for r in rows.values():
    assert r['ep'] == 2 and r['all_to_all_bytes_forward'] > 0 and r['step_ms'] > 0
assert rows['none']['all_to_all_bytes_replay'] == 0 == rows['moe_expert']['all_to_all_bytes_replay']
assert rows['per_block']['all_to_all_bytes_replay'] == rows['per_block']['all_to_all_bytes_forward']
assert rows['per_block']['replayed_comm_bytes'] >= rows['per_block']['all_to_all_bytes_replay']
assert rows['per_block']['activation_bytes'] < rows['none']['activation_bytes']
PY" || tail -20 "$tmp/bench.txt"
# Bad layouts are refused with a clear error.
timeout 60 mpirun "${flags[@]}" -np 2 $remat train --config tiny-moe --steps 1 --ep 3 > "$tmp/bad.txt" 2>&1
check "--ep that does not divide the ranks is refused" 'grep -q "the expert-parallel degree must divide the 2 ranks" "$tmp/bad.txt"'
$remat train --config tiny --steps 1 --dp 2 > "$tmp/bad2.txt" 2>&1
check "--dp without a launcher names mpirun" 'grep -q "mpirun -np 2" "$tmp/bad2.txt"'

finish

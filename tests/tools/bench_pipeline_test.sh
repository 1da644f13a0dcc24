#!/usr/bin/env bash
# ./remat bench --pp end to end on `tiny` with 8 blocks (short protocol):
# every schedule x plan runs as fresh jobs of P processes in the balanced
# order, listed in `runs`; the JSON has every key docs/REFERENCE.md#file-formats
# lists, for every stage; the in-flight counts are the schedules' (GPipe M, 1F1B
# P - s); stage 0's activations under 1F1B are about P/M of GPipe's and
# per_block lowers them; every stage sends M hidden states or gradients of R x S x
# d f32; the bubble is a fraction; flags that do not apply are refused.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
echo '{"name": "tiny", "n_layers": 8}' > "$tmp/tiny8.json"
$remat bench --pp 4 --grad-accum 8 --micro-batch 2 --config "$tmp/tiny8.json" --recompute none,per_block \
  --repeats 2 --warmup 1 --steps 1 --threads 2 --json "$tmp/b.json" > "$tmp/b.txt" 2>&1
check "bench --pp runs" '[ -s "$tmp/b.json" ]' || cat "$tmp/b.txt"
check "bench --pp JSON: every key for every variant and stage; in-flight, memory and bytes sent as the arithmetic says" \
  "/usr/bin/python3 - '$tmp/b.json' <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
P, M, R = 4, 8, 2
for k in ['config', 'pp', 'grad_accum', 'micro_batch_rows', 'threads_per_stage', 'repeats', 'warmup', 'steps',
          'order', 'dtype', 'rows', 'runs']:
    assert k in doc, k
assert (doc['pp'], doc['grad_accum'], doc['micro_batch_rows'], doc['order']) == (P, M, R, 'williams'), doc
rows = {r['variant']: r for r in doc['rows']}
assert sorted(rows) == ['1f1b', '1f1b+per_block', 'gpipe', 'gpipe+per_block'], sorted(rows)
assert len(doc['runs']) == 8 and sorted(r['position'] for r in doc['runs']) == list(range(8)), doc['runs']
stage_keys = ['stage', 'first_block', 'end_block', 'peak_allocated_bytes', 'activation_bytes', 'in_flight',
              'forward_ms', 'backward_ms', 'idle_ms', 'bubble', 'sent_bytes']
for name, r in rows.items():
    for k in ['schedule', 'plan', 'step_ms', 'step_ms_min', 'step_ms_max', 'tokens_per_s', 'bubble_theory', 'stages']:
        assert k in r, (name, k)
    assert abs(r['bubble_theory'] - (P - 1) / (M + P - 1)) < 1e-5  # (6 digits in the JSON)
    assert r['step_ms_min'] <= r['step_ms'] <= r['step_ms_max']
    assert [s['stage'] for s in r['stages']] == list(range(P)), name
    assert [(s['first_block'], s['end_block']) for s in r['stages']] == [(0, 2), (2, 4), (4, 6), (6, 8)], name
    for s in r['stages']:
        missing = [k for k in stage_keys if k not in s]
        assert not missing, (name, missing)
        assert 0 <= s['bubble'] < 1 and s['forward_ms'] > 0 and s['backward_ms'] > 0, (name, s)
        want = M if r['schedule'] == 'gpipe' else P - s['stage']
        assert s['in_flight'] == want, (name, s['stage'], s['in_flight'], want)
        # Hidden states forward (all but the last stage), gradients back (all
        # but the first): M tensors of [R, 128, 128] f32 each way.
        sends = (s['stage'] < P - 1) + (s['stage'] > 0)
        assert s['sent_bytes'] == sends * M * R * 128 * 128 * 4, (name, s)
g, f = rows['gpipe']['stages'][0], rows['1f1b']['stages'][0]
ratio = f['activation_bytes'] / g['activation_bytes']
print(f'stage 0 activations: 1f1b / gpipe = {ratio:.3f} (P/M = {P / M})')
assert abs(ratio - P / M) <= 0.15 * P / M, ratio
for sched in ['gpipe', '1f1b']:
    assert rows[sched + '+per_block']['stages'][0]['activation_bytes'] < 0.5 * rows[sched]['stages'][0]['activation_bytes']
PY"
check "bench --pp prints the per-stage table with the bubble's arithmetic" \
  "grep -q 'bubble' '$tmp/b.txt' && grep -q '(M+P-1)' '$tmp/b.txt' && grep -qE '^1f1b\+per_block +[0-9]+ +0 +0-1 ' '$tmp/b.txt'"
check "bench --pp with --ep is refused" \
  "! $remat bench --pp 2 --ep 2 --config tiny > '$tmp/e.txt' 2>&1 && grep -q 'bench --pp: --ep is not measured with a pipeline' '$tmp/e.txt'"
check "bench --grad-accum without --pp is refused" \
  "! $remat bench --grad-accum 4 --config tiny > '$tmp/e.txt' 2>&1 && grep -q 'bench: --grad-accum needs --pp P' '$tmp/e.txt'"
check "bench --pp with a bad schedule is refused before any run" \
  "! $remat bench --pp 2 --pp-schedule zigzag --config tiny > '$tmp/e.txt' 2>&1 && grep -q \"'zigzag': expected gpipe\" '$tmp/e.txt'"
finish

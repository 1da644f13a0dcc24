#!/usr/bin/env bash
# ./remat bench end to end on `tiny` (short protocol): the JSON has every key
# DESIGN.md §8 lists for every plan, per_block keeps fewer activations than
# none, the HTML plot is written; and --estimate predicts activations within
# 10% of the measurement for none and per_block.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
./bazel-bin/tools/remat bench --config tiny --recompute none,per_block,selected:0,2 --repeats 2 --warmup 1 --steps 2 \
  --threads 2 --json "$tmp/b.json" --html "$tmp/b.html" > "$tmp/b.txt" 2>&1
check "bench runs" '[ -s "$tmp/b.json" ]' || cat "$tmp/b.txt"
check "bench JSON has every key for every plan, per_block below none" "/usr/bin/python3 - '$tmp/b.json' <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
keys = ['plan', 'config', 'repeats', 'peak_allocated_bytes', 'peak_reserved_bytes', 'persistent_bytes',
        'activation_bytes', 'step_ms', 'step_ms_min', 'step_ms_max', 'forward_ms', 'backward_ms', 'tokens_per_s',
        'recomputed_ops', 'replayed_comm_bytes', 'mfu', 'hfu']
assert [r['plan'] for r in rows] == ['none', 'per_block', 'selected:0,2'], rows
for r in rows:
    missing = [k for k in keys if k not in r]
    assert not missing, (r['plan'], missing)
    assert r['repeats'] == 2 and r['step_ms_min'] <= r['step_ms'] <= r['step_ms_max']
by = {r['plan']: r for r in rows}
assert by['per_block']['activation_bytes'] < by['selected:0,2']['activation_bytes'] < by['none']['activation_bytes']
assert by['none']['recomputed_ops'] == 0 and by['per_block']['recomputed_ops'] > 0
assert 0 < by['none']['mfu'] < 1 and by['per_block']['hfu'] >= by['per_block']['mfu']
PY"
check "bench HTML plot written" 'grep -q "<svg" "$tmp/b.html" && grep -q "per_block" "$tmp/b.html"'
./bazel-bin/tools/remat bench --config tiny --recompute none,per_block --estimate --threads 2 --json "$tmp/e.json" \
  > "$tmp/e.txt" 2>&1
check "estimate within 10% of the measurement for none and per_block" "/usr/bin/python3 - '$tmp/e.json' <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
for r in rows:
    assert abs(r['relative_error']) < 0.10, r
PY" || cat "$tmp/e.txt"
finish

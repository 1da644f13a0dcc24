#!/usr/bin/env bash
# ./remat bench end to end on `tiny` (short protocol): plans and the PyTorch
# baseline run interleaved in the balanced order (tools/bench_order.h), one
# fresh process each, listed in `runs`; the JSON has every key
# docs/REFERENCE.md#file-formats lists for every plan (replay_ms,
# replay_forwards, torch_ratio included), per_block keeps fewer activations than
# none, the HTML plot is written; bad --baseline uses are refused; and
# --estimate predicts activations within 10% of the measurement for none and
# per_block.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
./bazel-bin/tools/remat bench --config tiny --recompute none,per_block,selected:0,2 --repeats 2 --warmup 1 --steps 2 \
  --threads 2 --baseline torch --json "$tmp/b.json" --html "$tmp/b.html" > "$tmp/b.txt" 2>&1
check "bench runs" '[ -s "$tmp/b.json" ]' || cat "$tmp/b.txt"
check "bench JSON has every key for every plan, per_block below none" "/usr/bin/python3 - '$tmp/b.json' <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc['order'] == 'williams' and doc['baseline_plan'] == 'none' and doc['repeats'] == 2, doc.keys()
rows = doc['rows']
keys = ['plan', 'config', 'repeats', 'peak_allocated_bytes', 'peak_reserved_bytes', 'persistent_bytes',
        'activation_bytes', 'loss_bytes', 'step_ms', 'step_ms_min', 'step_ms_max', 'forward_ms', 'forward_ms_min', 'forward_ms_max',
        'backward_ms', 'backward_ms_min', 'backward_ms_max', 'replay_ms', 'replay_forwards', 'tokens_per_s',
        'recomputed_ops', 'replayed_comm_bytes', 'mfu', 'hfu', 'time_ratio', 'memory_ratio', 'torch_ratio']
assert [r['plan'] for r in rows] == ['none', 'per_block', 'selected:0,2'], rows
for r in rows:
    missing = [k for k in keys if k not in r]
    assert not missing, (r['plan'], missing)
    assert r['repeats'] == 2 and r['step_ms_min'] <= r['step_ms'] <= r['step_ms_max']
by = {r['plan']: r for r in rows}
assert by['per_block']['activation_bytes'] < by['selected:0,2']['activation_bytes'] < by['none']['activation_bytes']
assert by['none']['recomputed_ops'] == 0 and by['per_block']['recomputed_ops'] > 0
assert 0 < by['none']['mfu'] < 1 and by['per_block']['hfu'] >= by['per_block']['mfu']
# Replay cost and the ratio to PyTorch, from the medians in the same file.
n, t = by['none'], doc['torch']
for r in rows:
    assert abs(r['replay_ms'] - (r['backward_ms'] - n['backward_ms'])) < 1e-3 * max(1, n['backward_ms']), r
    assert abs(r['replay_forwards'] * n['forward_ms'] - r['replay_ms']) < 1e-3 * max(1, abs(r['replay_ms'])), r
    assert abs(r['torch_ratio'] - r['tokens_per_s'] / t['tokens_per_s']) < 1e-4 * r['torch_ratio'], r
assert n['replay_ms'] == 0 and n['replay_forwards'] == 0
# The best-step view: each run's fastest timed step is at most its median
# step; a row's step_ms_best is the median of its runs' bests, and its
# ratios are taken against none's and PyTorch's.
def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])
for x in doc['runs']:
    assert 0 < x['step_ms_best'] <= x['step_ms'], x
for r in rows + [t]:
    name = r.get('plan', 'torch')
    assert abs(r['step_ms_best'] - med([x['step_ms_best'] for x in doc['runs'] if x['variant'] == name])) < 1e-4 * r['step_ms_best'], r
for r in rows:
    assert abs(r['time_ratio_best'] - r['step_ms_best'] / n['step_ms_best']) < 1e-4, r
    assert abs(r['torch_ratio_best'] - t['step_ms_best'] / r['step_ms_best']) < 1e-4, r
assert t['framework'].startswith('pytorch') and t['step_ms_min'] <= t['step_ms'] <= t['step_ms_max']
PY"
check "runs: one fresh process per variant and repeat, in the interleaved (Williams) order" "/usr/bin/python3 - '$tmp/b.json' <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))['runs']
order = [(r['variant'], r['repeat']) for r in runs]
assert order == [('none', 0), ('per_block', 0), ('torch', 0), ('selected:0,2', 0),
                 ('per_block', 1), ('selected:0,2', 1), ('none', 1), ('torch', 1)], order
assert [r['position'] for r in runs] == list(range(8)) and [r['slot'] for r in runs] == [0, 1, 2, 3] * 2
for r in runs:
    assert r['step_ms'] > 0 and r['forward_ms'] > 0 and r['backward_ms'] > 0, r
    assert ('activation_bytes' in r) == (r['variant'] != 'torch'), r
PY" || cat "$tmp/b.txt"
check "the table prints the spread, the ratio to PyTorch and the best-step view" \
  'grep -qE "^none +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ \[[0-9]+-[0-9]+\]" "$tmp/b.txt" && grep -qE "^torch " "$tmp/b.txt" && grep -q "x torch" "$tmp/b.txt" && grep -qE "^best step " "$tmp/b.txt" && grep -qE "^per_block +[0-9]+ \[[0-9]+-[0-9]+\] +[0-9.]+x +[0-9.]+x$" "$tmp/b.txt"'
check "bench HTML plot written" 'grep -q "<svg" "$tmp/b.html" && grep -q "per_block" "$tmp/b.html"'
./bazel-bin/tools/remat bench --config tiny --baseline tf > "$tmp/bad1.txt" 2>&1
check "--baseline other than torch is refused" 'grep -q "bench: --baseline expects .torch., got .tf." "$tmp/bad1.txt"'
./bazel-bin/tools/remat bench --config tiny-moe --baseline torch > "$tmp/bad2.txt" 2>&1
check "--baseline torch refuses an MoE config, naming it" \
  'grep -q "the PyTorch baseline models the dense decoder.*config tiny-moe has 8 experts" "$tmp/bad2.txt"' || cat "$tmp/bad2.txt"
./bazel-bin/tools/remat bench --config tiny --recompute none,per_block --estimate --threads 2 --json "$tmp/e.json" \
  > "$tmp/e.txt" 2>&1
check "estimate within 10% of the measurement for none and per_block" "/usr/bin/python3 - '$tmp/e.json' <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r['plan'] for r in rows] == ['none', 'per_block'], rows
for r in rows:
    # The error from the raw figures, not the tool's own relative_error.
    measured, predicted = r['activation_bytes'], r['predicted_activation_bytes']
    assert measured > 0 and predicted > 0, r
    err = (predicted - measured) / measured
    assert abs(err) < 0.10, (err, r)
    assert abs(r['relative_error'] - err) < 1e-5, (err, r)  # the JSON keeps 6 digits
PY" || cat "$tmp/e.txt"
finish

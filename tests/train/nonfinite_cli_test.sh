#!/usr/bin/env bash
# `remat train` on non-finite values: a run whose learning rate diverges
# (finite, so every flag check passes) exits non-zero naming the step and the
# value, and leaves the state on disk byte for byte as it was; --on-nonfinite
# skip drops such steps, logs them (skipped, skipped_steps) and stops after
# --max-nonfinite-skips in a row; bad values of the new flags are rejected;
# --dtype f16 logs its loss scale. Under mpirun the ranks take the same
# decision when only one rank's values go bad (nonfinite_test "[mpi]").
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
common=(--config tiny --eval-every 0 --seed 3 --warmup 2)

# A good state at step 3, then a resumed run with a learning rate that throws
# the weights far out: its loss or gradient norm turns non-finite.
$remat train "${common[@]}" --steps 3 --save "$tmp/s" > "$tmp/good.txt" 2>&1
check "a short run saves a state" '[ -s "$tmp/s/state.safetensors" ]' || tail -5 "$tmp/good.txt"
cp "$tmp/s/state.safetensors" "$tmp/good.safetensors"
$remat train "${common[@]}" --steps 20 --resume "$tmp/s" --save "$tmp/s" --lr 1e30 --log "$tmp/div.jsonl" \
  > "$tmp/div.txt" 2>&1
rc=$?
check "a diverging run exits non-zero" '[ $rc -ne 0 ]' || tail -5 "$tmp/div.txt"
check "... naming the step and the value" \
  'grep -Eq "^remat train: step [0-9]+: the (loss|gradient norm) is (nan|inf|-inf) \(not finite\)" "$tmp/div.txt"' ||
  tail -5 "$tmp/div.txt"
check "... and that nothing was saved after the last good step" \
  'grep -q "nothing saved after step" "$tmp/div.txt" && grep -q "state.safetensors is left as it was" "$tmp/div.txt"'
check "the state on disk is the one from before, byte for byte" 'cmp -s "$tmp/good.safetensors" "$tmp/s/state.safetensors"'
check "the log ends at the last good step, with finite values" \
  "/usr/bin/python3 - '$tmp/div.jsonl' '$tmp/div.txt' <<'PY'
import json, math, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
failed = int(re.search(r'step (\d+): the', open(sys.argv[2]).read()).group(1))
assert rows and rows[-1]['step'] == failed - 1, (rows[-1]['step'], failed)
for r in rows:
    assert r['loss'] is not None and math.isfinite(r['loss']) and r['grad_norm'] is not None, r
    assert r['skipped'] is False and r['skipped_steps'] == 0 and r['loss_scale'] == 1, r
PY"

# Skip mode: the same divergence is skipped 3 times, then stops.
$remat train "${common[@]}" --steps 20 --lr 1e30 --on-nonfinite skip --max-nonfinite-skips 3 --save "$tmp/k" \
  --log "$tmp/skip.jsonl" > "$tmp/skip.txt" 2>&1
rc=$?
check "--on-nonfinite skip stops after --max-nonfinite-skips in a row, exiting non-zero" \
  '[ $rc -ne 0 ] && grep -q "3 step(s) before it were skipped for non-finite values (--max-nonfinite-skips 3)" "$tmp/skip.txt"' ||
  tail -5 "$tmp/skip.txt"
check "... saying so for each skipped step" '[ "$(grep -c "update skipped (--on-nonfinite skip" "$tmp/skip.txt")" -eq 3 ]'
check "... logging skipped and skipped_steps, with the step tried again" \
  "/usr/bin/python3 - '$tmp/skip.jsonl' <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
good = [r for r in rows if not r['skipped']]
bad = [r for r in rows if r['skipped']]
assert len(bad) == 3, rows
assert [r['skipped_steps'] for r in bad] == [1, 2, 3], bad
assert len({r['step'] for r in bad}) == 1 and bad[0]['step'] == good[-1]['step'] + 1, rows
assert all(r['skipped_steps'] == 0 for r in good)
PY"
check "... and saved nothing" '[ ! -e "$tmp/k/state.safetensors" ]'

# Bad values of the flags.
$remat train --steps 2 --on-nonfinite ignore > "$tmp/bad1.txt" 2>&1
rc=$?
check "--on-nonfinite ignore is rejected naming the flag and the value" \
  '[ $rc -ne 0 ] && grep -q "on-nonfinite" "$tmp/bad1.txt" && grep -q "ignore" "$tmp/bad1.txt"'
$remat train --steps 2 --max-nonfinite-skips 0 > "$tmp/bad2.txt" 2>&1
rc=$?
check "--max-nonfinite-skips 0 is rejected" '[ $rc -ne 0 ] && grep -q "max-nonfinite-skips" "$tmp/bad2.txt"'
$remat train --steps 2 --lr nan --save "$tmp/n" > "$tmp/bad3.txt" 2>&1
rc=$?
check "--lr nan is rejected before any step or save" \
  '[ $rc -ne 0 ] && grep -q -- "--lr" "$tmp/bad3.txt" && ! grep -q "^step" "$tmp/bad3.txt" && [ ! -e "$tmp/n" ]'

# f16: dynamic loss scaling, logged.
$remat train "${common[@]}" --steps 6 --dtype f16 --log "$tmp/f16.jsonl" > "$tmp/f16.txt" 2>&1
rc=$?
check "--dtype f16 trains and logs loss_scale (starting at 65536)" \
  "[ $rc -eq 0 ] && /usr/bin/python3 - '$tmp/f16.jsonl' <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows[0]['loss_scale'] == 65536, rows[0]
assert sum(not r['skipped'] for r in rows) == 6
for a, b in zip(rows, rows[1:]):  # an overflow halves the scale; otherwise it stays or grows
    assert b['loss_scale'] == (a['loss_scale'] / 2 if a['skipped'] else a['loss_scale']), (a, b)
assert rows[-1]['overflow_steps'] == sum(r['skipped'] for r in rows) and rows[-1]['skipped_steps'] == 0
PY" || tail -5 "$tmp/f16.txt"

# Several processes: one rank's non-finite loss or gradients stop (or skip)
# every rank at the same step.
if command -v mpirun > /dev/null; then
  flags=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  out=$(REMAT_COMM_TIMEOUT=60 timeout 300 mpirun "${flags[@]}" --tag-output -np 2 \
    ./bazel-bin/tests/train/nonfinite_test "[mpi]" 2>&1)
  rc=$?
  check "under mpirun -np 2 every rank takes the same decision" \
    '[ $rc -eq 0 ] && [ "$(echo "$out" | grep -c "remat-tests: 1 passed, 0 failed")" -eq 2 ]' || echo "$out" | tail -20
  timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --steps 20 --dp 2 --lr 1e30 \
    > "$tmp/mpi.txt" 2>&1
  rc=$?
  check "mpirun -np 2 train --dp 2 with a diverging lr exits non-zero with the message" \
    '[ $rc -ne 0 ] && grep -Eq "remat train: step [0-9]+: the (loss|gradient norm) is" "$tmp/mpi.txt"' ||
    tail -5 "$tmp/mpi.txt"
fi
finish

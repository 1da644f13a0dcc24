#!/usr/bin/env bash
# `remat train --seq-range MIN:MAX` and `remat bench --seq-range`: each
# step's batch draws its own length from the range, the --log lines carry it
# as `seq` (and tokens_per_s counts batch x seq), the same seed draws the
# same lengths and losses again, a pipeline and data-parallel ranks
# (mpirun -np 2) log one process's losses, bench's plans see the same
# lengths, dynamic rematerialization holds its budget over them; --seq that disagrees with MAX, a bad range and --sp are refused,
# naming the flags.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
remat=./bazel-bin/tools/remat
export OMP_NUM_THREADS=1
common=(--config tiny --steps 3 --batch 4 --warmup 1 --eval-every 0 --eval-batches 1 --threads 1 --progress off)

# The log's `seq` values of file $1, space separated.
seqs() { /usr/bin/python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["seq"]) for l in open(sys.argv[1])))' "$1"; }

$remat train "${common[@]}" --seq-range 8:32 --log "$tmp/a.jsonl" > "$tmp/a.txt" 2>&1
rc=$?
check "train --seq-range 8:32 runs" '[ $rc -eq 0 ] && grep -q "^done: 3 steps" "$tmp/a.txt"' || tail -5 "$tmp/a.txt"
check "... its header names the range" 'grep -q "3 steps of 4 x \[8, 32\] tokens (a length per batch" "$tmp/a.txt"' || head -5 "$tmp/a.txt"
check "... every step logs its seq in [8, 32], not all the same, and tokens_per_s counts batch x seq" \
  '/usr/bin/python3 - "$tmp/a.jsonl" <<'"'"'PY'"'"'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
seqs = [r["seq"] for r in rows]
assert all(8 <= s <= 32 and s == int(s) for s in seqs), seqs
assert len(set(seqs)) > 1, seqs
for r in rows:  # (6 significant digits in the log)
    tokens = r["tokens_per_s"] * r["step_ms"] / 1e3
    assert abs(tokens / (4 * r["seq"]) - 1) < 1e-4, (r, tokens)
PY' || cat "$tmp/a.jsonl"

$remat train "${common[@]}" --steps 12 --seq-range 8:64:log --log "$tmp/l.jsonl" > "$tmp/l.txt" 2>&1
check "train --seq-range 8:64:log draws log-uniform lengths in [8, 64] and says so" \
  'grep -q "12 steps of 4 x \[8, 64\] tokens (a length per batch, log-uniform" "$tmp/l.txt" &&
   /usr/bin/python3 -c "import json,sys; s=[json.loads(l)[\"seq\"] for l in open(sys.argv[1])]; assert len(s) == 12 and all(8 <= x <= 64 for x in s) and len(set(s)) > 1, s" "$tmp/l.jsonl"' \
  || { tail -5 "$tmp/l.txt"; seqs "$tmp/l.jsonl"; }

$remat train "${common[@]}" --seq-range 8:32 --seq 32 --log "$tmp/b.jsonl" > "$tmp/b.txt" 2>&1
check "the same seed draws the same lengths and losses again (--seq 32 = MAX accepted)" \
  '[ "$(seqs "$tmp/a.jsonl")" = "$(seqs "$tmp/b.jsonl")" ] &&
   [ "$(grep -o "\"loss\": [^,]*" "$tmp/a.jsonl")" = "$(grep -o "\"loss\": [^,]*" "$tmp/b.jsonl")" ]' \
  || { cat "$tmp/b.txt"; seqs "$tmp/a.jsonl"; seqs "$tmp/b.jsonl"; }

$remat train "${common[@]}" --log "$tmp/fixed.jsonl" > "$tmp/fixed.txt" 2>&1
check "without --seq-range the log has no seq key" \
  '[ -s "$tmp/fixed.jsonl" ] && ! grep -q "\"seq\"" "$tmp/fixed.jsonl"' || cat "$tmp/fixed.txt"

# Resumed after 2 steps, the third step draws the same length and loss.
$remat train "${common[@]}" --seq-range 8:32 --stop-after 2 --save "$tmp/state" > "$tmp/r1.txt" 2>&1 &&
  $remat train "${common[@]}" --seq-range 8:32 --resume "$tmp/state" --log "$tmp/r2.jsonl" > "$tmp/r2.txt" 2>&1
check "a run resumed after 2 steps draws the third step's length and loss again" \
  '[ "$(seqs "$tmp/r2.jsonl")" = "$(seqs "$tmp/a.jsonl" | cut -d" " -f3)" ] &&
   [ "$(grep -o "\"loss\": [^,]*" "$tmp/r2.jsonl")" = "$(grep -o "\"loss\": [^,]*" "$tmp/a.jsonl" | tail -1)" ]' \
  || { tail -3 "$tmp/r1.txt" "$tmp/r2.txt"; cat "$tmp/r2.jsonl"; }

# Dynamic rematerialization over varying lengths: --memory-budget 50% of
# none's activations (from an in-process profile of none at MAX). Every
# step stays within the budget, evicts on the long batches, logs none's
# losses, and the run reserves less than none does (the profile's cached
# segments are returned, so what is reserved is the run's own).
$remat train "${common[@]}" --seq-range 32:128 --log "$tmp/dn.jsonl" > "$tmp/dn.txt" 2>&1
$remat train "${common[@]}" --seq-range 32:128 --recompute dynamic --memory-budget 50% --log "$tmp/dd.jsonl" \
  > "$tmp/dd.txt" 2>&1
check "dynamic 50% over --seq-range 32:128: within the budget, none's losses, less reserved than none" \
  '/usr/bin/python3 - "$tmp/dn.jsonl" "$tmp/dd.jsonl" <<'"'"'PY'"'"'
import json, sys
none, dyn = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(none) == len(dyn) == 3, (none, dyn)
assert [r["seq"] for r in none] == [r["seq"] for r in dyn]
assert [r["loss"] for r in none] == [r["loss"] for r in dyn], (none, dyn)
assert all(r["peak_allocated_bytes"] <= r["memory_budget_bytes"] for r in dyn), dyn
assert max(r["peak_allocated_bytes"] for r in none) > dyn[0]["memory_budget_bytes"], none
assert sum(r["evictions"] for r in dyn) > 0, dyn
assert max(r["peak_reserved_bytes"] for r in dyn) < max(r["peak_reserved_bytes"] for r in none), (none, dyn)
PY' || { tail -3 "$tmp/dd.txt"; cat "$tmp/dn.jsonl" "$tmp/dd.jsonl"; }

# Refusals, each naming what is wrong.
$remat train "${common[@]}" --seq-range 8:32 --recompute chunked_loss:64 > "$tmp/e0.txt" 2>&1
check "chunked_loss:64 with --seq-range 8:32 on 4 sequences is refused" \
  'grep -q "chunks of 64 tokens, but a micro-batch of the shortest length holds 32" "$tmp/e0.txt"' || cat "$tmp/e0.txt"
$remat train "${common[@]}" --seq 16 --seq-range 8:32 > "$tmp/e1.txt" 2>&1
check "--seq 16 with --seq-range 8:32 is refused naming both flags" \
  'grep -q -- "--seq 16 and --seq-range 8:32 disagree" "$tmp/e1.txt"' || cat "$tmp/e1.txt"
$remat train "${common[@]}" --seq-range 32:8 > "$tmp/e2.txt" 2>&1
check "--seq-range 32:8 is refused" 'grep -q -- "--seq-range 32:8: MIN (32) must be <= MAX (8)" "$tmp/e2.txt"' \
  || cat "$tmp/e2.txt"
$remat train "${common[@]}" --seq-range 0:8 > "$tmp/e3.txt" 2>&1
check "--seq-range 0:8 is refused" 'grep -q -- "--seq-range '"'"'0:8'"'"': expected MIN:MAX" "$tmp/e3.txt"' \
  || cat "$tmp/e3.txt"
$remat train "${common[@]}" --seq-range 8:32 --tp 2 --sp > "$tmp/e4.txt" 2>&1
check "--seq-range with --sp is refused" 'grep -q -- "--seq-range 8:32 with --sp" "$tmp/e4.txt"' || cat "$tmp/e4.txt"
$remat bench --config tiny --seq-range 8:32 --tp 1,2+sp > "$tmp/e5.txt" 2>&1
check "bench --seq-range with a +sp layout is refused" \
  'grep -q -- "bench --seq-range 8:32 with --tp 1,2+sp" "$tmp/e5.txt"' || cat "$tmp/e5.txt"

# Two ranks: a pipeline of 2 stages and 2 data-parallel ranks each log one
# process's lengths and (to 5 digits) its losses.
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join("%.5f" % json.loads(l)["loss"] for l in open(sys.argv[1])))' "$1"; }
$remat train "${common[@]}" --seq-range 8:32 --grad-accum 2 --log "$tmp/one.jsonl" > "$tmp/one.txt" 2>&1
for layout in "--pp 2" "--dp 2"; do
  name=${layout// /}
  # shellcheck disable=SC2086
  timeout 120 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --seq-range 8:32 --grad-accum 2 $layout \
    --log "$tmp/$name.jsonl" > "$tmp/$name.txt" 2>&1
  check "mpirun -np 2 train $layout --seq-range: one process's lengths and losses" \
    '[ "$(seqs "$tmp/$name.jsonl")" = "$(seqs "$tmp/one.jsonl")" ] &&
     [ "$(losses "$tmp/$name.jsonl")" = "$(losses "$tmp/one.jsonl")" ]' \
    || { tail -5 "$tmp/$name.txt"; losses "$tmp/$name.jsonl"; losses "$tmp/one.jsonl"; }
done

# bench: every plan's workers draw the same lengths (equal mean tokens), and
# the rows report the range.
$remat bench --config tiny --recompute none,per_block --repeats 1 --warmup 0 --steps 3 --threads 1 \
  --peak-flops 1e12 --seq-range 8:32 --json "$tmp/bench.json" > "$tmp/bench.txt" 2>&1
check "bench --seq-range 8:32: rows report the range, and both plans saw the same tokens" \
  '/usr/bin/python3 - "$tmp/bench.json" "$tmp/bench.txt" <<'"'"'PY'"'"'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
assert d["seq_min"] == 8 and d["seq_max"] == 32, d
assert len(rows) == 2 and all(r["seq_min"] == 8 and r["seq_max"] == 32 for r in rows), rows
tokens = [r["tokens_per_s"] * r["step_ms"] / 1e3 for r in rows]
assert abs(tokens[0] / tokens[1] - 1) < 1e-4, tokens
assert 8 * 8 <= tokens[0] <= 8 * 32, tokens  # (the mean over the steps of batch 8 x seq in [8, 32])
# Per-step figures are means over the run, not the median step: the fastest step
# is no figure of its own (it would be the shortest batch), and the text says so.
assert all(r["step_ms_best"] == r["step_ms"] for r in rows), rows
assert "each process\x27s mean step" in open(sys.argv[2]).read()
PY' || tail -20 "$tmp/bench.txt"

finish

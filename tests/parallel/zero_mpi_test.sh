#!/usr/bin/env bash
# `./remat train --zero` and `bench --dp --zero` under mpirun, through the
# CLI: a sharded state (one file per rank and an index, under --pp too)
# resumes in one process and on other layouts and exports to one Hugging
# Face folder; a rank killed while the
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
# The 2-rank set resumed by 4 ranks under --zero 3 and by 4 under --zero 1:
# each rank reads only its ranges, which cut the 2-rank pieces in half
# (read after their checksums are verified), and the runs continue with
# the losses of the one-process resume.
$remat train "${common[@]}" --resume "$tmp/state" --log "$tmp/one_resume.jsonl" > /dev/null 2>&1
for z in 3 1; do
  timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${common[@]}" --zero $z --resume "$tmp/state" \
    --log "$tmp/z${z}_4.jsonl" > "$tmp/z${z}_4.txt" 2>&1
done
check "the 2-rank set resumes on 4 ranks under --zero 3 and 1 with one process's losses" \
  "/usr/bin/python3 - '$tmp' <<'PY'
import json, sys
d = sys.argv[1]
def rows(n): return [json.loads(l) for l in open(f'{d}/{n}.jsonl')]
one = rows('one_resume')
assert len(one) == 2, one
for name in ('z3_4', 'z1_4'):
    got = rows(name)
    assert len(got) == 2, (name, got)
    for a, b in zip(one, got):
        assert a['step'] == b['step'] and abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (name, a['loss'], b['loss'])
PY" || tail -5 "$tmp/z3_4.txt"
$remat export --resume "$tmp/state" --out "$tmp/hf" > "$tmp/export.txt" 2>&1
rc=$?
check "export writes the sharded state as one Hugging Face folder" '[ $rc -eq 0 ] && [ -f "$tmp/hf/model.safetensors" ]' \
  || tail -5 "$tmp/export.txt"
# It streams: one parameter at a time from the rank files (tiny's largest,
# the embedding, is 128 KiB; the model 3.3 MiB), and writes the bytes the
# same state exports from one process's single file.
held=$(grep -o "at most [0-9.]* MiB allocated" "$tmp/export.txt" | grep -o "[0-9.]*")
check "export of a sharded state holds one tensor at a time (${held:-?} MiB at most)" \
  '[ -n "$held" ] && awk -v h="$held" "BEGIN { exit !(h < 1.0) }"'
$remat train "${common[@]}" --steps 2 --resume "$tmp/state" --save "$tmp/single" > "$tmp/single.txt" 2>&1
$remat export --resume "$tmp/single" --out "$tmp/hf1" > /dev/null 2>&1
check "the streamed export equals the export of the state resumed and saved by one process" \
  'cmp -s "$tmp/hf/model.safetensors" "$tmp/hf1/model.safetensors"' || tail -3 "$tmp/single.txt"

# train ARGS --zero 3 --save S --save-hf H on NP ranks, then `export` of S:
# --save-hf streamed the ranks' shards and wrote export's bytes.
check_streamed_save_hf() {  # TAG NP LABEL TRAIN-ARGS...
  local tag=$1 np=$2 label=$3
  shift 3
  timeout 300 mpirun "${flags[@]}" -np "$np" $remat train "$@" --zero 3 --save "$tmp/${tag}_state" \
    --save-hf "$tmp/${tag}_hf" > "$tmp/${tag}_savehf.txt" 2>&1
  local rc=$?
  $remat export --resume "$tmp/${tag}_state" --out "$tmp/${tag}_export" > /dev/null 2>&1
  check "$label" '[ $rc -eq 0 ] && grep -q "streamed from the ranks" "$tmp/${tag}_savehf.txt" && cmp -s "$tmp/${tag}_hf/model.safetensors" "$tmp/${tag}_export/model.safetensors"' \
    || tail -5 "$tmp/${tag}_savehf.txt"
}

# --pp 2 x --dp 2: ZeRO shards each stage over its replicas, with --zero 0's
# losses; a save is one file per rank of the job and the index (no rank
# gathers the stages), which one process resumes, and --save-hf streams it.
ppc=(--config tiny --steps 4 --warmup 2 --eval-every 0 --seed 5 --progress off --pp 2 --dp 2)
for z in 0 3; do
  timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${ppc[@]}" --zero $z --log "$tmp/pp_z$z.jsonl" \
    > "$tmp/pp_z$z.txt" 2>&1
done
timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${ppc[@]}" --zero 3 --stop-after 2 --save "$tmp/ppstate" \
  > "$tmp/ppsave.txt" 2>&1
rc=$?
check "--pp 2 --dp 2 --zero 3 saves one file per rank and the index" \
  '[ $rc -eq 0 ] && [ "$(ls "$tmp/ppstate/shards-2" | grep -c "^rank-[0-3].safetensors$")" -eq 4 ]' \
  || tail -5 "$tmp/ppsave.txt"
$remat train "${common[@]}" --resume "$tmp/ppstate" --log "$tmp/pp_resume.jsonl" > "$tmp/pp_resume.txt" 2>&1
timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${ppc[@]}" --zero 2 --resume "$tmp/ppstate" \
  --log "$tmp/pp_resume_z2.jsonl" > "$tmp/pp_resume_z2.txt" 2>&1
check "--pp 2 --dp 2 --zero 3 logs --zero 0's losses; its sharded state resumes on them in one process and under --pp 2 --zero 2" \
  "/usr/bin/python3 - '$tmp' <<'PY'
import json, sys
d = sys.argv[1]
def rows(n): return [json.loads(l) for l in open(f'{d}/{n}.jsonl')]
z0, z3 = rows('pp_z0'), rows('pp_z3')
assert len(z0) == len(z3) == 4, (z0, z3)
for a, b in zip(z0, z3):
    assert abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (a['loss'], b['loss'])
for name in ('pp_resume', 'pp_resume_z2'):
    resumed = rows(name)
    assert len(resumed) == 2, (name, resumed)
    for a, b in zip(z0[2:], resumed):
        assert a['step'] == b['step'] and abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (name, a['loss'], b['loss'])
PY" || tail -5 "$tmp/pp_resume.txt" "$tmp/pp_resume_z2.txt"
check_streamed_save_hf pp 4 "--pp 2 --zero 3 --save-hf streams the ranks' shards: export's bytes" "${ppc[@]}"

# --save-hf under --zero 3 streams the state the ranks saved (no process
# gathers the model): the bytes `export` writes from that state; without
# --save it writes a temporary set under the folder and removes it.
check_streamed_save_hf dp 2 "train --zero 3 --save-hf streams the ranks' shards: export's bytes" "${common[@]}"
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --zero 3 --save-hf "$tmp/hf_nosave" \
  > "$tmp/savehf2.txt" 2>&1
rc=$?
check "without --save: the same bytes, no temporary state left" \
  '[ $rc -eq 0 ] && cmp -s "$tmp/hf_nosave/model.safetensors" "$tmp/dp_hf/model.safetensors" && [ ! -e "$tmp/hf_nosave/.remat-state" ]' \
  || tail -5 "$tmp/savehf2.txt"

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

# --recompute auto under --zero 3: every rank profiles the step as the run
# runs it (its shards, gathers, keep_gathered) and all choose one plan; the
# run's losses equal plan none's (every lossless plan is bit-identical).
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --zero 3 --recompute auto --memory-budget 75% \
  --profile-rounds 1 > "$tmp/auto.txt" 2>&1
rc=$?
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --zero 3 > "$tmp/none.txt" 2>&1
losses() { grep -o "final train loss [0-9.]*, validation loss [0-9.]*" "$1"; }
check "train --zero 3 --recompute auto under mpirun: one choice, reported once" \
  '[ $rc -eq 0 ] && [ "$(grep -c "^recompute auto: " "$tmp/auto.txt")" -eq 1 ]' || tail -5 "$tmp/auto.txt"
check "its losses equal plan none's under --zero 3" \
  '[ -n "$(losses "$tmp/none.txt")" ] && [ "$(losses "$tmp/auto.txt")" = "$(losses "$tmp/none.txt")" ]' \
  || { losses "$tmp/auto.txt"; losses "$tmp/none.txt"; }

# plan under mpirun: the ranks profile together; rank 0 reports keep_gathered's
# measured change per block and the choices.
timeout 300 mpirun "${flags[@]}" -np 2 $remat plan --config tiny --zero 3 --memory-budget 75%,100% \
  --profile-rounds 1 --json "$tmp/plan.json" > "$tmp/plan.txt" 2>&1
rc=$?
check "plan --zero 3 under mpirun -np 2: one report, keep_gathered measured on every block" \
  "[ $rc -eq 0 ] && [ \"\$(grep -c '^remat plan: ' '$tmp/plan.txt')\" -eq 1 ] && /usr/bin/python3 - '$tmp/plan.json' <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d['ranks'] == 2 and d['zero'] == 3, d
kg = d['keep_gathered']
assert len(kg) == 4 and all(b['held_bytes'] > 0 and b['time_ms'] <= 0 for b in kg), kg
assert all('chosen_plan' in b for b in d['budgets']), d['budgets']
PY" || tail -20 "$tmp/plan.txt"

# bench --dp 2 --zero 3 with auto: the profile runs on the worker's ranks.
$remat bench --config tiny --recompute none,auto --memory-budget 75% --dp 2 --zero 3 --repeats 1 --warmup 1 \
  --steps 1 --threads 2 --profile-rounds 1 --json "$tmp/bench_auto.json" > "$tmp/bench_auto.txt" 2>&1
check "bench --dp 2 --zero 3 --recompute auto: the planner's row, chosen on the ranks, fits" \
  "/usr/bin/python3 - '$tmp/bench_auto.json' <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r['plan']: r for r in d['rows']}
a = rows['auto']
assert a['zero'] == 3 and a['chosen_plan'] and a['peak_allocated_bytes'] <= a['budget_bytes'], a
assert d['auto'][0]['fits'], d['auto']
PY" || tail -20 "$tmp/bench_auto.txt"

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
$remat plan --config tiny --zero 3 --memory-budget 50% > "$tmp/bad5.txt" 2>&1
check "plan --zero outside mpirun is refused" 'grep -q "run it under .mpirun -np N." "$tmp/bad5.txt"'
timeout 60 mpirun "${flags[@]}" -np 2 $remat train --config tiny --steps 1 --pp 2 --recompute auto \
  --memory-budget 50% > "$tmp/bad6.txt" 2>&1
check "--recompute auto under --pp is refused, naming the way" 'grep -q "not a pipeline.s stages" "$tmp/bad6.txt"' \
  || tail -3 "$tmp/bad6.txt"

finish

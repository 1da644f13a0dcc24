#!/usr/bin/env bash
# Pipeline parallelism (#22) under mpirun: `train --pp P` with gpipe and 1f1b,
# P = 2 and 4, plans none and per_block, dense and MoE, dropout and random
# routes, and P x D ranks with data and expert parallel inside: the saved state
# (every parameter and both AdamW moments, gathered to rank 0) equals one
# process with the same micro-batches bit for bit; a pipeline state resumes
# in one process and a one-process state under a pipeline, continuing as the
# uninterrupted run; stage 0's activation peak under 1F1B is P/M of GPipe's
# (in-flight micro-batches P vs M) and per_block shrinks each in-flight
# micro-batch to its boundaries; a killed stage makes the others exit non-zero
# naming the send / recv they were in; what is not built yet is refused.
# The one-process runs use the default thread count (every core) and the
# ranks one thread each: the bits do not depend on it (ops/gemm.h).
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
one() { env -u OMP_NUM_THREADS $remat "$@"; }  # one process, default threads
py=/usr/bin/python3
same_state() {  # A B: the two states hold the same tensors, bit for bit
  $py - "$1/state.safetensors" "$2/state.safetensors" <<'PY'
import sys
sys.path.insert(0, 'tools/reference')
import reference
a, _ = reference.read_safetensors(sys.argv[1])
b, _ = reference.read_safetensors(sys.argv[2])
assert set(a) == set(b), sorted(set(a) ^ set(b))[:5]
bad = [k for k in a if a[k].dtype != b[k].dtype or not (a[k] == b[k]).all()]
assert not bad, f'{len(bad)} of {len(a)} tensors differ, e.g. {bad[:3]}'
PY
}
for config in tiny tiny-moe; do
  common=(--config "$config" --steps 3 --warmup 1 --eval-every 0 --seed 5 --grad-accum 4 --progress off)
  one train "${common[@]}" --save "$tmp/one-$config" > /dev/null 2>&1
  for P in 2 4; do
    for sched in gpipe 1f1b; do
      for plan in none per_block; do
        name="$config pp $P $sched $plan"
        timeout 300 mpirun "${flags[@]}" -np $P $remat train "${common[@]}" --pp $P --pp-schedule $sched \
          --recompute $plan --save "$tmp/pp" > "$tmp/pp.txt" 2>&1
        check "mpirun -np $P train --pp $P ($name): the state equals one process's bit for bit" \
          "same_state $tmp/one-$config $tmp/pp || { tail -5 $tmp/pp.txt; false; }"
        rm -rf "$tmp/pp"
      done
    done
  done
done

# The chunked loss on the last stage (#35): 2 x 128 tokens per micro-batch
# make one chunk of the loss tile (256), so one process's unchunked bits.
common=(--config tiny --steps 3 --warmup 1 --eval-every 0 --seed 5 --grad-accum 4 --progress off)
for plan in chunked_loss per_block+chunked_loss; do
  timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --pp 2 --recompute $plan --save "$tmp/pp" \
    > "$tmp/pp.txt" 2>&1
  check "tiny pp 2 1f1b $plan: the state equals one unchunked process's bit for bit" \
    "same_state $tmp/one-tiny $tmp/pp || { tail -5 $tmp/pp.txt; false; }"
  rm -rf "$tmp/pp"
done

# Dropout and random routes: block b of micro-batch m draws from stream
# (m, b) whatever the schedule, so a pipeline draws one process's masks.
echo '{"name": "tiny-moe", "random_routing": true}' > "$tmp/random-routes.json"
for config in tests/checkpoint/data/tiny_dropout.json "$tmp/random-routes.json"; do
  common=(--config "$config" --steps 3 --warmup 1 --eval-every 0 --seed 5 --grad-accum 4 --progress off)
  one train "${common[@]}" --save "$tmp/one-r" --log "$tmp/one-r.jsonl" > /dev/null 2>&1
  for sched in gpipe 1f1b; do
    timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --pp 2 --pp-schedule $sched \
      --recompute per_block --save "$tmp/pp" > "$tmp/pp.txt" 2>&1
    check "$(basename "$config") pp 2 $sched per_block: the state equals one process's bit for bit" \
      "same_state $tmp/one-r $tmp/pp || { tail -5 $tmp/pp.txt; false; }"
    rm -rf "$tmp/pp"
  done
done

# f16 with dynamic loss scaling: every step's loss, scale and the state
# equal one process's (the overflow decision reads the gradient norm, which
# is one process's bit for bit).
common=(--config tiny --steps 4 --warmup 1 --eval-every 0 --seed 5 --grad-accum 4 --dtype f16 --progress off)
one train "${common[@]}" --save "$tmp/one-f16" --log "$tmp/one-f16.jsonl" > /dev/null 2>&1
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --pp 2 --recompute per_block --save "$tmp/pp-f16" \
  --log "$tmp/pp-f16.jsonl" > "$tmp/pp.txt" 2>&1
check "f16 pp 2 1f1b per_block: losses, loss scales and the state equal one process's bit for bit" \
  "same_state $tmp/one-f16 $tmp/pp-f16 && $py -c \"import json; a, b = ([(r['loss'], r['loss_scale'], r['grad_norm']) for r in map(json.loads, open(f))] for f in ['$tmp/one-f16.jsonl', '$tmp/pp-f16.jsonl']); assert a == b and len(a) == 4, (a, b)\" || { tail -5 $tmp/pp.txt; false; }"

# Pipeline x data parallel x expert parallel: P x D ranks (stage-major) equal
# the same D ranks without a pipeline, bit for bit: state, and every step's
# loss and gradient norm; dense with dropout (--dp 2) and MoE (--ep 2 inside
# each stage's replicas); the dense model also through --save-hf (remat's
# own MoE decoder has no Hugging Face class).
same_log() {  # A B: the same loss and grad_norm at every step
  $py - "$1" "$2" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) > 0, (len(a), len(b))
for x, y in zip(a, b):
    assert (x['loss'], x['grad_norm']) == (y['loss'], y['grad_norm']), (x['step'], x['loss'], y['loss'])
PY
}
for case in "tests/checkpoint/data/tiny_dropout.json --dp 2" "tiny-moe --ep 2"; do
  read -r config layout <<< "$case"
  common=(--config $config $layout --steps 3 --warmup 1 --eval-every 0 --seed 5 --grad-accum 2 --progress off)
  hf=()
  [ "$layout" = "--dp 2" ] && hf=(--save-hf "$tmp/d-hf")
  timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --save "$tmp/d" "${hf[@]}" \
    --log "$tmp/d.jsonl" > /dev/null 2>&1
  for sched in gpipe 1f1b; do
    [ "$layout" = "--dp 2" ] && hf=(--save-hf "$tmp/pd-hf")
    timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${common[@]}" --pp 2 --pp-schedule $sched \
      --recompute per_block --save "$tmp/pd" "${hf[@]}" --log "$tmp/pd.jsonl" > "$tmp/pd.txt" 2>&1
    check "mpirun -np 4 --pp 2 $layout ($(basename "$config") $sched): state, losses and grad norms equal $layout's" \
      "same_state $tmp/d $tmp/pd && same_log $tmp/d.jsonl $tmp/pd.jsonl || { tail -5 $tmp/pd.txt; false; }"
    [ "$layout" = "--dp 2" ] && check "mpirun -np 4 --pp 2 $layout ($(basename "$config") $sched): --save-hf writes the same model" \
      "$py -c \"import sys; sys.path.insert(0, 'tools/reference'); import reference as r; a, _ = r.read_safetensors('$tmp/d-hf/model.safetensors'); b, _ = r.read_safetensors('$tmp/pd-hf/model.safetensors'); assert set(a) == set(b) and all((a[k] == b[k]).all() for k in a)\""
    rm -rf "$tmp/pd" "$tmp/pd-hf"
  done
done

# Resume across layouts: 2 of 4 steps under a pipeline, the rest in one
# process, and the other way round, equal the uninterrupted run.
common=(--config tiny-moe --steps 4 --warmup 1 --eval-every 0 --seed 5 --grad-accum 4 --progress off)
one train "${common[@]}" --save "$tmp/whole" > /dev/null 2>&1
timeout 300 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --pp 2 --stop-after 2 --save "$tmp/a" > /dev/null 2>&1
$remat train "${common[@]}" --resume "$tmp/a" --save "$tmp/a" > "$tmp/a.txt" 2>&1
check "a pipeline state resumes in one process and ends as the uninterrupted run" \
  "same_state $tmp/whole $tmp/a || { tail -3 $tmp/a.txt; false; }"
$remat train "${common[@]}" --stop-after 2 --save "$tmp/b" > /dev/null 2>&1
timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${common[@]}" --pp 4 --pp-split 1,2,3 --resume "$tmp/b" \
  --save "$tmp/b" > "$tmp/b.txt" 2>&1
check "a one-process state resumes under --pp 4 and ends as the uninterrupted run" \
  "same_state $tmp/whole $tmp/b || { tail -3 $tmp/b.txt; false; }"

# Memory on stage 0 (rank 0 logs its own allocator), P = 4, M = 8, two
# blocks per stage (tiny with 8 layers), so what a micro-batch holds
# outweighs the one backward's working set that every schedule adds.
echo '{"name": "tiny", "n_layers": 8}' > "$tmp/tiny8.json"
mem=(--config "$tmp/tiny8.json" --steps 2 --warmup 1 --eval-every 0 --seed 5 --grad-accum 8 --batch 16 --progress off)
for plan in none per_block; do
  for sched in gpipe 1f1b; do
    timeout 300 mpirun "${flags[@]}" -np 4 $remat train "${mem[@]}" --pp 4 --pp-schedule $sched --recompute $plan \
      --log "$tmp/mem-$plan-$sched.jsonl" --save "$tmp/mem-state" > /dev/null 2>&1
  done
done
# A stage holds only its own weights: stage 0 (embedding and blocks 0-1)
# peaks the same whether the later stage has 6 blocks or 14.
echo '{"name": "tiny", "n_layers": 16}' > "$tmp/tiny16.json"
for n in 8 16; do
  timeout 300 mpirun "${flags[@]}" -np 2 $remat train --config "$tmp/tiny$n.json" --steps 1 --warmup 1 --eval-every 0 \
    --seed 5 --grad-accum 4 --batch 8 --pp 2 --pp-split 2 --progress off --log "$tmp/own-$n.jsonl" > /dev/null 2>&1
done
check "a stage holds only its own weights: 16 bytes per parameter of its own, the same peak whatever the other stage holds" \
  "$py - $tmp <<'PY'
import json, sys
sys.path.insert(0, 'tools/reference')
import reference
d = sys.argv[1]
state, _ = reference.read_safetensors(f'{d}/mem-state/state.safetensors')  # tiny with 8 blocks
params = {k: v.numel() for k, v in state.items() if not k.startswith('optimizer.')}
mine = sum(n for k, n in params.items() if k.startswith(('model.embed_tokens.', 'model.layers.0.', 'model.layers.1.')))
block = sum(n for k, n in params.items() if k.startswith('model.layers.2.'))
a, b = ([json.loads(l) for l in open(f'{d}/own-{n}.jsonl')][-1] for n in (8, 16))
print(f'stage 0: {mine} parameters; persistent {a[\"persistent_bytes\"]}; peak with 6 / 14 later blocks: '
      f'{a[\"peak_allocated_bytes\"]} / {b[\"peak_allocated_bytes\"]} (8 blocks of weights: {8 * 4 * block})')
assert a['persistent_bytes'] == b['persistent_bytes'] == 16 * mine  # weight, gradient, two moments
assert abs(b['peak_allocated_bytes'] - a['peak_allocated_bytes']) < 4 * block, (a, b)
PY"
check "stage 0's activations: 1F1B holds P of M micro-batches (P/M of GPipe's, within 15%); per_block keeps boundaries" \
  "$py - $tmp <<'PY'
import json, sys
d = sys.argv[1]
def last(n): return [json.loads(l) for l in open(f'{d}/mem-{n}.jsonl')][-1]
g, f = last('none-gpipe'), last('none-1f1b')
pg, pf = last('per_block-gpipe'), last('per_block-1f1b')
assert (g['pipeline_in_flight'], f['pipeline_in_flight']) == (8, 4), (g, f)
ratio = f['activation_bytes'] / g['activation_bytes']
print(f'none: gpipe {g[\"activation_bytes\"]} 1f1b {f[\"activation_bytes\"]} ratio {ratio:.3f} (P/M 0.5)')
assert abs(ratio - 0.5) <= 0.15 * 0.5, ratio
# Bytes one in-flight micro-batch holds: the difference of the schedules over
# the 4 micro-batches more that GPipe holds.
per_none = (g['activation_bytes'] - f['activation_bytes']) / 4
per_block = (pg['activation_bytes'] - pf['activation_bytes']) / 4
print(f'held per in-flight micro-batch: none {per_none:.0f}, per_block {per_block:.0f}')
# per_block: at most its two blocks' inputs (the region boundaries) and the stage's output,
# 3 x [2, 128, 128] f32 = 3 x 131072 bytes.
assert per_block <= 3 * 131072 * 1.15 and per_block * 10 < per_none, (per_block, per_none)
PY"

# 1F1B's memory does not grow with M: with the rows of a micro-batch fixed,
# 4 and 16 micro-batches hold the same on every stage (nothing of a
# micro-batch outlives its backward: sends are freed as they complete).
for M in 4 16; do
  timeout 300 mpirun "${flags[@]}" -np 2 $remat train --config tiny --steps 1 --warmup 1 --eval-every 0 --seed 5 \
    --grad-accum $M --batch $((2 * M)) --pp 2 --recompute per_block --progress off --log "$tmp/grow-$M.jsonl" > /dev/null 2>&1
done
check "1F1B with per_block: every stage's activations at M = 16 are within 15% of M = 4's" \
  "$py - $tmp <<'PY'
import json, sys
d = sys.argv[1]
a = json.loads(open(f'{d}/grow-4.jsonl').readlines()[-1])['pipeline_stages']
b = json.loads(open(f'{d}/grow-16.jsonl').readlines()[-1])['pipeline_stages']
for x, y in zip(a, b):
    print(f'stage {x[\"stage\"]}: M 4 {x[\"activation_bytes\"]}, M 16 {y[\"activation_bytes\"]}')
    assert y['activation_bytes'] <= 1.15 * x['activation_bytes'], (x, y)
PY"

# A killed stage ends the job; the survivors name the send / recv they were in.
start=$(date +%s)
REMAT_FAULT=kill:1:30 timeout 120 mpirun "${flags[@]}" -np 2 $remat train --config tiny --steps 4 --grad-accum 4 \
  --pp 2 --progress off > "$tmp/kill.txt" 2>&1
rc=$?
check "a killed stage ends the job non-zero, within the timeout" \
  '[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 100 ]'
check "the surviving stage names the send / recv it was in" \
  'grep -qE "remat: .*(send to|recv from) rank 1 \(tag [0-9]+, phase" "$tmp/kill.txt" || { cat "$tmp/kill.txt"; false; }'

# Not built yet: clear refusals.
fails_with() {  # TEXT NP ARGS...
  local text=$1 np=$2
  shift 2
  ! timeout 120 mpirun "${flags[@]}" -np "$np" $remat train --steps 1 --progress off "$@" > "$tmp/err.txt" 2>&1 &&
    grep -qF -- "$text" "$tmp/err.txt" || { cat "$tmp/err.txt"; false; }
}
check "--pp with a job size that is not a multiple is refused" \
  "fails_with 'this job has 2 rank(s), not a multiple of 4 stages' 2 --config tiny --pp 4"
check "--pp with a --dp that does not match the job is refused" \
  "fails_with '--dp 2 needs 4 ranks (pp x dp), this job has 2' 2 --config tiny --pp 2 --dp 2"
check "a region across a stage boundary is refused" \
  "fails_with 'the recompute plan'\''s region over blocks 0-3 crosses the boundary before block 2 (stage 1)' 2 --config tiny --pp 2 --recompute chunk"
finish

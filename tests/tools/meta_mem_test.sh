#!/usr/bin/env bash
# The meta device is exact: `mem --device meta` records the same allocator
# history as `mem` on the CPU, event for event (kind, block bytes, category,
# op tag, allocated and reserved bytes after it, phase markers), so the peaks
# are equal to the byte. Every plan of plans_dump_test.sh except offload
# (whose CPU history depends on when the spill file's writes finish), in f32
# and bf16, on tiny (dropout on), tiny-moe with balanced routes, bench-dense
# and bench-moe (balanced). Then the meta-only checks: a 70B shape on one
# core in seconds and little RAM, and the refusals.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
remat=./bazel-bin/tools/remat

fail() {
  failed=$((failed + 1))
  echo "FAILED: $*"
}

# check CONFIG DTYPE "PLANS" [more mem flags]: each plan on cpu and on meta.
# The CPU's offload writes and reads on the calling thread
# (REMAT_OFFLOAD_SYNC=1), so its history does not follow the I/O thread's
# timing; meta's offload is that one.
check() {
  local config=$1 dtype=$2 plans=$3
  shift 3
  for plan in $plans; do
    if ! REMAT_OFFLOAD_SYNC=1 $remat mem --config "$config" --dtype "$dtype" --recompute "$plan" "$@" --out "$tmp/cpu" \
         > /dev/null 2> "$tmp/err"; then
      fail "cpu mem $config $dtype $plan: $(tail -1 "$tmp/err")"
      continue
    fi
    if ! $remat mem --device meta --config "$config" --dtype "$dtype" --recompute "$plan" "$@" --out "$tmp/meta" \
         > /dev/null 2> "$tmp/err"; then
      fail "meta mem $config $dtype $plan: $(tail -1 "$tmp/err")"
      continue
    fi
    if /usr/bin/python3 - "$tmp/cpu.json" "$tmp/meta.json" > "$tmp/cmp.txt" 2>&1 <<'PY'
import json, sys
cpu, meta = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda e: (e["kind"], e["size"], e["category"], e["tag"], e["allocated"], e["reserved"])
a, b = [key(e) for e in cpu["events"]], [key(e) for e in meta["events"]]
for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
        sys.exit(f"event {i} of {len(a)}: cpu {x}, meta {y}")
if len(a) != len(b):
    sys.exit(f"cpu recorded {len(a)} events, meta {len(b)}")
for k in ("allocated", "reserved_peak", "by_category"):
    if cpu["peak"][k] != meta["peak"][k]:
        sys.exit(f"peak {k}: cpu {cpu['peak'][k]}, meta {meta['peak'][k]}")
assert len(a) > 100, len(a)
PY
    then
      passed=$((passed + 1))
    else
      fail "--recompute $plan ($config, $dtype): meta's history differs from the CPU's: $(cat "$tmp/cmp.txt")"
    fi
  done
}

dense="none per_block chunk selected:0,2 uniform:2 block:3 attention selective:core_attn selective:layernorm
       selective:mlp selective:save_matmul selective:save_attention selective:save_ops=matmul/scaled_dot_product_attention
       selective:mlp,layernorm selected:1,3+block:1 attention+selective:mlp per_block+keep_last uniform:2+keep_last
       per_block@0-1+selective:save_matmul@2-3 selective:mlp@1-2+attention@0
       uniform:2@0-1+selective:save_attention@2-3
       compress:bf16 compress:fp8 compress:fp8:mlp per_block+compress:fp8 compress:bf16:all
       chunked_loss per_block+chunked_loss selective:save_matmul+chunked_loss
       offload per_block+offload offload:mlp attention+offload:mlp block:2+offload:mlp chunk@1-2+offload@0-1
       chunk@0-1+per_block@2+offload per_block@0-1+offload:mlp per_block@2-3+offload:mlp@0-1
       uniform:2+keep_last+offload compress:fp8+offload offload+compress:bf16 per_block+compress:fp8+offload
       offload+chunked_loss"
moe="none per_block chunk per_block+keep_last attention moe_expert selective:moe_act selective:moe selective:shared_experts
     attention+moe_expert per_block@0-1+moe_expert@2-3 selective:save_matmul compress:fp8 per_block+compress:bf16
     chunked_loss per_block+chunked_loss offload offload:moe moe_expert+offload per_block+offload"
tiny=tests/checkpoint/data/tiny_dropout.json
echo '{"name": "tiny-moe", "dropout": 0.1, "balanced_routing": true}' > "$tmp/tiny_moe.json"
echo '{"name": "bench-moe", "balanced_routing": true}' > "$tmp/bench_moe.json"
check "$tiny" f32 "$dense"
check "$tiny" bf16 "$dense"
check "$tmp/tiny_moe.json" f32 "$moe"
check "$tmp/tiny_moe.json" bf16 "$moe"
# The bench configs: one plan of each kind (regions, save policies, a ranged
# mix, compression, the chunked loss, offload), to keep the suite short.
check bench-dense f32 "none per_block selective:save_matmul uniform:2+keep_last per_block+offload
  per_block@0-1+selective:mlp@2-3 compress:fp8 per_block+chunked_loss" --steps-before 0
check bench-dense bf16 "per_block attention+selective:mlp offload compress:fp8" --steps-before 0
check "$tmp/bench_moe.json" f32 "none per_block moe_expert attention+moe_expert selective:moe offload:moe
  per_block+chunked_loss" --steps-before 0
check "$tmp/bench_moe.json" bf16 "per_block moe_expert" --steps-before 0

# Each block's bytes held for backward: under per_block on tiny, blocks 1-3
# keep exactly their f32 boundary input (batch 8 x seq 128 x d 128 x 4 B);
# block 0 also the embedding's saves (its ids).
if $remat mem --device meta --config tiny --recompute per_block --out "$tmp/pb" > /dev/null 2> "$tmp/err" &&
   /usr/bin/python3 -c "
import json, sys
b = json.load(open(sys.argv[1]))['block_saved_bytes']
assert b[1:] == [8 * 128 * 128 * 4] * 3 and 8 * 128 * 128 * 4 < b[0] < 8 * 128 * 128 * 4 + 65536, b" "$tmp/pb.json"; then
  passed=$((passed + 1))
else
  fail "block_saved_bytes under per_block on tiny are not the block boundaries: $(tail -1 "$tmp/err")"
fi

# The time estimate (h100): none replays nothing and its backward is twice
# its forward; per_block adds a replay and costs more; the fixed cost of a
# call keeps every part above zero.
est() {
  $remat mem --device meta --config tiny --device-model h100 --recompute "$1" --out "$tmp/est" 2>&1 |
    sed -n 's/.*estimated step time (h100, an estimate): \([0-9.]*\) ms (forward \([0-9.]*\), backward \([0-9.]*\), replay \([0-9.]*\).*/\1 \2 \3 \4/p'
}
read -r n_total n_fwd n_bwd n_replay <<< "$(est none)"
read -r p_total p_fwd p_bwd p_replay <<< "$(est per_block)"
if /usr/bin/python3 -c "
import sys
n_total, n_fwd, n_bwd, n_replay, p_total, p_fwd, p_bwd, p_replay = map(float, sys.argv[1:])
assert n_fwd > 0 and n_replay == 0 and abs(n_bwd - 2 * n_fwd) < 1e-3 * n_bwd, sys.argv
assert p_replay > 0 and p_total > n_total and abs(p_fwd - n_fwd) < 1e-3 * n_fwd, sys.argv
" "${n_total:-x}" "${n_fwd:-x}" "${n_bwd:-x}" "${n_replay:-x}" "${p_total:-x}" "${p_fwd:-x}" "${p_bwd:-x}" "${p_replay:-x}" \
     2> "$tmp/err"; then
  passed=$((passed + 1))
else
  fail "the time estimate's parts for none / per_block on tiny (h100) are not as documented: $(tail -1 "$tmp/err")"
fi

# The planner on meta: bench-dense and bench-moe (balanced) at 25/50/75% of
# plan none's activations, times estimated for an H200 (whose PCIe link makes
# offload dear, so the choices are recompute plans, whose CPU peaks do not
# depend on I/O timing); each chosen plan's real CPU step fits its budget.
for cfg in bench-dense "$tmp/bench_moe.json"; do
  if ! $remat plan --device meta --device-model h200 --config "$cfg" --memory-budget 25%,50%,75% --profile-rounds 1 \
       --json "$tmp/plan.json" > "$tmp/plan.txt" 2>&1; then
    fail "plan --device meta --config $cfg: $(tail -3 "$tmp/plan.txt")"
    continue
  fi
  grep -q "step times are estimates for --device-model h200" "$tmp/plan.txt" ||
    fail "plan --device meta does not say its step times are estimates: $(head -5 "$tmp/plan.txt")"
  while read -r plan budget; do
    if $remat mem --config "$cfg" --recompute "$plan" --out "$tmp/real" > /dev/null 2> "$tmp/err" &&
       /usr/bin/python3 -c "import json, sys; sys.exit(json.load(open(sys.argv[1]))['peak']['allocated'] > int(sys.argv[2]))" \
         "$tmp/real.json" "$budget"; then
      passed=$((passed + 1))
    else
      fail "meta's plan $plan for $cfg: the CPU step peaks above its budget of $budget bytes, or failed: $(tail -1 "$tmp/err")"
    fi
  done < <(/usr/bin/python3 -c "
import json, sys
for b in json.load(open(sys.argv[1]))['budgets']: print(b['chosen_plan'], b['budget_bytes'])" "$tmp/plan.json")
done

# quick NAME MAX_SECONDS "WANT lines" ARGS...: `remat ARGS` finishes in under
# MAX_SECONDS using under 1 GiB of RAM and prints every WANT line.
quick() {
  local name=$1 max=$2 want=$3
  shift 3
  if /usr/bin/time -f "%e %M" -o "$tmp/time" $remat "$@" > "$tmp/$name.txt" 2>&1; then
    read -r secs kib < "$tmp/time"
    local ok=1
    /usr/bin/python3 -c "import sys; s, k, m = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]); \
sys.exit(not (s < m and k < 1 << 20))" "$secs" "$kib" "$max" || ok=0
    while IFS= read -r w; do grep -qF -- "$w" "$tmp/$name.txt" || ok=0; done <<< "$want"
    if [ $ok -eq 1 ]; then
      passed=$((passed + 1))
    else
      fail "$name: ${secs}s ${kib} KiB (want < $max s, < 1 GiB), want: $want; got: $(cat "$tmp/$name.txt")"
    fi
  else
    fail "$name: $(tail -2 "$tmp/$name.txt")"
  fi
}

# A 70B shape at 8192 tokens: quick, small, and its peak by category printed.
quick l70 60 "at the peak: parameter 262.83 GiB, gradient" mem --device meta --config llama3-70b --seq 8192 \
  --recompute per_block --out "$tmp/l70"

# One rank of a job that is not running (--simulate-world): 70B over dp=8 x
# pp=4 (rank 0: stage 0; rank 31: the last stage) and Mixtral under ep=8,
# each quick and small, with its stage's or experts' share of the parameters.
sim() {  # sim NAME "WANT..." mem flags
  local name=$1 want=$2
  shift 2
  quick "$name" 60 "$want" mem --device meta "$@" --out "$tmp/$name"
}
sim l70_dp8_pp4_r0 "simulated rank: 0 of dp=8,ep=1,pp=4: stage 0 (blocks 0-18), data-parallel rank 0 of 8
at the peak: parameter 64.48 GiB
held for backward per block (after its forward): 256.00 MiB (block 1) to 258.00 MiB (block 0), 4.75 GiB over 19 blocks
estimated step time (h200, an estimate)" --config llama3-70b --seq 8192 --recompute per_block \
  --simulate-world dp=8,pp=4 --simulate-rank 0 --device-model h200
sim l70_dp8_pp4_r31 "simulated rank: 31 of dp=8,ep=1,pp=4: stage 3 (blocks 61-79), data-parallel rank 7 of 8" \
  --config llama3-70b --seq 8192 --recompute per_block --simulate-world pp=4,dp=8 --simulate-rank 31
sim mixtral_ep8 "simulated rank: 0 of dp=8,ep=8,pp=1: data-parallel rank 0 of 8, expert-parallel rank 0 of 8
at the peak: parameter 26.98 GiB" --config mixtral-8x7b --seq 4096 --recompute per_block --simulate-world dp=8,ep=8
# Tensor and sequence parallel over 8 ranks (x dp=8): an eighth of the
# parameters, and per_block holding an eighth of a block's input.
sim l70_tp8_sp "simulated rank: 0 of dp=8,ep=1,pp=1,tp=8,sp: data-parallel rank 0 of 8, tensor-parallel rank 0 of 8 (sequence parallel)
at the peak: parameter 32.86 GiB
held for backward per block (after its forward): 32.00 MiB (block 1) to 32.09 MiB (block 0)" --config llama3-70b \
  --seq 8192 --recompute per_block --simulate-world dp=8,tp=8,sp
# ZeRO 3 over 64 ranks (issue #37's scale check): 70B and Llama-2-7B, bf16,
# per_block; rank 0's peak next to its arithmetic (16 x params / 64 + ZeRO's
# working set + the activations and their gradients at the peak), within 10%.
for z in llama3-70b llama2-7b; do
  sim "zero3_$z" "simulated rank: 0 of dp=64,ep=1,pp=1,zero=3
zero 3 arithmetic (this rank): 16 x" --config $z --dtype bf16 --recompute per_block --simulate-world dp=64,zero=3
  pct=$(grep -o "measured peak [0-9.]* [GM]iB ([+-][0-9.]*%)" "$tmp/zero3_$z.txt" | grep -o "[+-][0-9.]*%" | tr -d '%+')
  if [ -n "$pct" ] && awk -v p="$pct" "BEGIN { exit !(p < 10 && p > -10) }"; then
    passed=$((passed + 1))
  else
    fail "$z under dp=64,zero=3: the peak is ${pct:-?}% off its arithmetic (want within 10%)"
  fi
done
# The planner on a simulated rank: its checking run (a meta step of the same
# rank) fits, and mem's run of the plan it picks peaks where plan said.
if $remat plan --device meta --device-model h200 --config "$tmp/tiny_moe.json" --simulate-world dp=4,ep=2 \
     --simulate-rank 3 --memory-budget 50% > "$tmp/plan_sim.txt" 2>&1 &&
   grep -q "checked: the chosen plan's run in a fresh model peaked at" "$tmp/plan_sim.txt"; then
  chosen=$(awk '$1 == "chosen" {print $2; exit}' "$tmp/plan_sim.txt")
  pred=$(awk '$1 == "chosen" {print $3; exit}' "$tmp/plan_sim.txt")
  $remat mem --device meta --config "$tmp/tiny_moe.json" --simulate-world dp=4,ep=2 --simulate-rank 3 \
    --recompute "$chosen" --steps-before 1 --out "$tmp/plan_sim_mem" > /dev/null 2>&1
  if [ -n "$chosen" ] && /usr/bin/python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(not (d['peak']['allocated'] <= float(sys.argv[2]) * 1048576 * 1.01))" "$tmp/plan_sim_mem.json" "$pred"; then
    passed=$((passed + 1))
  else
    fail "plan --simulate-world: mem of '$chosen' peaks above the predicted $pred MiB"
  fi
else
  fail "plan --simulate-world: $(tail -3 "$tmp/plan_sim.txt")"
fi
# A world of one rank is the one-process step, event for event.
$remat mem --device meta --config tiny --out "$tmp/one" > /dev/null 2>&1
$remat mem --device meta --config tiny --simulate-world dp=1 --out "$tmp/one_sim" > /dev/null 2>&1
if /usr/bin/python3 -c "
import json, sys
a, b = (json.load(open(f))['events'] for f in sys.argv[1:])
key = lambda e: (e['kind'], e['size'], e['category'], e['tag'], e['allocated'], e['reserved'])
sys.exit(not (len(a) > 100 and list(map(key, a)) == list(map(key, b))))" "$tmp/one.json" "$tmp/one_sim.json"; then
  passed=$((passed + 1))
else
  fail "mem --simulate-world dp=1 differs from the one-process step"
fi

# dump --device meta: the same tensors (names, dtypes, shapes) as the CPU's
# dump and the same plan effects (balanced routes); a Hugging Face folder is
# read for its config.json and headers only.
dump_same() {  # dump_same NAME "dump flags"
  local name=$1 flags=$2
  if $remat dump $flags --out "$tmp/$name.st" > /dev/null 2>&1 &&
     $remat dump --device meta $flags --out "$tmp/$name.json" > /dev/null 2>"$tmp/$name.err" &&
     /usr/bin/python3 -c "
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
head = json.loads(raw[8:8 + n])
meta = json.load(open(sys.argv[2]))
names = {'F32': 'f32', 'BF16': 'bf16', 'I64': 'i64'}
cpu = sorted((k, names[v['dtype']], v['shape']) for k, v in head.items() if k != '__metadata__')
got = sorted((t['name'], t['dtype'], t['shape']) for t in meta['tensors'])
m = head['__metadata__']
same = all(int(m[k]) == meta[k] for k in ('recomputed_ops', 'replayed_dispatch_bytes'))
sys.exit(not (cpu == got and same and meta['device'] == 'meta' and meta['saved_after_forward_bytes'] > 0))" \
       "$tmp/$name.st" "$tmp/$name.json"; then
    passed=$((passed + 1))
  else
    fail "dump --device meta $flags: not the CPU dump's tensors and plan effects $(cat "$tmp/$name.err")"
  fi
}
dump_same moe_pb "--config $tmp/tiny_moe.json --recompute per_block"
dump_same moe_exp "--config $tmp/tiny_moe.json --recompute moe_expert --dtype bf16"
/usr/bin/python3 tools/reference/make_hf_model.py --out "$tmp/hf_llama" --arch llama --dtype bf16 --hidden 64 --heads 4 \
  --kv-heads 2 --vocab 320 --layers 2 --shards 2 > /dev/null
dump_same hf_llama "--model $tmp/hf_llama --recompute per_block"
# An 8B-wide folder (2 layers, 3.5 GB of bf16 tensors in sparse files): meta
# reads the headers, so it is quick and small.
/usr/bin/python3 -c "
import json, os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
h, f, v, kv = 4096, 14336, 128256, 1024
shapes = {'model.embed_tokens.weight': [v, h], 'model.norm.weight': [h], 'lm_head.weight': [v, h]}
for i in range(2):
    p = 'model.layers.%d.' % i
    shapes.update({p + 'input_layernorm.weight': [h], p + 'post_attention_layernorm.weight': [h],
                   p + 'self_attn.q_proj.weight': [h, h], p + 'self_attn.k_proj.weight': [kv, h],
                   p + 'self_attn.v_proj.weight': [kv, h], p + 'self_attn.o_proj.weight': [h, h],
                   p + 'mlp.gate_proj.weight': [f, h], p + 'mlp.up_proj.weight': [f, h], p + 'mlp.down_proj.weight': [h, f]})
header, at = {}, 0
for k in sorted(shapes):
    n = 2
    for d in shapes[k]: n *= d
    header[k] = {'dtype': 'BF16', 'shape': shapes[k], 'data_offsets': [at, at + n]}
    at += n
text = json.dumps(header).encode()
text += b' ' * (-len(text) % 8)
with open(os.path.join(out, 'model.safetensors'), 'wb') as fh:
    fh.write(len(text).to_bytes(8, 'little') + text)
    fh.truncate(8 + len(text) + at)
json.dump({'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': h, 'intermediate_size': f,
           'num_attention_heads': 32, 'num_key_value_heads': 8, 'num_hidden_layers': 2, 'vocab_size': v,
           'rms_norm_eps': 1e-5, 'rope_theta': 500000.0, 'tie_word_embeddings': False, 'torch_dtype': 'bfloat16'},
          open(os.path.join(out, 'config.json'), 'w'))" "$tmp/hf_8b"
quick hf_8b 30 "meta: shapes only, 45 tensors" dump --device meta --model "$tmp/hf_8b" --seq 4096 --dtype bf16 \
  --recompute per_block --out "$tmp/hf_8b.json"

# bench --estimate on meta: the same batch-1 traces as the CPU's (so the same
# predictions, to the byte), the full batch's step within 2% of a real
# worker's step (which adds the optimizer), and a time estimate per plan.
if $remat bench --estimate --config bench-dense --recompute none,per_block,selective:mlp --json "$tmp/est_cpu.json" \
     > /dev/null 2>&1 &&
   $remat bench --estimate --device meta --device-model h200 --config bench-dense --recompute none,per_block,selective:mlp \
     --json "$tmp/est_meta.json" > "$tmp/est_meta.txt" 2>&1 &&
   /usr/bin/python3 -c "
import json, sys
cpu, meta = (json.load(open(f)) for f in sys.argv[1:])
ok = len(cpu) == len(meta) == 3
for a, b in zip(cpu, meta):
    ok = ok and a['predicted_activation_bytes'] == b['predicted_activation_bytes'] and b['device'] == 'meta'
    ok = ok and abs(b['activation_bytes'] / a['activation_bytes'] - 1) < 0.02 and b['estimated_step_ms'] > 0
sys.exit(not ok)" "$tmp/est_cpu.json" "$tmp/est_meta.json" && grep -q "(h200, an estimate)" "$tmp/est_meta.txt"; then
  passed=$((passed + 1))
else
  fail "bench --estimate --device meta: $(cat "$tmp/est_meta.txt")"
fi

# Refusals: a device mem does not record, a dtype it does not train.
expect_error() {
  local want=$1
  shift
  if $remat "$@" > "$tmp/out.txt" 2>&1; then
    fail "$* succeeded; expected an error containing '$want'"
  elif grep -q -- "$want" "$tmp/out.txt"; then
    passed=$((passed + 1))
  else
    fail "$*: expected '$want', got: $(cat "$tmp/out.txt")"
  fi
}
# --device cuda records a GPU's step; without one it is refused by the device
# check (with or without the CUDA back end built).
cuda_built=0
$remat info 2>/dev/null | grep -q "CUDA back end : built" && cuda_built=1
if ! nvidia-smi -L > /dev/null 2>&1; then
  if [ $cuda_built = 1 ]; then
    expect_error "device cuda:0 is not available (0 CUDA devices present)" mem --device cuda --config tiny --out "$tmp/x"
  else
    expect_error "this build of remat has no CUDA back end" mem --device cuda --config tiny --out "$tmp/x"
  fi
fi
# --meta-kernels cuda: meta runs CUDA's op code on shapes (a build with the
# back end, no GPU needed); it says so in the info.
if [ $cuda_built = 1 ]; then
  if $remat mem --device meta --meta-kernels cuda --config tiny --dtype bf16 --recompute per_block \
      --out "$tmp/mk" > "$tmp/mk.txt" 2>&1 && grep -q "meta (CUDA's kernels)" "$tmp/mk.json" &&
      grep -q "workspace 32.00 MiB" "$tmp/mk.txt"; then
    passed=$((passed + 1))
  else
    fail "mem --device meta --meta-kernels cuda: $(cat "$tmp/mk.txt")"
  fi
else
  expect_error "this build has no CUDA back end" mem --device meta --meta-kernels cuda --config tiny --out "$tmp/x"
fi
expect_error "mem: --meta-kernels cuda needs --device meta (got cpu)" mem --meta-kernels cuda --config tiny --out "$tmp/x"
expect_error "plan: --meta-kernels cuda needs --device meta (got cpu)" plan --meta-kernels cuda --config tiny \
  --memory-budget 50%
# plan and dump take it too: the planner profiles CUDA's allocations on meta.
if [ $cuda_built = 1 ]; then
  if $remat plan --device meta --meta-kernels cuda --config tiny --memory-budget 60% > "$tmp/pk.txt" 2>&1 &&
      $remat dump --device meta --meta-kernels cuda --config tiny --out "$tmp/dk.json" > /dev/null 2>&1; then
    passed=$((passed + 1))
  else
    fail "plan/dump --device meta --meta-kernels cuda: $(cat "$tmp/pk.txt")"
  fi
fi
expect_error "mem: --meta-kernels tpu: expected cpu or cuda" mem --device meta --meta-kernels tpu --config tiny \
  --out "$tmp/x"
expect_error "unknown device 'metal'; expected cpu, cuda, cuda:N or meta" mem --device metal --config tiny --out "$tmp/x"
expect_error "expected f32 or bf16" mem --device meta --dtype f16 --config tiny --out "$tmp/x"
expect_error "unknown device model 'h300'; known: h100, h200, b200, cpu-measured" mem --device meta --device-model h300 \
  --config tiny --out "$tmp/x"
expect_error "--device meta has no values to run" plan --device meta --measure --config tiny --memory-budget 50%
expect_error "remat train: --device meta runs on shapes alone and train needs values" train --device meta --config tiny --steps 1
expect_error "dump: --device meta has no values to write: it writes shapes and saved bytes to --out FILE.json" \
  dump --device meta --config tiny --out "$tmp/x.safetensors"
expect_error "dump: --load reads a file's values, which meta cannot hold" dump --device meta --config tiny \
  --load "$tmp/moe_pb.st" --out "$tmp/x.json"
expect_error "bench: --device meta has no clock to time steps; it runs with --estimate" bench --device meta --config tiny \
  --recompute none

expect_error "mem: --simulate-world runs one rank of a job that is not running, on shapes alone; add --device meta" \
  mem --config tiny --simulate-world dp=2 --out "$tmp/x"
expect_error "mem: --simulate-rank 8: the job dp=4,ep=1,pp=2 has ranks 0 to 7" mem --device meta --config tiny \
  --simulate-world dp=4,pp=2 --simulate-rank 8 --out "$tmp/x"
expect_error "world 'cp=2': 'cp=2' is not an axis; expected dp=D,ep=E,pp=P,zero=S,tp=T,sp" mem --device meta \
  --config tiny --simulate-world cp=2 --out "$tmp/x"
expect_error "world 'dp=2,sp': sp shards the sequence over the tensor-parallel ranks; it needs tp >= 2" mem \
  --device meta --config tiny --simulate-world dp=2,sp --out "$tmp/x"
expect_error "--tp 3: config tiny does not split into 3 tensor-parallel ranks" mem --device meta --config tiny \
  --simulate-world tp=3 --out "$tmp/x"
expect_error "mem: --simulate-rank needs --simulate-world" mem --device meta --config tiny --simulate-rank 1 --out "$tmp/x"
expect_error "ep=3 must divide dp=4" mem --device meta --config tiny-moe --simulate-world dp=4,ep=3 --out "$tmp/x"

expect_error "the planner profiles one process's blocks; a pipeline (dp=1,ep=1,pp=2) is not planned yet" \
  plan --device meta --config tiny --simulate-world pp=2 --memory-budget 50%
expect_error "plan: --simulate-world runs one rank of a job that is not running, on shapes alone; add --device meta" \
  plan --config tiny --simulate-world dp=2 --memory-budget 50%

echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Hugging Face models through the CLI (#21): every recompute plan (and auto)
# dumps bit-identically to `none` on each architecture, the chunked loss too
# (#35; the tied GQA Llama), whose bad chunk sizes are refused with reasons; train --model
# fine-tunes (f32, and bf16 with a plan) and --save-hf writes a folder whose config.json has the same
# architecture and whose weights are the trained ones (dump --model of it
# passes the float64 reference); export --resume does the same from a state;
# --resume continues a fine-tune; --ep 2 under mpirun logs the one-process
# losses and exports the same weights; eval and generate take --model; bad
# folders and settings are errors that name the key or tensor.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
py=/usr/bin/python3
remat=./bazel-bin/tools/remat
export OMP_NUM_THREADS=1
make_model() {  # NAME ARGS...: a random HF folder in $tmp/NAME
  local name=$1
  shift
  $py tools/reference/make_hf_model.py --out "$tmp/$name" "$@" > /dev/null
}
common="--dtype f32 --hidden 64 --heads 4 --kv-heads 2 --vocab 320 --layers 4"
make_model llama --arch llama $common --tied --head-dim 24 --attention-bias 1
make_model qwen2 --arch qwen2 $common --kv-heads 1 --shards 2
make_model qmoe --arch qwen2_moe $common --experts 4 --top-k 2 --moe-intermediate 32 --shared-intermediate 48 \
  --norm-topk 0 --mlp-only-layers 0 --seed 3 --dtype bf16 --shards 3
make_model mixtral --arch mixtral $common --experts 4 --top-k 2 --intermediate 48 --seed 5

# 1. Plans: bit for bit equal to none, and each dump records that it ran the
# plan (its canonical string after "==" where it differs from the spec) and
# recomputed, offloaded and replayed MoE dispatch bytes as that plan implies
# (compare_dumps.py --plan).
plans_equal() {  # MODEL PLANS...
  local m=$1
  shift
  $remat dump --model "$tmp/$m" --batch 2 --seq 32 --out "$tmp/none.st" > /dev/null || return 1
  local bad=0
  for item in "$@"; do  # SPEC or SPEC==CANONICAL (the plan the dump must record it ran)
    local plan=${item%%==*} ran=${item#*==}
    if ! $remat dump --model "$tmp/$m" --batch 2 --seq 32 --recompute "$plan" --out "$tmp/plan.st" > /dev/null ||
       ! $py tools/reference/compare_dumps.py "$tmp/none.st" "$tmp/plan.st" --plan "$plan" --ran "$ran" > "$tmp/cmp.txt"; then
      echo "    --recompute $plan differs from none on $m, or did not run as $ran:"
      sed 's/^/      /' "$tmp/cmp.txt" | head -5
      bad=1
    fi
  done
  [ $bad -eq 0 ]
}
dense=$(echo per_block chunk uniform:2==chunk@0-1+chunk@2-3 block:1==per_block@0 attention selective:core_attn \
  selective:layernorm selective:mlp selective:save_matmul selective:save_attention per_block+keep_last==per_block@0-2 \
  offload per_block+offload per_block@0-1+selective:save_matmul@2-3 chunked_loss per_block+chunked_loss)
moe=$(echo per_block chunk attention moe_expert selective:moe_act selective:moe \
  attention+moe_expert offload per_block+offload moe_expert+offload selective:save_matmul per_block+keep_last==per_block@0-2)
check "every dense plan dumps bit-identical to none on Llama (GQA, tied, biases, head_dim 24)" "plans_equal llama $dense"
check "every dense plan dumps bit-identical to none on Qwen2 (one kv head, q/k/v biases)" "plans_equal qwen2 $dense"
check "every MoE plan dumps bit-identical to none on Qwen2-MoE (gated shared expert, raw top-K)" \
  "plans_equal qmoe $moe selective:shared_experts selective:mlp chunked_loss per_block+chunked_loss"
check "every MoE plan dumps bit-identical to none on Mixtral" "plans_equal mixtral $moe"
check "selective:shared_experts is refused on Mixtral (no shared expert), naming why" \
  "! $remat dump --model $tmp/mixtral --batch 2 --seq 32 --recompute selective:shared_experts --out $tmp/x.st \
     2> $tmp/err.txt && grep -q \"'shared_experts' needs shared experts, but config\" $tmp/err.txt"
# The chunked loss's bad sizes: more tokens per chunk than the batch has (2 x
# 32), under 1, or a block range.
check "--recompute chunked_loss:100000 is refused naming the batch's 64 tokens" \
  "! $remat dump --model $tmp/llama --batch 2 --seq 32 --recompute chunked_loss:100000 --out $tmp/x.st 2> $tmp/err.txt &&
   grep -qF 'chunks of 100000 tokens, but the loss sees 64 at a time' $tmp/err.txt ||
   { cat $tmp/err.txt; false; }"
check "--recompute chunked_loss:0 and chunked_loss@0-1 are refused with their reasons" \
  "! $remat dump --model $tmp/llama --batch 2 --seq 32 --recompute chunked_loss:0 --out $tmp/x.st 2> $tmp/err.txt &&
   grep -qF \"'chunked_loss:0': a chunk must be at least 1 token, got 0\" $tmp/err.txt &&
   ! $remat dump --model $tmp/llama --batch 2 --seq 32 --recompute chunked_loss@0-1 --out $tmp/x.st 2> $tmp/err.txt &&
   grep -qF 'chunked_loss takes no @range (the loss comes after the blocks)' $tmp/err.txt || { cat $tmp/err.txt; false; }"
check "--recompute auto (50% budget) dumps bit-identical to none on Qwen2-MoE" \
  "$remat dump --model $tmp/qmoe --batch 2 --seq 32 --recompute auto --memory-budget 50% --profile-rounds 1 \
     --out $tmp/auto.st > $tmp/auto.txt && $remat dump --model $tmp/qmoe --batch 2 --seq 32 --out $tmp/none.st > /dev/null &&
   $py tools/reference/compare_dumps.py $tmp/none.st $tmp/auto.st \
     --plan \"\$(sed -n 's/^recompute auto: \([^ ]*\) for .*/\1/p' $tmp/auto.txt)\" > $tmp/cmp.txt ||
   { cat $tmp/auto.txt $tmp/cmp.txt; false; }"

# 2. Fine-tune, save a state and a Hugging Face folder (f32: the trained weights exactly).
train_args="--batch 4 --seq 32 --warmup 2 --eval-every 0 --progress off"
$remat train --model "$tmp/qmoe" --steps 24 --stop-after 20 $train_args --save "$tmp/st" --save-hf "$tmp/out" --hf-dtype f32 \
  --max-shard-mb 0.2 --log "$tmp/ft.jsonl" > "$tmp/ft.txt" 2>&1
check "train --model (20 of 24 steps) --save-hf runs and lowers the loss" \
  "grep -q 'Hugging Face model written to' $tmp/ft.txt && $py - $tmp/ft.jsonl <<'PY' || { tail -5 $tmp/ft.txt; false; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20 and rows[-1]['loss'] < rows[0]['loss'] - 0.5, [r['loss'] for r in rows]
PY"
cmp_folder_state() {  # FOLDER STATE_DIR SOURCE_FOLDER: same tensors as the state's parameters, same architecture
  $py - "$@" <<'PY'
import json, os, sys
sys.path.insert(0, 'tools/reference')
import hf_reference as ref
import reference
folder, state, source = sys.argv[1:4]
cfg, src_cfg = (json.load(open(os.path.join(d, 'config.json'))) for d in (folder, source))
arch_keys = ['architectures', 'model_type', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
             'num_attention_heads', 'num_key_value_heads', 'rms_norm_eps', 'rope_theta', 'tie_word_embeddings',
             'vocab_size', 'num_experts', 'num_experts_per_tok', 'moe_intermediate_size',
             'shared_expert_intermediate_size', 'norm_topk_prob', 'decoder_sparse_step', 'mlp_only_layers',
             'router_aux_loss_coef', 'num_local_experts', 'attention_bias', 'max_position_embeddings', 'eos_token_id']
diff = [k for k in arch_keys if cfg.get(k) != src_cfg.get(k)]
assert not diff, f'config.json differs from the source in {diff}'
tensors, _ = reference.read_safetensors(os.path.join(state, 'state.safetensors'))
params = {k: v for k, v in tensors.items() if not k.startswith('optimizer.')}
files = [f for f in os.listdir(folder) if f.endswith('.safetensors')]
got = {}
for f in files:
    t, _ = reference.read_safetensors(os.path.join(folder, f))
    got.update(t)
assert set(got) == set(params), (sorted(set(got) ^ set(params)))[:5]
bad = [k for k in params if not (got[k] == params[k]).all()]
assert not bad, f'{len(bad)} tensors differ, e.g. {bad[:3]}'
PY
}
check "--save-hf: same architecture, sharded with an index, the state's weights exactly (f32)" \
  "[ -f $tmp/out/model.safetensors.index.json ] && cmp_folder_state $tmp/out $tmp/st $tmp/qmoe"
check "dump --model of the exported folder matches the float64 reference" \
  "$remat dump --model $tmp/out --batch 2 --seq 24 --out $tmp/out.st > /dev/null &&
   $py tools/reference/hf_reference.py --model $tmp/out $tmp/out.st > $tmp/ref.txt || { cat $tmp/ref.txt; false; }"
check "export --resume writes the same folder (bf16, one file) and it loads again" \
  "$remat export --resume $tmp/st --out $tmp/exp --dtype bf16 > /dev/null && [ -f $tmp/exp/model.safetensors ] &&
   $remat dump --model $tmp/exp --batch 2 --seq 24 --out $tmp/exp.st > /dev/null &&
   $py tools/reference/hf_reference.py --model $tmp/exp $tmp/exp.st > $tmp/ref.txt || { cat $tmp/ref.txt; false; }"
$remat train --model "$tmp/qmoe" --steps 24 $train_args --resume "$tmp/st" --log "$tmp/res.jsonl" > "$tmp/res.txt" 2>&1
$remat train --model "$tmp/qmoe" --steps 24 $train_args --log "$tmp/all.jsonl" > /dev/null 2>&1
check "train --model --resume continues the fine-tune as the uninterrupted run" \
  "$py - $tmp/res.jsonl $tmp/all.jsonl <<'PY' || { tail -3 $tmp/res.txt; false; }
import json, sys
res = [json.loads(l) for l in open(sys.argv[1])]
whole = [json.loads(l) for l in open(sys.argv[2])]
assert [r['step'] for r in res] == [21, 22, 23, 24], res
assert [r['loss'] for r in res] == [r['loss'] for r in whole[20:]], ([r['loss'] for r in res], [r['loss'] for r in whole[20:]])
PY"

check "train --model --dtype bf16 --recompute per_block+offload (Llama, tied) runs and lowers the loss" \
  "$remat train --model $tmp/llama --steps 8 $train_args --dtype bf16 --recompute per_block+offload \
     --log $tmp/bf16.jsonl > $tmp/bf16.txt 2>&1 && $py - $tmp/bf16.jsonl <<'PY' || { tail -3 $tmp/bf16.txt; false; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8 and rows[-1]['loss'] < rows[0]['loss'], [r['loss'] for r in rows]
PY"

# 3. Expert parallel: the one-process losses, the same exported weights.
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
timeout 300 mpirun "${flags[@]}" -np 2 $remat train --model "$tmp/mixtral" --steps 4 $train_args --ep 2 \
  --log "$tmp/ep.jsonl" --save-hf "$tmp/ep-out" --hf-dtype f32 > "$tmp/ep.txt" 2>&1
$remat train --model "$tmp/mixtral" --steps 4 $train_args --log "$tmp/one.jsonl" --save-hf "$tmp/one-out" \
  --hf-dtype f32 > /dev/null 2>&1
check "mpirun -np 2 train --model (Mixtral) --ep 2 logs the one-process losses and exports the same weights" \
  "$py - $tmp/ep.jsonl $tmp/one.jsonl $tmp/ep-out $tmp/one-out <<'PY' || { tail -5 $tmp/ep.txt; false; }
import json, os, sys
sys.path.insert(0, 'tools/reference')
import reference
ep = [json.loads(l)['loss'] for l in open(sys.argv[1])]
one = [json.loads(l)['loss'] for l in open(sys.argv[2])]
assert len(ep) == 4 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(ep, one)), (ep, one)
a, _ = reference.read_safetensors(os.path.join(sys.argv[3], 'model.safetensors'))
b, _ = reference.read_safetensors(os.path.join(sys.argv[4], 'model.safetensors'))
assert set(a) == set(b)
worst = max(float((a[k] - b[k]).abs().max() / max(b[k].abs().max(), 1e-30)) for k in a)
assert worst <= 1e-4, worst
PY"
# The same under a pipeline: 2 stages x (--ep 2), 4 ranks, export the same bits.
timeout 300 mpirun "${flags[@]}" -np 4 $remat train --model "$tmp/mixtral" --steps 4 $train_args --ep 2 --pp 2 \
  --grad-accum 2 --log "$tmp/ppep.jsonl" --save-hf "$tmp/ppep-out" --hf-dtype f32 > "$tmp/ppep.txt" 2>&1
timeout 300 mpirun "${flags[@]}" -np 2 $remat train --model "$tmp/mixtral" --steps 4 $train_args --ep 2 \
  --grad-accum 2 --log "$tmp/ep2.jsonl" --save-hf "$tmp/ep2-out" --hf-dtype f32 > /dev/null 2>&1
check "mpirun -np 4 train --model (Mixtral) --pp 2 --ep 2 logs and exports --ep 2's bits" \
  "$py - $tmp/ppep.jsonl $tmp/ep2.jsonl $tmp/ppep-out $tmp/ep2-out <<'PY' || { tail -5 $tmp/ppep.txt; false; }
import json, os, sys
sys.path.insert(0, 'tools/reference')
import reference
pp = [json.loads(l)['loss'] for l in open(sys.argv[1])]
ep = [json.loads(l)['loss'] for l in open(sys.argv[2])]
assert len(pp) == 4 and pp == ep, (pp, ep)
a, _ = reference.read_safetensors(os.path.join(sys.argv[3], 'model.safetensors'))
b, _ = reference.read_safetensors(os.path.join(sys.argv[4], 'model.safetensors'))
assert set(a) == set(b) and all((a[k] == b[k]).all() for k in a)
PY"

# --model under --zero 3: each rank reads only its shards' byte ranges of the
# folder's tensors (the routed experts under --ep 2 whole) and trains as
# --zero 2, which loads whole tensors, bit for bit.
for z in 2 3; do
  timeout 300 mpirun "${flags[@]}" -np 2 $remat train --model "$tmp/mixtral" --steps 3 $train_args --ep 2 --zero $z \
    --log "$tmp/z$z.jsonl" > "$tmp/z$z.txt" 2>&1
done
check "mpirun -np 2 train --model (Mixtral) --ep 2 --zero 3 reads its ranges and logs --zero 2's losses" \
  "$py - $tmp/z3.jsonl $tmp/z2.jsonl <<'PY' || { tail -5 $tmp/z3.txt; false; }
import json, sys
z3 = [json.loads(l)['loss'] for l in open(sys.argv[1])]
z2 = [json.loads(l)['loss'] for l in open(sys.argv[2])]
assert len(z3) == 3 and z3 == z2, (z3, z2)
PY"

# 4. eval and generate take a Hugging Face folder.
make_model qtok --arch qwen2 --dtype bf16 --hidden 32 --heads 2 --kv-heads 1 --layers 2 --vocab 151669 \
  --tokenizer-from tests/tokenizer/data/qwen3
check "eval --model DIR --data TEXT prints a validation loss" \
  "$remat eval --model $tmp/qwen2 --data docs/REFERENCE.md --batches 2 --batch 2 --seq 32 --json - > $tmp/eval.json &&
   $py -c \"import json,math; j=json.load(open('$tmp/eval.json')); assert math.isfinite(j['val_loss']) and j['val_loss'] > 0\""
check "generate --model DIR (its tokenizer): greedy decoding is deterministic and continues the prompt" \
  "$remat generate --model $tmp/qtok --prompt 'In the beginning' --temperature 0 --max-new 8 --no-stop > $tmp/g1.txt &&
   $remat generate --model $tmp/qtok --prompt 'In the beginning' --temperature 0 --max-new 8 --no-stop > $tmp/g2.txt &&
   cmp -s $tmp/g1.txt $tmp/g2.txt && grep -q '^In the beginning' $tmp/g1.txt && [ \$(wc -c < $tmp/g1.txt) -gt 18 ]"

# 5. Errors name the key, the tensor or the flag.
fails_with() {  # TEXT COMMAND...: the command fails and its stderr contains TEXT
  local text=$1
  shift
  ! "$@" > "$tmp/err.txt" 2>&1 && grep -qF -- "$text" "$tmp/err.txt" || { cat "$tmp/err.txt"; false; }
}
make_model scaled --arch llama $common --extra 'rope_scaling={"type":"linear","factor":2.0}'
make_model gelu --arch llama $common --extra 'hidden_act="gelu"'
make_model deeper --arch llama $common --extra 'num_hidden_layers=5'
make_model wide --arch llama $common --extra 'vocab_size=400'
make_model tiedcfg --arch llama $common --extra 'tie_word_embeddings=true'
mkdir -p "$tmp/noweights" && cp "$tmp/llama/config.json" "$tmp/noweights/"
dump=(dump --batch 1 --seq 8 --out "$tmp/x.st")
check "rope_scaling is an error naming the key" "fails_with '\"rope_scaling\": {\"factor\":2,\"type\":\"linear\"} is not supported' $remat ${dump[*]} --model $tmp/scaled"
check "another activation is an error naming it" "fails_with '\"hidden_act\": \"gelu\" is not supported' $remat ${dump[*]} --model $tmp/gelu"
check "missing tensors are named" "fails_with 'missing 9: model.layers.4.' $remat ${dump[*]} --model $tmp/deeper"
check "mis-shaped tensors are named" "fails_with 'model.embed_tokens.weight is [320, 64], the model needs [400, 64]' $remat ${dump[*]} --model $tmp/wide"
check "unexpected tensors are named" "fails_with 'unexpected 1 (not parameters of this model): lm_head.weight' $remat ${dump[*]} --model $tmp/tiedcfg"
check "a folder without weights names both file names" "fails_with 'model.safetensors.index.json' $remat ${dump[*]} --model $tmp/noweights"
check "a folder without config.json is not a model" "fails_with 'not a Hugging Face model folder' $remat ${dump[*]} --model $tmp"
check "--model with --config is refused" "fails_with 'drop --config' $remat train --model $tmp/llama --config tiny --steps 1"
check "remat's own MoE decoder cannot be exported" \
  "fails_with 'has no Hugging Face class' $remat train --config tiny-moe --steps 1 --save-hf $tmp/nope"
finish

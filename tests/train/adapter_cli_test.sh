#!/usr/bin/env bash
# LoRA adapters in and out as Hugging Face PEFT folders (#40 item 5), on a
# tiny Llama-style folder (GQA, tied embeddings): train --lora --save-adapter
# writes adapter_config.json (PEFT's keys) and adapter_model.safetensors
# (base_model.model.<name>, F32, the state's adapter values bit for bit);
# dump --model BASE --adapter DIR equals dump of the trained state's
# parameters bit for bit (loss, every parameter and gradient), dropout
# included; export --adapter-only writes the same folder; export
# --merge-adapter, train --save-hf and export --model --adapter
# --merge-adapter write the same merged weights (W + alpha/r B A in f32),
# whose dump is within 1e-5 of the adapter's (merged weights round
# differently) and which train / eval load back; train --adapter trains on;
# a Qwen2-MoE bf16 folder with every expert adapted under mpirun --ep 2 does
# the same; bad adapter folders and flags fail before any work, naming the
# key or tensor.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
py=/usr/bin/python3
remat=./bazel-bin/tools/remat
export OMP_NUM_THREADS=1
common="--arch llama --dtype f32 --heads 4 --kv-heads 2 --vocab 320 --layers 2"
$py tools/reference/make_hf_model.py --out "$tmp/base" $common --hidden 64 --tied > /dev/null
$py tools/reference/make_hf_model.py --out "$tmp/other" $common --hidden 32 --tied > /dev/null
targets=q_proj,v_proj,down_proj
lora="r=4,alpha=8,dropout=0,targets=$targets"
train_args="--batch 2 --seq 32 --warmup 1 --lr 1e-2 --eval-every 0 --progress off"
fails_with() {  # TEXT CMD...: CMD fails and its stderr holds TEXT
  local text=$1
  shift
  if "$@" > "$tmp/out.txt" 2> "$tmp/err.txt"; then echo "    succeeded: $*"; return 1; fi
  grep -qF -- "$text" "$tmp/err.txt" || { echo "    stderr:"; sed 's/^/      /' "$tmp/err.txt"; return 1; }
}
# A safetensors reader / writer (numpy only) for the checks below.
cat > "$tmp/st.py" <<'PY'
import json, struct
import numpy as np
NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "I32": np.int32}
def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for k, v in header.items():
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], np.frombuffer(data[8 + n + a:8 + n + b], NP[v["dtype"]]).reshape(v["shape"]))
    return out, meta
def write(path, tensors):  # name -> (dtype, array)
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for k, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
export PYTHONPATH=$tmp

# 1. Train a LoRA run; the adapter folder, the state and the merged folder.
$remat train --model "$tmp/base" --lora "$lora" --steps 3 $train_args --save "$tmp/st" --save-adapter "$tmp/ad" \
  --save-hf "$tmp/hf" > "$tmp/train.txt" 2>&1
check "train --lora --save-adapter --save-hf writes both folders" \
  "grep -q 'adapter written to $tmp/ad (LoRA r=4' $tmp/train.txt && grep -q 'the LoRA adapters merged' $tmp/train.txt ||
   { tail -5 $tmp/train.txt; false; }"
check "adapter_config.json has PEFT's keys and this run's values" "$py - $tmp/ad $tmp/base <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + '/adapter_config.json'))
want = {'peft_type': 'LORA', 'task_type': 'CAUSAL_LM', 'r': 4, 'lora_alpha': 8, 'lora_dropout': 0, 'bias': 'none',
        'fan_in_fan_out': False, 'inference_mode': True, 'base_model_name_or_path': sys.argv[2],
        'modules_to_save': None, 'init_lora_weights': True, 'use_rslora': False, 'use_dora': False,
        'layers_to_transform': None, 'layers_pattern': None, 'rank_pattern': {}, 'alpha_pattern': {},
        'revision': None}
assert sorted(c) == sorted(list(want) + ['target_modules']), sorted(c)
bad = {k: c[k] for k in want if c[k] != want[k] or type(c[k]) != type(want[k])}
assert not bad, bad
assert sorted(c['target_modules']) == ['down_proj', 'q_proj', 'v_proj'], c['target_modules']
PY"
check "adapter_model.safetensors: PEFT's names, F32, the state's adapter values bit for bit, no other tensor" \
  "$py - $tmp/ad $tmp/st <<'PY'
import sys, st
ad, meta = st.read(sys.argv[1] + '/adapter_model.safetensors')
state, _ = st.read(sys.argv[2] + '/state.safetensors')
assert meta == {'format': 'pt'}, meta
mods = ['self_attn.q_proj', 'self_attn.v_proj', 'mlp.down_proj']
names = {f'base_model.model.model.layers.{i}.{m}.lora_{x}.weight' for i in range(2) for m in mods for x in 'AB'}
assert set(ad) == names, sorted(set(ad) ^ names)
shapes = {'q_proj.lora_A': (4, 64), 'q_proj.lora_B': (64, 4), 'v_proj.lora_B': (32, 4), 'down_proj.lora_A': (4, 96)}
for k, (dt, a) in ad.items():
    assert dt == 'F32', (k, dt)
    ref = state[k[len('base_model.model.'):]][1]
    assert a.shape == ref.shape and a.tobytes() == ref.tobytes(), k
    for s, shape in shapes.items():
        assert s not in k or a.shape == shape, (k, a.shape)
    assert '.lora_A.' in k or abs(a).max() > 0, k + ' was not trained'
PY"

# 2. The adapter loaded over its base gives the trained model's dump bit for bit.
same_dumps() {  # A B: every tensor equal bit for bit
  $py - "$1" "$2" <<'PY'
import sys, st
a, _ = st.read(sys.argv[1])
b, _ = st.read(sys.argv[2])
assert set(a) == set(b), sorted(set(a) ^ set(b))[:5]
bad = [k for k in a if a[k][1].tobytes() != b[k][1].tobytes()]
assert not bad, f'{len(bad)} tensors differ: {bad[:4]}'
PY
}
close_loss() {  # A B TOL: loss.ce of dump A within TOL (relative) of dump B's
  $py - "$@" <<'PY'
import sys, st
a, b = (float(st.read(p)[0]['loss.ce'][1].reshape(-1)[0]) for p in sys.argv[1:3])
assert abs(a - b) <= float(sys.argv[3]) * abs(b), (a, b)
print(f'    {sys.argv[1].split("/")[-1]}: loss {a!r}, adapter {b!r}, relative difference {abs(a - b) / abs(b):.2e}')
PY
}
dump_args="--batch 2 --seq 24"
$remat dump --model "$tmp/base" --lora "$lora" --load "$tmp/st/state.safetensors" $dump_args --out "$tmp/mem.st" > /dev/null
$remat dump --model "$tmp/base" --adapter "$tmp/ad" $dump_args --out "$tmp/ad.st" > "$tmp/dump.txt" 2>&1
check "dump --model BASE --adapter DIR equals the trained state's dump bit for bit (loss, parameters, gradients)" \
  "same_dumps $tmp/mem.st $tmp/ad.st || { cat $tmp/dump.txt; false; }"
# lora_dropout read back drives the same dropout as --lora's (dump runs in training mode).
mkdir -p "$tmp/ad_drop" && cp "$tmp/ad/adapter_model.safetensors" "$tmp/ad_drop/"
$py -c "import json; c = json.load(open('$tmp/ad/adapter_config.json')); c['lora_dropout'] = 0.25
json.dump(c, open('$tmp/ad_drop/adapter_config.json', 'w'), indent=2, sort_keys=True)"
$remat dump --model "$tmp/base" --lora "r=4,alpha=8,dropout=0.25,targets=$targets" --load "$tmp/st/state.safetensors" \
  $dump_args --out "$tmp/mem_drop.st" > /dev/null
$remat dump --model "$tmp/base" --adapter "$tmp/ad_drop" $dump_args --out "$tmp/ad_drop.st" > /dev/null
check "an adapter with lora_dropout 0.25 dumps as --lora dropout=0.25 does, bit for bit (and unlike dropout 0)" \
  "same_dumps $tmp/mem_drop.st $tmp/ad_drop.st && ! same_dumps $tmp/ad.st $tmp/ad_drop.st > /dev/null 2>&1"
# adapter_config.json as a recent PEFT (0.19) writes it, every key, indented: the same model.
mkdir -p "$tmp/ad_peft" && cp "$tmp/ad/adapter_model.safetensors" "$tmp/ad_peft/"
cat > "$tmp/ad_peft/adapter_config.json" <<'JSON'
{
  "alora_invocation_tokens": null,
  "alpha_pattern": {},
  "arrow_config": null,
  "auto_mapping": null,
  "base_model_name_or_path": "someone/tiny-llama",
  "bias": "none",
  "corda_config": null,
  "ensure_weight_tying": false,
  "eva_config": null,
  "exclude_modules": null,
  "fan_in_fan_out": false,
  "inference_mode": true,
  "init_lora_weights": true,
  "layer_replication": null,
  "layers_pattern": null,
  "layers_to_transform": null,
  "loftq_config": {},
  "lora_alpha": 8,
  "lora_bias": false,
  "lora_dropout": 0.0,
  "lora_ga_config": null,
  "megatron_config": null,
  "megatron_core": "megatron.core",
  "modules_to_save": null,
  "peft_type": "LORA",
  "peft_version": "0.19.1",
  "qalora_group_size": 16,
  "r": 4,
  "rank_pattern": {},
  "revision": null,
  "target_modules": [
    "v_proj",
    "down_proj",
    "q_proj"
  ],
  "target_parameters": null,
  "task_type": "CAUSAL_LM",
  "trainable_token_indices": null,
  "use_bdlora": null,
  "use_dora": false,
  "use_qalora": false,
  "use_rslora": false
}
JSON
$remat dump --model "$tmp/base" --adapter "$tmp/ad_peft" $dump_args --out "$tmp/ad_peft.st" > /dev/null
check "adapter_config.json as PEFT 0.19 writes it (every key, targets in another order) loads the same model" \
  "same_dumps $tmp/ad.st $tmp/ad_peft.st"
$remat export --resume "$tmp/st" --adapter-only --model "$tmp/base" --out "$tmp/ad_x" > /dev/null
$remat export --resume "$tmp/st" --adapter-only --dtype bf16 --out "$tmp/ad_bf16" > /dev/null
$remat dump --model "$tmp/base" --adapter "$tmp/ad_bf16" $dump_args --out "$tmp/ad_bf16.st" > /dev/null
check "export --adapter-only writes the same folder as --save-adapter; a bf16 one loads (BF16 tensors)" \
  "cmp -s $tmp/ad/adapter_model.safetensors $tmp/ad_x/adapter_model.safetensors &&
   cmp -s $tmp/ad/adapter_config.json $tmp/ad_x/adapter_config.json &&
   grep -q '\"dtype\":\"BF16\"' $tmp/ad_bf16/adapter_model.safetensors &&
   grep -q '\"base_model_name_or_path\":null' $tmp/ad_bf16/adapter_config.json && [ -s $tmp/ad_bf16.st ]"

# 3. Merged: export --merge-adapter, train --save-hf and export --model --adapter agree.
$remat export --resume "$tmp/st" --merge-adapter --out "$tmp/mg" > "$tmp/export.txt" 2>&1
$remat export --model "$tmp/base" --adapter "$tmp/ad" --merge-adapter --out "$tmp/mg2" > /dev/null 2>&1
check "export --merge-adapter: W + (alpha/r) B A (f32), the other tensors the base's, no adapter keys" \
  "$py - $tmp/mg $tmp/base $tmp/ad <<'PY' || { cat $tmp/export.txt; false; }
import json, sys, st
import numpy as np
mg, _ = st.read(sys.argv[1] + '/model.safetensors')
base, _ = st.read(sys.argv[2] + '/model.safetensors')
ad, _ = st.read(sys.argv[3] + '/adapter_model.safetensors')
assert set(mg) == set(base), sorted(set(mg) ^ set(base))
merged = 0
for k, (dt, w) in mg.items():
    stem = 'base_model.model.' + k[:-len('.weight')]
    if stem + '.lora_A.weight' not in ad:
        assert w.tobytes() == base[k][1].tobytes(), k
        continue
    want = base[k][1].astype(np.float64) + 2.0 * (ad[stem + '.lora_B.weight'][1].astype(np.float64) @
                                                  ad[stem + '.lora_A.weight'][1].astype(np.float64))
    err = abs(w - want).max() / abs(want).max()
    assert err < 1e-6 and w.tobytes() != base[k][1].tobytes(), (k, err)
    merged += 1
assert merged == 6, merged
cfg = open(sys.argv[1] + '/config.json').read()
assert 'lora' not in cfg and 'freeze' not in cfg, cfg
PY"
check "train --save-hf and export --model BASE --adapter DIR --merge-adapter write the same merged weights" \
  "cmp -s $tmp/mg/model.safetensors $tmp/hf/model.safetensors && cmp -s $tmp/mg/model.safetensors $tmp/mg2/model.safetensors"
$remat dump --model "$tmp/mg" $dump_args --out "$tmp/mg.st" > /dev/null
check "dump of the merged folder: loss within 1e-5 (relative) of the adapter's (merged weights are rounded)" \
  "close_loss $tmp/mg.st $tmp/ad.st 1e-5"
head -c 20000 README.md > "$tmp/text.txt"
check "the merged folder trains and evaluates with --model" \
  "$remat train --model $tmp/mg --steps 1 $train_args > $tmp/t1.txt 2>&1 &&
   $remat eval --model $tmp/mg --data $tmp/text.txt --batch 2 --seq 32 --batches 2 > $tmp/e1.txt 2>&1 ||
   { tail -3 $tmp/t1.txt $tmp/e1.txt; false; }"
check "eval --model BASE --adapter DIR gives the trained state's validation loss" \
  "$remat eval --resume $tmp/st --data $tmp/text.txt --batches 2 --json - > $tmp/e_state.json &&
   $remat eval --model $tmp/base --adapter $tmp/ad --data $tmp/text.txt --batch 2 --seq 32 --batches 2 --json - \
     > $tmp/e_ad.json && [ \"\$(grep -o '\"val_loss\": [^,]*' $tmp/e_state.json)\" = \
                          \"\$(grep -o '\"val_loss\": [^,]*' $tmp/e_ad.json)\" ] || { cat $tmp/e_state.json $tmp/e_ad.json; false; }"
check "train --model BASE --adapter DIR trains the adapter on and saves it again" \
  "$remat train --model $tmp/base --adapter $tmp/ad --steps 2 $train_args --save-adapter $tmp/ad2 > $tmp/t2.txt 2>&1 &&
   grep -q 'adapter: $tmp/ad (LoRA r=4' $tmp/t2.txt && ! cmp -s $tmp/ad/adapter_model.safetensors \
     $tmp/ad2/adapter_model.safetensors || { tail -3 $tmp/t2.txt; false; }"

# 4. Qwen2-MoE from a bf16 folder (frozen weights kept bf16), every expert's
# linears adapted, trained under --ep 2: the adapter holds every expert.
$py tools/reference/make_hf_model.py --out "$tmp/qmoe" --arch qwen2_moe --dtype bf16 --heads 4 --kv-heads 2 --vocab 320 \
  --layers 2 --hidden 64 --experts 4 --top-k 2 --moe-intermediate 32 --shared-intermediate 48 --seed 3 > /dev/null
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
moe_lora="r=4,targets=q_proj,gate_proj,up_proj,down_proj"
timeout 300 mpirun "${flags[@]}" -np 2 $remat train --model "$tmp/qmoe" --lora "$moe_lora" --ep 2 --steps 2 $train_args \
  --save "$tmp/stm" --save-adapter "$tmp/adm" > "$tmp/moe.txt" 2>&1
check "mpirun -np 2 train --ep 2 --save-adapter (Qwen2-MoE): every expert's and the shared expert's adapters" \
  "$py - $tmp/adm <<'PY' || { tail -3 $tmp/moe.txt; false; }
import sys, st
ad, _ = st.read(sys.argv[1] + '/adapter_model.safetensors')
mods = ['self_attn.q_proj'] + [f'mlp.{e}.{p}' for e in ['experts.0', 'experts.1', 'experts.2', 'experts.3',
                                                         'shared_expert'] for p in ['gate_proj', 'up_proj', 'down_proj']]
names = {f'base_model.model.model.layers.{i}.{m}.lora_{x}.weight' for i in range(2) for m in mods for x in 'AB'}
assert set(ad) == names, sorted(set(ad) ^ names)[:6]
PY"
$remat dump --model "$tmp/qmoe" --lora "$moe_lora" --load "$tmp/stm/state.safetensors" $dump_args --out "$tmp/mm.st" > /dev/null
$remat dump --model "$tmp/qmoe" --adapter "$tmp/adm" $dump_args --out "$tmp/ma.st" > /dev/null
check "Qwen2-MoE: dump --adapter equals the state's dump bit for bit; mpirun --ep 2 trains on from the adapter" \
  "same_dumps $tmp/mm.st $tmp/ma.st && timeout 300 mpirun ${flags[*]} -np 2 $remat train --model $tmp/qmoe \
     --adapter $tmp/adm --ep 2 --steps 1 $train_args > $tmp/moe2.txt 2>&1 || { tail -3 $tmp/moe2.txt; false; }"
$remat export --resume "$tmp/stm" --merge-adapter --out "$tmp/mgm" > /dev/null
$remat export --resume "$tmp/stm" --merge-adapter --dtype bf16 --out "$tmp/mgmb" > /dev/null
$remat dump --model "$tmp/mgm" $dump_args --out "$tmp/mgm.st" > /dev/null
$remat dump --model "$tmp/mgmb" $dump_args --out "$tmp/mgmb.st" > /dev/null
check "Qwen2-MoE merged from its bf16 base: f32 export within 1e-5 of the adapter's loss, bf16 within 1e-3" \
  "close_loss $tmp/mgm.st $tmp/ma.st 1e-5 && close_loss $tmp/mgmb.st $tmp/ma.st 1e-3"

# 5. Bad folders and flags: errors before any work, naming the key or tensor.
$remat train --model "$tmp/other" --lora "$lora" --steps 1 $train_args --save-adapter "$tmp/ad_other" > /dev/null 2>&1
check "another base's adapter: the tensor, both shapes, 'another base model'; train stops before it saves" \
  "fails_with 'probably an adapter for another base model' $remat train --model $tmp/base --adapter $tmp/ad_other \
     --steps 1 $train_args --save $tmp/never &&
   grep -qF 'tensor base_model.model.model.layers.0.mlp.down_proj.lora_B.weight is [32, 4], the model' $tmp/err.txt &&
   grep -qF ' model.layers.0.mlp.down_proj.lora_B.weight is [64, 4] (and 9 more)' $tmp/err.txt && [ ! -e $tmp/never ]"
check "a missing folder or adapter_model.safetensors is named" \
  "fails_with 'no adapter_config.json' $remat dump --model $tmp/base --adapter $tmp/nowhere --out $tmp/x.st &&
   mkdir -p $tmp/ad_nw && cp $tmp/ad/adapter_config.json $tmp/ad_nw/ &&
   fails_with 'no adapter_model.safetensors' $remat dump --model $tmp/base --adapter $tmp/ad_nw --out $tmp/x.st"
unsupported() {  # KEY JSON TEXT: the adapter with KEY set to JSON is refused with '"KEY" TEXT'
  rm -rf "$tmp/ad_bad" && cp -r "$tmp/ad" "$tmp/ad_bad"
  $py -c "import json, sys; p = '$tmp/ad_bad/adapter_config.json'; c = json.load(open(p)); c['$1'] = json.loads(sys.argv[1])
json.dump(c, open(p, 'w'))" "$2"
  fails_with "\"$1\" $3" $remat dump --model "$tmp/base" --adapter "$tmp/ad_bad" --out "$tmp/x.st"
}
check "unsupported PEFT settings are refused, naming the key" \
  "unsupported use_dora true 'is true: DoRA' && unsupported use_rslora true 'is true: rsLoRA' &&
   unsupported bias '\"all\"' 'is \"all\": only \"none\"' && unsupported fan_in_fan_out true 'is true: fan_in_fan_out' &&
   unsupported modules_to_save '[\"lm_head\"]' 'is [\"lm_head\"]: modules_to_save' &&
   unsupported rank_pattern '{\"q_proj\": 8}' 'is {\"q_proj\":8}: rank_pattern' &&
   unsupported layers_to_transform '[0]' 'is [0]: layers_to_transform' &&
   unsupported target_modules '\".*proj\"' 'is a regular expression' &&
   unsupported init_lora_weights '\"pissa\"' 'is \"pissa\": that initialisation changes the base' &&
   unsupported peft_type '\"IA3\"' 'must be \"LORA\"' && unsupported task_type '\"SEQ_CLS\"' 'is \"SEQ_CLS\"'"
edit_tensors() {  # PYTHON: run on the adapter's tensors `t` (a dict), written to $tmp/ad_bad
  rm -rf "$tmp/ad_bad" && cp -r "$tmp/ad" "$tmp/ad_bad"
  $py -c "import st; p = '$tmp/ad_bad/adapter_model.safetensors'; t = st.read(p)[0]; $1; st.write(p, t)"
}
check "a tensor the model lacks and a missing adapter tensor are named" \
  "edit_tensors \"t['base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight'] = t['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight']\" &&
   fails_with 'tensor base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight is not an adapter parameter of the model' \
     $remat dump --model $tmp/base --adapter $tmp/ad_bad --out $tmp/x.st &&
   edit_tensors \"del t['base_model.model.model.layers.1.mlp.down_proj.lora_B.weight']\" &&
   fails_with 'has no tensor for model.layers.1.mlp.down_proj.lora_B.weight [64, 4]' \
     $remat dump --model $tmp/base --adapter $tmp/ad_bad --out $tmp/x.st"
check "PEFT's names with the adapter name (lora_A.default.weight) load too" \
  "edit_tensors \"t = {k.replace('.weight', '.default.weight'): v for k, v in t.items()}\" &&
   $remat dump --model $tmp/base --adapter $tmp/ad_bad $dump_args --out $tmp/x.st > /dev/null && same_dumps $tmp/ad.st $tmp/x.st"
check "--lora disagreeing with --adapter, --adapter without --model, --save-adapter without LoRA are refused" \
  "fails_with 'disagree: the adapter is LoRA r=4' $remat train --model $tmp/base --adapter $tmp/ad --lora r=8 --steps 1 &&
   fails_with 'needs --model BASE' $remat dump --adapter $tmp/ad --out $tmp/x.st &&
   fails_with 'goes with --model BASE' $remat eval --resume $tmp/st --adapter $tmp/ad &&
   fails_with '--save-adapter writes LoRA adapters' $remat train --model $tmp/base --steps 1 --save-adapter $tmp/x"
check "export of a LoRA state without --merge-adapter, and --merge-adapter without adapters, are refused" \
  "fails_with 'is a LoRA fine-tune (r=4,alpha=8,dropout=0,targets=q_proj,v_proj,down_proj): give --merge-adapter' \
     $remat export --resume $tmp/st --out $tmp/x && [ ! -e $tmp/x ] &&
   $remat train --model $tmp/base --steps 1 $train_args --save $tmp/st_full > /dev/null 2>&1 &&
   fails_with 'has no LoRA adapters to merge' $remat export --resume $tmp/st_full --merge-adapter --out $tmp/x"
finish

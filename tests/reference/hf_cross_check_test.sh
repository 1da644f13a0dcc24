#!/usr/bin/env bash
# Hugging Face models (#21): `./remat dump --model DIR` against the
# independent float64 PyTorch implementation with HF semantics
# (tools/reference/hf_reference.py, which reads the folder itself): loss.ce
# and loss.aux to 1e-5 relative, every gradient to 1e-4 of its tensor's
# largest value. Each architecture with grouped-query attention, as sharded
# bf16 files and as one f32 file: Llama (tied embeddings, head_dim != hidden /
# heads, attention biases), Qwen2 (q/k/v biases, one kv head), Qwen2-MoE
# (shared expert with its gate, un-renormalised top-K, a dense layer, sparse
# step), Mixtral (block_sparse_moe w1/w3/w2). Also the reference's own
# self-check (tools/reference/hf_reference_selftest.py).
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
py=/usr/bin/python3
make_model() {  # NAME ARGS...: a random HF folder in $tmp/NAME
  local name=$1
  shift
  $py tools/reference/make_hf_model.py --out "$tmp/$name" "$@" > /dev/null
}
cross_check() {  # NAME SEED: dump the folder and check it against the reference
  ./bazel-bin/tools/remat dump --model "$tmp/$1" --batch 2 --seq 24 --seed "$2" --out "$tmp/$1-$2.st" > /dev/null &&
    $py tools/reference/hf_reference.py --model "$tmp/$1" "$tmp/$1-$2.st" > "$tmp/ref.txt" ||
    { sed 's/^/    /' "$tmp/ref.txt"; return 1; }
}

check "the reference's self-check" "$py tools/reference/hf_reference_selftest.py > $tmp/self.txt || { tail -5 $tmp/self.txt; false; }"
for dtype in bf16 f32; do
  shards=1
  [ "$dtype" = bf16 ] && shards=3
  common="--dtype $dtype --shards $shards --hidden 64 --heads 4 --kv-heads 2 --vocab 320 --layers 3"
  make_model llama-$dtype --arch llama $common --tied --head-dim 24 --attention-bias 1
  make_model qwen2-$dtype --arch qwen2 $common --kv-heads 1
  make_model qwen2moe-$dtype --arch qwen2_moe $common --experts 6 --top-k 2 --moe-intermediate 32 \
    --shared-intermediate 48 --norm-topk 0 --mlp-only-layers 0 --seed 3
  make_model mixtral-$dtype --arch mixtral $common --experts 4 --top-k 2 --intermediate 48 --seed 5
  for m in llama qwen2 qwen2moe mixtral; do
    for seed in 0 1; do
      check "dump --model ($m, $dtype, $shards file(s), seed $seed) matches the float64 HF reference" \
        "cross_check $m-$dtype $seed"
    done
  done
done
# Qwen2-MoE with the top-K renormalised and MoE on every other layer.
make_model qwen2moe-step --arch qwen2_moe --dtype f32 --hidden 64 --heads 4 --kv-heads 2 --vocab 320 --layers 4 \
  --experts 4 --top-k 2 --moe-intermediate 32 --shared-intermediate 48 --norm-topk 1 --sparse-step 2
check "dump --model (qwen2_moe, decoder_sparse_step 2, norm_topk_prob) matches the reference" "cross_check qwen2moe-step 0"
finish

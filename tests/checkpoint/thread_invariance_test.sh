#!/usr/bin/env bash
# Same bits on any thread count (#43): `dump` of tiny, tiny-moe and a
# grouped-query, tied-embedding, qkv-bias config (tests/checkpoint/data/
# tiny_gqa_tied.json) under none and per_block, f32, and tiny under bf16, at
# --threads 1, 2 and 3 (3 is more threads than this machine's cores): every
# tensor, the loss and every gradient, is the same bit for bit as at one
# thread. A dump that differs names the tensors (compare_dumps.py).
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
remat=./bazel-bin/tools/remat
same() {  # A B: bit for bit
  /usr/bin/python3 tools/reference/compare_dumps.py "$1" "$2" > "$tmp/cmp.txt" 2>&1 || { sed 's/^/    /' "$tmp/cmp.txt"; false; }
}
cases=("tiny none f32" "tiny per_block f32" "tiny none bf16" "tiny-moe none f32" "tiny-moe per_block f32"
       "tests/checkpoint/data/tiny_gqa_tied.json none f32" "tests/checkpoint/data/tiny_gqa_tied.json per_block f32")
for c in "${cases[@]}"; do
  read -r config plan dtype <<< "$c"
  for t in 1 2 3; do
    $remat dump --config "$config" --recompute "$plan" --dtype "$dtype" --seed 3 --threads $t \
      --out "$tmp/t$t.safetensors" > /dev/null 2>&1 || echo "dump failed: $c --threads $t"
  done
  for t in 2 3; do
    check "$(basename "$config") $plan $dtype: --threads $t gives the bits of --threads 1" \
      "same $tmp/t1.safetensors $tmp/t$t.safetensors"
  done
done
finish

#!/usr/bin/env bash
# Every lossless recompute plan (regions, reentrant ones too, policies,
# offload) gives the same dump as `none`, bit for bit: `tiny` with dropout on
# (so the replay must restore the RNG), two seeds; and `tiny-moe` (learned and random routing,
# and with router z-loss and capacity drops) with the MoE plans (reentrant
# regions over MoE blocks too: the router losses leave each as outputs of
# the region, and the routing metrics count once). Compression is lossy: its dumps must stay within a
# stated relative bound of `none` (per tensor, max |a - b| <= R * max |b|).
# Each comparison also checks what the dumps recorded (compare_dumps.py
# --plan): `none` ran no plan and did nothing; the plan's dump ran the plan
# asked for (its canonical string, given after "==" where it differs from the
# spec) and recomputed, offloaded, compressed and replayed MoE dispatch bytes
# exactly as that plan implies. A dump that ignored --recompute fails here.
# The chunked loss (chunked_loss[:N], #35) too: alone and with block plans and
# offload, and, on a batch of several chunks, bit for bit at chunks that are
# multiples of the LM head's GEMM tile and within 1e-6 relative at any other.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dump_args=()  # more dump flags for every dump of check (--batch/--seq)
check() {
  local config=$1 seed=$2 plans=$3 rtol=${4:-}

  ./bazel-bin/tools/remat dump --config "$config" --seed "$seed" "${dump_args[@]}" --out "$tmp/none.safetensors" \
    > /dev/null || exit 1
  for item in $plans; do
    local plan=${item%%==*} ran=${item#*==}
    out="$tmp/plan.safetensors"
    if ./bazel-bin/tools/remat dump --config "$config" --seed "$seed" "${dump_args[@]}" --recompute "$plan" \
         --out "$out" > /dev/null &&
       /usr/bin/python3 tools/reference/compare_dumps.py "$tmp/none.safetensors" "$out" ${rtol:+--rtol "$rtol"} \
         --plan "$plan" --ran "$ran" > "$tmp/cmp.txt"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      echo "FAILED: --recompute $plan (seed $seed, $config${dump_args[*]:+ ${dump_args[*]}}) differs from none${rtol:+ by more than rtol $rtol}, or did not run as $ran:"
      sed 's/^/    /' "$tmp/cmp.txt"
    fi
  done
}
dense="per_block chunk selected:0,2==per_block@0+per_block@2 uniform:2==chunk@0-1+chunk@2-3 block:3==per_block@0-2 attention selective:core_attn selective:layernorm selective:mlp
       selective:save_matmul selective:save_attention selective:save_ops=matmul/scaled_dot_product_attention
       selective:mlp,layernorm==selective:layernorm+selective:mlp
       selected:1,3+block:1==per_block@0-1+per_block@3 attention+selective:mlp per_block+keep_last==per_block@0-2
       uniform:2+keep_last==chunk@0-1+per_block@2 offload per_block+offload offload:mlp attention+offload:mlp uniform:2+keep_last+offload==chunk@0-1+per_block@2+offload
       block:2+offload:mlp==per_block@0-1+offload:mlp per_block@0-1+selective:save_matmul@2-3 selective:mlp@1-2+attention@0==attention@0+selective:mlp@1-2
       chunk@1-2+offload@0-1 per_block@2-3+offload:mlp@0-1 uniform:2@0-1+selective:save_attention@2-3==chunk@0-1+selective:save_attention@2-3
       per_block:reentrant uniform:2:reentrant==chunk:reentrant@0-1+chunk:reentrant@2-3 chunk:reentrant
       per_block:reentrant+keep_last==per_block:reentrant@0-2 per_block:reentrant@0-1+selective:save_matmul@2-3
       per_block:reentrant+offload block:2:reentrant+offload:mlp==per_block:reentrant@0-1+offload:mlp"
moe="per_block chunk per_block+keep_last==per_block@0-2 attention moe_expert selective:moe_act selective:moe selective:shared_experts
     attention+moe_expert offload per_block+offload offload:moe moe_expert+offload per_block@0-1+moe_expert@2-3
     selective:save_matmul per_block:reentrant@0+per_block@1-3 per_block:reentrant@0+moe_expert@1-3
     per_block:reentrant chunk:reentrant uniform:2:reentrant==chunk:reentrant@0-1+chunk:reentrant@2-3
     per_block:reentrant+keep_last==per_block:reentrant@0-2 per_block:reentrant+offload
     per_block:reentrant@0-1+moe_expert@2-3"
# The chunked loss (one chunk at the default size on these batches) alone and
# under a block plan, a policy and offload: none's bits.
loss="chunked_loss per_block+chunked_loss selective:save_matmul+chunked_loss offload+chunked_loss"
for seed in 0 1; do
  check tests/checkpoint/data/tiny_dropout.json "$seed" "$dense $loss"
  check tests/checkpoint/data/tiny_moe_dropout.json "$seed" "$moe $loss"
  # Lossy: the bounds are about 1.5x the largest error seen on these models.
  check tests/checkpoint/data/tiny_dropout.json "$seed" "compress:bf16 compress:bf16+offload==offload+compress:bf16" 0.005
  check tests/checkpoint/data/tiny_dropout.json "$seed" "compress:fp8 compress:fp8+offload==offload+compress:fp8" 0.04
  check tests/checkpoint/data/tiny_dropout.json "$seed" "compress:fp8:mlp" 0.02
  check tests/checkpoint/data/tiny_dropout.json "$seed" "per_block+compress:fp8 per_block+compress:fp8+offload==per_block+offload+compress:fp8
    per_block:reentrant+compress:fp8" 0.06
  check tests/checkpoint/data/tiny_moe_dropout.json "$seed" "compress:fp8 per_block+compress:bf16
    selective:save_matmul+compress:fp8" 0.04
  check tests/checkpoint/data/tiny_dropout.json "$seed" "compress:bf16:all" 0.015
  check tests/checkpoint/data/tiny_dropout.json "$seed" "compress:fp8:all per_block+compress:fp8:all" 0.15
done
check tests/checkpoint/data/tiny_moe_random.json 0 "$moe"
# Several chunks: 4 x (tile/2 + 32) tokens, two whole chunks of the LM head's
# GEMM tile and a part, or one of twice the tile and a part. The tile
# (loss_chunk_tile(), BLIS's KC for this CPU: 256 on AVX2) is in every dump's
# metadata: at its multiples the head's weight gradient sums the same blocks
# as unchunked; at any other chunk (100) it is within rounding.
./bazel-bin/tools/remat dump --config tiny --out "$tmp/tile.safetensors" > /dev/null || exit 1
tile=$(/usr/bin/python3 -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); n, = struct.unpack('<Q', f.read(8))
print(json.loads(f.read(n))['__metadata__']['loss_chunk_tile'])" "$tmp/tile.safetensors")
dump_args=(--batch 4 --seq $((tile / 2 + 32)))
for cfg in tests/checkpoint/data/tiny_dropout.json tests/checkpoint/data/tiny_moe_dropout.json; do
  check "$cfg" 0 "chunked_loss:$tile per_block+chunked_loss:$((2 * tile))"
  check "$cfg" 0 "chunked_loss:100 per_block+chunked_loss:100" 1e-6
done
dump_args=()
# The routers' z-loss and capacity drops under recompute: with z_coef > 0 and
# capacity factor 0.75 (every expert keeps ceil(0.75 T K / E) of its slots, so
# at least a quarter of the T K routed slots of each MoE block are dropped),
# the plans still give none's gradients bit for bit; none's dump shows both
# were on (the lower bound on drops from the config's own numbers).
zcfg=tests/checkpoint/data/tiny_moe_zloss_capacity.json
check "$zcfg" 0 "per_block chunk per_block+keep_last==per_block@0-2 attention moe_expert selective:moe_act selective:moe
  selective:mlp selective:save_matmul attention+moe_expert per_block+offload per_block@0-1+moe_expert@2-3 per_block:reentrant@0+per_block@1-3
  per_block:reentrant chunk:reentrant"
if /usr/bin/python3 - "$tmp/none.safetensors" > "$tmp/routing.txt" 2>&1 <<'PY'
import json, math, struct, sys
data = open(sys.argv[1], "rb").read()
meta = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])["__metadata__"]
c = json.loads(meta["config"])
slots = c["batch"] * c["seq"] * c["top_k"]
kept = c["experts"] * math.ceil(c["capacity_factor"] * slots / c["experts"])
least = (c["n_layers"] - c["dense_first"]) * (slots - kept)
assert c["z_coef"] > 0 and 0 < kept < slots, c
assert int(meta["moe_dropped"]) >= least > 0, (meta["moe_dropped"], least)
assert float(meta["moe_z_loss"]) > 0, meta["moe_z_loss"]
print(f"none dropped {meta['moe_dropped']} routed slots (at least {least}), z-loss {meta['moe_z_loss']}")
PY
then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAILED: $zcfg: none's dump shows no capacity drops or no z-loss:"
  sed 's/^/    /' "$tmp/routing.txt"
fi
echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

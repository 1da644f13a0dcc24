#!/usr/bin/env bash
# --recompute dynamic (checkpoint/dynamic_remat.h) gives `none`'s dump bit for
# bit at budgets of 20%, 40%, 60% and 80% of none's activations above the
# bytes the dump holds besides them (the model and its gradients): on `tiny`
# with dropout, `tiny-moe` with dropout and random routes, and bench-dense;
# and under checkpoint plans (attention, selective:save_matmul, per_block and
# moe_expert, each with dynamic; per_block:reentrant, whose replays in
# backward save through dynamic's hooks). Each dump's metadata must show the budget bound (evictions > 0,
# computed again > 0) and held (peak allocated <= the budget).
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {
  local config=$1 plans=$2
  ./bazel-bin/tools/remat dump --config "$config" --seed 1 --out "$tmp/none.safetensors" > /dev/null || exit 1
  for item in $plans; do
    local plan=${item%%@*} budget=${item#*@}
    if ./bazel-bin/tools/remat dump --config "$config" --seed 1 --recompute "$plan" --memory-budget "$budget" \
         --out "$tmp/plan.safetensors" > "$tmp/out.txt" 2>&1 &&
       /usr/bin/python3 tools/reference/compare_dumps.py "$tmp/none.safetensors" "$tmp/plan.safetensors" \
         --dynamic > "$tmp/cmp.txt"
    then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      echo "FAILED: --recompute $plan --memory-budget $budget ($config) differs from none or did not hold its budget:"
      sed 's/^/    /' "$tmp/out.txt" "$tmp/cmp.txt" 2>/dev/null
    fi
  done
}
budgets="dynamic@20% dynamic@40% dynamic@60% dynamic@80%"
check tests/checkpoint/data/tiny_dropout.json "$budgets selective:save_matmul+dynamic@80% attention+dynamic@40%
  per_block:reentrant+dynamic@30%"
check tests/checkpoint/data/tiny_moe_random.json "$budgets per_block+dynamic@28% moe_expert+dynamic@50%"
check bench-dense "$budgets"
# Bad input: clear errors before any work, and a budget nothing can meet is
# an out-of-memory error naming the budget and what holds the memory.
refused() {  # WHAT EXPECTED ARGS...
  local what=$1 expected=$2
  shift 2
  if ! ./bazel-bin/tools/remat "$@" > "$tmp/bad.txt" 2>&1 && grep -qF -- "$expected" "$tmp/bad.txt"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $what: expected an error saying '$expected':"
    sed 's/^/    /' "$tmp/bad.txt"
  fi
}
refused "dynamic without a budget" "--recompute dynamic needs --memory-budget B" \
  dump --config tiny --recompute dynamic --out "$tmp/x.safetensors"
refused "two budgets" "both give dynamic's budget" \
  dump --config tiny --recompute dynamic:1000000 --memory-budget 1GiB --out "$tmp/x.safetensors"
refused "a bad budget" "--memory-budget 'lots'" \
  dump --config tiny --recompute dynamic --memory-budget lots --out "$tmp/x.safetensors"
refused "a budget below the model" "above the budget of" \
  train --config tiny --steps 2 --recompute dynamic:1000000 --save "$tmp/run"
[ -e "$tmp/run/state.safetensors" ] && { failed=$((failed + 1)); echo "FAILED: a refused run saved a state"; }
echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

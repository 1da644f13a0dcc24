#!/usr/bin/env bash
# --recompute dynamic holds its budget through training: 50 steps of
# `./remat train` at 20%, 40%, 60% and 80% of none's activations on tiny, and
# at 40%, 60% and 80% on tiny-moe, whose learned routes grow one expert's
# share as it trains (at 20% its expert working set meets the budget near
# step 14: docs/RECOMPUTE.md#dynamic). Every logged step's peak allocated
# bytes must be at most the budget the run printed, the run must evict and
# rebuild, and the losses must be none's bit for bit.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
remat=./bazel-bin/tools/remat
check() {  # CONFIG BUDGET
  local config=$1 budget=$2
  if $remat train --config "$config" --steps 50 --recompute dynamic --memory-budget "$budget" \
       --log "$tmp/dyn.jsonl" > "$tmp/out.txt" 2>&1 &&
     /usr/bin/python3 - "$tmp/out.txt" "$tmp/dyn.jsonl" "$tmp/none_$config.jsonl" > "$tmp/cmp.txt" 2>&1 <<'PY'
import json, re, sys
out = open(sys.argv[1]).read()
m = re.search(r"--recompute dynamic:(\d+)", out)
assert m, "the run did not print its budget in bytes"
budget = int(m.group(1))
def steps(path):
    return [r for r in (json.loads(l) for l in open(path) if l.strip()) if "step_ms" in r]
dyn, none = steps(sys.argv[2]), steps(sys.argv[3])
assert len(dyn) == 50, f"{len(dyn)} steps logged, expected 50"
assert all(r["memory_budget_bytes"] == budget for r in dyn), "the logged budget is not the printed one"
over = [(r["step"], r["peak_allocated_bytes"]) for r in dyn if r["peak_allocated_bytes"] > budget]
assert not over, f"steps over the budget of {budget} bytes: {over[:5]}"
assert sum(r["evictions"] for r in dyn) > 0 and sum(r["rebuilds"] for r in dyn) > 0, "the budget never bound"
diff = [(a["step"], a["loss"], b["loss"]) for a, b in zip(dyn, none) if a["loss"] != b["loss"]]
assert not diff, f"losses differ from none: {diff[:3]}"
print(f"budget {budget}: max peak {max(r['peak_allocated_bytes'] for r in dyn)}")
PY
  then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: train --config $config --recompute dynamic --memory-budget $budget, 50 steps:"
    sed 's/^/    /' "$tmp/cmp.txt" 2>/dev/null
    tail -3 "$tmp/out.txt" | sed 's/^/    /'
  fi
}
for config in tiny tiny-moe; do
  $remat train --config $config --steps 50 --log "$tmp/none_$config.jsonl" > /dev/null 2>&1 || {
    echo "FAILED: train --config $config (none)"
    exit 1
  }
done
for b in 20% 40% 60% 80%; do check tiny $b; done
for b in 40% 60% 80%; do check tiny-moe $b; done
echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

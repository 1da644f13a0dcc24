#!/usr/bin/env bash
# --recompute auto --memory-budget B through the CLI: `plan` prints and writes
# its choice, `dump` with auto is bit-identical to none (every lossless auto
# plan is), `train`, `mem` and `bench` accept auto, and bad budgets get clear
# errors.
set -u
# shellcheck source=../script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"  # cd to the root, $tmp, counters, finish
remat=./bazel-bin/tools/remat
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }
fast="--profile-rounds 1"

# plan --json: the chosen plan parses, fits the budget, and the profile is there.
if $remat plan --config tiny --memory-budget 50% $fast --json "$tmp/plan.json" > "$tmp/plan.txt" 2>&1 &&
   /usr/bin/python3 - "$tmp/plan.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["predicted_peak_bytes"] <= d["budget_bytes"], d
assert d["budget_bytes"] == int(d["persistent_bytes"] + 0.5 * d["none_activation_bytes"]), d
assert d["plans"][0]["role"] == "chosen" and d["plans"][0]["plan"] == d["chosen_plan"], d["plans"]
assert d["candidates"][0]["component"] == "none" and len(d["candidates"]) >= 6, [c["component"] for c in d["candidates"]]
assert all(len(c["blocks"]) == 4 for c in d["candidates"])
assert len(d["saves"]) > 20 and {s["block"] for s in d["saves"]} >= {-1, 0, 1, 2, 3}
PY
then ok; else bad "plan --json"; cat "$tmp/plan.txt"; fi
grep -q "^chosen " "$tmp/plan.txt" && ok || bad "plan prints no chosen row"

# plan with a list of budgets: one profile, a choice per budget (one that no
# plan reaches is reported and skipped), each plan measured once.
if $remat plan --config tiny --memory-budget 40%,1MiB,70% $fast --measure --repeats 1 --warmup 0 --steps 1 \
     --json "$tmp/plans.json" > "$tmp/plans.txt" 2>&1 &&
   /usr/bin/python3 - "$tmp/plans.json" "$tmp/plans.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
assert "chosen_plan" not in d and len(d["budgets"]) == 3, d.keys()
b40, b1, b70 = d["budgets"]
assert [b["memory_budget"] for b in d["budgets"]] == ["40%", "1MiB", "70%"]
assert "smallest predicted peak" in b1["skipped"] and "chosen_plan" not in b1, b1
for b in (b40, b70):
    assert b["plans"][0]["role"] == "chosen" and b["plans"][0]["plan"] == b["chosen_plan"], b
    assert b["predicted_peak_bytes"] <= b["budget_bytes"], b
    m = b["measured"][0]
    # fits from the raw figures: the measured peak against the budget bytes.
    assert m["plan"] == b["chosen_plan"] and 0 < m["peak_allocated_bytes"] <= b["budget_bytes"], (m, b["budget_bytes"])
    assert m["fits"] is True and m["step_ms_best"] > 0, m
assert b40["budget_bytes"] < b70["budget_bytes"]
assert text.count("profiling") == 1 and "no plan fits" in text, text
# Every distinct plan ran once (repeats 1), however many budgets listed it.
plans = {p["plan"] for b in (b40, b70) for p in b["plans"]}
import re
assert len(re.findall(r"^  \[ *\d+/\d+\] ", text, re.M)) == len(plans), (plans, text)
PY
then ok; else bad "plan with a budget list"; cat "$tmp/plans.txt"; fi

# Lossless auto plans dump bit-identically to none (dropout on, dense and MoE),
# and the dump records that it ran the plan auto chose (and what it did).
for run in "tiny_dropout 40% 55% 70% 85%" "tiny_moe_dropout 55% 70% 85%"; do
  set -- $run
  cfg=tests/checkpoint/data/$1.json
  shift
  $remat dump --config "$cfg" --seed 1 --out "$tmp/none.safetensors" > /dev/null || exit 1
  for b in "$@"; do
    if $remat dump --config "$cfg" --seed 1 --recompute auto --memory-budget "$b" $fast \
         --out "$tmp/auto.safetensors" > "$tmp/dump.txt" 2>&1 &&
       chosen=$(sed -n 's/^recompute auto: \([^ ]*\) for .*/\1/p' "$tmp/dump.txt") && [ -n "$chosen" ] &&
       /usr/bin/python3 tools/reference/compare_dumps.py "$tmp/none.safetensors" "$tmp/auto.safetensors" \
         --plan "$chosen" > "$tmp/cmp.txt"; then
      ok
    else
      bad "dump --recompute auto --memory-budget $b ($cfg) differs from none or failed:"; cat "$tmp/dump.txt" "$tmp/cmp.txt"
    fi
  done
done
grep -q "^recompute auto: .* for --memory-budget 85%" "$tmp/dump.txt" && ok || bad "dump names the chosen plan"

# train and mem run the chosen plan.
$remat train --config tiny --steps 2 --eval-every 0 --progress off --recompute auto --memory-budget 40% $fast \
  > "$tmp/train.txt" 2>&1 && grep -q "^recompute auto: " "$tmp/train.txt" && ok || { bad "train auto"; cat "$tmp/train.txt"; }
$remat train --config tiny --steps 2 --eval-every 0 --progress off --recompute auto --memory-budget 40% $fast \
  --tune-microbatch > "$tmp/tune.txt" 2>&1 && grep -q "^recompute auto: .* with --grad-accum [1-8] " "$tmp/tune.txt" &&
  [ "$(grep -c "^recompute auto: [1-8] micro-batch" "$tmp/tune.txt")" = 4 ] && ok || { bad "train --tune-microbatch"; cat "$tmp/tune.txt"; }
# mem: its JSON records the plan auto chose, and that plan's replays ran (not only that a file was written).
$remat mem --config tiny --recompute auto --memory-budget 40% $fast --out "$tmp/mem" > "$tmp/mem.txt" 2>&1 &&
  /usr/bin/python3 - "$tmp/mem.json" "$tmp/mem.txt" <<'PY' && ok || { bad "mem auto"; cat "$tmp/mem.txt"; }
import json, re, sys
d = json.load(open(sys.argv[1]))
chosen = re.search(r"^recompute auto: (\S+) for --memory-budget 40%", open(sys.argv[2]).read(), re.M).group(1)
assert d["format"] == "remat-mem-1" and d["plan"] == chosen, (d["format"], d["plan"], chosen)
phases = [p["name"] for p in d["phases"]]
regions = [c for c in chosen.split("+") if not c.startswith(("offload", "compress"))]
assert "forward" in phases and "backward" in phases and ("replay" in phases) == bool(regions), (chosen, phases)
assert (int(d["info"]["replays"]) > 0) == bool(regions), (chosen, d["info"])
assert d["peak"]["allocated"] > d["initial"]["allocated"] > 0 and len(d["events"]) > 100, d["peak"]
PY

# bench: auto is one row among the plans, with the plan it chose.
if $remat bench --config tiny --recompute none,per_block,auto --memory-budget 50% $fast --repeats 1 --warmup 0 --steps 1 \
     --json "$tmp/bench.json" > "$tmp/bench.txt" 2>&1 &&
   /usr/bin/python3 - "$tmp/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["plan"]: r for r in d["rows"]}
assert set(rows) == {"none", "per_block", "auto"}, rows.keys()
a = rows["auto"]
assert a["chosen_plan"] and a["chosen_plan"] != "auto" and a["budget_bytes"] > 0, a
assert d["auto"][0]["row"] == "auto" and d["auto"][0]["fits"] is True, d["auto"]
# fits from the raw figures: the auto row's measured peak (the median the rows report) within the budget.
assert a["peak_allocated_bytes"] == d["auto"][0]["peak_allocated_bytes"] <= d["auto"][0]["budget_bytes"], (a, d["auto"])
assert d["auto"][0]["step_ms_best"] > 0, d["auto"]
# per_block is the only other row under the budget: the fastest that fits in both views.
a0 = d["auto"][0]
assert rows["per_block"]["peak_allocated_bytes"] <= a0["budget_bytes"] < rows["none"]["peak_allocated_bytes"], rows
assert a0["best_hand_plan"] == "per_block" and a0["best_hand_plan_best"] == "per_block", a0
assert abs(a0["time_vs_best_hand_best"] - a0["step_ms_best"] / rows["per_block"]["step_ms_best"]) < 1e-3, a0
PY
then ok; else bad "bench none,per_block,auto"; cat "$tmp/bench.txt"; fi

# bench: a budget no plan reaches skips its auto row and the other plans still
# run; with nothing else listed the planner's error stops it.
if $remat bench --config tiny --recompute none,auto --memory-budget 1MiB $fast --repeats 1 --warmup 0 --steps 1 \
     --json "$tmp/bench1.json" > "$tmp/bench1.txt" 2>&1 &&
   grep -q "auto 1MiB   skipped: .*smallest predicted peak" "$tmp/bench1.txt" &&
   /usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["rows"]; assert [x["plan"] for x in r] == ["none"], r' \
     "$tmp/bench1.json"
then ok; else bad "bench none,auto at 1MiB: none runs, auto is skipped"; cat "$tmp/bench1.txt"; fi

# Errors: no budget, a budget without auto, a bad budget, a budget below every plan.
expect_error() {
  local what=$1 pattern=$2
  shift 2
  if "$@" > "$tmp/err.txt" 2>&1; then bad "$what: expected an error"; return; fi
  grep -q -- "$pattern" "$tmp/err.txt" && ok || { bad "$what: error does not say '$pattern'"; cat "$tmp/err.txt"; }
}
expect_error "auto without a budget" "needs --memory-budget" $remat dump --config tiny --recompute auto --out "$tmp/x.safetensors"
expect_error "budget without auto" "needs --recompute auto" $remat dump --config tiny --memory-budget 50% --out "$tmp/x.safetensors"
expect_error "bad budget" "expected bytes with an optional unit" $remat plan --config tiny --memory-budget 12parsecs $fast
expect_error "budget below every plan" "smallest predicted peak is .* reached by --recompute" \
  $remat plan --config tiny --memory-budget 1MiB $fast
expect_error "bench: auto alone below every plan" "smallest predicted peak is .* reached by --recompute" \
  $remat bench --config tiny --recompute auto --memory-budget 1MiB $fast --repeats 1 --warmup 0 --steps 1
finish

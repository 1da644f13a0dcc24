#!/usr/bin/env bash
# --recompute dynamic under expert parallelism (--ep 2, mpirun): tiny-moe with
# random routes (so the ranks' expert loads differ step to step) trains on
# --recompute none's losses with the budget binding on every rank, the
# all-to-all outputs pinned (rebuilds run no collective, so no rank waits on
# another's decisions: the run finishing is the no-hang check), and every
# step's peak within the budget; one process at 60% too. Ranks run one thread.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
common=(--config tests/checkpoint/data/tiny_moe_random.json --steps 4 --warmup 2 --eval-every 0 --seed 3 --progress off)
run() {  # TAG NP ARGS...
  local tag=$1 np=$2
  shift 2
  timeout 300 mpirun "${flags[@]}" -np "$np" $remat train "${common[@]}" "$@" --log "$tmp/$tag.jsonl" \
    > "$tmp/$tag.txt" 2>&1
}
run none 2 --ep 2
run dyn 2 --ep 2 --recompute dynamic --memory-budget 60%
run one 1 --recompute dynamic --memory-budget 60%
$remat train "${common[@]}" --log "$tmp/one_none.jsonl" > /dev/null 2>&1
same_run() {  # REF RUN: the same losses and aux losses; the budget held and bound at every step
  /usr/bin/python3 - "$tmp/$1.jsonl" "$tmp/$2.jsonl" <<'PY'
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
run = [json.loads(l) for l in open(sys.argv[2])]
assert len(ref) == len(run) == 4, (len(ref), len(run))
for a, b in zip(ref, run):
    assert a["loss"] == b["loss"] and a.get("loss_aux") == b.get("loss_aux"), (a["step"], a["loss"], b["loss"])
    assert b["peak_allocated_bytes"] <= b["memory_budget_bytes"], b
    assert b["evictions"] > 0 and b["rebuilds"] > 0, b
PY
}
check "--ep 2 dynamic 60%: none's losses, every step within its budget" 'same_run none dyn' || sed 's/^/    /' "$tmp/dyn.txt"
check "one process dynamic 60%: none's losses, every step within its budget" 'same_run one_none one' ||
  sed 's/^/    /' "$tmp/one.txt"
check "--ep 2 dynamic: the budget line names the plan run" 'grep -q "recompute dynamic: a budget of" "$tmp/dyn.txt"'
finish

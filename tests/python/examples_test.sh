#!/usr/bin/env bash
# The Python examples (examples/python/) run from the build tree as the README
# says (./remat python is PYTHONPATH=bazel-bin/python /usr/bin/python3) and
# print what they claim: the checkpointed MLP keeps fewer saved bytes with
# bit-identical gradients, the custom op passes gradcheck (a wrong backward
# does not) and replays bit-identically in a region, and LoRA fine-tuning of
# a tiny Llama folder under `auto` at 60% lowers the loss with the planner's
# plan printed.
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
export PYTHONPATH="$PWD/bazel-bin/python" OMP_NUM_THREADS=1
py=/usr/bin/python3
check "checkpointed_mlp.py: fewer saved bytes, gradients bit-identical" \
  "$py examples/python/checkpointed_mlp.py > '$tmp/mlp.txt' 2>&1 && grep -q 'gradients bit-identical: yes' '$tmp/mlp.txt' &&
   grep -q 'checkpoint replays 1' '$tmp/mlp.txt'" || cat "$tmp/mlp.txt"
check "custom_op.py: gradcheck passes, a wrong backward is caught, the replay is bit-identical" \
  "$py examples/python/custom_op.py > '$tmp/op.txt' 2>&1 && grep -q 'all within tolerance' '$tmp/op.txt' &&
   grep -q 'a wrong backward: caught' '$tmp/op.txt' && grep -q 'gradients bit-identical: yes' '$tmp/op.txt'" ||
  cat "$tmp/op.txt"
$py tools/reference/make_hf_model.py --arch llama --tied --out "$tmp/tiny-llama" > /dev/null
check "fine_tune_auto.py: LoRA under the plan auto chose for 60%, the loss falls" \
  "$py examples/python/fine_tune_auto.py '$tmp/tiny-llama' > '$tmp/ft.txt' 2>&1 &&
   grep -q '^plan chosen for 60% of none.s activations: ' '$tmp/ft.txt' && grep -q 'adapter tensors train' '$tmp/ft.txt' &&
   grep -q 'held-out loss' '$tmp/ft.txt'" || cat "$tmp/ft.txt"
finish

#!/usr/bin/env bash
# The installed package works without Bazel: `./remat install` into a fresh
# prefix, then the examples are built out of tree with CMake and with a
# plain Makefile (pkg-config), run, and checked: the custom model (a user's
# block stack) trains under several recompute plans, its loss falls and is the
# same under every plan, and a bad plan is refused; loading a model saved with
# HF names reproduces the in-tree model's loss exactly. Also: no internal
# header is installed, and the Python module imports from the prefix (a
# fresh interpreter outside the tree) and computes.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {  # a pipeline fails when any command in it fails (an example's exit code counts)
  if (set -o pipefail; eval "$2") > "$tmp/check.log" 2>&1; then
    passed=$((passed + 1))
    echo "passed: $1"
  else
    failed=$((failed + 1))
    echo "FAILED: $1"
    sed 's/^/    /' "$tmp/check.log" | tail -20
  fi
}
check "./remat install --prefix" "tools/install.sh --prefix '$tmp/prefix'"
check "no internal header is installed" \
  "! find '$tmp/prefix/include' -name kernel_util.h -o -name gemm.h -o -name strided.h -o -name immortal.h -o -name philox.h -o -path '*cuda*' | grep -q ."
check "the Python module imports from the install prefix and computes" \
  "cd '$tmp' && PYTHONPATH=\$(ls -d '$tmp'/prefix/lib/python3*/dist-packages) /usr/bin/python3 -c '
import remat, numpy as np
assert remat.__file__.startswith(\"$tmp/prefix/\"), remat.__file__
x = remat.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
(x @ x).sum().backward()
assert np.array_equal(x.grad.numpy(), np.array([[7, 11], [9, 13]], np.float32)), x.grad
'"
check "CMake build of the examples" \
  "cmake -S examples -B '$tmp/cmake' -DCMAKE_PREFIX_PATH='$tmp/prefix' && cmake --build '$tmp/cmake'"
check "pkg-config build of the examples" \
  "mkdir -p '$tmp/make' && PKG_CONFIG_PATH='$tmp/prefix/lib/pkgconfig' make -C examples OUT='$tmp/make'"
./bazel-bin/tools/remat dump --config tiny --seed 4 --out "$tmp/model.safetensors" > "$tmp/dump.txt"
want=$(sed -E 's/.*loss.ce ([0-9.]+).*/\1/' "$tmp/dump.txt")
for build in cmake make; do
  check "custom model ($build build): the loss falls" \
    "'$tmp/$build/custom_model' | tee '$tmp/custom.txt' && grep -qx 'plan none' '$tmp/custom.txt' &&
     grep -q 'peak allocated' '$tmp/custom.txt' &&
     awk '/^loss first/ { n++; if (!(\$5 < \$3)) bad = 1 } END { exit !(n == 1 && !bad) }' '$tmp/custom.txt'"
  for plan in per_block uniform:2+keep_last selective:mlp; do
    check "custom model ($build build) under plan $plan: the loss of none" \
      "'$tmp/$build/custom_model' $plan | tee '$tmp/plan.txt' && grep -qx 'plan $plan' '$tmp/plan.txt' &&
       diff <(grep '^loss' '$tmp/custom.txt') <(grep '^loss' '$tmp/plan.txt')"
  done
  check "custom model ($build build): a bad plan is refused naming the blocks' sub-regions" \
    "! '$tmp/$build/custom_model' selective:attn 2> '$tmp/bad.txt' &&
     grep -q \"unknown selective name 'attn'\" '$tmp/bad.txt' && grep -q 'selective:NAMES (norm, mlp' '$tmp/bad.txt'"
  check "custom op ($build build): gradcheck passes, bit-identical under a checkpoint region" \
    "'$tmp/$build/custom_op' | tee '$tmp/op.txt' && grep -q 'all within tolerance' '$tmp/op.txt' &&
     grep -q 'checkpoint replays 1, regenerated 3 saves; gradients bit-identical: yes' '$tmp/op.txt' &&
     [ \"\$(grep '^weight gradient plain:' '$tmp/op.txt' | cut -d: -f2 | wc -w)\" -eq 64 ] &&
     diff <(grep '^weight gradient plain:' '$tmp/op.txt' | cut -d: -f2) \
          <(grep '^weight gradient replayed:' '$tmp/op.txt' | cut -d: -f2)"
  check "typed hook ($build build) stacked with checkpoint(): fewer saved bytes, close gradients" \
    "'$tmp/$build/typed_hook' | tee '$tmp/hook.txt' &&
     awk '/^hook packed/ { p = \$3; a = \$8; b = \$10 } /^max \\|grad difference\\|/ { e = \$NF }
          END { exit !(p > 0 && b > 0 && b < a && e != \"\" && e < 0.05) }' '$tmp/hook.txt'"
  check "dynamic remat ($build build): under a quarter of the budget, bit-identical gradients" \
    "'$tmp/$build/dynamic_remat' | tee '$tmp/dyn.txt' && grep -q 'gradients bit-identical' '$tmp/dyn.txt' &&
     ! grep -q '^0 evictions' '$tmp/dyn.txt'"
  check "load and forward ($build build) matches the in-tree model" \
    "'$tmp/$build/load_forward' '$tmp/model.safetensors' | grep -qx 'loss.ce $want'"
done
echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]

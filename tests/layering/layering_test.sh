#!/usr/bin/env bash
# The layering check (check_layering.py) passes on this tree, and fails, naming
# the file, the line and both layers, on trees with a forbidden include: one
# added to a copy of this tree, and small trees with an include up the order,
# sideways within a layer, through a relative path, and into another folder's
# internal header. Needs no build.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
checker=tests/layering/check_layering.py
py=/usr/bin/python3

$py $checker > "$tmp/tree.txt" 2>&1
rc=$?
check "this tree's includes follow the layer order" '[ $rc -eq 0 ] && grep -q "^layering: ok" "$tmp/tree.txt"' \
  || cat "$tmp/tree.txt"

# A copy of this tree with one include up the order added to ops/ops.h.
mkdir -p "$tmp/copy"
for d in $($py $checker --folders); do [ -d "$d" ] && cp -r "$d" "$tmp/copy/"; done
line=$(($(wc -l < ops/ops.h) + 1))
echo '#include "train/trainer.h"' >> "$tmp/copy/ops/ops.h"
$py $checker --root "$tmp/copy" > "$tmp/copy.txt" 2>&1
rc=$?
check "an include added up the order fails the check, naming file, line and both layers" \
  '[ $rc -eq 1 ] && grep -qxF "ops/ops.h:$line: #include \"train/trainer.h\": ops (layer 1) may not include train (layer 6), a layer above it" "$tmp/copy.txt"' \
  || cat "$tmp/copy.txt"
check "only the added include is reported" '[ "$(grep -c "#include" "$tmp/copy.txt")" -eq 1 ]' || cat "$tmp/copy.txt"

# Small trees: mk ROOT FILE LINE... writes FILE under ROOT.
mk() {
  local root=$1 file=$2
  shift 2
  mkdir -p "$(dirname "$root/$file")"
  printf '%s\n' "$@" > "$root/$file"
}
good=$tmp/good
mk "$good" engine/tensor.h '// Tensors.' '#pragma once' '#include <vector>' '#include "third_party/x.h"'
mk "$good" ops/internal.h '// Helpers. Internal to ops/.' '#pragma once'
mk "$good" ops/add.cc '#include "ops/internal.h"' '#include "engine/tensor.h"'
mk "$good" cuda/add.cu '#include "kernel.cuh"' '#include "engine/tensor.h"'
mk "$good" cuda/kernel.cuh '#pragma once'
mk "$good" train/trainer.cc '#include "models/decoder.h"' '#include "parallel/group.h"' '#include "checkpoint/plan.h"'
mk "$good" examples/app.cpp '#include <remat/remat.h>' '#include <cstdio>'
mk "$good" api/remat.h '#include "tools/x.h"'
mk "$good" tests/any_test.cc '#include "tools/x.h"' '#include "ops/internal.h"'
$py $checker --root "$good" > "$tmp/good.txt" 2>&1
rc=$?
check "downward, same-folder, relative, system and test includes pass" '[ $rc -eq 0 ]' || cat "$tmp/good.txt"

bad=$tmp/bad
cp -r "$good" "$bad"
mk "$bad" checkpoint/plan.cc '// A plan.' '' '#include "parallel/group.h"'
mk "$bad" engine/alloc.cc '#include "engine/tensor.h"' '#include "../cuda/kernel.cuh"'
mk "$bad" moe/dispatch.cc '#include "ops/internal.h"'
mk "$bad" api/remat.h '#include "examples/app.h"'
$py $checker --root "$bad" > "$tmp/bad.txt" 2>&1
rc=$?
check "an include sideways within a layer fails" \
  '[ $rc -eq 1 ] && grep -qxF "checkpoint/plan.cc:3: #include \"parallel/group.h\": checkpoint (layer 3) may not include parallel (layer 3), the same layer as it" "$tmp/bad.txt"' \
  || cat "$tmp/bad.txt"
check "an include up the order through a relative path fails" \
  'grep -qxF "engine/alloc.cc:2: #include \"../cuda/kernel.cuh\": engine (layer 0) may not include cuda (layer 2), a layer above it" "$tmp/bad.txt"'
check "an include of another folder's internal header fails" \
  'grep -qxF "moe/dispatch.cc:1: #include \"ops/internal.h\": moe (layer 4) may not include a header internal to ops/ (its opening comment says so)" "$tmp/bad.txt"'
check "api may not include examples" 'grep -q "^api/remat.h:1: .*api (layer 8) may not include examples (layer 9)" "$tmp/bad.txt"'
check "every bad include is reported, and nothing else" '[ "$(grep -c "#include" "$tmp/bad.txt")" -eq 4 ]' \
  || cat "$tmp/bad.txt"

finish

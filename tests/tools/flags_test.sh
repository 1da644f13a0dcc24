#!/usr/bin/env bash
# The CLI's flags end to end (tools/args, CLI11 underneath): -h and --help on
# every command print its flags and exit 0; unknown flags and stray arguments
# still fail with the list of valid flags; values are checked for kind and
# range before a command does any work (train --lr nan fails naming --lr
# without training a step); the old error texts still read the same.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
remat=./bazel-bin/tools/remat

# One flag each command must list in its help (info has none of its own).
declare -A flag_of=([info]="--help" [bench-ops]="--repeats" [train]="--lr" [dump]="--out" [mem]="--capacity"
                    [bench]="--peak-flops" [bench-worker]="--recompute")
for cmd in info bench-ops train dump mem bench bench-worker; do
  $remat "$cmd" --help > "$tmp/help.txt" 2> "$tmp/help.err"
  rc=$?
  check "$cmd --help exits 0 and lists its flags" \
    '[ $rc -eq 0 ] && grep -q "Usage: remat $cmd" "$tmp/help.txt" && grep -q -- "${flag_of[$cmd]}" "$tmp/help.txt" &&
     [ ! -s "$tmp/help.err" ]' || cat "$tmp/help.txt" "$tmp/help.err"
  $remat "$cmd" -h > "$tmp/h.txt" 2>&1
  rc=$?
  check "$cmd -h is --help" '[ $rc -eq 0 ] && cmp -s "$tmp/help.txt" "$tmp/h.txt"'
  $remat help "$cmd" > "$tmp/hc.txt" 2>&1
  check "help $cmd is $cmd --help" 'cmp -s "$tmp/help.txt" "$tmp/hc.txt"'
  $remat "$cmd" --no-such-flag 3 > "$tmp/u.txt" 2>&1
  rc=$?
  check "$cmd: an unknown flag fails with the list of valid flags" \
    '[ $rc -ne 0 ] && grep -q "unknown flag --no-such-flag; valid flags:" "$tmp/u.txt" &&
     grep -q -- "-h, --help" "$tmp/u.txt"' || cat "$tmp/u.txt"
done

$remat train --help > "$tmp/train-help.txt" 2>&1
check "train --help shows help text, range and default of a flag" \
  'grep -qE -- "--steps INT >= 1 +optimizer steps of the whole run \(default 600\)" "$tmp/train-help.txt" &&
   grep -qE -- "--lr FLOAT > 0 +peak learning rate \(default 0.003\)" "$tmp/train-help.txt"' || cat "$tmp/train-help.txt"
check "train --help does not train" '! grep -q "remat train: config" "$tmp/train-help.txt"'

$remat help > "$tmp/help-all.txt" 2>&1
rc=$?
check "help lists the commands and points at COMMAND --help" \
  '[ $rc -eq 0 ] && grep -q "train" "$tmp/help-all.txt" && grep -q "bench-ops" "$tmp/help-all.txt" &&
   grep -q "remat COMMAND --help" "$tmp/help-all.txt"'

# expect_error NAME 'ARGS' TEXT: `remat ARGS` exits non-zero, prints TEXT and trains nothing.
expect_error() {
  # shellcheck disable=SC2086
  $remat $2 > "$tmp/e.txt" 2>&1
  local rc=$? want=$3  # locals: check's eval sees them
  check "$1" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$want" "$tmp/e.txt" && ! grep -q "remat train: config" "$tmp/e.txt"' ||
    cat "$tmp/e.txt"
}
expect_error "train --lr nan fails before training, naming --lr" "train --lr nan" \
  "remat train: flag --lr expects a finite number > 0, got 'nan'"
expect_error "train --lr inf" "train --lr inf" "flag --lr expects a finite number > 0, got 'inf'"
expect_error "train --lr -1" "train --lr -1" "flag --lr expects a finite number > 0, got '-1'"
expect_error "train --lr=-inf" "train --lr=-inf" "flag --lr expects a finite number > 0, got '-inf'"
expect_error "train --comm-timeout 0" "train --comm-timeout 0" "flag --comm-timeout expects a finite number > 0, got '0'"
expect_error "train --bucket-mb -3" "train --bucket-mb -3" \
  "flag --bucket-mb expects a finite number in (0, 1048576], got '-3'"
expect_error "train --steps 0" "train --steps 0" "flag --steps expects an integer >= 1, got '0'"
expect_error "train --steps abc (expects an integer)" "train --steps abc" "flag --steps expects an integer >= 1, got 'abc'"
expect_error "train --threads 0" "train --threads 0" "flag --threads expects an integer in [1, 1024], got '0'"
expect_error "train --seed -1" "train --seed -1" "flag --seed expects an integer >= 0, got '-1'"
expect_error "train --reuse-routing 2" "train --reuse-routing 2" "flag --reuse-routing expects an integer in [0, 1], got '2'"
expect_error "train --ep 0" "train --ep 0" "flag --ep expects an integer >= 1, got '0'"
expect_error "train --steps (needs a value)" "train --steps" "flag --steps needs a value"
expect_error "train stray (unexpected argument)" "train stray" "unexpected argument 'stray'; valid flags:"
expect_error "bench --peak-flops nan" "bench --peak-flops nan" "flag --peak-flops expects a finite number > 0, got 'nan'"
expect_error "bench --repeats 0" "bench --repeats 0" "flag --repeats expects an integer >= 1, got '0'"
expect_error "bench --estimate=maybe" "bench --estimate=maybe" "flag --estimate is a boolean flag"
expect_error "mem --capacity 0" "mem --capacity 0 --out $tmp/m" "flag --capacity expects an integer >= 1, got '0'"
expect_error "dump --seed x" "dump --seed x --out $tmp/d.safetensors" "flag --seed expects an integer >= 0, got 'x'"
expect_error "bench-ops --repeats 0" "bench-ops --repeats 0" "flag --repeats expects an integer in [1, 1000000], got '0'"
expect_error "info takes no flags" "info --json x" "unknown flag --json; valid flags:"

# Both spellings of a value still work: a 1-step run with --name=value and --name value.
$remat train --steps=1 --eval-every 1 --threads=2 --lr 1e-3 > "$tmp/t.txt" 2>&1
rc=$?
check "train --steps=1 --lr 1e-3 runs" '[ $rc -eq 0 ] && grep -q "1 steps of" "$tmp/t.txt" && grep -q "lr 0.001" "$tmp/t.txt"' ||
  cat "$tmp/t.txt"
finish
